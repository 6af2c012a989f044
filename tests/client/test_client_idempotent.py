"""``Message.msg_id``: an application's own resend (the same id, after a restart of its
producer, say) is answered with the first send's result and stored once, by send, by
send_batch and by auto-batched sends alike."""

from __future__ import annotations

import asyncio

import pytest

from tests.client.helpers import FAST_CLIENT
from tests.support.raw import connected
from txmq.broker.server import BrokerController
from txmq.client import AsyncProducer, InvalidMessageError, Message


async def _bodies(broker: BrokerController, topic: str) -> list[bytes]:
    async with connected(broker.address) as c:
        return sorted(m.body for m in await c.pull_all(topic))


async def test_a_message_id_of_the_application_is_sent_once(broker: BrokerController) -> None:
    async with AsyncProducer("idem-1", broker=broker.address, config=FAST_CLIENT) as p:
        first = await p.send(Message("idem", b"a", msg_id="order-17-created"))
    # A new producer (the application restarted) sends the same message again.
    async with AsyncProducer("idem-2", broker=broker.address, config=FAST_CLIENT) as p:
        again = await p.send(Message("idem", b"a", msg_id="order-17-created"))
        batch = await p.send_batch(
            [
                Message("idem", b"b", msg_id="order-18"),
                Message("idem", b"a", msg_id="order-17-created"),
            ]
        )
        auto = await asyncio.gather(
            *(p.send(Message("idem", b"c", msg_id=f"order-{i}")) for i in (19, 19, 18))
        )
    assert (again.msg_id, again.offset_msg_id, again.queue_id, again.queue_offset) == (
        first.msg_id,
        first.offset_msg_id,
        first.queue_id,
        first.queue_offset,
    )
    assert first.msg_id == "order-17-created"
    assert batch.msg_ids == ["order-18", "order-17-created"]
    assert [r.msg_id for r in auto] == ["order-19", "order-19", "order-18"]
    assert await _bodies(broker, "idem") == [b"a", b"b", b"c"]


@pytest.mark.parametrize("bad", ["", "x" * 129, "a\x01b", "a\x02b"])
async def test_a_message_id_is_checked(broker: BrokerController, bad: str) -> None:
    async with AsyncProducer("idem-3", broker=broker.address, config=FAST_CLIENT) as p:
        with pytest.raises(InvalidMessageError, match="message id"):
            await p.send(Message("idem", b"a", msg_id=bad))
