"""Idempotent sends: a producer's resend of a message the broker already stored is answered
with the first send's result instead of being stored again.

A producer resends when it did not get an answer in time -- the broker stalled (a GC pause, a
disk stall, SIGSTOP), the connection dropped after the request was written, a leader could not
acknowledge for a moment -- and every RocketMQ client resends with the message's UNIQ_KEY
unchanged.  Without this, both copies are stored and a consumer gets the message twice.

**The key** is ``(topic, UNIQ_KEY)``: the topic the producer sent to (a half's or delayed
message's real topic) and the message id the client made.  UNIQ_KEYs are unique by construction
(client address, process, time and a counter), so no producer group or producer id is needed,
and stock clients get idempotence without changing anything.  Retry and dead-letter topics
(``%RETRY%``, ``%DLQ%``) and the broker's own topics are not de-duplicated: their copies carry
the original's UNIQ_KEY on purpose.

**The window** is ``duplicateWindowSeconds`` (default 120 s, NATS JetStream's default), bounded
by ``duplicateWindowMaxEntries`` (the oldest are forgotten first; when that cuts the window
short a warning and ``txmq_dedup_evicted_early_total`` say so).  0 seconds turns it off.  Per
message it keeps the UNIQ_KEY string and the commit-log offset in a plain dict (about 160
bytes, no object the garbage collector tracks), and the ids of each append in a list for their
expiry; a resend -- rare -- reads its first copy back for the answer.  A batch's ids are checked
and remembered in bulk (one set operation, one ``dict.update``), and forgotten in bulk.

**Durable and replicated without a file of its own**: the index is a view of the commit log.
After a restart -- or on a follower that becomes leader, whose log is the leader's byte for
byte -- it is rebuilt from the messages stored within the window (:meth:`DedupIndex.rebuild`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from functools import lru_cache
from itertools import islice, repeat
from typing import Any, NamedTuple

import structlog

from txmq.protocol.errors import TxmqError
from txmq.protocol.message import MessageConst, MessageExt, MessageSysFlag, decode_message

from ..metrics import BrokerMetrics
from ..store import GetMessageStatus, MessageStore
from ..store.commit_log import RECORD_HEADER_SIZE
from ..topics import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    RMQ_SYS_TRANS_HALF_TOPIC,
    SCHEDULE_TOPIC,
    SYSTEM_TOPICS,
    TIMER_TOPIC,
)

log = structlog.get_logger(__name__)

#: Runs an iterator to its end, keeping nothing (in C).
_drain: Callable[[Iterator[Any]], None] = deque[Any](maxlen=0).extend

#: Messages read per look at a queue while rebuilding.
_REBUILD_CHUNK = 256


class Stored(NamedTuple):
    """What a first send was answered with, as its stored record tells."""

    commit_log_offset: int
    queue_id: int
    queue_offset: int
    transaction_id: str | None
    #: the commit-log offset that must be durable before the send may be acknowledged
    end_offset: int
    #: the store's clock when it was stored (ms): the window is measured on it
    store_timestamp: int
    #: the offsetMsgId it was answered with (the record's store host: the old leader's after a
    #: failover)
    msg_id: str


Key = tuple[str, str]


@lru_cache(maxsize=4096)
def dedup_topic(topic: str) -> bool:
    """Whether sends to ``topic`` are de-duplicated (remembered per topic name: asked on every
    send)."""
    return not (
        topic in SYSTEM_TOPICS
        or topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        or topic.startswith(DLQ_GROUP_TOPIC_PREFIX)
        or topic.startswith("rmq_sys_")
    )


class DedupIndex:
    """Per topic, the UNIQ_KEYs stored within the window and where (their commit-log offset):
    an int a message, no object the garbage collector has to look at.  A hit -- a resend, rare
    -- reads the first copy back from the store for its answer."""

    def __init__(
        self,
        window_ms: int,
        max_entries: int,
        metrics: BrokerMetrics,
        lookup: Callable[[int], MessageExt] | None = None,
    ) -> None:
        self.window_ms = window_ms
        self.max_entries = max_entries
        self.enabled = window_ms > 0 and max_entries > 0
        self.metrics = metrics
        #: Reads a stored message by commit-log offset (the store's ``lookup_message``).
        self.lookup = lookup
        #: Per topic, UNIQ_KEY -> commit-log offset, in the order first stored (a plain dict:
        #: its ``update`` from a batch runs in C at a fraction of an OrderedDict's cost).
        self._topics: dict[str, dict[str, int]] = {}
        #: ``[store timestamp, topic, ids]`` of each append, oldest first: what expires when
        #: (``ids``: the ids it added, in order, a list this index owns).
        self._marks: deque[list[Any]] = deque()
        self._size = 0
        self._warned = False

    def __len__(self) -> int:
        return self._size

    def key(self, topic: str, props: dict[str, str]) -> Key | None:
        """The key of a producer's send to ``topic``, or None when it is not de-duplicated."""
        uniq = props.get(MessageConst.UNIQ_KEY)
        if not uniq or not self.enabled or not dedup_topic(topic):
            return None
        return (topic, uniq)

    def get(self, key: Key | None, now_ms: int) -> Stored | None:
        """The first send of ``key`` if it was stored within the window (read back)."""
        if key is None:
            return None
        ids = self._topics.get(key[0])
        phy = ids.get(key[1]) if ids is not None else None
        if phy is None or self.lookup is None:
            return None
        try:
            m = self.lookup(phy)
        except (TxmqError, KeyError, ValueError):
            return None  # gone with retention, or unreadable: a new message then
        entry = _entry_of(m)
        if entry is None or entry[0] != key or entry[1].store_timestamp < now_ms - self.window_ms:
            return None
        self.metrics.dedup_hits.inc()
        return entry[1]

    def known(self, topic: str, uniq: str) -> bool:
        """Whether ``uniq`` is remembered for ``topic`` (perhaps past its window)."""
        ids = self._topics.get(topic)
        return ids is not None and uniq in ids

    def any_known(self, topic: str, uniqs: list[str]) -> bool:
        """Whether any of ``uniqs`` is remembered for ``topic`` (perhaps past its window): one
        pass in C, what a batch of new messages costs."""
        ids = self._topics.get(topic)
        return ids is not None and not ids.keys().isdisjoint(uniqs)

    def add_many(self, topic: str, uniqs: list[str], offsets: list[int], now_ms: int) -> None:
        """Remember first sends (in the order they were stored)."""
        ids = self._topics.get(topic)
        if ids is None:
            ids = self._topics[topic] = {}
        before = len(ids)
        ids.update(zip(uniqs, offsets, strict=True))
        added = len(ids) - before  # an id stored again after its window keeps its old place
        if added == len(uniqs):
            self._added(topic, list(uniqs), now_ms)  # all new (what a batch of sends is)
        elif added:
            # The new ids went to the end of the dict, in order.
            fresh = list(islice(reversed(ids), added))
            fresh.reverse()
            self._added(topic, fresh, now_ms)
        self._expire(now_ms)

    def add(self, key: Key | None, offset: int, now_ms: int) -> None:
        """:meth:`add_many` of one first send."""
        if key is None:
            return
        topic, uniq = key
        ids = self._topics.get(topic)
        if ids is None:
            ids = self._topics[topic] = {}
        if uniq in ids:
            ids[uniq] = offset  # an id stored again after its window keeps its old place
        else:
            ids[uniq] = offset
            self._added(topic, [uniq], now_ms)
        marks = self._marks
        if marks and (self._size > self.max_entries or marks[0][0] < now_ms - self.window_ms):
            self._expire(now_ms)

    def _added(self, topic: str, fresh: list[str], now_ms: int) -> None:
        """Note the new ids ``fresh`` of ``topic`` (a list this index keeps) stored at
        ``now_ms``: one mark per topic and millisecond (consecutive appends in the same one
        share it)."""
        self._size += len(fresh)
        marks = self._marks
        if marks:
            last = marks[-1]
            if last[0] == now_ms and last[1] == topic:
                last[2].extend(fresh)
                return
        marks.append([now_ms, topic, fresh])

    def _expire(self, now_ms: int) -> None:
        """Forget the ids past the window, then the oldest while over the bound (counted,
        with one warning: the window is cut short)."""
        marks = self._marks
        horizon = now_ms - self.window_ms
        early = 0
        kept_ms = 0
        while marks:
            mark = marks[0]
            ts, topic, fresh = mark
            n = len(fresh)
            over = self._size - self.max_entries
            if ts >= horizon and over <= 0:
                break
            drop = n if ts < horizon else min(n, over)
            if ts >= horizon:
                early += drop
                kept_ms = now_ms - ts
            gone = fresh if drop == n else fresh[:drop]
            ids = self._topics.get(topic)
            if ids is not None:
                # Forgotten in bulk: the ids of the mark, oldest first, in one C loop.
                _drain(map(ids.pop, gone, repeat(None)))
                if not ids:
                    del self._topics[topic]
            self._size -= drop
            if drop == n:
                marks.popleft()
            else:
                mark[2] = fresh[drop:]
        if early:
            self.metrics.dedup_evicted_early.inc(early)
            if not self._warned:
                self._warned = True
                log.warning(
                    "dedup_window_cut_short",
                    max_entries=self.max_entries,
                    window_seconds=self.window_ms / 1000,
                    kept_seconds=round(kept_ms / 1000, 1),
                    hint="raise duplicateWindowMaxEntries to keep the whole window",
                )

    # -- the view of the commit log ---------------------------------------------------------------

    def rebuild(self, store: MessageStore, now_ms: int) -> int:
        """Rebuild the index from the messages a producer sent within the window (the first
        stored copy of each key wins); returns how many keys it holds."""
        self._topics.clear()
        self._marks.clear()
        self._size = 0
        if not self.enabled:
            return 0
        since = now_ms - self.window_ms
        found: list[tuple[int, int, Key]] = []
        for topic in store.topics():
            if not (
                dedup_topic(topic)
                or topic in (RMQ_SYS_TRANS_HALF_TOPIC, SCHEDULE_TOPIC, TIMER_TOPIC)
            ):
                continue
            for qid in store.queue_ids(topic):
                for m in _stored_since(store, topic, qid, since):
                    entry = _entry_of(m)
                    if entry is not None:
                        found.append((m.commit_log_offset, m.store_timestamp, entry[0]))
        found.sort()
        seen: set[Key] = set()
        for phy, ts, key in found[-self.max_entries :] if found else ():
            if key not in seen:  # the first stored copy answers
                seen.add(key)
                self.add_many(key[0], [key[1]], [phy], ts)
        self._expire(now_ms)
        log.info(
            "dedup_index_rebuilt",
            keys=self._size,
            window_seconds=self.window_ms / 1000,
            scanned=len(found),
        )
        return self._size


