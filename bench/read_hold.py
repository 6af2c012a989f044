"""What holding consumers' reads back to the fsynced end would cost under ``ASYNC_FLUSH``.

Under ``ASYNC_FLUSH`` a message is readable as soon as it is written (and answered then), and
fsynced by the next interval flush (``flushIntervalCommitLog``). A broker that let consumers
read only what is fsynced would show each message that much later. This measures it, on a
broker of this process (its store in a temporary folder, the shipped flush settings), with
an SDK producer sending one message every ``1 / --rate`` seconds:

* ``async``: each send's latency (send to answer), and per message the time from its answer
  to the first moment the store's fsynced offset covers it (sampled every millisecond): the
  delay a consumer would see on top if reads waited for the fsync;
* ``sync``: the same sends under ``SYNC_FLUSH``, the documented way to no-dirty-reads on one
  broker (a message is readable and answered only once fsynced): its send latency.

    python bench/read_hold.py                  # 200 messages/s for 10 s each way
    python bench/read_hold.py --rate 1000 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

from _broker import emit, percentiles, quiet_logs  # noqa: E402

from txmq.broker.config import BrokerConfig  # noqa: E402
from txmq.broker.server import BrokerController  # noqa: E402
from txmq.client import AsyncProducer, Message  # noqa: E402

TOPIC = "bench-read-hold"


async def measure(flush: str, rate: float, seconds: float) -> dict[str, object]:
    """Send at ``rate`` for ``seconds`` to a fresh broker flushing as ``flush``; the send
    latencies (ms) and, per message, how long after its answer it was fsynced (ms)."""
    with tempfile.TemporaryDirectory(prefix="txmq-read-hold-") as root:
        broker = BrokerController(
            BrokerConfig(store_path_root_dir=root, listen_port=0, flush_disk_type=flush)
        )
        await broker.start()
        store = broker.store
        #: (answered at, end offset) of messages not yet seen fsynced
        waiting: list[tuple[float, int]] = []
        hold_ms: list[float] = []
        stop = asyncio.Event()

        async def watch_fsyncs() -> None:
            while not stop.is_set() or waiting:
                flushed = store.flushed_offset
                now = time.perf_counter()
                while waiting and waiting[0][1] <= flushed:
                    hold_ms.append((now - waiting.pop(0)[0]) * 1000)
                await asyncio.sleep(0.001)

        producer = AsyncProducer("bench-read-hold", broker=broker.address)
        await producer.start()
        send_ms: list[float] = []
        watcher = asyncio.create_task(watch_fsyncs())
        try:
            await producer.send(Message(TOPIC, b"warm-up"))
            period = 1.0 / rate
            start = time.perf_counter()
            n = int(rate * seconds)
            for i in range(n):
                due = start + i * period
                pause = due - time.perf_counter()
                if pause > 0:
                    await asyncio.sleep(pause)
                t0 = time.perf_counter()
                await producer.send(Message(TOPIC, b"x" * 256))
                t1 = time.perf_counter()
                send_ms.append((t1 - t0) * 1000)
                # one send in flight: the log's end is this message's end
                waiting.append((t1, store.max_phy_offset))
            stop.set()
            await asyncio.wait_for(watcher, timeout=10.0)
        finally:
            watcher.cancel()
            await producer.shutdown()
            await broker.shutdown()
    out: dict[str, object] = {"send_ms": _rounded(percentiles(send_ms))}
    if flush == "ASYNC_FLUSH":
        out["fsynced_after_answer_ms"] = _rounded(percentiles(hold_ms))
        out["fsynced_after_answer_mean_ms"] = round(sum(hold_ms) / max(1, len(hold_ms)), 1)
    return out


def _rounded(d: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 2) for k, v in d.items()}


async def main(args: argparse.Namespace) -> None:
    quiet_logs()
    doc: dict[str, object] = {"rate": args.rate, "seconds": args.seconds}
    for flush in ("ASYNC_FLUSH", "SYNC_FLUSH"):
        got = await measure(flush, args.rate, args.seconds)
        for k, v in got.items():
            doc[f"{flush.split('_')[0].lower()}_{k}"] = v
    emit(doc)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0, help="messages a second")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds each way")
    asyncio.run(main(parser.parse_args()))
