"""A commit builds its message from the in-memory copy of a recent half or, without one, from
the half read back from the store: the delivered record is the same either way."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.raw import RawClient, connected
from txmq.broker.server import BrokerController
from txmq.protocol.codes import ResponseCode
from txmq.protocol.message import MessageExt

COMMIT = 8
G = "tx-group"

#: What the store sets per record; everything else must match between the two paths.
_STORE_FIELDS = ("queue_offset", "commit_log_offset", "store_timestamp", "store_size")


@pytest.fixture
async def broker(make_broker_config: Any) -> Any:
    c = BrokerController(make_broker_config(transaction_check_interval=60_000))
    await c.start()
    yield c
    await c.shutdown()


def _comparable(m: MessageExt) -> dict[str, Any]:
    return {k: v for k, v in m.to_dict().items() if k not in _STORE_FIELDS}


async def _commit_one(c: RawClient, body: bytes, forget: BrokerController | None) -> None:
    half = await c.send(
        "orders",
        body,
        group=G,
        transactional=True,
        queue_id=1,
        props={"TAGS": "t", "KEYS": "k1", "region": "eu", "empty": ""},
    )
    if forget is not None:  # as after a restart or an eviction: only the store has the half
        forget.transactions._recent_halves.clear()
        forget.transactions._recent_bytes = 0
    resp = await c.end_transaction(G, half, COMMIT)
    assert resp.code == ResponseCode.SUCCESS, resp.remark


async def test_commit_from_memory_equals_commit_from_the_store(broker: BrokerController) -> None:
    async with connected(broker.address) as c:
        await _commit_one(c, b"same", None)
        assert not broker.transactions._recent_halves  # the commit used (and dropped) it
        await _commit_one(c, b"same", broker)
        first, second = await c.pull_all("orders")
    a, b = _comparable(first), _comparable(second)
    # each transaction has its own ids and half
    for k in ("properties", "prepared_transaction_offset", "born_timestamp"):
        a.pop(k), b.pop(k)
    assert a == b
    ka = {k: v for k, v in first.properties.items() if k != "UNIQ_KEY"}
    kb = {k: v for k, v in second.properties.items() if k != "UNIQ_KEY"}
    assert ka == kb
    assert list(first.properties) == list(second.properties)  # same order on the wire


async def test_recent_halves_stay_bounded(
    broker: BrokerController, monkeypatch: pytest.MonkeyPatch
) -> None:
    from txmq.broker.transaction import service

    monkeypatch.setattr(service, "RECENT_HALVES_MAX", 3)
    async with connected(broker.address) as c:
        for i in range(5):
            await c.send("orders", f"h{i}".encode(), group=G, transactional=True)
    tx = broker.transactions
    assert len(tx._recent_halves) == 3
    assert tx._recent_bytes == sum(len(m.body) for m in tx._recent_halves.values())
