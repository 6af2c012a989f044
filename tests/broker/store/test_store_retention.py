"""Retention: old commit-log segments go (never the active one), consume queues follow, and a
consumer below the new minimum is told where to resume."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from store_helpers import commit_log_files, make_msg, read_queue

from txmq.broker.store import GetMessageStatus, MessageStore, PutMessageResult
from txmq.protocol.errors import QueryNotFoundError

MakeStore = Callable[..., MessageStore]
HOURS = 3600.0


def fill(store: MessageStore, n: int) -> list[PutMessageResult]:
    return [
        store.put_message(make_msg(body=f"m{i}".encode() + bytes(400), queue_id=i % 2))
        for i in range(n)
    ]


def age(paths: list[Path], hours: float) -> None:
    t = os.path.getmtime(paths[-1]) - hours * HOURS
    for p in paths:
        os.utime(p, (t, t))


def cq_files(store_dir: Path, qid: int) -> list[Path]:
    return sorted((store_dir / "consumequeue" / "TopicA" / str(qid)).iterdir())


def test_aged_segments_are_deleted_but_never_the_active_one(
    make_store: MakeStore, tmp_path: Path
) -> None:
    store = make_store()
    results = fill(store, 60)
    store_dir = tmp_path / "store"
    files = commit_log_files(store_dir)
    assert len(files) >= 6
    cq_before = len(cq_files(store_dir, 0))

    age(files[:2], 71.0)  # younger than 72 h: kept
    assert store.delete_expired_files() == 0
    assert commit_log_files(store_dir) == files

    age(files, 73.0)  # all of them, the active one too
    assert store.delete_expired_files() == len(files) - 1
    assert commit_log_files(store_dir) == files[-1:]
    assert store.min_phy_offset == int(files[-1].name)

    # the consume queues dropped the files that only pointed into deleted segments
    assert len(cq_files(store_dir, 0)) < cq_before
    for qid in (0, 1):
        new_min = store.get_min_offset_in_queue("TopicA", qid)
        survivors = [
            r
            for i, r in enumerate(results)
            if i % 2 == qid and r.commit_log_offset >= store.min_phy_offset
        ]
        assert new_min == survivors[0].queue_offset
        r = store.get_messages("TopicA", qid, 0)
        assert r.status is GetMessageStatus.OFFSET_TOO_SMALL
        assert (r.next_begin_offset, r.min_offset) == (new_min, new_min)
        got = read_queue(store, "TopicA", qid)
        assert [m.queue_offset for m in got] == [s.queue_offset for s in survivors]

    with pytest.raises(QueryNotFoundError):
        store.lookup_message(results[0].commit_log_offset)
    assert store.lookup_message(results[-1].commit_log_offset).body.startswith(b"m59")

    # appends carry on, and the new minimum survives a restart
    store.put_message(make_msg(body=b"later"))
    mins = [store.get_min_offset_in_queue("TopicA", q) for q in (0, 1)]
    store.close()
    store = make_store()
    assert [store.get_min_offset_in_queue("TopicA", q) for q in (0, 1)] == mins
    assert store.min_phy_offset == int(files[-1].name)
    assert read_queue(store, "TopicA", 0)[-1].body == b"later"


def test_reserved_time_is_configurable(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store(file_reserved_time=1.0)
    fill(store, 30)
    files = commit_log_files(tmp_path / "store")
    age(files[:1], 1.5)
    assert store.delete_expired_files() == 1
    assert commit_log_files(tmp_path / "store") == files[1:]


def test_by_default_a_full_disk_deletes_no_unexpired_segment(
    make_store: MakeStore, tmp_path: Path
) -> None:
    store = make_store(disk_max_used_space_ratio=0)
    fill(store, 40)
    files = commit_log_files(tmp_path / "store")
    assert store.delete_expired_files() == 0
    assert commit_log_files(tmp_path / "store") == files


def test_with_delete_oldest_a_full_disk_deletes_the_oldest_segments_whatever_their_age(
    make_store: MakeStore, tmp_path: Path
) -> None:
    store = make_store(disk_max_used_space_ratio=0, disk_full_policy="delete_oldest")
    fill(store, 40)
    files = commit_log_files(tmp_path / "store")
    assert 2 <= len(files) <= 10
    assert store.delete_expired_files() == len(files) - 1
    assert commit_log_files(tmp_path / "store") == files[-1:]
    assert store.delete_expired_files() == 0  # the active segment stays


def test_deletion_is_batched(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store(disk_max_used_space_ratio=0, disk_full_policy="delete_oldest")
    for i in range(14):
        store.put_message(make_msg(body=bytes(3000 + i)))  # one segment each
    assert len(commit_log_files(tmp_path / "store")) == 14
    assert store.delete_expired_files() == 10
    assert store.delete_expired_files() == 3
