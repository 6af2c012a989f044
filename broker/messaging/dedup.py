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
short a warning and ``txmq_dedup_evicted_early_total`` say so).  0 seconds turns it off.

**Durable and replicated without a file of its own**: the index is a view of the commit log.
After a restart -- or on a follower that becomes leader, whose log is the leader's byte for
byte -- it is rebuilt from the messages stored within the window (:meth:`DedupIndex.rebuild`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import structlog

from txmq.protocol.message import MessageConst, MessageExt, MessageSysFlag, decode_message

from ..metrics import BrokerMetrics
from ..store import GetMessageStatus, MessageStore
from ..topics import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    RMQ_SYS_TRANS_HALF_TOPIC,
    SCHEDULE_TOPIC,
    SYSTEM_TOPICS,
)

log = structlog.get_logger(__name__)

#: Messages read per look at a queue while rebuilding.
_REBUILD_CHUNK = 256


class Stored(NamedTuple):
    """What a first send was answered with (the message id is the store's prefix and
    ``commit_log_offset``)."""

    commit_log_offset: int
    queue_id: int
    queue_offset: int
    transaction_id: str | None
    #: the commit-log offset that must be durable before the send may be acknowledged
    end_offset: int
    #: the store's clock when it was stored (ms): the window is measured on it
    store_timestamp: int
    #: the offsetMsgId it was answered with, when another broker stored it (a recovered
    #: record names the store host that wrote it: the old leader after a failover); None:
    #: this broker's
    msg_id: str | None = None


Key = tuple[str, str]


def dedup_topic(topic: str) -> bool:
    """Whether sends to ``topic`` are de-duplicated."""
    return not (
        topic in SYSTEM_TOPICS
        or topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        or topic.startswith(DLQ_GROUP_TOPIC_PREFIX)
        or topic.startswith("rmq_sys_")
    )


class DedupIndex:
    def __init__(self, window_ms: int, max_entries: int, metrics: BrokerMetrics) -> None:
        self.window_ms = window_ms
        self.max_entries = max_entries
        self.metrics = metrics
        self._entries: OrderedDict[Key, Stored] = OrderedDict()
        self._warned = False

    @property
    def enabled(self) -> bool:
        return self.window_ms > 0 and self.max_entries > 0

    def __len__(self) -> int:
        return len(self._entries)

    def key(self, topic: str, props: dict[str, str]) -> Key | None:
        """The key of a producer's send to ``topic``, or None when it is not de-duplicated."""
        uniq = props.get(MessageConst.UNIQ_KEY)
        if not uniq or not self.enabled or not dedup_topic(topic):
            return None
        return (topic, uniq)

    def get(self, key: Key | None, now_ms: int) -> Stored | None:
        """The first send of ``key`` if it was stored within the window."""
        if key is None:
            return None
        found = self._entries.get(key)
        if found is None or found.store_timestamp < now_ms - self.window_ms:
            return None
        self.metrics.dedup_hits.inc()
        return found

    def any_known(self, keys: list[Key]) -> bool:
        """Whether any of ``keys`` is remembered (perhaps past its window): one pass in C,
        what a batch of new messages costs."""
        return not self._entries.keys().isdisjoint(keys)

    def add_new(self, keys: list[Key], stored: list[Stored], now_ms: int) -> None:
        """Remember first sends whose keys :meth:`any_known` found unknown (in C)."""
        self._entries.update(zip(keys, stored, strict=True))
        self._expire(now_ms)

    def add(self, key: Key | None, stored: Stored) -> None:
        if key is None:
            return
        entries = self._entries
        if key in entries:  # stored again after its window: it is the newest now
            del entries[key]
        entries[key] = stored
        if len(entries) > self.max_entries or next(iter(entries.values()))[5] < (
            stored[5] - self.window_ms
        ):
            self._expire(stored[5])

    def add_many(self, items: Iterable[tuple[Key, Stored]], now_ms: int) -> None:
        """Remember first sends (in the order they were stored), then forget what is past
        the window or over the bound."""
        entries = self._entries
        for key, stored in items:
            if key in entries:  # stored again after its window: it is the newest now
                del entries[key]
            entries[key] = stored
        self._expire(now_ms)

    def _expire(self, now_ms: int) -> None:
        """Forget the ids past the window, then the oldest while over the bound (counted,
        with one warning: the window is cut short)."""
        entries = self._entries
        horizon = now_ms - self.window_ms
        popitem = entries.popitem
        over = len(entries) - self.max_entries
        early = 0
        kept_ms = 0
        while over > 0:
            _key, oldest = popitem(last=False)
            over -= 1
            if oldest[5] >= horizon:  # store_timestamp
                early += 1
                kept_ms = now_ms - oldest[5]
        while entries and next(iter(entries.values()))[5] < horizon:
            popitem(last=False)
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
        self._entries.clear()
        if not self.enabled:
            return 0
        since = now_ms - self.window_ms
        found: list[tuple[int, Key, Stored]] = []
        for topic in store.topics():
            if not (dedup_topic(topic) or topic in (RMQ_SYS_TRANS_HALF_TOPIC, SCHEDULE_TOPIC)):
                continue
            for qid in store.queue_ids(topic):
                for m in _stored_since(store, topic, qid, since):
                    entry = _entry_of(m)
                    if entry is not None:
                        found.append((m.commit_log_offset, *entry))
        found.sort(key=lambda x: x[0])
        for _phy, key, stored in found[-self.max_entries :] if found else ():
            if key not in self._entries:
                self._entries[key] = stored
        log.info(
            "dedup_index_rebuilt",
            keys=len(self._entries),
            window_seconds=self.window_ms / 1000,
            scanned=len(found),
        )
        return len(self._entries)


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
    if topic in (RMQ_SYS_TRANS_HALF_TOPIC, SCHEDULE_TOPIC):
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
        m.commit_log_offset,
        m.store_timestamp,
        m.offset_msg_id,
    )
