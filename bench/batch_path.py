"""The broker's own work per message of a pipelined send, in one process: a SEND_BATCH_MESSAGE
body parsed by the batch fast path, checked against and remembered in the duplicate window,
appended to a real store in a temporary folder, answered (its message ids joined), and then
drained as a consumer's pulls read it (joined reads of the queue).  No sockets, no event loop:
what is left of the broker's CPU per message once the network is taken out.

    python bench/batch_path.py                      # this checkout
    PYTHONPATH=/other/checkout python bench/batch_path.py
    python bench/batch_path.py --no-dedup --profile # calls per message, window off

Prints CPU µs per message (process time, the median of ``--repeats``) for each stage and,
with ``--profile``, Python calls per message from cProfile.
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import pstats
import statistics
import time
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from _scratch import scratch_dir

from txmq.broker.messaging.dedup import DedupIndex
from txmq.broker.messaging.fastpath_batch import parse_batch
from txmq.broker.metrics import BrokerMetrics
from txmq.broker.store import MessageStore, StoreConfig
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import BatchBody, MessageConst, properties_to_string

TOPIC = "bench-batch"
QUEUE = 1
_first = itemgetter(0)


def bodies(batches: int, per_batch: int, size: int) -> list[bytes]:
    """Batch bodies as the SDK's auto-batching sends them: a UNIQ_KEY each, the rest alike."""
    out = []
    payload = b"x" * size
    for k in range(batches):
        b = BatchBody()
        for i in range(per_batch):
            props = {MessageConst.UNIQ_KEY: f"7F0000010001{k:08X}{i:012X}", "WAIT": "true"}
            b.add(payload, properties_to_string(props).encode(), 0)
        out.append(b.encode())
    return out


def run(args: argparse.Namespace, data: list[bytes]) -> dict[str, float]:
    """One pass over ``data`` on a fresh store: CPU seconds per stage."""
    with scratch_dir("txmq-batchpath-") as folder:
        return run_in(args, data, str(folder))


def run_in(args: argparse.Namespace, data: list[bytes], folder: str) -> dict[str, float]:
    """:func:`run` on a store in ``folder``."""
    store = MessageStore(StoreConfig(folder), ("127.0.0.1", 10911))
    store.load()
    window_ms = 0 if args.no_dedup else 120_000
    dedup: Any = DedupIndex(window_ms, args.window_ids, BrokerMetrics())
    bulk = hasattr(dedup, "fresh")
    header = SendMessageRequestHeader(
        producer_group="g",
        topic=TOPIC,
        default_topic_queue_nums=4,
        queue_id=QUEUE,
        sys_flag=0,
        born_timestamp=int(time.time() * 1000),
        flag=0,
        properties="",
        batch=True,
        reconsume_times=0,
    )
    one_run: dict[str, Any] = (
        {"one_run": True} if "one_run" in inspect.signature(store.put_encoded).parameters else {}
    )
    host = ("127.0.0.1", 40000)
    prefix = "7F00000100002A9F"
    clock = time.process_time
    spent = {"send": 0.0, "drain": 0.0}
    try:
        t0 = clock()
        for body in data:
            batch = parse_batch(header, QUEUE, body, host, 4 << 20, _no_halves)
            assert batch is not None, "the bench batch did not take the fast path"
            uniqs = batch.uniq_keys
            fresh = dedup.fresh(TOPIC, uniqs) if dedup.enabled and bulk else None
            if bulk and dedup.enabled and fresh is None:
                raise RuntimeError("a bench id was seen twice")
            if not bulk and dedup.enabled:  # a checkout from before DedupIndex.fresh
                if dedup.any_known(TOPIC, uniqs) or len(set(uniqs)) < len(uniqs):
                    raise RuntimeError("a bench id was seen twice")
            res = store.put_encoded(batch.records, **one_run)
            if fresh is not None:
                dedup.add_fresh(TOPIC, fresh, res.placed, res.store_timestamp)
            elif dedup.enabled:
                dedup.add_many(TOPIC, uniqs, list(map(_first, res.placed)), res.store_timestamp)
            ",".join(map((prefix + "%016X").__mod__, map(_first, res.placed)))
        t1 = clock()
        offset = 0
        while True:
            r = store.get_messages(TOPIC, QUEUE, offset, 32, joined=True)
            if not r.count:
                break
            offset = r.next_begin_offset
        spent["send"], spent["drain"] = t1 - t0, clock() - t1
    finally:
        store.close()
    return spent


def _no_halves(*_: Any) -> None:
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--per-batch", type=int, default=200, help="messages per batch (default 200)")
    ap.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-dedup", action="store_true", help="duplicate window off")
    ap.add_argument(
        "--window-ids",
        type=int,
        default=200_000,
        help="duplicateWindowMaxEntries (default 200,000, the broker's)",
    )
    ap.add_argument("--profile", action="store_true", help="also count calls per message")
    args = ap.parse_args()
    data = bodies(args.batches, args.per_batch, args.size)
    n = args.batches * args.per_batch
    runs = [run(args, data) for _ in range(args.repeats)]
    for stage in ("send", "drain"):
        us = statistics.median(r[stage] for r in runs) / n * 1e6
        print(f"{stage:6} {us:6.2f} µs/msg")
    if args.profile:
        prof = cProfile.Profile()
        call: Callable[[], Any] = lambda: run(args, data)  # noqa: E731
        prof.runcall(call)
        calls = pstats.Stats(prof).total_calls  # type: ignore[attr-defined]
        print(f"calls  {calls / n:6.1f} per message (send and drain, one pass)")


if __name__ == "__main__":
    main()
