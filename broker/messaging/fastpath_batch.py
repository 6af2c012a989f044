"""The direct paths of a SEND_BATCH_MESSAGE (``plain`` and ``halves``, :mod:`.fastpath`): the
batch parsed into the records the generic path would store, byte for byte."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from txmq.protocol.errors import ProtocolError
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import (
    MessageConst,
    pack_host,
    properties_to_string,
    string_to_properties,
)

from ..store import EncodedMessage
from .fastpath_forms import (
    _I16,
    _KV,
    _NOT_PLAIN,
    _SEP,
    _UNIQ,
    _UNIQ_INSIDE,
    HalfTemplate,
    StoredForm,
    Template,
    _new_tuple,
    stored_form,
)

#: A SEND_BATCH_MESSAGE entry's head (total size, magic, CRC, flag, body length) and its
#: properties length (:class:`~txmq.protocol.message.BatchBody`'s layout).
_ENTRY_HEAD = struct.Struct(">iiiii")
_ENTRY_HEAD_SIZE = _ENTRY_HEAD.size
_ENTRY_OVERHEAD = _ENTRY_HEAD_SIZE + _I16.size


@dataclass(slots=True)
class FastBatch:
    """A batch parsed by :func:`parse_batch`: its records, the UNIQ_KEY of each, and for the
    halves of a transaction, each half's template."""

    #: What the store appends: for plain messages the fields of an :class:`EncodedMessage`
    #: in a plain tuple (the store only unpacks them), for halves EncodedMessages (their
    #: commit reads them by name).
    records: list[EncodedMessage]
    uniq_keys: list[str]
    halves: list[HalfTemplate] | None = None
    #: Each half's UNIQ_KEY as sent (bytes), for its committed record.
    raw_uniqs: list[bytes] | None = None
    #: the request's topic and producer group
    topic: str = ""
    group: str = ""

    @property
    def txid(self) -> str | None:
        return self.halves[0].txid if self.halves else None


