"""``txmq trace <msgId>``: a message's timeline from the trace topic (the broker's own records
when ``traceTopicEnable`` is on, and the records of clients that send traces)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import click

from txmq.protocol.trace import TRACE_TOPIC, MessageType, TraceRecord, TraceType, decode

from .common import BROKER_OPTION, _admin, _emit, _output_options

#: Trace messages read per key (the broker answers at most 64 per query).
MAX_PER_KEY = 64
#: Keys followed from one message (its transaction, the keys its records name).
MAX_KEYS = 32


def _matches(r: TraceRecord, wanted: set[str]) -> bool:
    return (
        r.msg_id in wanted
        or (bool(r.transaction_id) and r.transaction_id in wanted)
        or any(k in wanted for k in r.keys.split(" ") if k)
    )


async def collect(admin: Any, key: str, topic: str = TRACE_TOPIC) -> list[TraceRecord]:
    """Every trace record about ``key`` (a message id, a key, or a transaction id) and about
    the transaction it belongs to, oldest first."""
    wanted = {key}
    queue = [key]
    asked: set[str] = set()
    seen: set[str] = set()
    #: each record once, with where it was written (its trace message, its place in it)
    found: dict[tuple[Any, ...], tuple[int, int, TraceRecord]] = {}
    while queue and len(asked) < MAX_KEYS:
        k = queue.pop(0)
        if k in asked:
            continue
        asked.add(k)
        result = await admin.query_messages(topic, k, max_num=MAX_PER_KEY)
        for m in result.messages:
            if m.offset_msg_id in seen:
                continue
            seen.add(m.offset_msg_id)
            for i, r in enumerate(decode(m.body)):
                if not _matches(r, wanted):
                    continue
                found.setdefault(_identity(r), (m.commit_log_offset, i, r))
                for more in (r.msg_id, r.transaction_id):
                    if more and more not in wanted:
                        wanted.add(more)
                        queue.append(more)
    # by time, then in the order written (a millisecond holds several steps)
    return [r for _, _, r in sorted(found.values(), key=lambda x: (x[2].timestamp, x[0], x[1]))]


def _identity(r: TraceRecord) -> tuple[Any, ...]:
    return tuple(r.to_dict().values())


def describe(r: TraceRecord) -> tuple[str, str]:
    """The step's name and what happened, in words."""
    if r.type is TraceType.PUB:
        kind = {
            MessageType.TRANS_HALF: "half message",
            MessageType.DELAY: "delayed message",
            MessageType.TRANS_COMMIT: "committed message",
        }.get(r.msg_type, "message")
        what = f"{kind} stored {r.offset_msg_id} ({r.body_length} bytes)"
        return "stored" if r.success else "send-failed", what
    if r.type is TraceType.END_TRANSACTION:
        who = "check answer" if r.from_transaction_check else "producer decision"
        return "end-transaction", f"{who}: {r.transaction_state}"
    if r.type is TraceType.TX_EVENT:
        return r.event, r.detail
    if r.type is TraceType.SUB_BEFORE:
        if r.request_id == "pull":  # the broker's record of a delivery
            return "delivered", f"pulled (retry {r.retry_times})"
        return "consuming", f"callback called (retry {r.retry_times})"  # a consumer's
    if r.type is TraceType.SUB_AFTER:
        if r.request_id == "ack":  # the broker's record of a gRPC ack
            return "consumed", f"acked by {r.group}"
        if r.request_id == "invisible":  # ... of a gRPC change of invisible duration
            return "invisible", f"not consumed yet by {r.group}: delivered again later"
        if r.success:
            return "consumed", f"consumed by {r.group} in {r.cost_time} ms"
        if r.request_id in ("retry", "dlq"):  # the broker's record of a send-back
            return "sent-back", f"not consumed ({r.request_id}) by {r.group}".strip()
        return "consume-failed", f"callback failed in {r.cost_time} ms"
    return str(r.type), ""


def timeline(records: Iterable[TraceRecord]) -> list[dict[str, Any]]:
    rows = []
    for r in records:
        step, what = describe(r)
        d = r.to_dict()
        t = (
            datetime.fromtimestamp(r.timestamp / 1000, tz=UTC).isoformat(timespec="milliseconds")
            if r.timestamp
            else ""
        )
        d.update({"time": t, "step": step, "what": what})
        rows.append(d)
    return rows


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
