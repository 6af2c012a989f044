"""Queue offsets are never handed out twice, whatever the disk did.

Under ASYNC_FLUSH a send is acknowledged once written, and consumers read it before it is
fsynced.  When the filesystem fails before the fsync (a loop-mounted ext4 image with
errors=remount-ro, made to fail), the unsynced tail of the commit log is gone after the repair,
but consumers may have committed offsets past it.  At start the broker raises each queue's next
offset to the highest offset any group committed (``MessageStore.raise_queue_floors``), the
offsets between filled as holes: new messages never take the offsets of lost ones, so a consumer
that had committed past them does not skip new messages.  Logged (``queue_offsets_gap``) and
counted (``txmq_queue_offsets_skipped_total``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.broker.test_read_only_disk import _fail_filesystem, _repair, ext4_disk  # noqa: F401
from tests.support.brokers import raw_broker
from tests.support.raw import RawClient
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode

pytestmark = pytest.mark.external

MiB = 1024 * 1024
TOPIC = "never-reused"
GROUP = "committed-past"


def _config(make: Callable[..., BrokerConfig], root: Path) -> BrokerConfig:
    return make(
        store_path_root_dir=str(root),
        flush_disk_type="ASYNC_FLUSH",
        # nothing fsyncs the commit log while the test runs: its tail is in the page cache
        # only when the filesystem fails
        flush_interval_commit_log=600_000,
        mapped_file_size_commit_log=4 * MiB,
        mapped_file_size_consume_queue=20 * 4096,
        max_message_size=64 * 1024,
        message_index_enable=False,
    )


async def _committed(c: RawClient, qid: int) -> int:
    r = await c.call(
        RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": qid}
    )
    assert r.code == ResponseCode.SUCCESS, r.remark
    return int(r.ext_fields["offset"])


async def test_a_lost_unsynced_tail_never_gives_its_offsets_to_new_messages(
    ext4_disk: tuple[Path, Path],  # noqa: F811
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    mnt, image = ext4_disk
    b = BrokerController(_config(make_broker_config, mnt / "store"))
    await b.start()
    c = await RawClient.connect(b.address)
    sent = 40
    try:
        # the topic and the group's offsets durable before anything else
        for i in range(sent):
            r = await c.send(TOPIC, b"m%d" % i, queue_id=i % 2)
            assert r.code == ResponseCode.SUCCESS, r.remark
        got = await c.pull_all(TOPIC, queues=2)
        assert len(got) == sent, "consumers read what is written, before any fsync"
        for qid in (0, 1):
            commit = await c.call(
                RequestCode.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": GROUP, "topic": TOPIC, "queueId": qid, "commitOffset": sent // 2},
            )
            assert commit.code == ResponseCode.SUCCESS, commit.remark
        await b.in_background(b.offsets.persist)  # the offset table is fsynced; the log is not
        _fail_filesystem(mnt)
    finally:
        await c.close()
        await b.shutdown()

    _repair(mnt, image)
    async with raw_broker(_config(make_broker_config, mnt / "store")) as (again, c):
        kept = len(await c.pull_all(TOPIC, queues=2))
        assert kept < sent, (
            f"the failed filesystem kept all {sent} unsynced messages: nothing to show"
        )
        assert [await _committed(c, q) for q in (0, 1)] == [sent // 2, sent // 2]
        skipped = again.metrics.snapshot()
        gaps = {
            k: v for k, v in skipped.items() if k.startswith("txmq_queue_offsets_skipped_total")
        }
        assert sum(gaps.values()) == sent - kept, gaps
        # new messages go on above every committed offset: the group gets them all
        for i in range(4):
            r = await c.send(TOPIC, b"new%d" % i, queue_id=i % 2)
            assert r.code == ResponseCode.SUCCESS, r.remark
            assert RawClient.send_header(r).queue_offset >= sent // 2, r.ext_fields
        fresh = []
        for qid in (0, 1):
            resp, msgs = await c.pull(TOPIC, qid, await _committed(c, qid), group=GROUP)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            fresh += [m.body for m in msgs]
        assert sorted(fresh) == [b"new0", b"new1", b"new2", b"new3"], fresh
