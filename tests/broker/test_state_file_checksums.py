"""Every state file the broker writes and reads back carries a checksum: one byte flipped where
it still decodes (a digit of a number, an offset inside the transaction snapshot) is found at
the next start, the file is set aside under a name the broker does not read, a log line names
it, and what it held is rebuilt (from the commit log, the queues or the backup) -- never taken
silently.  Files written before checksums still load, and are written with one next time."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable, MutableMapping
from pathlib import Path
from typing import Any

import msgpack
import pytest
from structlog.testing import capture_logs

from tests.support.brokers import raw_broker, restart_on, started, with_transactions
from tests.support.logs import fresh_loggers
from tests.support.raw import connected
from txmq.broker import runtime_config
from txmq.broker.cluster.replication import EpochHistory
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.broker.store.fileio import CHECKSUM_FIELD
from txmq.broker.transaction import snapshot
from txmq.broker.transaction.persistence import CheckStateError, parse_check_state

COMMIT, ROLLBACK = 8, 12
CRC = CHECKSUM_FIELD.encode()


@pytest.fixture(autouse=True)
def _fresh_loggers(monkeypatch: pytest.MonkeyPatch) -> None:
    fresh_loggers(monkeypatch)


def _flip(path: Path, at: int, mask: int) -> bytes:
    """Flip bits ``mask`` of the byte at ``at`` of the file; its new content."""
    data = bytearray(path.read_bytes())
    data[at] ^= mask
    path.write_bytes(bytes(data))
    return bytes(data)


def _flip_digit(path: Path, key: str, mask: int = 0x01, after: bytes = b"") -> bytes:
    """Flip a bit of the last digit of the number after ``"key":`` (the first one after
    ``after``) in a JSON file: still a number, another one."""
    data = path.read_bytes()
    at = data.index(f'"{key}":'.encode(), data.index(after)) + len(key) + 3
    while data[at : at + 1] in (b" ", b"\n"):
        at += 1
    end = at
    while data[end : end + 1].isdigit():
        end += 1
    assert end > at, f"no number after {key} in {path}"
    new = _flip(path, end - 1, mask)
    json.loads(new)  # still valid JSON: only the checksum tells
    return new


def _aside(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + ".damaged*"))


def _events(logs: list[MutableMapping[str, Any]], event: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == event]


def _tx_table(b: BrokerController) -> dict[str, tuple[str, list[int]]]:
    return {
        t: (r.state.value, [h.commit_log_offset for h in r.halves])
        for t, r in b.transactions.records.items()
    }


@contextlib.asynccontextmanager
async def _restarted(
    cfg: BrokerConfig, port: int
) -> AsyncIterator[tuple[BrokerController, list[MutableMapping[str, Any]]]]:
    """A broker started on ``cfg`` at ``port`` (the stopped one's), with the log lines of its
    start; shut down when the block ends."""
    with capture_logs() as logs:
        b = await restart_on(cfg, port)
    try:
        yield b, logs
    finally:
        await b.shutdown()


async def _transactions(cfg: BrokerConfig) -> tuple[BrokerController, dict[str, Any]]:
    # the padding: so the halves' offsets take two bytes or more
    b = await with_transactions(cfg, "snap", [COMMIT, ROLLBACK], padding=b"p" * 300)
    return b, _tx_table(b)


# -- the transaction snapshot ------------------------------------------------------------------


async def test_a_snapshot_with_a_changed_half_offset_is_set_aside_and_rebuilt(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    cfg = make_broker_config(transaction_check_interval=600_000)
    b, before = await _transactions(cfg)
    await b.shutdown()  # writes the snapshot
    path = Path(cfg.store_path_root_dir) / "transaction" / "snapshot.msgpack"
    data = path.read_bytes()
    assert data.startswith(snapshot.CHECKSUM_MAGIC)

    # the committed half's commit-log offset, in the record's row
    committed = next(t for t, (state, _) in before.items() if state == "COMMITTED")
    offset = before[committed][1][0]
    row_at = data.index(msgpack.packb(committed))
    packed = msgpack.packb(offset)
    # its halves: an array of one array of 8 fields, the offset first
    at = data.index(b"\x91\x98" + packed, row_at) + 2 + len(packed) - 1
    damaged = _flip(path, at, 0x02)
    # Without the checksum this decodes, and names another offset for the committed half.
    changed = snapshot.decode(damaged[snapshot.PREFIX_SIZE :])
    rows = {r[0]: r for r in changed.records}
    assert rows[committed][10][0][0] == offset ^ 0x02

    async with _restarted(cfg, b.port) as (b, logs):
        assert _tx_table(b) == before
        assert b.recovery["transactions"]["snapshot"] == 0  # rebuilt from the queues
        assert not path.exists()
        assert path.with_name("snapshot.msgpack.damaged").read_bytes() == damaged
        (line,) = _events(logs, "transaction_snapshot_damaged")
        assert line["path"] == str(path) and "checksum mismatch" in line["error"]
        assert line["log_level"] == "warning"


async def test_a_snapshot_written_before_checksums_still_loads(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    cfg = make_broker_config(transaction_check_interval=600_000)
    b, before = await _transactions(cfg)
    await b.shutdown()
    path = Path(cfg.store_path_root_dir) / "transaction" / "snapshot.msgpack"
    path.write_bytes(path.read_bytes()[snapshot.PREFIX_SIZE :])  # the map alone
    async with _restarted(cfg, b.port) as (b, _):
        assert b.recovery["transactions"]["snapshot"] == 1
        assert _tx_table(b) == before
    assert path.read_bytes().startswith(snapshot.CHECKSUM_MAGIC)  # written with one


# -- the JSON tables (RocketMQ's files) ----------------------------------------------------------


async def test_consumer_offsets_with_a_changed_offset_are_read_from_the_backup(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    cfg = make_broker_config()
    async with started(cfg) as b:
        b.ctx.offsets.commit("billing", "orders", 0, 5)
        assert await b.in_background(b.ctx.offsets.persist)
        b.ctx.offsets.commit("billing", "orders", 0, 7)
        assert await b.in_background(b.ctx.offsets.persist)  # the first one is the backup
    path = Path(cfg.store_path_root_dir) / "config" / "consumerOffset.json"
    doc = json.loads(path.read_bytes())
    # RocketMQ's shape, the checksum one more top-level field
    assert set(doc) == {"offsetTable", "dataVersion", CHECKSUM_FIELD}
    assert doc["offsetTable"] == {"orders@billing": {"0": 7}}
    damaged = _flip_digit(path, "0")  # 7 -> 6
    assert json.loads(damaged)["offsetTable"] == {"orders@billing": {"0": 6}}

    async with _restarted(cfg, b.port) as (b, logs):
        assert b.ctx.offsets.query("billing", "orders", 0) == 5  # the backup's
        (aside,) = _aside(path)
        assert aside.read_bytes() == damaged
        (line,) = _events(logs, "table_read_from_backup")
        assert line["file"] == str(path) and line["set_aside"] == str(aside)
        assert "checksum mismatch" in line["error"]


async def test_a_topic_table_with_a_changed_queue_count_is_read_from_the_backup(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    cfg = make_broker_config()
    async with raw_broker(cfg) as (b, c):
        assert (await c.send("first", b"x")).code == 0
        await b.persist_topics()
        assert (await c.send("second", b"y")).code == 0
        await b.persist_topics()
    path = Path(cfg.store_path_root_dir) / "config" / "topics.json"
    doc = json.loads(path.read_bytes())
    assert doc["topicConfigTable"]["second"]["readQueueNums"] == 4
    _flip_digit(path, "readQueueNums", 0x02, after=b'"second"')  # 4 -> 6
    async with _restarted(cfg, b.port) as (b, logs):
        assert _aside(path)
        assert {e["event"] for e in logs} & {"table_read_from_backup", "table_lost"}
        line = next(e for e in logs if e["event"] in ("table_read_from_backup", "table_lost"))
        assert line["file"] == str(path)
        first, second = b.topics.get("first"), b.topics.get("second")
        assert first is not None and first.read_queue_nums == 4  # the backup's
        assert second is not None and second.read_queue_nums != 6  # never the damaged value


async def test_tables_written_before_checksums_load_and_are_written_with_one(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    cfg = make_broker_config()
    config = Path(cfg.store_path_root_dir) / "config"
    config.mkdir(parents=True)
    old = {"offsetTable": {"orders@billing": {"0": 42}}, "dataVersion": {"counter": 3}}
    (config / "consumerOffset.json").write_text(json.dumps(old, indent=2))
    async with started(cfg) as b:
        assert b.ctx.offsets.query("billing", "orders", 0) == 42
        assert not _aside(config / "consumerOffset.json")
    doc = json.loads((config / "consumerOffset.json").read_bytes())
    assert CHECKSUM_FIELD in doc and doc["offsetTable"] == old["offsetTable"]


# -- checkpoints -----------------------------------------------------------------------------


async def test_a_store_checkpoint_with_a_changed_offset_is_set_aside(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    cfg = make_broker_config()
    async with raw_broker(cfg) as (b, c):
        for i in range(5):
            assert (await c.send("orders", f"m{i}".encode())).code == 0
    path = Path(cfg.store_path_root_dir) / "checkpoint"
    assert CRC in path.read_bytes()
    _flip_digit(path, "logicOffset")
    async with _restarted(cfg, b.port) as (b, logs):
        (line,) = _events(logs, "checkpoint_damaged")
        assert line["file"] == str(path) and "checksum mismatch" in line["error"]
        assert b.recovery["store"].checkpoint_offset == -1  # rebuilt from the whole log
        assert _aside(path)
        r = b.store.get_messages("orders", 0, 0, 32)
        assert len(r.messages) == 5


async def test_a_timer_checkpoint_with_a_changed_time_is_set_aside_and_the_timer_kept(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    cfg = make_broker_config()
    b = BrokerController(cfg)
    await b.start()
    async with connected(b.address) as c:
        due = int(time.time() * 1000) + 3_600_000
        sent = await c.send("later", b"t", props={"TIMER_DELIVER_MS": str(due)})
        assert sent.code == 0, sent.remark
    assert b.timer.pending == 1
    await b.shutdown()  # writes the timer checkpoint
    path = Path(cfg.store_path_root_dir) / "config" / "timerCheckpoint.json"
    doc = json.loads(path.read_bytes())
    assert CHECKSUM_FIELD in doc and str(doc["firedMs"]).startswith("1")
    # firedMs "1..." -> "9...": every timer read would count as fired, the pending one lost
    data = path.read_bytes()
    _flip(path, data.index(b'"firedMs": ') + len(b'"firedMs": '), 0x08)
    assert json.loads(path.read_bytes())["firedMs"] > due
    async with _restarted(cfg, b.port) as (b, logs):
        (line,) = _events(logs, "timer_checkpoint_damaged")
        assert line["file"] == str(path) and "checksum mismatch" in line["error"]
        assert _aside(path)
        assert b.recovery["timers"]["pending"] == 1
        assert b.timer.pending == 1


# -- the other files -----------------------------------------------------------------------------


async def test_runtime_settings_with_a_changed_value_are_set_aside(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    cfg = make_broker_config()
    runtime_config.save(dataclasses.replace(cfg, max_reconsume_times=3), {"maxReconsumeTimes": 3})
    path = Path(runtime_config.runtime_file(cfg))
    _flip_digit(path, "maxReconsumeTimes")  # 3 -> 2
    async with _restarted(cfg, cfg.listen_port) as (b, logs):
        (line,) = _events(logs, "runtime_settings_set_aside")
        assert line["file"] == str(path) and "checksum mismatch" in line["error"]
        assert line["log_level"] == "error"
        assert b.config.max_reconsume_times == cfg.max_reconsume_times  # the configured one
        assert _aside(path)


def test_a_check_state_index_with_a_changed_count_is_refused() -> None:
    from txmq.broker.store.fileio import dumps_with_checksum

    good = dumps_with_checksum({"version": 1, "checks": {"tx-1": [3, 1_700_000_000_000]}})
    assert parse_check_state(good) == [("tx-1", 3, 1_700_000_000_000)]
    at = good.index(b"[3,") + 1
    bad = good[:at] + b"2" + good[at + 1 :]
    with pytest.raises(CheckStateError, match="checksum mismatch"):
        parse_check_state(bad)
    old = json.dumps({"version": 1, "checks": {"tx-1": [3, 5]}}).encode()
    assert parse_check_state(old) == [("tx-1", 3, 5)]  # written before checksums


def test_a_damaged_epoch_history_is_set_aside_and_taken_as_unknown(tmp_path: Path) -> None:
    h = EpochHistory(str(tmp_path))
    h.begin(3, 0)
    h.begin(4, 12345)
    again = EpochHistory(str(tmp_path))
    again.load()
    assert again.entries == [(3, 0), (4, 12345)] and not again.lost
    path = Path(h.path)
    _flip(path, path.read_bytes().index(b"[[3") + 2, 0x04)  # the first epoch: 3 -> 7
    with capture_logs() as logs:
        again.load()
    assert again.lost and again.known() == [(-1, 0)]
    (line,) = _events(logs, "epoch_history_damaged")
    assert line["file"] == str(path) and line["log_level"] == "error"
    assert not path.exists() and _aside(path)
    again.adopt([(5, 0)], 100)  # the leader's history, once fetched, is written again
    assert not again.lost and again.known() == [(5, 0)]
    # written before checksums: a bare list
    path.write_text("[[1, 0], [2, 77]]")
    old = EpochHistory(str(tmp_path))
    old.load()
    assert old.entries == [(1, 0), (2, 77)] and not old.lost
