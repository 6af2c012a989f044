"""The operations port (metricsPort): /healthz, /readyz and /metrics over plain HTTP, and
``txmq probe``, what container health checks run."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from tests.support.ports import free_port
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController

pytestmark = pytest.mark.external


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def probe(port: int, what: str = "ready") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txmq", "probe", what, "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_health_readiness_and_metrics(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    port = free_port()
    b = BrokerController(make_broker_config(metrics_port=port))
    await b.start()
    try:
        assert get(port, "/healthz") == (200, "ok: serving\n")
        assert get(port, "/readyz") == (200, "ok: serving\n")
        status, text = get(port, "/metrics")
        assert status == 200 and "txmq_connections" in text
        r = probe(port)
        assert r.returncode == 0 and "serving" in r.stdout, r
        assert probe(port, "health").returncode == 0
        # (a full disk makes /readyz answer 503 with the reason: tests/broker/test_disk_full.py)
    finally:
        await b.shutdown()
    r = probe(port)
    assert r.returncode == 1 and "no answer" in r.stderr
