"""The consumer group generation: GET_CONSUMER_LIST_BY_GROUP answers it beside the member ids,
and every membership change (join, unregister, connection closed, heartbeat expiry) moves it
on; a restarted broker hands out numbers above the ones it gave before."""

from __future__ import annotations

import json
from collections.abc import Callable

from tests.support.brokers import started
from tests.support.raw import RawClient, connected
from tests.support.waiting import wait_until
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.errors import FencedError, TransactionFailedError, error_for_code

GROUP = "gen-group"


async def members(c: RawClient) -> tuple[list[str], int]:
    resp = await c.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": GROUP})
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    doc = json.loads(resp.body)
    return sorted(doc["consumerIdList"]), int(doc["generation"])


async def test_every_membership_change_moves_the_generation_on(broker: BrokerController) -> None:
    a = await RawClient.connect(broker.address)
    b = await RawClient.connect(broker.address)
    c = await RawClient.connect(broker.address)
    try:
        await a.heartbeat(consumer_groups={GROUP: {"t": "*"}})
        ids, g1 = await members(a)
        assert ids == [a.client_id]
        await a.heartbeat(consumer_groups={GROUP: {"t": "*"}})  # a heartbeat is no change
        assert await members(a) == (ids, g1)

        await b.heartbeat(consumer_groups={GROUP: {"t": "*"}})  # join
        ids, g2 = await members(a)
        assert ids == sorted([a.client_id, b.client_id]) and g2 > g1

        resp = await b.call(
            RequestCode.UNREGISTER_CLIENT, {"clientID": b.client_id, "consumerGroup": GROUP}
        )
        assert resp.code == ResponseCode.SUCCESS  # unregister
        ids, g3 = await members(a)
        assert ids == [a.client_id] and g3 > g2

        await c.heartbeat(consumer_groups={GROUP: {"t": "*"}})
        _, g4 = await members(a)
        assert g4 > g3
        await c.close()  # connection closed
        g5 = await wait_until(
            lambda: _moved_past(a, g4), what="the generation moved on after the close"
        )

        expired = broker.clients.expire(0.0)  # heartbeat expiry: every channel is silent
        assert a.client_id in {ch.client_id for ch in expired}
        g6 = broker.clients.generation(GROUP)
        assert g6 > g5
        async with connected(broker.address) as d:
            await d.heartbeat(consumer_groups={GROUP: {"t": "*"}})
            assert await members(d) == ([d.client_id], g6 + 1)
    finally:
        for x in (a, b, c):
            x.conn.close()


async def _moved_past(c: RawClient, gen: int) -> int:
    """The generation once it is past ``gen``, else 0."""
    _, g = await members(c)
    return g if g > gen else 0


async def test_a_restarted_broker_hands_out_higher_generations(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    config = make_broker_config()
    seen = []
    for _ in range(2):
        async with started(config) as controller:
            c = await RawClient.connect(controller.address)
            await c.heartbeat(consumer_groups={GROUP: {"t": "*"}})
            seen.append((await members(c))[1])
            await c.close()
    assert seen[1] > seen[0]


def test_a_fenced_answer_is_raised_as_fenced_error() -> None:
    err = error_for_code(ResponseCode.TRANSACTION_FAILED, "fenced: generation 7 is stale")
    assert isinstance(err, FencedError) and isinstance(err, TransactionFailedError)
    other = error_for_code(ResponseCode.TRANSACTION_FAILED, "something else")
    assert type(other) is TransactionFailedError
