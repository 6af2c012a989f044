"""auto_batch: sends of one topic made together leave as SEND_BATCH_MESSAGE requests, and each
caller still gets the result of its own message."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tests.client.helpers import FAST_CLIENT, create_topic
from txmq.broker.server import BrokerController
from txmq.client import AsyncProducer, AsyncPullConsumer, Message, PullStatus, SendStatus
from txmq.protocol.codes import RequestCode
from txmq.protocol.errors import NoPermissionError


def requests(broker: BrokerController, code: int) -> float:
    value = broker.metrics.registry.get_sample_value("txmq_requests_total", {"code": str(code)})
    return value or 0.0


async def test_concurrent_sends_share_batches_and_get_their_own_results(
    broker: BrokerController, unique: Callable[[str], str]
) -> None:
    topic = unique("gathered")
    await create_topic(broker.address, topic, 4)
    config = FAST_CLIENT.replace(auto_batch=True, batch_max_bytes=16 * 1024)
    before_single = requests(broker, RequestCode.SEND_MESSAGE_V2)
    async with AsyncProducer("auto-batch", broker.address, config=config) as p:
        bodies = [f"m-{i}".encode() * 20 for i in range(300)]
        results = await asyncio.gather(*(p.send(Message(topic, b)) for b in bodies))
        # One message alone goes as a plain send.
        alone = await p.send(Message(topic, b"alone"))
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert len({r.msg_id for r in results}) == 300
    batches = requests(broker, RequestCode.SEND_BATCH_MESSAGE)
    assert 2 <= batches < 60, f"{batches} batch requests for 300 sends"
    assert requests(broker, RequestCode.SEND_MESSAGE_V2) - before_single <= 2
    # Each result names its own message: its queue, offset and ids.
    async with AsyncPullConsumer("auto-batch-check", broker.address, config=FAST_CLIENT) as c:
        for body, r in [*zip(bodies, results, strict=True), (b"alone", alone)]:
            pr = await c.pull(topic, r.queue_id, r.queue_offset, max_nums=1)
            assert pr.status is PullStatus.FOUND
            [m] = pr.messages
            assert (m.body, m.msg_id, m.offset_msg_id) == (body, r.msg_id, r.offset_msg_id)


async def test_a_refused_batch_fails_every_send_in_it(
    broker: BrokerController, unique: Callable[[str], str]
) -> None:
    topic = unique("readonly")
    await create_topic(broker.address, topic, 4, perm=4)  # read-only: sends are refused
    config = FAST_CLIENT.replace(auto_batch=True, retry_times_when_send_failed=0)
    async with AsyncProducer("auto-batch-refused", broker.address, config=config) as p:
        outcomes = await asyncio.gather(
            *(p.send(Message(topic, b"x")) for _ in range(20)), return_exceptions=True
        )
    assert all(isinstance(o, NoPermissionError) for o in outcomes), outcomes[:3]
