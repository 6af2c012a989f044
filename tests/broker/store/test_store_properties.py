"""Property tests: arbitrary messages survive put -> close -> load -> get identically, and
arbitrary damage to the commit log never makes the store serve a corrupt message."""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from txmq.broker.store import GetMessageStatus, MessageStore, PutMessageResult, StoreConfig
from txmq.protocol.message import MessageExt, MessageSysFlag, decode_message

_text = st.text(
    st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]), max_size=20
)
_ipv4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t)))

messages = st.builds(
    MessageExt,
    topic=st.from_regex(r"[A-Za-z0-9_%|-]{1,40}", fullmatch=True),
    body=st.binary(max_size=1500),
    queue_id=st.integers(0, 3),
    flag=st.integers(-(2**31), 2**31 - 1),
    sys_flag=st.sampled_from(
        [
            0,
            MessageSysFlag.COMPRESSED,
            MessageSysFlag.TRANSACTION_COMMIT_TYPE,
            MessageSysFlag.TRANSACTION_PREPARED_TYPE,
            MessageSysFlag.TRANSACTION_ROLLBACK_TYPE,
        ]
    ),
    born_timestamp=st.integers(0, 2**62),
    born_host=st.tuples(_ipv4, st.integers(0, 65535)),
    reconsume_times=st.integers(0, 1000),
    prepared_transaction_offset=st.integers(0, 2**62),
    properties=st.dictionaries(_text.filter(bool), _text, max_size=5),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages, min_size=1, max_size=25), st.integers(4096, 16384))
