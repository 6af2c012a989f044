"""``txmq dlq list|resend``: a consumer group's dead-lettered messages."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from .common import (
    BROKER_OPTION,
    _body_preview,
    _client_config,
    _collect_pages,
    _emit,
    _more,
    _output_options,
    _page_options,
    _run,
)


@click.group()
def dlq() -> None:
    """Dead-lettered messages of a consumer group (``%DLQ%<group>``): list, send back."""


def _dlq_doc(m: Any) -> dict[str, Any]:
    from txmq.client.dlq import original_topic

    stored = datetime.fromtimestamp(m.store_timestamp / 1000, tz=UTC)
    return {
        "msgId": m.msg_id,
        "offsetMsgId": m.offset_msg_id,
        "originalTopic": original_topic(m),
        "reconsumeTimes": m.reconsume_times,
        "storeTimestamp": m.store_timestamp,
        "storeTime": stored.isoformat(timespec="seconds"),
        "tags": m.tags,
        "keys": m.keys,
        "body": _body_preview(m.body, 60),
    }


@dlq.command("list")
@BROKER_OPTION
@_output_options
@click.argument("group_name", metavar="GROUP")
@_page_options("At most this many messages (default: all).")
def dlq_list(
    broker: str, group_name: str, limit: int | None, cursor: str | None, as_json: bool
) -> None:
    """The messages GROUP dead-lettered, oldest first (read a page at a time)."""
    from txmq.client.dlq import DLQ_PAGE, read_dlq_page

    config = _client_config()

    async def page(n: int, after: str | None) -> Any:
        try:
            return await read_dlq_page(group_name, broker, config, limit=n, after=after)
        except ValueError as exc:  # a cursor no listing answered
            raise click.BadParameter(str(exc), param_hint="--cursor") from None

    msgs, more = _run(_collect_pages(page, limit, cursor, DLQ_PAGE))
    _more(more)
    _emit(
        [_dlq_doc(m) for m in msgs],
        "json" if as_json else "table",
        [("msgId", "msg id", 32), ("originalTopic", "topic", 20), ("reconsumeTimes", "tries", -5)]
        + [("storeTime", "stored", 25), ("body", "body", 0)],
    )


@dlq.command("resend")
@BROKER_OPTION
@_output_options
@click.argument("group_name", metavar="GROUP")
@click.option("--id", "ids", multiple=True, help="A message id or offsetMsgId (repeatable).")
@click.option("--all", "resend_all", is_flag=True, help="Every dead-lettered message.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def dlq_resend(
    broker: str, group_name: str, ids: tuple[str, ...], resend_all: bool, yes: bool, as_json: bool
) -> None:
    """Send GROUP's dead-lettered messages back to their original topics, as new messages with
    the same body, tags, keys and user properties.  Each resend's message id is derived from
    the dead-lettered message's id: repeating a resend within the broker's duplicate window
    stores nothing twice.  The messages stay in the dead-letter queue."""
    from txmq.client.dlq import read_dlq, resend

    if bool(ids) == resend_all:
        raise click.UsageError("give --id (one or more) or --all")
    msgs = _run(read_dlq(group_name, broker, _client_config()))
    if ids:
        wanted = set(ids)
        msgs = [m for m in msgs if m.msg_id in wanted or m.offset_msg_id in wanted]
        found = {m.msg_id for m in msgs} | {m.offset_msg_id for m in msgs}
        missing = sorted(wanted - found)
        if missing:
            raise click.ClickException(f"not in %DLQ%{group_name}: {', '.join(missing)}")
    if not msgs:
        raise click.ClickException(f"no dead-lettered message of group {group_name}")
    if not yes:
        click.confirm(f"send {len(msgs)} message(s) back to their topics?", abort=True)
    try:
        done = _run(resend(msgs, broker, _client_config()))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    rows = [
        {"dlqMsgId": r.dlq_msg_id, "topic": r.topic, "msgId": r.msg_id, "status": r.status}
        for r in done
    ]
    _emit(
        rows,
        "json" if as_json else "table",
        [("dlqMsgId", "dead-lettered id", 32), ("topic", "sent to", 20)]
        + [("msgId", "new msg id", 32), ("status", "status", 0)],
    )
