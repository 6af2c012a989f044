"""A decision made live and the same decision replayed after a restart leave the same record.

A real broker gets a generated run of halves (single sends and SEND_BATCH_MESSAGE halves taken
by the fast path), commits, rollbacks (first decisions, repeats and contradictions), batch
decisions, snapshots and restarts on the same store folder.  Every restart reads the table back
one way: from the snapshot written at shutdown, from the queues alone (no snapshot), or from an
older snapshot plus the queues after it; the table it rebuilds must equal the live one field by
field, the decision offsets included.  Live, a decision's offset is the end of its whole append
(op record and committed messages), so a repeated decision waits for all of it to be durable.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from tests.support.fastpath import batch_body, batch_header
from tests.support.raw import RawClient
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController, new_event_loop
from txmq.broker.transaction.state import TxRecord, TxState
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.headers import EndTransactionRequestHeader
from txmq.protocol.message import MessageConst, MessageSysFlag, properties_to_string

G = "tx-offsets-g"
TOPIC = "tx-offsets"
COMMIT, ROLLBACK = 8, 12
PLAIN = 4  # transactions tx-0 .. tx-3, halves sent one by one
BATCHES, MEMBERS = 2, 3  # transactions b0-m0 .. b1-m2, halves sent as batches, batch keys b0, b1

Op = tuple[Any, ...]
TXIDS = [f"tx-{i}" for i in range(PLAIN)] + [
    f"b{b}-m{m}" for b in range(BATCHES) for m in range(MEMBERS)
]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("half"), st.integers(0, PLAIN - 1), st.integers(1, 3)),
        st.tuples(
            st.just("batch_halves"),
            st.integers(0, BATCHES - 1),
            st.integers(0, MEMBERS - 1),
            st.integers(1, 4),
        ),
        st.tuples(st.just("end"), st.sampled_from(TXIDS), st.sampled_from([COMMIT, ROLLBACK])),
        st.tuples(
            st.just("decide_batch"),
            st.integers(0, BATCHES - 1),
            st.sets(st.integers(0, MEMBERS - 1)),
        ),
        st.tuples(st.just("snapshot")),
        st.tuples(st.just("restart"), st.sampled_from(["snapshot", "replay", "old_snapshot"])),
    ),
    min_size=3,
    max_size=20,
)


def note(what: str) -> None:
    """Count ``what`` in hypothesis' statistics (``--hypothesis-show-statistics``)."""
    if currently_in_test_context():
        event(what)


def table(b: BrokerController) -> dict[str, Any]:
    """Everything recovery must rebuild: each record's fields (halves included), the pending
    set and the batch decisions."""
    m = b.transactions.machine

    def row(r: TxRecord) -> tuple[Any, ...]:
        return (
            r.state,
            r.decision_end_offset,
            r.decided_ms,
            r.decided_by,
            r.remark,
            r.producer_group,
            r.batch_key,
            r.check_times,
            r.last_check_ms,
            tuple(r.halves),
        )

    return {
        "records": {t: row(r) for t, r in m.records.items()},
        "pending": sorted(m.pending),
        "batches": dict(m.batches),
        "batch_members": {k: sorted(v) for k, v in m.batch_members.items()},
    }


