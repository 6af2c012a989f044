"""POP consumption, the read side of RocketMQ 5's SimpleConsumer and PushConsumer (gRPC
ReceiveMessage / AckMessage / ChangeInvisibleDuration, remoting POP_MESSAGE / ACK_MESSAGE /
CHANGE_MESSAGE_INVISIBLETIME / BATCH_ACK_MESSAGE), written once for both front ends.

Per (consumer group, topic, queue) a :class:`QueueView` keeps:

* ``committed`` - every offset below it is acked; it is the group's consumer offset in the
  broker's offset table (the one remoting consumers, lag and ``txmq group`` commands see),
  committed whenever the acked prefix grows;
* ``next`` - the first offset never handed out;
* ``inflight`` - offsets handed out and not acked: the receipt handle's nonce, when the message
  becomes visible again (epoch ms), how many times it was delivered;
* ``acked`` - acked (or filtered out) offsets above ``committed`` (acks come in any order).

**Durable.**  Every change is a record appended to the commit log (queue 0 of
:data:`POP_STATE_TOPIC`, msgpack): a hand-out (``ck``: the offsets, their nonces and attempts,
the visible time, and the view's ``next`` before and after, so what a filter skipped is known),
an ack, a change of invisible time, a reset (an operator moved the group's offset), and now and
then a snapshot of every view (``snap``).  The records are replicated with the rest of the log,
so a restart and a new leader rebuild the same views (:meth:`PopService.recover`): the newest
snapshot found scanning the queue backwards, then the records after it.  Receipt handles,
invisible deadlines and delivery attempts therefore survive a SIGKILL and a failover: a message
never acked is delivered again after its invisible time with its attempt count going on, and
after the group's ``retryMaxTimes + 1`` deliveries goes to ``%DLQ%<group>``.

A record is appended without waiting for it to be flushed: a crash can lose the last ones, which
only makes a message visible sooner (an ack lost: delivered again; a hand-out lost: delivered
again without that attempt counted) - at least once, never lost.

A group whose settings say ``consumeMessageOrderly`` is FIFO (the broker decides, as RocketMQ's
proxy does): a queue with an invisible message hands out nothing else, and what became visible
again is handed out first, in offset order.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack
import structlog

from txmq.protocol.errors import InvalidParameterError
from txmq.protocol.message import MessageExt, decode_message
from txmq.protocol.topics import POP_STATE_TOPIC

from ..store import GetMessageStatus
from ..store.reading import read_queue
from .read import ReadFilter, ReadSide, readable_topic

if TYPE_CHECKING:
    from ..context import BrokerContext
    from ..sql_filter import StoredFilter

log = structlog.get_logger(__name__)

#: A snapshot record after this many other records (bounds what a recovery replays) ...
SNAPSHOT_EVERY_RECORDS = 512
#: ... or when the last one is older than this and something changed since.
SNAPSHOT_EVERY_MS = 5_000
#: Records read per store call while recovering.
_READ_BATCH = 256


class ReceiptHandleError(InvalidParameterError):
    """A receipt handle that is malformed, of another group or topic, acked, or replaced by a
    later delivery of its message."""


@dataclass(slots=True)
class InFlight:
    offset: int
    nonce: str
    #: When the message becomes visible again (epoch ms, the broker's clock).
    visible_at: int
    #: Deliveries so far (1 on the first).
    attempts: int


@dataclass
class QueueView:
    committed: int
    next: int
    inflight: dict[int, InFlight] = field(default_factory=dict)
    acked: set[int] = field(default_factory=set)

    def due(self, now: int) -> list[InFlight]:
        """In-flight messages whose invisible time has passed, in offset order."""
        return sorted(
            (x for x in self.inflight.values() if x.visible_at <= now), key=lambda x: x.offset
        )

    def blocked(self, now: int) -> bool:
        """FIFO: a queue with an invisible message hands out nothing else."""
        return any(x.visible_at > now for x in self.inflight.values())

    def next_visible(self) -> int | None:
        return min((x.visible_at for x in self.inflight.values()), default=None)

    def hand_out(self, offset: int, visible_at: int, attempts: int, nonce: str) -> InFlight:
        x = InFlight(offset, nonce, visible_at, attempts)
        self.inflight[offset] = x
        return x

    def ack(self, offset: int) -> bool:
        """Mark ``offset`` acked; True if ``committed`` moved."""
        self.inflight.pop(offset, None)
        if offset < self.committed:
            return False
        self.acked.add(offset)
        return self.settle()

    def settle(self) -> bool:
        """Move ``committed`` over the acked prefix; True if it moved."""
        moved = False
        while self.committed in self.acked:
            self.acked.discard(self.committed)
            self.committed += 1
            moved = True
        return moved

    def skip_to(self, offset: int) -> None:
        """Offsets in [next, offset) were filtered out or are gone: they count as acked."""
        for o in range(self.next, offset):
            if o not in self.inflight:
                self.acked.add(o)
        self.next = max(self.next, offset)

    def reset(self, offset: int) -> None:
        """Start again at ``offset``: nothing in flight, nothing acked ahead."""
        self.committed = self.next = offset
        self.inflight = {}
        self.acked = set()

    def moved(self, offset: int) -> None:
        """The queue moved under the view (retention, or an offset beyond its end)."""
        self.committed = self.next = offset
        self.inflight = {k: v for k, v in self.inflight.items() if k >= offset}
        self.acked = {o for o in self.acked if o >= offset}

    def to_doc(self) -> list[Any]:
        return [
            self.committed,
            self.next,
            [[x.offset, x.nonce, x.visible_at, x.attempts] for x in self.inflight.values()],
            sorted(self.acked),
        ]

    @classmethod
    def from_doc(cls, doc: list[Any]) -> QueueView:
        committed, nxt, inflight, acked = doc
        v = cls(int(committed), int(nxt))
        for o, nonce, vis, att in inflight:
            v.inflight[int(o)] = InFlight(int(o), str(nonce), int(vis), int(att))
        v.acked = {int(o) for o in acked}
        return v


def make_handle(queue_id: int, x: InFlight) -> str:
    """A receipt handle: queue, offset and the nonce of this delivery (the group and topic
    come with every request that carries a handle)."""
    return f"{queue_id}-{x.offset}-{x.nonce}"


def parse_handle(handle: str) -> tuple[int, int, str]:
    """(queue id, offset, nonce) of a receipt handle.

    Raises:
        ReceiptHandleError: not a handle this broker issues.
    """
    parts = handle.split("-")
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() for p in parts[:2]) or not parts[2]:
        raise ReceiptHandleError(f"invalid receipt handle {handle!r}")
    return int(parts[0]), int(parts[1]), parts[2]


@dataclass(slots=True)
class Delivery:
    """One message handed out: the message, its queue, the handle, the attempt."""

    message: MessageExt
    queue_id: int
    handle: str
    attempts: int
    invisible_ms: int


Key = tuple[str, str, int]


class PopService:
    """Every queue view, kept durable in the commit log (see the module's text).

    ``dead_letter(group, message, attempts)`` moves a message to the group's dead-letter
    queue (the core's use case)."""

    def __init__(
        self,
        ctx: BrokerContext,
        dead_letter: Callable[[str, MessageExt, int], object],
        reads: ReadSide,
    ) -> None:
        self.ctx = ctx
        self._dead_letter = dead_letter
        self.reads = reads
        self.trace = reads.trace
        self.views: dict[Key, QueueView] = {}
        self._since_snapshot = 0
        self._snapshot_ms = 0
        #: Records replayed by the last :meth:`recover`.
        self.replayed = 0
        self._rr = 0
        self._last_pop_time = 0

    # -- durability -----------------------------------------------------------------------------

    def _record(self, doc: dict[str, Any], now: int) -> MessageExt:
        return MessageExt(
            topic=POP_STATE_TOPIC,
            body=msgpack.packb(doc, use_bin_type=True),
            queue_id=0,
            born_timestamp=now,
            born_host=("127.0.0.1", 0),
        )

    def _append(self, doc: dict[str, Any]) -> None:
        """Append one change (the views already show it), with a snapshot after it in the same
        append when one is due."""
        now = self.ctx.now_ms()
        records = [self._record(doc, now)]
        self._since_snapshot += 1
        if (
            self._since_snapshot >= SNAPSHOT_EVERY_RECORDS
            or now - self._snapshot_ms >= SNAPSHOT_EVERY_MS
        ):
            records.append(self._snapshot(now))
        self.ctx.write.put_messages(records)

    def _snapshot(self, now: int) -> MessageExt:
        """A snapshot record of every view (counted as written)."""
        views = [[g, t, q, v.to_doc()] for (g, t, q), v in self.views.items()]
        self._since_snapshot = 0
        self._snapshot_ms = now
        return self._record({"k": "snap", "views": views}, now)

    def _records_from(self, offset: int) -> Iterator[tuple[int, dict[str, Any]]]:
        for m in read_queue(self.ctx.store, POP_STATE_TOPIC, 0, offset, chunk=_READ_BATCH):
            try:
                doc = msgpack.unpackb(m.body, raw=False)
            except (ValueError, msgpack.UnpackException) as exc:
                log.error(
                    "pop_record_unreadable",
                    queue_offset=m.queue_offset,
                    commit_log_offset=m.commit_log_offset,
                    error=str(exc),
                )
                continue
            if isinstance(doc, dict):
                yield m.queue_offset, doc

    def _latest_snapshot(self) -> int | None:
        """The queue offset of the newest snapshot record, scanning backwards."""
        store = self.ctx.store
        lo = store.get_min_offset_in_queue(POP_STATE_TOPIC, 0)
        hi = store.get_max_offset_in_queue(POP_STATE_TOPIC, 0)
        at = hi - 1
        while at >= lo:
            r = store.get_messages(POP_STATE_TOPIC, 0, at, 1)
            if r.status is GetMessageStatus.FOUND:
                m = decode_message(r.messages[0])
                # a snapshot's body starts with a map whose first key is "k" = "snap"
                if b"snap" in m.body[:16]:
                    try:
                        doc = msgpack.unpackb(m.body, raw=False)
                    except (ValueError, msgpack.UnpackException):
                        doc = None
                    if isinstance(doc, dict) and doc.get("k") == "snap":
                        return at
            at -= 1
        return None

    def recover(self) -> int:
        """Rebuild the views from the commit log: the newest snapshot, then every record after
        it (all records when there is none).  Returns how many records were applied."""
        store = self.ctx.store
        start = self._latest_snapshot()
        if start is None:
            start = store.get_min_offset_in_queue(POP_STATE_TOPIC, 0)
        self.views = {}
        n = 0
        for _, doc in self._records_from(start):
            self._apply(doc)
            n += 1
        # Views the offset table moved past while the records were not looked at (a reset made
        # with the broker down, retention): the table wins where it is ahead.
        # The offset table is written now and then: what the records acked since is committed
        # again.
        for (group, topic, qid), v in self.views.items():
            committed = self.ctx.offsets.query(group, topic, qid)
            if committed > v.next:
                v.reset(committed)
            elif committed < v.committed:
                self.ctx.offsets.commit(group, topic, qid, v.committed)
        self.replayed = n
        if self.views:
            self.ctx.write.put_messages([self._snapshot(self.ctx.now_ms())])
            log.info(
                "pop_state_recovered",
                views=len(self.views),
                in_flight=sum(len(v.inflight) for v in self.views.values()),
                records=n,
            )
        return n

    def _apply(self, doc: dict[str, Any]) -> None:
        """One record, replayed."""
        kind = doc.get("k")
        if kind == "snap":
            self.views = {
                (str(g), str(t), int(q)): QueueView.from_doc(v) for g, t, q, v in doc["views"]
            }
            return
        key = (str(doc["g"]), str(doc["t"]), int(doc["q"]))
        v = self.views.get(key)
        if kind == "ck":
            if v is None:
                v = self.views[key] = QueueView(int(doc["from"]), int(doc["from"]))
            for o, nonce, att in doc["o"]:
                v.hand_out(int(o), int(doc["vis"]), int(att), str(nonce))
            if int(doc["to"]) > v.next:
                v.skip_to(int(doc["to"]))
            v.settle()
        elif v is None:
            return
        elif kind == "ack":
            for o in doc["o"]:
                v.ack(int(o))
        elif kind == "inv":
            x = v.inflight.get(int(doc["o"]))
            if x is not None:
                x.visible_at = int(doc["vis"])
                x.nonce = str(doc["n"])
        elif kind == "reset":
            v.reset(int(doc["o"]))

    # -- views ----------------------------------------------------------------------------------

    def _initial(self, group: str, topic: str, qid: int) -> int:
        off = self.ctx.offsets.query(group, topic, qid)
        if off < 0:
            return self.ctx.store.get_min_offset_in_queue(topic, qid)
        return off

    def view(self, group: str, topic: str, queue_id: int) -> QueueView:
        key = (group, topic, queue_id)
        v = self.views.get(key)
        if v is None:
            start = self._initial(group, topic, queue_id)
            v = self.views[key] = QueueView(start, start)
        return v

    def existing(self, group: str, topic: str, queue_id: int) -> QueueView | None:
        return self.views.get((group, topic, queue_id))

    def groups(self) -> set[str]:
        return {g for g, _, _ in self.views}

    def _commit(self, key: Key, v: QueueView) -> None:
        self.ctx.offsets.commit(key[0], key[1], key[2], v.committed)

    def reset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """The group's offset of the queue was moved (reset-offset): a live view starts again
        there, durably, and does not write its old position back."""
        v = self.views.get((group, topic, queue_id))
        if v is None:
            return
        v.reset(offset)
        self._append({"k": "reset", "g": group, "t": topic, "q": queue_id, "o": offset})

    # -- the use cases --------------------------------------------------------------------------

    async def receive(
        self,
        group: str,
        topic: str,
        *,
        batch: int,
        invisible_ms: int,
        poll_s: float,
        filter: ReadFilter,
        stopping: Callable[[], bool],
        queue_id: int = -1,
        nonce: str | None = None,
    ) -> list[Delivery]:
        """One receive of a POP consumer: the permissions (:func:`.read.readable_topic`), the
        filter (:func:`.read.read_filter`), the group's settings (FIFO when
        ``consumeMessageOrderly``, its retry budget), then :meth:`collect` over every read
        queue of the topic, waiting up to ``poll_s`` for a message (a long poll); counted in
        the pull metrics.  ``queue_id`` >= 0: that queue only.  ``nonce``: the nonce of every
        handle of this receive (a remoting pop's ``popTime``), else one of its own each.

        Raises:
            TopicNotExistError: no such topic.
            NoPermissionError: the topic is not readable, or the group may not consume.
        """
        ctx = self.ctx
        tc = readable_topic(ctx, topic, group)
        settings = ctx.groups.effective(group)
        fifo = settings.consume_message_orderly
        max_attempts = settings.retry_max_times + 1
        tags, tag_codes, sql = filter.tags, filter.tag_codes, filter.sql
        qids = list(range(tc.read_queue_nums))
        if queue_id >= 0:
            if queue_id >= tc.read_queue_nums:
                raise InvalidParameterError(
                    f"queueId {queue_id} is not a queue of {topic} ({tc.read_queue_nums} read "
                    "queues)"
                )
            qids = [queue_id]
        self._rr += 1
        start = self._rr % max(1, len(qids))
        qids = qids[start:] + qids[:start]
        deadline = time.monotonic() + poll_s
        while True:
            out = self.collect(
                group,
                topic,
                qids,
                tags,
                tag_codes,
                sql,
                batch,
                invisible_ms,
                fifo,
                max_attempts,
                nonce,
            )
            left = deadline - time.monotonic()
            if out or left <= 0 or stopping():
                if out:
                    nbytes = sum(len(d.message.body or b"") for d in out)
                    self.reads.delivered(topic, group, len(out), nbytes=nbytes)
                return out
            # at most 1 s: a ChangeInvisibleDuration made meanwhile may shorten the wait
            wait = min(left, 1.0)
            nv = self.next_visible(group, topic, qids)
            if nv is not None:
                wait = min(wait, max(0.01, (nv - ctx.now_ms()) / 1000))
            await self._wait_any(topic, qids, wait)

    async def _wait_any(self, topic: str, qids: list[int], timeout: float) -> None:
        hold = self.ctx.hold
        waiters = [asyncio.ensure_future(hold.wait(topic, q, timeout)) for q in qids]
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)

    def collect(
        self,
        group: str,
        topic: str,
        qids: list[int],
        tags: frozenset[str] | None,
        tag_codes: frozenset[int] | None,
        sql: StoredFilter | None,
        batch: int,
        invisible_ms: int,
        fifo: bool,
        max_attempts: int,
        nonce: str | None = None,
    ) -> list[Delivery]:
        """Hand out at most ``batch`` messages of ``topic``'s queues ``qids``: those whose
        invisible time passed first (a message delivered ``max_attempts`` times goes to the
        dead-letter queue instead), then new ones."""
        out: list[Delivery] = []
        now = self.ctx.now_ms()
        for qid in qids:
            if len(out) >= batch:
                break
            key = (group, topic, qid)
            v = self.view(group, topic, qid)
            if fifo and v.blocked(now):
                continue
            start = v.next
            handed: list[list[Any]] = []
            acked: list[int] = []
            for x in v.due(now):
                if len(out) >= batch:
                    break
                m = self._read_one(topic, qid, x.offset)
                if m is None or x.attempts >= max_attempts:
                    if m is not None:
                        self._dead_letter(group, m, x.attempts)
                        if self.trace is not None:
                            self.trace.sent_back(group, m, dead_letter=True)
                    acked.append(x.offset)
                    if v.ack(x.offset):
                        self._commit(key, v)
                    continue
                x2 = v.hand_out(x.offset, now + invisible_ms, x.attempts + 1, nonce or _nonce())
                handed.append([x2.offset, x2.nonce, x2.attempts])
                out.append(Delivery(m, qid, make_handle(qid, x2), x2.attempts, invisible_ms))
            if not (fifo and v.inflight):
                self._collect_new(
                    key, v, tags, tag_codes, sql, batch, now + invisible_ms, out, handed, nonce
                )
            if acked:
                self._append({"k": "ack", "g": group, "t": topic, "q": qid, "o": acked})
            if handed or v.next != start:
                self._append(
                    {
                        "k": "ck",
                        "g": group,
                        "t": topic,
                        "q": qid,
                        "from": start,
                        "to": v.next,
                        "vis": now + invisible_ms,
                        "o": handed,
                    }
                )
        for d in out:
            d.invisible_ms = invisible_ms
        return out

    def _collect_new(
        self,
        key: Key,
        v: QueueView,
        tags: frozenset[str] | None,
        tag_codes: frozenset[int] | None,
        sql: StoredFilter | None,
        batch: int,
        visible_at: int,
        out: list[Delivery],
        handed: list[list[Any]],
        nonce: str | None,
    ) -> None:
        group, topic, qid = key
        store = self.ctx.store
        committed_before = v.committed
        while len(out) < batch:
            r = store.get_messages(
                topic,
                qid,
                v.next,
                batch - len(out),
                tag_codes,
                message_filter=sql,
                for_consumer=True,
            )
            if r.status is GetMessageStatus.FOUND:
                if self.trace is not None:  # SubBefore records, as for a remoting pull
                    self.trace.delivered(group, b"".join(r.messages))
                for raw in r.messages:
                    m = decode_message(raw)
                    v.skip_to(m.queue_offset)
                    v.next = m.queue_offset + 1
                    if tags is not None and m.tags not in tags:
                        v.acked.add(m.queue_offset)
                        continue
                    x = v.hand_out(m.queue_offset, visible_at, 1, nonce or _nonce())
                    handed.append([x.offset, x.nonce, 1])
                    out.append(Delivery(m, qid, make_handle(qid, x), 1, 0))
                v.skip_to(r.next_begin_offset)
            elif r.status is GetMessageStatus.OFFSET_TOO_SMALL:
                v.moved(r.next_begin_offset)
            elif r.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY:
                v.moved(r.next_begin_offset)
                break
            elif r.next_begin_offset > v.next:
                v.skip_to(r.next_begin_offset)
            else:
                break
        v.settle()
        if v.committed != committed_before:
            self._commit(key, v)

    def _read_one(self, topic: str, qid: int, offset: int) -> MessageExt | None:
        r = self.ctx.store.get_messages(topic, qid, offset, 1)
        if r.status is not GetMessageStatus.FOUND:
            return None
        m = decode_message(r.messages[0])
        return m if m.queue_offset == offset else None

    def _inflight(self, group: str, topic: str, handle: str) -> tuple[QueueView, int, InFlight]:
        qid, offset, nonce = parse_handle(handle)
        v = self.existing(group, topic, qid)
        if v is None:
            raise ReceiptHandleError(
                f"receipt handle {handle!r} does not belong to group {group} and topic {topic}"
            )
        x = v.inflight.get(offset)
        if x is None or x.nonce != nonce:
            if x is None and (offset < v.committed or offset in v.acked):
                raise _AlreadyAcked()
            raise ReceiptHandleError(
                "receipt handle is expired: the message was delivered again since"
                if x is not None
                else "receipt handle is unknown"
            )
        return v, qid, x

    def ack(self, group: str, topic: str, handles: list[str], msg_ids: list[str]) -> list[str]:
        """Ack receipt handles (one record for all).  Acking an offset already acked is fine;
        a handle that was replaced (the message was handed out again) is refused.  Returns,
        per handle, "" or why it was refused."""
        results: list[str] = []
        by_queue: dict[int, list[int]] = {}
        for handle, msg_id in zip(handles, msg_ids, strict=True):
            try:
                v, qid, x = self._inflight(group, topic, handle)
            except _AlreadyAcked:
                results.append("")
                continue
            except ReceiptHandleError as exc:
                results.append(str(exc))
                continue
            by_queue.setdefault(qid, []).append(x.offset)
            if v.ack(x.offset):
                self._commit((group, topic, qid), v)
            if self.trace is not None and msg_id:
                self.trace.settled(group, msg_id, "ack", True)
            results.append("")
        for qid, offsets in by_queue.items():
            self._append({"k": "ack", "g": group, "t": topic, "q": qid, "o": offsets})
        return results

    def change_invisible(
        self,
        group: str,
        topic: str,
        handle: str,
        invisible_ms: int,
        msg_id: str = "",
        nonce: str | None = None,
    ) -> str:
        """Make a handed-out message visible again after ``invisible_ms`` from now; returns the
        new receipt handle (the old one no longer acks it).

        Raises:
            ReceiptHandleError: the handle is expired or already acked.
        """
        try:
            _, qid, x = self._inflight(group, topic, handle)
        except _AlreadyAcked:
            raise ReceiptHandleError("receipt handle is already acked") from None
        x.visible_at = self.ctx.now_ms() + invisible_ms
        x.nonce = nonce or _nonce()
        self._append(
            {
                "k": "inv",
                "g": group,
                "t": topic,
                "q": qid,
                "o": x.offset,
                "vis": x.visible_at,
                "n": x.nonce,
            }
        )
        if self.trace is not None and msg_id:
            # not consumed (yet): a client's nack, or more time asked for
            self.trace.settled(group, msg_id, "invisible", False)
        return make_handle(qid, x)

    def message_of(self, group: str, topic: str, handle: str) -> MessageExt:
        """The message a live handle names (to forward it to the dead-letter queue).

        Raises:
            ReceiptHandleError: the handle is unknown, or its message is gone.
        """
        try:
            _, qid, x = self._inflight(group, topic, handle)
        except _AlreadyAcked:
            raise ReceiptHandleError("receipt handle is already acked") from None
        m = self._read_one(topic, qid, x.offset)
        if m is None:
            raise ReceiptHandleError(f"the message of {handle!r} is gone")
        return m

    def pop_time(self) -> int:
        """A remoting pop's ``popTime`` (epoch ms): the nonce of the handles it gives, so never
        the same twice on this broker."""
        t = max(self.ctx.now_ms(), self._last_pop_time + 1)
        self._last_pop_time = t
        return t

    def next_visible(self, group: str, topic: str, qids: list[int]) -> int | None:
        """The earliest time (epoch ms) an in-flight message of these queues becomes visible."""
        times = [
            t
            for q in qids
            if (v := self.views.get((group, topic, q))) is not None
            and (t := v.next_visible()) is not None
        ]
        return min(times, default=None)


class _AlreadyAcked(Exception):
    """The handle's offset is acked already (an ack of it again is fine)."""


def _nonce() -> str:
    return secrets.token_hex(6)


__all__ = [
    "Delivery",
    "InFlight",
    "PopService",
    "QueueView",
    "ReceiptHandleError",
    "make_handle",
    "parse_handle",
]
