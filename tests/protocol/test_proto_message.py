"""Messages: properties codec, stored-message layout, batches, ids, tag hashes, subscriptions."""

from __future__ import annotations

import pickle
import re
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txmq.protocol.errors import ProtocolError
from txmq.protocol.message import (
    FIXED_SIZE,
    POS_PHYSICAL_OFFSET,
    POS_QUEUE_OFFSET,
    POS_STORE_TIMESTAMP,
    Message,
    MessageConst,
    MessageExt,
    MessageSysFlag,
    UniqIdGenerator,
    create_offset_msg_id,
    decode_batch,
    decode_message,
    decode_messages,
    decode_offset_msg_id,
    encode_batch,
    encode_message,
    java_string_hash,
    parse_subscription,
    properties_to_string,
    string_to_properties,
    tags_code,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Property text: anything UTF-8 can carry except the two separators.
prop_text = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters="\x01\x02"), max_size=20
)
properties = st.dictionaries(prop_text, prop_text, max_size=8)

ipv4 = st.ip_addresses(v=4).map(str)
hosts = st.tuples(ipv4, st.integers(0, 65535))
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
# Topics of any length up to 255 UTF-8 bytes (V1 up to 127, V2 beyond).
topics = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=100).filter(
    lambda t: len(t.encode()) <= 255
)

messages = st.builds(
    MessageExt,
    topic=topics,
    body=st.binary(max_size=200),
    queue_id=i32,
    flag=i32,
    queue_offset=i64,
    commit_log_offset=i64,
    # IPv6 host bits are refused; every other bit is carried as is.
    sys_flag=i32.map(lambda f: f & ~(MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOST_V6)),
    born_timestamp=i64,
    born_host=hosts,
    store_timestamp=i64,
    store_host=hosts,
    reconsume_times=i32,
    prepared_transaction_offset=i64,
    properties=properties,
)


def stored(m: MessageExt, raw: bytes) -> MessageExt:
    """What decoding ``raw`` must give: ``m`` plus the fields the encoder computes."""
    return m.copy(body_crc=zlib.crc32(m.body) & 0x7FFFFFFF, store_size=len(raw))


# --- properties -------------------------------------------------------------------------------


@SETTINGS
@given(props=properties)
def test_properties_round_trip(props: dict[str, str]) -> None:
    s = properties_to_string(props)
    assert s.count("\x02") == len(props)
    assert string_to_properties(s) == props


def test_properties_format() -> None:
    assert properties_to_string({"TAGS": "a", "KEYS": "k1 k2"}) == "TAGS\x01a\x02KEYS\x01k1 k2\x02"
    assert properties_to_string({}) == ""
    assert string_to_properties(None) == {}
    assert string_to_properties("") == {}


@pytest.mark.parametrize(
    "props",
    [{"a\x01": "v"}, {"a": "v\x01"}, {"a\x02": "v"}, {"a": "x\x02y"}],
    ids=["key-nv-sep", "value-nv-sep", "key-prop-sep", "value-prop-sep"],
)
def test_separators_are_rejected(props: dict[str, str]) -> None:
    with pytest.raises(ProtocolError, match="separator"):
        properties_to_string(props)


def test_string_to_properties_is_lenient_like_rocketmq() -> None:
    # No trailing separator, and an item without a name/value separator is skipped.
    assert string_to_properties("A\x011\x02junk\x02B\x012") == {"A": "1", "B": "2"}


# --- stored messages --------------------------------------------------------------------------


@SETTINGS
@given(m=messages)
def test_encode_decode_message_round_trip(m: MessageExt) -> None:
    raw = encode_message(m)
    assert struct.unpack_from(">i", raw)[0] == len(raw)
    assert decode_message(raw) == stored(m, raw)


@SETTINGS
@given(ms=st.lists(messages, min_size=0, max_size=5))
def test_decode_messages_of_several(ms: list[MessageExt]) -> None:
    raws = [encode_message(m) for m in ms]
    got = decode_messages(b"".join(raws))
    assert got == [stored(m, r) for m, r in zip(ms, raws, strict=True)]


@SETTINGS
@given(ms=st.lists(messages, min_size=1, max_size=3), lead=st.binary(max_size=10))
def test_decode_message_at_an_offset_and_from_a_memoryview(
    ms: list[MessageExt], lead: bytes
) -> None:
    buf = bytearray(lead)
    positions = []
    for m in ms:
        positions.append(len(buf))
        buf += encode_message(m)
    view = memoryview(bytes(buf))
    for pos, m in zip(positions, ms, strict=True):
        assert decode_message(view, pos).topic == m.topic


