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

import threading
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import MessageConst, MessageExt, pack_host, string_to_properties

from ..store import AppendResult, EncodedMessage
from ..transaction.committed import HOST_V6_BITS
from ..transaction.state import HalfRef, TxState
from .dedup import dedup_topic
from .fastpath_batch import FastBatch, parse_batch
from .fastpath_forms import (
    _KV,
    _SEP,
    _UNIQ,
    _UNIQ_INSIDE,
    HalfTemplate,
    StoredForm,
    _new_tuple,
    _plain_form,
    make_half_template,
)
from .fastpath_one import (
    _NOT_HERE,
    _ONE_FORMS_MAX,
    _PREPARED,
    _SHAPES_MAX,
    _STAND_IN,
    _STAND_IN_B,
    _TX_MASK,
    _TXID,
    HalfSend,
    OneSend,
    PlainSend,
    _Shape,
    _split,
    committed_record,
    header_values,
)
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


#: The paths a remoting send takes (the ``path`` label of ``txmq_send_path_total``): the four
#: direct paths, and the generic one (``disabled``: because ``fastPathEnable`` is off).
PATH_PLAIN, PATH_HALVES, PATH_ONE_PLAIN, PATH_ONE_HALF = "plain", "halves", "one_plain", "one_half"
PATH_GENERIC, PATH_DISABLED = "generic", "disabled"
PATHS = (PATH_PLAIN, PATH_HALVES, PATH_ONE_PLAIN, PATH_ONE_HALF, PATH_GENERIC, PATH_DISABLED)


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
        try:
            form = forms[key]  # None too: a form that does not qualify is remembered
        except KeyError:
            if len(forms) >= _ONE_FORMS_MAX:
                forms.clear()
            form = forms[key] = _plain_form(topic, sys_flag, before, after)
        head = form.head(len(uniq_raw)) if form is not None else None
        if form is None or head is None:
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

    # The committed copies are built in one loop, in locals, no call per half: kept whole.
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
        try:
            return shapes[key]  # None too: a shape that does not qualify is remembered
        except KeyError:
            pass
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


__all__ = [
    "PATHS",
    "PATH_DISABLED",
    "PATH_GENERIC",
    "PATH_HALVES",
    "PATH_ONE_HALF",
    "PATH_ONE_PLAIN",
    "PATH_PLAIN",
    "FastPaths",
    "HalfBook",
    "PathCounts",
    # the gRPC front end reads a send's fields through it
    "PlainSend",
]
