"""Two-phase commit with SQLite as the coordinator: an order is placed and announced on topic
``order-events`` together, or neither happens.

For each order the coordinator

1. prepares a txmq transaction (``transaction(two_phase=True)`` + ``prepare()``): the event is
   stored on the broker, invisible, and a handle names it;
2. runs one SQLite transaction that writes the order *and* the decision row
   (``decisions(txn, 'COMMIT', handle)``), or, for an order it refuses, only the decision row
   (``'ROLLBACK'``).  That local commit is the decision;
3. tells the broker: ``producer.commit(handle)`` or ``producer.rollback(handle)`` (repeated
   until the broker answers: deciding again is harmless).

A crash anywhere leaves a state the database decides.  The decision row is the only way to
decide, and whoever writes it first wins (its primary key): when the broker asks about an
undecided transaction (check-back) or a recovery finds it, the *resolver* reads the row, and
when there is none it writes ``'ROLLBACK'`` itself, so the coordinator's own commit, should it
still come, fails on the key and rolls back too.  ``recover`` finishes every prepared
transaction from the database after an outage.

Try it against a local broker (``make run`` starts one on 127.0.0.1:10911)::

    python examples/two_phase_sqlite.py place --db orders.db --orders 1-20
    python examples/two_phase_sqlite.py recover --db orders.db   # after a crash
    python examples/two_phase_sqlite.py show --db orders.db

Each line on stdout is a JSON event.  ``TXMQ_EXAMPLE_PAUSE_AT=<step>@<n>`` with
``TXMQ_EXAMPLE_PAUSE_FILE=<path>`` (test seam) stops the ``n``-th order of a run at ``<step>``
(``prepared``, ``db-open``, ``db-committed``, ``decided``), writes ``<path>.paused`` and goes
on once ``<path>.go`` exists, so that a test can kill the process (or the broker) right there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import time
import uuid
from collections.abc import Sequence
from typing import Any

from txmq.client import (
    AsyncPullConsumer,
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
    PreparedTransaction,
    PreparedTransactionUnknownError,
    RollbackOnCheck,
)
from txmq.protocol.errors import IllegalOperationError, TxmqError

DEFAULT_BROKER = "127.0.0.1:10911"
TOPIC = "order-events"
GROUP = "order-coordinator"

SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    order_id INTEGER PRIMARY KEY,
    amount INTEGER NOT NULL,
    txn TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS decisions (
    txn TEXT PRIMARY KEY,
    decision TEXT NOT NULL CHECK (decision IN ('COMMIT', 'ROLLBACK')),
    handle TEXT NOT NULL,
    order_id INTEGER,
    reason TEXT NOT NULL,
    decided_at REAL NOT NULL
);
"""


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "pid": os.getpid(), **fields}), flush=True)


def connect(path: str) -> sqlite3.Connection:
    """Autocommit mode: every transaction below is an explicit BEGIN IMMEDIATE ... COMMIT."""
    db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db


def init(path: str) -> None:
    db = connect(path)
    try:
        db.executescript(SCHEMA)
    finally:
        db.close()


def refused(order_id: int) -> bool:
    """The business rule: some orders are refused (out of stock), so nothing is announced."""
    return order_id % 7 == 3


# -- the decision: one row per transaction, the first one written wins -------------------------


def recorded_decision(db: sqlite3.Connection, txn: str) -> str | None:
    row = db.execute("SELECT decision FROM decisions WHERE txn = ?", (txn,)).fetchone()
    return None if row is None else str(row[0])


