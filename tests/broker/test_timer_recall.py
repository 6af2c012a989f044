"""Recalling a pending timer message (RocketMQ 5.3's RECALL_MESSAGE and its TIMER_DEL_UNIQKEY
marker): the recall handle a send answers names it; a recalled message is never delivered,
also after a SIGKILL; recalling one already delivered, or one that is not pending, is refused
saying so."""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest

from tests.support.brokers import pulled
from tests.support.decisions import now_ms
from tests.support.process import running
from tests.support.raw import RawClient, connected
from tests.support.waiting import wait_until
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.message import MessageExt

TOPIC = "recallable"


def past(moment_ms: int) -> Callable[[], bool]:
    return lambda: now_ms() >= moment_ms


def handle_of(resp: RemotingCommand) -> str:
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    handle = resp.ext_fields.get("recallHandle")
    assert handle, f"no recall handle in {resp.ext_fields}"
    return str(handle)


def make_handle(topic: str, broker: str, ts: int, msg_id: str) -> str:
    raw = f"v1 {topic} {broker} {ts} {msg_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode()


async def recall(c: RawClient, handle: str, topic: str = TOPIC) -> RemotingCommand:
    return await c.call(
        RequestCode.RECALL_MESSAGE,
        {"producerGroup": "recaller", "topic": topic, "recallHandle": handle},
    )


async def test_a_recalled_timer_message_is_never_delivered(broker: BrokerController) -> None:
    async with connected(broker.address) as c:
        await c.send(TOPIC, b"warm-up")  # the topic exists
        deliver = now_ms() + 2500
        h1 = handle_of(await c.send(TOPIC, b"recalled", props={"TIMER_DELIVER_MS": str(deliver)}))
        kept = await c.send(TOPIC, b"kept", props={"TIMER_DELIVER_MS": str(deliver)})
        h2 = handle_of(kept)
        # The handle is RocketMQ 5.3's: v1, topic, broker name, time, message id.
        v, topic, broker_name, ts, msg_id = base64.urlsafe_b64decode(h1).decode().split(" ")
        assert (v, topic, broker_name, int(ts)) == ("v1", TOPIC, broker.config.broker_name, deliver)
        assert broker.timer.pending == 2
        r = await recall(c, h1)
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert r.ext_fields["msgId"] == msg_id
        assert broker.timer.pending == 1
        again = await recall(c, h1)  # a retried recall is answered the same
        assert again.code == ResponseCode.SUCCESS, again.remark
        await wait_until(past(deliver + 300), 10, "past the delivery time")
        await wait_until(lambda: broker.timer.pending == 0, 10, "the kept one fired")
        got = await pulled(broker.address, TOPIC)
        assert sorted(m.body for m in got) == [b"kept", b"warm-up"]
        # Too late: the kept one was delivered.
        late = await recall(c, h2)
        assert late.code == ResponseCode.ILLEGAL_OPERATION
        assert "delivered" in (late.remark or ""), late.remark


async def test_recall_refusals_say_what_is_wrong(broker: BrokerController) -> None:
    async with connected(broker.address) as c:
        await c.send(TOPIC, b"warm-up")
        name = broker.config.broker_name
        future = now_ms() + 30_000
        unknown = await recall(
            c, make_handle(TOPIC, name, future, "C0A80001000000000000000000000001")
        )
        assert unknown.code == ResponseCode.QUERY_NOT_FOUND
        assert "no pending timer message" in (unknown.remark or "")
        bad = await recall(c, "not a handle!")
        assert (bad.code, bad.remark) == (
            ResponseCode.ILLEGAL_OPERATION,
            "recall handle is invalid",
        )
        other = await recall(c, make_handle("elsewhere", name, future, "X"))
        assert other.code == ResponseCode.ILLEGAL_OPERATION
        assert "topic not match" in (other.remark or "")
        foreign = await recall(c, make_handle(TOPIC, "another-broker", future, "X"))
        assert foreign.code == ResponseCode.ILLEGAL_OPERATION
        assert "another-broker" in (foreign.remark or "")
        nowhere = await recall(c, make_handle("nowhere", name, future, "X"), topic="nowhere")
        assert nowhere.code == ResponseCode.TOPIC_NOT_EXIST
        missing = await c.call(RequestCode.RECALL_MESSAGE, {"topic": TOPIC})
        assert missing.code == ResponseCode.INVALID_PARAMETER
        # No timer: no recall handle.
        plain = await c.send(TOPIC, b"plain")
        assert plain.code == ResponseCode.SUCCESS and "recallHandle" not in plain.ext_fields


