"""Broker metrics on a private Prometheus registry (no globals), also readable as JSON.

Two kinds: counters, gauges and a latency histogram the broker updates as it works (below), and
figures computed when the metrics are read (:mod:`.metrics_scrape`: consumer lag, disk, parked
transactions, replication lag in seconds), which cost nothing per message.  Every name is listed
beside RocketMQ 5's in ``docs/operations.md``."""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

from txmq.protocol.aio import IDLE, PARTIAL_FRAME, SLOW_READER, WRITE_BUFFER

log = structlog.get_logger(__name__)

#: Request latency buckets (seconds): sub-millisecond sends to 60 s long polls.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

P = TypeVar("P", bound=Callable[..., Awaitable[Any]])
K = TypeVar("K")

#: The ``reason`` label values of ``txmq_connections_dropped_total``.
DROP_REASONS = (SLOW_READER, IDLE, WRITE_BUFFER, PARTIAL_FRAME)


class MetricsRegistry(CollectorRegistry):
    """A registry whose scrape-time figures are brought up to date by :meth:`refresh` (run on
    the event loop that owns what they read: the operations port asks the loop to run it), and
    whose counts kept in plain integers are folded in by every :meth:`collect` (``folds``:
    safe from any thread)."""

    def __init__(self) -> None:
        super().__init__(auto_describe=True)
        self.refreshers: list[Callable[[], None]] = []
        self.folds: list[Callable[[], None]] = []

    def collect(self) -> Iterator[Any]:
        for fn in self.folds:
            fn()
        yield from super().collect()

    def refresh(self) -> None:
        for fn in list(self.refreshers):
            try:
                fn()
            except Exception as exc:  # a scrape still answers with everything else
                log.warning("metrics_refresh_failed", error=repr(exc))


class IdentityLabels:
    """A registry as the operations port serves it: every sample carries the constant labels
    ``labels`` too (``cluster`` and ``broker``, what rocketmq-exporter's dashboards group by),
    unless it has a label of that name itself.  They are added while a scrape is written, so
    recording a figure costs nothing more, and the registry itself (the JSON of
    TXMQ_GET_METRICS, the tests' reads) keeps its own labels."""

    def __init__(self, registry: Any, labels: dict[str, str]) -> None:
        self.registry = registry
        self.labels = labels

    def collect(self) -> Iterator[Any]:
        const = self.labels
        for metric in self.registry.collect():
            labelled = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            labelled.samples = [
                s._replace(labels={**const, **s.labels} if s.labels else const)
                for s in metric.samples
            ]
            yield labelled

    def restricted_registry(self, names: Iterable[str]) -> IdentityLabels:
        """What ``/metrics?name[]=...`` serves: the named families, labelled the same."""
        return IdentityLabels(self.registry.restricted_registry(names), self.labels)


class _FoldedCounter(Counter):
    """A counter the request path counts in plain integers: reading a child through
    :meth:`labels` folds those in first (``fold_first``), so code that reads the Prometheus
    objects directly sees every count."""

    fold_first: Callable[[], None] | None = None

    def labels(self, *args: Any, **kwargs: Any) -> Any:
        if self.fold_first is not None:
            self.fold_first()
        return super().labels(*args, **kwargs)


class _FoldedHistogram(Histogram):
    """:class:`_FoldedCounter`'s histogram."""

    fold_first: Callable[[], None] | None = None

    def labels(self, *args: Any, **kwargs: Any) -> Any:
        if self.fold_first is not None:
            self.fold_first()
        return super().labels(*args, **kwargs)


def add_process_collectors(registry: CollectorRegistry) -> None:
    """What every Prometheus exporter serves beside its own figures, so existing dashboards
    and alerts find them: ``process_*`` (CPU seconds, resident memory, open files, start
    time), ``python_info``, and ``txmq_build_info`` (version, Python, whether the request path
    runs compiled)."""
    import platform

    from prometheus_client import PlatformCollector, ProcessCollector

    from txmq import __version__

    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    info = Gauge(
        "txmq_build_info",
        "The build that serves: 1, labelled with its version",
        ["version", "python", "implementation"],
        registry=registry,
    )
    info.labels(__version__, platform.python_version(), platform.python_implementation()).set(1)


