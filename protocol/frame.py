"""Frame codec: bytes <-> :class:`RemotingCommand`, with no I/O.

Frame layout (RocketMQ's remoting framing)::

    +-----------------+-------------------+---------------------+----------------+--------+
    | length : u32 BE | serialize type:u8 | header length: u24  | header (n)     | body   |
    +-----------------+-------------------+---------------------+----------------+--------+
      length = 4 + header length + body length  (the length field does not count itself)

Header encodings, chosen per frame by the type byte:

* ``MSGPACK`` (2, txmq's native form): a map with ``code, language (int), version, opaque,
  flag, remark, extFields``; extFields values may be native ints and bools.
* ``JSON`` (0, what stock RocketMQ clients send): the same keys, ``language`` as a name
  (``"JAVA"``), every extFields value a string.
* ``ROCKETMQ`` (1, RocketMQ's compact binary form, ``RocketMQSerializable``)::

      code i16 | language u8 | version i16 | opaque i32 | flag i32 |
      remark length i32 + UTF-8 | extFields length i32 + (key length i16 + key,
      value length i32 + value)*

Only :class:`~txmq.protocol.errors.ProtocolError` (and its subclasses) escapes the decoder.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import msgpack

from .codes import LanguageCode, SerializeType
from .command import RemotingCommand
from .errors import FrameTooLargeError, MalformedFrameError, ProtocolError

#: Default frame size limit (16 MiB).
DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024

#: Bodies of this many bytes or more are not copied next to their frame's head: a writer hands
#: head and body to the transport as they are, and a :class:`FrameDecoder` missing at least
#: this much of a body once its header is in collects the chunks that arrive and joins them
#: once (a large PULL answer would otherwise be copied into its buffer, out of it, and grow it).
LARGE_BODY = 64 * 1024

_U32 = struct.Struct(">I")
_FRAME_PREFIX = struct.Struct(">II")


def _stringify(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def _string_ext_fields(ext: dict[str, Any]) -> dict[str, str]:
    return {str(k): _stringify(v) for k, v in ext.items() if v is not None}


def encode_header(cmd: RemotingCommand) -> bytes:
    """The header bytes of ``cmd`` in its serialize type.

    Raises :class:`ProtocolError` when the encoding cannot carry a value (e.g. a code outside
    the 16-bit range of the ROCKETMQ form, an int beyond 64 bits, a value msgpack cannot pack).
    """
    try:
        return _encode_header(cmd)
    except ProtocolError:
        raise
    except (struct.error, OverflowError, TypeError, ValueError) as exc:
        raise ProtocolError(
            f"cannot encode a {SerializeType(cmd.serialize_type).name} header: {exc}"
        ) from None


def _encode_header(cmd: RemotingCommand) -> bytes:
    st = cmd.serialize_type
    if st == SerializeType.MSGPACK:
        packed: bytes = msgpack.packb(
            {
                "code": cmd.code,
                "language": int(cmd.language),
                "version": cmd.version,
                "opaque": cmd.opaque,
                "flag": cmd.flag,
                "remark": cmd.remark,
                "extFields": {k: v for k, v in cmd.ext_fields.items() if v is not None},
            },
            use_bin_type=True,
        )
        return packed
    if st == SerializeType.JSON:
        try:
            lang = LanguageCode(cmd.language).name
        except ValueError:
            lang = LanguageCode.OTHER.name
        doc: dict[str, Any] = {
            "code": cmd.code,
            "language": lang,
            "version": cmd.version,
            "opaque": cmd.opaque,
            "flag": cmd.flag,
            "serializeTypeCurrentRPC": "JSON",
        }
        if cmd.remark is not None:
            doc["remark"] = cmd.remark
        if cmd.ext_fields:
            doc["extFields"] = _string_ext_fields(cmd.ext_fields)
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if st == SerializeType.ROCKETMQ:
        parts = [
            struct.pack(">hBhii", cmd.code, cmd.language & 0xFF, cmd.version, cmd.opaque, cmd.flag)
        ]
        if cmd.remark is None:
            parts.append(_U32.pack(0))
        else:
            r = cmd.remark.encode("utf-8")
            parts.append(_U32.pack(len(r)) + r)
        ext = bytearray()
        for k, v in _string_ext_fields(cmd.ext_fields).items():
            kb, vb = k.encode("utf-8"), v.encode("utf-8", "surrogateescape")
            ext += struct.pack(">h", len(kb)) + kb + _U32.pack(len(vb)) + vb
        parts.append(_U32.pack(len(ext)) + bytes(ext))
        return b"".join(parts)
    raise ProtocolError(f"unsupported serialize type {st!r}")


def encode_frame(cmd: RemotingCommand) -> bytes:
    """The bytes of one frame."""
    return encode_frame_head(cmd) + cmd.body


def encode_frame_head(cmd: RemotingCommand) -> bytes:
    """The bytes of one frame up to its body (length, serialize type and header length,
    header): a writer can send the body after it as it is, without joining the two."""
    header = encode_header(cmd)
    if len(header) > 0xFFFFFF:
        raise ProtocolError(f"header too large: {len(header)} bytes")
    length = 4 + len(header) + len(cmd.body)
    return _FRAME_PREFIX.pack(length, (int(cmd.serialize_type) << 24) | len(header)) + header


def _int_field(doc: dict[Any, Any], key: str, default: int = 0) -> int:
    v = doc.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise MalformedFrameError(f"header field {key!r} must be an integer, got {v!r}")
    return v


def _ext_from(doc: dict[Any, Any]) -> dict[str, Any]:
    ext = doc.get("extFields") or {}
    if not isinstance(ext, dict):
        raise MalformedFrameError("header field 'extFields' must be a map")
    out: dict[str, Any] = {}
    for k, v in ext.items():
        if not isinstance(k, str):
            raise MalformedFrameError(f"extFields key must be a string, got {k!r}")
        if isinstance(v, (dict, list)):
            raise MalformedFrameError(f"extFields value of {k!r} must be a scalar")
        out[k] = v
    return out


def _remark_from(doc: dict[Any, Any]) -> str | None:
    r = doc.get("remark")
    if r is not None and not isinstance(r, str):
        raise MalformedFrameError("header field 'remark' must be a string")
    return r


#: The serialize type byte -> its member, built once: ``SerializeType(byte)`` per frame costs an
#: Enum lookup with its error path on every decode.
_SERIALIZE_TYPES: dict[int, SerializeType] = {int(t): t for t in SerializeType}


#: What an extFields value may be in the common case (anything else: the checks of
#: :func:`_ext_from` judge it).
_PLAIN_VALUES = frozenset({str, int, bool, float, bytes, type(None)})
_STR_ONLY = frozenset({str})
_MSGPACK = SerializeType.MSGPACK
_unpackb = msgpack.unpackb


def _plain_msgpack(doc: Any, body: bytes) -> RemotingCommand | None:
    """The command of a msgpack header whose fields all have their usual types (ints, a
    string or no remark, a map of strings to scalars), read in a few C calls; None: anything
    else, which :func:`decode_header` reads field by field (the same result, or its error)."""
    if doc.__class__ is not dict:
        return None
    get = doc.get
    code = get("code")
    opaque = get("opaque", 0)
    flag = get("flag", 0)
    version = get("version", 0)
    lang = get("language", LanguageCode.OTHER)
    remark = get("remark")
    ext = get("extFields")
    if (
        code.__class__ is not int
        or opaque.__class__ is not int
        or flag.__class__ is not int
        or version.__class__ is not int
        or lang.__class__ is not int
        or (remark is not None and remark.__class__ is not str)
    ):
        return None
    if not ext:
        if ext is not None and ext.__class__ is not dict:
            return None
        ext = {}
    elif (
        ext.__class__ is not dict
        or not _STR_ONLY.issuperset(map(type, ext))
        or not _PLAIN_VALUES.issuperset(map(type, ext.values()))
    ):
        return None
    return RemotingCommand(code, opaque, flag, remark, ext, body, lang, version, _MSGPACK)


def decode_header(st_byte: int, header: bytes, body: bytes) -> RemotingCommand:
    """Decode one header; raises :class:`MalformedFrameError` on anything wrong."""
    if st_byte == 2:  # MSGPACK, with its fields as usual: read at once
        try:
            doc = _unpackb(header, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises a zoo of types on garbage
            raise MalformedFrameError(f"cannot decode MSGPACK header: {exc}") from None
        cmd = _plain_msgpack(doc, body)
        if cmd is not None:
            return cmd
    return decode_header_fields(st_byte, header, body)


def decode_header_fields(st_byte: int, header: bytes, body: bytes) -> RemotingCommand:
    """:func:`decode_header`, every field checked one by one (what it falls back to)."""
    st = _SERIALIZE_TYPES.get(st_byte)
    if st is None:
        raise MalformedFrameError(f"unknown serialize type {st_byte}")
    try:
        if st == SerializeType.MSGPACK:
            doc = msgpack.unpackb(header, raw=False, strict_map_key=False)
            if not isinstance(doc, dict):
                raise MalformedFrameError("msgpack header is not a map")
            lang = _int_field(doc, "language", LanguageCode.OTHER)
        elif st == SerializeType.JSON:
            doc = json.loads(header.decode("utf-8"))
            if not isinstance(doc, dict):
                raise MalformedFrameError("JSON header is not an object")
            raw_lang = doc.get("language", "OTHER")
            if isinstance(raw_lang, str):
                lang = LanguageCode[raw_lang] if raw_lang in LanguageCode.__members__ else 7
            else:
                lang = _int_field(doc, "language", LanguageCode.OTHER)
        else:
            return _decode_rocketmq(header, body)
        if doc.get("code") is None:
            raise MalformedFrameError("header has no 'code'")
        return RemotingCommand(
            code=_int_field(doc, "code"),
            opaque=_int_field(doc, "opaque"),
            flag=_int_field(doc, "flag"),
            remark=_remark_from(doc),
            ext_fields=_ext_from(doc),
            body=body,
            language=lang,
            version=_int_field(doc, "version"),
            serialize_type=st,
        )
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack/json raise a zoo of types on garbage
        raise MalformedFrameError(f"cannot decode {st.name} header: {exc}") from None


def _decode_rocketmq(header: bytes, body: bytes) -> RemotingCommand:
    try:
        code, lang, version, opaque, flag = struct.unpack_from(">hBhii", header, 0)
        pos = 13
        (rlen,) = _U32.unpack_from(header, pos)
        pos += 4
        if pos + rlen > len(header):
            raise MalformedFrameError("remark runs past the header")
        remark = header[pos : pos + rlen].decode("utf-8") if rlen else None
        pos += rlen
        (elen,) = _U32.unpack_from(header, pos)
        pos += 4
        end = pos + elen
        if end != len(header):
            raise MalformedFrameError("extFields length does not match the header length")
        ext: dict[str, Any] = {}
        while pos < end:
            (klen,) = struct.unpack_from(">h", header, pos)
            pos += 2
            if klen < 0 or pos + klen > end:
                raise MalformedFrameError("extFields key runs past the header")
            k = header[pos : pos + klen].decode("utf-8")
            pos += klen
            (vlen,) = _U32.unpack_from(header, pos)
            pos += 4
            if pos + vlen > end:
                raise MalformedFrameError("extFields value runs past the header")
            ext[k] = header[pos : pos + vlen].decode("utf-8")
            pos += vlen
    except ProtocolError:
        raise
    except (struct.error, UnicodeDecodeError) as exc:
        raise MalformedFrameError(f"cannot decode ROCKETMQ header: {exc}") from None
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=ext,
        body=body,
        language=lang,
        version=version,
        serialize_type=SerializeType.ROCKETMQ,
    )


def decode_frame(frame: bytes) -> RemotingCommand:
    """Decode exactly one whole frame (with its length prefix)."""
    dec = FrameDecoder(max_frame_size=max(len(frame), 8))
    dec.feed(frame)
    cmd = dec.next_command()
    if cmd is None or dec.buffered:
        raise ProtocolError("not exactly one frame")
    return cmd


def _not_remoting(head: bytes) -> str | None:
    """Name the protocol when the first bytes of a stream are plainly not remoting frames."""
    if head.startswith(b"PRI * HT"):
        return (
            "HTTP/2 connection preface on the remoting port: a gRPC client (RocketMQ 5.x) "
            "must use the gRPC port (grpcServerPort)"
        )
    if head[:1] == b"\x16" and head[1:2] == b"\x03":
        return "TLS handshake on a plain-text remoting port"
    if head[:4] in (b"GET ", b"POST", b"PUT ", b"HEAD"):
        return "HTTP/1 request on the remoting port"
    return None


class FrameDecoder:
    """Incremental, size-capped decoder (sans-IO).

    ``feed(data)`` appends bytes; ``next_command()`` returns the next command, ``None`` when more
    bytes are needed, and raises:

    * :class:`FrameTooLargeError` as soon as a length prefix above the limit arrives; the stream
      cannot be resynchronised, so the connection must be closed;
    * :class:`MalformedFrameError` for a well-delimited frame with a bad header; that frame is
      consumed and the decoder can go on.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._failed: FrameTooLargeError | None = None
        # The large frame being collected: its serialize type, header, body chunks, and the
        # body bytes still missing.
        self._large: tuple[int, bytes, list[bytes]] | None = None
        self._large_missing = 0

    @property
    def buffered(self) -> int:
        if self._large is not None:
            return len(self._buf) + sum(map(len, self._large[2]))
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        if self._large is None:
            self._buf += data
            return
        missing = self._large_missing
        if len(data) <= missing:
            self._large[2].append(data)
            self._large_missing = missing - len(data)
        else:  # the body's end and what follows it
            self._large[2].append(data[:missing])
            self._large_missing = 0
            self._buf += data[missing:]

    def next_command(self) -> RemotingCommand | None:
        if self._failed is not None:
            raise self._failed
        if self._large is not None:
            if self._large_missing:
                return None
            st_byte, header, parts = self._large
            self._large = None
            return decode_header(st_byte, header, b"".join(parts))
        buf = self._buf
        if len(buf) < 4:
            return None
        (length,) = _U32.unpack_from(buf, 0)
        if length > self.max_frame_size:
            self._failed = FrameTooLargeError(
                _not_remoting(bytes(buf[:8]))
                or f"frame of {length} bytes exceeds the limit of {self.max_frame_size} bytes"
            )
            raise self._failed
        if length < 4:
            # Consume the whole announced frame (length bytes) so the stream stays in sync.
            if len(buf) < 4 + length:
                return None
            del buf[: 4 + length]
            raise MalformedFrameError(f"frame length {length} is shorter than its header field")
        if len(buf) < 4 + length:
            if 4 + length - len(buf) < LARGE_BODY or len(buf) < 8:
                return None
            (mark,) = _U32.unpack_from(buf, 4)
            st_byte, hlen = mark >> 24, mark & 0xFFFFFF
            if 8 + hlen > 4 + length or len(buf) < 8 + hlen:
                return None  # judged (or refused) once the whole frame is in
            self._large = (st_byte, bytes(buf[8 : 8 + hlen]), [bytes(buf[8 + hlen :])])
            self._large_missing = 4 + length - len(buf)
            buf.clear()
            return None
        (mark,) = _U32.unpack_from(buf, 4)
        st_byte, hlen = mark >> 24, mark & 0xFFFFFF
        frame_end = 4 + length
        if 8 + hlen > frame_end:
            del buf[:frame_end]
            raise MalformedFrameError(f"header length {hlen} exceeds the frame length {length}")
        header = bytes(buf[8 : 8 + hlen])
        body = bytes(buf[8 + hlen : frame_end])
        del buf[:frame_end]
        return decode_header(st_byte, header, body)
