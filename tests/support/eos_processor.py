"""A consume-transform-produce processor for the exactly-once tests, run as a child process:
an orderly consumer of topic A with transactional offsets; each input becomes one output in
topic B (same queue id) naming the input's message id and this attempt, committed together
with the consumer offset in one transaction.

Usage: ``python eos_processor.py <broker> <group> <topic A> <topic B> <name> [delay_s]``.
It prints JSON lines on stdout (``ready``, ``committed``, ``failed``) and stops on SIGTERM.

With ``TXMQ_EOS_ACROSS=1`` in the environment each transaction is one across broker groups
(``transaction(across_groups=True)``: topic A and topic B in different groups of a cluster),
and the transaction's pause points (``TXMQ_TXN_PAUSE_AT``) include ``after-send``: the output
was sent, its consumer offset not yet.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid

from txmq.client import (
    AsyncOrderlyPushConsumer,
    AsyncTransactionProducer,
    ClientConfig,
    Message,
    MessageExt,
    RollbackOnCheck,
    TxmqError,
)
from txmq.client._txn_common import _pause_point

CONFIG = ClientConfig(
    request_timeout=3.0,
    heartbeat_interval=0.5,
    reconnect_backoff_initial=0.05,
    reconnect_backoff_max=0.5,
    rebalance_interval=1.0,
    long_poll_timeout=1.0,
    pull_backoff_on_error=0.1,
    shutdown_timeout=3.0,
)


def say(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, "pid": os.getpid(), **fields}), flush=True)


async def main(address: str, group: str, a: str, b: str, name: str, delay: float) -> None:
    across = os.environ.get("TXMQ_EOS_ACROSS") == "1"
    consumer = AsyncOrderlyPushConsumer(
        group,
        broker=address,
        consume_from="first",
        transactional_offsets=True,
        lock_interval=0.5,
        suspend_interval=0.05,
        config=CONFIG,
    )
    producer = AsyncTransactionProducer(
        f"{group}-producer", RollbackOnCheck(), broker=address, config=CONFIG
    )

    async def transform(msg: MessageExt) -> None:
        attempt = uuid.uuid4().hex
        out = {"input": msg.msg_id, "queue": msg.queue_id, "by": name, "attempt": attempt}
        try:
            async with producer.transaction(across_groups=across) as txn:
                await txn.send(Message(b, json.dumps(out).encode()), queue_id=msg.queue_id)
                await _pause_point("after-send")
                txn.send_offsets(consumer, msg)
                await asyncio.sleep(delay)  # the work: a window for kills and stops
        except TxmqError as exc:
            say("failed", input=msg.msg_id, attempt=attempt, error=f"{type(exc).__name__}: {exc}")
            raise
        say("committed", input=msg.msg_id, attempt=attempt)

    consumer.subscribe(a, "*", transform)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await producer.start()
    await consumer.start()
    say("ready", name=name)
    await stop.wait()
    await consumer.shutdown()
    await producer.shutdown()
    say("stopped")


if __name__ == "__main__":
    address, group, topic_a, topic_b, name, *rest = sys.argv[1:]
    asyncio.run(main(address, group, topic_a, topic_b, name, float(rest[0]) if rest else 0.0))
