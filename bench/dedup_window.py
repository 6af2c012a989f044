"""The duplicate window's own work per message, in one process: batches of new UNIQ_KEYs (made
fresh for each batch, as a parse makes them) checked against the window and remembered, far past
``duplicateWindowMaxEntries`` so that the window is full for most of the run; minus the same
loop with the window off.  No store, no sockets: what the window adds to a pipelined send.

    python bench/dedup_window.py                      # this checkout
    PYTHONPATH=/other/checkout python bench/dedup_window.py

Prints CPU µs per message (process time) of each repeat.
"""

from __future__ import annotations

import argparse
import logging
import time
from operator import itemgetter
from typing import Any

import structlog

from txmq.broker.messaging.dedup import DedupIndex
from txmq.broker.metrics import BrokerMetrics

_first = itemgetter(0)


def run(raws: list[bytes], per_batch: int, max_entries: int, on: bool) -> float:
    """One pass: CPU seconds."""
    d: Any = DedupIndex(120_000 if on else 0, max_entries, BrokerMetrics())
    bulk = hasattr(d, "fresh")  # a checkout from before DedupIndex.fresh has any_known
    offset = 0
    t0 = time.process_time()
    for k, raw in enumerate(raws):
        uniqs = raw.decode().split("\x02")
        placed = [(offset + i * 1100, 1100, i) for i in range(per_batch)]
        offset += per_batch * 1100
        now = 1_000 + k // 50
        if not d.enabled:
            continue
        if bulk:
            fresh = d.fresh("t", uniqs)
            if fresh is None:
                raise RuntimeError("a bench id was seen twice")
            d.add_fresh("t", fresh, placed, now)
        else:
            if d.any_known("t", uniqs) or len(set(uniqs)) < len(uniqs):
                raise RuntimeError("a bench id was seen twice")
            d.add_many("t", uniqs, list(map(_first, placed)), now)
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--per-batch", type=int, default=200)
    ap.add_argument("--window-ids", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    b = args.per_batch
    raws = [
        b"\x02".join(b"7F0000010F2A%08X%012X" % (k, i) for i in range(b))
        for k in range(args.messages // b)
    ]
    n = len(raws) * b
    for _ in range(args.repeats):
        on = run(raws, b, args.window_ids, True)
        off = run(raws, b, args.window_ids, False)
        print(f"window {(on - off) / n * 1e6:.3f} µs/msg", flush=True)


if __name__ == "__main__":
    main()
