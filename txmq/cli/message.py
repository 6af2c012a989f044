"""``txmq message show|find``: stored messages by id or by key (the broker's message index)."""

from __future__ import annotations

from typing import Any

import click

from .common import (
    BROKER_OPTION,
    _admin,
    _body_preview,
    _collect_pages,
    _echo_json,
    _more,
    _output_options,
    _parse_time,
)


def _message_doc(m: Any) -> dict[str, Any]:
    from datetime import UTC, datetime

    stored = datetime.fromtimestamp(m.store_timestamp / 1000, tz=UTC)
    return {
        "msgId": m.msg_id,
        "offsetMsgId": m.offset_msg_id,
        "topic": m.topic,
        "queueId": m.queue_id,
        "queueOffset": m.queue_offset,
        "storeTimestamp": m.store_timestamp,
        "storeTime": stored.isoformat(timespec="milliseconds"),
        "keys": m.keys,
        "tags": m.tags,
        "properties": dict(m.properties),
        "bodySize": len(m.body),
        "body": _body_preview(m.body),
    }


def _echo_messages(docs: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        _echo_json(docs)
        return
    for i, d in enumerate(docs):
        if i:
            click.echo("")
        click.echo(f"msgId:        {d['msgId']}")
        click.echo(f"offsetMsgId:  {d['offsetMsgId']}")
        click.echo(f"topic:        {d['topic']}  queue {d['queueId']}  offset {d['queueOffset']}")
        click.echo(f"stored:       {d['storeTime']} ({d['storeTimestamp']})")
        click.echo(f"keys:         {d['keys'] or ''}")
        click.echo(f"tags:         {d['tags'] or ''}")
        props = " ".join(f"{k}={v}" for k, v in sorted(d["properties"].items()))
        click.echo(f"properties:   {props}")
        click.echo(f"body:         {d['body']} ({d['bodySize']} bytes)")


@click.group()
def message() -> None:
    """Find stored messages by id or by key (the broker's message index)."""


@message.command("show")
@BROKER_OPTION
@click.argument("msg_id")
@click.option(
    "--topic",
    "-t",
    help="The message's topic: looks a message id (UNIQ_KEY) up in the index; without it every "
    "topic is searched when the id is not an offsetMsgId.",
)
@_output_options
def message_show(broker: str, msg_id: str, topic: str | None, as_json: bool) -> None:
    """Show one message by offsetMsgId or message id."""
    from txmq.protocol.errors import QueryNotFoundError

    async def find(admin: Any) -> Any:
        try:
            return await admin.view_message(msg_id, topic=topic)
        except QueryNotFoundError:
            if topic is not None:
                raise
        for name in sorted(await admin.list_topics()):
            found = await admin.query_messages(name, msg_id, unique=True, max_num=1)
            if found.messages:
                return found.messages[0]
        raise QueryNotFoundError(f"no message with id {msg_id}")

    _echo_messages([_message_doc(_admin(broker, find))], as_json)


@message.command("find")
@BROKER_OPTION
@click.option("--topic", "-t", required=True)
@click.option("--key", "-k", required=True, help="A key (KEYS) or, with --unique-key, a msgId.")
@click.option("--unique-key", is_flag=True, help="Match the message id (UNIQ_KEY) only.")
@click.option("--begin", help="Stored at or after: ms since the epoch or an ISO time.")
@click.option("--end", help="Stored at or before: ms since the epoch or an ISO time.")
@click.option(
    "--max",
    "--limit",
    "max_num",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="At most this many, newest first (asked for 64 at a time).",
)
@click.option(
    "--cursor", help="Start after this cursor (printed on stderr by a search cut by --max)."
)
@_output_options
def message_find(
    broker: str,
    topic: str,
    key: str,
    unique_key: bool,
    begin: str | None,
    end: str | None,
    max_num: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """Find messages of a topic by key, newest first."""
    from txmq.client.admin import MESSAGE_PAGE

    b, e = _parse_time(begin), _parse_time(end)

    async def fetch(admin: Any) -> tuple[list[Any], str | None]:
        async def page(n: int, after: str | None) -> Any:
            result, nxt = await admin.query_messages_page(
                topic, key, unique=unique_key, begin=b, end=e, limit=n, after=after
            )
            return result.messages, nxt

        return await _collect_pages(page, max_num, cursor, MESSAGE_PAGE)

    msgs, more = _admin(broker, fetch)
    docs = [_message_doc(m) for m in msgs]
    if not docs and not as_json:
        raise click.ClickException(f"no message of topic {topic} with key {key}")
    _echo_messages(docs, as_json)
    _more(more)