def resolve(path: str, handle: PreparedTransaction) -> str:
    """The decision of ``handle``'s transaction: the recorded one, else ROLLBACK, recorded
    now (so that a coordinator still running for it cannot commit it any more)."""
    db = connect(path)
    try:
        db.execute("BEGIN IMMEDIATE")
        try:
            decision = recorded_decision(db, handle.transaction_id)
            if decision is None:
                decision = "ROLLBACK"
                db.execute(
                    "INSERT INTO decisions VALUES (?, 'ROLLBACK', ?, NULL, 'resolved', ?)",
                    (handle.transaction_id, str(handle), time.time()),
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return decision
    finally:
        db.close()


def resolver_for(path: str) -> Any:
    """The producer's prepared resolver: what the broker's check-back of a two-phase
    transaction gets (run in a thread: it is a plain function)."""

    def resolver(handle: PreparedTransaction) -> LocalTransactionState:
        decision = resolve(path, handle)
        emit("resolved", txn=handle.transaction_id, decision=decision, by="check")
        return (
            LocalTransactionState.COMMIT_MESSAGE
            if decision == "COMMIT"
            else LocalTransactionState.ROLLBACK_MESSAGE
        )

    return resolver


def record_order(path: str, order_id: int, handle: PreparedTransaction) -> str:
    """Step 2: the local transaction with the decision in it; the decision in force after it
    (a resolver may have recorded ROLLBACK first, another attempt may have placed the order)."""
    txn = handle.transaction_id
    db = connect(path)
    try:
        db.execute("BEGIN IMMEDIATE")
        try:
            if refused(order_id):
                decision, reason = "ROLLBACK", "refused"
            else:
                db.execute("INSERT INTO orders VALUES (?, ?, ?)", (order_id, 100 + order_id, txn))
                decision, reason = "COMMIT", "placed"
            db.execute(
                "INSERT INTO decisions VALUES (?, ?, ?, ?, ?, ?)",
                (txn, decision, str(handle), order_id, reason, time.time()),
            )
            pause("db-open")
            db.execute("COMMIT")
            return decision
        except sqlite3.IntegrityError as exc:
            db.execute("ROLLBACK")
            emit("db_refused", txn=txn, order=order_id, error=str(exc))
        except BaseException:
            db.execute("ROLLBACK")
            raise
    finally:
        db.close()
    return resolve(path, handle)  # recorded by someone else first (or ROLLBACK now)


# -- the coordinator ---------------------------------------------------------------------------

_pause_step, _, _pause_n = os.environ.get("TXMQ_EXAMPLE_PAUSE_AT", "").partition("@")
_orders_done = 0


def pause(step: str) -> None:
    """The test seam (see the module's docstring)."""
    path = os.environ.get("TXMQ_EXAMPLE_PAUSE_FILE")
    if not path or step != _pause_step or str(_orders_done + 1) != _pause_n:
        return
    with open(f"{path}.paused", "w") as f:
        f.write(step)
    emit("paused", step=step)
    deadline = time.monotonic() + 300.0
    while not os.path.exists(f"{path}.go") and time.monotonic() < deadline:
        time.sleep(0.02)


async def decide(
    producer: AsyncTransactionProducer, handle: PreparedTransaction, decision: str
) -> None:
    """Step 3, repeated (through a broker restart) until the broker answers: deciding again
    is harmless.  The broker refusing it (the other decision is in force) is a bug: raised."""
    deadline = time.monotonic() + 60.0
    while True:
        try:
            if decision == "COMMIT":
                await producer.commit(handle)
            else:
                await producer.rollback(handle)
            return
        except (IllegalOperationError, PreparedTransactionUnknownError):
            raise
        except (TxmqError, OSError) as exc:
            if time.monotonic() > deadline:
                raise
            emit("decision_retried", txn=handle.transaction_id, error=repr(exc))
        await asyncio.sleep(0.2)


def settled(path: str, order_id: int) -> bool:
    """The order was placed, or refused, by an earlier attempt."""
    db = connect(path)
    try:
        row = db.execute(
            "SELECT 1 FROM orders WHERE order_id = ? UNION ALL "
            "SELECT 1 FROM decisions WHERE order_id = ? AND reason = 'refused'",
            (order_id, order_id),
        ).fetchone()
        return row is not None
    finally:
        db.close()


async def place_order(producer: AsyncTransactionProducer, path: str, order_id: int) -> None:
    """One attempt at an order: prepare, decide in the database, tell the broker."""
    txn = f"order-{order_id}-{uuid.uuid4().hex[:12]}"  # one transaction per attempt
    body = json.dumps({"order": order_id, "txn": txn}).encode()
    async with producer.transaction(txn, two_phase=True) as t:
        await t.send(Message(TOPIC, body, keys=str(order_id)))
        handle = await t.prepare()
    emit("prepared", order=order_id, txn=txn)
    await asyncio.to_thread(pause, "prepared")
    decision = await asyncio.to_thread(record_order, path, order_id, handle)
    emit("db_committed", order=order_id, txn=txn, decision=decision)
    await asyncio.to_thread(pause, "db-committed")
    await decide(producer, handle, decision)
    emit("decided", order=order_id, txn=txn, decision=decision)
    await asyncio.to_thread(pause, "decided")


async def place(broker: str, path: str, orders: Sequence[int]) -> None:
    global _orders_done
    init(path)
    producer = AsyncTransactionProducer(
        GROUP, RollbackOnCheck(), broker, prepared_resolver=resolver_for(path)
    )
    async with producer:
        for order_id in orders:
            deadline = time.monotonic() + 60.0
            # An attempt the broker did not answer (it restarted) is given up and the order
            # tried again: the database's decision rows keep one placed attempt per order, and
            # the abandoned one is rolled back by a check-back or a recovery.
            while not await asyncio.to_thread(settled, path, order_id):
                try:
                    await place_order(producer, path, order_id)
                except (IllegalOperationError, PreparedTransactionUnknownError):
                    raise  # the broker and the database disagree: a bug, not an outage
                except (TxmqError, OSError) as exc:
                    if time.monotonic() > deadline:
                        raise
                    emit("attempt_failed", order=order_id, error=repr(exc))
                    await asyncio.sleep(0.2)
                    continue
                _orders_done += 1
                break
    emit("run_finished", orders=_orders_done)


async def recover(broker: str, path: str) -> None:
    """Finish every prepared transaction of the group from the database's decisions."""
    init(path)
    producer = AsyncTransactionProducer(
        GROUP, RollbackOnCheck(), broker, prepared_resolver=resolver_for(path)
    )
    counts = {"COMMIT": 0, "ROLLBACK": 0}
    async with producer:
        for handle in await producer.recover():
            decision = await asyncio.to_thread(resolve, path, handle)
            await decide(producer, handle, decision)
            counts[decision] += 1
            emit("resolved", txn=handle.transaction_id, decision=decision, by="recover")
        left = len(await producer.recover())
    emit("recovered", committed=counts["COMMIT"], rolled_back=counts["ROLLBACK"], left=left)


async def show(broker: str, path: str) -> None:
    """What was announced against what the database placed."""
    per_order: dict[int, int] = {}
    async with AsyncPullConsumer("order-events-viewer", broker=broker) as pc:
        for q in await pc.fetch_queues(TOPIC):
            offset, end = await pc.min_offset(TOPIC, q), await pc.max_offset(TOPIC, q)
            while offset < end:
                r = await pc.pull(TOPIC, q, offset, 64)
                for m in r.messages:
                    order = int(json.loads(m.body)["order"])
                    per_order[order] = per_order.get(order, 0) + 1
                offset = r.next_begin_offset
    db = connect(path)
    try:
        placed = {int(r[0]) for r in db.execute("SELECT order_id FROM orders")}
    finally:
        db.close()
    emit(
        "shown",
        placed=len(placed),
        announced=len(per_order),
        twice=sorted(o for o, n in per_order.items() if n > 1),
        missing=sorted(placed - set(per_order)),
        not_placed=sorted(set(per_order) - placed),
    )


def order_range(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("command", choices=["place", "recover", "show"])
    ap.add_argument("--broker", default=DEFAULT_BROKER)
    ap.add_argument("--db", default="orders.db")
    ap.add_argument("--orders", default="1-10", help="order ids, e.g. 1-20")
    args = ap.parse_args(argv)
    if args.command == "place":
        asyncio.run(place(args.broker, args.db, order_range(args.orders)))
    elif args.command == "recover":
        asyncio.run(recover(args.broker, args.db))
    else:
        asyncio.run(show(args.broker, args.db))


if __name__ == "__main__":
    main()