def _stored_since(store: MessageStore, topic: str, qid: int, since_ms: int) -> Iterator[MessageExt]:
    offset = store.get_offset_by_time(topic, qid, since_ms)
    while True:
        r = store.get_messages(topic, qid, offset, _REBUILD_CHUNK)
        if r.status is GetMessageStatus.FOUND:
            for raw in r.messages:
                m = decode_message(raw)
                if m.store_timestamp >= since_ms:
                    yield m
            offset = r.next_begin_offset
        elif r.next_begin_offset > offset:
            offset = r.next_begin_offset
        else:
            return


def _entry_of(m: MessageExt) -> tuple[Key, Stored] | None:
    """The key and first answer of a stored message that a producer sent, or None."""
    props = m.properties
    uniq = props.get(MessageConst.UNIQ_KEY)
    if not uniq:
        return None
    if MessageSysFlag.transaction_value(m.sys_flag) == MessageSysFlag.TRANSACTION_COMMIT_TYPE:
        return None  # a commit's copy: the half was the send
    txid = None
    queue_id = m.queue_id
    topic = m.topic
    if topic in (RMQ_SYS_TRANS_HALF_TOPIC, SCHEDULE_TOPIC, TIMER_TOPIC):
        topic = props.get(MessageConst.REAL_TOPIC, "")
        try:
            queue_id = int(props.get(MessageConst.REAL_QID, "0") or 0)
        except ValueError:
            return None
        if m.topic == RMQ_SYS_TRANS_HALF_TOPIC:
            txid = props.get(MessageConst.TRANSACTION_ID) or uniq
    if not topic or not dedup_topic(topic):
        return None
    return (topic, uniq), Stored(
        m.commit_log_offset,
        queue_id,
        m.queue_offset,
        txid,
        m.commit_log_offset + RECORD_HEADER_SIZE + m.store_size,
        m.store_timestamp,
        m.offset_msg_id,
    )
