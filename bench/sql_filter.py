"""Pull throughput with a SQL92 property filter against the same pull unfiltered.

    python bench/sql_filter.py                       # 50,000 messages of 1 KiB, one queue
    python bench/sql_filter.py --messages 200000 --size 1024 --rounds 3

Fills one queue of a broker in a child process with ``--messages`` messages of ``--size`` bytes,
each with a few user properties (``a`` a number, ``region``, a tag), then reads the whole queue
with one pull consumer, ``--max`` messages a pull, in three ways (best of ``--rounds`` each):

* ``unfiltered``   expression ``*``
* ``sql_all``      ``a >= 0 AND region IN ('eu', 'us') AND TAGS IS NOT NULL``: three clauses
                   every message passes, so the same bytes cross the wire and only the broker's
                   evaluation differs
* ``sql_half``     ``a >= 0 AND region = 'eu' AND TAGS IS NOT NULL``: half the messages pass

Prints messages scanned per second (the queue walked) and delivered per second for each, and
the ratio of the filtered scans to the unfiltered one (the target: at least 0.5).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from _broker import broker_process, emit, quiet_logs  # noqa: E402

from txmq.client import AsyncProducer, AsyncPullConsumer, Message, sql  # noqa: E402

SQL_ALL = "a >= 0 AND region IN ('eu', 'us') AND TAGS IS NOT NULL"
SQL_HALF = "a >= 0 AND region = 'eu' AND TAGS IS NOT NULL"


async def fill(address: str, topic: str, n: int, size: int) -> None:
    body = b"x" * size
    async with AsyncProducer("bench-sql-producer", broker=address) as p:
        batch = 64
        for start in range(0, n, batch):
            msgs = []
            for i in range(start, min(n, start + batch)):
                m = Message(topic, body, tags="TagA")
                m.properties["a"] = str(i)
                m.properties["region"] = "eu" if i % 2 == 0 else "us"
                msgs.append(m)
            await p.send_batch(msgs, queue_id=0)


async def read_all(pc: AsyncPullConsumer, topic: str, expression: str, max_nums: int) -> int:
    delivered = 0
    offset = 0
    end = await pc.max_offset(topic, 0)
    while offset < end:
        r = await pc.pull(topic, 0, offset, max_nums=max_nums, expression=expression)
        delivered += len(r.messages)
        offset = r.next_begin_offset
    return delivered


async def run(args: argparse.Namespace, address: str) -> dict[str, object]:
    topic = args.topic
    await fill(address, topic, args.messages, args.size)
    modes = {"unfiltered": "*", "sql_all": sql(SQL_ALL), "sql_half": sql(SQL_HALF)}
    out: dict[str, object] = {"messages": args.messages, "size": args.size, "max": args.max}
    rates: dict[str, float] = {}
    async with AsyncPullConsumer("bench-sql-reader", broker=address) as pc:
        for name, expression in modes.items():
            best = float("inf")
            delivered = 0
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                delivered = await read_all(pc, topic, expression, args.max)
                best = min(best, time.perf_counter() - t0)
            rates[name] = args.messages / best
            out[f"{name}_scanned_per_s"] = round(rates[name])
            out[f"{name}_delivered_per_s"] = round(delivered / best)
            out[f"{name}_delivered"] = delivered
    out["sql_all_vs_unfiltered"] = round(rates["sql_all"] / rates["unfiltered"], 3)
    out["sql_half_vs_unfiltered"] = round(rates["sql_half"] / rates["unfiltered"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--broker", help="use this broker instead of starting one")
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--max", type=int, default=32, help="messages a pull asks for")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--topic", default="bench-sql")
    args = ap.parse_args()
    quiet_logs()
    with broker_process(address=args.broker) as address:
        emit(asyncio.run(run(args, address)))


if __name__ == "__main__":
    main()
