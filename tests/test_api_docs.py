"""The SDK's API reference builds from the docstrings without a problem reported, and documents
the classes an application uses."""

from __future__ import annotations

from pathlib import Path

from txmq import apidocs


def test_api_reference_builds_cleanly(tmp_path: Path) -> None:
    problems = apidocs.build(tmp_path)
    assert problems == []
    index = tmp_path / "txmq" / "client.html"
    page = index.read_text(encoding="utf-8")
    for name in (
        "AsyncProducer",
        "Producer",
        "AsyncPushConsumer",
        "PushConsumer",
        "AsyncSimpleConsumer",
        "SimpleConsumer",
        "AsyncStreamConsumer",
        "AsyncPullConsumer",
        "AsyncTransactionProducer",
        "ClientConfig",
        "RetryPolicy",
        "ConnectionState",
    ):
        assert f'id="{name}"' in page, f"{name} is missing from the API reference"
    assert "send_async" in page and "change_invisible_duration" in page
    assert (tmp_path / "txmq" / "client" / "telemetry.html").is_file()
    assert (tmp_path / "txmq" / "client" / "callbacks.html").is_file()
    assert (tmp_path / "index.html").is_file()
