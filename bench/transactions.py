"""Transactional benchmark and correctness audit, in the spirit of RocketMQ's
TransactionProducer benchmark.

N producers of one group send transactional messages whose body says what the producer will
decide: commit, rollback, unknown then commit (or rollback) on the k-th check, or unknown
forever.  Afterwards a reader pulls every queue of the topic and audits that exactly the
committed set was delivered, once each.

    python bench/transactions.py --producers 8 --seconds 15

Prints transactions/s, latency percentiles from send to the acknowledged decision, checks sent
(broker metric), unexpected checks (a check for a transaction the producer had already
decided), duplicated checks (a check for a transaction whose previous check was still being
answered), and the audit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(__file__))

from _broker import broker_process, drain_topic, emit, percentiles, quiet_logs  # noqa: E402

from txmq.client import (  # noqa: E402
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
    TransactionListener,
)
from txmq.client.admin import AsyncAdminClient  # noqa: E402

C, R, U = (
    LocalTransactionState.COMMIT_MESSAGE,
    LocalTransactionState.ROLLBACK_MESSAGE,
    LocalTransactionState.UNKNOW,
)
KINDS = ["commit", "rollback", "check-commit", "check-rollback", "unknown"]


class AuditListener(TransactionListener):
    """One instance shared by all producers: any of them may receive a transaction's check."""

    def __init__(self) -> None:
        self.decided: dict[str, str] = {}  # transaction key -> final decision given
        self.checks: Counter[str] = Counter()
        self.in_check: set[str] = set()
        self.unexpected = 0
        self.duplicated = 0

    async def execute_local_transaction(self, message, arg):  # type: ignore[override]
        key = message.body.decode().rstrip("x")
        kind = key.split(":")[0]
        if kind == "commit":
            self.decided[key] = "commit"
            return C
        if kind == "rollback":
            self.decided[key] = "rollback"
            return R
        return U

    async def check_local_transaction(self, message):  # type: ignore[override]
        key = message.body.decode().rstrip("x")
        if key in self.decided:
            self.unexpected += 1
        if key in self.in_check:
            self.duplicated += 1
        self.in_check.add(key)
        try:
            self.checks[key] += 1
            kind, _, rest = key.partition(":")
            k = int(rest.split(":")[0])
            if kind == "check-commit" and self.checks[key] >= k:
                self.decided[key] = "commit"
                return C
            if kind == "check-rollback" and self.checks[key] >= k:
                self.decided[key] = "rollback"
                return R
            if kind in ("commit", "rollback"):  # decided before; answer the same again
                return C if kind == "commit" else R
            return U
        finally:
            self.in_check.discard(key)


async def run(args: argparse.Namespace, address: str) -> dict[str, object]:
    rnd = random.Random(args.seed)
    audit = AuditListener()
    listeners = [audit]
    producers = [
        AsyncTransactionProducer(args.group, audit, address, check_threads=8)
        for _ in range(args.producers)
    ]
    for p in producers:
        await p.start()
    intents: dict[str, str] = {}
    latencies: list[float] = []
    stop_at = time.monotonic() + args.seconds
    weights = [
        args.w_commit,
        args.w_rollback,
        args.w_check_commit,
        args.w_check_rollback,
        args.w_unknown,
    ]

    async def worker(i: int) -> None:
        n = 0
        while time.monotonic() < stop_at:
            kind = rnd.choices(KINDS, weights)[0]
            k = rnd.randint(1, args.max_check)
            body = f"{kind}:{k}:p{i}-{n}"
            n += 1
            t0 = time.perf_counter()
            await producers[i].send_message_in_transaction(
                Message(args.topic, body.encode() + b"x" * max(0, args.size - len(body)))
            )
            latencies.append((time.perf_counter() - t0) * 1000)
            intents[body] = kind

    t0 = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(args.producers)))
    elapsed = time.monotonic() - t0
    sent = len(intents)

    # let check-back settle every transaction that a check can settle
    def unsettled() -> int:
        decided = audit.decided
        return sum(1 for b, k in intents.items() if k != "unknown" and b not in decided)

    settle_deadline = time.monotonic() + args.settle
    while unsettled() and time.monotonic() < settle_deadline:
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)  # let the last END_TRANSACTIONs land
    async with AsyncAdminClient(address) as admin:
        metrics = await admin.metrics()

    delivered: Counter[str] = Counter(
        b.decode().rstrip("x") for b in await drain_topic(address, args.topic, "bench-audit")
    )
    for p in producers:
        await p.shutdown()

    want_commit = {b for b, k in intents.items() if k in ("commit", "check-commit")}
    twice = sum(1 for b, c in delivered.items() if c > 1)
    missing = len(want_commit - set(delivered))
    extra = len(set(delivered) - want_commit)
    lat = percentiles(latencies)
    by_kind = Counter(intents.values())
    return {
        "producers": args.producers,
        "transactions": sent,
        "transactions_per_s": round(sent / elapsed, 1),
        "latency_ms": {k: round(v, 2) for k, v in lat.items()},
        "mix": dict(by_kind),
        "checks_sent(broker)": metrics.get("txmq_transaction_checks_sent_total", 0),
        "checks_answered(broker)": metrics.get("txmq_transaction_checks_answered_total", 0),
        "checks_received(producers)": sum(sum(lst.checks.values()) for lst in listeners),
        "unexpected_checks": sum(lst.unexpected for lst in listeners),
        "duplicated_checks": sum(lst.duplicated for lst in listeners),
        "unsettled_after_wait": unsettled(),
        "delivered": sum(delivered.values()),
        "audit_missing_commits": missing,
        "audit_delivered_twice": twice,
        "audit_delivered_not_committed": extra,
        "audit": "PASS" if not (missing or twice or extra) else "FAIL",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--broker", help="use this broker instead of starting one")
    ap.add_argument("--producers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--settle", type=float, default=20, help="max seconds to wait for checks")
    ap.add_argument("--size", type=int, default=128, help="message body bytes")
    ap.add_argument("--topic", default="bench-tx")
    ap.add_argument("--group", default="bench-tx-producer")
    ap.add_argument("--max-check", type=int, default=3, help="k: decide on the k-th check")
    ap.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    ap.add_argument("--seed", type=int, default=7)
    for name, default in [
        ("commit", 60),
        ("rollback", 20),
        ("check-commit", 8),
        ("check-rollback", 8),
        ("unknown", 4),
    ]:
        ap.add_argument(
            f"--w-{name}", type=float, default=default, help=f"weight of '{name}' transactions"
        )
    args = ap.parse_args()
    quiet_logs()
    settings = {
        "transactionTimeOut": 1000,
        "transactionCheckInterval": 500,
        "transactionCheckMax": args.max_check + 2,
    }
    with broker_process(settings, flush=args.flush, address=args.broker) as address:
        result = asyncio.run(run(args, address))
    emit(result)
    sys.exit(0 if result["audit"] == "PASS" else 1)


if __name__ == "__main__":
    main()
