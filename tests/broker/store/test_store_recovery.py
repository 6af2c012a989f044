"""Recovery: lost consume queues are rebuilt, torn tails are cut, the store keeps working.

"Crash images" are copies of a store folder taken while the store is open (see
``store_helpers.crash_image``): what the disk holds when the process is killed.  The SIGKILL
tests with real processes are in test_store_crash.py.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from store_helpers import commit_log_files, crash_image, make_msg, read_queue

from txmq.broker.store import (
    GetMessageStatus,
    MessageStore,
    PutMessageResult,
    StoreConfig,
    StoreCorruptError,
)
from txmq.broker.store.commit_log import RECORD_HEADER_SIZE, encode_record
from txmq.broker.store.consume_queue import CQ_ENTRY
from txmq.broker.store.fileio import with_checksum
from txmq.protocol.message import decode_message

MakeStore = Callable[..., MessageStore]


def fill(
    store: MessageStore, n: int = 40, queues: int = 2, topic: str = "TopicA"
) -> dict[int, list[bytes]]:
    """Append ``n`` messages with distinct bodies; the bodies by queue."""
    sent: dict[int, list[bytes]] = {q: [] for q in range(queues)}
    for i in range(n):
        q = i % queues
        body = f"{topic}-{i}-".encode() + random.Random(i).randbytes(20 + (i * 53) % 300)
        store.put_message(make_msg(topic, body, q, tags=f"t{i % 3}"))
        sent[q].append(body)
    return sent


def filled_and_closed(
    make_store: MakeStore, n: int, queues: int = 2
) -> tuple[dict[int, list[bytes]], int]:
    """A store of its own folder filled with :func:`fill` (``n`` messages over ``queues``
    queues of TopicA), then closed: the bodies by queue and the commit log's end."""
    store = make_store()
    sent = fill(store, n, queues)
    end = store.max_phy_offset
    store.close()
    return sent, end


def queue_files(tmp_path: Path, topic: str = "TopicA", queue_id: int = 0) -> list[Path]:
    """The consume-queue files of a queue of the store under ``tmp_path``, oldest first."""
    return sorted((tmp_path / "store" / "consumequeue" / topic / str(queue_id)).iterdir())


def image_store(image: Path) -> MessageStore:
    """A store over the crash image ``image`` with the test stores' small segments, not loaded
    yet (the test reads what ``load`` reports)."""
    cfg = StoreConfig(
        str(image), mapped_file_size_commit_log=4096, mapped_file_size_consume_queue=200
    )
    return MessageStore(cfg, ("127.0.0.1", 1))


def assert_queues(store: MessageStore, sent: dict[int, list[bytes]], topic: str = "TopicA") -> None:
    for q, bodies in sent.items():
        got = read_queue(store, topic, q)
        assert [m.body for m in got] == bodies
        assert [m.queue_offset for m in got] == list(range(len(bodies)))
        assert store.get_max_offset_in_queue(topic, q) == len(bodies)


def last_segment_write(store_dir: Path, offset: int, data: bytes) -> None:
    """Write ``data`` at commit-log ``offset`` (inside an existing segment)."""
    for f in commit_log_files(store_dir):
        start = int(f.name)
        if start <= offset < start + f.stat().st_size:
            with open(f, "r+b") as fh:
                fh.seek(offset - start)
                fh.write(data)
            return
    raise AssertionError(f"no segment holds offset {offset}")


