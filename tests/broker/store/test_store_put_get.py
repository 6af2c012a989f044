"""Appending and reading: round trips, queues, tags, statuses, segments, ids, time lookups."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from store_helpers import FakeClock, commit_log_files, make_msg, read_queue

from txmq.broker.store import (
    GetMessageStatus,
    MessageStore,
    StoreConfig,
    StoreIOError,
    StoreLockedError,
    encode_for_store,
)
from txmq.broker.store.commit_log import RECORD_HEADER_SIZE
from txmq.protocol.errors import (
    MessageIllegalError,
    QueryNotFoundError,
    ServiceNotAvailableError,
)
from txmq.protocol.message import (
    MessageExt,
    MessageSysFlag,
    decode_message,
    decode_messages,
    decode_offset_msg_id,
    encode_message,
    tags_code,
)

MakeStore = Callable[..., MessageStore]
S = GetMessageStatus


def test_put_then_get_returns_the_same_message_with_store_fields(
    make_store: MakeStore, clock: FakeClock
) -> None:
    store = make_store()
    msg = MessageExt(
        topic="Orders",
        body=b"\x00\x01payload\xff",
        queue_id=2,
        flag=7,
        sys_flag=0,
        born_timestamp=1_699_000_000_123,
        born_host=("192.168.1.9", 4567),
        reconsume_times=3,
        prepared_transaction_offset=99,
        properties={"TAGS": "created", "KEYS": "order-1", "region": "eu"},
    )
    r = store.put_message(msg)

    assert r.commit_log_offset == 0 and r.queue_offset == 0
    assert r.store_timestamp == int(clock.now * 1000)
    assert r.end_offset == r.commit_log_offset + RECORD_HEADER_SIZE + r.size
    assert decode_offset_msg_id(r.offset_msg_id) == (("10.1.2.3", 10911), r.commit_log_offset)
    # the store fills in the message object too
    assert (msg.commit_log_offset, msg.queue_offset, msg.store_size) == (0, 0, r.size)

    got = store.get_messages("Orders", 2, 0)
    assert got.status is S.FOUND
    assert (got.next_begin_offset, got.min_offset, got.max_offset) == (1, 0, 1)
    [raw] = got.messages
    assert len(raw) == r.size
    m = decode_message(raw)
    assert (m.topic, m.body, m.queue_id, m.flag, m.born_timestamp, m.born_host) == (
        "Orders",
        b"\x00\x01payload\xff",
        2,
        7,
        1_699_000_000_123,
        ("192.168.1.9", 4567),
    )
    assert (m.reconsume_times, m.prepared_transaction_offset) == (3, 99)
    assert m.properties == {"TAGS": "created", "KEYS": "order-1", "region": "eu"}
    assert (m.store_timestamp, m.store_host) == (r.store_timestamp, ("10.1.2.3", 10911))
    assert (m.commit_log_offset, m.queue_offset) == (0, 0)
    assert m.offset_msg_id == r.offset_msg_id

    assert store.read_message_bytes(r.commit_log_offset) == raw
    assert store.lookup_message(r.commit_log_offset).body == b"\x00\x01payload\xff"


def test_queues_and_topics_are_independent(make_store: MakeStore) -> None:
    store = make_store()
    sent: dict[tuple[str, int], list[bytes]] = {}
    for i in range(60):
        topic = ("Alpha", "Beta")[i % 2]
        qid = i % 3
        body = f"{topic}-{qid}-{i}".encode()
        r = store.put_message(make_msg(topic, body, qid))
        assert r.queue_offset == len(sent.setdefault((topic, qid), []))
        sent[(topic, qid)].append(body)

    assert store.topics() == ["Alpha", "Beta"]
    assert store.queue_ids("Alpha") == [0, 1, 2]
    assert store.queue_ids("Nope") == []
    for (topic, qid), bodies in sent.items():
        assert store.get_max_offset_in_queue(topic, qid) == len(bodies)
        assert store.get_min_offset_in_queue(topic, qid) == 0
        got = read_queue(store, topic, qid)
        assert [m.body for m in got] == bodies
        assert [m.queue_offset for m in got] == list(range(len(bodies)))


def test_tag_filtering_skips_other_tags_and_advances(make_store: MakeStore) -> None:
    store = make_store()
    tags = ["a", "b", None, "a", "c", "b", "a"]
    for i, t in enumerate(tags):
        store.put_message(make_msg(body=str(i).encode(), tags=t))

    only_a = store.get_messages("TopicA", 0, 0, 32, frozenset({tags_code("a")}))
    assert only_a.status is S.FOUND
    assert [decode_message(m).body for m in only_a.messages] == [b"0", b"3", b"6"]
    assert only_a.next_begin_offset == 7

    a_or_c = store.get_messages("TopicA", 0, 1, 2, frozenset({tags_code("a"), tags_code("c")}))
    assert [decode_message(m).body for m in a_or_c.messages] == [b"3", b"4"]
    assert a_or_c.next_begin_offset == 5  # stopped after the second match

    none = store.get_messages("TopicA", 0, 1, 32, frozenset({tags_code("zzz")}))
    assert none.status is S.NO_MATCHED_MESSAGE and none.messages == []
    assert none.next_begin_offset == 7  # past everything scanned


def test_every_get_status(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store()
    seen: set[GetMessageStatus] = set()

    def check(r_status: GetMessageStatus, expected: GetMessageStatus) -> None:
        assert r_status is expected
        seen.add(r_status)

    r = store.get_messages("bad topic/..", 0, 0)
    check(r.status, S.NO_MATCHED_LOGIC_QUEUE)
    check(store.get_messages("TopicA", -1, 0).status, S.NO_MATCHED_LOGIC_QUEUE)

    r = store.get_messages("NeverWritten", 3, 5)  # a valid queue with nothing in it yet
    check(r.status, S.NO_MESSAGE_IN_QUEUE)
    assert (r.next_begin_offset, r.min_offset, r.max_offset) == (0, 0, 0)

    for i in range(30):
        store.put_message(make_msg(body=b"x" * 300, tags="t" if i % 2 else "u"))
    check(store.get_messages("TopicA", 0, 0).status, S.FOUND)

    r = store.get_messages("TopicA", 0, 30)
    check(r.status, S.OFFSET_OVERFLOW_ONE)
    assert r.next_begin_offset == 30

    r = store.get_messages("TopicA", 0, 45)
    check(r.status, S.OFFSET_OVERFLOW_BADLY)
    assert r.next_begin_offset == 30

    r = store.get_messages("TopicA", 0, 0, 32, frozenset({12345}))
    check(r.status, S.NO_MATCHED_MESSAGE)

    # retention: the oldest segments go, the queue's minimum moves up
    files = commit_log_files(tmp_path / "store")
    for f in files:
        os.utime(f, (1_000_000, 1_000_000))
    assert store.delete_expired_files() == len(files) - 1
    new_min = store.get_min_offset_in_queue("TopicA", 0)
    assert new_min > 0
    r = store.get_messages("TopicA", 0, 0)
    check(r.status, S.OFFSET_TOO_SMALL)
    assert (r.next_begin_offset, r.min_offset) == (new_min, new_min)

    # a consume-queue entry whose message cannot be read (here: damaged on disk)
    victim = store.put_message(make_msg(body=b"to be damaged"))
    seg_start = victim.commit_log_offset // 4096 * 4096
    with open(tmp_path / "store" / "commitlog" / f"{seg_start:020d}", "r+b") as fh:
        fh.seek(victim.commit_log_offset - seg_start + RECORD_HEADER_SIZE + 90)
        fh.write(b"\xee\xee")
    r = store.get_messages("TopicA", 0, victim.queue_offset)
    check(r.status, S.OFFSET_FOUND_NULL)
    assert r.next_begin_offset == victim.queue_offset + 1
    store.put_message(make_msg(body=b"after"))
    r = store.get_messages("TopicA", 0, victim.queue_offset)
    assert [decode_message(m).body for m in r.messages] == [b"after"]

    assert seen == set(GetMessageStatus)


def test_max_msgs_and_max_bytes(make_store: MakeStore) -> None:
    store = make_store()
    sizes = [store.put_message(make_msg(body=bytes(200))).size for _ in range(10)]
    r = store.get_messages("TopicA", 0, 0, max_msgs=3)
    assert len(r.messages) == 3 and r.next_begin_offset == 3
    r = store.get_messages("TopicA", 0, 2, max_msgs=32, max_bytes=sizes[0] * 2 + 10)
    assert len(r.messages) == 2 and r.next_begin_offset == 4
    # the first message is returned even when it alone is larger than max_bytes
    r = store.get_messages("TopicA", 0, 5, max_msgs=32, max_bytes=10)
    assert len(r.messages) == 1 and r.next_begin_offset == 6


def test_segments_roll_over_and_records_never_span_two(
    make_store: MakeStore, tmp_path: Path
) -> None:
    store = make_store()
    results = [
        store.put_message(make_msg(body=os.urandom(50 + (i * 37) % 900), queue_id=i % 2))
        for i in range(80)
    ]
    files = commit_log_files(tmp_path / "store")
    assert len(files) > 5
    assert [int(f.name) for f in files] == [i * 4096 for i in range(len(files))]
    assert all(len(f.name) == 20 and f.stat().st_size == 4096 for f in files)
    for r in results:
        assert r.commit_log_offset // 4096 == (r.end_offset - 1) // 4096
        assert store.lookup_message(r.commit_log_offset).commit_log_offset == r.commit_log_offset
    bodies = [m.body for q in (0, 1) for m in read_queue(store, "TopicA", q)]
    assert len(bodies) == 80


@pytest.mark.parametrize("leftover", [0, 5, 11, 12, 40])
def test_segment_tail_of_any_size_is_skipped_after_reload(
    make_store: MakeStore, tmp_path: Path, leftover: int
) -> None:
    """A record that ends 0..11 bytes before the segment end leaves no room for a blank record;
    readers must move to the next segment by themselves."""
    store = make_store()
    probe = store.put_message(make_msg(body=b""))
    body_len = 4096 - probe.end_offset - leftover - probe.size - RECORD_HEADER_SIZE
    filler = store.put_message(make_msg(body=bytes(body_len)))
    assert filler.end_offset == 4096 - leftover
    after = store.put_message(make_msg(body=b"next segment"))
    assert after.commit_log_offset == 4096
    store.close()
    store = make_store()
    assert store.max_phy_offset == after.end_offset
    assert [m.body for m in read_queue(store, "TopicA", 0)][-1] == b"next segment"


def test_lookup_rejects_offsets_that_are_not_messages(make_store: MakeStore) -> None:
    store = make_store()
    r1 = store.put_message(make_msg(body=b"one"))
    r2 = store.put_message(make_msg(body=b"two"))
    assert store.lookup_message(r2.commit_log_offset).body == b"two"
    for bad in (
        r1.commit_log_offset + 1,
        r2.commit_log_offset + 4,
        r2.end_offset,
        r2.end_offset + 1000,
        -1,
        10**12,
    ):
        with pytest.raises(QueryNotFoundError):
            store.lookup_message(bad)
        with pytest.raises(QueryNotFoundError):
            store.read_message_bytes(bad)


def test_offset_by_time(make_store: MakeStore, clock: FakeClock) -> None:
    store = make_store()
    stamps = []
    for i in range(20):
        clock.advance(1.0)
        stamps.append(store.put_message(make_msg(body=str(i).encode())).store_timestamp)
    assert store.get_offset_by_time("TopicA", 0, stamps[0] - 5000) == 0
    assert store.get_offset_by_time("TopicA", 0, stamps[7]) == 7
    assert store.get_offset_by_time("TopicA", 0, stamps[7] + 1) == 8
    assert store.get_offset_by_time("TopicA", 0, stamps[-1]) == 19
    assert store.get_offset_by_time("TopicA", 0, stamps[-1] + 1) == 20  # none: the max
    assert store.get_offset_by_time("Unknown", 0, 0) == 0


def test_oversized_message_is_rejected_and_nothing_is_written(
    make_store: MakeStore, tmp_path: Path
) -> None:
    store = make_store(max_message_size=1000)
    big = make_msg(body=bytes(1000))
    size = len(encode_message(big))
    with pytest.raises(MessageIllegalError) as err:
        store.put_message(big)
    text = str(err.value)
    assert "exceeds" in text and "1000 bytes" in text and f"{size} bytes" in text
    assert store.max_phy_offset == 0
    assert store.get_max_offset_in_queue("TopicA", 0) == 0
    assert commit_log_files(tmp_path / "store") == []
    ok = store.put_message(make_msg(body=bytes(100)))
    assert ok.commit_log_offset == 0 and ok.queue_offset == 0


def test_put_messages_is_contiguous_and_all_or_nothing(make_store: MakeStore) -> None:
    store = make_store(max_message_size=1000)
    store.put_message(make_msg(body=b"first"))
    before = store.max_phy_offset
    bad_batches = [
        [make_msg(body=b"ok"), make_msg(body=bytes(2000))],
        [make_msg(body=b"ok"), make_msg(topic="no spaces allowed", body=b"x")],
        [make_msg(body=b"ok"), make_msg(body=b"x", queue_id=-3)],
        [make_msg(body=bytes(900)) for _ in range(5)],  # larger than a 4 KiB segment
    ]
    for batch in bad_batches:
        with pytest.raises(MessageIllegalError):
            store.put_messages(batch)
        assert store.max_phy_offset == before
        assert store.get_max_offset_in_queue("TopicA", 0) == 1

    batch = [make_msg(body=f"b{i}".encode(), queue_id=i % 2) for i in range(6)]
    results = store.put_messages(batch)
    for a, b in zip(results, results[1:], strict=False):
        assert a.end_offset == b.commit_log_offset
    assert [r.queue_offset for r in results] == [1, 0, 2, 1, 3, 2]
    assert [m.body for m in read_queue(store, "TopicA", 1)] == [b"b1", b"b3", b"b5"]
    assert store.put_messages([]) == []


def test_batch_that_does_not_fit_the_current_segment_starts_a_new_one(
    make_store: MakeStore,
) -> None:
    store = make_store()
    store.put_message(make_msg(body=bytes(3000)))
    results = store.put_messages([make_msg(body=bytes(500)) for _ in range(4)])
    assert results[0].commit_log_offset == 4096
    assert results[-1].end_offset <= 8192


def test_transaction_types_follow_the_dispatch_rule(make_store: MakeStore) -> None:
    store = make_store()
    f = MessageSysFlag
    kinds = {
        "not": f.TRANSACTION_NOT_TYPE,
        "prepared": f.TRANSACTION_PREPARED_TYPE,
        "commit": f.TRANSACTION_COMMIT_TYPE,
        "rollback": f.TRANSACTION_ROLLBACK_TYPE,
    }
    results = {}
    for name, flag in kinds.items():
        results[name] = store.put_message(make_msg(body=name.encode(), sys_flag=flag))
    assert results["prepared"].queue_offset == 0 and results["rollback"].queue_offset == 0
    assert [m.body for m in read_queue(store, "TopicA", 0)] == [b"not", b"commit"]
    for name, r in results.items():
        assert store.lookup_message(r.commit_log_offset).body == name.encode()


def test_topic_and_queue_validation(make_store: MakeStore) -> None:
    store = make_store()
    for topic in ("", "a/b", "..", "with space", "x" * 256):
        with pytest.raises(MessageIllegalError):
            store.put_message(make_msg(topic=topic))
    long_topic = "%RETRY%" + "g" * 200  # retry topics may be longer than 127 bytes
    store.put_message(make_msg(topic=long_topic, body=b"v2"))
    assert [m.body for m in read_queue(store, long_topic, 0)] == [b"v2"]


def test_flush_moves_the_flushed_offset(make_store: MakeStore) -> None:
    store = make_store()
    assert store.flushed_offset == 0
    r = store.put_message(make_msg())
    assert store.flushed_offset < r.end_offset
    assert store.flush() == r.end_offset == store.flushed_offset == store.max_phy_offset
    assert store.min_phy_offset == 0


def test_flush_from_another_thread_while_appending(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store(mapped_file_size_commit_log=64 * 1024)
    stop = threading.Event()
    errors: list[BaseException] = []
    flushed: list[int] = []

    def flusher() -> None:
        try:
            while not stop.is_set():
                flushed.append(store.flush())
                store.flush_consume_queues()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=flusher)
    t.start()
    try:
        results = [
            store.put_message(make_msg(body=os.urandom(64), queue_id=i % 4)) for i in range(3000)
        ]
    finally:
        stop.set()
        t.join()
    assert not errors
    assert flushed == sorted(flushed)
    assert store.flush() == results[-1].end_offset
    store.close()
    store = make_store()
    assert sum(len(read_queue(store, "TopicA", q)) for q in range(4)) == 3000


def test_second_store_on_the_same_folder_is_refused(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store()
    other = MessageStore(StoreConfig(str(tmp_path / "store")), ("127.0.0.1", 1))
    with pytest.raises(StoreLockedError):
        other.load()
    store.close()
    other.load()  # free again once the first one closed
    other.close()


def test_closed_store_refuses_writes(make_store: MakeStore) -> None:
    store = make_store()
    store.close()
    with pytest.raises(ServiceNotAvailableError):
        store.put_message(make_msg())
    store.close()  # idempotent


def test_config_is_validated(tmp_path: Path) -> None:
    bads: list[dict[str, Any]] = [
        {"mapped_file_size_commit_log": 1000},
        {"mapped_file_size_consume_queue": 210},
        {"max_message_size": 0},
        {"disk_max_used_space_ratio": 101},
        {"disk_refuse_writes_ratio": 0},
        {"disk_full_policy": "delete_everything"},
    ]
    for bad in bads:
        with pytest.raises(ValueError):
            StoreConfig(str(tmp_path), **bad)


def test_failed_write_leaves_nothing_visible(make_store: MakeStore, tmp_path: Path) -> None:
    """Fault injection at the OS level: the active segment's descriptor is swapped for a
    read-only one, so the next pwrite fails as a full or broken disk would."""
    store = make_store()
    ok = store.put_message(make_msg(body=b"before"))
    seg = store._commit_log.segments[-1]
    assert seg.fd is not None
    saved = os.dup(seg.fd)
    readonly = os.open(seg.path, os.O_RDONLY)
    os.dup2(readonly, seg.fd)
    os.close(readonly)
    try:
        with pytest.raises(StoreIOError) as err:
            store.put_message(make_msg(body=b"lost"))
        assert isinstance(err.value, OSError) and "commit log" in str(err.value)
        # the errno and the cause travel with it (the disk-full refusal reads them), also
        # when the store runs compiled
        assert err.value.errno == errno.EBADF and isinstance(err.value.__cause__, OSError)
        assert store.max_phy_offset == ok.end_offset
        assert store.get_max_offset_in_queue("TopicA", 0) == 1
    finally:
        os.dup2(saved, seg.fd)
        os.close(saved)
    again = store.put_message(make_msg(body=b"after"))
    assert again.commit_log_offset == ok.end_offset and again.queue_offset == 1
    assert [m.body for m in read_queue(store, "TopicA", 0)] == [b"before", b"after"]


def test_batch_spanning_several_consume_queue_files(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store(mapped_file_size_commit_log=64 * 1024)  # queue files hold 10 entries
    store.put_message(make_msg(body=b"first"))
    batch = [make_msg(body=f"b{i}".encode()) for i in range(25)]
    results = store.put_messages(batch)
    assert [r.queue_offset for r in results] == list(range(1, 26))
    qdir = tmp_path / "store" / "consumequeue" / "TopicA" / "0"
    assert [f.name for f in sorted(qdir.iterdir())] == [f"{n:020d}" for n in (0, 200, 400)]
    assert [m.body for m in read_queue(store, "TopicA", 0)] == [b"first"] + [
        f"b{i}".encode() for i in range(25)
    ]
    store.close()
    store = make_store()
    assert [m.queue_offset for m in read_queue(store, "TopicA", 0)] == list(range(26))


def test_an_append_of_many_parts_is_written_whole_through_short_writes(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append of more buffers than one pwritev takes is written a chunk at a time, and a
    short write (the kernel may write less than asked) is finished, not lost."""
    real = os.pwritev
    chunks: list[int] = []

    def short_pwritev(fd: int, bufs: list[bytes], offset: int) -> int:
        chunks.append(len(bufs))
        return real(fd, bufs[: len(bufs) // 2], offset)  # about half of what was asked

    monkeypatch.setattr(os, "pwritev", short_pwritev)
    store = make_store(mapped_file_size_commit_log=1 << 20)
    bodies = [f"m{i}-".encode() * (1 + i % 40) for i in range(700)]  # 4 buffers each
    results = store.put_messages([make_msg(body=b) for b in bodies])
    assert len(chunks) == 3 and max(chunks) <= 1024
    assert store.max_phy_offset == results[-1].end_offset
    assert [m.body for m in read_queue(store, "TopicA", 0)] == bodies
    monkeypatch.setattr(os, "pwritev", real)
    store.close()
    # Recovery validates every record (framing and CRC).
    reopened = make_store(mapped_file_size_commit_log=1 << 20)
    assert [m.body for m in read_queue(reopened, "TopicA", 0)] == bodies


def test_put_encoded_stores_what_put_messages_stores(make_store: MakeStore, tmp_path: Path) -> None:
    """The same messages through put_messages and, encoded, through put_encoded: the same
    commit log and consume queues, byte for byte, and the same offsets."""
    long_topic = "T" * 200  # a V2 record (two-byte topic length)

    def batch() -> list[MessageExt]:
        return [
            make_msg(body=b"a", tags="x", KEYS="k"),
            make_msg(body=b"b" * 300, queue_id=2),
            make_msg(body=b"c", sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE),
            make_msg(topic=long_topic, body=b"d", tags="y"),
            make_msg(body=b"e", sys_flag=MessageSysFlag.TRANSACTION_COMMIT_TYPE, region="eu"),
            make_msg(body=b"f", queue_id=2),
        ]

    a = make_store(tmp_path / "a", mapped_file_size_commit_log=1 << 16)
    b = make_store(tmp_path / "b", mapped_file_size_commit_log=1 << 16)
    for _ in range(3):
        results = a.put_messages(batch())
        res = b.put_encoded([encode_for_store(m) for m in batch()])
        assert res.placed == [(r.commit_log_offset, r.size, r.queue_offset) for r in results]
        assert res.end_offset == results[-1].end_offset
        assert res.per_destination == {("TopicA", 0): 3, ("TopicA", 2): 2, (long_topic, 0): 1}
    for q in (("TopicA", 0), ("TopicA", 2), (long_topic, 0)):
        assert [encode_message(m) for m in read_queue(a, *q)] == [
            encode_message(m) for m in read_queue(b, *q)
        ]
    a.close()
    b.close()
    log_a, log_b = commit_log_files(tmp_path / "a"), commit_log_files(tmp_path / "b")
    assert [p.read_bytes() for p in log_a] == [p.read_bytes() for p in log_b]


def test_joined_reads_return_what_separate_reads_return(
    make_store: MakeStore, tmp_path: Path
) -> None:
    # The PULL path reads a batch joined, through views of the mappings; it must agree with the
    # one-by-one reads on every status, offset and byte, across segments, tags, limits, and a
    # record damaged on disk (left out of both, the read going on past it).
    store = make_store()
    puts = [
        store.put_message(make_msg(body=bytes([i]) * (50 + 37 * i), tags="a" if i % 3 else "b"))
        for i in range(40)
    ]
    victim = puts[17]
    seg_start = victim.commit_log_offset // 4096 * 4096
    with open(tmp_path / "store" / "commitlog" / f"{seg_start:020d}", "r+b") as fh:
        fh.seek(victim.commit_log_offset - seg_start + RECORD_HEADER_SIZE + 90)
        fh.write(b"\xee\xee")
    cases = 0
    for offset in (0, 5, 16, 17, 18, 39, 40, 41):
        for max_msgs in (1, 3, 32):
            for max_bytes in (10, 900, 4 * 1024 * 1024):
                for tags in (None, frozenset({tags_code("b")})):
                    a = store.get_messages("TopicA", 0, offset, max_msgs, tags, max_bytes)
                    b = store.get_messages("TopicA", 0, offset, max_msgs, tags, max_bytes, True)
                    assert (a.status, a.next_begin_offset, a.min_offset, a.max_offset) == (
                        b.status,
                        b.next_begin_offset,
                        b.min_offset,
                        b.max_offset,
                    ), (offset, max_msgs, max_bytes, tags)
                    assert b.messages == [] and b.joined == b"".join(a.messages)
                    assert a.count == b.count == len(a.messages)
                    cases += a.count
    assert cases > 0
    r = store.get_messages("TopicA", 0, 16, 3, joined=True)
    got = [m.body for m in decode_messages(r.joined)]
    assert got == [bytes([i]) * (50 + 37 * i) for i in (16, 18, 19)]
    assert r.next_begin_offset == 20