def test_patch_positions_match_the_layout() -> None:
    # The broker patches these fields in place when it stores a message.
    m = MessageExt(
        topic="T", body=b"x", queue_offset=0x1111, commit_log_offset=0x2222, store_timestamp=0x3333
    )
    raw = encode_message(m)
    assert FIXED_SIZE == 88
    assert struct.unpack_from(">q", raw, POS_QUEUE_OFFSET)[0] == 0x1111
    assert struct.unpack_from(">q", raw, POS_PHYSICAL_OFFSET)[0] == 0x2222
    assert struct.unpack_from(">q", raw, POS_STORE_TIMESTAMP)[0] == 0x3333


def test_topic_over_255_bytes_is_refused() -> None:
    with pytest.raises(ProtocolError):
        encode_message(MessageExt(topic="t" * 256, body=b""))


def test_ipv6_flags_are_refused_on_decode() -> None:
    raw = bytearray(encode_message(MessageExt(topic="T", body=b"")))
    struct.pack_into(">i", raw, 36, MessageSysFlag.BORNHOST_V6)
    with pytest.raises(ProtocolError, match="IPv6"):
        decode_message(bytes(raw))


@SETTINGS
@given(m=messages, data=st.data())
def test_truncated_or_corrupted_message_raises_only_protocol_error(
    m: MessageExt, data: st.DataObject
) -> None:
    raw = bytearray(encode_message(m))
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(ProtocolError):
        decode_message(bytes(raw[:cut]))
    for pos in data.draw(st.lists(st.integers(0, len(raw) - 1), max_size=6)):
        raw[pos] = data.draw(st.integers(0, 255))
    try:
        decode_message(bytes(raw))
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(garbage=st.binary(max_size=300))
def test_garbage_message_bodies_raise_only_protocol_error(garbage: bytes) -> None:
    try:
        decode_messages(garbage)
    except ProtocolError:
        pass
    try:
        decode_batch(garbage)
    except ProtocolError:
        pass


def test_message_ext_views() -> None:
    m = MessageExt(
        topic="T",
        body=b"",
        store_host=("10.0.0.2", 10911),
        commit_log_offset=4,
        properties={"TAGS": "a", "KEYS": "k", "UNIQ_KEY": "U" * 32, "region": "eu"},
    )
    assert (m.tags, m.keys) == ("a", "k")
    assert m.msg_id == "U" * 32
    assert m.transaction_id == "U" * 32
    assert m.offset_msg_id == "0A00000200002A9F0000000000000004"
    assert m.user_properties == {"region": "eu"}
    no_uniq = m.copy(properties={})
    assert no_uniq.msg_id == no_uniq.offset_msg_id
    assert m.copy(properties={**m.properties, "__transactionId__": "X"}).transaction_id == "X"
    m.copy().properties["x"] = "y"
    assert "x" not in m.properties


def test_decoded_message_parses_its_properties_on_first_read() -> None:
    m = MessageExt(
        topic="T",
        body=b"payload",
        queue_offset=7,
        properties={"UNIQ_KEY": "U" * 32, "region": "eu"},
    )
    raw = encode_message(m)
    got = decode_message(raw)
    assert got.store_size == len(raw)
    assert got == m.copy(body_crc=zlib.crc32(m.body) & 0x7FFFFFFF, store_size=len(raw))
    assert "region" in repr(got) and "payload" in repr(got)
    assert got.properties == {"UNIQ_KEY": "U" * 32, "region": "eu"}
    got.properties["added"] = "1"  # the parsed dict is kept: changes stay
    assert got.get_property("added") == "1"
    got.properties = {"TAGS": "t"}
    assert (got.tags, got.user_properties) == ("t", {})
    assert pickle.loads(pickle.dumps(got)) == got
    lazy = MessageExt("T", b"", wire_properties="KEYS\x01k\x02")
    assert lazy.keys == "k"
    assert MessageExt(
        "T", b"", properties={"a": "b"}, wire_properties="KEYS\x01k\x02"
    ).properties == {"a": "b"}
    assert m != got and m.copy() == m


def test_message_wire_properties() -> None:
    msg = Message(
        "orders", "é", tags="created", keys="order-1", properties={"region": "eu"}, delay_level=3
    )
    assert msg.body == "é".encode()
    assert msg.wire_properties() == {
        "region": "eu",
        MessageConst.TAGS: "created",
        MessageConst.KEYS: "order-1",
        MessageConst.DELAY: "3",
    }
    assert Message("t").wire_properties() == {}


def test_sys_flag_transaction_bits() -> None:
    assert MessageSysFlag.transaction_value(0x4 | 0x1) == MessageSysFlag.TRANSACTION_PREPARED_TYPE
    flag = MessageSysFlag.reset_transaction_value(0x4 | 0x1, MessageSysFlag.TRANSACTION_COMMIT_TYPE)
    assert flag == 0x8 | 0x1
    assert MessageSysFlag.transaction_value(0xC) == MessageSysFlag.TRANSACTION_ROLLBACK_TYPE


# --- batches ----------------------------------------------------------------------------------


