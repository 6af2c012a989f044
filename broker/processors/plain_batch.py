"""A SEND_BATCH_MESSAGE of plain messages, stored straight from the request body.

The generic path (:func:`~txmq.protocol.message.decode_batch`, a :class:`MessageExt` per entry,
``put_messages``) parses every entry's properties into a dict and writes them back into a
string.  Entries that a producer sends in bulk differ only in their UNIQ_KEY: what comes
before and after it is the same.  Those parts are judged once per request (their
properties parsed, checked, the stored tail's fixed parts made), and each entry is stored as
its body and its properties as sent, which is what the generic path writes for properties in
canonical form (the only ones let through).  Anything else returns None before a byte is
stored, and the generic path stores the batch or gives the error.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from txmq.protocol.errors import ProtocolError
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import (
    MAX_PROPERTIES_BYTES,
    MessageConst,
    batch_entry_at,
    pack_host,
    properties_to_string,
    stored_topic_part,
    string_to_properties,
)

from ..store.message_store import EncodedMessage
from ..store.tags import tags_code_of

_I16 = struct.Struct(">h")
_KV = b"\x01"
_SEP = b"\x02"
_UNIQ = f"{MessageConst.UNIQ_KEY}\x01".encode()
_UNIQ_INSIDE = b"\x02" + _UNIQ
#: Properties a plain batch entry may not carry here: the generic path judges those (a
#: transaction's halves, a delay it refuses).
_NOT_HERE = (MessageConst.TRAN_MSG, MessageConst.DELAY, MessageConst.UNIQ_KEY)


@dataclass(slots=True)
class _Template:
    """What entries with the same properties around their UNIQ_KEY share."""

    #: The stored tail up to the UNIQ_KEY's value, per length of that value.
    heads: dict[int, bytes]
    #: The properties before the UNIQ_KEY entry, and from its terminator on.
    before: bytes
    after: bytes
    tags_code: int


def plain_batch_records(
    h: SendMessageRequestHeader,
    queue_id: int,
    body: bytes,
    born_host: tuple[str, int],
    max_body: int,
) -> list[EncodedMessage] | None:
    """The records ``put_messages`` would store for this SEND_BATCH_MESSAGE of plain messages
    (the generic path's, byte for byte), or None when the batch does not qualify or anything
    in it is amiss."""
    if body.__class__ is not bytes or not body:
        return None
    try:
        magic, topic_part = stored_topic_part(h.topic)
    except ProtocolError:
        return None
    size = len(body)
    entry_at = batch_entry_at
    find = body.find
    startswith = body.startswith
    uniq_len = len(_UNIQ)
    crc32 = zlib.crc32
    join = b"".join
    host = pack_host(born_host)
    topic = h.topic
    sys_flag = h.sys_flag & ~0xC
    born_ts = h.born_timestamp
    reconsume = h.reconsume_times or 0
    templates: dict[tuple[bytes, bytes], _Template] = {}
    t: _Template | None = None
    records: list[EncodedMessage] = []
    append = records.append
    uniqs: list[bytes] = []
    pos = 0
    try:
        while pos < size:
            entry = entry_at(body, pos, max_body)
            if entry is None:
                return None
            total, flag, b, p, end = entry
            if startswith(_UNIQ, p, end):
                at = p
            else:
                at = find(_UNIQ_INSIDE, p, end) + 1
                if at == 0:
                    return None
            sep = find(_SEP, at + uniq_len, end)
            if sep < 0:
                return None
            before = body[p:at]
            after = body[sep:end]
            if t is None or before != t.before or after != t.after:
                key = (before, after)
                t = templates.get(key)
                if t is None:
                    t = _template(before, after)
                    if t is None:
                        return None
                    templates[key] = t
            u = body[at + uniq_len : sep]
            head = t.heads.get(len(u))
            if head is None:
                n = len(before) + uniq_len + len(u) + len(after)
                if n > MAX_PROPERTIES_BYTES:
                    return None  # the generic path refuses it
                head = t.heads[len(u)] = join((topic_part, _I16.pack(n), before, _UNIQ))
            append(
                (
                    topic,
                    queue_id,
                    magic,
                    crc32(b) & 0x7FFFFFFF,
                    b,
                    join((head, u, after)),
                    flag,
                    sys_flag,
                    born_ts,
                    host,
                    reconsume,
                    0,
                    t.tags_code,
                )
            )
            uniqs.append(u)
            pos += total
    except struct.error:
        return None
    # The UNIQ_KEYs: free of separators (\x02 ends each, and none may hold \x01) and UTF-8.
    joined = _SEP.join(uniqs)
    if _KV in joined:
        return None
    try:
        joined.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return records


def _template(before: bytes, after: bytes) -> _Template | None:
    """The template of entries whose properties are ``before`` + UNIQ_KEY + ``after``, or None
    when they are not in canonical form (what ``properties_to_string`` writes of what
    ``string_to_properties`` reads) or carry what only the generic path handles."""
    try:
        text = (before + after[1:]).decode("utf-8")
        props = string_to_properties(text)
        if properties_to_string(props) != text:
            return None
    except (UnicodeDecodeError, ProtocolError):
        return None
    if any(k in props for k in _NOT_HERE):
        return None
    return _Template({}, before, after, tags_code_of(props.get(MessageConst.TAGS)))
