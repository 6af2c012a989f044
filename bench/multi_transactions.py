"""Multi-message transactions: one producer, transactions of ``--messages`` halves each, one
after the other, every one committed; then an audit that exactly the committed messages were
delivered.

    python bench/multi_transactions.py --messages 10 --seconds 5
    python bench/multi_transactions.py --messages 10 --one-request-per-half   # for comparison

The halves of a transaction are sent concurrently (``asyncio.gather`` of ``txn.send``), as the
peer harness's ``txn.k`` figure does; the SDK sends them as one SEND_BATCH_MESSAGE.
``--one-request-per-half`` makes the SDK send one SEND_MESSAGE per half (what it did before it
batched them): k + 1 acknowledged round trips per transaction instead of 2.  ``--sequential``
awaits each half before sending the next.

Prints messages/s, transactions/s, latency percentiles per transaction, and the audit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from _broker import broker_process, drain_topic, percentiles, quiet_logs

from txmq.client import AsyncTransactionProducer, LocalTransactionState, TransactionListener
from txmq.client.admin import AsyncAdminClient
from txmq.client.transaction import AsyncTransaction
from txmq.protocol.message import Message


class _Listener(TransactionListener):
    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


async def run(args: argparse.Namespace, address: str) -> dict[str, object]:
    if args.one_request_per_half:
        AsyncTransaction._batchable = lambda self, msg: False  # type: ignore[method-assign]
    topic = f"{args.topic}-{int(time.time())}"
    async with AsyncAdminClient(address) as admin:
        await admin.create_topic(topic, 4)
    producer = AsyncTransactionProducer("bench-multi-tx", _Listener(), address)
    await producer.start()
    pad = b"x" * args.size
    latencies: list[float] = []
    sent: list[bytes] = []
    n = 0
    stop_at = time.monotonic() + args.seconds
    t0 = time.monotonic()
    while time.monotonic() < stop_at:
        bodies = [f"{n}-{i}:".encode() + pad for i in range(args.messages)]
        n += 1
        t1 = time.perf_counter()
        async with producer.transaction() as txn:
            if args.sequential:
                for b in bodies:
                    await txn.send(Message(topic, b))
            else:
                await asyncio.gather(*(txn.send(Message(topic, b)) for b in bodies))
        latencies.append((time.perf_counter() - t1) * 1000)
        sent.extend(bodies)
    elapsed = time.monotonic() - t0
    await producer.shutdown()
    delivered = await drain_topic(address, topic, "bench-multi-audit")
    ok = sorted(delivered) == sorted(sent)
    return {
        "messages_per_transaction": args.messages,
        "mode": "one-request-per-half"
        if args.one_request_per_half
        else ("sequential" if args.sequential else "concurrent"),
        "transactions": n,
        "transactions_per_s": round(n / elapsed, 1),
        "messages_per_s": round(len(sent) / elapsed, 1),
        "latency_ms": {k: round(v, 2) for k, v in percentiles(latencies).items()},
        "delivered": len(delivered),
        "audit": "PASS" if ok else "FAIL",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--broker", help="use this broker instead of starting one")
    ap.add_argument("--messages", type=int, default=10, help="halves per transaction")
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--size", type=int, default=1024, help="message body bytes")
    ap.add_argument("--topic", default="bench-multi-tx")
    ap.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    ap.add_argument("--sequential", action="store_true", help="await each half in turn")
    ap.add_argument(
        "--one-request-per-half",
        action="store_true",
        help="send each half in its own request (the SDK's behaviour before batching)",
    )
    args = ap.parse_args()
    quiet_logs()
    with broker_process(flush=args.flush, address=args.broker) as address:
        result = asyncio.run(run(args, address))
    for k, v in result.items():
        print(f"{k:<28} {v}")
    print("JSON " + json.dumps(result))


if __name__ == "__main__":
    main()
