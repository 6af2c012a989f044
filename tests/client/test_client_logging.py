"""The SDK and the Spark connector log through the standard library's ``logging``: silent
unless the application configures logging, controlled by it when it does, and rendered as the
broker's own structured events inside a broker process.  Each case runs in a fresh interpreter
(logging configuration is process-wide)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.process import run_python

pytestmark = pytest.mark.external

ROOT = Path(__file__).resolve().parents[2]


def test_no_sdk_module_uses_structlog() -> None:
    """structlog is the broker's: library code must not print through an unconfigured one."""
    for folder in ("client", "spark_connector", "protocol"):
        for path in (ROOT / folder).rglob("*.py"):
            assert "import structlog" not in path.read_text(encoding="utf-8"), path


def test_silent_unless_the_application_configures_logging() -> None:
    proc = run_python(
        """
        from txmq.client.logs import get_logger
        import txmq.client, txmq.spark_connector  # importing logs nothing either
        log = get_logger("txmq.client.consumer")
        log.warning("rebalance_failed", group="g", topic="t", error="boom")
        log.info("queue_taken", group="g", queue_id=1)
        """
    )
    assert proc.stdout == "" and proc.stderr == ""


def test_the_application_controls_level_handler_and_format() -> None:
    proc = run_python(
        """
        import logging, sys
        logging.basicConfig(stream=sys.stdout, level=logging.INFO,
                            format="%(name)s|%(levelname)s|%(message)s|%(lineno)d")
        logging.getLogger("txmq.client.producer").setLevel(logging.WARNING)
        from txmq.client.logs import get_logger
        get_logger("txmq.client.consumer").info("queue_taken", group="g", queue_id=1)
        get_logger("txmq.client.producer").info("hidden_by_the_application")
        get_logger("txmq.client.producer").warning("send_retried", attempt=2)
        get_logger("txmq.client.consumer").bind(group="g").warning("pull_failed", queue_id=3)
        """
    )
    lines = proc.stdout.splitlines()
    # the caller's line number, not the logging helper's
    assert lines == [
        "txmq.client.consumer|INFO|queue_taken group=g queue_id=1|7",
        "txmq.client.producer|WARNING|send_retried attempt=2|9",
        "txmq.client.consumer|WARNING|pull_failed group=g queue_id=3|10",
    ], lines


def test_inside_a_broker_process_sdk_records_are_structured_events() -> None:
    proc = run_python(
        """
        from txmq.broker.logging import configure_logging
        configure_logging("INFO", json=True)
        from txmq.client.logs import get_logger
        get_logger("txmq.client.consumer").warning("rebalance_failed", group="g", error="x")
        """
    )
    (line,) = proc.stdout.splitlines()
    doc = json.loads(line)
    assert doc["event"] == "rebalance_failed" and doc["group"] == "g" and doc["error"] == "x"
    assert doc["logger"] == "txmq.client.consumer" and doc["level"] == "warning"


def test_every_error_class_is_exported_and_documented() -> None:
    import inspect

    import txmq.client
    import txmq.client.errors
    import txmq.client.offset_store
    import txmq.protocol.errors

    doc = (ROOT / "docs" / "sdk.md").read_text(encoding="utf-8")
    for module in (txmq.protocol.errors, txmq.client.errors, txmq.client.offset_store):
        for name, cls in vars(module).items():
            if inspect.isclass(cls) and issubclass(cls, Exception):
                assert getattr(txmq.client, name, None) is cls, f"txmq.client lacks {name}"
                assert name in txmq.client.__all__, f"{name} missing from txmq.client.__all__"
                assert f"`{name}`" in doc, f"docs/sdk.md does not name {name}"
