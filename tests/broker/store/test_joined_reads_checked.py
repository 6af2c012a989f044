"""Records read together for a pull are checked one by one as a single read checks them: any
entry that names no intact record (a damaged consume-queue entry: a wrong offset, a size cut or
made negative, past the end of the log) makes the joined read give up (None), never raise and
never serve bytes that are not a record; intact entries across segments read back whole."""

from __future__ import annotations

from collections.abc import Callable

from store_helpers import make_msg

from txmq.broker.store import MessageStore

MakeStore = Callable[..., MessageStore]


def test_joined_reads_check_every_entry(make_store: MakeStore) -> None:
    store = make_store(mapped_file_size_commit_log=4096)
    puts = [
        store.put_message(make_msg(body=bytes([65 + i % 26]) * (40 + 61 * i))) for i in range(30)
    ]
    cl = store._commit_log
    entries = [(r.commit_log_offset, r.size) for r in puts]
    assert len({r.commit_log_offset // 4096 for r in puts}) > 3  # several segments
    whole = cl.read_payloads(entries)
    singles = [cl.read_payload(o, s) for o, s in entries]
    assert whole is not None and all(p is not None for p in singles)
    assert whole == b"".join(bytes(p) for p in singles if p is not None)
    end = cl.write_pos
    o5, s5 = entries[5]
    for bad in (
        (o5, -12),  # a negative size: before the record, inside its segment's view
        (o5, -5000),
        (o5, s5 - 1),
        (o5, s5 + 1),
        (o5 + 4, s5),  # not where a record starts
        (end, s5),  # past the end of the log
        (end - 20, s5),
        (-1, s5),
        (o5 + 8192, -8192),  # out of the segment, its end inside: a corrupt pair
        (end + 100_000, -100_000),
        (entries[-1][0], 4096),  # runs past the end of the log
    ):
        mixed = [*entries[:5], bad, *entries[6:]]
        assert cl.read_payloads(mixed) is None, bad
        assert cl.read_payloads([bad]) is None, bad
    assert cl.read_payloads(entries[7:12]) == b"".join(bytes(p) for p in singles[7:12] if p)