def test_messages_survive_close_and_reload(msgs: list[MessageExt], segment_size: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        cfg = StoreConfig(
            root, mapped_file_size_commit_log=segment_size, mapped_file_size_consume_queue=60
        )
        store = MessageStore(cfg, ("10.9.8.7", 10911), clock=lambda: 1_700_000_000.0)
        store.load()
        originals = [m.copy() for m in msgs]
        results = store.put_messages(msgs[:1]) + [store.put_message(m) for m in msgs[1:]]
        store.close()

        store = MessageStore(cfg, ("10.9.8.7", 10911))
        store.load()
        try:
            queues: dict[tuple[str, int], list[bytes]] = {}
            for orig, r in zip(originals, results, strict=True):
                got = store.lookup_message(r.commit_log_offset)
                assert (got.topic, got.body, got.queue_id, got.flag, got.sys_flag) == (
                    orig.topic,
                    orig.body,
                    orig.queue_id,
                    orig.flag,
                    orig.sys_flag,
                )
                assert (got.born_timestamp, got.born_host, got.reconsume_times) == (
                    orig.born_timestamp,
                    orig.born_host,
                    orig.reconsume_times,
                )
                assert got.prepared_transaction_offset == orig.prepared_transaction_offset
                assert got.properties == orig.properties
                assert (got.store_timestamp, got.store_host) == (
                    1_700_000_000_000,
                    ("10.9.8.7", 10911),
                )
                assert (got.commit_log_offset, got.queue_offset) == (
                    r.commit_log_offset,
                    r.queue_offset,
                )
                tx = orig.sys_flag & MessageSysFlag.TRANSACTION_MASK
                if tx in (0, MessageSysFlag.TRANSACTION_COMMIT_TYPE):
                    queues.setdefault((orig.topic, orig.queue_id), []).append(
                        store.read_message_bytes(r.commit_log_offset)
                    )
            for (topic, qid), raws in queues.items():
                got_raw = store.get_messages(topic, qid, 0, 100).messages
                assert got_raw == raws
                assert [decode_message(b).queue_offset for b in got_raw] == list(range(len(raws)))
            assert store.topics() == sorted({t for t, _ in queues})
        finally:
            store.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 1200), min_size=1, max_size=20),
    checkpoint_after=st.integers(0, 20),
    in_tail=st.booleans(),
    where=st.floats(0.0, 1.0, exclude_max=True),
    garbage=st.binary(min_size=1, max_size=64),
)
def test_damage_is_cut_or_skipped_and_nothing_corrupt_is_served(
    sizes: list[int], checkpoint_after: int, in_tail: bool, where: float, garbage: bytes
) -> None:
    """Bytes of the commit log are changed at a random place.

    Wherever the damage is -- in the tail after the checkpoint (what a crash tears) or below it
    (data fsynced long ago, damaged by a failing disk) -- reads skip exactly the damaged
    messages: the intact records after the damage stay (only a tail with nothing intact after
    it is cut).  Recovery never fails, and every message served is exactly as written."""
    with tempfile.TemporaryDirectory() as root:
        cfg = StoreConfig(
            root + "/s", mapped_file_size_commit_log=4096, mapped_file_size_consume_queue=100
        )
        store = MessageStore(cfg, ("10.9.8.7", 10911))
        store.load()
        written: dict[int, tuple[PutMessageResult, bytes]] = {}
        checkpoint = 0
        for i, size in enumerate(sizes):
            r = store.put_message(MessageExt(topic="T", body=bytes([i]) * size, queue_id=i % 2))
            written[r.commit_log_offset] = (r, store.read_message_bytes(r.commit_log_offset))
            if i + 1 == checkpoint_after:
                store.flush_consume_queues()
                checkpoint = r.end_offset
        end = store.max_phy_offset
        image = root + "/image"
        shutil.copytree(root + "/s", image)
        store.close()
        os.unlink(image + "/lock")

        if in_tail:
            pos = checkpoint + int(where * (end - checkpoint))
        else:
            assume(checkpoint > 0)
            pos = int(where * checkpoint)
            garbage = garbage[: checkpoint - pos]  # stays below the checkpoint
        seg_start = pos // 4096 * 4096
        with open(f"{image}/commitlog/{seg_start:020d}", "r+b") as fh:
            fh.seek(pos - seg_start)
            old = fh.read(min(len(garbage), 4096 - (pos - seg_start)))
            fh.seek(pos - seg_start)
            fh.write(bytes(a ^ (b or 0x55) for a, b in zip(old, garbage, strict=False)))
        damage_end = pos + len(old)

        recovered = MessageStore(
            StoreConfig(
                image, mapped_file_size_commit_log=4096, mapped_file_size_consume_queue=100
            ),
            ("10.9.8.7", 10911),
        )
        recovered.load()
        try:
            for off, (r, raw) in written.items():
                if r.end_offset <= pos:  # before the damage: intact
                    assert recovered.read_message_bytes(off) == raw
            served: list[int] = []
            for qid in (0, 1):
                # where a consumer starts (a queue whose first messages were damaged starts
                # after them: their offsets are not reused)
                offset = recovered.get_min_offset_in_queue("T", qid)
                while True:
                    g = recovered.get_messages("T", qid, offset, 7)
                    if g.status is GetMessageStatus.OFFSET_FOUND_NULL:
                        offset = g.next_begin_offset
                        continue
                    if g.status is not GetMessageStatus.FOUND:
                        break
                    for raw in g.messages:
                        m = decode_message(raw)
                        assert written[m.commit_log_offset][1] == raw  # exactly as written
                        assert m.queue_offset >= offset
                        served.append(m.commit_log_offset)
                        offset = m.queue_offset + 1
                    offset = g.next_begin_offset
                assert offset == recovered.get_max_offset_in_queue("T", qid)
            damaged = {
                off for off, (r, _) in written.items() if off < damage_end and r.end_offset > pos
            }
            # Damage costs only the damaged messages, in the tail after the checkpoint too:
            # the scan resumes at the next intact record (each names its own offset); only a
            # tail with nothing intact after the damage is cut.
            assert sorted(served) == sorted(set(written) - damaged)
            last = max(written)
            if last not in damaged:
                assert recovered.max_phy_offset == end
            else:
                assert recovered.max_phy_offset <= end
            # and the recovered store takes new messages
            r = recovered.put_message(MessageExt(topic="T", body=b"new", queue_id=0))
            assert recovered.lookup_message(r.commit_log_offset).body == b"new"
        finally:
            recovered.close()