def test_deleted_consume_queue_is_rebuilt(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store()
    sent = fill(store)
    sent_b = fill(store, 10, 1, topic="TopicB")
    store.close()
    shutil.rmtree(tmp_path / "store" / "consumequeue" / "TopicA")

    store = make_store()
    assert_queues(store, sent)
    assert_queues(store, sent_b, topic="TopicB")
    assert store.topics() == ["TopicA", "TopicB"]


def test_recovery_report_counts_what_was_rebuilt(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store()
    fill(store, 30)
    store.close()
    shutil.rmtree(tmp_path / "store" / "consumequeue" / "TopicA" / "1")
    store = MessageStore(store.config, ("127.0.0.1", 1))
    report = store.load()
    try:
        assert report.rebuilt_queues == 1
        assert report.redispatched == 15
        assert report.truncated_bytes == 0 and report.deleted_segments == 0
        assert report.max_phy_offset == store.max_phy_offset
        assert report.consume_queues == 2
        assert report.scan_start_offset == 0 < report.checkpoint_offset
    finally:
        store.close()


@pytest.mark.parametrize("keep_entries", [0, 2, 13])
def test_truncated_consume_queue_file_is_rebuilt(
    make_store: MakeStore, tmp_path: Path, keep_entries: int
) -> None:
    sent, _ = filled_and_closed(make_store, 50)
    files = queue_files(tmp_path)
    assert len(files) >= 3  # 25 entries in 10-entry files
    keep_file, keep_in_file = divmod(keep_entries, 10)
    for f in files[keep_file + 1 :]:
        f.unlink()
    os.truncate(files[keep_file], keep_in_file * 20 + 7)  # and a torn entry

    store = make_store()
    assert_queues(store, sent)


def test_missing_checkpoint_rebuilds_everything(make_store: MakeStore, tmp_path: Path) -> None:
    sent, _ = filled_and_closed(make_store, 30)
    os.unlink(tmp_path / "store" / "checkpoint")
    # make the old queues wrong: a rebuild must not trust them
    qfile = queue_files(tmp_path)[0]
    with open(qfile, "r+b") as fh:
        fh.write(CQ_ENTRY.pack(999_999, 50, 0) * 3)

    store = make_store()
    assert_queues(store, sent)


def test_checkpoint_of_another_format_version_is_refused(
    make_store: MakeStore, tmp_path: Path
) -> None:
    store = make_store()
    fill(store, 3)
    store.close()
    path = tmp_path / "store" / "checkpoint"
    doc = json.loads(path.read_bytes())
    doc["formatVersion"] = 99
    path.write_text(json.dumps(with_checksum(doc)))
    with pytest.raises(StoreCorruptError, match="version 99"):
        make_store()
    # the refused load released its lock: fix the file and open again
    path.write_text("not json at all")
    store = make_store()
    assert store.get_max_offset_in_queue("TopicA", 0) == 2


def _valid_record_bytes(store: MessageStore, r: PutMessageResult) -> bytes:
    return encode_record(store.read_message_bytes(r.commit_log_offset))


TEARS = [
    "random_garbage",
    "half_record",
    "flipped_byte_in_last_record",
    "bad_length",
    "garbage_in_next_segment",
]


@pytest.mark.parametrize("tear", TEARS)
def test_torn_tail_is_cut_and_everything_before_survives(
    make_store: MakeStore, tmp_path: Path, tear: str
) -> None:
    store = make_store()
    sent = fill(store, 30)
    store.flush_consume_queues()  # checkpoint somewhere in the middle
    more = fill(store, 10, topic="TopicB", queues=1)
    last = store.put_message(make_msg("TopicB", b"the last one", 0))
    image = crash_image(tmp_path / "store", tmp_path / "image")
    end = store.max_phy_offset
    rng = random.Random(tear)
    expected_b = more[0] + [b"the last one"]

    if tear == "random_garbage":
        last_segment_write(image, end, rng.randbytes(100))
    elif tear == "half_record":
        record = _valid_record_bytes(store, last)
        last_segment_write(image, end, record[: len(record) // 2])
    elif tear == "flipped_byte_in_last_record":
        pos = last.commit_log_offset + RECORD_HEADER_SIZE + last.size - 3
        last_segment_write(image, pos, b"\x5a")
        expected_b = more[0]
    elif tear == "bad_length":
        torn = bytearray(_valid_record_bytes(store, last))
        struct.pack_into(">I", torn, 4, 4000)  # length past the segment end
        last_segment_write(image, end, bytes(torn))
    else:  # a new segment file full of garbage after the last one
        seg_end = (end // 4096 + 1) * 4096
        (image / "commitlog" / f"{seg_end:020d}").write_bytes(rng.randbytes(4096))
    store.close()

    recovered = image_store(image)
    first_report = recovered.load()
    assert first_report.truncated_bytes > 0
    if tear == "garbage_in_next_segment":
        assert first_report.deleted_segments == 1
        assert len(commit_log_files(image)) == len(commit_log_files(tmp_path / "store"))
    report_end = recovered.max_phy_offset
    assert_queues(recovered, sent)
    assert_queues(recovered, {0: expected_b}, topic="TopicB")
    if tear == "flipped_byte_in_last_record":
        assert report_end == last.commit_log_offset
        r = recovered.get_messages("TopicB", 0, len(expected_b))
        assert r.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
    else:
        assert report_end == end
    recovered.close()

    # a second opening finds nothing left to cut, and appends land and read back
    reopened = MessageStore(recovered.config, ("127.0.0.1", 1))
    report = reopened.load()
    assert report.truncated_bytes == 0
    put = reopened.put_message(make_msg("TopicB", b"after recovery", 0))
    assert put.commit_log_offset == report_end
    assert reopened.lookup_message(put.commit_log_offset).body == b"after recovery"
    assert [m.body for m in read_queue(reopened, "TopicB", 0)] == expected_b + [b"after recovery"]
    reopened.close()


@pytest.mark.parametrize("tear", ["random_garbage", "flipped_byte_in_last_record"])
def test_recovery_report_measures_the_cut(tmp_path: Path, tear: str) -> None:
    cfg = StoreConfig(
        str(tmp_path / "s"), mapped_file_size_commit_log=4096, mapped_file_size_consume_queue=200
    )
    store = MessageStore(cfg, ("127.0.0.1", 1))
    store.load()
    fill(store, 5, 1)
    last = store.put_message(make_msg(body=b"last"))
    image = crash_image(tmp_path / "s", tmp_path / "img")
    store.close()
    if tear == "random_garbage":
        last_segment_write(image, last.end_offset, b"\x01" * 77)
        cut = 77
    else:
        last_segment_write(image, last.end_offset - 1, b"\x01")
        cut = last.end_offset - last.commit_log_offset
    img = image_store(image)
    report = img.load()
    assert report.truncated_bytes == cut
    img.close()


def test_consume_queue_entries_past_the_end_are_dropped(
    make_store: MakeStore, tmp_path: Path
) -> None:
    sent, end = filled_and_closed(make_store, 24, 1)
    qfile = queue_files(tmp_path)[-1]
    with open(qfile, "r+b") as fh:  # entries 24, 25 exist in the queue, not in the commit log
        fh.seek((24 % 10) * 20)
        fh.write(CQ_ENTRY.pack(end, 120, 0) + CQ_ENTRY.pack(end + 132, 120, 0))

    store = make_store()
    assert store.get_max_offset_in_queue("TopicA", 0) == 24
    assert store.get_messages("TopicA", 0, 24).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
    assert_queues(store, sent)


def test_crash_without_checkpoint_progress_redispatches_the_tail(
    make_store: MakeStore, tmp_path: Path
) -> None:
    store = make_store()
    first = fill(store, 20)
    store.flush_consume_queues()
    checkpoint = store.max_phy_offset
    second = fill(store, 30, topic="TopicC", queues=3)
    image = crash_image(tmp_path / "store", tmp_path / "image")
    store.close()

    recovered = image_store(image)
    report = recovered.load()
    assert report.checkpoint_offset == report.scan_start_offset == checkpoint
    assert report.redispatched == 30
    assert_queues(recovered, first)
    assert_queues(recovered, second, topic="TopicC")
    recovered.close()
    again = MessageStore(recovered.config, ("127.0.0.1", 1))
    report = again.load()
    assert report.checkpoint_offset == report.max_phy_offset  # recovery wrote a fresh one
    assert report.redispatched == 0
    again.close()


def test_recovery_after_retention_keeps_queue_offsets(
    make_store: MakeStore, tmp_path: Path
) -> None:
    store = make_store()
    fill(store, 20, 1, topic="Old")  # all in the first segments
    old_end = (store.max_phy_offset // 4096 + 1) * 4096
    for _ in range(3):
        store.put_message(make_msg("Filler", bytes(3000)))
    new = fill(store, 5, 1, topic="New")
    assert decode_message(store.get_messages("New", 0, 0).messages[0]).commit_log_offset > old_end
    for f in commit_log_files(tmp_path / "store"):
        if int(f.name) < old_end:
            os.utime(f, (1_000_000, 1_000_000))
    assert store.delete_expired_files() == old_end // 4096
    old_max = store.get_max_offset_in_queue("Old", 0)
    assert store.get_min_offset_in_queue("Old", 0) == old_max == 20
    store.close()
    shutil.rmtree(tmp_path / "store" / "consumequeue")

    store = make_store()
    # every message of "Old" is gone, but its offsets are not reused
    assert store.get_max_offset_in_queue("Old", 0) == 20
    assert store.get_min_offset_in_queue("Old", 0) == 20
    r = store.get_messages("Old", 0, 3)
    assert r.status is GetMessageStatus.OFFSET_TOO_SMALL and r.next_begin_offset == 20
    assert store.put_message(make_msg("Old", b"next")).queue_offset == 20
    assert_queues(store, new, topic="New")
    store.close()

    # without the checkpoint the rebuilt queue starts at its first surviving message
    os.unlink(tmp_path / "store" / "checkpoint")
    shutil.rmtree(tmp_path / "store" / "consumequeue" / "Old")
    store = make_store()
    assert store.get_min_offset_in_queue("Old", 0) == 20
    assert [m.body for m in read_queue(store, "Old", 0)] == [b"next"]


def test_unknown_files_are_ignored(make_store: MakeStore, tmp_path: Path) -> None:
    sent, _ = filled_and_closed(make_store, 10)
    (tmp_path / "store" / "commitlog" / "README").write_text("hi")
    (tmp_path / "store" / "consumequeue" / "not a topic").mkdir()
    (tmp_path / "store" / "consumequeue" / "TopicA" / "x").mkdir()
    store = make_store()
    assert_queues(store, sent)


def test_damage_below_the_checkpoint_is_skipped_not_cut(
    make_store: MakeStore, tmp_path: Path
) -> None:
    """A queue is rebuilt from the start of the commit log and the scan meets a damaged record
    in data that was fsynced long ago: nothing is cut, and only the damaged message is lost:
    the scan finds the next intact record (each names its own offset) and goes on."""
    store = make_store()
    results = [
        store.put_message(make_msg(body=f"m{i:02d}".encode() + bytes(300), queue_id=i % 2))
        for i in range(24)
    ]
    end = store.max_phy_offset
    store.close()
    victim = results[4]  # queue 0, offset 2, in the first segment
    last_segment_write(tmp_path / "store", victim.commit_log_offset + 30, b"\xff\xff")
    shutil.rmtree(tmp_path / "store" / "consumequeue" / "TopicA" / "1")

    store = MessageStore(store.config, ("127.0.0.1", 1))
    report = store.load()
    try:
        assert report.damaged_records == 1 and report.truncated_bytes == 0
        assert store.max_phy_offset == end

        def bodies(qid: int) -> list[bytes]:
            got = []
            offset = 0
            while offset < store.get_max_offset_in_queue("TopicA", qid):
                r = store.get_messages("TopicA", qid, offset, 3)
                assert r.status in (GetMessageStatus.FOUND, GetMessageStatus.OFFSET_FOUND_NULL)
                got += [decode_message(m).body[:3] for m in r.messages]
                offset = r.next_begin_offset
            return got

        assert store.get_max_offset_in_queue("TopicA", 1) == 12
        assert bodies(0) == [f"m{i:02d}".encode() for i in range(0, 24, 2) if i != 4]
        assert bodies(1) == [f"m{i:02d}".encode() for i in range(1, 24, 2)]
    finally:
        store.close()


@pytest.mark.parametrize("with_checkpoint", [False, True])
def test_a_damaged_record_in_the_middle_costs_only_itself(
    make_store: MakeStore, tmp_path: Path, with_checkpoint: bool
) -> None:
    """One flipped byte in a record in the middle of the commit log: every intact record after
    it stays, with its offsets, also when the checkpoint is gone (the scan cannot tell a torn
    tail from damage by position then, only by what follows); queue offsets are not reused."""
    store = make_store()
    results = [
        store.put_message(make_msg(body=f"m{i:03d}".encode() + bytes(200), queue_id=0))
        for i in range(60)
    ]
    end = store.max_phy_offset
    store.close()
    victim = results[20]
    last_segment_write(tmp_path / "store", victim.commit_log_offset + 40, b"\x5a")
    if not with_checkpoint:
        os.unlink(tmp_path / "store" / "checkpoint")
    store = MessageStore(store.config, ("127.0.0.1", 1))
    report = store.load()
    try:
        # Without the checkpoint the scan meets the damage; with it, reads do (CRC).
        assert report.damaged_records == (0 if with_checkpoint else 1)
        assert report.truncated_bytes == 0
        assert store.max_phy_offset == end
        got = {}
        offset = 0
        while offset < store.get_max_offset_in_queue("TopicA", 0):
            r = store.get_messages("TopicA", 0, offset, 7)
            assert r.status in (GetMessageStatus.FOUND, GetMessageStatus.OFFSET_FOUND_NULL)
            for raw in r.messages:
                m = decode_message(raw)
                got[m.queue_offset] = m.body[:4]
            offset = r.next_begin_offset
        assert got == {i: f"m{i:03d}".encode() for i in range(60) if i != 20}
        after = store.put_message(make_msg(body=b"new", queue_id=0))
        assert after.queue_offset == 60
    finally:
        store.close()


def test_a_damaged_queue_entry_cannot_misdirect_the_rebuild(
    make_store: MakeStore, tmp_path: Path
) -> None:
    sent, end = filled_and_closed(make_store, 30, 1)
    files = queue_files(tmp_path)
    for f in files[1:]:
        f.unlink()
    # the queue now ends after 10 entries; make the last one point into the middle of a record
    with open(files[0], "r+b") as fh:
        fh.seek(9 * 20)
        fh.write(CQ_ENTRY.pack(end // 2 + 7, 200, 0))

    store = make_store()
    assert store.max_phy_offset == end  # nothing cut
    assert_queues(store, sent)


def test_segments_after_a_missing_one_are_set_aside(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store()
    results = [store.put_message(make_msg(body=bytes(1500))) for _ in range(12)]
    store.close()
    files = commit_log_files(tmp_path / "store")
    assert len(files) >= 4
    files[1].unlink()  # an operator removed a segment in the middle

    store = make_store()
    assert store.max_phy_offset == int(files[1].name)  # the log now ends at the gap
    assert sorted(p.name for p in (tmp_path / "store" / "commitlog").iterdir()) == [
        files[0].name
    ] + [f.name + ".orphaned" for f in files[2:]]
    # the messages in the set-aside files are lost, their offsets are not reused
    assert store.get_max_offset_in_queue("TopicA", 0) == 12
    r = store.put_message(make_msg(body=b"new"))
    assert (r.commit_log_offset, r.queue_offset) == (int(files[1].name), 12)
    got = read_queue(store, "TopicA", 0)
    assert [m.commit_log_offset for m in got] == [
        x.commit_log_offset for x in results if x.end_offset <= int(files[1].name)
    ] + [r.commit_log_offset]
