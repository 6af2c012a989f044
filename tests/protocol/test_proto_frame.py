"""Frame codec: round trips for the three serialize types, arbitrary chunking of the stream, and
garbage input that may raise nothing but ProtocolError."""

from __future__ import annotations

import json
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from txmq.protocol.codes import LanguageCode, RequestCode, SerializeType
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import FrameTooLargeError, MalformedFrameError, ProtocolError
from txmq.protocol.frame import FrameDecoder, decode_frame, encode_frame

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text that UTF-8 can carry (no lone surrogates).
text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)
i16 = st.integers(-(2**15), 2**15 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
languages = st.sampled_from(list(LanguageCode))
bodies = st.binary(max_size=300)


def string_ext() -> st.SearchStrategy[dict[str, str]]:
    return st.dictionaries(text, text, max_size=8)


def native_ext() -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(text, st.one_of(i64, st.booleans(), text), max_size=8)


@st.composite
def commands(draw: st.DrawFn, st_type: SerializeType | None = None) -> RemotingCommand:
    """A command that the given serialize type can carry exactly."""
    if st_type is None:
        st_type = draw(st.sampled_from(list(SerializeType)))
    if st_type == SerializeType.ROCKETMQ:
        # RocketMQSerializable: code i16, language u8, version i16, opaque i32, flag i32.
        code, version, opaque, flag = draw(i16), draw(i16), draw(i32), draw(i32)
        language = draw(st.integers(0, 255))
        ext: dict[str, Any] = draw(string_ext())
    elif st_type == SerializeType.JSON:
        code, version, opaque, flag = draw(i64), draw(i64), draw(i64), draw(i64)
        language = draw(languages)  # JSON carries the name, so only known languages survive
        ext = draw(string_ext())
    else:
        code, version, opaque, flag = draw(i64), draw(i64), draw(i64), draw(i64)
        language = draw(i64)
        ext = draw(native_ext())
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        remark=draw(st.none() | text),
        ext_fields=ext,
        body=draw(bodies),
        language=int(language),
        version=version,
        serialize_type=st_type,
    )


def expected_after_round_trip(cmd: RemotingCommand) -> RemotingCommand:
    """What the decoder must give back: RocketMQ's binary form writes an empty remark as length
    0, which reads back as null (``RocketMQSerializable.readStr``)."""
    if cmd.serialize_type == SerializeType.ROCKETMQ and cmd.remark == "":
        return RemotingCommand(**{**_as_dict(cmd), "remark": None})
    return cmd


def _as_dict(cmd: RemotingCommand) -> dict[str, Any]:
    return {name: getattr(cmd, name) for name in RemotingCommand.__dataclass_fields__}


def drain(dec: FrameDecoder) -> list[RemotingCommand]:
    out = []
    while (cmd := dec.next_command()) is not None:
        out.append(cmd)
    return out


# --- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("st_type", list(SerializeType), ids=lambda s: s.name)
@SETTINGS
@given(data=st.data())
def test_round_trip_each_serialize_type(st_type: SerializeType, data: st.DataObject) -> None:
    cmd = data.draw(commands(st_type))
    frame = encode_frame(cmd)
    (length,) = struct.unpack_from(">I", frame)
    assert length == len(frame) - 4
    assert frame[4] == int(st_type)
    assert decode_frame(frame) == expected_after_round_trip(cmd)


@SETTINGS
@given(ext=native_ext(), st_type=st.sampled_from([SerializeType.JSON, SerializeType.ROCKETMQ]))
def test_string_encodings_stringify_native_values(
    ext: dict[str, Any], st_type: SerializeType
) -> None:
    cmd = RemotingCommand(code=10, ext_fields=ext, serialize_type=st_type)
    got = decode_frame(encode_frame(cmd)).ext_fields
    want = {
        k: ("true" if v else "false") if isinstance(v, bool) else str(v) for k, v in ext.items()
    }
    assert got == want
    assert all(isinstance(v, str) for v in got.values())


def test_msgpack_keeps_native_values() -> None:
    cmd = RemotingCommand(code=10, ext_fields={"queueId": 3, "batch": True, "topic": "T"})
    got = decode_frame(encode_frame(cmd)).ext_fields
    assert got == {"queueId": 3, "batch": True, "topic": "T"}
    assert type(got["queueId"]) is int and type(got["batch"]) is bool


def test_none_ext_values_are_left_out_in_every_encoding() -> None:
    for st_type in SerializeType:
        cmd = RemotingCommand(code=10, ext_fields={"a": None, "b": "x"}, serialize_type=st_type)
        assert decode_frame(encode_frame(cmd)).ext_fields == {"b": "x"}


