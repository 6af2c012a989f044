"""Replicating a store byte for byte: what a follower does with a leader's commit log."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from store_helpers import commit_log_files, make_msg, read_queue

from txmq.broker.store import GetMessageStatus, MessageStore
from txmq.protocol.message import MessageSysFlag, decode_message


def copy_all(leader: MessageStore, follower: MessageStore, max_bytes: int = 700) -> int:
    """Fetch chunks from the leader until the follower has everything; returns the chunks."""
    n = 0
    pos = follower.max_phy_offset
    while True:
        data, nxt = leader.read_replica_chunk(pos, max_bytes)
        if not data and nxt == pos:
            return n
        pos = follower.append_replicated(pos, data, nxt)
        assert pos == nxt
        n += 1


def fill(store: MessageStore, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        store.put_messages(
            [make_msg(body=b"x" * (37 * (i % 11)), queue_id=i % 3, tags=f"t{i % 2}", KEYS=f"k{i}")]
        )


def queue_keys(store: MessageStore, queue_id: int) -> list[str]:
    return [m.properties["KEYS"] for m in read_queue(store, "TopicA", queue_id)]


@pytest.fixture
def pair(
    make_store: Callable[..., MessageStore], tmp_path: Path
) -> tuple[MessageStore, MessageStore]:
    """A leader's store and an empty follower's, each in its own folder under ``tmp_path``."""
    return make_store(tmp_path / "leader"), make_store(tmp_path / "follower")


def test_follower_log_is_byte_identical_across_segment_rolls(
    pair: tuple[MessageStore, MessageStore], tmp_path: Path
) -> None:
    leader, follower = pair
    fill(leader, 120)
    # A half (no consume-queue entry) and a batch in one append.
    leader.put_messages(
        [
            make_msg(sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE, KEYS="half"),
            make_msg(queue_id=1, KEYS="b1"),
            make_msg(queue_id=1, KEYS="b2"),
        ]
    )
    assert len(commit_log_files(tmp_path / "leader")) > 3  # several segment rolls
    chunks = copy_all(leader, follower)
    assert chunks > 3
    assert follower.max_phy_offset == leader.max_phy_offset
    for a, b in zip(
        commit_log_files(tmp_path / "leader"), commit_log_files(tmp_path / "follower"), strict=True
    ):
        assert a.name == b.name
        assert a.read_bytes() == b.read_bytes()
    for q in range(3):
        assert queue_keys(follower, q) == queue_keys(leader, q)
    # Appends continue on both; the follower picks up where it stopped.
    fill(leader, 30, start=200)
    copy_all(leader, follower)
    for q in range(3):
        assert queue_keys(follower, q) == queue_keys(leader, q)


def test_follower_refuses_a_gap_and_damaged_records(
    pair: tuple[MessageStore, MessageStore],
) -> None:
    leader, follower = pair
    fill(leader, 10)
    data, nxt = leader.read_replica_chunk(0, 100_000)
    follower.append_replicated(0, data, nxt)
    fill(leader, 5, start=10)
    data2, nxt2 = leader.read_replica_chunk(nxt, 100_000)
    with pytest.raises(ValueError, match="belongs at offset"):
        follower.append_replicated(nxt + 1, data2, nxt2 + 1)
    bad = bytearray(data2)
    bad[40] ^= 0xFF
    with pytest.raises(ValueError, match="CRC"):
        follower.append_replicated(nxt, bytes(bad), nxt2)
    assert follower.max_phy_offset == nxt  # nothing was written
    follower.append_replicated(nxt, data2, nxt2)
    assert queue_keys(follower, 0) == queue_keys(leader, 0)


def test_truncate_cuts_log_and_queue_entries(
    make_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    store = make_store(tmp_path / "s")
    fill(store, 40)
    keep = store.max_phy_offset
    kept = {q: queue_keys(store, q) for q in range(3)}
    fill(store, 40, start=100)
    assert store.truncate(keep) > 0
    assert store.max_phy_offset == keep
    assert {q: queue_keys(store, q) for q in range(3)} == kept
    fill(store, 3, start=500)
    assert queue_keys(store, 0)[-1] == "k501" or queue_keys(store, 2)[-1] == "k502"
    # Cutting everything leaves an empty store that takes replicated data from any offset.
    assert store.truncate(0) > 0
    assert store.max_phy_offset == 0
    assert queue_keys(store, 0) == []


def test_consumers_read_only_what_the_replicas_confirmed(
    make_store: Callable[..., MessageStore],
) -> None:
    """A leader's consumers see records only up to ``visible_end`` (what its in-sync followers
    hold); the records past it wait, with the offset unchanged; the broker's own readers see
    everything."""
    store = make_store()
    ends = []
    for i in range(6):
        store.put_messages([make_msg(body=b"m%d" % i, queue_id=0, KEYS=f"k{i}")])
        ends.append(store.max_phy_offset)
    store.visible_end = ends[2]  # the first three records are on every in-sync replica

    r = store.get_messages("TopicA", 0, 0, 32, for_consumer=True)
    assert r.status is GetMessageStatus.FOUND and len(r.messages) == 3
    assert (r.next_begin_offset, r.max_offset) == (3, 3)
    for offset in (3, 5, 6):  # not confirmed yet, or the end: wait there
        w = store.get_messages("TopicA", 0, offset, 32, for_consumer=True)
        assert w.status is GetMessageStatus.OFFSET_OVERFLOW_ONE, offset
        assert (w.next_begin_offset, w.max_offset, w.messages) == (offset, 3, [])
    assert len(store.get_messages("TopicA", 0, 0, 32).messages) == 6  # the broker's own read

    store.visible_end = ends[4]
    r = store.get_messages("TopicA", 0, 3, 32, for_consumer=True)
    assert [m.properties["KEYS"] for m in map(decode_message, r.messages)] == ["k3", "k4"]
    store.visible_end = None
    assert len(store.get_messages("TopicA", 0, 0, 32, for_consumer=True).messages) == 6
