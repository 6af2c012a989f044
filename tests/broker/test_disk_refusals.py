"""Every write the disk refuses gets the same answer: a retriable SERVICE_NOT_AVAILABLE naming
the cause, whichever store file it was (the commit log, the topic table, subscription groups),
never SYSTEM_ERROR with an errno's text.

* No byte left before the sampled usage says so: a tmpfs filled by a writer faster than the
  once-a-second disk check (``diskRefuseWritesRatio`` 100, so the sampler never refuses): the
  append that meets ENOSPC turns writes off, and they stay off until space is freed.
* A filesystem gone read-only (a loop-mounted ext4 image with errors=remount-ro, made to fail):
  a new group's heartbeat dirties the topic table (its retry topic), and the sends that follow
  must write it first; creating a topic or a subscription group writes their tables.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.broker.test_read_only_disk import _fail_filesystem, ext4_disk  # noqa: F401
from tests.support.brokers import raw_broker
from tests.support.raw import RawClient
from tests.support.waiting import wait_until
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.headers import CreateTopicRequestHeader

MiB = 1024 * 1024
BODY = b"y" * 60_000


def _refused(code: int, remark: str | None, *words: str) -> bool:
    return code == ResponseCode.SERVICE_NOT_AVAILABLE and all(w in (remark or "") for w in words)


async def test_no_byte_left_is_refused_clearly_before_the_sampler_sees_it(
    small_disk: Path, make_broker_config: Callable[..., BrokerConfig]
) -> None:
    b = BrokerController(
        make_broker_config(
            store_path_root_dir=str(small_disk / "store"),
            mapped_file_size_commit_log=1 * MiB,
            mapped_file_size_consume_queue=20 * 4096,
            disk_max_used_space_ratio=100,
            disk_refuse_writes_ratio=100,
            max_message_size=64 * 1024,
        )
    )
    await b.start()
    c = await RawClient.connect(b.address)
    filler = small_disk / "filler"  # what the operator frees at the end
    with open(filler, "wb") as f:
        f.write(b"\0" * (3 * MiB))
    try:
        acked = 0
        answers: list[tuple[int, str | None]] = []
        for i in range(1000):  # 24 MiB of disk: full long before 60 MB
            r = await c.send("nospace", BODY + str(i).encode())
            if r.code == ResponseCode.SUCCESS:
                acked += 1
                continue
            answers.append((r.code, r.remark))
            if len(answers) >= 5:
                break
        assert answers, "the disk never filled"
        for code, remark in answers:
            assert _refused(code, remark, "no space left", "writes are refused"), (code, remark)
        assert b.store.writes_refused_cause == "disk_full"
        # the broker serves reads meanwhile, and every acknowledged message is there
        got = await c.pull_all("nospace", queues=4)
        assert len(got) == acked
        # still refused a while later: the sampler (usage under 100 %) does not let writes in
        # while a write finds no byte left
        r = await c.send("nospace", BODY)
        assert _refused(r.code, r.remark, "no space left"), (r.code, r.remark)
        # freeing space lets writes in again, without a restart
        filler.unlink()
        await wait_until(lambda: b.store.writes_refused is None, 15, "writes accepted again")
        r = await c.send("nospace", b"after")
        assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
    finally:
        await c.close()
        await b.shutdown()


async def test_a_read_only_store_refuses_table_writes_like_appends(
    ext4_disk: tuple[Path, Path],  # noqa: F811
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    mnt, _ = ext4_disk
    async with raw_broker(
        make_broker_config(
            store_path_root_dir=str(mnt / "store"),
            mapped_file_size_commit_log=4 * MiB,
            mapped_file_size_consume_queue=20 * 4096,
            max_message_size=64 * 1024,
            message_index_enable=False,
        )
    ) as (b, c):
        assert (await c.send("ro-tables", b"before")).code == ResponseCode.SUCCESS
        _fail_filesystem(mnt)
        # a new consumer group's heartbeat: its retry topic dirties the topic table
        await c.heartbeat(consumer_groups={"newcomer": {"ro-tables": "*"}})
        for i in range(3):
            r = await c.send("ro-tables", b"after %d" % i)
            assert _refused(r.code, r.remark, "read-only"), (r.code, r.remark)
        h = CreateTopicRequestHeader(topic="ro-new", read_queue_nums=1, write_queue_nums=1)
        r = await c.call(RequestCode.UPDATE_AND_CREATE_TOPIC, h.to_ext_fields())
        assert _refused(r.code, r.remark, "read-only"), (r.code, r.remark)
        r = await c.call(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            {},
            b'{"groupName":"ro-group","consumeEnable":true}',
        )
        assert _refused(r.code, r.remark, "read-only"), (r.code, r.remark)
        # reads go on
        assert [m.body for m in await c.pull_all("ro-tables")] == [b"before"]
