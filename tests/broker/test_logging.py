"""configure_logging: JSON lines when stdout is a pipe, console lines on demand, level filtering,
contextvars, and stdlib logging routed through the same renderer.

Each case runs in a fresh interpreter: configuring structlog is process-wide, and the test
process must keep its own configuration (other tests rely on ``capture_logs``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta

import pytest

from tests.support.process import run_python

pytestmark = pytest.mark.external


PROGRAM = """
    import logging, warnings
    import structlog
    from txmq.broker.logging import configure_logging

    configure_logging({args})
    configure_logging({args})  # twice: must not print every line twice
    log = structlog.get_logger("txmq.broker.server")
    log.debug("hidden_debug_event")
    log.info("broker_started", port=10911, store="data/x")
    structlog.contextvars.bind_contextvars(peer="10.0.0.7:51234")
    log.warning("request_rejected", code=13)
    structlog.contextvars.clear_contextvars()
    logging.getLogger("asyncio").warning("plain %s message", "stdlib")
    logging.getLogger("asyncio").debug("hidden stdlib debug")
    try:
        1 / 0
    except ZeroDivisionError:
        log.exception("request_crashed", code=10)
"""


def test_json_lines_when_stdout_is_a_pipe() -> None:
    before = datetime.now(UTC) - timedelta(seconds=5)
    proc = run_python(PROGRAM.format(args='"INFO"'))
    lines = proc.stdout.strip().splitlines()
    events = [json.loads(line) for line in lines]  # every line is one JSON object
    by_event = {e["event"]: e for e in events}
    assert [e["event"] for e in events] == [
        "broker_started",
        "request_rejected",
        "plain stdlib message",
        "request_crashed",
    ]

    started = by_event["broker_started"]
    assert started["level"] == "info"
    assert started["logger"] == "txmq.broker.server"
    assert started["port"] == 10911 and started["store"] == "data/x"
    assert "peer" not in started
    # ISO 8601 in UTC.
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", started["timestamp"])
    stamp = datetime.fromisoformat(started["timestamp"].replace("Z", "+00:00"))
    assert before <= stamp <= datetime.now(UTC) + timedelta(seconds=5)

    # Context bound with contextvars shows on the lines logged while it is bound.
    assert by_event["request_rejected"]["peer"] == "10.0.0.7:51234"
    assert by_event["request_rejected"]["level"] == "warning"

    # The stdlib record went through the same renderer.
    stdlib = by_event["plain stdlib message"]
    assert stdlib["level"] == "warning" and stdlib["logger"] == "asyncio"
    assert "timestamp" in stdlib and "peer" not in stdlib

    crashed = by_event["request_crashed"]
    assert crashed["level"] == "error"
    assert "ZeroDivisionError" in crashed["exception"]
    assert proc.stderr == ""


def test_level_filtering() -> None:
    proc = run_python(PROGRAM.format(args='"debug"'))
    events = [json.loads(line)["event"] for line in proc.stdout.strip().splitlines()]
    assert "hidden_debug_event" in events and "hidden stdlib debug" in events

    proc = run_python(PROGRAM.format(args='"ERROR"'))
    events = [json.loads(line)["event"] for line in proc.stdout.strip().splitlines()]
    assert events == ["request_crashed"]


def test_console_renderer_when_forced() -> None:
    proc = run_python(PROGRAM.format(args='"INFO", json=False'))
    out = proc.stdout
    assert "broker_started" in out and "port=10911" in out
    assert "peer=10.0.0.7:51234" in out
    assert "plain stdlib message" in out
    assert "ZeroDivisionError" in out
    assert "\x1b[" not in out  # no colours into a pipe
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.splitlines()[0])


def test_bad_level_is_refused() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from txmq.broker.logging import configure_logging; configure_logging('LOUD')",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "unknown log level 'LOUD'" in proc.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_console_lines_on_a_terminal() -> None:
    import os
    import select

    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(PROGRAM.format(args='"INFO"'))],
            stdout=slave,
            stderr=subprocess.PIPE,
        )
        os.close(slave)
        chunks = []
        while True:
            ready, _, _ = select.select([master], [], [], 30)
            if not ready:
                break
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(timeout=60) == 0
        assert proc.stderr is not None
        proc.stderr.close()
    finally:
        os.close(master)
    out = b"".join(chunks).decode()
    assert "broker_started" in out
    assert not out.lstrip().startswith("{")  # not JSON
    assert "\x1b[" in out  # coloured, as a terminal can show
