"""A check-state index the fuzzer found unreadable (not a map, not UTF-8, a short row) no longer
stops the broker's start: it is ignored, and the transaction table is what the queues say."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.brokers import started
from tests.support.raw import RawClient
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController

COMMIT = 8


@pytest.mark.parametrize(
    "content", [b"[1]", b"\xff\xfe", b'{"version": 1, "checks": {"t": [1]}}', b'{"checks": 5}']
)
async def test_an_unreadable_check_state_index_is_ignored(
    make_broker_config: Callable[..., BrokerConfig], content: bytes
) -> None:
    cfg = make_broker_config(transaction_check_interval=600_000)
    b = BrokerController(cfg)
    await b.start()
    c = await RawClient.connect(b.address)
    try:
        sent = [
            await c.send("chk", f"h{i}".encode(), group="g", transactional=True) for i in range(2)
        ]
        assert (await c.end_transaction("g", sent[0], COMMIT)).code == 0
    finally:
        await c.close()
    before = {t: r.state.value for t, r in b.transactions.records.items()}
    assert sorted(before.values()) == ["COMMITTED", "PENDING"]
    await b.shutdown()

    path = Path(cfg.store_path_root_dir) / "transaction" / "checkState.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    async with started(dataclasses.replace(cfg, listen_port=b.port)) as b:
        assert {t: r.state.value for t, r in b.transactions.records.items()} == before
