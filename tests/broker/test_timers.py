"""Timer messages (RocketMQ 5's timer): delivered at their time, exactly, never early; refused
beyond ``timerMaxDelaySec``; pending timers survive a restart and a SIGKILL and fire once."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from tests.support.brokers import started, stored
from tests.support.decisions import now_ms
from tests.support.process import running
from tests.support.raw import RawClient, connected
from tests.support.waiting import wait_until
from txmq.broker.messaging.timer import TimerIndex
from txmq.broker.server import BrokerController
from txmq.broker.topics import TIMER_TOPIC
from txmq.client import (
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
    TransactionListener,
)
from txmq.protocol.codes import ResponseCode
from txmq.protocol.message import MessageConst, MessageExt
from txmq.protocol.topics import SCHEDULE_TOPIC

TOPIC = "timed"
#: How late a copy may be stored in these tests: the target is 100 ms, the margin is for a
#: loaded test machine (bench/timers.py measures the lateness).
LATE_MS = 1000


def past(moment_ms: int) -> Callable[[], bool]:
    """A probe: the wall clock has passed ``moment_ms``."""
    return lambda: now_ms() >= moment_ms


async def pulled(address: str, topic: str = TOPIC) -> list[MessageExt]:
    async with connected(address) as c:
        return await c.pull_all(topic)


def check_on_time(copies: list[MessageExt]) -> None:
    """Each copy stored at or after its delivery time, and not much later."""
    for m in copies:
        deliver = int(m.properties["TIMER_DELIVER_MS"])
        late = m.store_timestamp - deliver
        assert 0 <= late <= LATE_MS, f"{m.body!r} stored {late} ms after its delivery time"


# -- the index -------------------------------------------------------------------------------


def test_index_gives_every_timer_once_in_time_order_never_early() -> None:
    rnd = random.Random(7)
    idx = TimerIndex()
    base = 1_700_000_000_000
    due_of: dict[int, int] = {}
    for phy in range(5000):
        due = base + rnd.randrange(0, 20_000)
        due_of[phy] = due
        idx.add(due, phy, phy, base)
    taken: list[int] = []
    t = base
    while len(idx):
        t += rnd.randrange(1, 300)
        # Timers added while firing, some due at once, some in the second being fired.
        if rnd.random() < 0.2:
            phy = len(due_of)
            due_of[phy] = t + rnd.randrange(-50, 500)
            idx.add(due_of[phy], phy, phy, t)
        got, complete = idx.take_due(t, 100)
        assert all(due_of[p] <= t for p in got), "a timer was given before its time"
        taken.extend(got)
        if complete:
            assert idx.next_due_ms() > t, "complete, yet a timer is due"
    assert sorted(taken) == sorted(due_of), "a timer was lost or given twice"


def test_index_low_water_is_the_lowest_pending_queue_offset() -> None:
    idx = TimerIndex()
    base = 1_700_000_000_000
    idx.add(base + 5000, 100, 10, base)
    idx.add(base + 1000, 101, 11, base)
    idx.add(base + 9000, 102, 12, base)
    assert idx.low_water(99) == 10
    got, _ = idx.take_due(base + 6000, 10)
    assert got == [101, 100]
    # The second of offset 10 was fired whole: 12 is the lowest left.
    assert idx.low_water(99) == 12
    idx.take_due(base + 10_000, 10)
    assert idx.low_water(99) == 99


# -- a broker in the test's loop --------------------------------------------------------------


async def test_delivery_time_is_exact_not_a_delay_level(broker: BrokerController) -> None:
    """Times between 1.3 s and 2 s ahead (no delay level of the test config waits that long):
    each timer property is honoured to the millisecond, not rounded to a level."""
    async with connected(broker.address) as c:
        start = now_ms()
        asks = {
            "TIMER_DELIVER_MS": (str(start + 1500), start + 1500),
            "__STARTDELIVERTIME": (str(start + 1700), start + 1700),
            "TIMER_DELAY_SEC": ("2", None),
            "TIMER_DELAY_MS": ("1300", None),
        }
        for key, (value, _) in asks.items():
            resp = await c.send(TOPIC, key.encode(), props={key: value})
            assert resp.code == ResponseCode.SUCCESS, (key, resp.remark)
        assert len(stored(broker, TIMER_TOPIC)) == len(asks), "not held by the timer"
        copies = await wait_until(
            lambda: _copies(broker, len(asks)), 15, "the four timer messages delivered"
        )
        check_on_time(copies)
        assert {m.body for m in copies} == {k.encode() for k in asks}
        by_body = {m.body: m for m in copies}
        sent_at = {k: int(by_body[k.encode()].born_timestamp) for k in asks}
        for key, want in (("TIMER_DELAY_SEC", 2000), ("TIMER_DELAY_MS", 1300)):
            deliver = int(by_body[key.encode()].properties["TIMER_DELIVER_MS"])
            assert 0 <= deliver - sent_at[key] - want < 1000, f"{key}: delivered at {deliver}"
        assert broker.store.get_max_offset_in_queue(SCHEDULE_TOPIC, 1) == 0, "used a level"


def _copies(broker: BrokerController, n: int) -> list[MessageExt]:
    got = stored(broker, TOPIC)
    return got if len(got) >= n else []


async def test_a_time_now_or_past_is_delivered_at_once(broker: BrokerController) -> None:
    async with connected(broker.address) as c:
        resp = await c.send(TOPIC, b"past", props={"TIMER_DELIVER_MS": str(now_ms() - 60_000)})
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        [m] = stored(broker, TOPIC)
        assert m.body == b"past"
        assert stored(broker, TIMER_TOPIC) == []


async def test_beyond_the_max_delay_is_refused_naming_the_limit(make_broker_config) -> None:
    async with started(make_broker_config(timer_max_delay_sec=10)) as b:
        async with connected(b.address) as c:
            resp = await c.send(TOPIC, b"far", props={"TIMER_DELAY_SEC": "11"})
            assert resp.code == ResponseCode.MESSAGE_ILLEGAL, (resp.code, resp.remark)
            assert "timerMaxDelaySec" in (resp.remark or ""), resp.remark
            half = await c.send(
                TOPIC, b"far-tx", props={"TIMER_DELAY_SEC": "11"}, transactional=True
            )
            assert half.code == ResponseCode.MESSAGE_ILLEGAL, (half.code, half.remark)
            ok = await c.send(TOPIC, b"near", props={"TIMER_DELAY_SEC": "9"})
            assert ok.code == ResponseCode.SUCCESS, ok.remark
            assert [m.body for m in stored(b, TIMER_TOPIC)] == [b"near"]


async def test_longer_than_the_longest_delay_level_is_accepted(broker: BrokerController) -> None:
    """Three hours ahead: beyond the default levels' 2 h, well within 3 days."""
    async with connected(broker.address) as c:
        resp = await c.send(TOPIC, b"later", props={"TIMER_DELAY_SEC": str(3 * 3600)})
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        await wait_until(lambda: broker.timer.pending == 1, 5, "the timer pending")


