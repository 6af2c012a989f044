"""The message index on a disk without room for its file (a small real tmpfs): the broker goes on
storing and serving, queries find nothing yet, and once the index fits it catches up."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from structlog.testing import capture_logs

from tests.client.helpers import FAST_CLIENT
from tests.support.brokers import started
from tests.support.waiting import wait_until
from txmq.broker.config import BrokerConfig
from txmq.client import AsyncProducer, Message
from txmq.client.admin import AsyncAdminClient

MiB = 1024 * 1024


async def test_no_room_for_an_index_file_stops_indexing_not_the_broker(
    small_disk: Path, make_broker_config: Callable[..., BrokerConfig]
) -> None:
    store = str(small_disk / "store")
    # 8 M slots = 32 MiB of slots: an index file cannot be allocated on a 24 MiB disk.
    cfg = make_broker_config(
        store_path_root_dir=store,
        mapped_file_size_commit_log=MiB,
        max_message_size=64 * 1024,
        max_hash_slot_num=8_000_000,
    )
    async with started(cfg) as b:
        with capture_logs() as logs:
            async with AsyncProducer("p", broker=b.address, config=FAST_CLIENT) as p:
                sent = [await p.send(Message("full", f"m{i}", keys=f"k{i}")) for i in range(20)]
            await wait_until(
                lambda: any(e["event"] == "index_build_failed" for e in logs),
                what="the index to fail for want of space",
            )
        assert "No space left" in next(
            e["error"] for e in logs if e["event"] == "index_build_failed"
        )
        async with AsyncAdminClient(b.address) as admin:
            assert (await admin.query_messages("full", "k3")).messages == []
            # Everything else is served: the message is there by its offsetMsgId.
            assert (await admin.view_message(sent[3].offset_msg_id)).body == b"m3"
        assert os.listdir(os.path.join(store, "index")) == [], "no half-made index file is left"
    # With files that fit, the index catches up with everything stored.
    async with started(cfg.replace(max_hash_slot_num=1024, max_index_num=1024)) as b:
        async with AsyncAdminClient(b.address) as admin:

            async def found() -> bool:
                return bool((await admin.query_messages("full", "k19")).messages)

            await wait_until(found, what="the index to catch up")
            for i, r in enumerate(sent):
                got = (await admin.query_messages("full", f"k{i}")).messages
                assert [m.msg_id for m in got] == [r.msg_id]
