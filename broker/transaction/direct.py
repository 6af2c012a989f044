"""A half message sent alone, stored straight from its request header.

A SEND_MESSAGE_V2 (or SEND_MESSAGE) of one half -- what ``producer.transaction()`` with one
message and ``send_message_in_transaction`` send -- would take the generic path: a header
object, the properties parsed into a dict, a message object, the half prepared, encoded, its
committed copy encoded again for the commit.  The SDK's halves differ only in their UNIQ_KEY and
their transaction id (``__transactionId__``); what lies around those two values is the same from
one transaction to the next.  So, as the batch fast path does for the halves of one request
(:mod:`txmq.broker.messaging.fastpath`), the parts around them are judged and prepared once per
shape (:func:`~txmq.broker.messaging.fastpath.make_half_template`, the generic path's own
preparation, made on the shape with stand-ins for the two values) and each half is stored as
those parts with its two values put back: the same record the generic path stores, the same
committed copy remembered for the commit, the same answer.

Anything unusual -- no UNIQ_KEY leading the properties, no transaction id or an empty one, a
batch key, a delay or a delivery time, a header field not of its usual type, a body over
``maxMessageSize``, a resend inside the duplicate window, a transaction the half may not join,
transactions refused on this broker, the message trace on -- goes to the generic path, which
stores it or gives its error.  ``batchFastPathEnable`` switches this off with the other fast
paths; ``tests/broker/test_half_direct_path.py`` compares both paths' answers and bytes.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import (
    MAX_PROPERTIES_BYTES,
    MessageConst,
    MessageExt,
    MessageSysFlag,
    pack_host,
    string_to_properties,
)

from ..delivery import TIMER_PROPERTIES
from ..messaging.dedup import dedup_topic
from ..messaging.fastpath import header_values, make_half_template
from ..store import AppendResult, EncodedMessage
from .state import HalfRef, TxState

if TYPE_CHECKING:
    from ..context import BrokerContext
    from ..messaging.dedup import DedupIndex
    from .machine import TransactionStateMachine

_I16 = struct.Struct(">h")
_new_tuple = tuple.__new__
_KV = b"\x01"
_SEP = b"\x02"
_UNIQ = f"{MessageConst.UNIQ_KEY}\x01".encode()
_TXID = f"\x02{MessageConst.TRANSACTION_ID}\x01".encode()
#: What stands for the transaction id while a shape is prepared (no separator, never sent:
#: a shape that holds it is left to the generic path).
_STAND_IN = "\x00txid\x00"
_STAND_IN_B = _STAND_IN.encode()
_TX_MASK = MessageSysFlag.TRANSACTION_MASK
_PREPARED = MessageSysFlag.TRANSACTION_PREPARED_TYPE
_HOST_V6_BITS = MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOST_V6
#: Properties that send a half to the generic path (it judges them against its clock or
#: the batch table).
_NOT_HERE = frozenset((MessageConst.DELAY, MessageConst.TXMQ_BATCH_KEY, *TIMER_PROPERTIES))
#: Shapes kept (per topic, queue, sys flag, header group and the properties around the values).
_SHAPES_MAX = 4096
_MISSING: Any = object()


@dataclass(slots=True)
class HalfForm:
    """How one shape's record is stored: ``topic_part + plen + UNIQ_KEY<01> + uniq + a +
    txid + b`` for the properties, the other fields fixed."""

    topic: str
    queue_id: int
    magic: int
    topic_part: bytes
    a: bytes
    b: bytes
    sys_flag: int
    tags_code: int

    def props(self, uniq: bytes, txid: bytes) -> bytes | None:
        plen = len(_UNIQ) + len(uniq) + len(self.a) + len(txid) + len(self.b)
        if plen > MAX_PROPERTIES_BYTES:
            return None
        return b"".join((self.topic_part, _I16.pack(plen), _UNIQ, uniq, self.a, txid, self.b))


@dataclass(slots=True)
class _Shape:
    group: str
    real_topic: str
    real_queue_id: int
    immunity_ms: int | None
    half: HalfForm
    committed: HalfForm


@dataclass(slots=True)
class HalfSend:
    """A SEND_MESSAGE(_V2) of one half, read from its header (see :meth:`HalfSends.parse`)."""

    topic: str
    #: the header's producer group (the half's group when it has no PGROUP property)
    group: str
    queue_id: int
    queue_nums: int
    body: bytes
    sys_flag: int
    uniq: str
    uniq_raw: bytes
    txid: str
    txid_raw: bytes
    #: the properties between the UNIQ_KEY's value and the transaction id's, and after it
    mid: bytes
    after: bytes
    flag: int
    born_timestamp: int
    reconsume_times: int


def _split(form: Any, real_topic: str | None = None) -> HalfForm | None:
    """A :class:`~txmq.broker.messaging.fastpath.StoredForm` made with the stand-in, cut
    around it."""
    tail: bytes = form.tail
    at = tail.find(_STAND_IN_B)
    if at < 0 or tail.find(_STAND_IN_B, at + 1) >= 0 or form.before:
        return None
    return HalfForm(
        form.topic,
        form.queue_id,
        form.magic,
        form.topic_part,
        tail[:at],
        tail[at + len(_STAND_IN_B) :],
        form.sys_flag,
        form.tags_code,
    )


class _Counts(Protocol):
    halves: int


class HalfBook(Protocol):
    """What the direct path needs of the transaction service."""

    @property
    def ctx(self) -> BrokerContext: ...

    @property
    def machine(self) -> TransactionStateMachine: ...

    @property
    def trace(self) -> object | None: ...

    @property
    def counts(self) -> _Counts: ...

    def prepare_half(self, msg: MessageExt, header_group: str) -> None: ...

    @staticmethod
    def transaction_id_of(props: dict[str, str]) -> str | None: ...

    def remember_committed(
        self, phy: int, form: HalfForm, p: HalfSend, crc: int, host: bytes
    ) -> None: ...


class HalfSends:
    """Halves sent alone, stored from their header; counted in :attr:`stored`."""

    def __init__(self, tx: HalfBook) -> None:
        self.tx = tx
        self.cfg = tx.ctx.config
        self._shapes: dict[tuple[str, int, int, str, bytes, bytes], _Shape | None] = {}
        #: Halves stored here (the rest went to the generic path).
        self.stored = 0

    def parse(self, v2: bool, ext: dict[str, Any], body: bytes) -> HalfSend | None:
        """The half of a SEND_MESSAGE(_V2) request when it can be stored from its header:
        every header field of its native type, the transaction flag of a half, properties
        led by the UNIQ_KEY and holding a non-empty ``__transactionId__``, a body within
        ``maxMessageSize``; None: the generic path reads it."""
        cfg = self.cfg
        if (
            not cfg.batch_fast_path_enable
            or cfg.reject_transaction_message
            or self.tx.trace is not None
            or body.__class__ is not bytes
        ):
            return None
        vals = header_values(v2, ext)
        if vals is None:
            return None
        (group, topic, _dt, nums, qid, sys_flag, born_ts, flag, props, reconsume) = vals[:10]
        if (
            group is None
            or topic is None
            or props is None
            or vals[12]
            or sys_flag is None
            or sys_flag & _TX_MASK != _PREPARED
            or sys_flag & _HOST_V6_BITS
            or len(body) > cfg.max_message_size
        ):
            return None
        try:
            raw = props.encode("utf-8")
        except UnicodeEncodeError:
            return None
        if not raw.startswith(_UNIQ):
            return None
        sep = raw.find(_SEP, len(_UNIQ))
        t = raw.find(_TXID, sep) if sep > 0 else -1
        if t < 0:
            return None
        t_at = t + len(_TXID)
        t_end = raw.find(_SEP, t_at)
        if t_end < 0:
            return None
        uniq_raw = raw[len(_UNIQ) : sep]
        txid_raw = raw[t_at:t_end]
        if not uniq_raw or not txid_raw or _KV in uniq_raw or _KV in txid_raw:
            return None
        return HalfSend(
            topic,
            group,
            -1 if qid is None else qid,
            4 if nums is None else nums,
            body,
            sys_flag,
            uniq_raw.decode("utf-8"),
            uniq_raw,
            txid_raw.decode("utf-8"),
            txid_raw,
            raw[sep:t_at],
            raw[t_end:],
            0 if flag is None else flag,
            0 if born_ts is None else born_ts,
            0 if reconsume is None else reconsume,
        )

    def _shape(self, p: HalfSend, queue_id: int) -> _Shape | None:
        key = (p.topic, queue_id, p.sys_flag, p.group, p.mid, p.after)
        shapes = self._shapes
        got: _Shape | None = shapes.get(key, _MISSING)
        if got is _MISSING:
            if len(shapes) >= _SHAPES_MAX:
                shapes.clear()
            got = shapes[key] = self._make_shape(p, queue_id)
        return got

    def _make_shape(self, p: HalfSend, queue_id: int) -> _Shape | None:
        """The shape's forms, prepared as the generic path prepares a half (None: it does not
        qualify)."""
        rest = p.mid[1:] + _STAND_IN_B + p.after
        try:
            names = string_to_properties(rest.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None
        if not _NOT_HERE.isdisjoint(names) or names.get(MessageConst.TRANSACTION_ID) != _STAND_IN:
            return None
        h = SendMessageRequestHeader(producer_group=p.group, topic=p.topic, sys_flag=p.sys_flag)
        prepare: Callable[[MessageExt, str], None] = self.tx.prepare_half
        t = make_half_template(rest, h, queue_id, prepare, self.tx.transaction_id_of)
        if t is None or t.batch_key is not None or t.txid != _STAND_IN:
            return None
        if _STAND_IN in t.group or _STAND_IN in t.real_topic:
            return None
        half, committed = _split(t.half), _split(t.committed)
        if half is None or committed is None:
            return None
        return _Shape(t.group, t.real_topic, t.real_queue_id, t.immunity_ms, half, committed)

    def store(
        self, p: HalfSend, queue_id: int, born_host: tuple[str, int], dedup: DedupIndex
    ) -> AppendResult | None:
        """Store the half ``p`` in the half queue, join it to its transaction and remember its
        committed copy, as the generic path does; where it was stored (not yet durable: the
        answer is the one of a batch of one, with ``p.txid``).  None: the generic path must
        take it (nothing was stored)."""

        shape = self._shape(p, queue_id)
        if shape is None:
            return None
        tx = self.tx
        txid = p.txid
        rec = tx.machine.records.get(txid)
        if rec is not None and (
            rec.producer_group != shape.group or rec.state is not TxState.PENDING
        ):
            return None  # the generic path refuses it
        topic = p.topic
        remember = dedup.enabled and dedup_topic(topic)
        if remember and dedup.known(topic, p.uniq):
            return None  # perhaps a resend: the generic path looks up the first send
        form = shape.half
        props = form.props(p.uniq_raw, p.txid_raw)
        if props is None:
            return None
        body = p.body
        crc = zlib.crc32(body) & 0x7FFFFFFF
        host = pack_host(born_host)
        record = (
            form.topic,
            form.queue_id,
            form.magic,
            crc,
            body,
            props,
            p.flag,
            form.sys_flag,
            p.born_timestamp,
            host,
            p.reconsume_times,
            0,
            form.tags_code,
        )
        res = tx.ctx.write.put_encoded([record])  # type: ignore[list-item]
        self.stored += 1
        placed = res.placed
        phy, _n, qo = placed[0]
        now = res.store_timestamp
        prefix = tx.ctx.store.msg_id_prefix
        tx.machine.add_half(
            txid,
            shape.group,
            None,
            HalfRef(
                phy,
                qo,
                shape.real_topic,
                shape.real_queue_id,
                now,
                p.uniq,
                f"{prefix}{phy:016X}",
                shape.immunity_ms,
            ),
        )
        tx.remember_committed(phy, shape.committed, p, crc, host)
        tx.counts.halves += 1
        if remember:  # remembered at its store timestamp, as a rebuild finds it
            dedup.add((topic, p.uniq), phy, now)
        return res


def committed_record(
    form: HalfForm, p: HalfSend, crc: int, host: bytes, phy: int
) -> EncodedMessage | None:
    """The committed copy of the half ``p`` stored at ``phy`` (None: its properties are too
    long; the commit reads it back and refuses it, as the generic path)."""
    props = form.props(p.uniq_raw, p.txid_raw)
    if props is None:
        return None
    return _new_tuple(
        EncodedMessage,
        (
            form.topic,
            form.queue_id,
            form.magic,
            crc,
            p.body,
            props,
            p.flag,
            form.sys_flag,
            p.born_timestamp,
            host,
            p.reconsume_times,
            phy,
            form.tags_code,
        ),
    )


__all__ = ["HalfBook", "HalfForm", "HalfSend", "HalfSends", "committed_record"]
