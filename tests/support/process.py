"""A broker in a real child process, for tests that kill it (SIGKILL) or stop it (SIGTERM)
and start it again on the same data folder."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any


class BrokerProcess:
    def __init__(
        self,
        store_dir: str,
        *,
        flush: str = "SYNC_FLUSH",
        port: int = 0,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.store_dir = store_dir
        self.flush = flush
        self.port = port
        self.settings = dict(settings or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.log_lines: list[dict[str, Any]] = []

    def command(self) -> list[str]:
        return broker_command(self.store_dir, self.port, self.flush, self.settings)

    def start(self, timeout: float = 30.0) -> str:
        self._close_previous()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
        )
        self.address = ""
        deadline = time.monotonic() + timeout
        for line in self._lines(deadline):
            if line.get("event") == "broker_started":
                self.address = line["address"]
                self.port = int(self.address.rpartition(":")[2])
                return self.address
        raise RuntimeError(f"broker did not start: {self.log_lines[-20:]}")

    def _close_previous(self) -> None:
        """A restart: the process before is gone (killed if it is not), its last lines read
        and its pipe closed."""
        old = self.proc
        if old is not None and old.poll() is None:
            old.kill()
            old.wait(10)
        self._close_pipe()

    def _close_pipe(self) -> None:
        """The process has ended: read its last lines (until the pipe's end, 5 s at most) and
        close the pipe."""
        if self.proc is None or self.proc.stdout is None or self.proc.stdout.closed:
            return
        self.drain_logs(5.0)
        self.proc.stdout.close()

    def _lines(self, deadline: float) -> Iterator[dict[str, Any]]:
        assert self.proc is not None and self.proc.stdout is not None
        if self.proc.stdout.closed:  # the process ended and every line was read
            return
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        buf = b""
        while time.monotonic() < deadline:
            if not sel.select(0.2):
                if self.proc.poll() is not None:
                    break
                continue
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                try:
                    doc = json.loads(raw)
                except ValueError:
                    doc = {"event": "raw", "text": raw.decode("utf-8", "replace")}
                self.log_lines.append(doc)
                yield doc
        sel.close()

    def drain_logs(self, seconds: float = 0.2) -> None:
        for _ in self._lines(time.monotonic() + seconds):
            pass

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._close_pipe()

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        for _ in self._lines(time.monotonic() + timeout):
            pass
        code = self.proc.wait(timeout)
        self._close_pipe()
        return code

    def stop_quietly(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (dedented) in a new interpreter with stdout and stderr as pipes; a
    non-zero exit raises."""
    import textwrap

    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def broker_command(
    store_dir: str, port: int, flush: str, settings: dict[str, Any] | None = None
) -> list[str]:
    """``python -m txmq broker`` on ``port`` with its store in ``store_dir``, the flush mode
    ``flush`` and ``--set key=value`` for each of ``settings``."""
    cmd = [
        sys.executable,
        "-m",
        "txmq",
        "broker",
        "--store-dir",
        store_dir,
        "--port",
        str(port),
        "--flush",
        flush,
    ]
    for k, v in (settings or {}).items():
        cmd += ["--set", f"{k}={v}"]
    return cmd


@contextlib.contextmanager
def running(store_dir: str, **kwargs: Any) -> Iterator[BrokerProcess]:
    """A :class:`BrokerProcess` (``kwargs``: its settings) started for a block, stopped when
    it ends."""
    bp = BrokerProcess(store_dir, **kwargs)
    bp.start()
    try:
        yield bp
    finally:
        bp.stop_quietly()
