"""Figures computed when the metrics are read, not as messages flow: consumer lag per (group,
topic) in messages and in age, the store's disk, parked transactions, and replication lag as the
leader and as a follower see it.

Each collector's :meth:`refresh` runs on the event loop that owns the store (the operations port
asks the loop to run it, so nothing is read while the loop changes it) and keeps the families
:meth:`collect` hands out.  The cost is per scrape: one step per (group, topic, queue) with a
committed offset, one message header read per lagging queue, one ``statvfs``, one pass over the
transaction table."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily, Metric

from txmq.protocol.message import decode_message
from txmq.protocol.topics import INTERNAL_TOPICS

from .metrics import MetricsRegistry, add_figures, add_process_collectors
from .store import ConsumerOffsetManager, GetMessageStatus, MessageStore
from .transaction.state import TxState

if TYPE_CHECKING:
    from .context import BrokerContext
    from .transaction.machine import TransactionStateMachine
    from .transaction.service import TransactionalMessageService

GROUP_TOPIC = ["group", "topic"]

#: name -> (help, labels) of every family these collectors may export.
FAMILIES: dict[str, tuple[str, list[str]]] = {
    "txmq_consumer_lag_messages": (
        "Messages stored and not yet consumed by the group (sum over queues of the max offset "
        "minus the committed offset)",
        GROUP_TOPIC,
    ),
    "txmq_consumer_lag_seconds": (
        "Age of the group's oldest unconsumed message (0 when caught up)",
        GROUP_TOPIC,
    ),
    "txmq_consumer_offset": (
        "The group's committed offsets summed over the topic's queues (its progress, what "
        "rocketmq-exporter calls the consumer offset)",
        GROUP_TOPIC,
    ),
    "txmq_topic_offset": (
        "Each queue's end summed over the topic's queues: the messages ever stored in it "
        "(rocketmq-exporter's topic offset; retry and dead-letter topics included)",
        ["topic"],
    ),
    "txmq_disk_used_ratio": ("Used share of the filesystem holding the store (0..1)", []),
    "txmq_disk_free_ratio": (
        "Share of the store's filesystem still free for the broker (0..1)",
        [],
    ),
    "txmq_disk_total_bytes": ("Size of the filesystem holding the store", []),
    "txmq_commit_log_bytes": ("Commit-log bytes retained (max minus min offset)", []),
    "txmq_transaction_parked": (
        "Transactions parked after their check budget (state DISCARDED, waiting for an operator)",
        ["topic", "group"],
    ),
    "txmq_transaction_parked_oldest_seconds": (
        "Age of the oldest parked transaction's half",
        ["topic", "group"],
    ),
    "txmq_replication_lag_seconds": (
        "Seconds since the follower was last caught up with the leader's end (0 when it is)",
        ["replica"],
    ),
    "txmq_min_in_sync_replicas": ("The group's minInSyncReplicas (on its leader)", []),
    "txmq_follower_lag_bytes": (
        "Commit-log bytes this follower is behind its leader's end (as of its last fetch)",
        [],
    ),
    "txmq_follower_lag_seconds": (
        "Seconds since this follower last reached its leader's end (0 when it is there)",
        [],
    ),
}


class Families:
    """A set of gauge families being filled (``add``) for one refresh."""

    def __init__(self) -> None:
        self.by_name: dict[str, GaugeMetricFamily] = {}

    def add(self, name: str, value: float, *labels: str) -> None:
        fam = self.by_name.get(name)
        if fam is None:
            doc, names = FAMILIES[name]
            fam = self.by_name[name] = GaugeMetricFamily(name, doc, labels=names)
        fam.add_metric(list(labels), value)


class Figures:
    """A collector whose families are rebuilt by :meth:`refresh`."""

    def __init__(self) -> None:
        self._families: list[Metric] = []

    def describe(self) -> list[Metric]:
        return [GaugeMetricFamily(n, d, labels=ls) for n, (d, ls) in FAMILIES.items()]

    def collect(self) -> Iterator[Metric]:
        yield from self._families

    def refresh(self) -> None:
        out = Families()
        self.fill(out)
        self._families = list(out.by_name.values())

    def fill(self, out: Families) -> None:
        raise NotImplementedError


def consumer_lag(
    out: Families, store: MessageStore, offsets: ConsumerOffsetManager, now_ms: int
) -> None:
    """Lag of every (group, topic) with a committed offset.  A queue the group never committed
    counts from its oldest stored message; a committed offset below it (retention deleted what
    was not consumed) counts from there too."""
    for group in offsets.groups():
        for topic in offsets.topics_of(group):
            if topic in INTERNAL_TOPICS:
                continue
            committed = offsets.offsets(group, topic)
            out.add("txmq_consumer_offset", sum(committed.values()), group, topic)
            lag = 0
            oldest: int | None = None
            for qid in store.queue_ids(topic):
                low = store.get_min_offset_in_queue(topic, qid)
                start = max(committed.get(qid, low), low)
                behind = store.get_max_offset_in_queue(topic, qid) - start
                if behind <= 0:
                    continue
                lag += behind
                ts = store_timestamp(store, topic, qid, start)
                if ts is not None and (oldest is None or ts < oldest):
                    oldest = ts
            out.add("txmq_consumer_lag_messages", lag, group, topic)
            age = max(0.0, (now_ms - oldest) / 1000.0) if lag and oldest is not None else 0.0
            out.add("txmq_consumer_lag_seconds", age, group, topic)


def topic_offsets(out: Families, store: MessageStore) -> None:
    """Every stored topic's queue ends, summed (one step per queue)."""
    for topic in store.topics():
        end = sum(store.get_max_offset_in_queue(topic, qid) for qid in store.queue_ids(topic))
        out.add("txmq_topic_offset", end, topic)


