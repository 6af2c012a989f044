"""A check-state index the fuzzer found unreadable (not a map, not UTF-8, a short row) no longer
stops the broker's start: it is ignored, and the transaction table is what the queues say."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.brokers import started, with_transactions
from txmq.broker.config import BrokerConfig

COMMIT = 8


@pytest.mark.parametrize(
    "content", [b"[1]", b"\xff\xfe", b'{"version": 1, "checks": {"t": [1]}}', b'{"checks": 5}']
)
async def test_an_unreadable_check_state_index_is_ignored(
    make_broker_config: Callable[..., BrokerConfig], content: bytes
) -> None:
    cfg = make_broker_config(transaction_check_interval=600_000)
    b = await with_transactions(cfg, "chk", [COMMIT])
    before = {t: r.state.value for t, r in b.transactions.records.items()}
    assert sorted(before.values()) == ["COMMITTED", "PENDING"]
    await b.shutdown()

    path = Path(cfg.store_path_root_dir) / "transaction" / "checkState.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    async with started(dataclasses.replace(cfg, listen_port=b.port)) as b:
        assert {t: r.state.value for t, r in b.transactions.records.items()} == before