class Run:
    """One generated run against one broker (restarted in place)."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker: BrokerController | None = None
        self.client: RawClient | None = None
        self.old_snapshot: bytes | None = None
        self.seq = 0
        self.restarts: list[str] = []

    @property
    def b(self) -> BrokerController:
        assert self.broker is not None
        return self.broker

    @property
    def c(self) -> RawClient:
        assert self.client is not None
        return self.client

    async def start(self) -> None:
        self.broker = BrokerController(self.config)
        await self.broker.start()
        self.client = await RawClient.connect(self.broker.address)

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None
        if self.broker is not None:
            await self.broker.shutdown()
            self.broker = None

    def _uniq(self) -> str:
        self.seq += 1
        return f"7F000001{self.seq:024X}"

    # -- the operations ------------------------------------------------------------------------

    async def half(self, i: int, n: int) -> None:
        for _ in range(n):
            r = await self.c.send(
                TOPIC,
                b"half",
                group=G,
                transactional=True,
                queue_id=i % 4,
                props={MessageConst.TRANSACTION_ID: f"tx-{i}"},
            )
            self._sent(f"tx-{i}", r)

    async def batch_halves(self, batch: int, member: int, n: int) -> None:
        txid, key = f"b{batch}-m{member}", f"b{batch}"
        rest = {
            MessageConst.TRAN_MSG: "true",
            MessageConst.PGROUP: G,
            MessageConst.TRANSACTION_ID: txid,
            MessageConst.TXMQ_BATCH_KEY: key,
        }
        rows = [
            (
                f"{txid}-{k}".encode(),
                0,
                properties_to_string({MessageConst.UNIQ_KEY: self._uniq(), **rest}).encode(),
            )
            for k in range(n)
        ]
        hdr = batch_header(G, TOPIC, batch, MessageSysFlag.TRANSACTION_PREPARED_TYPE)
        fast = self._fast_batches()
        r = await self.c.call(RequestCode.SEND_BATCH_MESSAGE, hdr, batch_body(rows))
        self._sent(txid, r)
        if self._fast_batches() > fast:
            note("halves stored by the batch fast path")

    def _fast_batches(self) -> float:
        return float(self.b.metrics.snapshot().get("txmq_send_path_total{path=halves}", 0.0))

    def _sent(self, txid: str, r: RemotingCommand) -> None:
        """A half joins only a pending transaction (of a batch not decided yet)."""
        rec = self.b.transactions.records.get(txid)
        if r.code == ResponseCode.SUCCESS:
            assert rec is not None and rec.state is TxState.PENDING
        else:
            assert r.code == ResponseCode.ILLEGAL_OPERATION, (r.code, r.remark)

    async def end(self, txid: str, decision: int) -> None:
        """END_TRANSACTION for ``txid`` (given a half first if it has none)."""
        records = self.b.transactions.records
        if txid not in records:
            if txid.startswith("tx-"):
                await self.half(int(txid[3:]), 1)
            else:
                await self.batch_halves(int(txid[1]), int(txid[-1]), 1)
            if txid not in records:
                return  # its batch is decided: no half joins it
        rec = records[txid]
        before = rec.state
        h = rec.halves[0]
        eh = EndTransactionRequestHeader(
            producer_group=G,
            tran_state_table_offset=h.queue_offset,
            commit_log_offset=h.commit_log_offset,
            commit_or_rollback=decision,
            from_transaction_check=False,
            msg_id=h.uniq_key,
            transaction_id=rec.transaction_id,
        )
        r = await self.c.call(RequestCode.END_TRANSACTION, eh.to_ext_fields())
        wanted = TxState.COMMITTED if decision == COMMIT else TxState.ROLLED_BACK
        if before.decided and before is not wanted:
            assert r.code == ResponseCode.ILLEGAL_OPERATION, (r.code, r.remark)
            return
        assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
        assert rec.state is wanted
        note("END_TRANSACTION repeated" if before.decided else "END_TRANSACTION decided")
        self._decided_now(rec, first=not before.decided)

    async def decide_batch(self, batch: int, members: set[int]) -> None:
        key = f"b{batch}"
        records = self.b.transactions.records
        before = {t: r.state for t, r in records.items() if r.batch_key == key}
        # the members listed that have halves (an unknown one would only make it refused)
        commit = sorted(t for t in (f"{key}-m{m}" for m in members) if t in records)
        r = await self.c.call(
            RequestCode.TXMQ_DECIDE_BATCH,
            {"producerGroup": G, "batchKey": key},
            json.dumps({"commit": commit}).encode(),
        )
        if r.code != ResponseCode.SUCCESS:
            # a listed transaction unknown here or rolled back: nothing was decided
            assert r.code in (ResponseCode.INVALID_PARAMETER, ResponseCode.ILLEGAL_OPERATION), (
                r.code,
                r.remark,
            )
            assert {t: r.state for t, r in records.items() if r.batch_key == key} == before
            return
        doc = json.loads(r.body)
        note("batch decided" if doc["first"] else "batch decision repeated")
        for txid in doc["committed"] + doc["rolledBack"]:
            rec = records[txid]
            if doc["first"] and not before.get(txid, TxState.PENDING).decided:
                self._decided_now(rec, first=True)

    def _decided_now(self, rec: TxRecord, *, first: bool) -> None:
        """The decision was answered: durable (SYNC_FLUSH) up to its offset, which for a first
        decision is the end of its append, the last thing in the commit log."""
        store = self.b.store
        assert rec.decision_end_offset <= store.flushed_offset
        if first:
            assert rec.decision_end_offset == store.max_phy_offset

    async def snapshot(self) -> None:
        tx = self.b.transactions
        await tx.write_snapshot()
        with open(tx.persistence.snapshot_path, "rb") as fh:
            self.old_snapshot = fh.read()

    async def restart(self, mode: str) -> None:
        live = table(self.b)
        path = self.b.transactions.persistence.snapshot_path
        await self.stop()
        if mode == "replay" and os.path.exists(path):
            os.remove(path)
        elif mode == "old_snapshot":
            if self.old_snapshot is None:
                os.remove(path)
            else:
                with open(path, "wb") as fh:
                    fh.write(self.old_snapshot)
        await self.start()
        recovered = self.b.recovery["transactions"]
        restored = mode == "snapshot" or (mode == "old_snapshot" and self.old_snapshot is not None)
        assert recovered["snapshot"] == int(restored)
        assert recovered["repaired"] == 0
        assert table(self.b) == live, f"after restarts {self.restarts + [mode]}"
        self.restarts.append(mode)
        note(f"restart from {'a snapshot' if restored else 'the queues'}")


def drive(config: BrokerConfig, run_ops: list[Op]) -> None:
    async def main() -> None:
        run = Run(config)
        await run.start()
        try:
            for op in [*run_ops, ("restart", "replay")]:
                await getattr(run, op[0])(*op[1:])
        finally:
            await run.stop()

    loop = new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(main(), 60))
    finally:
        loop.close()
        shutil.rmtree(config.store_path_root_dir, ignore_errors=True)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(run_ops=ops)
def test_replayed_decisions_equal_the_live_ones(
    make_broker_config: Callable[..., BrokerConfig], run_ops: list[Op]
) -> None:
    drive(
        make_broker_config(transaction_check_interval=60_000, flush_disk_type="SYNC_FLUSH"),
        run_ops,
    )


def test_a_commit_of_several_halves_recovers_the_end_of_its_whole_append(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    """The case the property test is about, spelled out: a commit whose committed messages
    follow its op record, a batch decision, and a full replay."""
    drive(
        make_broker_config(transaction_check_interval=60_000, flush_disk_type="SYNC_FLUSH"),
        [
            ("half", 0, 3),
            ("end", "tx-0", COMMIT),
            ("batch_halves", 0, 0, 4),
            ("batch_halves", 0, 1, 2),
            ("decide_batch", 0, {0}),
            ("half", 1, 1),
            ("end", "tx-1", ROLLBACK),
            ("end", "tx-0", COMMIT),
            ("end", "b0-m1", COMMIT),
        ],
    )


async def test_a_commit_finished_after_a_crash_is_repeated_once_its_repair_is_durable(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    """A crash cut a commit's append after its op record: recovery writes the committed
    messages again, and the decision's offset becomes the end of that append (a repeat waits
    for it), also when the table is replayed once more."""
    cfg = make_broker_config(transaction_check_interval=60_000, flush_disk_type="SYNC_FLUSH")
    run = Run(cfg)
    await run.start()
    try:
        await run.half(0, 3)
        await run.end("tx-0", COMMIT)
        delivered = await run.c.pull_all(TOPIC)
        assert len(delivered) == 3
        first = min(m.commit_log_offset for m in delivered)
        path = run.b.transactions.persistence.snapshot_path
        await run.stop()
        # a crash before the commit's messages reached the disk: zero the commit log from the
        # first of them on (the op record stays), the checkpoint no longer covers them
        seg_dir = os.path.join(cfg.store_path_root_dir, "commitlog")
        [seg] = os.listdir(seg_dir)
        with open(os.path.join(seg_dir, seg), "r+b") as fh:
            fh.seek(first - int(seg))
            fh.write(b"\0" * (os.path.getsize(fh.name) - (first - int(seg))))
        os.remove(path)
        os.remove(os.path.join(cfg.store_path_root_dir, "checkpoint"))
        await run.start()
        assert run.b.recovery["transactions"]["repaired"] == 3
        rec = run.b.transactions.records["tx-0"]
        again = await run.c.pull_all(TOPIC)
        assert len(again) == 3
        assert min(m.commit_log_offset for m in again) == first  # written where the cut was
        repair_end = max(m.commit_log_offset + 12 + m.store_size for m in again)
        assert rec.decision_end_offset == repair_end
        await run.end("tx-0", COMMIT)  # a repeat, answered once the repair is durable
        await run.restart("replay")
        assert run.b.transactions.records["tx-0"].decision_end_offset == repair_end
    finally:
        await run.stop()
