"""ali-ons 3.12 (npm; a pure JavaScript remoting client with JSON headers) against a real
broker: send, push consume with the broker notifying rebalances, and interop with the SDK.

ali-ons, against RocketMQ too, cannot auto-create a topic (it stops on the route answer
TOPIC_NOT_EXIST instead of asking for TBW102's route), so the topics are created first."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.compat.stock import ali_ons_client
from tests.conftest import BrokerThread
from txmq.client import Message, Producer, PullConsumer, PullStatus
from txmq.client.admin import AsyncAdminClient

pytestmark = pytest.mark.slow


def test_send_and_push_both_ways_with_the_sdk(
    broker_thread_factory: Callable[..., BrokerThread],
) -> None:
    bt = broker_thread_factory()
    ons = ali_ons_client()
    addr, topic = bt.address, "ons-orders"
    bt.call(_create_topic(addr, topic))
    sent = ons.run("send", addr, topic, 3, "TagA", "ons").check()
    assert [d["status"] for d in sent.docs] == ["SEND_OK"] * 3
    # ali-ons -> SDK: bodies, tags and ids as ali-ons reported them.
    ids = {d["msg_id"] for d in sent.docs}
    seen = []
    with PullConsumer("sdk-reader", broker=addr) as c:
        for q in range(4):
            r = c.pull(topic, q, 0)
            if r.status is PullStatus.FOUND:
                seen.extend(r.messages)
    assert sorted(m.body for m in seen) == [b"ons-0", b"ons-1", b"ons-2"]
    assert {m.tags for m in seen} == {"TagA"}
    assert {m.offset_msg_id for m in seen} == ids  # ali-ons reports the offset message id
    # SDK -> ali-ons push consumer (a new group starts at the first offset).
    with Producer("sdk-producer", broker=addr) as p:
        for i in range(2):
            p.send(Message(topic, f"sdk-{i}".encode(), tags="TagB"))
    got = ons.run("push", addr, topic, "ons-group", 5, 60).check()
    bodies = sorted(d["body"] for d in got.events("received"))
    assert bodies == ["ons-0", "ons-1", "ons-2", "sdk-0", "sdk-1"]


async def _create_topic(addr: str, topic: str) -> None:
    async with AsyncAdminClient(addr) as admin:
        await admin.create_topic(topic, queues=4)
