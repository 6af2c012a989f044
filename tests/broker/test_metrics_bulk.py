"""The request path counts in plain integers folded into the Prometheus objects when the metrics
are read: a read shows exactly what one ``inc``/``observe`` per event would have shown."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram

from txmq.broker.metrics import LATENCY_BUCKETS, BrokerMetrics, samples

CODES = st.sampled_from([10, 310, 11, "grpc:SendMessage"])
TOPICS = st.sampled_from(["a", "b", "%RETRY%g"])
SECONDS = st.one_of(
    st.sampled_from(LATENCY_BUCKETS),  # exactly on a bound: counted in that bucket (le)
    st.floats(min_value=0.0, max_value=100.0, allow_nan=False),
)
EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("request"), CODES),
        st.tuples(st.just("put"), st.dictionaries(TOPICS, st.integers(1, 500), min_size=1)),
        st.tuples(st.just("latency"), CODES, SECONDS),
    ),
    max_size=60,
)


class Reference:
    """The same metrics, updated one event at a time as before."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("txmq_requests", "", ["code"], registry=r)
        self.messages_put = Counter("txmq_messages_put", "", ["topic"], registry=r)
        self.bytes_put = Counter("txmq_bytes_put", "", registry=r)
        self.latency = Histogram(
            "txmq_request_latency_seconds", "", ["code"], buckets=LATENCY_BUCKETS, registry=r
        )


def _compare(got: dict[str, float], want: dict[str, float]) -> None:
    names = ("txmq_requests", "txmq_messages_put", "txmq_bytes_put", "txmq_request_latency")
    got = {k: v for k, v in got.items() if k.startswith(names)}
    assert got.keys() == want.keys()
    for key, w in want.items():
        if "_sum" in key:
            assert math.isclose(got[key], w, rel_tol=1e-9, abs_tol=1e-12), key
        else:
            assert got[key] == w, key


@settings(max_examples=60, deadline=None)
@given(rounds=st.lists(EVENTS, min_size=1, max_size=4))
def test_folded_counts_equal_one_update_per_event(rounds: list[list[tuple]]) -> None:  # type: ignore[type-arg]
    metrics = BrokerMetrics()
    ref = Reference()
    for events in rounds:  # several reads, events in between
        for event in events:
            if event[0] == "request":
                metrics.record_request(event[1])
                ref.requests.labels(str(event[1])).inc()
            elif event[0] == "put":
                per_topic = event[1]
                metrics.record_put(per_topic, 7 * sum(per_topic.values()))
                for topic, n in per_topic.items():
                    ref.messages_put.labels(topic).inc(n)
                ref.bytes_put.inc(7 * sum(per_topic.values()))
            else:
                metrics.observe_latency(event[1], event[2])
                ref.latency.labels(str(event[1])).observe(event[2])
        _compare(metrics.snapshot(), samples(ref.registry.collect()))


def _own(snap: dict[str, Any]) -> dict[str, Any]:
    """The broker's own samples of a snapshot (``txmq_*``)."""
    return {k: v for k, v in snap.items() if k.startswith("txmq_")}


def test_timed_processors_count_answers_and_failures() -> None:
    metrics = BrokerMetrics()

    async def ok(*args: object) -> str:
        return "ok"

    async def fails(*args: object) -> str:
        await asyncio.sleep(0)
        raise ValueError("boom")

    procs = metrics.timed({10: ok, 11: fails})

    async def run() -> None:
        for _ in range(3):
            assert await procs[10]() == "ok"
        for _ in range(2):
            try:
                await procs[11]()
            except ValueError:
                pass
            else:
                raise AssertionError("the failure was swallowed")

    asyncio.run(run())
    snap = metrics.snapshot()
    assert snap["txmq_request_latency_seconds_count{code=10}"] == 3
    assert snap["txmq_request_latency_seconds_bucket{code=10,le=+Inf}"] == 3
    assert snap["txmq_request_latency_seconds_count{code=11}"] == 2
    assert snap["txmq_request_latency_seconds_sum{code=11}"] > 0
    # A second read without new events shows the same figures (nothing folded twice); the
    # process figures (memory, CPU) move by themselves between two reads.
    assert _own(metrics.snapshot()) == _own(snap)
    metrics.record_put_one("t", 100)
    metrics.record_put_one("t", 50)
    snap = metrics.snapshot()
    assert snap["txmq_messages_put_total{topic=t}"] == 2
    assert snap["txmq_bytes_put_total"] == 150


def test_reads_from_another_thread_lose_and_repeat_nothing() -> None:
    metrics = BrokerMetrics()
    stop = threading.Event()
    reads = [0]

    def reader() -> None:
        while not stop.is_set():
            list(metrics.registry.collect())
            reads[0] += 1

    t = threading.Thread(target=reader)
    t.start()
    n = 0
    deadline = time.monotonic() + 60
    try:
        # at least 60,000 events, and on until the reader has read a few times meanwhile (a
        # loaded machine may give it few turns)
        while n < 60_000 or (reads[0] < 5 and time.monotonic() < deadline):
            metrics.record_request(310)
            metrics.record_put_one("t", 3)
            metrics.observe_latency(310, 0.0001 * (n % 7))
            n += 1
    finally:
        stop.set()
        t.join(10)
    assert not t.is_alive(), "the reader did not stop"
    assert reads[0] >= 5, f"the reader read {reads[0]} times in 60 s of counting"
    snap = metrics.snapshot()
    assert snap["txmq_requests_total{code=310}"] == n
    assert snap["txmq_messages_put_total{topic=t}"] == n
    assert snap["txmq_bytes_put_total"] == 3 * n
    assert snap["txmq_request_latency_seconds_count{code=310}"] == n


def test_a_child_read_through_labels_sees_the_counts() -> None:
    metrics = BrokerMetrics()
    for _ in range(3):
        metrics.record_request(320)
        metrics.record_put_one("t", 5)
        metrics.observe_latency(320, 0.002)
    assert metrics.requests.labels("320")._value.get() == 3
    assert metrics.messages_put.labels("t")._value.get() == 3
    assert metrics.request_latency.labels("320")._sum.get() == 0.006
    assert metrics.registry.get_sample_value("txmq_bytes_put_total") == 15