async def test_delay_levels_still_serve_delay(broker: BrokerController) -> None:
    async with connected(broker.address) as c:
        resp = await c.send(TOPIC, b"lvl", props={MessageConst.DELAY: "2"})
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        [m] = stored(broker, SCHEDULE_TOPIC)
        assert m.queue_id == 1 and stored(broker, TIMER_TOPIC) == []
        await wait_until(lambda: stored(broker, TOPIC), 10, "the delayed message delivered")


async def test_pending_timers_survive_a_restart_and_fire_once(make_broker_config) -> None:
    cfg = make_broker_config()
    b = BrokerController(cfg)
    await b.start()
    c = await RawClient.connect(b.address)
    start = now_ms()
    bodies = []
    for i in range(20):
        body = f"r{i}".encode()
        bodies.append(body)
        # half due before the restart, half after it
        resp = await c.send(TOPIC, body, props={"TIMER_DELIVER_MS": str(start + 300 + i * 150)})
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    await c.close()
    await wait_until(lambda: len(stored(b, TOPIC)) >= 5, 10, "a few timers fired")
    await b.shutdown()
    async with started(cfg) as b:
        copies = await wait_until(lambda: _copies(b, 20), 15, "all 20 timers delivered")
        await wait_until(lambda: b.timer.pending == 0, 5, "nothing pending")
        got = [m.body for m in stored(b, TOPIC)]
        assert sorted(got) == sorted(bodies), f"delivered {got}"
        check_on_time(copies)


# -- SIGKILL ------------------------------------------------------------------------------------


class CommitTx(TransactionListener):
    """Commits ``tx…`` bodies, rolls back the others."""

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        body = message.body
        if (body.encode() if isinstance(body, str) else body).startswith(b"tx"):
            return LocalTransactionState.COMMIT_MESSAGE
        return LocalTransactionState.ROLLBACK_MESSAGE

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        return self.execute_local_transaction(Message(TOPIC, message.body), None)