# One pass over the entries, the hot path of every batch: each record is built inline, in
# locals, with no call per message (split, every part would look them up again).
def parse_batch(
    h: SendMessageRequestHeader,
    queue_id: int,
    body: bytes,
    born_host: tuple[str, int],
    max_body: int,
    half_template: Callable[[bytes, SendMessageRequestHeader, int], HalfTemplate | None],
) -> FastBatch | None:
    """The records the generic path would store for this SEND_BATCH_MESSAGE (byte for byte),
    or None when the batch does not qualify or anything in it is amiss.

    ``half_template(rest, h, queue_id)``: the :class:`HalfTemplate` of halves whose properties
    after their UNIQ_KEY are ``rest``, or None when they do not qualify."""
    if body.__class__ is not bytes or not body:
        return None
    size = len(body)
    unpack_head = _ENTRY_HEAD.unpack_from
    unpack_plen = _I16.unpack_from
    hsize = _ENTRY_HEAD_SIZE
    overhead = _ENTRY_OVERHEAD
    find = body.find
    startswith = body.startswith
    ulen = len(_UNIQ)
    crc32 = zlib.crc32
    join = b"".join
    host = pack_host(born_host)
    born_ts = h.born_timestamp
    reconsume = h.reconsume_times or 0
    templates: dict[tuple[bytes, bytes], Template] = {}
    t: Template | None = None
    last_before = last_after = b""
    halves: list[HalfTemplate] | None = None
    kind: type | None = None  # StoredForm or HalfTemplate: a batch is all of one
    records: list[Any] = []  # EncodedMessage, or for plain messages its fields in a tuple
    append = records.append
    uniqs: list[bytes] = []
    add_uniq = uniqs.append
    # The stored form of the current template, in locals: the loop below builds each record
    # inline (a tuple made in C), no call per message but the CRC.
    form: StoredForm | None = None
    heads: dict[int, bytes] = {}
    topic, qid, magic, tail, sys_flag, tags_code = "", 0, 0, b"", 0, 0
    pos = 0
    try:
        while pos < size:
            # The entry at pos, read inline (as batch_entry_at reads it, no call per entry).
            total, _magic, _crc, flag, blen = unpack_head(body, pos)
            if blen < 0 or blen > max_body or total < overhead or pos + total > size:
                return None
            p = pos + hsize + blen
            end = p + 2 + unpack_plen(body, p)[0]
            if end - pos != total or end < p + 2:
                return None
            b = body[pos + hsize : p]
            p += 2
            if startswith(_UNIQ, p, end):
                at = p
            else:
                at = find(_UNIQ_INSIDE, p, end) + 1
                if at == 0:
                    return None
            sep = find(_SEP, at + ulen, end)
            if sep < 0:
                return None
            before = body[p:at]
            after = body[sep:end]
            if t is None or before != last_before or after != last_after:
                key = (before, after)
                t = templates.get(key)
                if t is None:
                    t = _template(before, after, h, queue_id, half_template)
                    if t is None:
                        return None
                    if kind is None:
                        kind = t.__class__
                        if kind is HalfTemplate:
                            halves = []
                    elif t.__class__ is not kind:
                        return None  # plain messages and halves mixed
                    elif halves and t.txid != halves[0].txid:  # type: ignore[union-attr]
                        return None  # halves of two transactions
                    templates[key] = t
                last_before, last_after = before, after
                form = t.half if halves is not None else t  # type: ignore[union-attr,assignment]
                heads = form.heads  # type: ignore[union-attr]
                topic, qid, magic = form.topic, form.queue_id, form.magic  # type: ignore[union-attr]
                tail, sys_flag, tags_code = form.tail, form.sys_flag, form.tags_code  # type: ignore[union-attr]
            u = body[at + ulen : sep]
            head = heads.get(len(u))
            if head is None:
                head = form.head(len(u))  # type: ignore[union-attr]
                if head is None:
                    return None
            rec = (
                topic,
                qid,
                magic,
                crc32(b) & 0x7FFFFFFF,
                b,
                join((head, u, tail)),
                flag,
                sys_flag,
                born_ts,
                host,
                reconsume,
                0,
                tags_code,
            )
            # A plain batch's records go to the store only, which unpacks them: plain tuples in
            # the EncodedMessage's order; the halves' are read by name for their commit.
            append(rec if halves is None else _new_tuple(EncodedMessage, rec))
            if halves is not None:
                halves.append(t)  # type: ignore[arg-type]
            add_uniq(u)
            pos += total
    except struct.error:
        return None
    # The UNIQ_KEYs: free of separators (\x02 ends each, and none may hold \x01) and UTF-8.
    joined = _SEP.join(uniqs)
    if _KV in joined:
        return None
    try:
        texts = joined.decode("utf-8").split("\x02")
    except UnicodeDecodeError:
        return None
    return FastBatch(
        records, texts, halves, uniqs if halves is not None else None, h.topic, h.producer_group
    )


def _template(
    before: bytes,
    after: bytes,
    h: SendMessageRequestHeader,
    queue_id: int,
    half_template: Callable[[bytes, SendMessageRequestHeader, int], HalfTemplate | None],
) -> Template | None:
    """The template of entries whose properties are ``before`` + UNIQ_KEY + ``after``."""
    rest = after[1:]
    if not before and rest.find(b"TRAN_MSG\x01") >= 0:
        return half_template(rest, h, queue_id)
    try:
        text = (before + rest).decode("utf-8")
        props = string_to_properties(text)
        if properties_to_string(props) != text:
            return None  # not canonical: stored as sent it would differ from the generic path
    except (UnicodeDecodeError, ProtocolError):
        return None
    if any(k in props for k in _NOT_PLAIN):
        return None
    try:
        return stored_form(
            h.topic, queue_id, before, after, h.sys_flag & ~0xC, props.get(MessageConst.TAGS)
        )
    except ProtocolError:
        return None