async def test_a_timer_del_uniqkey_marker_recalls(broker: BrokerController) -> None:
    """RocketMQ 5's own form of a recall: a message of the same topic carrying
    ``TIMER_DEL_UNIQKEY = <topic>+<message id>`` and the recalled message's time."""
    async with connected(broker.address) as c:
        deliver = now_ms() + 2000
        sent = await c.send(TOPIC, b"cancelled", props={"TIMER_DELIVER_MS": str(deliver)})
        msg_id = base64.urlsafe_b64decode(handle_of(sent)).decode().split(" ")[4]
        await c.send(TOPIC, b"marker-kept", props={"TIMER_DELIVER_MS": str(deliver + 100)})
        marker = await c.send(
            TOPIC,
            b"0",
            props={"TIMER_DEL_UNIQKEY": f"{TOPIC}+{msg_id}", "TIMER_DELIVER_MS": str(deliver)},
        )
        assert marker.code == ResponseCode.SUCCESS, marker.remark
        bad = await c.send(
            TOPIC, b"0", props={"TIMER_DEL_UNIQKEY": "other+x", "TIMER_DELIVER_MS": str(deliver)}
        )
        assert bad.code == ResponseCode.MESSAGE_ILLEGAL
        await wait_until(lambda: pulled(broker.address, TOPIC), 10, "the kept one delivered")
        await wait_until(lambda: broker.timer.pending == 0, 10, "nothing pending")
        assert [m.body for m in await pulled(broker.address, TOPIC)] == [b"marker-kept"]


@pytest.mark.external
@pytest.mark.slow
async def test_a_recall_survives_sigkill_and_restarts(tmp_path) -> None:
    """Twelve timers, six recalled; the broker is SIGKILLed before the checkpoint can hold
    the recalls, started, SIGKILLed again after it did: the six others are delivered once,
    the recalled never."""
    with running(str(tmp_path / "store"), flush="ASYNC_FLUSH") as bp:
        deliver = now_ms() + 6000
        handles: dict[bytes, str] = {}
        async with connected(bp.address) as c:
            for i in range(12):
                body = f"t{i}".encode()
                handles[body] = handle_of(
                    await c.send(TOPIC, body, props={"TIMER_DELIVER_MS": str(deliver + i)})
                )
            recalled = {b for i, b in enumerate(handles) if i % 2}
            for body in recalled:
                r = await recall(c, handles[body])
                assert r.code == ResponseCode.SUCCESS, r.remark
        bp.kill()  # right after the recalls: the checkpoint (once a second) may not hold them
        bp.start()
        checkpoint = tmp_path / "store" / "config" / "timerCheckpoint.json"
        await wait_until(lambda: checkpoint.exists(), 10, "a checkpoint written")
        start = now_ms()
        await wait_until(past(start + 2500), 10, "two checkpoints later")
        bp.kill()
        bp.start()
        await wait_until(past(deliver + 700), 15, "past the delivery times")

        async def six() -> list[MessageExt]:
            got = await pulled(bp.address, TOPIC)
            return got if len(got) >= 6 else []

        got = await wait_until(six, 20, "the six not recalled delivered")
        bodies = sorted(m.body for m in got)
        assert bodies == sorted(set(handles) - recalled), bodies
        # recalled before: the answer is the same; their times passed: not pending
        async with connected(bp.address) as c:
            r = await recall(c, handles[b"t0"])
            assert r.code == ResponseCode.ILLEGAL_OPERATION, r.remark
