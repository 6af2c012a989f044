"""Stock RocketMQ clients for the compatibility tests: installed once under build/clients/
from the package registries (PyPI ``rocketmq==0.4.4``, npm ``ali-ons@3.12.0``), each in a
place of its own (both PyPI RocketMQ clients are the top-level package ``rocketmq``), and
run as subprocesses that print one JSON line per result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from txmq.client import PullConsumer, PullStatus
from txmq.protocol.message import MessageExt

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / "build" / "clients"
HERE = Path(__file__).resolve().parent

CPP_WHEEL = "rocketmq==0.4.4"
ALI_ONS = ["ali-ons@3.12.0", "urllib@2"]


def _unavailable(what: str, reason: str) -> None:
    """A client that cannot be installed fails the run in CI and is skipped, with the reason,
    elsewhere: never silently."""
    msg = f"{what} cannot be installed here: {reason}"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


def run_setup(cmd: list[str], cwd: Path | None = None, timeout: float = 600) -> str | None:
    """Run an install step of a stock client; what went wrong, or None."""
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if r.returncode != 0:
        return f"{' '.join(cmd)} exited {r.returncode}: {(r.stderr or r.stdout)[-2000:]}"
    return None


def install_cpp_client() -> Path:
    """The Python of a virtualenv holding rocketmq-client-cpp's ctypes wheel."""
    venv = CLIENTS / "cpp"
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if not stamp.exists():
        print(f"installing {CPP_WHEEL} into {venv.relative_to(ROOT)}", file=sys.stderr)
        err = run_setup([sys.executable, "-m", "venv", "--clear", str(venv)]) or run_setup(
            [str(python), "-m", "pip", "install", "--quiet", CPP_WHEEL]
        )
        if err is None:
            err = run_setup([str(python), "-c", "import rocketmq.client"])
        if err is not None:
            _unavailable(f"PyPI {CPP_WHEEL}", err)
        stamp.write_text(CPP_WHEEL + "\n")
    return python


def install_ali_ons() -> Path:
    """The node_modules folder holding ali-ons."""
    where = CLIENTS / "node"
    stamp = where / ".installed"
    if not stamp.exists():
        print(f"installing {' '.join(ALI_ONS)} into {where.relative_to(ROOT)}", file=sys.stderr)
        where.mkdir(parents=True, exist_ok=True)
        err = run_setup(
            [
                "npm",
                "install",
                "--no-audit",
                "--no-fund",
                "--no-save",
                "--prefix",
                str(where),
                *ALI_ONS,
            ]
        )
        if err is not None:
            _unavailable(f"npm {' '.join(ALI_ONS)}", err)
        stamp.write_text(" ".join(ALI_ONS) + "\n")
    return where / "node_modules"


@dataclass
class ClientRun:
    """What a client subprocess printed."""

    returncode: int
    docs: list[dict[str, Any]]
    stderr: str

    def events(self, name: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d.get("event") == name]

    def check(self) -> ClientRun:
        assert self.returncode == 0, f"client exited {self.returncode}: {self.stderr[-3000:]}"
        return self


class StockClient:
    """Runs one stock client's driver script with a bounded timeout."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        self.env = env

    def run(self, *args: object, timeout: float = 120) -> ClientRun:
        try:
            r = subprocess.run(
                [*self.argv, *map(str, args)],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=self.env,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            pytest.fail(f"{self.argv[-1]} {args} did not finish within {timeout}s: {out[-3000:]}")
        docs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        return ClientRun(r.returncode, docs, r.stderr)

    def start(self, *args: object) -> subprocess.Popen[str]:
        """Start the client in the background (the caller waits and ends it)."""
        return subprocess.Popen(
            [*self.argv, *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )


def cpp_client(home: Path) -> StockClient:
    """rocketmq-client-cpp; it writes its logs under ``home``/logs/rocketmq-cpp."""
    python = install_cpp_client()
    env = {**os.environ, "HOME": str(home)}
    return StockClient([str(python), str(HERE / "cpp_client.py")], env)


def ali_ons_client() -> StockClient:
    modules = install_ali_ons()
    env = {**os.environ, "NODE_PATH": str(modules)}
    return StockClient(["node", str(HERE / "ali_ons_client.js")], env)


def sdk_messages(address: str, topic: str, queues: int = 4) -> list[MessageExt]:
    """Every message of ``topic`` as the txmq SDK's pull consumer reads it (the other side of
    an interop check)."""
    out: list[MessageExt] = []
    with PullConsumer("sdk-reader", broker=address) as c:
        for q in range(queues):
            offset = 0
            while True:
                r = c.pull(topic, q, offset)
                if r.status is not PullStatus.FOUND:
                    break
                out.extend(r.messages)
                offset = r.next_begin_offset
    return out
