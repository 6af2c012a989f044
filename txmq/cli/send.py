"""``txmq send``: send messages to a topic, one result line each."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from .common import BROKER_OPTION, OUTPUT_OPTION, _client_config, _parse_sets, _run


def _props(values: tuple[str, ...]) -> dict[str, str]:
    try:
        return _parse_sets(values)
    except click.BadParameter as exc:
        raise click.BadParameter(str(exc), param_hint="--property") from None


@click.command()
@BROKER_OPTION
@click.argument("topic_name", metavar="TOPIC")
@click.argument("body", required=False)
@click.option("--tags", "-t", help="Message tag.")
@click.option("--keys", "-k", help="Message keys.")
@click.option("--property", "-P", "properties", multiple=True, metavar="KEY=VALUE")
@click.option("--group", "-g", default="txmq-cli-producer", show_default=True)
@click.option("--count", "-n", default=1, show_default=True, help="Send BODY this many times.")
@click.option("--stdin", "from_stdin", is_flag=True, help="Send one message per line of stdin.")
@OUTPUT_OPTION
def send(
    broker: str,
    topic_name: str,
    body: str | None,
    tags: str | None,
    keys: str | None,
    properties: tuple[str, ...],
    group: str,
    count: int,
    from_stdin: bool,
    output: str,
) -> None:
    """Send BODY (or stdin lines) to TOPIC; prints one result line per message (with -o json,
    one JSON object per line)."""
    from txmq.client import AsyncProducer, Message

    if body is None and not from_stdin:
        raise click.UsageError("give a BODY or --stdin")
    props = _props(properties)
    config = _client_config()  # here: the click context is not visible inside the loop

    async def go() -> None:
        async with AsyncProducer(group, broker=broker, config=config) as producer:
            bodies = (
                (line.rstrip("\n") for line in sys.stdin)
                if from_stdin
                else (body for _ in range(count))
            )
            for b in bodies:
                r = await producer.send(
                    Message(topic_name, (b or "").encode(), tags=tags, keys=keys, properties=props)
                )
                status = r.status.name if hasattr(r.status, "name") else str(r.status)
                if output == "json":
                    doc: dict[str, Any] = {"status": status, "msgId": r.msg_id}
                    doc |= {"offsetMsgId": r.offset_msg_id, "queueId": r.queue_id}
                    doc["queueOffset"] = r.queue_offset
                    click.echo(json.dumps(doc))
                    continue
                click.echo(
                    f"{status} msgId={r.msg_id} offsetMsgId={r.offset_msg_id} "
                    f"queue={r.queue_id} offset={r.queue_offset}"
                )

    _run(go())