def store_timestamp(store: MessageStore, topic: str, qid: int, offset: int) -> int | None:
    """Store time (ms) of the message at ``offset`` of a queue; None when it cannot be read."""
    r = store.get_messages(topic, qid, offset, 1, max_bytes=1)
    if r.status is not GetMessageStatus.FOUND or not r.messages:
        return None
    return decode_message(r.messages[0]).store_timestamp


def disk(out: Families, store: MessageStore) -> None:
    usage = shutil.disk_usage(store.config.store_path_root_dir)
    total = usage.total or 1
    out.add("txmq_disk_used_ratio", usage.used / total)
    out.add("txmq_disk_free_ratio", usage.free / total)
    out.add("txmq_disk_total_bytes", usage.total)
    out.add("txmq_commit_log_bytes", store.max_phy_offset - store.min_phy_offset)


def parked(out: Families, machine: TransactionStateMachine, now_ms: int) -> None:
    """Parked transactions per (topic, group) and the age of the oldest one's half."""
    seen: dict[tuple[str, str], tuple[int, int]] = {}
    for rec in list(machine.records.values()):  # one step under the GIL
        if rec.state is not TxState.DISCARDED:
            continue
        key = (rec.halves[0].real_topic if rec.halves else "", rec.producer_group)
        n, oldest = seen.get(key, (0, now_ms))
        seen[key] = (n + 1, min(oldest, rec.oldest_store_timestamp or now_ms))
    for (topic, group), (n, oldest) in seen.items():
        out.add("txmq_transaction_parked", n, topic, group)
        out.add("txmq_transaction_parked_oldest_seconds", (now_ms - oldest) / 1000.0, topic, group)


class BrokerFigures(Figures):
    """A serving broker's (a single broker, or a group's leader)."""

    def __init__(
        self,
        ctx: BrokerContext,
        transactions: TransactionalMessageService,
        replication: Callable[[], Any],
    ) -> None:
        super().__init__()
        self.ctx = ctx
        self.transactions = transactions
        self.replication = replication

    def fill(self, out: Families) -> None:
        ctx = self.ctx
        now_ms = ctx.now_ms()
        consumer_lag(out, ctx.store, ctx.offsets, now_ms)
        topic_offsets(out, ctx.store)
        disk(out, ctx.store)
        self.transactions.update_gauges()
        parked(out, self.transactions.machine, now_ms)
        rep = self.replication()
        if rep is not None:
            out.add("txmq_min_in_sync_replicas", ctx.config.min_in_sync_replicas)
            now, end = time.monotonic(), ctx.store.max_phy_offset
            for replica, f in list(rep.followers.items()):
                behind = 0.0 if f.offset >= end else max(0.0, now - f.caught_up_at)
                out.add("txmq_replication_lag_seconds", behind, str(replica))


class FollowerFigures(Figures):
    """A following replica's: its store's consumer lag (the offsets copied from the leader),
    disk, and how far behind its leader it is.  ``follower()``: the node's follower role, or
    None while the replica does not follow."""

    def __init__(self, follower: Callable[[], Any], clock: Callable[[], float]) -> None:
        super().__init__()
        self.follower = follower
        self.clock = clock

    def fill(self, out: Families) -> None:
        role = self.follower()
        if role is None:
            return
        store: MessageStore = role.store
        root = store.config.store_path_root_dir
        offsets = ConsumerOffsetManager(os.path.join(root, "config", "consumerOffset.json"))
        offsets.load()
        consumer_lag(out, store, offsets, int(self.clock() * 1000))
        topic_offsets(out, store)
        disk(out, store)
        fetcher = role.fetcher
        if fetcher is not None and fetcher.fetches:
            behind = max(0, fetcher.leader_end - store.max_phy_offset)
            out.add("txmq_follower_lag_bytes", behind)
            seconds = 0.0 if not behind else time.monotonic() - fetcher.caught_up_at
            out.add("txmq_follower_lag_seconds", max(0.0, seconds))


def follower_registry(follower: Callable[[], Any], clock: Callable[[], float]) -> MetricsRegistry:
    """What a replica's operations port serves while it does not lead."""
    registry = MetricsRegistry()
    add_process_collectors(registry)
    add_figures(registry, FollowerFigures(follower, clock))
    return registry