def test_json_unknown_language_name_reads_as_other() -> None:
    header = json.dumps({"code": 10, "language": "COBOL", "opaque": 5}).encode()
    frame = struct.pack(">II", 4 + len(header), len(header)) + header
    cmd = decode_frame(frame)
    assert (cmd.code, cmd.opaque, cmd.language) == (10, 5, LanguageCode.OTHER)


def test_json_language_may_be_a_number() -> None:
    header = json.dumps({"code": 10, "language": 3}).encode()
    frame = struct.pack(">II", 4 + len(header), len(header)) + header
    assert decode_frame(frame).language == LanguageCode.PYTHON


def test_rocketmq_encoding_refuses_values_it_cannot_carry() -> None:
    cmd = RemotingCommand(code=70000, serialize_type=SerializeType.ROCKETMQ)
    with pytest.raises(ProtocolError):
        encode_frame(cmd)


def test_decode_frame_wants_exactly_one_frame() -> None:
    frame = encode_frame(RemotingCommand(code=10))
    with pytest.raises(ProtocolError):
        decode_frame(frame + frame)
    with pytest.raises(ProtocolError):
        decode_frame(frame[:-1])


# --- chunking ---------------------------------------------------------------------------------


@SETTINGS
@given(cmds=st.lists(commands(), min_size=1, max_size=6), data=st.data())
def test_arbitrary_chunking_gives_back_the_same_commands(
    cmds: list[RemotingCommand], data: st.DataObject
) -> None:
    stream = b"".join(encode_frame(c) for c in cmds)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(stream) - 1)), max_size=30)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert b"".join(pieces) == stream

    dec = FrameDecoder()
    got: list[RemotingCommand] = []
    for piece in pieces:
        dec.feed(piece)
        got.extend(drain(dec))
    assert got == [expected_after_round_trip(c) for c in cmds]
    assert dec.buffered == 0


@SETTINGS
@given(
    sizes=st.lists(
        st.sampled_from([0, 7, 65_535, 65_536, 70_001, 300_000]), min_size=1, max_size=5
    ),
    data=st.data(),
)
def test_large_bodies_come_back_whole_whatever_the_chunking(
    sizes: list[int], data: st.DataObject
) -> None:
    # Bodies of 64 KiB and more are collected chunk by chunk once their header is in; a chunk
    # may end a body and start the next frame.
    cmds = [
        RemotingCommand(code=11, opaque=i, ext_fields={"n": str(i)}, body=bytes([i % 251]) * n)
        for i, n in enumerate(sizes)
    ]
    stream = b"".join(encode_frame(c) for c in cmds)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(stream) - 1), max_size=40)))
    dec = FrameDecoder()
    got: list[RemotingCommand] = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        dec.feed(stream[a:b])
        assert dec.buffered <= len(stream)
        got.extend(drain(dec))
    assert got == [expected_after_round_trip(c) for c in cmds]
    assert dec.buffered == 0


def test_large_frame_with_a_bad_header_is_refused_and_the_stream_goes_on() -> None:
    header = b"\xc1\xc1\xc1"
    body = b"b" * 200_000
    bad = struct.pack(">II", 4 + len(header) + len(body), (2 << 24) | len(header)) + header
    good = RemotingCommand(code=10, opaque=3, body=b"g" * 100_000)
    stream = bad + body + encode_frame(good)
    dec = FrameDecoder()
    got: list[RemotingCommand] = []
    errors = 0
    for i in range(0, len(stream), 65_536):
        dec.feed(stream[i : i + 65_536])
        while True:
            try:
                cmd = dec.next_command()
            except MalformedFrameError:
                errors += 1
                continue
            if cmd is None:
                break
            got.append(cmd)
    assert errors == 1
    assert got == [expected_after_round_trip(good)]
    assert dec.buffered == 0


def test_byte_at_a_time() -> None:
    cmds = [
        RemotingCommand(code=10, opaque=1, ext_fields={"topic": "T"}, body=b"x" * 50),
        RemotingCommand(code=0, opaque=1, flag=1, remark="ok", serialize_type=SerializeType.JSON),
        RemotingCommand(code=11, opaque=2, serialize_type=SerializeType.ROCKETMQ),
    ]
    stream = b"".join(encode_frame(c) for c in cmds)
    dec = FrameDecoder()
    got = []
    for i in range(len(stream)):
        dec.feed(stream[i : i + 1])
        got.extend(drain(dec))
    assert got == cmds


# --- garbage ----------------------------------------------------------------------------------