class BrokerMetrics:
    # The broker's metrics declared one after another: split, a metric would be harder to find.
    def __init__(self) -> None:
        self.registry = MetricsRegistry()
        add_process_collectors(self.registry)
        c, g = self._counter, self._gauge
        self.messages_put = _FoldedCounter(
            "txmq_messages_put", "Messages stored", ["topic"], registry=self.registry
        )
        self.bytes_put = c("txmq_bytes_put", "Message bytes stored")
        self.messages_pulled = c("txmq_messages_pulled", "Messages returned by pulls")
        self.bytes_out = c(
            "txmq_bytes_out",
            "Message bytes handed to consumers (the stored records of pull answers, the bodies "
            "of POP receives)",
        )
        self.dead_lettered = c(
            "txmq_messages_dead_lettered",
            "Messages parked in a group's dead-letter queue (%DLQ%<group>)",
            ["group"],
        )
        self.queue_offsets_skipped = c(
            "txmq_queue_offsets_skipped",
            "Queue offsets skipped at start: consumers had committed past the end the commit "
            "log kept (never handed out twice)",
            ["topic", "queue_id"],
        )
        self.messages_out = c(
            "txmq_messages_out",
            "Messages returned to consumers (remoting pulls, gRPC receives)",
            ["topic", "group"],
        )
        self.requests = _FoldedCounter(
            "txmq_requests", "Requests handled", ["code"], registry=self.registry
        )
        self.request_errors = c("txmq_request_errors", "Error responses", ["code"])
        self.request_latency = _FoldedHistogram(
            "txmq_request_latency_seconds",
            "Time from a request's dispatch to its answer, by request code (gRPC: grpc:Method); "
            "long-polled pulls include the time they were held",
            ["code"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.protocol_errors = c("txmq_protocol_errors", "Malformed or oversized frames")
        self.connections = g("txmq_connections", "Open client connections")
        self.connections_dropped = c(
            "txmq_connections_dropped",
            "Client connections dropped by the broker, by reason: slow_reader (answers unread "
            "for clientWriteStallTimeout), idle (no whole frame within clientFirstFrameTimeout), "
            "write_buffer (past maxConnectionWriteBuffer), partial_frame (frameReadTimeout)",
            ["reason"],
        )
        for reason in DROP_REASONS:  # exported at 0 from the start, for rate() and alerts
            self.connections_dropped.labels(reason)
        self.flushes = c("txmq_flushes", "Commit-log fsyncs")
        self.scrub_damaged = g(
            "txmq_commit_log_damaged_records",
            "Damaged commit-log records the scrub found (its last complete pass, or the pass "
            "under way when that found more)",
        )
        self.scrub_bytes = c("txmq_commit_log_scrubbed_bytes", "Commit-log bytes the scrub checked")
        self.writes_refused = g(
            "txmq_writes_refused",
            "1 while writes are refused (the disk is full, or its filesystem is read-only)",
        )
        self.writes_refused_reason = g(
            "txmq_writes_refused_reason",
            "1 for the reason writes are refused now: disk_full or read_only",
            ["reason"],
        )
        self.dedup_hits = c(
            "txmq_dedup_hits",
            "Resends answered with the first send's result instead of being stored again",
        )
        self.dedup_evicted_early = c(
            "txmq_dedup_evicted_early",
            "Send ids forgotten before the end of duplicateWindowSeconds "
            "(duplicateWindowMaxEntries reached)",
        )
        self.send_path = c(
            "txmq_send_path",
            "Remoting send requests by the path that stored them: the direct paths (plain, "
            "halves: a batch; one_plain, one_half: one message), generic (no direct path "
            "qualified) or disabled (fastPathEnable is off)",
            ["path"],
        )
        # transactions
        self.tx_half = c("txmq_transaction_halves", "Half messages stored")
        self.tx_commits = c("txmq_transaction_commits", "Transactions committed")
        self.tx_rollbacks = c("txmq_transaction_rollbacks", "Transactions rolled back")
        self.tx_discards = c(
            "txmq_transaction_discards", "Transactions parked after the check budget"
        )
        self.tx_pipeline_orphans = c(
            "txmq_transaction_pipeline_orphans",
            "Pending transactions of a superseded Spark pipeline run rolled back",
        )
        self.tx_two_phase_overdue = c(
            "txmq_transaction_two_phase_overdue_checks",
            "Checks of two-phase transactions past the check budget (kept pending, not parked)",
        )
        self.tx_pruned = c(
            "txmq_transaction_pruned",
            "Decided transactions forgotten after their idempotency window",
        )
        self.tx_checks_sent = c(
            "txmq_transaction_checks_sent", "Checks delivered to a live producer"
        )
        self.tx_checks_answered = c(
            "txmq_transaction_checks_answered", "END_TRANSACTION answers to checks"
        )
        self.tx_checks_unexpected = c(
            "txmq_transaction_checks_unexpected", "Checks answered for transactions already decided"
        )
        self.tx_pending = g("txmq_transaction_pending", "Pending half messages", ["topic", "group"])
        self.tx_pending_oldest = g(
            "txmq_transaction_pending_oldest_seconds",
            "Age of the oldest pending half",
            ["topic", "group"],
        )
        # Cluster mode (docs/cluster.md), on a group's leader.
        self.replication_lag = g(
            "txmq_replication_lag_bytes",
            "Commit-log bytes a follower is behind the leader",
            ["replica"],
        )
        self.in_sync_replicas = g("txmq_in_sync_replicas", "Replicas in the group's in-sync set")
        self.elections = c("txmq_elections", "Elections this broker process has won")

        # Labelled children, cached: ``Counter.labels(...)`` validates and locks on every call.
        self._request_counters: dict[int | str, Any] = {}
        self._error_counters: dict[int, Any] = {}
        self._put_counters: dict[str, Any] = {}
        self._out_counters: dict[tuple[str, str], Any] = {}
        self._latency: dict[int | str, Any] = {}
        # What the request path counts (requests by code, messages by topic, bytes, latencies
        # by code), in plain integers and lists since the start, on the event loop: what they
        # grew by since the last read is added to the Prometheus objects above when the
        # metrics are read (:meth:`fold`, by every ``registry.collect()``), not one locked
        # ``inc``/``observe`` per request.
        self._requests_seen: dict[int | str, int] = {}
        self._puts_seen: dict[str, int] = {}
        #: (topic, group) -> messages returned since the start (RocketMQ's GROUP_GET_NUMS).
        self._out_seen: dict[tuple[str, str], int] = {}
        self._bytes_seen = 0
        #: code -> [count per bucket (the last: +Inf)..., sum of the seconds]
        self._latency_seen: dict[int | str, list[float]] = {}
        # What was added to the Prometheus objects so far (the same shapes).
        self._requests_folded: dict[int | str, int] = {}
        self._puts_folded: dict[str, int] = {}
        self._bytes_folded = 0
        self._latency_folded: dict[int | str, list[float]] = {}
        self._fold_lock = threading.RLock()
        self.registry.folds.append(self.fold)
        self.requests.fold_first = self.fold
        self.messages_put.fold_first = self.fold
        self.request_latency.fold_first = self.fold

    def _counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, doc, labels, registry=self.registry)

    def _gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, doc, labels, registry=self.registry)

    def record_request(self, code: int | str) -> None:
        """Count one request of ``code`` (a request code, or a name such as ``grpc:Send``)."""
        seen = self._requests_seen
        seen[code] = seen.get(code, 0) + 1

    def record_error(self, code: int) -> None:
        """Count one error response with response code ``code``."""
        child = self._error_counters.get(code)
        if child is None:
            child = self._error_counters[code] = self.request_errors.labels(str(int(code)))
        child.inc()

    def record_put(self, per_topic: dict[str, int], nbytes: int) -> None:
        """Count stored messages (``per_topic``: topic -> messages) and their bytes."""
        seen = self._puts_seen
        for topic, n in per_topic.items():
            seen[topic] = seen.get(topic, 0) + n
        self._bytes_seen += nbytes

    def record_put_one(self, topic: str, nbytes: int) -> None:
        """Count one stored message of ``topic`` and its bytes."""
        seen = self._puts_seen
        seen[topic] = seen.get(topic, 0) + 1
        self._bytes_seen += nbytes

    def record_out(self, topic: str, group: str, n: int) -> None:
        """Count ``n`` messages returned to ``group`` from ``topic`` (one call per answer)."""
        key = (topic, group)
        out = self._out_seen
        out[key] = out.get(key, 0) + n
        child = self._out_counters.get(key)
        if child is None:
            child = self._out_counters[key] = self.messages_out.labels(topic, group)
        child.inc(n)

    def puts_by_topic(self) -> dict[str, int]:
        """Messages stored per topic since the start (a copy)."""
        return dict(self._puts_seen)

    def out_by_topic_group(self) -> dict[tuple[str, str], int]:
        """Messages returned per ``(topic, group)`` since the start (a copy)."""
        return dict(self._out_seen)

    def _latency_of(self, code: int | str) -> list[float]:
        seen = self._latency_seen.get(code)
        if seen is None:
            seen = self._latency_seen[code] = [0.0] * (len(LATENCY_BUCKETS) + 2)
        return seen

    def observe_latency(self, code: int | str, seconds: float) -> None:
        """One request of ``code`` answered after ``seconds``."""
        seen = self._latency_of(code)
        seen[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        seen[-1] += seconds

    def timed(self, processors: dict[int, P]) -> dict[int, P]:
        """``processors`` (request code -> ``async (conn, cmd)``), each timed into
        :attr:`request_latency` (whether it answers or raises)."""
        return {code: self._timed(code, proc) for code, proc in processors.items()}

    def _timed(self, code: int, proc: P) -> P:
        seen = self._latency_of(code)
        clock = time.perf_counter
        bounds = LATENCY_BUCKETS

        async def timed(*args: Any) -> Any:
            t0 = clock()
            try:
                return await proc(*args)
            finally:
                seconds = clock() - t0
                seen[bisect_left(bounds, seconds)] += 1
                seen[-1] += seconds

        return timed  # type: ignore[return-value]

    def fold(self) -> None:
        """Add what was counted since the last fold to the Prometheus objects.  Any thread:
        the counts only grow (on the loop) and are read here with one copy each, and folds
        take turns."""
        with self._fold_lock:
            _fold_totals(
                self._requests_seen, self._requests_folded, self._request_counters, self.requests
            )
            _fold_totals(self._puts_seen, self._puts_folded, self._put_counters, self.messages_put)
            nbytes = self._bytes_seen
            if nbytes != self._bytes_folded:
                self.bytes_put.inc(nbytes - self._bytes_folded)
                self._bytes_folded = nbytes
            for code, seen in list(self._latency_seen.items()):
                counts = list(seen)
                before = self._latency_folded.get(code)
                if before is None:
                    before = self._latency_folded[code] = [0.0] * len(counts)
                if counts[:-1] == before[:-1]:
                    continue
                child = self._latency.get(code)
                if child is None:
                    child = self._latency[code] = Histogram.labels(self.request_latency, str(code))
                # The histogram child's own buckets (per bucket, not cumulative) and sum, as
                # ``observe`` fills them one observation at a time.
                for i in range(len(counts) - 1):
                    if counts[i] != before[i]:
                        child._buckets[i].inc(counts[i] - before[i])
                child._sum.inc(counts[-1] - before[-1])
                self._latency_folded[code] = counts

    def watch(self, figures: Any) -> None:
        """Add scrape-time figures (:mod:`.metrics_scrape`: ``refresh()`` on the event loop,
        ``collect()`` from any thread)."""
        add_figures(self.registry, figures)

    def snapshot(self) -> dict[str, Any]:
        """All samples as ``{"name{label=value}": value}`` (scrape-time figures refreshed
        first: call it on the event loop)."""
        self.registry.refresh()
        return samples(self.registry.collect())


def add_figures(registry: MetricsRegistry, figures: Any) -> None:
    """Register a scrape-time collector (``refresh()`` on the loop, ``collect()`` anywhere)."""
    registry.register(figures)
    registry.refreshers.append(figures.refresh)


def samples(metrics: Iterable[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric in metrics:
        for s in metric.samples:
            if s.name.endswith("_created"):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def _fold_totals(
    seen: dict[K, int], folded: dict[K, int], children: dict[K, Any], family: Counter
) -> None:
    """Add to the counter of ``family`` labelled with each key of ``seen`` what its running
    total grew by since the last fold (``folded``); ``children`` keeps the labelled counters."""
    for key, total in list(seen.items()):
        n = total - folded.get(key, 0)
        if n:
            child = children.get(key)
            if child is None:
                child = children[key] = Counter.labels(family, str(key))
            child.inc(n)
            folded[key] = total
