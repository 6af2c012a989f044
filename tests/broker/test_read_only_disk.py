"""A store whose filesystem goes read-only under a running broker: a loop-mounted ext4 image
(errors=remount-ro) made to fail, so the kernel remounts it read-only as it does on a real disk
error.  Writes are refused with SERVICE_NOT_AVAILABLE naming the cause; reads, heartbeats,
consumer registration and offset commits are still served; /readyz and
``txmq_writes_refused_reason{reason="read_only"}`` say why.  After the operator's repair (fsck,
mounted read-write again) every acknowledged message is there.

Linux keeps a filesystem with files open for writing from being remounted read-only by hand
(EBUSY), and ext4 stays read-only after its emergency remount until it is unmounted; so the
broker noticing the filesystem writable again without a restart is shown with the statvfs seam
reporting the read-only flag, then not."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker.test_ops_port import get
from tests.support.brokers import raw_broker
from tests.support.ports import free_port
from tests.support.raw import RawClient
from tests.support.waiting import wait_until
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode

pytestmark = pytest.mark.external

MiB = 1024 * 1024


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60)


@pytest.fixture
def ext4_disk(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """``(mount point, image)``: a 48 MiB ext4 image loop-mounted with errors=remount-ro."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the read-only disk tests loop-mount an ext4 image and need root")
        pytest.skip("loop-mounting an image needs root")
    image = tmp_path / "disk.img"
    with open(image, "wb") as f:
        f.truncate(48 * MiB)
    _run("mkfs.ext4", "-q", "-F", str(image))
    mnt = tmp_path / "disk"
    mnt.mkdir()
    _run("mount", "-o", "loop,errors=remount-ro", str(image), str(mnt))
    try:
        yield mnt, image
    finally:
        subprocess.run(["umount", str(mnt)], check=False, timeout=60)


def _repair(mnt: Path, image: Path) -> None:
    """The operator's repair of a filesystem that failed: unmount, fsck, mount again."""
    _run("umount", str(mnt))
    subprocess.run(["e2fsck", "-fy", str(image)], capture_output=True, timeout=120)
    _run("mount", "-o", "loop,errors=remount-ro", str(image), str(mnt))


def _fail_filesystem(mnt: Path) -> None:
    """Make ext4 take an error: with errors=remount-ro the kernel remounts it read-only."""
    dev = _run("findmnt", "-no", "SOURCE", str(mnt)).stdout.strip()
    trigger = Path(f"/sys/fs/ext4/{os.path.basename(dev)}/trigger_fs_error")
    if not trigger.exists():
        pytest.skip("this kernel's ext4 has no trigger_fs_error")
    trigger.write_text("test\n")


def _config(make: Callable[..., BrokerConfig], root: Path, **kw: Any) -> BrokerConfig:
    return make(
        store_path_root_dir=str(root),
        flush_disk_type="SYNC_FLUSH",  # an acknowledged send is on the disk
        mapped_file_size_commit_log=4 * MiB,
        mapped_file_size_consume_queue=20 * 4096,
        max_message_size=64 * 1024,
        message_index_enable=False,
        **kw,
    )


def _reason(b: BrokerController, reason: str) -> float:
    snap = b.metrics.snapshot()
    return float(snap.get(f"txmq_writes_refused_reason{{reason={reason}}}", -1))


async def test_a_filesystem_gone_read_only_refuses_writes_serves_reads_and_loses_nothing(
    ext4_disk: tuple[Path, Path], make_broker_config: Callable[..., BrokerConfig]
) -> None:
    mnt, image = ext4_disk
    ops = free_port()
    b = BrokerController(_config(make_broker_config, mnt / "store", metrics_port=ops))
    await b.start()
    c = await RawClient.connect(b.address)
    acked = 0
    try:
        await c.heartbeat(consumer_groups={"before": {"ro": "*"}})
        for i in range(60):
            r = await c.send("ro", b"m%d" % i, queue_id=i % 4)
            assert r.code == ResponseCode.SUCCESS, r.remark
            acked += 1
        assert get(ops, "/readyz")[0] == 200

        _fail_filesystem(mnt)
        r = await c.send("ro", b"refused")
        assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE, (r.code, r.remark)
        assert r.remark is not None and "read-only" in r.remark, r.remark
        status, why = get(ops, "/readyz")
        assert status == 503 and "read-only" in why, (status, why)
        await wait_until(lambda: _reason(b, "read_only") == 1, 10, "the read_only metric")
        assert _reason(b, "disk_full") == 0
        # Still refused a while later (the probe keeps failing), with the same answer.
        r = await c.send("ro", b"refused again")
        assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE and "read-only" in (r.remark or "")

        # Reads, heartbeats, a new consumer's registration and offset commits are served.
        assert len(await c.pull_all("ro")) == acked
        await c.heartbeat(consumer_groups={"newcomer": {"ro": "*"}})
        commit = await c.call(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": "newcomer", "topic": "ro", "queueId": 0, "commitOffset": 1},
        )
        assert commit.code == ResponseCode.SUCCESS, commit.remark
        members = await c.call(
            RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "newcomer"}
        )
        assert members.code == ResponseCode.SUCCESS and c.client_id.encode() in members.body
    finally:
        await c.close()
        await b.shutdown()

    # The operator's repair: unmount, fsck, mount read-write; every acknowledged message is
    # there.
    _repair(mnt, image)
    async with raw_broker(_config(make_broker_config, mnt / "store")) as (again, c):
        got = await c.pull_all("ro")
        assert sorted(m.body for m in got) == sorted(b"m%d" % i for i in range(acked))
        assert (await c.send("ro", b"after")).code == ResponseCode.SUCCESS


class _Flags:
    """statvfs with the read-only flag added while ``read_only``."""

    def __init__(self) -> None:
        self.read_only = False

    def __call__(self, path: str) -> Any:
        st = os.statvfs(path)
        if not self.read_only:
            return st
        return os.statvfs_result(
            (*st[:8], st.f_flag | os.ST_RDONLY, st.f_namemax), {"f_fsid": st.f_fsid}
        )


async def test_writes_come_back_without_a_restart_once_the_filesystem_is_writable(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    ops = free_port()
    b = BrokerController(make_broker_config(metrics_port=ops))
    await b.start()
    flags = _Flags()
    b.store.statvfs = flags
    c = await RawClient.connect(b.address)
    try:
        assert (await c.send("back", b"1")).code == ResponseCode.SUCCESS
        flags.read_only = True
        await wait_until(lambda: b.store.writes_refused_cause == "read_only", 10)
        r = await c.send("back", b"2")
        assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE and "read-only" in (r.remark or "")
        assert get(ops, "/readyz")[0] == 503
        flags.read_only = False
        await wait_until(lambda: b.store.writes_refused is None, 10, "writes accepted again")
        await wait_until(lambda: _reason(b, "read_only") == 0, 10)
        assert get(ops, "/readyz")[0] == 200
        assert (await c.send("back", b"3")).code == ResponseCode.SUCCESS
        assert [m.body for m in await c.pull_all("back")] == [b"1", b"3"]
    finally:
        await c.close()
        await b.shutdown()