def consume_all(data: bytes, max_frame_size: int = 4096) -> int:
    """Feed ``data`` and pull commands until the decoder needs more bytes or refuses the stream.

    Only ProtocolError may escape ``next_command``; the test fails on anything else.  Returns the
    number of commands decoded.
    """
    dec = FrameDecoder(max_frame_size=max_frame_size)
    dec.feed(data)
    decoded = 0
    for _ in range(len(data) + 2):  # every step consumes bytes, so this bounds the loop
        try:
            cmd = dec.next_command()
        except FrameTooLargeError:
            return decoded
        except MalformedFrameError:
            continue
        except ProtocolError as exc:  # pragma: no cover - fails the test with a clear message
            pytest.fail(f"unexpected ProtocolError subclass {type(exc).__name__}: {exc}")
        if cmd is None:
            return decoded
        assert isinstance(cmd, RemotingCommand)
        decoded += 1
    pytest.fail("decoder did not make progress")


@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=600))
def test_random_bytes_raise_only_protocol_error(data: bytes) -> None:
    consume_all(data)


@st.composite
def framed_garbage(draw: st.DrawFn) -> bytes:
    """Well-delimited frames of any serialize type byte whose header is random bytes."""
    # Mostly the three real types, so the garbage reaches each header decoder.
    st_byte = draw(st.one_of(st.sampled_from([0, 1, 2]), st.integers(0, 255)))
    header = draw(st.binary(max_size=200))
    body = draw(st.binary(max_size=20))
    hlen = draw(st.one_of(st.just(len(header)), st.integers(0, 0xFFFFFF)))
    return struct.pack(">II", 4 + len(header) + len(body), (st_byte << 24) | hlen) + header + body


@settings(max_examples=400, deadline=None)
@given(frames=st.lists(framed_garbage(), min_size=1, max_size=4))
def test_framed_garbage_headers_raise_only_protocol_error(frames: list[bytes]) -> None:
    consume_all(b"".join(frames))


@st.composite
def corrupted_frames(draw: st.DrawFn) -> bytes:
    """A valid frame with bytes of its header (after the length prefix) overwritten."""
    frame = bytearray(encode_frame(draw(commands())))
    hlen = struct.unpack_from(">I", frame, 4)[0] & 0xFFFFFF
    positions = draw(st.lists(st.integers(4, 7 + hlen), min_size=1, max_size=8))
    for pos in positions:
        frame[pos] = draw(st.integers(0, 255))
    return bytes(frame)


@settings(max_examples=500, deadline=None)
@given(frame=corrupted_frames())
def test_corrupted_valid_frames_raise_only_protocol_error(frame: bytes) -> None:
    consume_all(frame, max_frame_size=1 << 20)


