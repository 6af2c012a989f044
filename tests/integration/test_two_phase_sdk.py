"""Two-phase commit with an outside coordinator: prepare, commit/rollback by handle from another
producer of the group, idempotence, recover(), check-back through the prepared resolver, and the
broker keeping such transactions pending past the check budget."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from click.testing import CliRunner

from tests.support.brokers import pulled, started
from tests.support.decisions import C, R, U
from tests.support.waiting import wait_until
from txmq.broker.server import BrokerController
from txmq.cli import main as cli
from txmq.client import (
    AsyncTransactionProducer,
    LocalTransactionState,
    PreparedTransaction,
    PreparedTransactionUnknownError,
    RollbackOnCheck,
    TransactionFailedError,
    TransactionProducer,
)
from txmq.client.admin import AsyncAdminClient
from txmq.protocol.errors import IllegalOperationError
from txmq.protocol.message import Message, MessageExt

G = "coordinated"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:")
T = "payments"


@pytest.fixture
async def fast_broker(make_broker_config: Any) -> Any:
    b = BrokerController(
        make_broker_config(
            transaction_time_out=300, transaction_check_interval=100, transaction_check_max=2
        )
    )
    await b.start()
    yield b
    await b.shutdown()


class NoListener(RollbackOnCheck):
    """Fails the test if a two-phase transaction's check reaches the listener."""

    checked: list[MessageExt]

    def __init__(self) -> None:
        self.checked = []

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        self.checked.append(message)
        return R


async def prepared(p: AsyncTransactionProducer, *bodies: bytes, txid: str | None = None) -> Any:
    async with p.transaction(txid, two_phase=True) as txn:
        for b in bodies:
            await txn.send(Message(T, b))
        handle = await txn.prepare()
    return handle


def test_handle_text_round_trips_and_bad_text_is_refused() -> None:
    h = PreparedTransaction("order/17:a", "grp", "broker-a", 1234, 7, "AB12")
    text = str(h)
    assert text.startswith("txmq-2pc:1:")
    assert PreparedTransaction.parse(text) == h
    assert PreparedTransaction.parse(h) is h
    for bad in ["", "txmq-2pc:1:a/b", "nope", "txmq-2pc:1:g/b/t/x/1/m", "txmq-2pc:1://t/1/1/m"]:
        with pytest.raises(ValueError):
            PreparedTransaction.parse(bad)


async def test_prepared_is_invisible_then_committed_once_by_another_producer(fast_broker):
    lst = NoListener()
    async with AsyncTransactionProducer(G, lst, fast_broker.address) as p1:
        handle = await prepared(p1, b"a", b"b")
    assert await pulled(fast_broker.address, T) == []
    text = str(handle)
    # a fresh producer of the group, with only the handle's text
    async with AsyncTransactionProducer(G, lst, fast_broker.address) as p2:
        await p2.commit(text)
        await p2.commit(text)  # idempotent
        with pytest.raises(IllegalOperationError, match="already COMMITTED"):
            await p2.rollback(text)
    assert sorted(m.body for m in await pulled(fast_broker.address, T)) == [b"a", b"b"]
    assert lst.checked == []


async def test_concurrent_halves_then_prepare(fast_broker):
    async with AsyncTransactionProducer(G, NoListener(), fast_broker.address) as p:
        async with p.transaction(two_phase=True) as txn:
            await asyncio.gather(*(txn.send(Message(T, b"%d" % i), queue_id=0) for i in range(5)))
            handle = await txn.prepare()
        rec = fast_broker.transactions.records[handle.transaction_id]
        assert rec.two_phase and len(rec.halves) == 5
        assert await pulled(fast_broker.address, T) == []
        await p.commit(handle)
    assert sorted(m.body for m in await pulled(fast_broker.address, T)) == [
        b"%d" % i for i in range(5)
    ]


async def test_rollback_by_handle_is_idempotent_and_a_late_commit_refused(fast_broker):
    async with AsyncTransactionProducer(G, NoListener(), fast_broker.address) as p:
        handle = await prepared(p, b"x")
        await p.rollback(handle)
        await p.rollback(str(handle))
        with pytest.raises(IllegalOperationError, match="already ROLLED_BACK"):
            await p.commit(handle)
        with pytest.raises(ValueError, match="producer group"):
            async with AsyncTransactionProducer("other", NoListener(), fast_broker.address) as o:
                await o.commit(handle)
    assert await pulled(fast_broker.address, T) == []


async def test_recover_lists_prepared_handles_across_a_restart(fast_broker):
    async with AsyncTransactionProducer(G, NoListener(), fast_broker.address) as p:
        h1 = await prepared(p, b"1", txid="tx-1")
        h2 = await prepared(p, b"2", txid="tx-2")
        decided = await prepared(p, b"3", txid="tx-3")
        await p.commit(decided)
        async with p.transaction("plain") as txn:  # not two-phase: not listed
            await txn.send(Message(T, b"plain"))
        assert [h.transaction_id for h in await p.recover()] == ["tx-1", "tx-2"]
    cfg = fast_broker.config
    await fast_broker.shutdown()
    async with started(cfg) as b2:
        assert b2.transactions.records["tx-1"].two_phase
        async with AsyncTransactionProducer(G, NoListener(), b2.address) as p:
            found = await p.recover()
            assert found == [h1, h2]
            await p.commit(found[0])
            await p.rollback(found[1])
            await p.commit(decided)  # remembered across the restart
            assert await p.recover() == []
        bodies = sorted(m.body for m in await pulled(b2.address, T))
        assert bodies == [b"1", b"3", b"plain"]
    fast_broker.__init__(cfg)
    await fast_broker.start()


