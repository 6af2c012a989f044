"""Bounded memory: a decided transaction is remembered for its idempotency window
(``transactionDecidedRetention``) and then forgotten, on the broker's clock, live and after a
restart."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tests.support.brokers import started
from tests.support.raw import RawClient
from txmq.broker.config import BrokerConfig
from txmq.protocol.codes import ResponseCode

COMMIT = 8


class Clock:
    """The broker's clock seam: wall time plus an offset the test moves forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


async def test_a_decision_is_remembered_for_its_window_then_forgotten(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    clock = Clock()
    cfg = make_broker_config(
        transaction_decided_retention=60_000, transaction_check_interval=60_000
    )
    async with started(cfg, clock=clock) as b:
        c = await RawClient.connect(b.address)
        half = await c.send("orders", b"x", group="g", transactional=True)
        assert (await c.end_transaction("g", half, COMMIT)).code == ResponseCode.SUCCESS
        txid = c.send_header(half).transaction_id
        # Within the window a repeat is answered as the first decision was.
        clock.offset = 30
        b.transactions.prune()
        again = await c.end_transaction("g", half, COMMIT)
        assert again.code == ResponseCode.SUCCESS and "was already" in (again.remark or "")
        # After it the record is gone from memory (and the metric says so).
        clock.offset = 61
        assert b.transactions.prune() == 1
        assert txid not in b.transactions.records
        late = await c.end_transaction("g", half, COMMIT)
        assert late.code == ResponseCode.SYSTEM_ERROR
        assert "Find prepared transaction message failed" in (late.remark or "")
        assert b.metrics.tx_pruned._value.get() == 1
        # The broker still counts it as committed (the console's overview, txmq status).
        assert b.transactions.summary()["committed"] == 1
        # The message was delivered once, and stays so.
        assert [m.body for m in await c.pull_all("orders")] == [b"x"]
        await c.close()
    # A restart starts from the shutdown's snapshot, which no longer holds it.
    async with started(cfg, clock=clock) as b:
        tx = b.recovery["transactions"]
        assert (tx["snapshot"], tx["halves"], tx["ops"]) == (1, 0, 0)
        assert not b.transactions.records
        assert b.transactions.summary()["committed"] == 1, "the snapshot carries the count"
    # Without the snapshot the op record is replayed, and forgotten again at once.
    (Path(cfg.store_path_root_dir) / "transaction" / "snapshot.msgpack").unlink()
    async with started(cfg, clock=clock) as b:
        tx = b.recovery["transactions"]
        assert (tx["snapshot"], tx["halves"], tx["pruned"]) == (0, 1, 1)
        assert not b.transactions.records
