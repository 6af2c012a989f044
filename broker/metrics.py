"""Broker metrics on a private Prometheus registry (no globals), also readable as JSON."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.messages_put = Counter("txmq_messages_put", "Messages stored", ["topic"], registry=r)
        self.bytes_put = Counter("txmq_bytes_put", "Message bytes stored", registry=r)
        self.messages_pulled = Counter(
            "txmq_messages_pulled", "Messages returned by pulls", registry=r
        )
        self.requests = Counter("txmq_requests", "Requests handled", ["code"], registry=r)
        self.request_errors = Counter(
            "txmq_request_errors", "Error responses", ["code"], registry=r
        )
        self.protocol_errors = Counter(
            "txmq_protocol_errors", "Malformed or oversized frames", registry=r
        )
        self.connections = Gauge("txmq_connections", "Open client connections", registry=r)
        self.connections_dropped = Counter(
            "txmq_connections_dropped",
            "Client connections dropped for holding too much (unread answers, a partial frame)",
            registry=r,
        )
        self.flushes = Counter("txmq_flushes", "Commit-log fsyncs", registry=r)
        self.writes_refused = Gauge(
            "txmq_writes_refused",
            "1 while writes are refused because the disk is full (diskRefuseWritesRatio)",
            registry=r,
        )
        self.dedup_hits = Counter(
            "txmq_dedup_hits",
            "Resends answered with the first send's result instead of being stored again",
            registry=r,
        )
        self.dedup_evicted_early = Counter(
            "txmq_dedup_evicted_early",
            "Send ids forgotten before the end of duplicateWindowSeconds "
            "(duplicateWindowMaxEntries reached)",
            registry=r,
        )
        self.batch_path = Counter(
            "txmq_batch_path",
            "SEND_BATCH_MESSAGE requests by the path that stored them (plain, halves: the fast "
            "paths; generic: did not qualify; disabled: batchFastPathEnable is off)",
            ["path"],
            registry=r,
        )
        # transactions
        self.tx_half = Counter("txmq_transaction_halves", "Half messages stored", registry=r)
        self.tx_commits = Counter("txmq_transaction_commits", "Transactions committed", registry=r)
        self.tx_rollbacks = Counter(
            "txmq_transaction_rollbacks", "Transactions rolled back", registry=r
        )
        self.tx_discards = Counter(
            "txmq_transaction_discards", "Transactions parked after the check budget", registry=r
        )
        self.tx_pruned = Counter(
            "txmq_transaction_pruned",
            "Decided transactions forgotten after their idempotency window",
            registry=r,
        )
        self.tx_checks_sent = Counter(
            "txmq_transaction_checks_sent", "Checks delivered to a live producer", registry=r
        )
        self.tx_checks_answered = Counter(
            "txmq_transaction_checks_answered", "END_TRANSACTION answers to checks", registry=r
        )
        self.tx_checks_unexpected = Counter(
            "txmq_transaction_checks_unexpected",
            "Checks answered for transactions already decided",
            registry=r,
        )
        self.tx_pending = Gauge(
            "txmq_transaction_pending", "Pending half messages", ["topic", "group"], registry=r
        )
        self.tx_pending_oldest = Gauge(
            "txmq_transaction_pending_oldest_seconds",
            "Age of the oldest pending half",
            ["topic", "group"],
            registry=r,
        )
        # Cluster mode (docs/cluster.md), on a group's leader.
        self.replication_lag = Gauge(
            "txmq_replication_lag_bytes",
            "Commit-log bytes a follower is behind the leader",
            ["replica"],
            registry=r,
        )
        self.in_sync_replicas = Gauge(
            "txmq_in_sync_replicas", "Replicas in the group's in-sync set", registry=r
        )
        self.elections = Counter(
            "txmq_elections", "Elections this broker process has won", registry=r
        )

        # Labelled children, cached: ``Counter.labels(...)`` validates and locks on every call,
        # and the send path counts one request and one put per message.
        self._request_counters: dict[int | str, Any] = {}
        self._error_counters: dict[int, Any] = {}
        self._put_counters: dict[str, Any] = {}

    def record_request(self, code: int | str) -> None:
        """Count one request of ``code`` (a request code, or a name such as ``grpc:Send``)."""
        child = self._request_counters.get(code)
        if child is None:
            child = self._request_counters[code] = self.requests.labels(str(code))
        child.inc()

    def record_error(self, code: int) -> None:
        """Count one error response with response code ``code``."""
        child = self._error_counters.get(code)
        if child is None:
            child = self._error_counters[code] = self.request_errors.labels(str(int(code)))
        child.inc()

    def record_put(self, per_topic: dict[str, int], nbytes: int) -> None:
        """Count stored messages (``per_topic``: topic -> messages) and their bytes."""
        children = self._put_counters
        for topic, n in per_topic.items():
            child = children.get(topic)
            if child is None:
                child = children[topic] = self.messages_put.labels(topic)
            child.inc(n)
        self.bytes_put.inc(nbytes)

    def snapshot(self) -> dict[str, Any]:
        """All samples as ``{"name{label=value}": value}``."""
        out: dict[str, Any] = {}
        for metric in self.registry.collect():
            for s in metric.samples:
                if s.name.endswith("_created"):
                    continue
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out
