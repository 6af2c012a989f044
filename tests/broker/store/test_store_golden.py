"""Golden bytes of the on-disk formats.  If one of these fails, the commit-log record, the
consume-queue entry or the checkpoint changed: bump FORMAT_VERSION (old stores then refuse to
open instead of being misread) and update the bytes here on purpose.

The bytes were written from the layout tables in commit_log.py, consume_queue.py and
txmq.protocol.message; only the two CRC32 values were computed (zlib.crc32)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from store_helpers import FakeClock

from txmq.broker.store import FORMAT_VERSION, MessageStore
from txmq.protocol.message import MessageExt

STORED_MESSAGE = bytes.fromhex(
    "00000068"  # TOTALSIZE 104
    "daa320a7"  # MAGICCODE (RocketMQ V1)
    "58932aac"  # BODYCRC crc32(b"hi") & 0x7fffffff
    "00000001"  # QUEUEID 1
    "00000000"  # FLAG
    "0000000000000000"  # QUEUEOFFSET 0
    "0000000000000000"  # PHYSICALOFFSET 0
    "00000000"  # SYSFLAG
    "0000018bcfe56800"  # BORNTIMESTAMP 1_700_000_000_000
    "0a000001000004d2"  # BORNHOST 10.0.0.1:1234
    "0000018bcfe569f4"  # STORETIMESTAMP 1_700_000_000_500 (the store's clock)
    "0a01020300002a9f"  # STOREHOST 10.1.2.3:10911
    "00000000"  # RECONSUMETIMES
    "0000000000000000"  # PREPARED_TRANSACTION_OFFSET
    "00000002"
    "6869"  # BODY b"hi"
    "04"
    "476f6c64"  # TOPIC "Gold"
    "0007"
    "54414753017402"  # PROPERTIES "TAGS\x01t\x02"
)
RECORD = (
    bytes.fromhex(
        "54584d51"  # MAGIC "TXMQ"
        "00000068"  # LENGTH 104
        "2984b956"  # CRC32 of the stored message
    )
    + STORED_MESSAGE
)
CQ_ENTRIES = bytes.fromhex(
    "0000000000000000"
    "00000068"
    "0000000000000074"  # offset 0, size 104, tagsCode("t") 116
    "0000000000000074"
    "00000068"
    "0000000000000074"  # offset 116 = 12 + 104
)


def test_format_version_is_the_one_these_bytes_describe() -> None:
    assert FORMAT_VERSION == 1


def test_golden_commit_log_record_and_consume_queue_entries(
    make_store: Callable[..., MessageStore], tmp_path: Path, clock: FakeClock
) -> None:
    clock.now = 1_700_000_000.5
    store = make_store()
    for _ in range(2):
        store.put_message(
            MessageExt(
                topic="Gold",
                body=b"hi",
                queue_id=1,
                born_timestamp=1_700_000_000_000,
                born_host=("10.0.0.1", 1234),
                properties={"TAGS": "t"},
            )
        )
    assert store.read_message_bytes(0) == STORED_MESSAGE
    store.close()

    root = tmp_path / "store"
    commit_log = (root / "commitlog" / "00000000000000000000").read_bytes()
    assert commit_log[: len(RECORD)] == RECORD
    second = commit_log[len(RECORD) + 12 : len(RECORD) + 12 + 104]
    assert second[20:36] == bytes.fromhex(  # the second copy's QUEUEOFFSET, PHYSICALOFFSET
        "00000000000000010000000000000074"
    )
    cq = (root / "consumequeue" / "Gold" / "1" / "00000000000000000000").read_bytes()
    assert cq[:40] == CQ_ENTRIES
    assert cq[40:60] == bytes(20)  # zeros: no entry yet

    checkpoint = json.loads((root / "checkpoint").read_bytes())
    assert checkpoint["formatVersion"] == FORMAT_VERSION
    assert (checkpoint["logicOffset"], checkpoint["queues"]) == (232, {"Gold": {"1": 2}})
