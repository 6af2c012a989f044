"""``txmq consume``: print a topic's messages, as a consumer group or as a peek that moves no
group's offsets."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import click

from .common import BROKER_OPTION, _body_preview, _client_config, _run, output_option


@click.command()
@BROKER_OPTION
@click.argument("topic_name", metavar="TOPIC")
@click.option(
    "--group",
    "-g",
    help="Consume as this consumer group: join it, take a share of its queues and commit its "
    "offsets. Without it, peek: read the topic's queues, join no group, commit nothing (the "
    "pulls name group txmq-cli-peek: with the ACL on, an account needs SUB on it and on TOPIC).",
)
@click.option(
    "--expression", "-e", default="*", show_default=True, help="Tag filter: * or 'a || b'."
)
@click.option(
    "--from",
    "consume_from",
    type=click.Choice(["first", "last"]),
    default="first",
    show_default=True,
    help="Where a new group (or a peek) starts: the oldest stored message or only new ones.",
)
@click.option("--count", "-n", type=int, help="Stop after this many messages.")
@click.option("--timeout", type=float, help="Stop after this many seconds without a message.")
@output_option(
    "json", "One JSON line per message (for scripts), or one short line each for people."
)
def consume(
    broker: str,
    topic_name: str,
    group: str | None,
    expression: str,
    consume_from: str,
    count: int | None,
    timeout: float | None,
    output: str,
) -> None:
    """Print TOPIC's messages, one JSON line each (or, with -o table, one short line each): as
    consumer group GROUP (--group), or a peek that moves no group's offsets."""
    # The config is made here: the click context is not visible inside the loop.
    source = _Source(broker, _client_config(), topic_name, expression, consume_from)
    printer = _MessagePrinter(count, timeout, table=output == "table")
    if group is None:
        work = _peek(source, printer)
    else:
        work = _consume_as_group(source, group, printer)
    try:
        _run(work)
    except KeyboardInterrupt:
        pass


@dataclass(frozen=True)
class _Source:
    """What ``txmq consume`` reads: ``topic``'s messages matching ``expression`` on
    ``broker``, from the first or the last (``consume_from``)."""

    broker: str
    config: Any
    topic: str
    expression: str
    consume_from: str


class _MessagePrinter:
    """Prints messages as JSON lines and tells when ``count`` were printed, or when none came
    for ``timeout`` seconds (:meth:`idle`)."""

    def __init__(self, count: int | None, timeout: float | None, table: bool = False) -> None:
        self.table = table
        self.count = count
        self.timeout = timeout
        self.seen = 0
        self.last = time.monotonic()
        self.done = asyncio.Event()

    def __call__(self, msg: Any) -> None:
        doc = {
            "topic": msg.topic,
            "queueId": msg.queue_id,
            "queueOffset": msg.queue_offset,
            "msgId": msg.msg_id,
            "tags": msg.tags,
            "keys": msg.keys,
            "properties": msg.user_properties,
            "body": msg.body.decode("utf-8", "replace"),
        }
        if self.table:
            click.echo(
                f"{msg.topic} q{msg.queue_id}@{msg.queue_offset} {msg.msg_id} "
                f"tags={msg.tags or ''} {_body_preview(msg.body, 80)}"
            )
        else:
            click.echo(json.dumps(doc))
        self.seen += 1
        self.last = time.monotonic()
        if self.count is not None and self.seen >= self.count:
            self.done.set()

    def idle(self) -> bool:
        return self.timeout is not None and time.monotonic() - self.last > self.timeout


async def _consume_as_group(source: _Source, group: str, printer: _MessagePrinter) -> None:
    from txmq.client import AsyncPushConsumer

    consumer = AsyncPushConsumer(
        group, broker=source.broker, consume_from=source.consume_from, config=source.config
    )
    consumer.subscribe(source.topic, source.expression, printer)
    await consumer.start()
    try:
        while not printer.done.is_set() and not printer.idle():
            try:
                await asyncio.wait_for(printer.done.wait(), 0.5)
            except TimeoutError:
                pass
    finally:
        await consumer.shutdown()


#: The group name a peek's pulls carry: pulls without the commit flag store nothing for it, and
#: a pull consumer announces no group in its heartbeats.
PEEK_GROUP = "txmq-cli-peek"
#: How long a peek waits between rounds over the queues when none had a message.
PEEK_IDLE_PAUSE = 0.2


async def _peek(source: _Source, printer: _MessagePrinter) -> None:
    from txmq.client import AsyncPullConsumer, PullStatus

    topic = source.topic
    consumer = AsyncPullConsumer(PEEK_GROUP, broker=source.broker, config=source.config)
    await consumer.start()
    try:
        queues = await consumer.fetch_message_queues(topic)
        start = consumer.min_offset if source.consume_from == "first" else consumer.max_offset
        offsets = {q: await start(topic, q.queue_id, broker=q.broker) for q in queues}
        while not printer.done.is_set():
            found = False
            for q in queues:
                left = 32 if printer.count is None else printer.count - printer.seen
                res = await consumer.pull(
                    topic, q.queue_id, offsets[q], min(32, left), source.expression, broker=q.broker
                )
                if res.status is PullStatus.OFFSET_ILLEGAL:  # retention moved past it
                    offsets[q] = res.min_offset
                    continue
                offsets[q] = res.next_begin_offset
                for msg in res.messages:
                    found = True
                    printer(msg)
                    if printer.done.is_set():
                        return
            if not found:
                if printer.idle():
                    return
                await asyncio.sleep(PEEK_IDLE_PAUSE)
    finally:
        await consumer.shutdown()
