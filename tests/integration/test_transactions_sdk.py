"""Transactional messages end to end with the real SDK and a real broker (fast timers)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests.support.brokers import started
from tests.support.decisions import C, R, U
from tests.support.raw import connected
from tests.support.waiting import rounds_pass, wait_until
from txmq.broker.server import BrokerController
from txmq.client.admin import AsyncAdminClient
from txmq.client.transaction import (
    AsyncTransactionProducer,
    TransactionListener,
)
from txmq.protocol.codes import RequestCode
from txmq.protocol.errors import (
    BrokerSystemError,
    IllegalOperationError,
    NoPermissionError,
)
from txmq.protocol.message import Message, MessageConst, MessageExt

G = "order-tx"


class Scripted(TransactionListener):
    """execute returns ``first``; the k-th check returns ``checks[k-1]`` (last one repeats)."""

    def __init__(self, first, checks=(U,), on_execute=None):
        self.first = first
        self.script = list(checks)
        self.checks: list[tuple[float, MessageExt]] = []
        self.executed = 0
        self.on_execute = on_execute

    # The SDK awaits coroutine listeners; the base class annotates only the sync form.
    async def execute_local_transaction(self, message, arg):  # type: ignore[override]
        self.executed += 1
        if self.on_execute:
            await self.on_execute(message)
        if isinstance(self.first, Exception):
            raise self.first
        return self.first

    def check_local_transaction(self, message):  # sync on purpose: runs in a thread pool
        self.checks.append((time.monotonic(), message))
        return self.script[min(len(self.checks), len(self.script)) - 1]


async def delivered(address: str, topic: str) -> list[MessageExt]:
    async with connected(address) as c:
        return await c.pull_all(topic)


@pytest.fixture
async def fast_broker(make_broker_config):
    b = BrokerController(
        make_broker_config(
            transaction_time_out=300, transaction_check_interval=100, transaction_check_max=5
        )
    )
    await b.start()
    yield b
    await b.shutdown()


async def test_commit_is_delivered_once_and_invisible_before(fast_broker):
    seen_before = []

    async def look(message):
        seen_before.extend(await delivered(fast_broker.address, "orders"))

    lst = Scripted(C, on_execute=look)
    async with AsyncTransactionProducer(G, lst, fast_broker.address) as p:
        msg = Message("orders", b"order-1", tags="created", keys="o1", properties={"region": "eu"})
        r = await p.send_message_in_transaction(msg, arg={"id": 1}, queue_id=2)
    assert r.local_transaction_state is C and r.transaction_id == r.msg_id
    assert seen_before == []
    [m] = await delivered(fast_broker.address, "orders")
    assert (m.topic, m.queue_id, m.body, m.tags, m.keys) == (
        "orders",
        2,
        b"order-1",
        "created",
        "o1",
    )
    assert m.user_properties == {"region": "eu"} and m.msg_id == r.msg_id
    assert not {MessageConst.REAL_TOPIC, MessageConst.REAL_QID, MessageConst.TRAN_MSG} & set(
        m.properties
    )


async def test_rollback_never_delivered_also_after_restart(fast_broker):
    async with AsyncTransactionProducer(G, Scripted(R), fast_broker.address) as p:
        r = await p.send_message_in_transaction(Message("orders", b"x"))
    assert r.local_transaction_state is R
    cfg = fast_broker.config
    await fast_broker.shutdown()
    async with started(cfg) as b2:
        await rounds_pass(lambda: b2.transactions.rounds, 3)
        assert await delivered(b2.address, "orders") == []
    fast_broker.__init__(cfg)  # the fixture shuts down a fresh, started broker
    await fast_broker.start()


@pytest.mark.parametrize("answer", [C, R])
async def test_unknown_then_resolved_by_check_back(fast_broker, answer):
    lst = Scripted(RuntimeError("db timeout"), checks=[U, answer])
    async with AsyncTransactionProducer(G, lst, fast_broker.address) as p:
        r = await p.send_message_in_transaction(Message("orders", b"x"))
        assert r.local_transaction_state is U
        await wait_until(lambda: len(lst.checks) == 2)
        await wait_until(lambda: not fast_broker.transactions.pending)
    got = await delivered(fast_broker.address, "orders")
    assert len(got) == (1 if answer is C else 0)
    assert lst.checks[0][1].topic == "orders"
    assert lst.checks[0][1].transaction_id == r.transaction_id


async def test_unknown_forever_exactly_check_max_then_parked_then_resumed(fast_broker):
    lst = Scripted(None)  # None means UNKNOW
    async with AsyncTransactionProducer(G, lst, fast_broker.address) as p:
        r = await p.send_message_in_transaction(Message("orders", b"x"))
        assert r.transaction_id is not None
        rec = fast_broker.transactions.records[r.transaction_id]
        await wait_until(lambda: rec.state.value == "DISCARDED")
        await rounds_pass(lambda: fast_broker.transactions.rounds, 3)
        assert len(lst.checks) == 5  # transactionCheckMax
        async with AsyncAdminClient(fast_broker.address) as admin:
            parked = await admin.list_transactions(state="DISCARDED")
            assert [t["transactionId"] for t in parked] == [r.transaction_id]
            await admin.resume_transaction(r.transaction_id)
        lst.script = [C]
        await wait_until(lambda: rec.state.value == "COMMITTED")
    assert len(await delivered(fast_broker.address, "orders")) == 1


async def test_no_check_before_the_timeout_and_immunity_delays_it(make_broker_config):
    async with started(
        make_broker_config(transaction_time_out=800, transaction_check_interval=50)
    ) as b:
        lst = Scripted(U, checks=[C])
        async with AsyncTransactionProducer(G, lst, b.address) as p:
            t0 = time.monotonic()
            await p.send_message_in_transaction(Message("orders", b"a"))
            t1 = time.monotonic()
            await p.send_message_in_transaction(Message("orders", b"b"), check_immunity_seconds=2)
            await wait_until(lambda: len(lst.checks) == 2, 6)
        first, second = lst.checks[0][0] - t0, lst.checks[1][0] - t1
        assert first >= 0.8, first
        assert second >= 2.0, second


async def test_repeated_and_contradicting_decisions(fast_broker):
    async with AsyncTransactionProducer(G, Scripted(C), fast_broker.address) as p:
        r = await p.send_message_in_transaction(Message("orders", b"x"))
        await p.end_transaction(r, C)  # harmless
        with pytest.raises(IllegalOperationError, match="already COMMITTED"):
            await p.end_transaction(r, R)
    assert len(await delivered(fast_broker.address, "orders")) == 1
    async with AsyncTransactionProducer(G, Scripted(R), fast_broker.address) as p:
        r2 = await p.send_message_in_transaction(Message("orders2", b"y"))
        with pytest.raises(IllegalOperationError, match="already ROLLED_BACK"):
            await p.end_transaction(r2, C)
    assert await delivered(fast_broker.address, "orders2") == []


async def test_mismatched_group_gets_system_error_naming_the_reason(fast_broker):
    async with (
        AsyncTransactionProducer(G, Scripted(U), fast_broker.address) as p,
        AsyncTransactionProducer("other", Scripted(U), fast_broker.address) as q,
    ):
        r = await p.send_message_in_transaction(Message("orders", b"x"))
        with pytest.raises(BrokerSystemError, match="producer group wrong"):
            await q.end_transaction(r, C)
        r.queue_offset += 1
        with pytest.raises(BrokerSystemError, match="state table offset wrong"):
            await p.end_transaction(r, C)


async def test_rejected_transactions_run_no_local_transaction(make_broker_config):
    async with started(make_broker_config(reject_transaction_message=True)) as b:
        lst = Scripted(C)
        async with AsyncTransactionProducer(G, lst, b.address) as p:
            with pytest.raises(NoPermissionError):
                await p.send_message_in_transaction(Message("orders", b"x"))
        assert lst.executed == 0


async def test_delay_level_waits_after_the_commit(fast_broker):
    """A delay level on a transactional message counts from the commit (RocketMQ's rule): the
    committed message waits in the timer for its level (500 ms here), then comes once."""
    before = int(time.time() * 1000)
    async with AsyncTransactionProducer(G, Scripted(C), fast_broker.address) as p:
        await p.send_message_in_transaction(Message("orders", b"x", delay_level=5))
    got = await wait_until(
        lambda: delivered(fast_broker.address, "orders"), 20, "the delayed commit delivered"
    )
    [m] = got
    assert m.store_timestamp >= before + 500, (m.store_timestamp - before, "ms after the send")
    assert MessageConst.DELAY not in m.properties


async def test_multi_message_transaction_all_or_nothing(fast_broker):
    async with AsyncTransactionProducer(G, Scripted(U), fast_broker.address) as p:
        async with p.transaction() as txn:
            for q in range(4):
                await txn.send(Message("orders", f"m{q}".encode()), queue_id=q)
            await txn.send(Message("audit", b"a"))
            assert await delivered(fast_broker.address, "orders") == []
        with pytest.raises(ZeroDivisionError):
            async with p.transaction() as txn2:
                await txn2.send(Message("orders", b"never"), queue_id=0)
                raise ZeroDivisionError("the local work failed")
    got = sorted(m.body for m in await delivered(fast_broker.address, "orders"))
    assert got == [b"m0", b"m1", b"m2", b"m3"]
    assert [m.body for m in await delivered(fast_broker.address, "audit")] == [b"a"]
    assert fast_broker.transactions.records[txn2.transaction_id].state.value == "ROLLED_BACK"


async def test_concurrent_halves_travel_in_one_batch(fast_broker):
    """Halves sent together go as one SEND_BATCH_MESSAGE per topic and queue choice; each
    send still gets its own ids, and the decision covers all of them."""
    requests = fast_broker.metrics.requests

    def batches() -> float:
        return float(requests.labels(str(int(RequestCode.SEND_BATCH_MESSAGE)))._value.get())

    async with AsyncTransactionProducer(G, Scripted(U), fast_broker.address) as p:
        before = batches()
        async with p.transaction() as txn:
            results = await asyncio.gather(
                *(txn.send(Message("orders", f"b{i}".encode())) for i in range(5)),
                txn.send(Message("audit", b"x1")),
                txn.send(Message("audit", b"x2")),
                txn.send(Message("orders", b"q3"), queue_id=3),
            )
            assert await delivered(fast_broker.address, "orders") == []
        assert batches() - before == 2  # five "orders" halves, two "audit" halves
        assert len({r.msg_id for r in results}) == len({r.offset_msg_id for r in results}) == 8
        orders = results[:5]
        assert [r.queue_offset for r in orders] == [orders[0].queue_offset + i for i in range(5)]
    rec = fast_broker.transactions.records[txn.transaction_id]
    assert rec.state.value == "COMMITTED"
    got = sorted(m.body for m in await delivered(fast_broker.address, "orders"))
    assert got == [b"b0", b"b1", b"b2", b"b3", b"b4", b"q3"]
    assert sorted(m.body for m in await delivered(fast_broker.address, "audit")) == [b"x1", b"x2"]


async def test_no_producer_online_keeps_the_budget(fast_broker):
    async with AsyncTransactionProducer(G, Scripted(U), fast_broker.address) as p:
        r = await p.send_message_in_transaction(Message("orders", b"x"))
    await rounds_pass(lambda: fast_broker.transactions.rounds, 10)  # nobody online
    rec = fast_broker.transactions.records[r.transaction_id]
    assert rec.check_times == 0 and rec.state.value == "PENDING"
    lst = Scripted(U, checks=[C])
    async with AsyncTransactionProducer(G, lst, fast_broker.address):
        await wait_until(lambda: rec.state.value == "COMMITTED")
    assert len(lst.checks) == 1


async def test_bounded_check_queue_refuses_and_nothing_is_lost(fast_broker):
    async with AsyncTransactionProducer(G, Scripted(U), fast_broker.address) as p:
        for i in range(6):
            await p.send_message_in_transaction(Message("orders", f"{i}".encode()))

    release = threading.Event()

    class Held(Scripted):
        def check_local_transaction(self, message):
            release.wait(30)  # the one check thread stays busy until a check was refused
            return super().check_local_transaction(message)

    lst = Held(U, checks=[C])
    async with AsyncTransactionProducer(
        G, lst, fast_broker.address, check_threads=1, check_queue_size=2
    ) as q:
        try:
            await wait_until(lambda: q.checks_refused > 0, 15, "a check refused (queue full)")
        finally:
            release.set()
        await wait_until(lambda: not fast_broker.transactions.pending, 15)
    assert len(await delivered(fast_broker.address, "orders")) == 6


PRODUCER_THAT_DIES = textwrap.dedent("""
    import os, signal, sys
    from txmq.client.transaction import (TransactionProducer, TransactionListener,
                                         LocalTransactionState)
    from txmq.protocol.message import Message

    class Dies(TransactionListener):
        def execute_local_transaction(self, message, arg):
            print("HALF", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    with TransactionProducer("order-tx", Dies(), broker=sys.argv[1]) as p:
        p.send_message_in_transaction(Message("orders", b"from-the-dead"))
""")


async def test_producer_killed_after_the_half_another_producer_decides(fast_broker):
    lst = Scripted(C, checks=[C])
    async with AsyncTransactionProducer(G, lst, fast_broker.address):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", PRODUCER_THAT_DIES, fast_broker.address, stdout=subprocess.PIPE
        )
        out, _ = await proc.communicate()
        assert b"HALF" in out and proc.returncode == -9
        await wait_until(lambda: not fast_broker.transactions.pending)
    assert [m.body for m in await delivered(fast_broker.address, "orders")] == [b"from-the-dead"]
    assert len(lst.checks) == 1
    # every check the broker counted went to the live producer
    sent = fast_broker.metrics.snapshot()["txmq_transaction_checks_sent_total"]
    assert sent == 1


def test_sync_facade_commits_and_rolls_back_multi_message_transactions(broker_thread):
    from txmq.client import TransactionProducer

    addr = broker_thread.address
    with TransactionProducer(G, Scripted(C), broker=addr) as p:
        r = p.send_message_in_transaction(Message("sync-tx", b"single"))
        assert r.local_transaction_state is C
        with p.transaction() as txn:
            txn.send(Message("sync-tx", b"a"))
            txn.send(Message("sync-tx", b"b"))
        with pytest.raises(KeyError), p.transaction() as txn2:
            txn2.send(Message("sync-tx", b"never"))
            raise KeyError("local work failed")
    got = broker_thread.test_thread.call(delivered(addr, "sync-tx"))
    assert sorted(m.body for m in got) == [b"a", b"b", b"single"]
