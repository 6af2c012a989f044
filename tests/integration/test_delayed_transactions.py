"""Delayed transactional messages: a half carrying a delivery time is, once committed, delivered
at that time (never before the commit, never before the time); rolled back, never.  Over
remoting with the SDK's transaction producer and a real broker."""

from __future__ import annotations

from typing import Any

from tests.support.brokers import pulled, started, stored
from tests.support.decisions import C, R, U, now_ms
from tests.support.waiting import wait_until
from txmq.broker.server import BrokerController
from txmq.broker.topics import TIMER_TOPIC
from txmq.client.transaction import (
    AsyncTransactionProducer,
    LocalTransactionState,
    TransactionListener,
)
from txmq.protocol.message import Message, MessageConst, MessageExt

G = "delayed-tx"
TOPIC = "delayed-orders"
#: Margin for a loaded test machine (the target is 100 ms; bench/timers.py measures it).
LATE_MS = 1000


def at(ms: int) -> dict[str, str]:
    """The property that asks for delivery at ``ms`` (epoch ms)."""
    return {"TIMER_DELIVER_MS": str(ms)}


class Listener(TransactionListener):
    """Answers ``first`` (after ``before`` ran), then ``check`` to every check-back; records
    when it answered."""

    def __init__(self, first: LocalTransactionState, check: LocalTransactionState = U) -> None:
        self.first = first
        self.check = check
        self.before: Any = None
        self.answered_ms: list[int] = []

    async def execute_local_transaction(self, message, arg):  # type: ignore[override]
        if self.before is not None:
            await self.before(message)
        self.answered_ms.append(now_ms())
        return self.first

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        self.answered_ms.append(now_ms())
        return self.check


async def test_commit_is_delivered_at_its_time_not_at_the_commit(broker: BrokerController) -> None:
    deliver = now_ms() + 1500
    async with AsyncTransactionProducer(G, Listener(C), broker.address) as p:
        r = await p.send_message_in_transaction(
            Message(TOPIC, b"later", tags="t", keys="k1", properties=at(deliver))
        )
    assert r.local_transaction_state is C
    # Committed, held by the timer: nothing in the topic yet.
    [held] = stored(broker, TIMER_TOPIC)
    assert held.properties[MessageConst.REAL_TOPIC] == TOPIC and held.body == b"later"
    assert await pulled(broker.address, TOPIC) == [], "delivered at the commit, before its time"
    got = await wait_until(
        lambda: pulled(broker.address, TOPIC), 15, "the committed message delivered"
    )
    await wait_until(lambda: broker.timer.pending == 0, 5, "nothing pending")
    [m] = await pulled(broker.address, TOPIC)
    assert (m.body, m.tags, m.keys, m.msg_id) == (b"later", "t", "k1", r.msg_id), got
    assert 0 <= m.store_timestamp - deliver <= LATE_MS, (
        f"delivered {m.store_timestamp - deliver} ms after its time"
    )
    assert not {MessageConst.REAL_TOPIC, MessageConst.REAL_QID, MessageConst.TRAN_MSG} & set(
        m.properties
    )


async def test_a_time_passed_before_the_commit_is_delivered_at_the_commit(
    broker: BrokerController,
) -> None:
    """The local transaction outlasts the delivery time: delivered once committed, not
    before."""
    deliver = now_ms() + 200
    lst = Listener(C)

    async def slow(_: Message) -> None:
        await wait_until(lambda: now_ms() > deliver + 300, 5, "the delivery time passed")
        assert await pulled(broker.address, TOPIC) == [], "delivered before the commit"

    lst.before = slow
    async with AsyncTransactionProducer(G, lst, broker.address) as p:
        await p.send_message_in_transaction(Message(TOPIC, b"due", properties=at(deliver)))
    [m] = await wait_until(lambda: pulled(broker.address, TOPIC), 10, "delivered after the commit")
    assert m.store_timestamp >= lst.answered_ms[0], "stored before the commit was decided"


async def test_rollback_is_never_delivered(broker: BrokerController) -> None:
    soon = now_ms() + 300
    async with AsyncTransactionProducer(G, Listener(R), broker.address) as p:
        r = await p.send_message_in_transaction(Message(TOPIC, b"rolled", properties=at(soon)))
    assert r.local_transaction_state is R
    # The marker: committed, due after the rolled-back one would have been.
    async with AsyncTransactionProducer(G, Listener(C), broker.address) as p:
        await p.send_message_in_transaction(Message(TOPIC, b"marker", properties=at(soon + 700)))
    await wait_until(lambda: pulled(broker.address, TOPIC), 10, "the marker delivered")
    await wait_until(lambda: broker.timer.pending == 0, 5, "nothing pending")
    assert [m.body for m in await pulled(broker.address, TOPIC)] == [b"marker"]
    assert [m.body for m in stored(broker, TIMER_TOPIC) if m.queue_id == 0] == [b"marker"]


async def test_check_back_commit_waits_for_the_time(make_broker_config) -> None:
    async with started(
        make_broker_config(transaction_time_out=100, transaction_check_interval=100)
    ) as b:
        deliver = now_ms() + 2500
        lst = Listener(U, check=C)
        async with AsyncTransactionProducer(G, lst, b.address) as p:
            await p.send_message_in_transaction(Message(TOPIC, b"checked", properties=at(deliver)))
            await wait_until(lambda: not b.transactions.pending, 10, "committed by a check")
        [m] = await wait_until(lambda: pulled(b.address, TOPIC), 15, "delivered")
        assert 0 <= m.store_timestamp - deliver <= LATE_MS, m.store_timestamp - deliver


async def test_a_delayed_commit_survives_a_restart_and_is_delivered_once(
    make_broker_config,
) -> None:
    cfg = make_broker_config()
    b = BrokerController(cfg)
    await b.start()
    deliver = now_ms() + 2000
    async with AsyncTransactionProducer(G, Listener(C), b.address) as p:
        await p.send_message_in_transaction(Message(TOPIC, b"kept", properties=at(deliver)))
    await b.shutdown()
    async with started(cfg) as b:
        assert b.timer.pending == 1
        await wait_until(lambda: pulled(b.address, TOPIC), 15, "delivered after the restart")
        await wait_until(lambda: b.timer.pending == 0, 5, "nothing pending")
        [m] = await pulled(b.address, TOPIC)
        assert m.body == b"kept" and m.store_timestamp >= deliver
