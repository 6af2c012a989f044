"""Consume-transform-produce, exactly once: topic ``orders`` -> this service -> ``billing``.

Each order (JSON ``{"order_id", "amount"}``) becomes one billing message (the amount in cents,
naming the order's message id).  The service is an orderly consumer with transactional
offsets: the billing message and the consumer offset past the order are committed in one
producer transaction, so after a crash, a kill or a pause of any instance, every order is billed
exactly once.  Run several instances at once: they share the queues, and an instance that lost
its queues in a rebalance (or was paused and came back) cannot commit for them.

Try it against a local broker (``make run`` starts one on 127.0.0.1:10911)::

    python examples/consume_transform_produce.py seed --count 100
    python examples/consume_transform_produce.py run          # Ctrl-C stops it
    python examples/consume_transform_produce.py show         # billing messages per order
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from collections import Counter
from collections.abc import Sequence

from txmq.client import (
    AsyncOrderlyPushConsumer,
    AsyncProducer,
    AsyncPullConsumer,
    AsyncTransactionProducer,
    FencedError,
    Message,
    MessageExt,
    RollbackOnCheck,
)

DEFAULT_BROKER = "127.0.0.1:10911"


def bill(order: MessageExt) -> bytes:
    """The transformation: one billing record per order."""
    doc = json.loads(order.body)
    return json.dumps(
        {"order": order.msg_id, "order_id": doc["order_id"], "cents": round(doc["amount"] * 100)}
    ).encode()


async def run(broker: str, source: str, sink: str, group: str) -> None:
    consumer = AsyncOrderlyPushConsumer(
        group, broker=broker, consume_from="first", transactional_offsets=True
    )
    # Transactions the broker asks about were never confirmed: roll them back (the queue's
    # owner handles their order again).
    producer = AsyncTransactionProducer(f"{group}-producer", RollbackOnCheck(), broker=broker)

    async def transform(order: MessageExt) -> None:
        try:
            async with producer.transaction() as txn:
                await txn.send(Message(sink, bill(order)), queue_id=order.queue_id)
                txn.send_offsets(consumer, order)  # moves only if the billing is committed
        except FencedError as exc:
            # another instance owns the queue now: nothing was billed, the offset did not move
            print(f"fenced, not billed: {exc}")
            raise

    consumer.subscribe(source, "*", transform)
    stop = asyncio.Event()
    with contextlib.suppress(NotImplementedError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with producer, consumer:
        print(f"billing {source} -> {sink} as a member of {group}; Ctrl-C stops")
        await stop.wait()


async def seed(broker: str, source: str, count: int) -> None:
    async with AsyncProducer("orders-seeder", broker=broker) as p:
        for i in range(count):
            body = json.dumps({"order_id": f"o-{i}", "amount": 1.5 + i}).encode()
            await p.send(Message(source, body), sharding_key=f"o-{i}")
    print(f"published {count} orders to {source}")


async def show(broker: str, sink: str) -> None:
    per_order: Counter[str] = Counter()
    async with AsyncPullConsumer("billing-viewer", broker=broker) as pc:
        for q in await pc.fetch_queues(sink):
            offset, end = await pc.min_offset(sink, q), await pc.max_offset(sink, q)
            while offset < end:
                r = await pc.pull(sink, q, offset, 64)
                per_order.update(json.loads(m.body)["order"] for m in r.messages)
                offset = r.next_begin_offset
    twice = sum(1 for n in per_order.values() if n > 1)
    print(f"{sum(per_order.values())} billing messages, {len(per_order)} orders, {twice} twice")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("command", choices=["seed", "run", "show"])
    ap.add_argument("--broker", default=DEFAULT_BROKER)
    ap.add_argument("--source", default="orders")
    ap.add_argument("--sink", default="billing")
    ap.add_argument("--group", default="billing-service")
    ap.add_argument("--count", type=int, default=100)
    args = ap.parse_args(argv)
    if args.command == "seed":
        asyncio.run(seed(args.broker, args.source, args.count))
    elif args.command == "run":
        asyncio.run(run(args.broker, args.source, args.sink, args.group))
    else:
        asyncio.run(show(args.broker, args.sink))


if __name__ == "__main__":
    main()
