"""A delay level (``DELAY``) on a transactional message: once committed, the message is
delivered in its topic that level's delay after the commit (never before), once, also when the
broker is SIGKILLed between the commit and the delivery; rolled back, never."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tests.support.brokers import pulled, started, stored
from tests.support.decisions import C, R, U, now_ms
from tests.support.process import running
from tests.support.raw import connected
from tests.support.waiting import wait_until
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.broker.topics import TIMER_TOPIC
from txmq.client.transaction import (
    AsyncTransactionProducer,
    LocalTransactionState,
    TransactionListener,
)
from txmq.protocol.codes import ResponseCode
from txmq.protocol.message import Message, MessageConst, MessageExt
from txmq.protocol.topics import SCHEDULE_TOPIC

G = "delay-level-tx"
TOPIC = "delay-level-orders"
#: The level these tests use: 3 s, long enough that "not delivered at the commit" holds on a
#: loaded machine.
LEVEL, LEVEL_MS = 2, 3000
LEVELS = "100ms 3s"
#: Margin for a loaded test machine (the timer's target is 100 ms).
LATE_MS = 1000


class Listener(TransactionListener):
    """Waits ``hold_ms`` after the half was stored, then answers ``first`` (and ``check`` to
    a check-back, ``first`` unless given); records when."""

    def __init__(
        self,
        first: LocalTransactionState,
        hold_ms: int = 0,
        check: LocalTransactionState | None = None,
    ) -> None:
        self.first = first
        self.check = first if check is None else check
        self.hold_ms = hold_ms
        self.answered_ms: dict[bytes, int] = {}

    async def execute_local_transaction(self, message, arg):  # type: ignore[override]
        if self.hold_ms:
            until = now_ms() + self.hold_ms
            await wait_until(lambda: now_ms() >= until, 10, "the local transaction's time")
        body = message.body if isinstance(message.body, bytes) else message.body.encode()
        self.answered_ms[body] = now_ms()
        return self.first

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        return self.check


def check_after_commit(got: list[MessageExt], committed_ms: dict[bytes, int], delay: int) -> None:
    """Each message once, stored its delay after its commit (never before, not much later)."""
    bodies = [m.body for m in got]
    assert sorted(bodies) == sorted(committed_ms), bodies
    for m in got:
        late = m.store_timestamp - (committed_ms[m.body] + delay)
        assert late >= 0, f"{m.body!r} delivered {-late} ms before its delay after the commit"
        assert late <= LATE_MS, f"{m.body!r} delivered {late} ms after its time"


@pytest.fixture
async def broker(
    make_broker_config: Callable[..., BrokerConfig],
) -> AsyncIterator[BrokerController]:
    async with started(make_broker_config(message_delay_level=LEVELS)) as b:
        yield b


async def test_delay_level_counts_from_the_commit(broker: BrokerController) -> None:
    """The local transaction takes 800 ms: a delay counted from the half would deliver before
    the commit's time + the level's 3 s."""
    lst = Listener(C, hold_ms=800, check=U)  # only the producer's commit decides
    async with AsyncTransactionProducer(G, lst, broker.address) as p:
        r = await p.send_message_in_transaction(
            Message(TOPIC, b"one", tags="t", keys="k1", delay_level=LEVEL)
        )
    assert r.local_transaction_state is C
    # Committed and held by the timer (not by the delay levels' topic): nothing delivered yet.
    held = [m for m in stored(broker, TIMER_TOPIC) if m.queue_id == 0]
    assert [m.body for m in held] == [b"one"]
    assert stored(broker, SCHEDULE_TOPIC) == []
    assert await pulled(broker.address, TOPIC) == [], "delivered at the commit"
    await wait_until(lambda: pulled(broker.address, TOPIC), 15, "the committed message delivered")
    await wait_until(lambda: broker.timer.pending == 0, 5, "nothing pending")
    got = await pulled(broker.address, TOPIC)
    check_after_commit(got, lst.answered_ms, LEVEL_MS)
    [m] = got
    assert (m.body, m.tags, m.keys, m.msg_id) == (b"one", "t", "k1", r.msg_id)
    assert MessageConst.DELAY not in m.properties
    assert not {MessageConst.REAL_TOPIC, MessageConst.TRAN_MSG} & set(m.properties)


async def _n(got: Any, n: int) -> list[MessageExt]:
    msgs: list[MessageExt] = await got
    return msgs if len(msgs) >= n else []


async def test_a_batch_of_halves_waits_its_delay_after_the_commit(
    broker: BrokerController,
) -> None:
    """The halves of one request (the batch fast path): each delivered the level's delay
    after the commit, once."""
    lst = Listener(C)
    async with AsyncTransactionProducer(G, lst, broker.address) as p:
        async with p.transaction() as txn:
            for body in (b"b1", b"b2", b"b3"):
                await txn.send(Message(TOPIC, body, keys="k", delay_level=LEVEL))
        committed = now_ms()  # the commit is answered once durable: it was before this
    assert await pulled(broker.address, TOPIC) == [], "delivered at the commit"
    await wait_until(lambda: _n(pulled(broker.address, TOPIC), 3), 15, "all three delivered")
    await wait_until(lambda: broker.timer.pending == 0, 5, "nothing pending")
    got = await pulled(broker.address, TOPIC)
    assert sorted(m.body for m in got) == [b"b1", b"b2", b"b3"]
    for m in got:
        assert m.store_timestamp <= committed + LEVEL_MS + LATE_MS
        assert MessageConst.DELAY not in m.properties
    # Never before the level's delay after the halves were stored (the commit came later).
    halves = {m.body: m.store_timestamp for m in stored(broker, broker.transactions.half_topic)}
    for m in got:
        assert m.store_timestamp >= halves[m.body] + LEVEL_MS


async def test_rolled_back_with_a_delay_level_is_never_delivered(
    broker: BrokerController,
) -> None:
    async with AsyncTransactionProducer(G, Listener(R), broker.address) as p:
        await p.send_message_in_transaction(Message(TOPIC, b"rolled", delay_level=1))
    async with AsyncTransactionProducer(G, Listener(C), broker.address) as p:
        await p.send_message_in_transaction(Message(TOPIC, b"marker", delay_level=LEVEL))
    await wait_until(lambda: pulled(broker.address, TOPIC), 10, "the marker delivered")
    await wait_until(lambda: broker.timer.pending == 0, 5, "nothing pending")
    assert [m.body for m in await pulled(broker.address, TOPIC)] == [b"marker"]


async def test_a_level_that_is_no_number_is_refused(broker: BrokerController) -> None:
    async with connected(broker.address) as c:
        resp = await c.send(
            TOPIC, b"x", group=G, props={MessageConst.DELAY: "soon"}, transactional=True
        )
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL
    assert "DELAY" in (resp.remark or "")
    assert stored(broker, broker.transactions.half_topic) == []


@pytest.mark.external
@pytest.mark.slow
async def test_sigkill_between_commit_and_delivery_delivers_once_after_the_delay(
    tmp_path,
) -> None:
    """Twenty halves with a 3 s level, committed; the broker is SIGKILLed right after the
    commits, and again while they fire: each is delivered once, never before 3 s after its
    commit."""
    delay = 3000
    with running(
        str(tmp_path / "store"), flush="ASYNC_FLUSH", settings={"messageDelayLevel": "3s 4s"}
    ) as bp:
        address = bp.address
        lst = Listener(C)
        async with AsyncTransactionProducer(G, lst, address) as p:
            for i in range(20):
                await p.send_message_in_transaction(
                    Message(TOPIC, f"tx{i}".encode(), delay_level=1)
                )
        first = min(lst.answered_ms.values())
        bp.kill()  # between the commits and any delivery
        bp.start()
        await wait_until(lambda: now_ms() >= first + delay, 30, "the first one due")
        bp.kill()  # while they fire
        bp.start()
        last = max(lst.answered_ms.values()) + delay

        async def all_there() -> list[MessageExt]:
            got = await pulled(bp.address, TOPIC)
            return got if len(got) >= 20 and now_ms() > last + 500 else []

        got = await wait_until(all_there, 60, "every committed message delivered")
        bodies = [m.body for m in got]
        assert len(bodies) == len(set(bodies)) == 20, sorted(bodies)
        for m in got:
            assert m.store_timestamp >= lst.answered_ms[m.body] + delay, (
                f"{m.body!r} delivered before its delay after the commit"
            )
