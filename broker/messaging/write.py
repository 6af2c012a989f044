"""The one write path: every append to the store goes through :class:`WritePath`, which then
tells its subscribers (the flush service, replication, parked long polls, the delay levels)
what was written, once per append and once per destination queue."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from txmq.protocol.message import MessageExt

from ..metrics import BrokerMetrics
from ..store import AppendResult, EncodedMessage, MessageStore, PutMessageResult


class AppendSubscriber(Protocol):
    """Told after every append (synchronously, on the event loop)."""

    def on_append(self, destinations: Iterable[tuple[str, int]]) -> None:
        """``destinations``: the ``(topic, queue id)`` pairs the append wrote to (each once)."""


class WritePath:
    """Appends to the store and tells the subscribers.

    Appends are synchronous: the records of one call are contiguous and nothing else runs in
    between, which is what the transaction service relies on (a decision's op record and its
    committed messages in one append)."""

    def __init__(self, store: MessageStore, metrics: BrokerMetrics) -> None:
        self.store = store
        self.metrics = metrics
        self._subscribers: list[AppendSubscriber] = []

    def subscribe(self, subscriber: AppendSubscriber) -> None:
        self._subscribers.append(subscriber)

    def unsubscribe(self, subscriber: AppendSubscriber) -> None:
        if subscriber in self._subscribers:
            self._subscribers.remove(subscriber)

    def put_message(self, msg: MessageExt) -> PutMessageResult:
        return self.put_messages([msg])[0]

    def put_messages(self, msgs: list[MessageExt]) -> list[PutMessageResult]:
        """Store ``msgs`` (their store fields are set) and tell the subscribers."""
        results = self.store.put_messages(msgs)
        # Counted once per (topic, queue), not per message: a batch decision can append
        # hundreds of thousands of messages in one call.
        if len(msgs) == 1:
            m = msgs[0]
            self._appended({(m.topic, m.queue_id): 1}, results[0].size)
            return results
        per_dest: dict[tuple[str, int], int] = {}
        for msg in msgs:
            key = (msg.topic, msg.queue_id)
            per_dest[key] = per_dest.get(key, 0) + 1
        self._appended(per_dest, sum([r.size for r in results]))
        return results

    def put_encoded(self, records: list[EncodedMessage], *, one_run: bool = False) -> AppendResult:
        """:meth:`put_messages` of records already encoded for the store (see
        :meth:`MessageStore.put_encoded`; ``one_run``: all to one queue with one sys flag)."""
        res = self.store.put_encoded(records, one_run=one_run)
        self._appended(res.per_destination, res.payload_bytes)
        return res

    def _appended(self, per_dest: dict[tuple[str, int], int], nbytes: int) -> None:
        if len(per_dest) == 1:  # the usual append: one queue
            ((topic, _qid), n) = next(iter(per_dest.items()))
            per_topic = {topic: n}
        else:
            per_topic = {}
            for (topic, _qid), n in per_dest.items():
                per_topic[topic] = per_topic.get(topic, 0) + n
        self.metrics.record_put(per_topic, nbytes)
        for s in self._subscribers:
            s.on_append(per_dest)
