"""Memory of the transaction table: how much a broker holds for N decided transactions.

Drives the broker's transaction state machine (the same code the broker runs for every half
and decision) with N one-message transactions at a steady rate on a simulated clock, pruning
once per simulated second as the check loop does, and prints the peak RSS, the bytes per
remembered transaction and how many were remembered at the end.

    python bench/tx_memory.py --count 10000000 --rate 5000 --retention 300
"""

from __future__ import annotations

import argparse
import resource
import time

from txmq.broker.transaction.machine import TransactionStateMachine
from txmq.broker.transaction.state import Decision, HalfRef


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1_000_000, help="transactions decided")
    ap.add_argument("--rate", type=int, default=5000, help="decisions per simulated second")
    ap.add_argument(
        "--retention", type=float, default=300.0, help="transactionDecidedRetention, seconds"
    )
    args = ap.parse_args()
    m = TransactionStateMachine()
    base = rss_mib()
    t0 = time.perf_counter()
    start_ms = 1_700_000_000_000
    peak_remembered = 0
    retention_ms = int(args.retention * 1000)
    for i in range(args.count):
        now = start_ms + i * 1000 // args.rate
        txid = f"C0A80001{i:024X}"
        half = HalfRef(i * 1000, i, "orders", i % 8, now, txid, f"C0A8000100002A9F{i * 1000:016X}")
        rec = m.add_half(txid, "orders-tx", None, half)
        op = m.plan_decision(rec, Decision.COMMIT, "producer", now)
        assert op is not None
        m.apply(op, i * 1000 + 900)
        if i % args.rate == 0:  # once per simulated second, as the check loop does
            m.prune(now - retention_ms, 0)
            peak_remembered = max(peak_remembered, len(m.records))
    elapsed = time.perf_counter() - t0
    peak = rss_mib() - base
    print(
        f"{args.count:,} decided at {args.rate:,}/s (simulated), retention {args.retention:g}s: "
        f"peak RSS +{peak:,.0f} MiB over a {base:,.0f} MiB interpreter, "
        f"{peak * 1048576 / max(peak_remembered, 1):,.0f} B per remembered transaction, "
        f"at most {peak_remembered:,} remembered, {len(m.records):,} at the end; "
        f"{elapsed:,.1f}s ({elapsed / args.count * 1e6:.1f} us per half+decision)"
    )


if __name__ == "__main__":
    main()
