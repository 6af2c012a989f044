"""Timer messages: the broker's memory per pending timer, and how late timers fire.

Starts a broker (a child process on a temporary store, ASYNC_FLUSH) and:

1. stores ``--timers`` timer messages (SEND_MESSAGE_V2 with ``TIMER_DELIVER_MS``, many in
   flight) due a day ahead, spread over ``--window`` seconds, and prints the broker's memory
   growth per pending timer: anonymous memory (``RssAnon``, what the index and the process
   hold; the duplicate window is off, it would count the UNIQ_KEYs of the last 120 s) and all
   of RSS (which also counts the commit-log pages read through the mapping);
2. restarts the broker (SIGTERM, then a new one on the store) and prints how long it took to
   answer again, the pending timers rebuilt;
3. with those still pending, stores ``--rate`` x ``--seconds`` timers due over ``--seconds``
   seconds starting once they are all stored (``--rate`` timers a second fire), waits until
   they fired, and prints the lateness percentiles of the copies: each copy's store time minus
   its delivery time, in ms (never negative: a copy stored early would be a bug).

    python bench/timers.py                      # 100,000 pending, 10,000 timers/s for 10 s
    python bench/timers.py --timers 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

from _broker import emit, percentiles, quiet_logs, send_raw, spawn_broker  # noqa: E402

from txmq.client import AsyncPullConsumer  # noqa: E402

PENDING_TOPIC = "bench-timers-pending"
FIRE_TOPIC = "bench-timers-fire"
QUEUES = 4
DAY_MS = 86_400_000


def proc_mem_mib(pid: int) -> dict[str, float]:
    """VmRSS and RssAnon of process ``pid`` (MiB)."""
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("VmRSS", "RssAnon"):
                out[key] = int(line.split()[1]) / 1024
    return out


async def store_timers(
    address: str, topic: str, deliveries: list[int], body: bytes, in_flight: int, conns: int
) -> float:
    """Store one timer message per delivery time (``in_flight`` sends at a time on each of
    ``conns`` connections); returns the seconds it took."""
    return await send_raw(
        address,
        group="bench-timers",
        topic=topic,
        queues=QUEUES,
        sys_flag=0,
        body=body,
        properties=({"TIMER_DELIVER_MS": str(d)} for d in deliveries),
        in_flight=in_flight,
        conns=conns,
    )


async def lateness(address: str, topic: str, want: int, timeout: float) -> list[float]:
    """Read the fired copies of ``topic`` until ``want`` are there: each one's lateness (ms)."""
    late: list[float] = []
    offsets = dict.fromkeys(range(QUEUES), 0)
    consumer = AsyncPullConsumer("bench-timers-reader", broker=address)
    await consumer.start()
    deadline = time.monotonic() + timeout
    try:
        while len(late) < want and time.monotonic() < deadline:
            got = 0
            for qid in offsets:
                r = await consumer.pull(topic, qid, offsets[qid], max_nums=256)
                for m in r.messages:
                    late.append(m.store_timestamp - int(m.properties["TIMER_DELIVER_MS"]))
                got += len(r.messages)
                offsets[qid] = r.next_begin_offset
            if not got:
                await asyncio.sleep(0.2)
    finally:
        await consumer.shutdown()
    return late


async def fill(args: argparse.Namespace, address: str, pid: int) -> dict[str, Any]:
    body = b"t" * args.body
    doc: dict[str, Any] = {"timers": args.timers}
    # Warm up (connections, topic creation) before the memory baseline.
    now = int(time.time() * 1000)
    await store_timers(address, PENDING_TOPIC, [now + DAY_MS] * 1000, body, 64, 1)
    before = proc_mem_mib(pid)
    now = int(time.time() * 1000)
    window_ms = args.window * 1000
    deliveries = [now + DAY_MS + i * window_ms // args.timers for i in range(args.timers)]
    secs = await store_timers(
        address, PENDING_TOPIC, deliveries, body, args.in_flight, args.connections
    )
    await asyncio.sleep(2.0)  # the timer service reads what was stored
    after = proc_mem_mib(pid)
    doc["store_s"] = round(secs, 1)
    doc["stores_per_s"] = round(args.timers / secs)
    doc["rss_before_mib"] = round(before["VmRSS"], 1)
    doc["rss_after_mib"] = round(after["VmRSS"], 1)
    doc["rss_bytes_per_timer"] = round((after["VmRSS"] - before["VmRSS"]) * 2**20 / args.timers)
    doc["anon_bytes_per_timer"] = round(
        (after["RssAnon"] - before["RssAnon"]) * 2**20 / args.timers
    )
    doc["_secs"] = secs
    return doc


async def fire(args: argparse.Namespace, address: str, pid: int, secs: float) -> dict[str, Any]:
    body = b"t" * args.body
    doc: dict[str, Any] = {}
    # Firing: rate x seconds timers, due once they are all stored (estimated from the rate
    # just measured, with a margin).
    n = args.rate * args.seconds
    lead_ms = int(n / (args.timers / secs) * 1500) + 3000
    start = int(time.time() * 1000) + lead_ms
    due = [start + i * 1000 // args.rate for i in range(n)]
    secs2 = await store_timers(address, FIRE_TOPIC, due, body, args.in_flight, args.connections)
    if (time.time() * 1000) > start:
        doc["warning"] = "the firing timers took longer to store than the lead: some fired late"
    late = await lateness(address, FIRE_TOPIC, n, args.seconds + lead_ms / 1000 + 120)
    doc["fire_timers"] = n
    doc["fire_rate_per_s"] = args.rate
    doc["fire_store_s"] = round(secs2, 1)
    doc["fired"] = len(late)
    doc["early"] = sum(1 for x in late if x < 0)
    doc["lateness_ms"] = percentiles(late)
    doc["rss_end_mib"] = round(proc_mem_mib(pid)["VmRSS"], 1)
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timers", type=int, default=100_000, help="pending timers stored")
    ap.add_argument("--window", type=int, default=3600, help="seconds the pending ones span")
    ap.add_argument("--rate", type=int, default=10_000, help="timers fired a second")
    ap.add_argument("--seconds", type=int, default=10, help="seconds of firing")
    ap.add_argument("--body", type=int, default=128, help="body bytes")
    ap.add_argument("--in-flight", type=int, default=256, help="sends in flight a connection")
    ap.add_argument("--connections", type=int, default=2, help="sending connections")
    args = ap.parse_args()
    quiet_logs()
    # The duplicate window is off: it keeps every UNIQ_KEY sent in the last 120 s, which would
    # be counted here as the timers' memory.
    settings: dict[str, object] = {"mappedFileSizeCommitLog": 1 << 30, "duplicateWindowSeconds": 0}
    with tempfile.TemporaryDirectory(prefix="txmq-bench-timers-") as tmp:
        with spawn_broker(tmp, settings) as (address, pid):
            doc = asyncio.run(fill(args, address, pid))
        # Restart (SIGTERM above): how long until the broker answers with every timer pending.
        t0 = time.monotonic()
        with spawn_broker(tmp, settings) as (address, pid):
            doc["restart_s"] = round(time.monotonic() - t0, 1)
            doc["rss_after_restart_mib"] = round(proc_mem_mib(pid)["VmRSS"], 1)
            doc.update(asyncio.run(fire(args, address, pid, doc.pop("_secs"))))
        emit(doc)


if __name__ == "__main__":
    main()
