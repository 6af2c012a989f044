"""HTTP/2 frames and HPACK for the native gRPC transport (:mod:`.h2`): the frame layout and
codes (RFC 9113), the constant response header blocks, and the request header decoder
(RFC 7541).

Responses use constant header blocks of static-table references and literals never added to
the peer's dynamic table, encoded once; request header blocks are decoded here, with ``hpack``'s
Huffman decoder and static table.
"""

from __future__ import annotations

import struct
from collections import deque
from urllib.parse import quote

from hpack.exceptions import HPACKError
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types (RFC 9113 section 6)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
# flags
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 5, 6, 7, 8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 9, 11
# settings
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS = 1, 2, 3
S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 4, 5, 6

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65_535
DEFAULT_FRAME = 16_384

#: Bytes of one request header block (with its CONTINUATIONs) at most.
MAX_HEADER_BLOCK = 64 * 1024

_STATIC: tuple[tuple[bytes, bytes], ...] = tuple(HeaderTable.STATIC_TABLE)
_STATIC_LEN = len(_STATIC)

FRAME_HEAD = struct.Struct(">HBBBL")  # length (24 bits as 16 + 8), type, flags, stream id
MESSAGE_PREFIX = struct.Struct(">BL")  # gRPC message: compressed flag, length


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return FRAME_HEAD.pack(n >> 8, n & 0xFF, kind, flags, stream) + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field never indexed (the peer's dynamic table stays as it is,
    so the block is the same bytes every time); no Huffman coding."""
    return b"\x10" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value


def _hpack_int(value: int, prefix_bits: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out = bytearray([limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


#: ``:status: 200`` (static index 8) and ``content-type: application/grpc``.
RESPONSE_HEADERS = b"\x88" + _literal(b"content-type", b"application/grpc")
TRAILERS_OK = _literal(b"grpc-status", b"0")


def trailers(code: int, message: str = "") -> bytes:
    block = _literal(b"grpc-status", str(code).encode())
    if message:
        text = quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode("ascii")
        block += _literal(b"grpc-message", text)
    return block


def parse_timeout(value: bytes) -> float | None:
    """``grpc-timeout`` (``<digits><unit>``) in seconds; None when malformed."""
    unit = {
        b"H": 3600.0,
        b"M": 60.0,
        b"S": 1.0,
        b"m": 1e-3,
        b"u": 1e-6,
        b"n": 1e-9,
    }.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        return None
    return int(digits) * unit


class HpackDecoder:
    """HPACK (RFC 7541) request header blocks to ``(name, value)`` byte pairs.

    ``hpack``'s decoder spends some 20 µs on even a block of indexed fields; this one walks the
    block with plain indexing and keeps ``hpack``'s Huffman decoder and static table (with a
    memo of the strings it decoded: a client sends the same values call after call).
    ``changes`` counts the changes to the dynamic table.

    Raises :class:`ConnectionError_` (COMPRESSION_ERROR) on a malformed block.
    """

    __slots__ = ("dynamic", "size", "max_size", "limit", "changes", "_huffman")

    def __init__(self, limit: int = 4096) -> None:
        self.dynamic: deque[tuple[bytes, bytes]] = deque()
        self.size = 0
        #: The table size the encoder chose (at most ``limit``, what the broker advertised).
        self.max_size = limit
        self.limit = limit
        self.changes = 0
        self._huffman: dict[bytes, bytes] = {}

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= _STATIC_LEN:
            return _STATIC[index - 1]
        i = index - _STATIC_LEN - 1
        if index == 0 or i >= len(self.dynamic):
            raise ConnectionError_(COMPRESSION_ERROR, f"header table index {index} out of range")
        return self.dynamic[i]

    def _add(self, name: bytes, value: bytes) -> None:
        self.changes += 1
        size = len(name) + len(value) + 32
        if size > self.max_size:
            self.dynamic.clear()
            self.size = 0
            return
        self.dynamic.appendleft((name, value))
        self.size += size
        self._shrink()

    def _shrink(self) -> None:
        while self.size > self.max_size:
            n, v = self.dynamic.pop()
            self.size -= len(n) + len(v) + 32

    @staticmethod
    def _int(data: bytes, pos: int, bits: int) -> tuple[int, int]:
        mask = (1 << bits) - 1
        value = data[pos] & mask
        pos += 1
        if value < mask:
            return value, pos
        shift = 0
        while True:
            if pos >= len(data) or shift > 28:
                raise ConnectionError_(COMPRESSION_ERROR, "bad HPACK integer")
            b = data[pos]
            pos += 1
            value += (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value, pos

    def _literal(self, data: bytes, pos: int, bits: int) -> tuple[tuple[bytes, bytes], int]:
        """A literal field whose name index has a ``bits``-bit prefix (0: the name follows)."""
        index, pos = self._int(data, pos, bits)
        if index:
            name = self._entry(index)[0]
        else:
            name, pos = self._string(data, pos)
        value, pos = self._string(data, pos)
        return (name, value), pos

    def _string(self, data: bytes, pos: int) -> tuple[bytes, int]:
        if pos >= len(data):
            raise ConnectionError_(COMPRESSION_ERROR, "truncated HPACK string")
        huffman = data[pos] & 0x80
        n, pos = self._int(data, pos, 7)
        end = pos + n
        if end > len(data):
            raise ConnectionError_(COMPRESSION_ERROR, "truncated HPACK string")
        raw = data[pos:end]
        if not huffman:
            return raw, end
        text = self._huffman.get(raw)
        if text is None:
            try:
                text = decode_huffman(raw)
            except HPACKError as exc:
                raise ConnectionError_(COMPRESSION_ERROR, f"bad Huffman string: {exc}") from None
            if len(self._huffman) >= 1024:
                self._huffman.clear()
            self._huffman[raw] = text
        return text, end

    def decode(self, data: bytes) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = []
        pos = 0
        end = len(data)
        total = 0
        while pos < end:
            b = data[pos]
            if b & 0x80:  # indexed field
                index, pos = self._int(data, pos, 7)
                field = self._entry(index)
            elif b & 0x40:  # literal, added to the table
                field, pos = self._literal(data, pos, 6)
                self._add(*field)
            elif b & 0x20:  # dynamic table size update (only before the first field)
                size, pos = self._int(data, pos, 5)
                if size > self.limit or out:
                    raise ConnectionError_(COMPRESSION_ERROR, f"bad table size update {size}")
                self.max_size = size
                self.changes += 1
                self._shrink()
                continue
            else:  # literal not indexed / never indexed
                field, pos = self._literal(data, pos, 4)
            total += len(field[0]) + len(field[1]) + 32
            if total > MAX_HEADER_BLOCK:
                raise ConnectionError_(ENHANCE_YOUR_CALM, "header list too large")
            out.append(field)
        return out


class ConnectionError_(Exception):
    """A connection error: GOAWAY with ``code``, then close."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(detail)
        self.code = code
