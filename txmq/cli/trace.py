"""``txmq trace <msgId>``: a message's timeline from the trace topic (the broker's own records
when ``traceTopicEnable`` is on, and the records of clients that send traces)."""

from __future__ import annotations

import click

from txmq.client.trace_timeline import MAX_KEYS, MAX_PER_KEY, collect, describe, timeline
from txmq.protocol.trace import TRACE_TOPIC

from .common import BROKER_OPTION, _admin, _emit, _output_options

__all__ = ["MAX_KEYS", "MAX_PER_KEY", "collect", "describe", "timeline", "trace"]


@click.command("trace")
@BROKER_OPTION
@click.argument("msg_id", required=False)
@click.option("--key", "-k", help="Find the messages by a key (KEYS) or a transaction id instead.")
@click.option(
    "--topic",
    default=TRACE_TOPIC,
    show_default=True,
    help="The trace topic (the broker's msgTraceTopicName).",
)
@_output_options
def trace(broker: str, msg_id: str | None, key: str | None, topic: str, as_json: bool) -> None:
    """A message's timeline: stored, each step of its transaction (checks sent and answered,
    the decision and who made it), deliveries and send-backs, from the trace topic."""
    if bool(msg_id) == bool(key):
        raise click.UsageError("give a message id or --key, not both")
    wanted = str(msg_id or key)
    records = _admin(broker, lambda admin: collect(admin, wanted, topic))
    if not records and not as_json:
        raise click.ClickException(f"no trace of {wanted} in {topic}")
    _emit(
        timeline(records),
        "json" if as_json else "table",
        [("time", "time", 29), ("step", "step", 16), ("groupName", "group", 16)]
        + [("msgId", "msg id", 32), ("what", "what", 0)],
    )
