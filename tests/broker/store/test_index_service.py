"""The index service on a real store: it follows the commit log across segments, skips rolled-back
records, checks every candidate against the stored message, and copes with a log cut back under
it or removed by retention."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from store_helpers import FakeClock, make_msg

from txmq.broker.messaging.index import MessageIndexService
from txmq.broker.store import MessageStore
from txmq.protocol.errors import SystemBusyError
from txmq.protocol.message import MessageSysFlag, decode_message

FOREVER = 2**62


def _index(store: MessageStore, tmp_path: Path, **kw: int) -> MessageIndexService:
    svc = MessageIndexService(
        store,
        str(tmp_path / "index"),
        slot_num=kw.get("slots", 16),
        max_entries=kw.get("entries", 1000),
    )
    svc.load()
    return svc


def _bodies(svc: MessageIndexService, topic: str, key: str, unique: bool = False) -> list[bytes]:
    res = svc.query(topic, key, 64, 0, FOREVER, unique=unique)
    return [decode_message(m).body for m in res.messages]


def test_it_follows_the_log_across_segments_and_skips_rolled_back_records(
    make_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    store = make_store()  # 4 KiB segments: the log spans several
    for i in range(40):
        store.put_messages(
            [make_msg("T", f"m{i}".encode(), KEYS=f"k{i % 4} all", UNIQ_KEY=f"U{i}")]
        )
    store.put_messages(
        [
            make_msg(
                "T", b"rolled back", sys_flag=MessageSysFlag.TRANSACTION_ROLLBACK_TYPE, KEYS="all"
            )
        ]
    )
    assert len(os.listdir(tmp_path / "store" / "commitlog")) >= 2
    svc = _index(store, tmp_path)
    svc.catch_up()
    assert svc.position == store.max_phy_offset and svc.behind == 0
    assert _bodies(svc, "T", "k1") == [f"m{i}".encode() for i in range(37, 0, -4)][:10]
    assert len(_bodies(svc, "T", "all")) == 40, "the rolled-back record is not indexed"
    assert _bodies(svc, "T", "U7", unique=True) == [b"m7"]
    assert _bodies(svc, "T", "k1", unique=True) == [], "a key is not a message id"
    assert _bodies(svc, "T", "U7") == [b"m7"], "a key query matches a message id"
    assert _bodies(svc, "Other", "k1") == []
    res = svc.query("T", "all", 5, 0, FOREVER)
    assert len(res.messages) == 5
    assert res.last_update_phy_offset == store.max_phy_offset
    svc.files.close()


def test_a_log_cut_back_under_the_index_is_followed(
    make_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    store = make_store(mapped_file_size_commit_log=1024 * 1024)
    cut_at = 0
    for i in range(10):
        if i == 6:
            cut_at = store.max_phy_offset
        store.put_messages([make_msg("T", f"old{i}".encode(), KEYS="k")])
    svc = _index(store, tmp_path)
    svc.catch_up()
    assert len(_bodies(svc, "T", "k")) == 10
    store.truncate(cut_at)  # what a replica does with records its leader never acknowledged
    store.put_messages([make_msg("T", b"new", KEYS="k2")])
    svc.catch_up()
    assert svc.position == store.max_phy_offset
    # Stale entries of the cut records are never returned: each candidate is checked.
    assert _bodies(svc, "T", "k") == [f"old{i}".encode() for i in range(5, -1, -1)]
    assert _bodies(svc, "T", "k2") == [b"new"]
    svc.files.close()


def test_records_removed_by_retention_are_skipped(
    make_store: Callable[..., MessageStore], tmp_path: Path, clock: FakeClock
) -> None:
    store = make_store(file_reserved_time=1.0)
    for i in range(100):
        store.put_messages([make_msg("T", f"m{i}".encode(), KEYS=f"k{i} all")])
    before = _index(store, tmp_path)
    before.catch_up()
    assert _bodies(before, "T", "k0") == [b"m0"]
    before.files.close()
    for seg in sorted(os.listdir(tmp_path / "store" / "commitlog"))[:-1]:
        os.utime(tmp_path / "store" / "commitlog" / seg, (0, 0))
    assert store.delete_expired_files(now=clock.now) > 0
    # The entries of deleted records are still in the index: their candidates are skipped.
    after = _index(store, tmp_path)
    assert _bodies(after, "T", "k0") == []
    assert _bodies(after, "T", "k99") == [b"m99"]
    after.files.close()
    # An index that starts after retention starts at the oldest record still stored.
    for name in os.listdir(tmp_path / "index"):
        os.remove(tmp_path / "index" / name)
    fresh = _index(store, tmp_path)
    assert fresh.position == store.min_phy_offset > 0
    fresh.catch_up()
    assert _bodies(fresh, "T", "k99") == [b"m99"] and _bodies(fresh, "T", "k0") == []
    fresh.files.close()


async def test_a_lookup_while_the_index_is_rebuilt_is_busy_not_a_false_not_found(
    make_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    """After a start with records left unindexed (an unclean stop), a query that finds nothing
    yet is answered "busy" (ask again), one that comes while the rebuild runs waits for it;
    once rebuilt, "not found" is an answer again."""
    store = make_store(mapped_file_size_commit_log=1024 * 1024)
    for i in range(50):
        store.put_messages([make_msg("T", f"m{i}".encode(), KEYS=f"k{i}", UNIQ_KEY=f"U{i}")])
    svc = _index(store, tmp_path)
    assert svc.behind > 0 and svc.rebuilding
    with pytest.raises(SystemBusyError, match="being rebuilt"):
        await svc.query_when_ready("T", "k7", 64, 0, FOREVER)  # not started: nothing indexed
    svc.start()
    try:
        res = await svc.query_when_ready("T", "k7", 64, 0, FOREVER)  # waits for the rebuild
        assert [decode_message(m).body for m in res.messages] == [b"m7"]
        assert not svc.rebuilding and svc.behind == 0
        none = await svc.query_when_ready("T", "no-such-key", 64, 0, FOREVER)
        assert none.messages == []
    finally:
        await asyncio.wait_for(svc.close(), 10)


async def test_an_index_loaded_caught_up_is_not_rebuilding(
    make_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    store = make_store(mapped_file_size_commit_log=1024 * 1024)
    store.put_messages([make_msg("T", b"m", KEYS="k")])
    first = _index(store, tmp_path)
    first.catch_up()
    first.files.close()
    svc = _index(store, tmp_path)
    svc.start()
    try:
        assert not svc.rebuilding
        assert (await svc.query_when_ready("T", "absent", 64, 0, FOREVER)).messages == []
    finally:
        await asyncio.wait_for(svc.close(), 10)
