"""A broker on a small real filesystem (a tmpfs with a size limit) that fills up: by default no
unread message is deleted and writes are refused with a clear error past diskRefuseWritesRatio,
while reads, heartbeats of new groups and offset commits go on; writes are accepted again once
space is freed.  With diskFullPolicy=delete_oldest, retention deletes only as many segments as
it takes to get below diskMaxUsedSpaceRatio."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.broker.test_ops_port import get
from tests.support.brokers import raw_broker
from tests.support.ports import free_port
from tests.support.raw import RawClient
from txmq.broker.config import BrokerConfig
from txmq.protocol.codes import RequestCode, ResponseCode

MiB = 1024 * 1024
SEGMENT = 1 * MiB
BODY = b"x" * 4000


def _used(mnt: Path) -> float:
    u = shutil.disk_usage(mnt)
    return u.used * 100.0 / u.total


def _fill_to(mnt: Path, percent: float) -> Path:
    """A filler file that brings the disk to ``percent`` used."""
    filler = mnt / "filler"
    u = shutil.disk_usage(mnt)
    want = int(u.total * percent / 100) - u.used
    with open(filler, "ab") as f:
        f.write(b"\0" * max(0, want))
    return filler


async def _send(c: RawClient, topic: str, i: int) -> tuple[int, str | None]:
    r = await c.send(topic, BODY + str(i).encode())
    return r.code, r.remark


@pytest.fixture
def disk_config(
    small_disk: Path, make_broker_config: Callable[..., BrokerConfig]
) -> Callable[..., BrokerConfig]:
    def make(**kw: object) -> BrokerConfig:
        return make_broker_config(
            store_path_root_dir=str(small_disk / "store"),
            mapped_file_size_commit_log=SEGMENT,
            mapped_file_size_consume_queue=20 * 4096,
            disk_max_used_space_ratio=50,
            disk_refuse_writes_ratio=80,
            max_message_size=64 * 1024,
            **kw,
        )

    return make


async def test_a_full_disk_refuses_writes_keeps_every_message_and_recovers(
    small_disk: Path, disk_config: Callable[..., BrokerConfig]
) -> None:
    ops = free_port()
    async with raw_broker(disk_config(metrics_port=ops)) as (b, c):
        acked = 0
        for i in range(200):
            code, _ = await _send(c, "full", i)
            assert code == ResponseCode.SUCCESS
            acked += 1
        segments_before = sorted(os.listdir(small_disk / "store" / "commitlog"))
        filler = _fill_to(small_disk, 82)
        assert b.store.check_space() is not None
        code, remark = await _send(c, "full", 999)
        assert code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert remark is not None and "disk" in remark and "full" in remark, remark
        status, why = get(ops, "/readyz")  # the operations port says why
        assert status == 503 and "full" in why, (status, why)

        # Past diskMaxUsedSpaceRatio, the default policy deletes nothing unread.
        assert b.store.delete_expired_files() == 0
        assert sorted(os.listdir(small_disk / "store" / "commitlog")) == segments_before
        # Reads, a new group's heartbeat and offset commits go on.
        got = await c.pull_all("full")
        assert len(got) == acked
        await c.heartbeat(consumer_groups={"newcomer": {"full": "*"}})  # asserts SUCCESS
        commit = await c.call(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": "newcomer", "topic": "full", "queueId": 0, "commitOffset": 1},
        )
        assert commit.code == ResponseCode.SUCCESS, commit.remark
        snap = b.metrics.snapshot()
        assert "txmq_writes_refused" in snap

        # Space comes back: writes are accepted again, without a restart.
        filler.unlink()
        assert b.store.check_space() is None
        assert get(ops, "/readyz")[0] == 200
        code, remark = await _send(c, "full", 1000)
        assert code == ResponseCode.SUCCESS, remark
        assert len(await c.pull_all("full")) == acked + 1


async def test_delete_oldest_frees_only_what_is_needed(
    small_disk: Path, disk_config: Callable[..., BrokerConfig]
) -> None:
    async with raw_broker(disk_config(disk_full_policy="delete_oldest")) as (b, c):
        for i in range(1500):  # about 6 MiB: six segments
            code, _ = await _send(c, "oldest", i)
            assert code == ResponseCode.SUCCESS
        segments = sorted(os.listdir(small_disk / "store" / "commitlog"))
        assert len(segments) >= 5
        # Just under two segments' worth over the ratio: retention must delete two, not all
        # but the active one (which it did while deleted files stayed open and uncounted).
        _fill_to(small_disk, 50 + 2 * SEGMENT * 100 / shutil.disk_usage(small_disk).total - 1)
        deleted = b.store.delete_expired_files()
        assert deleted == 2, (deleted, len(segments))
        assert _used(small_disk) <= 50 + 1
        assert sorted(os.listdir(small_disk / "store" / "commitlog")) == segments[deleted:]


async def test_a_disk_with_no_byte_left_still_takes_heartbeats(
    small_disk: Path, disk_config: Callable[..., BrokerConfig]
) -> None:
    """Another process took the last byte: a new consumer group's heartbeat (which creates its
    retry topic) is answered, so are the heartbeats after it, and the topic table is written
    once there is room again."""
    async with raw_broker(disk_config()) as (b, c):
        code, _ = await _send(c, "nobyte", 0)
        assert code == ResponseCode.SUCCESS
        filler = small_disk / "filler"
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * MiB)
                    f.flush()
            except OSError:
                pass  # ENOSPC: the disk is full to the last block
        await c.heartbeat(consumer_groups={"late-group": {"nobyte": "*"}})  # asserts SUCCESS
        await c.heartbeat(consumer_groups={"late-group": {"nobyte": "*"}}, producer_groups=["p"])
        assert b.topics.table.dirty, "the table cannot have been written"
        code, remark = await _send(c, "nobyte", 1)
        assert code != ResponseCode.SUCCESS and remark, "a write was acknowledged on a full disk"
        assert len(await c.pull_all("nobyte")) == 1
        filler.unlink()
        await b.persist_topics()
        assert not b.topics.table.dirty
        assert (
            "%RETRY%late-group"
            in (Path(b.config.store_path_root_dir) / "config" / "topics.json").read_text()
        )
