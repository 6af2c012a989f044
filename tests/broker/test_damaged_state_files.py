"""Damaged state files beside the commit log never stop the broker: a transaction snapshot with
a flipped bit (or cut short) is set aside under a name the broker does not read, with a log line
naming it, and the table is rebuilt from the half and op queues -- the same table as before."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.brokers import started, with_transactions
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController

COMMIT, ROLLBACK = 8, 12


def _table(b: BrokerController) -> dict[str, tuple[str, int]]:
    return {t: (r.state.value, len(r.halves)) for t, r in b.transactions.records.items()}


@pytest.mark.parametrize("damage", ["state name", "cut short", "garbage"])
async def test_a_damaged_snapshot_is_set_aside_and_the_table_rebuilt(
    make_broker_config: Callable[..., BrokerConfig], damage: str
) -> None:
    cfg = make_broker_config(transaction_check_interval=600_000)
    b = await with_transactions(cfg, "snap", [COMMIT, ROLLBACK])
    before = _table(b)
    assert sorted(s for s, _ in before.values()) == ["COMMITTED", "PENDING", "ROLLED_BACK"]
    await b.shutdown()  # writes the snapshot

    path = Path(cfg.store_path_root_dir) / "transaction" / "snapshot.msgpack"
    data = bytearray(path.read_bytes())
    if damage == "state name":
        at = data.find(b"COMMITTED")
        assert at > 0
        data[at + 4] ^= 0x01  # "COMMITTED" -> "COMMJTTED": valid msgpack, no such state
    elif damage == "cut short":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 3 : len(data) // 3 + 8] = b"\xc1" * 8  # never-used msgpack byte
    path.write_bytes(bytes(data))

    async with started(dataclasses.replace(cfg, listen_port=b.port)) as b:
        assert _table(b) == before
        assert b.recovery["transactions"]["snapshot"] == 0  # rebuilt from the queues
        assert not path.exists()
        assert path.with_name("snapshot.msgpack.damaged").read_bytes() == bytes(data)
    # The next start reads the fresh snapshot written at shutdown.
    async with started(dataclasses.replace(cfg, listen_port=b.port)) as b:
        assert _table(b) == before
        assert b.recovery["transactions"]["snapshot"] == 1
