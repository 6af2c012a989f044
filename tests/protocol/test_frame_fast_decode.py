"""A msgpack header whose fields have their usual types is read in a few C calls; anything else
is read field by field.  Both must give the same command, or the same error, for any header
hypothesis makes (the usual ones, and every wrong type in every field)."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.protocol.errors import MalformedFrameError
from txmq.protocol.frame import decode_header, decode_header_fields

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=8),
)
_odd = st.one_of(
    _scalars,
    st.lists(st.integers(0, 9), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2),
)
_ext_values = st.one_of(_scalars, st.just([1]), st.just({"a": 1}))
_ext_keys = st.one_of(st.text(max_size=6), st.integers(0, 3), st.binary(max_size=3))


@st.composite
def headers(draw: Any) -> bytes:
    doc: dict[Any, Any] = {}

    def usual() -> bool:  # each field of its usual type most of the time, any other sometimes
        return bool(draw(st.integers(0, 5)) != 0)

    for key in ("code", "language", "version", "opaque", "flag"):
        if draw(st.integers(0, 9)) == 0:
            continue  # absent
        doc[key] = draw(st.integers(-(2**31), 2**31)) if usual() else draw(_odd)
    if draw(st.booleans()):
        doc["remark"] = draw(st.one_of(st.none(), st.text(max_size=5))) if usual() else draw(_odd)
    if draw(st.integers(0, 5)):
        if usual():
            keys = st.text(max_size=6) if usual() else _ext_keys
            values = _scalars if usual() else _ext_values
            doc["extFields"] = draw(st.dictionaries(keys, values, max_size=6))
        else:
            doc["extFields"] = draw(_odd)
    if draw(st.integers(0, 20)) == 0:
        return msgpack.packb(draw(_odd))  # not a map at all
    if draw(st.integers(0, 30)) == 0:
        return b"\xc1" + msgpack.packb(doc)  # not msgpack
    return msgpack.packb(doc, use_bin_type=True)


def _outcome(fn: Any, header: bytes) -> Any:
    try:
        cmd = fn(2, header, b"body")
    except MalformedFrameError as exc:
        return ("error", str(exc))
    return (
        "command",
        cmd.code,
        cmd.opaque,
        cmd.flag,
        cmd.remark,
        list(cmd.ext_fields.items()),
        {k: type(v) for k, v in cmd.ext_fields.items()},
        cmd.body,
        cmd.language,
        type(cmd.language),
        cmd.version,
        cmd.serialize_type,
    )


@settings(max_examples=600, deadline=None)
@given(header=headers())
def test_the_quick_read_gives_what_the_field_by_field_read_does(header: bytes) -> None:
    assert _outcome(decode_header, header) == _outcome(decode_header_fields, header)


def test_the_sdks_header_is_read_quickly() -> None:
    doc = {
        "code": 310,
        "language": 3,
        "version": 1,
        "opaque": 7,
        "flag": 0,
        "remark": None,
        "extFields": {"a": "g", "b": "t", "e": 1, "i": "UNIQ_KEY\x01A\x02", "m": False},
    }
    cmd = decode_header(2, msgpack.packb(doc), b"x")
    assert (cmd.code, cmd.opaque, cmd.language, cmd.version) == (310, 7, 3, 1)
    assert cmd.ext_fields == doc["extFields"]
