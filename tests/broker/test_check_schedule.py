"""The check-back schedule: a round looks only at what is due, in due order, and every rule of
docs/transactions.md holds (age on the broker's clock, immunity, one interval between checks,
producers awaited per group, parking, resume, decided ones never checked, restarts).

The broker's clock is the test's (``clock=``) and checks go to a recording sender
(``check_sender=``); rounds are run by the test (``check_round``) with the periodic loop set far
apart, so nothing here sleeps."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tests.support.raw import RawClient
from tests.support.waiting import wait_until
from txmq.broker.clients import ClientChannel
from txmq.broker.server import BrokerController
from txmq.broker.transaction.state import Decision, TxRecord, TxState
from txmq.protocol.headers import CheckTransactionStateRequestHeader
from txmq.protocol.message import MessageConst

G = "sched-group"
COMMIT = 8
INTERVAL_MS = 5_000
TIME_OUT_MS = 1_000


class Recorder:
    """The check sender: records the transaction id of every check and says it was delivered
    (or not, when ``deliver`` is false)."""

    def __init__(self) -> None:
        self.txids: list[str] = []
        self.deliver = True

    async def __call__(
        self, channel: ClientChannel, header: CheckTransactionStateRequestHeader, body: bytes
    ) -> bool:
        assert header.transaction_id is not None
        self.txids.append(header.transaction_id)
        return self.deliver


class Setup:
    def __init__(self, make_config: Callable[..., Any]) -> None:
        self.now_ms = 1_800_000_000_000
        self.checks = Recorder()
        self.config = make_config(
            transaction_time_out=TIME_OUT_MS,
            # the periodic round is the test's to run
            transaction_check_interval=INTERVAL_MS,
            transaction_check_max=3,
        )
        self.broker: BrokerController | None = None
        self.clients: list[RawClient] = []

    def clock(self) -> float:
        # half a millisecond in: the broker's milliseconds are exactly the test's
        return (self.now_ms + 0.5) / 1000.0

    def advance(self, ms: int) -> None:
        self.now_ms += ms

    async def start(self) -> BrokerController:
        self.broker = BrokerController(self.config, clock=self.clock, check_sender=self.checks)
        await self.broker.start()
        self.broker.transactions.checks._task.cancel()  # type: ignore[union-attr]
        return self.broker

    async def restart(self) -> BrokerController:
        await self.close_clients()
        assert self.broker is not None
        await self.broker.shutdown()
        return await self.start()

    async def client(self, producer: bool = True) -> RawClient:
        assert self.broker is not None
        c = await RawClient.connect(self.broker.address)
        if producer:
            await c.heartbeat(producer_groups=[G])
        self.clients.append(c)
        return c

    async def half(self, c: RawClient, props: dict[str, str] | None = None) -> str:
        r = await c.send("orders", b"x", group=G, transactional=True, props=props)
        txid = c.send_header(r).transaction_id
        assert txid is not None
        return txid

    async def round(self) -> dict[str, int]:
        assert self.broker is not None
        return await self.broker.transactions.check_round()

    def rec(self, txid: str) -> TxRecord:
        assert self.broker is not None
        return self.broker.transactions.records[txid]

    async def close_clients(self) -> None:
        for c in self.clients:
            await c.close()
        self.clients.clear()


@pytest.fixture
async def s(make_broker_config: Callable[..., Any]) -> AsyncIterator[Setup]:
    setup = Setup(make_broker_config)
    await setup.start()
    yield setup
    await setup.close_clients()
    if setup.broker is not None:
        await setup.broker.shutdown()


async def test_due_order_and_nothing_before_the_timeout(s: Setup) -> None:
    c = await s.client()
    txids = []
    for _ in range(5):
        txids.append(await s.half(c))
        s.advance(100)
    # the third one was stored last: a half joining later moves its due time
    await c.send(
        "orders",
        b"y",
        group=G,
        transactional=True,
        props={MessageConst.TRANSACTION_ID: txids[2]},
    )
    # stored at 0, 100, 200 (and 500), 300, 400 ms; now 500 ms
    s.advance(499)
    assert (await s.round())["due"] == 0 and s.checks.txids == []
    s.advance(201)  # 1200 ms: the first two are due, not the third (its newest half is 700 ms old)
    await s.round()
    assert s.checks.txids == txids[:2]
    s.advance(200)  # 1400 ms: the fourth and fifth
    await s.round()
    assert s.checks.txids == [*txids[:2], txids[3], txids[4]]
    s.advance(100)  # 1500 ms: the third
    await s.round()
    assert s.checks.txids == [*txids[:2], txids[3], txids[4], txids[2]]


async def test_immunity_per_half_delays_the_first_check(s: Setup) -> None:
    c = await s.client()
    immune = await s.half(c, {MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS: "10"})
    plain = await s.half(c)
    s.advance(2_000)
    await s.round()
    assert s.checks.txids == [plain]
    s.advance(7_999)
    await s.round()  # 9.999 s: still immune; the plain one is checked again (an interval on)
    assert s.checks.txids == [plain, plain]
    s.advance(1)
    await s.round()
    assert s.checks.txids == [plain, plain, immune]


async def test_checked_again_one_interval_later(s: Setup) -> None:
    c = await s.client()
    txid = await s.half(c)
    s.advance(TIME_OUT_MS)
    await s.round()
    assert s.checks.txids == [txid] and s.rec(txid).check_times == 1
    await s.round()  # the same instant: one check per interval
    s.advance(INTERVAL_MS - 1)
    await s.round()
    assert s.checks.txids == [txid]
    s.advance(1)
    await s.round()
    assert s.checks.txids == [txid, txid] and s.rec(txid).check_times == 2


async def test_an_undelivered_check_is_sent_again_next_interval_and_not_counted(
    s: Setup,
) -> None:
    c = await s.client()
    txid = await s.half(c)
    s.checks.deliver = False
    s.advance(TIME_OUT_MS)
    assert (await s.round())["not_delivered"] == 1
    assert s.rec(txid).check_times == 0
    s.checks.deliver = True
    s.advance(INTERVAL_MS)
    assert (await s.round())["sent"] == 1
    assert s.checks.txids == [txid, txid] and s.rec(txid).check_times == 1


async def test_a_group_without_producer_is_checked_as_soon_as_one_registers(s: Setup) -> None:
    sender = await s.client(producer=False)
    txid = await s.half(sender)
    s.advance(TIME_OUT_MS)
    stats = await s.round()
    assert stats["no_producer"] == 1 and s.checks.txids == []
    assert s.broker is not None
    checks = s.broker.transactions.checks
    assert checks.schedule.waiting == {G: {txid}}
    s.advance(10 * INTERVAL_MS)
    assert (await s.round())["due"] == 0  # it waits in its group's set, not in the rounds
    assert s.rec(txid).check_times == 0  # the budget is intact
    checks.start()  # the periodic loop, woken by the registration
    await s.client()  # a producer of the group registers
    await wait_until(lambda: s.checks.txids == [txid], 10)
    assert s.rec(txid).check_times == 1 and not checks.schedule.waiting


async def test_out_of_budget_is_parked_and_resume_checks_it_again(s: Setup) -> None:
    c = await s.client()
    txid = await s.half(c)
    s.advance(TIME_OUT_MS)
    for _ in range(3):  # transactionCheckMax
        await s.round()
        s.advance(INTERVAL_MS)
    assert s.checks.txids == [txid] * 3
    assert (await s.round())["discarded"] == 1
    assert s.rec(txid).state is TxState.DISCARDED
    s.advance(INTERVAL_MS)
    await s.round()
    assert s.checks.txids == [txid] * 3  # parked: never checked
    assert s.broker is not None
    s.broker.transactions.resume(s.rec(txid))
    await s.round()
    assert s.checks.txids == [txid] * 4
    assert s.rec(txid).state is TxState.PENDING and s.rec(txid).check_times == 1


async def test_parked_after_file_reserved_time_even_without_producer(s: Setup) -> None:
    sender = await s.client(producer=False)
    txid = await s.half(sender)
    s.advance(TIME_OUT_MS)
    assert (await s.round())["no_producer"] == 1
    assert s.broker is not None
    s.advance(int(s.config.file_reserved_time * 3_600_000))
    assert (await s.round())["discarded"] == 1
    assert s.rec(txid).state is TxState.DISCARDED and s.checks.txids == []
    assert not s.broker.transactions.checks.schedule.waiting


async def test_decided_ones_are_never_checked_and_leave_the_schedule(s: Setup) -> None:
    c = await s.client()
    r = await c.send("orders", b"x", group=G, transactional=True)
    committed = c.send_header(r).transaction_id
    operator = await s.half(c)
    checked = await s.half(c)
    assert (await c.end_transaction(G, r, COMMIT)).code == 0
    assert s.broker is not None
    tx = s.broker.transactions
    tx.decide(s.rec(operator), Decision.ROLLBACK, "operator")
    s.advance(TIME_OUT_MS)
    await s.round()
    assert s.checks.txids == [checked]
    tx.decide(s.rec(checked), Decision.COMMIT, "check")
    for _ in range(3):
        s.advance(INTERVAL_MS)
        await s.round()
    assert s.checks.txids == [checked] and committed not in s.checks.txids
    assert len(tx.checks.schedule) == 0 and not tx.pending


async def test_gauges_count_and_oldest_per_topic_and_group(s: Setup) -> None:
    c = await s.client()
    first = await s.half(c)
    s.advance(1_000)
    await s.half(c)
    await c.send("payments", b"p", group=G, transactional=True)
    s.advance(500)
    assert s.broker is not None
    tx = s.broker.transactions
    tx.update_gauges()
    snap = s.broker.ctx.metrics.snapshot()
    key = "txmq_transaction_pending{group=" + G + ",topic=%s}"
    oldest = "txmq_transaction_pending_oldest_seconds{group=" + G + ",topic=%s}"
    assert snap[key % "orders"] == 2 and snap[oldest % "orders"] == pytest.approx(1.5)
    assert snap[key % "payments"] == 1 and snap[oldest % "payments"] == pytest.approx(0.5)
    tx.decide(s.rec(first), Decision.COMMIT, "producer")
    tx.update_gauges()
    snap = s.broker.ctx.metrics.snapshot()
    assert snap[key % "orders"] == 1 and snap[oldest % "orders"] == pytest.approx(0.5)


async def test_a_round_with_nothing_due_looks_at_no_pending_transaction(
    s: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert s.broker is not None
    tx = s.broker.transactions
    from txmq.broker.transaction.state import HalfRef

    now_ms = s.now_ms
    for i in range(20_000):  # straight into the table: the round's cost is what is measured
        h = HalfRef(10**9 + i, i, "orders", 0, now_ms, f"T{i}", f"O{i}")
        tx.machine.add_half(f"T{i}", G, None, h)
    looked = [0]
    for name in ("newest_store_timestamp", "oldest_store_timestamp"):
        prop = getattr(TxRecord, name)

        def counting(rec: TxRecord, _get: Any = prop.fget) -> int:
            looked[0] += 1
            return int(_get(rec))

        monkeypatch.setattr(TxRecord, name, property(counting))
    t0 = time.perf_counter()
    for _ in range(10):
        await s.round()
    elapsed = time.perf_counter() - t0
    assert looked[0] <= 10  # the gauges' oldest record per (topic, group), once a round
    assert elapsed < 5, elapsed
    assert len(tx.checks.schedule) == 20_000


@pytest.mark.parametrize("with_snapshot", [True, False])
async def test_the_schedule_is_rebuilt_after_a_restart(s: Setup, with_snapshot: bool) -> None:
    c = await s.client()
    checked = await s.half(c)
    s.advance(TIME_OUT_MS)
    await s.round()
    assert s.checks.txids == [checked]
    later = await s.half(c)
    parked = await s.half(c)
    assert s.broker is not None
    s.broker.transactions.park(s.rec(parked), "test")
    await s.broker.transactions.persist_check_state()
    if not with_snapshot:  # the half and op queues are replayed from their start
        await s.close_clients()
        await s.broker.shutdown()
        os.remove(s.broker.transactions.persistence.snapshot_path)
        b = await s.start()
    else:
        b = await s.restart()
    tx = b.transactions
    assert b.recovery["transactions"]["snapshot"] == int(with_snapshot)
    assert set(tx.pending) == {checked, later} and len(tx.checks.schedule) == 2
    assert tx.records[checked].check_times == 1
    c = await s.client()
    s.advance(TIME_OUT_MS)  # the new one is due; the checked one only an interval after its check
    await s.round()
    assert s.checks.txids == [checked, later]
    s.advance(INTERVAL_MS - TIME_OUT_MS)
    await s.round()
    assert s.checks.txids == [checked, later, checked]
    assert tx.records[checked].check_times == 2 and parked not in s.checks.txids


async def test_a_two_phase_transaction_is_asked_on_past_its_budget(s: Setup) -> None:
    c = await s.client()
    txid = await s.half(c, {MessageConst.TXMQ_2PC: "1"})
    assert s.rec(txid).two_phase
    s.advance(TIME_OUT_MS)
    for _ in range(6):  # twice transactionCheckMax
        assert (await s.round())["discarded"] == 0
        s.advance(INTERVAL_MS)
    assert s.checks.txids == [txid] * 6
    assert s.rec(txid).state is TxState.PENDING
    assert s.broker is not None
    metrics = s.broker.ctx.metrics.snapshot()
    assert metrics["txmq_transaction_two_phase_overdue_checks_total"] == 3
    # past fileReservedTime its halves may be deleted: parked (not rolled back) like any other
    s.advance(int(s.config.file_reserved_time * 3_600_000))
    assert (await s.round())["discarded"] == 1
    assert s.rec(txid).state is TxState.DISCARDED