# Headers that are valid for their container format (msgpack / JSON) but not as remoting
# headers: the decoder must turn them into MalformedFrameError, not TypeError or KeyError.
STRUCTURED_GARBAGE: list[tuple[int, bytes]] = [
    (2, msgpack.packb([1, 2, 3])),
    (2, msgpack.packb({"language": 3})),  # no code
    (2, msgpack.packb({"code": "10"})),
    (2, msgpack.packb({"code": 10, "opaque": 1.5})),
    (2, msgpack.packb({"code": 10, "flag": True})),
    (2, msgpack.packb({"code": 10, "remark": 5})),
    (2, msgpack.packb({"code": 10, "extFields": [1, 2]})),
    (2, msgpack.packb({"code": 10, "extFields": {1: "a"}})),
    (2, msgpack.packb({"code": 10, "extFields": {"a": {"b": 1}}})),
    (2, msgpack.packb({"code": 10, "extFields": {"a": [1]}})),
    (2, msgpack.packb({1: 2})),
    (2, b"\xc1"),  # never used in msgpack
    (2, msgpack.packb({"code": 10}) + b"\x00"),  # trailing data
    (0, b"[]"),
    (0, b'"code"'),
    (0, b"{"),
    (0, b'{"code": null}'),
    (0, b'{"code": 1e3}'),
    (0, b'{"code": 10, "language": []}'),
    (0, b'{"code": 10, "extFields": "x"}'),
    (0, b"\xff\xfe"),
    (0, b"[" * 5000 + b"]" * 5000),  # deep nesting
    (1, b""),
    (1, b"\x00" * 12),  # one byte short of the fixed part
    (1, b"\x00" * 13 + b"\xff\xff\xff\xff"),  # remark runs past the header
    (1, b"\x00" * 13 + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x05"),  # ext runs past
    (1, b"\x00" * 13 + b"\x00\x00\x00\x01\xff" + b"\x00\x00\x00\x00"),  # remark not UTF-8
    (1, b"\x00" * 13 + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x02\xff\xff"),  # negative key len
    (3, b"anything"),
    (255, b""),
]


@pytest.mark.parametrize(("st_byte", "header"), STRUCTURED_GARBAGE)
def test_structured_garbage_is_malformed_and_decoder_stays_in_sync(
    st_byte: int, header: bytes
) -> None:
    bad = struct.pack(">II", 4 + len(header) + 3, (st_byte << 24) | len(header)) + header + b"abc"
    good = RemotingCommand(code=RequestCode.HEART_BEAT, opaque=77, body=b"hb")
    dec = FrameDecoder()
    dec.feed(bad + encode_frame(good))
    with pytest.raises(MalformedFrameError):
        dec.next_command()
    assert dec.next_command() == good
    assert dec.next_command() is None
    assert dec.buffered == 0


@pytest.mark.parametrize(
    "bad",
    [
        struct.pack(">I", 0),  # shorter than the header-length field
        struct.pack(">I", 3) + b"abc",
        struct.pack(">II", 4, 2 << 24 | 100),  # header length beyond the frame
        struct.pack(">II", 10, 2 << 24 | 7) + b"123456",
    ],
    ids=["length-0", "length-3", "hlen-past-frame", "hlen-past-frame-2"],
)
def test_badly_delimited_frame_is_consumed_and_decoder_stays_in_sync(bad: bytes) -> None:
    good = RemotingCommand(code=10, opaque=9, serialize_type=SerializeType.JSON)
    dec = FrameDecoder()
    dec.feed(bad)
    dec.feed(encode_frame(good))
    with pytest.raises(MalformedFrameError):
        dec.next_command()
    assert dec.next_command() == good
    assert dec.buffered == 0


def test_malformed_frame_split_across_feeds_still_resyncs() -> None:
    header = b"\xc1\xc1\xc1"
    bad = struct.pack(">II", 4 + len(header), (2 << 24) | len(header)) + header
    good = RemotingCommand(code=10, opaque=3)
    stream = bad + encode_frame(good)
    dec = FrameDecoder()
    dec.feed(stream[:5])
    assert dec.next_command() is None
    dec.feed(stream[5:9])
    assert dec.next_command() is None
    dec.feed(stream[9:])
    with pytest.raises(MalformedFrameError):
        dec.next_command()
    assert dec.next_command() == good


# --- size limit -------------------------------------------------------------------------------


def test_frame_too_large_is_raised_on_the_four_byte_prefix() -> None:
    dec = FrameDecoder(max_frame_size=1024)
    dec.feed(struct.pack(">I", 1025))
    with pytest.raises(FrameTooLargeError) as info:
        dec.next_command()
    assert "1025" in str(info.value) and "1024" in str(info.value)
    # The stream cannot be resynchronised: the decoder keeps refusing, whatever comes next.
    dec.feed(encode_frame(RemotingCommand(code=10)))
    with pytest.raises(FrameTooLargeError):
        dec.next_command()


def test_frame_too_large_default_limit_is_16_mib() -> None:
    dec = FrameDecoder()
    dec.feed(struct.pack(">I", 16 * 1024 * 1024 + 1))
    with pytest.raises(FrameTooLargeError):
        dec.next_command()
    ok = FrameDecoder()
    ok.feed(struct.pack(">I", 16 * 1024 * 1024))
    assert ok.next_command() is None  # at the limit: waits for the rest


def test_frame_at_the_limit_decodes() -> None:
    cmd = RemotingCommand(code=10, body=b"z" * 1000)
    frame = encode_frame(cmd)
    dec = FrameDecoder(max_frame_size=len(frame) - 4)
    dec.feed(frame)
    assert dec.next_command() == cmd


def test_fewer_than_four_bytes_wait() -> None:
    dec = FrameDecoder(max_frame_size=8)
    dec.feed(b"\xff\xff\xff")
    assert dec.next_command() is None
    dec.feed(b"\xff")
    with pytest.raises(FrameTooLargeError):
        dec.next_command()


def test_frame_too_large_is_a_protocol_error() -> None:
    assert issubclass(FrameTooLargeError, ProtocolError)
    assert issubclass(MalformedFrameError, ProtocolError)


@given(length=st.integers(9, 2**32 - 1), limit=st.integers(8, 2**24))
@settings(max_examples=100, deadline=None)
def test_any_prefix_above_the_limit_is_refused_at_once(length: int, limit: int) -> None:
    assume(length > limit)
    dec = FrameDecoder(max_frame_size=limit)
    dec.feed(struct.pack(">I", length))
    with pytest.raises(FrameTooLargeError):
        dec.next_command()
