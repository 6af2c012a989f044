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
by ``duplicateWindowMaxEntries``; 0 seconds turns it off.  Ids are kept in two generations: the
current one takes new ids and, once it is a window old or holds ``duplicateWindowMaxEntries``
ids, becomes the previous one, the previous one being forgotten whole.  So every id is
remembered for at least the window, or, when ids come faster than the bound allows, at least
until ``duplicateWindowMaxEntries`` newer ones came (what is forgotten then inside its window
is counted in ``txmq_dedup_evicted_early_total``, with one warning); and at most about twice
that (up to twice ``duplicateWindowMaxEntries`` ids are held).  Whether a resend is a resend is
exact all the same: it is answered from its first copy only if that was stored within the
window (its store timestamp).  Per message it keeps the 64-bit hash of the UNIQ_KEY and the
commit-log offset in a plain dict (two ints, no object the garbage collector tracks, the
UNIQ_KEY string not kept); a resend -- rare -- reads its first copy back for the answer and
checks its UNIQ_KEY there (two UNIQ_KEYs of one hash are told apart).  A batch's ids are
checked with one set and two ``isdisjoint`` and remembered with one ``dict.update``; a
generation is forgotten by dropping its dict.

**Durable and replicated without a file of its own**: the index is a view of the commit log.
After a restart -- or on a follower that becomes leader, whose log is the leader's byte for
byte -- it is rebuilt from the messages stored within the window (:meth:`DedupIndex.rebuild`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import lru_cache
from operator import itemgetter
from typing import NamedTuple

import structlog

from txmq.protocol.errors import TxmqError
from txmq.protocol.message import MessageConst, MessageExt, MessageSysFlag

from ..metrics import BrokerMetrics
from ..store import MessageStore
from ..store.commit_log import RECORD_HEADER_SIZE
from ..store.reading import read_queue
from ..topics import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    RMQ_SYS_TRANS_HALF_TOPIC,
    SCHEDULE_TOPIC,
    SYSTEM_TOPICS,
    TIMER_TOPIC,
)

log = structlog.get_logger(__name__)