@pytest.mark.external
@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
async def test_sigkill_while_pending_and_firing_delivers_each_once_never_early(
    tmp_path, seed
) -> None:
    """300 timers and 40 delayed transactional messages (30 committed, 10 rolled back) spread
    over 4 s; the broker is SIGKILLed three times at random moments while they fire (and once
    before any is due); every timer and committed message is delivered once, none early, no
    rolled-back one."""
    rnd = random.Random(seed)
    with running(str(tmp_path / "store"), flush="ASYNC_FLUSH") as bp:
        start = now_ms() + 3000
        want: dict[bytes, int] = {}
        async with connected(bp.address) as c:
            for i in range(300):
                deliver = start + rnd.randrange(0, 4000)
                body = f"k{i}".encode()
                want[body] = deliver
                resp = await c.send(TOPIC, body, props={"TIMER_DELIVER_MS": str(deliver)})
                assert resp.code == ResponseCode.SUCCESS, resp.remark
        async with AsyncTransactionProducer("timer-tx", CommitTx(), bp.address) as p:
            for i in range(40):
                deliver = start + rnd.randrange(0, 4000)
                body = f"{'tx' if i % 4 else 'rb'}{i}".encode()
                if i % 4:
                    want[body] = deliver
                await p.send_message_in_transaction(
                    Message(TOPIC, body, properties={"TIMER_DELIVER_MS": str(deliver)})
                )
        assert now_ms() < start, "the sends took longer than the lead: raise it"
        kills = sorted(rnd.uniform(0, 4000) for _ in range(3))
        bp.kill()  # before any is due
        bp.start()
        for at in kills:
            await wait_until(past(start + int(at)), 30, f"{at:.0f} ms past start")
            bp.kill()
            bp.start()
        end = max(want.values())

        async def all_there() -> list[MessageExt]:
            got = await pulled(bp.address)
            return got if len(got) >= len(want) and now_ms() > end + 500 else []

        got = await wait_until(all_there, 60, "every timer delivered")
        bodies = [m.body for m in got]
        twice = {b for b in bodies if bodies.count(b) > 1}
        assert not twice, f"{len(twice)} timers delivered twice: {sorted(twice)[:5]}"
        assert set(bodies) == set(want), (
            f"missing {set(want) - set(bodies)}, not to be delivered {set(bodies) - set(want)}"
        )
        early = [
            (m.body, want[m.body] - m.store_timestamp)
            for m in got
            if m.store_timestamp < want[m.body]
        ]
        assert not early, f"delivered early (ms): {early[:5]}"


async def test_a_resend_after_a_restart_is_not_stored_twice(make_broker_config) -> None:
    """The duplicate window, rebuilt at start, knows timer messages by their real topic."""
    cfg = make_broker_config()
    props = {"TIMER_DELAY_SEC": "30", MessageConst.UNIQ_KEY: "C0A80001000018B4AAC2000000000001"}
    b = BrokerController(cfg)
    await b.start()
    c = await RawClient.connect(b.address)
    first = RawClient.send_header(await c.send(TOPIC, b"once", props=props))
    await c.close()
    await b.shutdown()
    async with started(cfg) as b:
        c = await RawClient.connect(b.address)
        again = RawClient.send_header(await c.send(TOPIC, b"once", props=props))
        await c.close()
        assert again.msg_id == first.msg_id, "answered as a new message"
        assert len(stored(b, TIMER_TOPIC)) == 1 and b.timer.pending == 1


async def test_sdk_batches_of_timer_messages_wait_for_their_time(broker: BrokerController) -> None:
    """A batch (send_batch, or sends the SDK gathers into one) is not stored as plain messages:
    each waits for its time."""
    from txmq.client import AsyncProducer

    deliver = now_ms() + 1200
    async with AsyncProducer("timer-batch", broker.address) as p:
        await p.send_batch(
            [
                Message(TOPIC, f"b{i}".encode(), properties={"TIMER_DELIVER_MS": str(deliver)})
                for i in range(5)
            ]
        )
        await asyncio.gather(
            *(
                p.send(
                    Message(TOPIC, f"g{i}".encode(), properties={"TIMER_DELIVER_MS": str(deliver)})
                )
                for i in range(20)
            )
        )
    assert stored(broker, TOPIC) == [], "delivered before its time"
    copies = await wait_until(lambda: _copies(broker, 25), 10, "the 25 timers delivered")
    check_on_time(copies)


async def test_timers_overdue_at_start_fire_once(make_broker_config) -> None:
    """The broker was down when 2,000 timers fell due: they fire at start, each once, in
    bounded steps (the broker answers while they do)."""
    cfg = make_broker_config()
    b = BrokerController(cfg)
    await b.start()
    c = await RawClient.connect(b.address)
    due = now_ms() + 500
    for i in range(2000):
        resp = await c.send(TOPIC, b"o%d" % i, props={"TIMER_DELIVER_MS": str(due + i % 7)})
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    await c.close()
    await b.shutdown()
    await wait_until(lambda: now_ms() > due + 100, 10, "the timers' time passed")
    async with started(cfg) as b:
        c = await RawClient.connect(b.address)
        resp = await c.send("other", b"meanwhile")
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        await c.close()
        await wait_until(lambda: b.timer.pending == 0, 30, "the overdue timers fired")
        bodies = [m.body for m in stored(b, TOPIC)]
        assert len(bodies) == 2000 and len(set(bodies)) == 2000, f"{len(bodies)} copies"