@SETTINGS
@given(batch=st.lists(st.tuples(st.binary(max_size=100), i32, properties), max_size=6))
def test_batch_round_trip(batch: list[tuple[bytes, int, dict[str, str]]]) -> None:
    assert decode_batch(encode_batch(batch)) == batch


def test_truncated_batch_raises_protocol_error() -> None:
    raw = encode_batch([(b"hello", 0, {"a": "b"})])
    for cut in range(1, len(raw)):
        with pytest.raises(ProtocolError):
            decode_batch(raw[:cut])


# --- ids --------------------------------------------------------------------------------------


@SETTINGS
@given(host=hosts, offset=st.integers(0, 2**63 - 1))
def test_offset_msg_id_round_trip(host: tuple[str, int], offset: int) -> None:
    msg_id = create_offset_msg_id(host, offset)
    assert re.fullmatch(r"[0-9A-F]{32}", msg_id)
    assert decode_offset_msg_id(msg_id) == (host, offset)
    assert decode_offset_msg_id(msg_id.lower()) == (host, offset)


@pytest.mark.parametrize(
    "bad", ["", "XYZ", "0A" * 15, "0A" * 17, "0A00000200002A9F000000000000000G"]
)
def test_bad_offset_msg_id(bad: str) -> None:
    with pytest.raises(ProtocolError):
        decode_offset_msg_id(bad)


def test_uniq_ids_are_32_hex_and_unique() -> None:
    gen = UniqIdGenerator(ip="10.1.2.3")
    ids = [gen.next_id() for _ in range(10_000)]
    assert all(re.fullmatch(r"[0-9A-F]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)
    # MessageClientIDSetter: IP (4 bytes) + pid (2) + a per-process value (4), then time and
    # counter.  The prefix is the same for every id of one generator.
    assert {i[:20] for i in ids} == {ids[0][:20]}
    assert ids[0].startswith("0A010203")


def test_uniq_ids_of_two_generators_differ() -> None:
    a, b = UniqIdGenerator(ip="10.1.2.3"), UniqIdGenerator(ip="10.1.2.3")
    assert a.next_id()[:20] != b.next_id()[:20]  # per-process random part


def test_uniq_id_time_part_is_ms_since_month_start() -> None:
    import time

    gen = UniqIdGenerator(ip="127.0.0.1")
    before = time.time()
    uid = gen.next_id()
    t = time.localtime(before)
    month_start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))
    diff = int(uid[20:28], 16)
    assert abs(diff - (before - month_start) * 1000) < 5_000


# --- tags -------------------------------------------------------------------------------------

# Java's String.hashCode: s[0]*31^(n-1) + s[1]*31^(n-2) + ... + s[n-1], in 32-bit two's
# complement over UTF-16 code units.  Worked by hand:
#   "TagA":  T=84, a=97, g=103, A=65 -> ((84*31 + 97)*31 + 103)*31 + 65 = 2598919
#   "hello": ((((104*31 + 101)*31 + 108)*31 + 108)*31 + 111) = 99162322
#   "":      0
#   "polygenelubricants": the well-known string whose hash is Integer.MIN_VALUE
#   "\U0001F600" (one code point, two UTF-16 units 0xD83D 0xDE00): 0xD83D*31 + 0xDE00 = 1772899
JAVA_HASHES = [
    ("TagA", 2598919),
    ("hello", 99162322),
    ("", 0),
    ("polygenelubricants", -2147483648),
    ("\U0001f600", 1772899),
]


@pytest.mark.parametrize(("s", "expected"), JAVA_HASHES)
def test_java_string_hash(s: str, expected: int) -> None:
    assert java_string_hash(s) == expected


@SETTINGS
@given(s=st.text(st.characters(blacklist_categories=["Cs"]), max_size=50))
def test_java_string_hash_matches_the_formula(s: str) -> None:
    units = struct.unpack(f">{len(s.encode('utf-16-be')) // 2}H", s.encode("utf-16-be"))
    h = 0
    for u in units:
        h = (h * 31 + u) % 2**32
    expected = h - 2**32 if h >= 2**31 else h
    assert java_string_hash(s) == expected


def test_tags_code() -> None:
    assert tags_code(None) == 0
    assert tags_code("") == 0
    assert tags_code("TagA") == 2598919


# --- subscriptions ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (None, None),
        ("", None),
        ("*", None),
        (" * ", None),
        ("TagA", frozenset({"TagA"})),
        ("TagA || TagB", frozenset({"TagA", "TagB"})),
        ("TagA||TagB|| TagC ", frozenset({"TagA", "TagB", "TagC"})),
        ("TagA || ", frozenset({"TagA"})),
        ("||", None),
    ],
)
def test_parse_subscription(expr: str | None, expected: frozenset[str] | None) -> None:
    assert parse_subscription(expr) == expected