_first = itemgetter(0)

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
    """Per topic, the UNIQ_KEYs stored within the window and where (their commit-log offset),
    each id as the 64-bit hash of its UNIQ_KEY, in two generations.

    **Hashes, checked on a hit**: an id is remembered as ``hash(uniq)`` (an int; the UNIQ_KEY
    string is not kept), so a batch's check, its insert and its forgetting touch small objects.
    A hit -- a resend, rare -- reads the first copy back from the store, whose UNIQ_KEY must
    match (:meth:`get`); two UNIQ_KEYs of one hash (one chance in 2**64 per pair) are told apart
    there: the later one is remembered by its UNIQ_KEY itself, next to the hash.

    **Generations**: ids go into the current generation; when it is ``window`` old or holds
    ``max_entries`` ids, it becomes the previous one and the previous one is dropped whole.  So
    each id is remembered for at least the window (or at least until ``max_entries`` newer ids
    came, when that is sooner) and at most about twice that; the window itself is exact, since
    a hit is a hit only when the first copy was stored within it (its store timestamp)."""

    def __init__(
        self,
        window_ms: int,
        max_entries: int,
        metrics: BrokerMetrics,
        lookup: Callable[[int], MessageExt] | None = None,
        *,
        key_hash: Callable[[str], int] = hash,
    ) -> None:
        self.window_ms = window_ms
        self.max_entries = max_entries
        self.enabled = window_ms > 0 and max_entries > 0
        self.metrics = metrics
        #: Reads a stored message by commit-log offset (the store's ``lookup_message``).
        self.lookup = lookup
        #: How an id is remembered (``hash``: a test gives a worse one to make collisions).
        self._hash = key_hash
        #: The current and the previous generation: per topic, id -> commit-log offset.  An id
        #: is its UNIQ_KEY's hash (an int), or for the rare second UNIQ_KEY of a hash, the
        #: UNIQ_KEY itself (a str: never equal to an int).
        self._cur: dict[str, dict[int | str, int]] = {}
        self._prev: dict[str, dict[int | str, int]] = {}
        #: When the current generation began (store ms) and how many ids each holds.
        self._cur_since = 0
        self._cur_size = 0
        self._prev_size = 0
        self._warned = False

    def __len__(self) -> int:
        return self._cur_size + self._prev_size

    def key(self, topic: str, props: dict[str, str]) -> Key | None:
        """The key of a producer's send to ``topic``, or None when it is not de-duplicated."""
        uniq = props.get(MessageConst.UNIQ_KEY)
        if not uniq or not self.enabled or not dedup_topic(topic):
            return None
        return (topic, uniq)

    def _offset(self, topic: str, uniq: str) -> int | None:
        """Where the first copy of ``uniq`` may be: remembered by the UNIQ_KEY itself (the
        second of a hash), else by its hash; the newest generation first."""
        gens = [ids for ids in (self._cur.get(topic), self._prev.get(topic)) if ids]
        for ids in gens:
            phy = ids.get(uniq)
            if phy is not None:
                return phy
        return self._offset_of_hash(topic, self._hash(uniq)) if gens else None

    def get(self, key: Key | None, now_ms: int) -> Stored | None:
        """The first send of ``key`` if it was stored within the window (read back)."""
        if key is None:
            return None
        phy = self._offset(key[0], key[1])
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
        """Whether ``uniq`` may be remembered for ``topic`` (perhaps past its window, perhaps
        another UNIQ_KEY of its hash): a resend then if :meth:`get` says so."""
        h = self._hash(uniq)
        ids = self._cur.get(topic)
        if ids is not None and h in ids:
            return True
        ids = self._prev.get(topic)
        return ids is not None and h in ids

    def any_known(self, topic: str, uniqs: list[str]) -> bool:
        """Whether any of ``uniqs`` may be remembered for ``topic`` (see :meth:`known`)."""
        return self.fresh(topic, uniqs, False) is None

    def fresh(self, topic: str, uniqs: list[str], once: bool = True) -> list[int] | None:
        """The ids of ``uniqs`` when none is remembered for ``topic`` (and, with ``once``, none
        is there twice), else None: what a batch of new messages costs, a few passes in C.
        Give the ids to :meth:`add_fresh` once they are stored."""
        hs = list(map(self._hash, uniqs))
        distinct = set(hs)
        if once and len(distinct) < len(hs):
            return None
        ids = self._cur.get(topic)
        if ids is not None and not ids.keys().isdisjoint(distinct):
            return None
        ids = self._prev.get(topic)
        if ids is not None and not ids.keys().isdisjoint(distinct):
            return None
        return hs

    def add_fresh(
        self, topic: str, ids: list[int], placed: list[tuple[int, int, int]], now_ms: int
    ) -> None:
        """Remember the messages of a batch :meth:`fresh` gave ``ids`` for, stored where
        ``placed`` says (the store's ``(commit-log offset, size, queue offset)`` of each)."""
        self._turn(now_ms)
        cur = self._cur.get(topic)
        if cur is None:
            cur = self._cur[topic] = {}
        cur.update(zip(ids, map(_first, placed), strict=True))
        self._cur_size += len(ids)

    def add_many(self, topic: str, uniqs: list[str], offsets: list[int], now_ms: int) -> None:
        """Remember first sends (in the order they were stored)."""
        hs = self.fresh(topic, uniqs)
        if hs is not None:
            self._turn(now_ms)
            cur = self._cur.get(topic)
            if cur is None:
                cur = self._cur[topic] = {}
            cur.update(zip(hs, offsets, strict=True))
            self._cur_size += len(hs)
            return
        for uniq, offset in zip(uniqs, offsets, strict=True):
            self.add((topic, uniq), offset, now_ms)

    def add(self, key: Key | None, offset: int, now_ms: int) -> None:
        """Remember one first send."""
        if key is None:
            return
        topic, uniq = key
        self._turn(now_ms)
        cur = self._cur.get(topic)
        if cur is None:
            cur = self._cur[topic] = {}
        prev = self._prev.get(topic)
        h = self._hash(uniq)
        if h not in cur and (prev is None or h not in prev):
            cur[h] = offset  # the usual: a new id
            self._cur_size += 1
            return
        # Its hash is remembered: the same UNIQ_KEY stored again after its window (it answers
        # from the new copy now), or another UNIQ_KEY of that hash, remembered by itself.
        key_id: int | str
        if uniq in cur or (prev is not None and uniq in prev):
            key_id = uniq
        else:
            key_id = h if self._same_id(topic, uniq, self._offset_of_hash(topic, h)) else uniq
        if key_id is uniq and h not in cur:
            # The hash stays as long as the UNIQ_KEY it stands beside (what known() asks).
            cur[h] = self._offset_of_hash(topic, h) or 0
            self._cur_size += 1
        if key_id not in cur:
            self._cur_size += 1
        cur[key_id] = offset

    def _offset_of_hash(self, topic: str, h: int) -> int | None:
        for gen in (self._cur, self._prev):
            ids = gen.get(topic)
            if ids is not None and h in ids:
                return ids[h]
        return None

    def _same_id(self, topic: str, uniq: str, phy: int | None) -> bool:
        """Whether the message stored at ``phy`` is ``uniq`` sent to ``topic`` (True when it
        cannot be read: gone with retention, so nothing is left to tell apart)."""
        if phy is None or self.lookup is None:
            return True
        try:
            entry = _entry_of(self.lookup(phy))
        except (TxmqError, KeyError, ValueError):
            return True
        return entry is None or entry[0] == (topic, uniq)

    def _turn(self, now_ms: int) -> None:
        """Start a new generation when the current one is a window old or full; the previous
        one is forgotten whole (its ids counted as cut short when it is dropped for size while
        some were stored within the window)."""
        if now_ms - self._cur_since < self.window_ms and self._cur_size < self.max_entries:
            return
        dropped = self._prev_size
        if dropped and now_ms - self._cur_since < self.window_ms:
            # Dropped for size: the previous generation ended when this one began, less than a
            # window ago, so its newest ids were still inside their window.
            self.metrics.dedup_evicted_early.inc(dropped)
            if not self._warned:
                self._warned = True
                log.warning(
                    "dedup_window_cut_short",
                    max_entries=self.max_entries,
                    window_seconds=self.window_ms / 1000,
                    kept_seconds=round(max(0, now_ms - self._cur_since) / 1000, 1),
                    hint="raise duplicateWindowMaxEntries to keep the whole window",
                )
        self._prev, self._cur = self._cur, {}
        self._prev_size, self._cur_size = self._cur_size, 0
        self._cur_since = now_ms

    # -- the view of the commit log ---------------------------------------------------------------

    def rebuild(self, store: MessageStore, now_ms: int) -> int:
        """Rebuild the index from the messages a producer sent within the window (the first
        stored copy of each key wins); returns how many keys it holds."""
        self._cur, self._prev = {}, {}
        self._cur_size = self._prev_size = 0
        self._cur_since = 0
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
                self.add(key, phy, ts)
        self._turn(now_ms)
        log.info(
            "dedup_index_rebuilt",
            keys=len(self),
            window_seconds=self.window_ms / 1000,
            scanned=len(found),
        )
        return len(self)


def _stored_since(store: MessageStore, topic: str, qid: int, since_ms: int) -> Iterator[MessageExt]:
    start = store.get_offset_by_time(topic, qid, since_ms)
    for m in read_queue(store, topic, qid, start, chunk=_REBUILD_CHUNK):
        if m.store_timestamp >= since_ms:
            yield m


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
