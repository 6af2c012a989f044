"""What the operator's metrics cost: the request latency histogram per request, and the
scrape-time figures (consumer lag, disk, transactions) per scrape.

    python bench/metrics_cost.py                       # 1,000,000 observes; 20 x 10 x 4 queues
    python bench/metrics_cost.py --groups 100 --topics 20

Prints nanoseconds per ``observe()`` of a cached histogram child, the timing wrapper's cost per
request over a bare processor call, and milliseconds per refresh of the scrape-time figures of
an in-process broker whose every (group, topic, queue) lags by one message (the worst case: one
message header read per queue)."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import timeit
from typing import Any

from txmq.broker.config import BrokerConfig
from txmq.broker.metrics import BrokerMetrics
from txmq.broker.server import BrokerController
from txmq.protocol.message import MessageExt


def observe_ns(rounds: int) -> float:
    child = BrokerMetrics().request_latency.labels("310")
    t = timeit.timeit(lambda: child.observe(0.0007), number=rounds)
    base = timeit.timeit(lambda: None, number=rounds)
    return (t - base) / rounds * 1e9


async def wrapper_ns(rounds: int) -> float:
    async def proc(conn: Any, cmd: Any) -> None:
        return None

    timed = BrokerMetrics().timed({310: proc})[310]

    async def run(fn: Any) -> float:
        t0 = time.perf_counter()
        for _ in range(rounds):
            await fn(None, None)
        return time.perf_counter() - t0

    bare = await run(proc)
    return (await run(timed) - bare) / rounds * 1e9


async def refresh_ms(groups: int, topics: int, queues: int, repeats: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        b = BrokerController(BrokerConfig(store_path_root_dir=d, listen_port=0))
        await b.start()
        try:
            for t in range(topics):
                for q in range(queues):
                    msgs = [MessageExt(f"t{t}", b"x" * 100, queue_id=q) for _ in range(2)]
                    b.put_messages(msgs)
            for g in range(groups):
                for t in range(topics):
                    for q in range(queues):
                        b.offsets.commit(f"g{g}", f"t{t}", q, 1)
            registry = b.metrics.registry
            registry.refresh()
            t0 = time.perf_counter()
            for _ in range(repeats):
                registry.refresh()
            return (time.perf_counter() - t0) / repeats * 1000
        finally:
            await b.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1_000_000, help="observe() calls")
    ap.add_argument("--groups", type=int, default=20)
    ap.add_argument("--topics", type=int, default=10)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=20, help="refreshes timed")
    a = ap.parse_args()
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    print(f"histogram observe():        {observe_ns(a.rounds):7.0f} ns")
    print(f"timed processor wrapper:    {asyncio.run(wrapper_ns(a.rounds // 3)):7.0f} ns/request")
    lagging = a.groups * a.topics * a.queues
    ms = asyncio.run(refresh_ms(a.groups, a.topics, a.queues, a.repeats))
    print(
        f"scrape-time refresh:        {ms:7.1f} ms for {lagging} lagging queues "
        f"({ms * 1000 / lagging:.1f} us each)"
    )


if __name__ == "__main__":
    main()
