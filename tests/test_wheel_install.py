"""The package as a user gets it: the wheel and the sdist built and checked as PyPI would take
them, the wheel installed in a clean virtual environment -- the SDK alone first (the broker
says which extra it needs), then with the broker's extra -- and the README's quick start run
from that environment."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.ports import free_port

pytestmark = [pytest.mark.external, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent


def _run(*argv: str | Path, timeout: float = 600, **kw: object) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw
    )  # type: ignore[call-overload]
    assert r.returncode == 0, f"{argv}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r  # type: ignore[no-any-return]


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the broker exited with {proc.returncode}"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"the broker did not listen on {port} within {timeout} s")


def test_the_wheel_installs_alone_and_runs_the_quick_start(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # as PyPI gets them (no isolated build: the checkout's own setuptools builds them)
    _run(
        sys.executable,
        "-m",
        "build",
        "--no-isolation",
        "--skip-dependency-check",
        "--sdist",
        "--wheel",
        "--outdir",
        dist,
        ROOT,
        cwd=tmp_path,
    )
    wheels = sorted(dist.glob("txmq-*.whl"))
    sdists = sorted(dist.glob("txmq-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(os.listdir(dist))
    checked = _run(sys.executable, "-m", "twine", "check", "--strict", *wheels, *sdists)
    assert checked.stdout.count("PASSED") == 2, checked.stdout

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    pip, py, txmq = venv / "bin" / "pip", venv / "bin" / "python", venv / "bin" / "txmq"
    # The SDK alone: what it needs, no broker dependency.
    _run(pip, "install", "--quiet", wheels[0])
    _run(py, "-c", "import txmq.client, txmq.protocol; from txmq.client import Producer")
    listed = _run(pip, "list", "--format=freeze").stdout.lower()
    for broker_only in ("structlog", "prometheus-client", "lark", "uvloop"):
        assert broker_only not in listed, f"the SDK alone pulled {broker_only}:\n{listed}"
    refused = subprocess.run(
        [txmq, "broker", "--port", "0"], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode != 0 and "pip install 'txmq[broker]'" in refused.stderr, refused
    assert "Traceback" not in refused.stderr, refused.stderr

    # With the broker: the README's quick start, from the installed package alone.
    _run(pip, "install", "--quiet", f"{wheels[0]}[broker]")
    port = free_port()
    work = tmp_path / "work"
    work.mkdir()
    broker = subprocess.Popen(
        [txmq, "broker", "--port", str(port), "--store-dir", work / "data"],
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_port(port, broker)
        address = f"127.0.0.1:{port}"
        _run(
            txmq,
            "send",
            "orders",
            "hello",
            "--tags",
            "created",
            "--keys",
            "order-1",
            "-b",
            address,
            cwd=work,
            timeout=120,
        )
        got = _run(
            txmq,
            "consume",
            "orders",
            "--count",
            "1",
            "--timeout",
            "30",
            "-b",
            address,
            cwd=work,
            timeout=120,
        )
        assert "hello" in got.stdout, got.stdout
        status = _run(txmq, "status", "-b", address, cwd=work, timeout=120)
        assert status.stdout.strip(), "txmq status printed nothing"
    finally:
        os.killpg(broker.pid, signal.SIGTERM)
        try:
            broker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(broker.pid, signal.SIGKILL)
            broker.wait(10)
    assert broker.returncode == 0, f"the broker stopped with {broker.returncode} on SIGTERM"
