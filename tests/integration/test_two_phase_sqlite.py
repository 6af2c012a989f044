"""Two-phase commit with a real database as the coordinator, under kills.

A real broker process (restarted between runs, SIGKILL or SIGTERM) and
``examples/two_phase_sqlite.py`` as the coordinator: each run places orders (prepare, one SQLite
transaction holding the order and its decision row, then the broker's commit or rollback by
handle).  Runs are SIGKILLed at each step of the protocol and at random times, and the broker is
SIGKILLed and restarted while a run stands between its steps.  Later runs retry the orders a
killed run did not place (a new transaction per attempt); live coordinators answer the broker's
check-backs from the database.  A recovery run (``recover()`` + the database) then finishes
what is left, and a last run places the remaining orders.

Then: no transaction of the group is PENDING or DISCARDED, every order the database placed was
delivered exactly once, by the attempt whose local transaction placed it, and nothing else was
delivered (no event of an attempt whose local transaction rolled back or was refused)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.client.helpers import FAST_CLIENT, create_topic, json_bodies
from tests.support.logs import json_lines
from tests.support.process import BrokerProcess
from tests.support.waiting import wait_until
from txmq.client import AsyncProducer, Message
from txmq.client.admin import AsyncAdminClient

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "examples" / "two_phase_sqlite.py")
TOPIC = "order-events"
GROUP = "order-coordinator"
QUEUES = 4
#: Orders each run adds to the range it places (it retries the earlier ones not placed yet).
PER_RUN = 4

#: Times each schedule is run (in a seeded random order).
ROUNDS = 3
#: (what happens, the coordinator's step it happens at)
SCHEDULES: list[tuple[str, str | None]] = [
    ("kill", "prepared"),  # halves stored, nothing in the database
    ("kill", "db-open"),  # the local transaction written but not committed
    ("kill", "db-committed"),  # decided in the database, the broker not told
    ("kill", "decided"),  # all done, killed before the next order
    ("kill-random", None),  # anywhere
    ("broker-kill", "prepared"),  # the broker SIGKILLed and restarted, the run goes on
    ("broker-kill", "db-committed"),
    ("none", None),
]


class Broker:
    """The broker process; its log is read on a thread so that it never blocks on the pipe."""

    def __init__(self, store: Path) -> None:
        self.bp = BrokerProcess(
            str(store),
            settings={
                "transactionTimeOut": 1500,
                "transactionCheckInterval": 500,
                "transactionCheckMax": 2,
            },
        )

    def start(self) -> str:
        address = self.bp.start()
        out = self.bp.proc.stdout if self.bp.proc is not None else None
        assert out is not None

        def drain() -> None:  # this process's pipe only, until it ends
            while out.read(65536):
                pass

        threading.Thread(target=drain, daemon=True).start()
        return address

    def restart(self, how: str) -> None:
        if how == "kill":
            self.bp.kill()
        else:
            assert self.bp.proc is not None
            self.bp.proc.send_signal(signal.SIGTERM)
            assert self.bp.proc.wait(60) == 0
        self.start()


class Coordinator:
    """One run of the example; stdout (JSON events) and stderr go to files."""

    def __init__(
        self, workdir: Path, name: str, args: list[str], pause: tuple[str, int] | None = None
    ) -> None:
        self.out = workdir / f"{name}.out"
        self.err = workdir / f"{name}.err"
        self.pause_file = workdir / f"{name}.pause"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
        )
        if pause is not None:
            env["TXMQ_EXAMPLE_PAUSE_AT"] = f"{pause[0]}@{pause[1]}"
            env["TXMQ_EXAMPLE_PAUSE_FILE"] = str(self.pause_file)
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, SCRIPT, *args], stdout=out, stderr=err, env=env
            )

    def seen(self, event: str) -> bool:
        return any(e["event"] == event for e in self.events())

    def paused(self) -> bool:
        return Path(f"{self.pause_file}.paused").exists()

    def go(self) -> None:
        Path(f"{self.pause_file}.go").touch()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    async def finished(self, timeout: float = 120.0) -> int:
        await wait_until(lambda: self.proc.poll() is not None, timeout, f"{self.out.name} ends")
        return self.proc.returncode

    def events(self) -> list[dict[str, Any]]:
        return json_lines(self.out)

    def stderr_tail(self) -> str:
        return self.err.read_text()[-3000:]


async def read_events(address: str) -> list[dict[str, Any]]:
    return await json_bodies(address, TOPIC, QUEUES, "two-phase-reader")


async def transactions(address: str, state: str) -> list[dict[str, Any]]:
    async with AsyncAdminClient(address) as admin:
        return await admin.list_transactions(group=GROUP, state=state)


def db_rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db, timeout=30.0)
    try:
        return list(conn.execute(sql))
    finally:
        conn.close()


@pytest.mark.parametrize("seed", [int(os.environ.get("TXMQ_2PC_SEED", "20261206"))])
async def test_sqlite_coordinator_killed_between_prepare_and_decision(
    tmp_path: Path, seed: int
) -> None:
    print(f"two-phase sqlite seed={seed} (set TXMQ_2PC_SEED to replay another)")
    rnd = random.Random(seed)
    broker = Broker(tmp_path / "store")
    address = broker.start()
    db = tmp_path / "orders.db"
    runs: list[Coordinator] = []
    tried: Counter[str] = Counter()
    broker_restarts: Counter[str] = Counter()
    schedules = SCHEDULES * ROUNDS
    rnd.shuffle(schedules)
    try:
        await create_topic(address, TOPIC, QUEUES)
        for i, (action, step) in enumerate(schedules):
            orders = f"0-{PER_RUN * (i + 1) - 1}"
            args = ["place", "--broker", address, "--db", str(db), "--orders", orders]
            at = rnd.randint(1, PER_RUN - 1)
            pause = (step, at) if step is not None else None
            run = Coordinator(tmp_path, f"run{i}", args, pause)
            runs.append(run)
            label = f"{action}@{step}" if step else action
            if action == "kill":
                await wait_until(run.paused, 60, f"run {i} paused at {step}")
                run.kill()
            elif action == "kill-random":
                await wait_until(partial(run.seen, "prepared"), 60, f"run {i} prepares")
                await asyncio.sleep(rnd.uniform(0.0, 0.05))  # chaos timing, not a wait
                run.kill()
                done = [e["event"] for e in run.events()]
                label = f"kill-random (after {done[-1] if done else 'nothing'})"
            elif action == "broker-kill":
                await wait_until(run.paused, 60, f"run {i} paused at {step}")
                broker.restart("kill")
                broker_restarts["kill (mid-run)"] += 1
                run.go()
                rc = await run.finished()
                assert rc == 0, f"run {i} ({label}) failed:\n{run.stderr_tail()}"
            else:
                rc = await run.finished()
                assert rc == 0, f"run {i} failed:\n{run.stderr_tail()}"
            tried[label] += 1
            if i % 4 == 1:
                broker.restart("kill")
                broker_restarts["kill (between runs)"] += 1
            elif i % 4 == 3:
                broker.restart("term")
                broker_restarts["term (between runs)"] += 1

        # Recovery: what the killed runs left prepared is finished from the database.
        before = await transactions(address, "PENDING")
        recovery = Coordinator(
            tmp_path, "recover", ["recover", "--broker", address, "--db", str(db)]
        )
        runs.append(recovery)
        assert await recovery.finished() == 0, recovery.stderr_tail()
        recovered = next(e for e in recovery.events() if e["event"] == "recovered")
        assert recovered["left"] == 0
        # The orders no run placed are placed now (nothing killed).
        last = len(schedules) * PER_RUN - 1
        final = Coordinator(
            tmp_path,
            "final",
            ["place", "--broker", address, "--db", str(db), "--orders", f"0-{last}"],
        )
        runs.append(final)
        assert await final.finished() == 0, final.stderr_tail()

        pending = await transactions(address, "PENDING")
        discarded = await transactions(address, "DISCARDED")
        # Everything committed is dispatched once a marker sent after it is, in every queue.
        async with AsyncProducer("two-phase-marker", broker=address, config=FAST_CLIENT) as p:
            for q in range(QUEUES):
                await p.send(Message(TOPIC, json.dumps({"marker": q}).encode()), queue_id=q)
        await wait_until(lambda: _markers(address), 30, "the markers in every queue")
        delivered = [e for e in await read_events(address) if "marker" not in e]

        placed = dict(db_rows(db, "SELECT order_id, txn FROM orders"))
        decisions = dict(db_rows(db, "SELECT txn, decision FROM decisions"))
        per_order = Counter(int(e["order"]) for e in delivered)
        duplicates = {o: n for o, n in per_order.items() if n > 1}
        missing = sorted(set(placed) - set(per_order))
        # delivered but not placed by that attempt's local transaction
        unplaced = [e for e in delivered if placed.get(int(e["order"])) != e["txn"]]
        refused = sorted(o for o in range(last + 1) if o % 7 == 3)
        not_placed = sorted(set(range(last + 1)) - set(placed) - set(refused))
        events = [e for run in runs for e in run.events()]
        resolved = Counter((e["by"], e["decision"]) for e in events if e["event"] == "resolved")
        print(
            json.dumps(
                {
                    "seed": seed,
                    "schedules": dict(tried),
                    "broker_restarts": dict(broker_restarts),
                    "orders": last + 1,
                    "placed": len(placed),
                    "refused": len(refused),
                    "attempts": len(decisions),
                    "rolled_back_attempts": sum(1 for d in decisions.values() if d == "ROLLBACK"),
                    "pending_before_recovery": len(before),
                    "recovered": {
                        "committed": recovered["committed"],
                        "rolled_back": recovered["rolled_back"],
                    },
                    "resolved": {f"{by}:{d}": n for (by, d), n in resolved.items()},
                    "pending": len(pending),
                    "discarded": len(discarded),
                    "duplicates": len(duplicates),
                    "missing": len(missing),
                    "delivered_not_placed": len(unplaced),
                }
            )
        )
        assert pending == [] and discarded == []
        assert not duplicates, duplicates
        assert not missing, missing
        assert not unplaced, unplaced
        assert not not_placed, not_placed
        assert len(delivered) == len(placed)
        # the kills hit what they aimed at: something was left for the recovery or the checks
        assert len(before) + sum(resolved.values()) > 0
    finally:
        for run in runs:
            run.kill()
        broker.bp.stop_quietly()


async def _markers(address: str) -> bool:
    return len({e["marker"] for e in await read_events(address) if "marker" in e}) == QUEUES
