"""The direct paths: sends stored straight from the request, behind one seam.

The generic path of a send (a header object, a :class:`~txmq.protocol.message.MessageExt` per
message, its properties parsed into a dict and written back into a string, ``put_messages``)
costs several microseconds a message.  What producers send differs from one message to the
next in a value or two -- the UNIQ_KEY, a half's transaction id -- and what lies around those
values is the same.  Here those parts are judged once per *form* (per template, per shape) and
each message is stored as the form's bytes with its values put back: the same record, the same
answer as the generic path, without the objects.  Four direct paths, one seam:

* ``plain``: a SEND_BATCH_MESSAGE of plain messages, stored with their properties as sent
  (only canonical ones qualify, the form the generic path writes back);
* ``halves``: a SEND_BATCH_MESSAGE of the halves of one transaction whose UNIQ_KEY leads their
  properties (the Spark sink's, the SDK's batched transactions), prepared once per template as
  the generic path prepares each half
  (:meth:`~txmq.broker.transaction.service.TransactionalMessageService.prepare_half`), their
  committed messages built at the same time for the commit to come;
* ``one_plain``: a SEND_MESSAGE(_V2) of one plain message, read from its header fields;
* ``one_half``: a SEND_MESSAGE(_V2) of one half (``producer.transaction()`` with one message,
  ``send_message_in_transaction``), the parts around its UNIQ_KEY and transaction id prepared
  once per shape (:func:`make_half_template` on the shape with stand-ins for the two values).

:class:`FastPaths` is the seam: :meth:`FastPaths.read_one` / :meth:`FastPaths.read_batch` say
whether a request has a direct path (reading it as they go), :meth:`FastPaths.try_store`
stores it -- the duplicate window, the message trace and the transaction table told as the
generic path tells them -- and returns its :class:`~.outcome.SendOutcome`, or None when the
generic path must take it after all (a resend inside the duplicate window, a transaction the
half may not join); nothing is stored then.  Only :class:`~.core.MessagingCore`'s send use
case calls it: the front ends never pick a path.

Anything else -- a delay or a delivery time, a second UNIQ_KEY, non-canonical or non-UTF-8
properties, a header field not of its usual type, a malformed entry, an oversized body, plain
messages mixed with halves, halves while the message trace is on -- is read as None before a
byte is stored, and the generic path stores the request or gives its error.  Both paths store
the same bytes and answer the same (the differential tests prove it); ``fastPathEnable`` turns
all four off, and ``txmq_send_path_total{path}`` counts which path each remoting send took
(``generic``: it did not qualify; ``disabled``: the switch is off).
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from txmq.protocol.errors import ProtocolError, TxmqError
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import (
    MAX_PROPERTIES_BYTES,
    MessageConst,
    MessageExt,
    MessageSysFlag,
    pack_host,
    properties_to_string,
    stored_topic_part,
    string_to_properties,
)

from ..delivery import TIMER_DEL_UNIQKEY, TIMER_PROPERTIES
from ..store import AppendResult, EncodedMessage
from ..store.tags import tags_code_of
from ..transaction.committed import (
    HOST_V6_BITS,
    check_immunity_ms,
    committed_properties,
    committed_sys_flag,
)
from ..transaction.state import HalfRef, TxState
from .dedup import dedup_topic
from .outcome import SendOutcome, StoredBatch

if TYPE_CHECKING:
    from ..context import BrokerContext
    from ..metrics import BrokerMetrics
    from ..transaction.machine import TransactionStateMachine
    from .dedup import DedupIndex


class SendTrace(Protocol):
    """What the direct paths tell the message trace (:class:`~.trace.BrokerTrace`)."""

    def stored_plain(self, p: PlainSend, phy: int, store_timestamp: int, prefix: str) -> None: ...

    def stored_batch(self, topic: str, group: str, batch: StoredBatch) -> None: ...


class _HalfCounts(Protocol):
    halves: int


class HalfBook(Protocol):
    """What the direct paths of halves need of the transaction service (its port for them:
    :class:`~txmq.broker.transaction.service.TransactionalMessageService` is one)."""

    @property
    def machine(self) -> TransactionStateMachine: ...

    @property
    def counts(self) -> _HalfCounts: ...

    def prepare_half(self, msg: MessageExt, header_group: str) -> None: ...

    @staticmethod
    def transaction_id_of(props: dict[str, str]) -> str | None: ...

    def committed_body_max(self) -> int: ...

    def remember_committed(self, phy: int, record: EncodedMessage, n: int) -> None: ...

    def remember_committed_many(
        self, records: list[tuple[int, EncodedMessage]], n: int
    ) -> None: ...


_I16 = struct.Struct(">h")
#: A SEND_BATCH_MESSAGE entry's head (total size, magic, CRC, flag, body length) and its
#: properties length (:class:`~txmq.protocol.message.BatchBody`'s layout).
_ENTRY_HEAD = struct.Struct(">iiiii")
_ENTRY_HEAD_SIZE = _ENTRY_HEAD.size
_ENTRY_OVERHEAD = _ENTRY_HEAD_SIZE + _I16.size
_new_tuple = tuple.__new__
_KV = b"\x01"
_SEP = b"\x02"
_UNIQ = f"{MessageConst.UNIQ_KEY}\x01".encode()
_UNIQ_INSIDE = _SEP + _UNIQ
#: Properties a plain entry may not carry here: the generic path judges those (a delay it
#: refuses in a batch; a second UNIQ_KEY; a delivery time, for the timer; a recall marker).
_NOT_PLAIN = (
    MessageConst.TRAN_MSG,
    MessageConst.DELAY,
    MessageConst.UNIQ_KEY,
    TIMER_DEL_UNIQKEY,
    *TIMER_PROPERTIES,
)
#: A SEND_MESSAGE header's fields with their wire names (SEND_MESSAGE_V2's single letters, the
#: long ones) and the one native type each may have here (anything else, and any other key: the
#: generic path reads the header): producerGroup, topic, defaultTopic, defaultTopicQueueNums,
#: queueId, sysFlag, bornTimestamp, flag, properties, reconsumeTimes, unitMode,
#: maxReconsumeTimes, batch, brokerName.
_ONE_FIELDS = (
    ("a", "producerGroup", str),
    ("b", "topic", str),
    ("c", "defaultTopic", str),
    ("d", "defaultTopicQueueNums", int),
    ("e", "queueId", int),
    ("f", "sysFlag", int),
    ("g", "bornTimestamp", int),
    ("h", "flag", int),
    ("i", "properties", str),
    ("j", "reconsumeTimes", int),
    ("k", "unitMode", bool),
    ("l", "maxReconsumeTimes", int),
    ("m", "batch", bool),
    ("n", "brokerName", str),
)
#: wire key -> (field index, type), for SEND_MESSAGE_V2 and for SEND_MESSAGE.
_ONE_V2 = {v2: (i, tp) for i, (v2, _, tp) in enumerate(_ONE_FIELDS)}
_ONE_V1 = {name: (i, tp) for i, (_, name, tp) in enumerate(_ONE_FIELDS)}
_ONE_V2_KEYS = frozenset(_ONE_V2)
_ONE_V1_KEYS = frozenset(_ONE_V1)
#: Forms of plain messages kept (per topic, sys flag and properties around the UNIQ_KEY).
_ONE_FORMS_MAX = 4096
_TX_MASK = MessageSysFlag.TRANSACTION_MASK

#: A half's transaction id property, as it follows another property.
_TXID = f"\x02{MessageConst.TRANSACTION_ID}\x01".encode()
#: What stands for the transaction id while a half's shape is prepared (no separator, never
#: sent: a shape that holds it is left to the generic path).
_STAND_IN = "\x00txid\x00"
_STAND_IN_B = _STAND_IN.encode()
_PREPARED = MessageSysFlag.TRANSACTION_PREPARED_TYPE
#: Properties that send a half sent alone to the generic path (it judges them against its
#: clock or the batch table).
_NOT_HERE = frozenset(
    (MessageConst.DELAY, MessageConst.TXMQ_BATCH_KEY, MessageConst.TXMQ_2PC, *TIMER_PROPERTIES)
)
#: Shapes of halves sent alone kept (per topic, queue, sys flag, header group and the
#: properties around the two values).
_SHAPES_MAX = 4096

#: The paths a remoting send takes (the ``path`` label of ``txmq_send_path_total``): the four
#: direct paths, and the generic one (``disabled``: because ``fastPathEnable`` is off).
PATH_PLAIN, PATH_HALVES, PATH_ONE_PLAIN, PATH_ONE_HALF = "plain", "halves", "one_plain", "one_half"
PATH_GENERIC, PATH_DISABLED = "generic", "disabled"
PATHS = (PATH_PLAIN, PATH_HALVES, PATH_ONE_PLAIN, PATH_ONE_HALF, PATH_GENERIC, PATH_DISABLED)


@dataclass(slots=True)
class StoredForm:
    """How the entries of one template are stored: every field of the record but the body,
    its CRC and the UNIQ_KEY.  The tail (topic and properties) is ``head(n) + UNIQ_KEY +
    tail`` for a UNIQ_KEY of ``n`` bytes."""

    topic: str
    queue_id: int
    magic: int
    topic_part: bytes
    #: The properties before ``UNIQ_KEY<01>`` (ending in a separator), and from the UNIQ_KEY's
    #: terminator on.
    before: bytes
    tail: bytes
    sys_flag: int
    tags_code: int
    heads: dict[int, bytes] = field(default_factory=dict)
    #: the producer-group property, tags and keys of its entries, for the message trace
    #: (read once per form, when a trace first needs them)
    trace_fields: tuple[str, str, str] | None = None

    def head(self, n: int) -> bytes | None:
        """Topic, properties length, the properties before the UNIQ_KEY and ``UNIQ_KEY<01>``
        for a UNIQ_KEY of ``n`` bytes; None when the properties would be too long (the generic
        path refuses them)."""
        head = self.heads.get(n)
        if head is None:
            plen = len(self.before) + len(_UNIQ) + n + len(self.tail)
            if plen > MAX_PROPERTIES_BYTES:
                return None
            head = self.heads[n] = b"".join((self.topic_part, _I16.pack(plen), self.before, _UNIQ))
        return head

    def record(
        self,
        crc: int,
        body: bytes,
        head: bytes,
        uniq: bytes,
        flag: int,
        born_timestamp: int,
        born_host: bytes,
        reconsume_times: int,
        prepared_offset: int = 0,
    ) -> EncodedMessage:
        """The record of one entry (a half's committed copy; :func:`parse_batch` builds the
        same tuple inline, in C: a NamedTuple's own constructor is a Python call, a cost per
        message there)."""
        return _new_tuple(
            EncodedMessage,
            (
                self.topic,
                self.queue_id,
                self.magic,
                crc,
                body,
                b"".join((head, uniq, self.tail)),
                flag,
                self.sys_flag,
                born_timestamp,
                born_host,
                reconsume_times,
                prepared_offset,
                self.tags_code,
            ),
        )


def stored_form(
    topic: str, queue_id: int, before: bytes, tail: bytes, sys_flag: int, tags: str | None
) -> StoredForm:
    """Raises ProtocolError for a topic that cannot be stored."""
    magic, topic_part = stored_topic_part(topic)
    return StoredForm(
        topic, queue_id, magic, topic_part, before, tail, sys_flag, tags_code_of(tags)
    )


@dataclass(slots=True)
class HalfTemplate:
    """What halves with the same properties after their leading UNIQ_KEY share: how the half
    and its committed message are stored, and what the transaction table needs."""

    txid: str
    group: str
    batch_key: str | None
    real_topic: str
    real_queue_id: int
    immunity_ms: int | None
    half: StoredForm
    committed: StoredForm


#: A template: plain entries are stored as sent (a :class:`StoredForm`), halves as prepared.
Template = StoredForm | HalfTemplate


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


@dataclass(slots=True)
class PlainSend:
    """A SEND_MESSAGE (or _V2) of one plain message, read straight from its header: what its
    topic lookup, its store and its duplicate check need (see :meth:`FastPaths.read_one`)."""

    topic: str
    group: str
    #: the queue asked for (-1: any) and the queues a topic created by this send gets
    queue_id: int
    queue_nums: int
    body: bytes
    #: the UNIQ_KEY, as text and as sent
    uniq: str
    uniq_raw: bytes
    #: topic, properties length and properties up to the UNIQ_KEY's value; the rest
    head: bytes
    form: StoredForm
    flag: int
    born_timestamp: int
    reconsume_times: int

    def trace_fields(self) -> tuple[str, str, str]:
        """Its ``PGROUP``, ``TAGS`` and ``KEYS`` properties ('' when absent), for the message
        trace: the same for every send of its form, so read once per form."""
        form = self.form
        got = form.trace_fields
        if got is None:
            props = string_to_properties(
                b"".join((form.before, _UNIQ, self.uniq_raw, form.tail)).decode("utf-8")
            )
            get = props.get
            got = form.trace_fields = (
                get(MessageConst.PGROUP, ""),
                get(MessageConst.TAGS, ""),
                get(MessageConst.KEYS, ""),
            )
        return got

    def record(self, queue_id: int, born_host: bytes) -> tuple[Any, ...]:
        """The fields of its :class:`EncodedMessage`, as the generic path encodes it."""
        form = self.form
        body = self.body
        return (
            self.topic,
            queue_id,
            form.magic,
            zlib.crc32(body) & 0x7FFFFFFF,
            body,
            b"".join((self.head, self.uniq_raw, form.tail)),
            self.flag,
            form.sys_flag,
            self.born_timestamp,
            born_host,
            self.reconsume_times,
            0,
            form.tags_code,
        )


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
    """A SEND_MESSAGE(_V2) of one half, read from its header (see :meth:`FastPaths.read_one`)."""

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
    """A :class:`StoredForm` made with the stand-in, cut around it."""
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


def header_values(v2: bool, ext: dict[str, Any]) -> list[Any] | None:
    """The fields of a SEND_MESSAGE(_V2) header by position (``_ONE_V1``/``_ONE_V2``), when
    every field is one the direct paths know and has its native type; None otherwise (the
    generic path reads the request)."""
    if v2:
        if not _ONE_V2_KEYS.issuperset(ext):
            return None
        fields = _ONE_V2
    else:
        if not _ONE_V1_KEYS.issuperset(ext):
            return None
        fields = _ONE_V1
    vals: list[Any] = [None] * 14
    for k, v in ext.items():
        if v is None:
            continue
        i, tp = fields[k]
        if v.__class__ is not tp:
            return None
        vals[i] = v
    return vals


class PathCounts:
    """The remoting sends each path took, counted in plain integers on the event loop and
    added to ``txmq_send_path_total{path}`` whenever the metrics are read (:meth:`fold`, from
    any thread): no Prometheus call per send."""

    __slots__ = (*PATHS, "_children", "_folded", "_lock")

    def __init__(self, metrics: BrokerMetrics) -> None:
        self.plain = self.halves = self.one_plain = self.one_half = 0
        self.generic = self.disabled = 0
        counter = metrics.send_path
        self._children = {path: counter.labels(path) for path in PATHS}
        self._folded = dict.fromkeys(PATHS, 0)
        self._lock = threading.Lock()
        metrics.registry.folds.append(self.fold)

    def fold(self) -> None:
        with self._lock:
            folded = self._folded
            for path in PATHS:
                total: int = getattr(self, path)
                n = total - folded[path]
                if n:
                    self._children[path].inc(n)
                    folded[path] = total


#: What :meth:`FastPaths.read_one` reads: one plain message or one half.
OneSend = PlainSend | HalfSend


class FastPaths:
    """The seam of the four direct paths (see the module's text): :meth:`read_one` and
    :meth:`read_batch` read a request a direct path can take, :meth:`try_store` stores it;
    every path is counted in :attr:`counts`, all behind ``fastPathEnable``."""

    def __init__(
        self,
        ctx: BrokerContext,
        tx: HalfBook,
        dedup: DedupIndex,
        trace: SendTrace | None,
    ) -> None:
        self.ctx = ctx
        self.tx = tx
        self.dedup = dedup
        self.trace = trace
        cfg = ctx.config
        self.enabled = cfg.fast_path_enable
        #: halves sent alone are left to the generic path while the trace is on (and while
        #: the broker refuses transactional messages, a setting that may change at run time:
        #: read per half; the generic path gives the refusal)
        self._halves_alone = self.enabled and trace is None
        self.counts = PathCounts(ctx.metrics)
        self._one_forms: dict[tuple[str, int, bytes, bytes], StoredForm | None] = {}
        self._shapes: dict[tuple[str, int, int, str, bytes, bytes], _Shape | None] = {}

    # -- reading a request -----------------------------------------------------------------

    def read_one(self, v2: bool, ext: dict[str, Any], body: bytes) -> OneSend | None:
        """A SEND_MESSAGE(_V2) request's message when a direct path can store it as it is:
        every header field present with its native type, a UNIQ_KEY, canonical properties
        with no delay or delivery time, a body within ``maxMessageSize``; a plain message,
        or a half whose properties are led by its UNIQ_KEY and hold a non-empty
        ``__transactionId__``.  None: the generic path reads it (and gives any error)."""
        if not self.enabled:
            self.counts.disabled += 1
            return None
        vals = header_values(v2, ext)
        if vals is None or body.__class__ is not bytes:
            self.counts.generic += 1
            return None
        (group, topic, _dt, nums, qid, sys_flag, born_ts, flag, props, reconsume) = vals[:10]
        if group is None or topic is None or props is None or vals[12]:
            if not vals[12]:  # a batch is counted where it is read (read_batch)
                self.counts.generic += 1
            return None
        if sys_flag is None:
            sys_flag = 0
        elif sys_flag & _TX_MASK:
            return self._read_half(vals, body)  # the generic path judges any other flag
        if len(body) > self.ctx.config.max_message_size:
            self.counts.generic += 1
            return None
        try:
            raw = props.encode("utf-8")
        except UnicodeEncodeError:
            self.counts.generic += 1
            return None
        if raw.startswith(_UNIQ):
            at = 0
        else:
            at = raw.find(_UNIQ_INSIDE) + 1
            if at == 0:
                self.counts.generic += 1
                return None
        sep = raw.find(_SEP, at + len(_UNIQ))
        uniq_raw = raw[at + len(_UNIQ) : sep]
        if sep < 0 or not uniq_raw or _KV in uniq_raw:
            self.counts.generic += 1
            return None
        before, after = raw[:at], raw[sep:]
        key = (topic, sys_flag, before, after)
        forms = self._one_forms
        form = forms.get(key, _MISSING)
        if form is _MISSING:
            if len(forms) >= _ONE_FORMS_MAX:
                forms.clear()
            form = forms[key] = _plain_form(topic, sys_flag, before, after)
        head = form.head(len(uniq_raw)) if form is not None else None
        if head is None:
            self.counts.generic += 1
            return None
        return PlainSend(
            topic,
            group,
            -1 if qid is None else qid,
            4 if nums is None else nums,
            body,
            uniq_raw.decode("utf-8"),
            uniq_raw,
            head,
            form,
            0 if flag is None else flag,
            0 if born_ts is None else born_ts,
            0 if reconsume is None else reconsume,
        )

    def _read_half(self, vals: list[Any], body: bytes) -> HalfSend | None:
        """:meth:`read_one` of a message with a transaction flag: a half it can store."""
        cfg = self.ctx.config
        (group, topic, _dt, nums, qid, sys_flag, born_ts, flag, props, reconsume) = vals[:10]
        if (
            not self._halves_alone
            or cfg.reject_transaction_message
            or sys_flag & _TX_MASK != _PREPARED
            or sys_flag & HOST_V6_BITS
            or len(body) > cfg.max_message_size
        ):
            self.counts.generic += 1
            return None
        try:
            raw = props.encode("utf-8")
        except UnicodeEncodeError:
            self.counts.generic += 1
            return None
        if not raw.startswith(_UNIQ):
            self.counts.generic += 1
            return None
        sep = raw.find(_SEP, len(_UNIQ))
        t = raw.find(_TXID, sep) if sep > 0 else -1
        t_at = t + len(_TXID)
        t_end = raw.find(_SEP, t_at) if t >= 0 else -1
        if t_end < 0:
            self.counts.generic += 1
            return None
        uniq_raw = raw[len(_UNIQ) : sep]
        txid_raw = raw[t_at:t_end]
        if not uniq_raw or not txid_raw or _KV in uniq_raw or _KV in txid_raw:
            self.counts.generic += 1
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

    def read_batch(
        self, h: SendMessageRequestHeader, queue_id: int, body: bytes, born_host: tuple[str, int]
    ) -> FastBatch | None:
        """A SEND_BATCH_MESSAGE's records when a direct path can store it (:func:`parse_batch`);
        None: the generic path takes it."""
        if not self.enabled:
            self.counts.disabled += 1
            return None
        batch = parse_batch(
            h, queue_id, body, born_host, self.ctx.config.max_message_size, self._half_template
        )
        if batch is None:
            self.counts.generic += 1
        return batch

    def _half_template(
        self, rest: bytes, h: SendMessageRequestHeader, queue_id: int
    ) -> HalfTemplate | None:
        return make_half_template(
            rest, h, queue_id, self.tx.prepare_half, self.tx.transaction_id_of
        )

    # -- storing it ------------------------------------------------------------------------

    def try_store(
        self, req: OneSend | FastBatch, queue_id: int, born_host: tuple[str, int]
    ) -> SendOutcome | None:
        """Store what :meth:`read_one` or :meth:`read_batch` read, in queue ``queue_id``, as
        the generic path stores it: the duplicate window, the message trace and the
        transaction table told alike.  Its outcome (not yet durable); None: the generic path
        must take it (perhaps a resend, or a half its transaction refuses), nothing was
        stored."""
        if req.__class__ is PlainSend:
            p = req
            dedup = self.dedup
            topic = p.topic
            remember = dedup.enabled and dedup_topic(topic)
            if remember and dedup.known(topic, p.uniq):
                self.counts.generic += 1
                return None  # perhaps a resend: the generic path looks up the first send
            res = self.ctx.write.put_encoded([p.record(queue_id, pack_host(born_host))])  # type: ignore[list-item]
            self.counts.one_plain += 1
            phy = res.placed[0][0]
            if remember:  # remembered at its store timestamp, as a rebuild finds it
                dedup.add((topic, p.uniq), phy, res.store_timestamp)
            prefix = self.ctx.store.msg_id_prefix
            if self.trace is not None:
                self.trace.stored_plain(p, phy, res.store_timestamp, prefix)
            return SendOutcome(
                batch=StoredBatch(prefix, res.placed, [p.uniq], queue_id, None, res.end_offset)
            )
        if req.__class__ is HalfSend:
            return self._store_half(req, queue_id, born_host)
        return self._store_batch(req, queue_id)  # type: ignore[arg-type]

    def _store_batch(self, batch: FastBatch, queue_id: int) -> SendOutcome | None:
        dedup = self.dedup
        fresh = None
        uniqs = batch.uniq_keys
        topic = batch.topic
        if dedup.enabled and dedup_topic(topic) and "" not in uniqs:
            fresh = dedup.fresh(topic, uniqs)
            if fresh is None:
                # A resend (or partly one, or a message twice): the generic path stores what
                # is new, once.
                self.counts.generic += 1
                return None
        # A batch's records share their topic, queue and sys flag (see parse_batch).
        res = self.ctx.write.put_encoded(batch.records, one_run=True)
        if batch.halves is not None:
            self._halves_stored(batch, res)
            self.counts.halves += 1
        else:
            self.counts.plain += 1
        placed = res.placed
        if fresh is not None:
            dedup.add_fresh(topic, fresh, placed, res.store_timestamp)
        stored = StoredBatch(
            self.ctx.store.msg_id_prefix, placed, uniqs, queue_id, batch.txid, res.end_offset
        )
        if self.trace is not None:
            self.trace.stored_batch(topic, batch.group, stored)
        return SendOutcome(batch=stored)

    def _halves_stored(self, batch: FastBatch, res: AppendResult) -> None:
        """The halves of ``batch``, just stored, join their transaction and their committed
        messages are remembered for the commit: what the transaction service does for the
        same halves stored by the generic path."""
        halves = batch.halves
        assert halves is not None and batch.raw_uniqs is not None
        tx = self.tx
        first = halves[0]
        placed = res.placed
        now = res.store_timestamp
        prefix = self.ctx.store.msg_id_prefix
        tx.machine.add_halves(
            first.txid,
            first.group,
            first.batch_key,
            [
                HalfRef(
                    phy,
                    qo,
                    t.real_topic,
                    t.real_queue_id,
                    now,
                    text,
                    f"{prefix}{phy:016X}",
                    t.immunity_ms,
                )
                for (phy, _n, qo), text, t in zip(placed, batch.uniq_keys, halves, strict=True)
            ],
        )
        too_big = tx.committed_body_max()
        if too_big >= 0:
            kept: list[tuple[int, EncodedMessage]] = []
            keep = kept.append
            added = 0
            join = b"".join
            # The committed form of the current template in locals: each record is a tuple
            # made in C (what ``StoredForm.record`` makes), no call per half.
            last: HalfTemplate | None = None
            form: StoredForm | None = None
            heads: dict[int, bytes] = {}
            topic, qid, magic, tail, sys_flag, tags_code = "", 0, 0, b"", 0, 0
            for (phy, _n, _qo), r, t, u in zip(
                placed, batch.records, halves, batch.raw_uniqs, strict=True
            ):
                b = r.body
                n = len(b)
                if n > too_big:
                    continue
                if t is not last:
                    last = t
                    form = t.committed
                    heads = form.heads
                    topic, qid, magic, tail = form.topic, form.queue_id, form.magic, form.tail
                    sys_flag, tags_code = form.sys_flag, form.tags_code
                head = heads.get(len(u))
                if head is None:
                    assert form is not None
                    head = form.head(len(u))
                    if head is None:
                        continue  # the commit reads it back and refuses it, as the generic path
                keep(
                    (
                        phy,
                        _new_tuple(
                            EncodedMessage,
                            (
                                topic,
                                qid,
                                magic,
                                r.body_crc,
                                b,
                                join((head, u, tail)),
                                r.flag,
                                sys_flag,
                                r.born_timestamp,
                                r.born_host,
                                r.reconsume_times,
                                phy,
                                tags_code,
                            ),
                        ),
                    )
                )
                added += n
            tx.remember_committed_many(kept, added)
        tx.counts.halves += len(batch.records)

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

    def _store_half(
        self, p: HalfSend, queue_id: int, born_host: tuple[str, int]
    ) -> SendOutcome | None:
        """Store the half ``p`` in the half queue, join it to its transaction and remember its
        committed copy, as the generic path does; answered as a batch of one with ``p.txid``.
        None: the generic path must take it (nothing was stored)."""
        shape = self._shape(p, queue_id)
        if shape is None:
            self.counts.generic += 1
            return None
        tx = self.tx
        txid = p.txid
        rec = tx.machine.records.get(txid)
        if rec is not None and (
            rec.producer_group != shape.group or rec.state is not TxState.PENDING
        ):
            self.counts.generic += 1
            return None  # the generic path refuses it
        dedup = self.dedup
        topic = p.topic
        remember = dedup.enabled and dedup_topic(topic)
        if remember and dedup.known(topic, p.uniq):
            self.counts.generic += 1
            return None  # perhaps a resend: the generic path looks up the first send
        form = shape.half
        props = form.props(p.uniq_raw, p.txid_raw)
        if props is None:
            self.counts.generic += 1
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
        res = self.ctx.write.put_encoded([record])  # type: ignore[list-item]
        self.counts.one_half += 1
        placed = res.placed
        phy, _n, qo = placed[0]
        now = res.store_timestamp
        prefix = self.ctx.store.msg_id_prefix
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
        n = len(body)
        if n <= tx.committed_body_max():
            committed = committed_record(shape.committed, p, crc, host, phy)
            if committed is not None:  # else the commit reads it back and refuses it
                tx.remember_committed(phy, committed, n)
        tx.counts.halves += 1
        if remember:  # remembered at its store timestamp, as a rebuild finds it
            dedup.add((topic, p.uniq), phy, now)
        return SendOutcome(
            batch=StoredBatch(prefix, placed, [p.uniq], queue_id, txid, res.end_offset)
        )


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


_MISSING: Any = object()


def _plain_form(topic: str, sys_flag: int, before: bytes, after: bytes) -> StoredForm | None:
    """How a plain message with properties ``before`` + UNIQ_KEY + ``after`` is stored, or
    None when the generic path must judge it (as :func:`_template`, the sys flag as sent)."""
    rest = after[1:]
    try:
        text = (before + rest).decode("utf-8")
        props = string_to_properties(text)
        if properties_to_string(props) != text:
            return None
    except (UnicodeDecodeError, ProtocolError):
        return None
    if any(k in props for k in _NOT_PLAIN):
        return None
    try:
        return stored_form(topic, -1, before, after, sys_flag, props.get(MessageConst.TAGS))
    except ProtocolError:
        return None


def make_half_template(
    rest: bytes,
    h: SendMessageRequestHeader,
    queue_id: int,
    prepare_half: Callable[[MessageExt, str], None],
    transaction_id_of: Callable[[dict[str, str]], str | None],
) -> HalfTemplate | None:
    """The :class:`HalfTemplate` of halves whose properties after their leading UNIQ_KEY are
    ``rest``: parsed and prepared (``prepare_half``) as the generic path does each half; None
    when they do not qualify (not transactional, the transaction id not in a property of its
    own, a UNIQ_KEY further on, anything refused)."""
    try:
        rest_props = string_to_properties(rest.decode("utf-8"))
    except (UnicodeDecodeError, ProtocolError):
        return None
    C = MessageConst
    if (
        C.UNIQ_KEY in rest_props
        or rest_props.get(C.TRAN_MSG, "").lower() != "true"
        or not rest_props.get(C.TRANSACTION_ID)
        or C.TXMQ_2PC in rest_props  # two-phase halves: the generic path marks their record
    ):
        return None
    props = {C.UNIQ_KEY: "", **rest_props}  # the order of the wire
    msg = MessageExt(
        topic=h.topic, body=b"", queue_id=queue_id, sys_flag=h.sys_flag & ~0xC, properties=props
    )
    try:
        prepare_half(msg, h.producer_group)
    except TxmqError:
        return None  # the generic path raises it for the first such half
    committed = committed_properties(props)
    if next(iter(props)) != C.UNIQ_KEY or next(iter(committed)) != C.UNIQ_KEY:
        return None
    del props[C.UNIQ_KEY], committed[C.UNIQ_KEY]
    txid = transaction_id_of(props)
    if not txid or txid != props.get(C.TRANSACTION_ID):
        return None
    immunity_ms = check_immunity_ms(props)
    real_topic = props.get(C.REAL_TOPIC, "")
    tags = props.get(C.TAGS)
    try:
        real_queue_id = int(props.get(C.REAL_QID, "0") or 0)
        half = stored_form(
            msg.topic,
            msg.queue_id,
            b"",
            _SEP + properties_to_string(props).encode("utf-8"),
            msg.sys_flag,
            tags,
        )
        committed_form = stored_form(
            real_topic,
            real_queue_id,
            b"",
            _SEP + properties_to_string(committed).encode("utf-8"),
            committed_sys_flag(msg.sys_flag),
            tags,
        )
    except (ProtocolError, ValueError):
        return None
    return HalfTemplate(
        txid=txid,
        group=props.get(C.PGROUP, ""),
        batch_key=props.get(C.TXMQ_BATCH_KEY),
        real_topic=real_topic,
        real_queue_id=real_queue_id,
        immunity_ms=immunity_ms,
        half=half,
        committed=committed_form,
    )


__all__ = [
    "PATHS",
    "PATH_DISABLED",
    "PATH_GENERIC",
    "PATH_HALVES",
    "PATH_ONE_HALF",
    "PATH_ONE_PLAIN",
    "PATH_PLAIN",
    "FastBatch",
    "FastPaths",
    "HalfBook",
    "HalfForm",
    "HalfSend",
    "HalfTemplate",
    "OneSend",
    "PathCounts",
    "PlainSend",
    "StoredForm",
    "committed_record",
    "make_half_template",
    "parse_batch",
]
