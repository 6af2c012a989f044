"""A batch to one queue with one sys flag, appended with ``one_run`` (checked as a whole): the
same commit log, consume queues, offsets and errors as the record-by-record checks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from store_helpers import commit_log_files, make_msg, read_queue

from txmq.broker.store import MessageStore, encode_for_store
from txmq.protocol.errors import MessageIllegalError
from txmq.protocol.message import MessageExt, MessageSysFlag, encode_message

MakeStore = Callable[..., MessageStore]


def _batch(i: int, sys_flag: int = 0, queue_id: int = 1) -> list[MessageExt]:
    return [
        make_msg(
            body=bytes([65 + j % 26]) * (1 + (i * 7 + j * 13) % 300),
            queue_id=queue_id,
            sys_flag=sys_flag,
            tags="t" if j % 2 else None,
            UNIQ_KEY=f"{i:08X}{j:024X}",
        )
        for j in range(1 + i % 9)
    ]


@pytest.mark.parametrize(
    "sys_flag", [0, MessageSysFlag.TRANSACTION_PREPARED_TYPE], ids=["plain", "half"]
)
def test_one_run_stores_what_record_by_record_stores(
    make_store: MakeStore, tmp_path: Path, sys_flag: int
) -> None:
    a = make_store(tmp_path / "a", mapped_file_size_commit_log=1 << 14)
    b = make_store(tmp_path / "b", mapped_file_size_commit_log=1 << 14)
    for i in range(40):  # several segments: batches that do not fit start a new one
        ra = a.put_encoded([encode_for_store(m) for m in _batch(i, sys_flag)])
        rb = b.put_encoded([encode_for_store(m) for m in _batch(i, sys_flag)], one_run=True)
        assert (rb.placed, rb.end_offset, rb.per_destination, rb.payload_bytes) == (
            ra.placed,
            ra.end_offset,
            ra.per_destination,
            ra.payload_bytes,
        )
    if not sys_flag:
        assert [encode_message(m) for m in read_queue(a, "TopicA", 1)] == [
            encode_message(m) for m in read_queue(b, "TopicA", 1)
        ]
        assert len(read_queue(b, "TopicA", 1)) == sum(1 + i % 9 for i in range(40))
    else:
        assert read_queue(b, "TopicA", 1) == []  # halves are not dispatched
    a.close()
    b.close()
    log_a, log_b = commit_log_files(tmp_path / "a"), commit_log_files(tmp_path / "b")
    assert len(log_b) > 1
    assert [p.read_bytes() for p in log_a] == [p.read_bytes() for p in log_b]


def test_one_run_refuses_what_record_by_record_refuses(make_store: MakeStore) -> None:
    store = make_store(max_message_size=400)
    ok = make_msg(body=b"x" * 100, queue_id=1)
    big = make_msg(body=b"y" * 320, queue_id=1)  # 88 + 320 + its tail: over 400
    bad_queue = make_msg(body=b"x", queue_id=-5)
    for records in (
        [ok, big, ok],
        [big],
        [bad_queue, bad_queue],
    ):
        encoded = [encode_for_store(m) for m in records]
        with pytest.raises(MessageIllegalError) as generic:
            store.put_encoded(encoded)
        with pytest.raises(MessageIllegalError) as one_run:
            store.put_encoded(encoded, one_run=True)
        assert str(one_run.value) == str(generic.value)
    assert store.max_phy_offset == 0  # all or none: nothing was written
    # Records that fit only one by one (their largest body and largest tail are from two
    # different records) are still stored.
    mixed = [
        make_msg(body=b"z" * 280, queue_id=1),
        make_msg(body=b"z", queue_id=1, KEYS="k" * 60),
    ]
    res = store.put_encoded([encode_for_store(m) for m in mixed], one_run=True)
    assert len(res.placed) == 2
