"""The operations port (metricsPort): /healthz, /readyz and /metrics over plain HTTP, and
``txmq probe``, what container health checks run."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.brokers import started
from tests.support.certs import issue, make_certs
from tests.support.ports import free_port
from tests.support.waiting import wait_until, wait_until_sync
from txmq.broker.config import BrokerConfig

pytestmark = pytest.mark.external


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def probe(
    port: int | None, what: str = "ready", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    flags = [] if port is None else ["--port", str(port)]
    return subprocess.run(
        [sys.executable, "-m", "txmq", "probe", what, *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


async def test_health_readiness_and_metrics(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    port = free_port()
    async with started(make_broker_config(metrics_port=port)):
        assert get(port, "/healthz") == (200, "ok: serving\n")
        assert get(port, "/readyz") == (200, "ok: serving\n")
        status, text = get(port, "/metrics")
        assert status == 200 and "txmq_connections" in text
        r = probe(port)
        assert r.returncode == 0 and "serving" in r.stdout, r
        assert probe(port, "health").returncode == 0
        # (a full disk makes /readyz answer 503 with the reason: tests/broker/test_disk_full.py)
    r = probe(port)
    assert r.returncode == 1 and "no answer" in r.stderr


async def test_healthz_fails_while_the_event_loop_is_blocked(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    """A broker whose event loop is stuck in a blocking call answers /healthz 503 from the ops
    thread (with how long the loop has been quiet), /readyz and /metrics still answer, and
    /healthz is 200 again once the loop turns."""
    port = free_port()
    async with started(make_broker_config(metrics_port=port, healthz_loop_stall_seconds=1.0)):
        await wait_until(lambda: get(port, "/healthz")[0] == 200, what="/healthz 200 at start")
        seen: dict[str, tuple[int, str]] = {}
        done = threading.Event()

        def watch() -> None:
            # From another thread while the loop below is blocked: /healthz turns 503.
            try:

                def unhealthy() -> tuple[int, str] | None:
                    answer = get(port, "/healthz")
                    return answer if answer[0] == 503 else None

                answer = wait_until_sync(
                    unhealthy, timeout=30, what="/healthz 503 while the loop is blocked"
                )
                assert answer is not None
                seen["healthz"] = answer
                seen["probe"] = (probe(port, "health").returncode, "")
                seen["metrics"] = (get(port, "/metrics")[0], "")
            finally:
                done.set()

        threading.Thread(target=watch, name="watch-healthz", daemon=True).start()
        # Block the event loop for real (no await) until the watcher has seen the 503.
        assert done.wait(60), "the watcher thread did not finish"
        assert "healthz" in seen, "the watcher failed; see its output"
        status, text = seen["healthz"]
        assert status == 503 and "event loop has not turned" in text, text
        assert seen["probe"][0] == 1  # `txmq probe health` fails meanwhile
        assert seen["metrics"][0] == 200  # the ops thread still serves the rest
        await wait_until(
            lambda: get(port, "/healthz") == (200, "ok: serving\n"),
            timeout=10,
            what="/healthz 200 again once the loop turns",
        )


@pytest.mark.parametrize("client_auth", ["none", "require"])
async def test_probe_reads_the_brokers_tls_settings_from_its_config(
    make_broker_config: Callable[..., BrokerConfig], tmp_path: Path, client_auth: str
) -> None:
    """Under enforcing TLS, with or without mutual TLS, `txmq probe` with no flag at all finds
    the port, HTTPS and the certificate to present in the broker's configuration file
    (TXMQ_CONFIG), as the container's health check runs it."""
    certs = make_certs(tmp_path / "certs")
    # Under mutual TLS the probe presents the broker's certificate, which then needs clientAuth.
    cert, key = issue(
        certs.folder, "broker-both", (certs.ca, certs.ca_key), server=True, client_too=True
    )
    port = free_port()
    settings = {
        "metricsPort": port,
        "tls.server.mode": "enforcing",
        "tls.server.certPath": str(cert),
        "tls.server.keyPath": str(key),
        "tls.server.trustCertPath": str(certs.ca),
        "tls.server.need.client.auth": client_auth,
    }
    config = tmp_path / "broker.toml"
    config.write_text("".join(f'"{k}" = {v!r}\n'.replace("'", '"') for k, v in settings.items()))
    async with started(
        make_broker_config(
            metrics_port=port,
            tls_server_mode="enforcing",
            tls_server_cert_path=str(cert),
            tls_server_key_path=str(key),
            tls_server_trust_cert_path=str(certs.ca),
            tls_server_need_client_auth=client_auth,
        )
    ):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TXMQ_")}
        r = probe(None, env={**env, "TXMQ_CONFIG": str(config)})
        assert r.returncode == 0 and "serving" in r.stdout, r
        assert probe(None, "health", env={**env, "TXMQ_CONFIG": str(config)}).returncode == 0
        # Without the configuration the probe speaks plain HTTP to port 9876 and gets nothing.
        r = probe(port, env=env)
        assert r.returncode == 1 and "no answer" in r.stderr, r
        if client_auth == "require":
            # HTTPS without a client certificate is refused: the certificate is what passed.
            ctx = ssl.create_default_context(cafile=str(certs.ca))
            with pytest.raises(OSError):
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{port}/readyz", timeout=10, context=ctx
                ) as answer:
                    answer.read()