async def test_checks_go_to_the_resolver_and_the_budget_never_parks(fast_broker):
    lst = NoListener()
    answers = [U]
    asked: list[PreparedTransaction] = []

    def resolver(handle: PreparedTransaction) -> LocalTransactionState:
        asked.append(handle)
        return answers[-1]

    async with AsyncTransactionProducer(
        G, lst, fast_broker.address, prepared_resolver=resolver
    ) as p:
        handle = await prepared(p, b"late")
        rec = fast_broker.transactions.records[handle.transaction_id]
        # transactionCheckMax is 2: the coordinator's transaction is asked on past it
        await wait_until(lambda: len(asked) >= 5)
        assert rec.state.value == "PENDING"
        assert {h.transaction_id for h in asked} == {handle.transaction_id}
        assert asked[0].commit_log_offset == handle.commit_log_offset
        overdue = fast_broker.metrics.snapshot()["txmq_transaction_two_phase_overdue_checks_total"]
        assert overdue >= 1
        answers.append(C)
        await wait_until(lambda: rec.state.value == "COMMITTED")
    assert lst.checked == []
    assert [m.body for m in await pulled(fast_broker.address, T)] == [b"late"]


async def test_without_a_resolver_checks_are_answered_unknown(fast_broker):
    lst = NoListener()
    async with AsyncTransactionProducer(G, lst, fast_broker.address) as p:
        handle = await prepared(p, b"y")
        rec = fast_broker.transactions.records[handle.transaction_id]
        await wait_until(lambda: rec.check_times >= 4)
        assert rec.state.value == "PENDING" and lst.checked == []
        p.set_prepared_resolver(lambda h: R)
        await wait_until(lambda: rec.state.value == "ROLLED_BACK")
    assert await pulled(fast_broker.address, T) == []


async def test_a_block_without_prepare_rolls_back(fast_broker):
    async with AsyncTransactionProducer(G, NoListener(), fast_broker.address) as p:
        with pytest.raises(TransactionFailedError, match="without prepare"):
            async with p.transaction("np", two_phase=True) as txn:
                await txn.send(Message(T, b"n"))
        with pytest.raises(RuntimeError):
            async with p.transaction("boom", two_phase=True) as txn:
                await txn.send(Message(T, b"n"))
                raise RuntimeError("before prepare")
        async with p.transaction("after", two_phase=True) as txn:
            await txn.send(Message(T, b"kept"))
            await txn.prepare()
            with pytest.raises(TransactionFailedError, match="prepared"):
                await txn.send(Message(T, b"more"))
        with pytest.raises(ValueError):
            p.transaction(two_phase=True, across_groups=True)
        records = fast_broker.transactions.records
        assert records["np"].state.value == "ROLLED_BACK"
        assert records["boom"].state.value == "ROLLED_BACK"
        assert records["after"].state.value == "PENDING"
        await p.commit(txn.handle)  # type: ignore[arg-type]
    assert [m.body for m in await pulled(fast_broker.address, T)] == [b"kept"]


async def test_decision_is_remembered_past_the_decided_retention(make_broker_config):
    async with started(make_broker_config(transaction_decided_retention=1)) as b:
        async with AsyncTransactionProducer(G, NoListener(), b.address) as p:
            handle = await prepared(p, b"z")
            await p.commit(handle)
            async with p.transaction() as txn:
                await txn.send(Message(T, b"plain"))
            plain = txn.halves[0]
            await asyncio.sleep(0.01)  # past the 1 ms window of a plain decision
            b.transactions.prune()
            assert handle.transaction_id in b.transactions.records
            assert txn.transaction_id not in b.transactions.records
            await p.commit(handle)
            # past transactionBatchRetention too: forgotten, and said so
            b.transactions.machine.prune(0, b.transactions.now_ms() + 1)
            with pytest.raises(PreparedTransactionUnknownError):
                await p.commit(handle)
            assert plain is not None


async def test_admin_lists_two_phase_transactions(fast_broker):
    async with AsyncTransactionProducer(G, NoListener(), fast_broker.address) as p:
        handle = await prepared(p, b"q")
        async with AsyncAdminClient(fast_broker.address) as admin:
            rows = await admin.list_transactions(group=G, two_phase=True)
        assert [r["transactionId"] for r in rows] == [handle.transaction_id]
        assert rows[0]["twoPhase"] is True
        await p.rollback(handle)


def test_sync_facade_prepares_commits_and_recovers(broker_thread):
    with TransactionProducer(G, NoListener(), broker=broker_thread.address) as p:
        with p.transaction(two_phase=True) as txn:
            txn.send(Message(T, b"s"))
            handle = txn.prepare()
        with p.transaction("plain") as plain:
            plain.send(Message(T, b"plain"))
        assert p.recover() == [handle]
        p.commit(str(handle))
        p.commit(handle)
        assert p.recover() == []
    both = sorted([handle.transaction_id, "plain"])
    for flags, listed in ((["--two-phase"], [handle.transaction_id]), ([], both)):
        out = CliRunner().invoke(
            cli,
            ["txn", "list", "--json", "-b", broker_thread.address, "-g", G, "-s", "COMMITTED"]
            + flags,
        )
        assert out.exit_code == 0, out.output
        # the broker thread's log lines may land in the same captured stdout
        text = "\n".join(ln for ln in out.output.splitlines() if not LOG_LINE.match(ln))
        assert sorted(r["transactionId"] for r in json.loads(text)) == listed
