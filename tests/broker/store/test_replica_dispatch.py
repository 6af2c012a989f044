"""A follower indexes a replicated chunk of many records in one go: the consume queues it
writes must be the leader's, byte for byte, whatever the chunk holds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from store_helpers import make_msg

from txmq.broker.store import MessageStore
from txmq.protocol.message import MessageSysFlag


def queue_files(root: Path) -> dict[str, bytes]:
    cq = root / "consumequeue"
    return {str(p.relative_to(cq)): p.read_bytes() for p in sorted(cq.rglob("*")) if p.is_file()}


def replicate(leader: MessageStore, follower: MessageStore) -> int:
    """Copy the leader's log in chunks of up to 1 MiB; returns the records of the biggest."""
    most = 0
    pos = follower.max_phy_offset
    while True:
        data, nxt = leader.read_replica_chunk(pos, 1 << 20)
        if not data and nxt == pos:
            return most
        pos = follower.append_replicated(pos, data, nxt)
        most = max(most, data.count(b"KEYS\x01"))


def test_chunks_of_many_records_index_as_the_leader_did(
    make_store: Callable[..., MessageStore], tmp_path: Path
) -> None:
    # 64 KiB segments: one chunk holds dozens of records; 10-entry consume-queue files: the
    # entries of one chunk roll over several queue files.
    leader = make_store(tmp_path / "leader", mapped_file_size_commit_log=65536)
    follower = make_store(tmp_path / "follower", mapped_file_size_commit_log=65536)
    for round_ in range(3):
        batch = []
        for i in range(40):
            n = round_ * 100 + i
            if n % 7 == 3:  # halves and rollbacks get no entry; commits and plain ones do
                flag = (
                    MessageSysFlag.TRANSACTION_PREPARED_TYPE
                    if n % 2
                    else MessageSysFlag.TRANSACTION_ROLLBACK_TYPE
                )
                batch.append(make_msg(sys_flag=flag, queue_id=n % 3, KEYS=f"k{n}"))
            else:
                topic = "TopicB" if n % 5 == 0 else "TopicA"  # TopicB appears mid-chunk
                batch.append(make_msg(topic=topic, queue_id=n % 3, tags=f"t{n % 4}", KEYS=f"k{n}"))
        leader.put_messages(batch[:15])
        leader.put_messages(batch[15:])
        most = replicate(leader, follower)
        assert most >= 15, f"a chunk held only {most} records: the test needs bigger chunks"
        assert follower.max_phy_offset == leader.max_phy_offset
        mine, theirs = queue_files(tmp_path / "follower"), queue_files(tmp_path / "leader")
        assert sorted(mine) == sorted(theirs)
        for name, data in theirs.items():
            assert mine[name] == data, f"consume-queue file {name} differs after round {round_}"
    for topic in ("TopicA", "TopicB"):
        for q in range(3):
            assert follower.get_max_offset_in_queue(topic, q) == leader.get_max_offset_in_queue(
                topic, q
            )
