"""Timer messages: delivery at any time, to the millisecond (RocketMQ 5's timer, RIP-43).

A message asking for a delivery time (``TIMER_DELIVER_MS``, ``TIMER_DELAY_SEC``,
``TIMER_DELAY_MS``, ONS's ``__STARTDELIVERTIME``; gRPC's ``delivery_timestamp``) that is not due
yet is stored in :data:`~txmq.broker.topics.TIMER_TOPIC`, queue 0, with its delivery time in
``TIMER_DELIVER_MS`` and its real topic and queue in ``REAL_TOPIC`` / ``REAL_QID``.
:class:`TimerService` reads that queue as it grows, keeps what is pending in an index, and at
each message's time stores a copy in the real topic (the ``UNIQ_KEY`` and every property kept).
A delivery time more than ``timerMaxDelaySec`` ahead is refused; one in the past is delivered at
once (it never reaches the timer topic).

**The index** holds no Python object per timer: one ``array('q')`` per second that has timers,
each entry ``ms-within-the-second << 53 | commit-log offset`` (8 bytes), a heap of those
seconds, and the second being fired sorted.  A million pending timers take about 10 MB.

**Fired once, across crashes.**  Each fire is one append: the copies, then one record in queue 1
of the timer topic (the *fired log*) whose body lists the commit-log offsets of the timer
messages that fired.  A checkpoint file (``config/timerCheckpoint.json``), written about once a
second once what it covers is durable, says:

* ``scanned``: the timer-queue offset the index had read up to;
* ``firedMs``: every timer read before ``scanned`` due at or before this time has fired;
* ``lowWater``: the lowest timer-queue offset still pending;
* ``firedLog``: the fired log's length;
* ``txmqCrc32``: the CRC-32 of the rest (canonical JSON, :func:`~..store.fileio.checked_json`).

A checkpoint that does not read or whose checksum does not match is set aside
(``timerCheckpoint.json.damaged-<time>``, a WARNING names it) and the timers rebuilt as without
one; one without ``txmqCrc32`` (written before checksums) is read as before.

At start the index is rebuilt from the timer queue from ``lowWater``: a timer before
``scanned`` due by ``firedMs`` fired before the checkpoint; one the fired log lists after
``firedLog`` fired after it (the crash came between the checkpoint and the next); every other
is pending (and fires at once if overdue).  A copy and its fired-log entry are in one append,
so a timer is either fired and listed, or neither: none is delivered twice or lost.  No
checkpoint (a new store): the whole queue and log are read.

**Recall** (RocketMQ 5.3's RecallMessage, its ``TIMER_DEL_UNIQKEY`` marker): a pending timer
named by its real topic, UNIQ_KEY and delivery time (the recall handle a send answers, see
:func:`recall_handle`) is taken out of the index and one record is appended to queue 2 of the
timer topic (the *recall log*) holding its commit-log offset.  The checkpoint's ``recallLow``
is the recall log's offset of the earliest recall whose timer's time is not yet behind
``firedMs``; the rebuild reads the recall log from there and leaves every timer it lists out
of the index, so a recalled timer is never delivered, also after a SIGKILL.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import heapq
import os
from array import array
from collections.abc import Iterable
from typing import TYPE_CHECKING

import structlog

from txmq.protocol.aio import wait_event
from txmq.protocol.errors import (
    MALFORMED_DOCUMENT,
    IllegalOperationError,
    QueryNotFoundError,
    TxmqError,
)
from txmq.protocol.message import MessageConst, MessageExt, decode_message

from ..delivery import (
    TIMER_DEL_UNIQKEY,
    TIMER_DELIVER_MS,
    TIMER_QUEUE,
)
from ..redelivery import redelivered
from ..store import GetMessageStatus, PutMessageResult
from ..store.fileio import atomic_write, checked_json, dumps_with_checksum, set_aside_quietly
from ..store.reading import read_queue
from ..topics import TIMER_TOPIC

if TYPE_CHECKING:
    from ..context import BrokerContext

log = structlog.get_logger(__name__)

#: The queues of the timer topic (the timers' own, :data:`TIMER_QUEUE`, is queue 0).
FIRED_QUEUE = 1
RECALL_QUEUE = 2

#: Timers read from the queue per look (and looks per step), fired per step (one append).
READ_CHUNK = 512
LOAD_CHUNKS = 8
FIRE_CHUNK = 2048
#: Longest sleep while timers are pending (s): the clock is a seam and may jump.
MAX_IDLE = 0.2
#: Longest sleep with nothing pending (s): an append to the timer queue wakes the service.
EMPTY_IDLE = 60.0
CHECKPOINT_INTERVAL = 1.0
#: Sleep after a step failed (s): the timers taken are fired again then.
FAILED_RETRY = 1.0

_MS_SHIFT = 53
_PHY_MASK = (1 << _MS_SHIFT) - 1


def recall_handle(topic: str, broker_name: str, deliver_ms: int, uniq_key: str) -> str:
    """The recall handle of a timer message (RocketMQ 5.3's ``RecallMessageHandle.HandleV1``:
    ``v1 <topic> <broker name> <timestamp> <message id>``, URL-safe base64); the timestamp is
    the exact delivery time here."""
    raw = " ".join(("v1", topic, broker_name, str(deliver_ms), uniq_key))
    return base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii")


def parse_recall_handle(handle: str) -> tuple[str, str, str, str]:
    """``(topic, broker name, timestamp, message id)`` of a recall handle.

    Raises:
        IllegalOperationError: it is not one (RocketMQ's answer and remark).
    """
    try:
        raw = base64.urlsafe_b64decode(handle.encode("ascii")).decode("utf-8")
    except (ValueError, binascii.Error, UnicodeError):
        raise IllegalOperationError("recall handle is invalid") from None
    items = raw.split(" ")
    if not handle or items[0] != "v1" or len(items) < 5:
        raise IllegalOperationError("recall handle is invalid")
    return items[1], items[2], items[3], items[4]


def fired_copy(m: MessageExt) -> MessageExt:
    """What a timer message delivers: the message in its real topic and queue."""
    props = dict(m.properties)
    topic = props.pop(MessageConst.REAL_TOPIC)
    qid = int(props.pop(MessageConst.REAL_QID, "0") or 0)
    return redelivered(
        m, topic, qid, props, prepared_transaction_offset=m.prepared_transaction_offset
    )


class TimerIndex:
    """Pending timers by due time: per second an ``array('q')`` of packed entries, a heap of
    the seconds, the current second sorted; per second the lowest timer-queue offset."""

    def __init__(self) -> None:
        self._buckets: dict[int, array[int]] = {}
        self._minq: dict[int, int] = {}
        self._seconds: list[int] = []
        #: The second being fired (sorted) and how far it has fired.
        self._cur_sec = -1
        self._cur: array[int] = array("q")
        self._cur_i = 0
        self._cur_minq = -1
        #: Overdue when read: fired at the next step, whatever their time.
        self._due: array[int] = array("q")
        self._due_minq = -1
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def add(self, deliver_ms: int, phy: int, qoff: int, now_ms: int) -> None:
        self._n += 1
        if deliver_ms <= now_ms:
            self._due.append(phy)
            self._due_minq = qoff if self._due_minq < 0 else min(self._due_minq, qoff)
            return
        sec, ms = divmod(deliver_ms, 1000)
        packed = ms << _MS_SHIFT | phy
        if sec == self._cur_sec:
            bisect.insort(self._cur, packed, lo=self._cur_i)
            self._cur_minq = min(self._cur_minq, qoff) if self._cur_minq >= 0 else qoff
            return
        b = self._buckets.get(sec)
        if b is None:
            self._buckets[sec] = array("q", (packed,))
            self._minq[sec] = qoff
            heapq.heappush(self._seconds, sec)
        else:
            b.append(packed)
            if qoff < self._minq[sec]:
                self._minq[sec] = qoff

    def at(self, deliver_ms: int) -> list[int]:
        """The commit-log offsets of the pending timers due exactly at ``deliver_ms`` (not
        those already overdue when read: they fire at the next step)."""
        sec, ms = divmod(deliver_ms, 1000)
        if sec == self._cur_sec:
            cur = self._cur
            lo = bisect.bisect_left(cur, ms << _MS_SHIFT, lo=self._cur_i)
            hi = bisect.bisect_right(cur, (ms << _MS_SHIFT) | _PHY_MASK, lo=lo)
            return [p & _PHY_MASK for p in cur[lo:hi]]
        b = self._buckets.get(sec)
        if b is None:
            return []
        return [p & _PHY_MASK for p in b if p >> _MS_SHIFT == ms]

    def remove(self, deliver_ms: int, phy: int) -> bool:
        """Take the pending timer at ``phy`` due at ``deliver_ms`` out (its second's low-water
        mark is kept); whether it was there."""
        sec, ms = divmod(deliver_ms, 1000)
        packed = ms << _MS_SHIFT | phy
        if sec == self._cur_sec:
            i = bisect.bisect_left(self._cur, packed, lo=self._cur_i)
            if i >= len(self._cur) or self._cur[i] != packed:
                return False
            del self._cur[i]
        else:
            b = self._buckets.get(sec)
            if b is None or packed not in b:
                return False
            b.remove(packed)
        self._n -= 1
        return True

    def requeue(self, phys: list[int]) -> None:
        """Timers taken but not fired (the append failed): due again (their queue offsets are
        not known here, so the low-water mark is the queue's start until they fire)."""
        self._due.extend(phys)
        self._due_minq = 0
        self._n += len(phys)

    def take_due(self, now_ms: int, limit: int) -> tuple[list[int], bool]:
        """Up to ``limit`` commit-log offsets due by ``now_ms``, earliest first (overdue ones
        first); and whether that is all that is due."""
        out: list[int] = []
        if self._due:
            n = min(limit, len(self._due))
            out.extend(self._due[:n])
            del self._due[:n]
            if not self._due:
                self._due_minq = -1
        now_sec, now_ms_in = divmod(now_ms, 1000)
        while len(out) < limit:
            if self._cur_i >= len(self._cur) or self._cur_sec > now_sec:
                if self._cur_i >= len(self._cur) and self._seconds and self._seconds[0] <= now_sec:
                    sec = heapq.heappop(self._seconds)
                    self._cur = array("q", sorted(self._buckets.pop(sec)))
                    self._cur_minq = self._minq.pop(sec)
                    self._cur_sec, self._cur_i = sec, 0
                    continue
                break
            cur, i = self._cur, self._cur_i
            end = len(cur)
            if self._cur_sec == now_sec:
                end = bisect.bisect_right(cur, (now_ms_in << _MS_SHIFT) | _PHY_MASK, lo=i)
            end = min(end, i + limit - len(out))
            if end <= i:
                break
            out.extend(p & _PHY_MASK for p in cur[i:end])
            self._cur_i = end
            if end >= len(cur):
                self._cur, self._cur_i, self._cur_minq = array("q"), 0, -1
        self._n -= len(out)
        more = bool(self._due) or self.next_due_ms() <= now_ms
        return out, not more

    def next_due_ms(self) -> int:
        """When the earliest pending timer is due (a huge number when none is)."""
        if self._due:
            return 0
        if self._cur_i < len(self._cur):
            return self._cur_sec * 1000 + (self._cur[self._cur_i] >> _MS_SHIFT)
        if self._seconds:
            return self._seconds[0] * 1000
        return 1 << 62

    def low_water(self, default: int) -> int:
        """The lowest timer-queue offset that may still be pending (``default``: none is)."""
        lows = [q for q in (self._cur_minq, self._due_minq) if q >= 0]
        if self._minq:
            lows.append(min(self._minq.values()))
        return min(lows) if lows else default


class TimerService:
    """Fires timer messages at their time (see the module's description)."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.index = TimerIndex()
        self.path = os.path.join(ctx.config.store_path_root_dir, "config", "timerCheckpoint.json")
        #: The next timer-queue offset to read.
        self.scanned = 0
        #: Every timer read, due at or before this, has fired.
        self.fired_ms = 0
        self.fired_total = 0
        self.recalled_total = 0
        #: Recalled timers whose time is not yet behind ``fired_ms``: (real topic, UNIQ_KEY,
        #: delivery ms) -> (commit-log offset, the recall record's recall-log offset).
        self.recalled: dict[tuple[str, str, int], tuple[int, int]] = {}
        #: Steps failed in a row (a full disk refuses the copies).
        self.failures = 0
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._last_checkpoint: dict[str, int] | None = None
        cfg = ctx.config
        if cfg.file_reserved_time * 3600 < cfg.timer_max_delay_sec:
            # Retention does not look at pending timers: a timer older than the commit log
            # keeps is dropped (logged) when it falls due.
            log.warning(
                "timer_max_delay_beyond_retention",
                timer_max_delay_sec=cfg.timer_max_delay_sec,
                file_reserved_hours=cfg.file_reserved_time,
                hint="keep fileReservedTime (h) x 3600 at or above timerMaxDelaySec",
            )

    # -- recovery ----------------------------------------------------------------------------

    def _read_checkpoint(self) -> dict[str, int]:
        none = {"scanned": 0, "firedMs": -1, "lowWater": 0, "firedLog": 0, "recallLow": 0}
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return none
        except OSError as exc:
            log.warning("timer_checkpoint_unreadable", path=self.path, error=repr(exc))
            return none
        try:
            doc, _ = checked_json(raw, self.path)
            ck = {k: int(doc[k]) for k in ("scanned", "firedMs", "lowWater", "firedLog")}
            ck["recallLow"] = int(doc.get("recallLow", 0))  # a checkpoint from before recalls
            return ck
        except MALFORMED_DOCUMENT as exc:
            log.warning(
                "timer_checkpoint_damaged",
                file=self.path,
                set_aside=set_aside_quietly(self.path),
                error=str(exc),
                action="rebuilding the pending timers from the whole timer, fired and recall logs",
            )
            return none

    def recover(self) -> dict[str, int]:
        """Rebuild the pending index from the timer queue (before the broker serves)."""
        ck = self._read_checkpoint()
        fired: set[int] = set()
        for rec in read_queue(
            self.store, TIMER_TOPIC, FIRED_QUEUE, ck["firedLog"], chunk=READ_CHUNK
        ):
            fired.update(array("q", bytes(rec.body)))
        # Recalled timers: phy -> (the recall's key, its recall-log offset).
        recalls: dict[int, tuple[tuple[str, str, int], int]] = {}
        for rec in read_queue(
            self.store, TIMER_TOPIC, RECALL_QUEUE, ck["recallLow"], chunk=READ_CHUNK
        ):
            key = _recall_key(rec)
            for phy in array("q", bytes(rec.body)):
                if key is not None:
                    recalls[phy] = (key, rec.queue_offset)
        now = self.ctx.now_ms()
        index = self.index
        scanned_before, fired_ms = ck["scanned"], ck["firedMs"]
        skipped = 0
        for m in read_queue(self.store, TIMER_TOPIC, TIMER_QUEUE, ck["lowWater"], chunk=READ_CHUNK):
            deliver = _deliver_ms(m)
            if deliver is None or m.commit_log_offset in fired:
                skipped += 1
                continue
            if m.queue_offset < scanned_before and deliver <= fired_ms:
                skipped += 1
                continue
            recall = recalls.get(m.commit_log_offset)
            if recall is not None:
                self.recalled[recall[0]] = (m.commit_log_offset, recall[1])
                skipped += 1
                continue
            index.add(deliver, m.commit_log_offset, m.queue_offset, now)
        self.scanned = self.store.get_max_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE)
        self.fired_ms = max(fired_ms, 0)
        report = {
            "pending": len(index),
            "fired_after_checkpoint": len(fired),
            "recalled": len(self.recalled),
            "skipped": skipped,
        }
        log.info("timers_recovered", **report)
        return report

    # -- running -----------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._run(), name="txmq-timer"),
            loop.create_task(self._checkpoints(), name="txmq-timer-checkpoint"),
        ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        try:
            await self._checkpoint()
        except Exception as exc:  # the next start reads a little more
            log.warning("timer_checkpoint_failed", error=repr(exc))

    def on_append(self, destinations: Iterable[tuple[str, int]]) -> None:
        """The write path's subscriber: new timers wake the service."""
        for topic, qid in destinations:
            if topic == TIMER_TOPIC and qid == TIMER_QUEUE:
                self._wake.set()
                return

    @property
    def pending(self) -> int:
        return len(self.index)

    def _load(self, now_ms: int) -> bool:
        """Read (some of) the timers appended since the last look into the index; whether it
        read them all."""
        store = self.store
        for _ in range(LOAD_CHUNKS):
            r = store.get_messages(TIMER_TOPIC, TIMER_QUEUE, self.scanned, READ_CHUNK)
            if r.status is GetMessageStatus.FOUND:
                for raw in r.messages:
                    m = decode_message(raw)
                    deliver = _deliver_ms(m)
                    if deliver is None:
                        log.error("timer_message_without_time", offset=m.commit_log_offset)
                        continue
                    self.index.add(deliver, m.commit_log_offset, m.queue_offset, now_ms)
                self.scanned = r.next_begin_offset
            elif r.next_begin_offset > self.scanned:
                self.scanned = r.next_begin_offset
            else:
                return True
        return False

    def step(self) -> bool:
        """Read new timers and fire what is due, a bounded amount (the event loop runs between
        steps); whether more is left to read or fire now."""
        now = self.ctx.now_ms()
        caught_up = self._load(now)
        phys, complete = self.index.take_due(now, FIRE_CHUNK)
        if phys:
            self._fire(phys)
        if complete:
            self.fired_ms = max(self.fired_ms, now)
            if self.recalled:  # past their time: the checkpoint's firedMs covers them
                fired_ms = self.fired_ms
                for key in [k for k in self.recalled if k[2] <= fired_ms]:
                    del self.recalled[key]
        return not (caught_up and complete)

    def recall(self, topic: str, uniq_key: str, deliver_ms: int) -> PutMessageResult | None:
        """Recall the pending timer message ``uniq_key`` of ``topic`` due at ``deliver_ms``: it
        is never delivered.  Returns where the recall record was stored (not yet durable);
        None when the message was recalled before (nothing is stored again).

        Raises:
            IllegalOperationError: its time has passed: it was delivered (or recalled before).
            QueryNotFoundError: no such timer message is pending.
        """
        key = (topic, uniq_key, deliver_ms)
        done = self.recalled.get(key)
        if done is not None:
            return None
        now = self.ctx.now_ms()
        while not self._load(now):  # the timers sent before the recall are in the index
            pass
        lookup = self.store.lookup_message
        for phy in self.index.at(deliver_ms):
            try:
                m = lookup(phy)
            except (TxmqError, KeyError, ValueError):
                continue
            props = m.properties
            if props.get(MessageConst.UNIQ_KEY) != uniq_key:
                continue
            if props.get(MessageConst.REAL_TOPIC) != topic:
                continue
            record = MessageExt(
                topic=TIMER_TOPIC,
                body=array("q", (phy,)).tobytes(),
                queue_id=RECALL_QUEUE,
                born_timestamp=now,
                born_host=self.ctx.store_host,
                properties={
                    TIMER_DEL_UNIQKEY: f"{topic}+{uniq_key}",
                    TIMER_DELIVER_MS: str(deliver_ms),
                },
            )
            [r] = self.ctx.write.put_messages([record])
            self.index.remove(deliver_ms, phy)
            self.recalled[key] = (phy, r.queue_offset)
            self.recalled_total += 1
            log.info("timer_message_recalled", topic=topic, msg_id=uniq_key, deliver_ms=deliver_ms)
            return r
        if deliver_ms <= max(now, self.fired_ms):
            raise IllegalOperationError(
                f"recall failed: message {uniq_key} of topic {topic} was due at {deliver_ms}, "
                "which has passed: it has been delivered (or was recalled before)"
            )
        raise QueryNotFoundError(
            f"recall failed: no pending timer message {uniq_key} of topic {topic} due at "
            f"{deliver_ms}"
        )

    def _fire(self, phys: list[int]) -> None:
        lookup = self.store.lookup_message
        copies: list[MessageExt] = []
        for phy in phys:
            try:
                copies.append(fired_copy(lookup(phy)))
            except (TxmqError, KeyError, ValueError) as exc:
                log.error("timer_message_dropped", offset=phy, error=repr(exc))
        record = MessageExt(
            topic=TIMER_TOPIC,
            body=array("q", phys).tobytes(),
            queue_id=FIRED_QUEUE,
            born_timestamp=self.ctx.now_ms(),
            born_host=self.ctx.store_host,
        )
        # The copies and the record of their firing in one append: both or neither survive.
        try:
            self.ctx.write.put_messages([*copies, record])
        except BaseException:
            self.index.requeue(phys)
            raise
        self.fired_total += len(copies)

    async def _run(self) -> None:
        while True:
            try:
                busy = self.step()
            except Exception as exc:  # a store error (a full disk) must not stop the timers
                self.failures += 1
                if self.failures == 1 or self.failures % 60 == 0:
                    log.error("timer_step_failed", error=repr(exc), failures=self.failures)
                await asyncio.sleep(FAILED_RETRY)
                continue
            if self.failures:
                log.info("timer_step_recovered", failures=self.failures)
                self.failures = 0
            wait = (self.index.next_due_ms() - self.ctx.now_ms()) / 1000.0
            if busy or wait <= 0:
                await asyncio.sleep(0)
                continue
            self._wake.clear()
            await wait_event(self._wake, min(wait, MAX_IDLE if len(self.index) else EMPTY_IDLE))

    # -- the checkpoint ------------------------------------------------------------------------

    def snapshot(self) -> dict[str, int]:
        """What the checkpoint says now (between two steps, so every timer read and due by
        ``fired_ms`` has fired)."""
        return {
            "scanned": self.scanned,
            "firedMs": self.fired_ms,
            "lowWater": self.index.low_water(self.scanned),
            "firedLog": self.store.get_max_offset_in_queue(TIMER_TOPIC, FIRED_QUEUE),
            "recallLow": min(
                (q for _, q in self.recalled.values()),
                default=self.store.get_max_offset_in_queue(TIMER_TOPIC, RECALL_QUEUE),
            ),
        }

    async def _checkpoint(self) -> None:
        snap = self.snapshot()
        if snap == self._last_checkpoint:
            return
        # Never claim more than the commit log keeps: what the checkpoint covers is durable
        # first.
        await self.ctx.flush.wait_durable(self.store.max_phy_offset)
        data = dumps_with_checksum(snap)
        await self.ctx.in_background(lambda: atomic_write(self.path, data))
        self._last_checkpoint = snap

    async def _checkpoints(self) -> None:
        while True:
            await asyncio.sleep(CHECKPOINT_INTERVAL)
            try:
                await self._checkpoint()
            except Exception as exc:
                log.warning("timer_checkpoint_failed", error=repr(exc))


def _deliver_ms(m: MessageExt) -> int | None:
    v = m.properties.get(TIMER_DELIVER_MS)
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _recall_key(m: MessageExt) -> tuple[str, str, int] | None:
    """(real topic, UNIQ_KEY, delivery ms) a recall-log record names."""
    topic, sep, uniq = m.properties.get(TIMER_DEL_UNIQKEY, "").partition("+")
    deliver = _deliver_ms(m)
    if not sep or deliver is None:
        return None
    return topic, uniq, deliver
