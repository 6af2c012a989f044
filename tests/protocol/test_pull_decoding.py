"""A pull answer decoded in one loop (``decode_messages``) gives what decoding each record on
its own (``_decode_at``, the general decoder) gives: the same messages, or the same error."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.protocol.errors import ProtocolError
from txmq.protocol.message import MessageExt, _decode_at, decode_messages, encode_message

_text = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]))
_hosts = st.tuples(
    st.tuples(*[st.integers(0, 255)] * 4).map(lambda q: ".".join(map(str, q))),
    st.integers(0, 65535),
)
_i32 = st.integers(-(1 << 31), (1 << 31) - 1)
_i64 = st.integers(-(1 << 63), (1 << 63) - 1)

_messages = st.builds(
    MessageExt,
    topic=st.one_of(
        st.sampled_from(["orders", "TBW102", "t"]),
        st.text("abcXYZ019_-%|", min_size=1, max_size=300),  # long ones: two-byte length
    ),
    body=st.binary(max_size=64),
    queue_id=_i32,
    flag=_i32,
    queue_offset=_i64,
    commit_log_offset=_i64,
    sys_flag=st.integers(0, (1 << 31) - 1),
    born_timestamp=_i64,
    born_host=_hosts,
    store_timestamp=_i64,
    store_host=_hosts,
    reconsume_times=_i32,
    prepared_transaction_offset=_i64,
    properties=st.dictionaries(
        _text.filter(bool).map(lambda s: s[:20]), _text.map(lambda s: s[:20]), max_size=4
    ),
)


def _one_by_one(buf: bytes) -> list[MessageExt]:
    """The general decoder, record after record."""
    out = []
    pos = 0
    while pos < len(buf):
        m = _decode_at(buf, pos)
        out.append(m)
        pos += m.store_size
    return out


def _outcome(decode: object, buf: bytes) -> object:
    try:
        return [(m, m.store_size, m.body_crc) for m in decode(buf)]  # type: ignore[operator]
    except ProtocolError as exc:
        return ("error", str(exc))


@settings(max_examples=300, deadline=None)
@given(msgs=st.lists(_messages, max_size=6))
def test_a_pull_body_decodes_as_its_records_one_by_one(msgs: list[MessageExt]) -> None:
    buf = b"".join(encode_message(m) for m in msgs)
    fast = decode_messages(buf)
    assert fast == _one_by_one(buf)
    assert [m.store_size for m in fast] == [len(encode_message(m)) for m in msgs]
    for got, sent in zip(fast, msgs, strict=True):
        assert got.body == sent.body and got.properties == sent.properties
        assert (got.born_host, got.store_host) == (sent.born_host, sent.store_host)
    assert decode_messages(memoryview(buf)) == fast


@settings(max_examples=500, deadline=None)
@given(
    msgs=st.lists(_messages, min_size=1, max_size=3),
    cuts=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=3),
    truncate=st.integers(0, 10_000),
)
def test_a_damaged_pull_body_fails_or_decodes_as_the_general_decoder_says(
    msgs: list[MessageExt], cuts: list[tuple[int, int]], truncate: int
) -> None:
    buf = bytearray(b"".join(encode_message(m) for m in msgs))
    for at, value in cuts:
        buf[at % len(buf)] = value
    damaged = bytes(buf[: max(1, len(buf) - truncate % 8)])
    assert _outcome(decode_messages, damaged) == _outcome(_one_by_one, damaged)
