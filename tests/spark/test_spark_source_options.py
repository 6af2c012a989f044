"""The source's Kafka-style options in real Spark (``local[2]``) against a real broker, one
behaviour per test: starting by timestamp, ``endingOffsets``, ``subscribePattern``,
``minPartitions``, ``maxBytesPerTrigger``, ``minOffsetsPerTrigger`` / ``maxTriggerDelay``, the
offsets behind latest in the query progress, and unknown options refused by name."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BrokerThread
from tests.spark.helpers import pull_all, spark_fixture
from txmq.client import Message, Producer

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'txmq[spark]')")

from txmq.spark_connector.options import offsets_behind  # noqa: E402  (after the skip)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


spark = spark_fixture("local[2]", "txmq-source-options-tests")


def _publish(address: str, topic: str, ids: range, *, queues: int = 2, size: int = 0) -> list[int]:
    """Send ``m-<id>`` bodies (padded to ``size`` bytes) to queue ``id % queues``; returns the
    ids."""
    with Producer("source-options-test", broker=address) as producer:
        for i in ids:
            body = f"m-{i}|".ljust(size, "x").encode()
            producer.send(Message(topic, body), queue_id=i % queues)
    return list(ids)


def _ids(rows: list[Any]) -> list[int]:
    return sorted(int(bytes(r.body).split(b"|")[0][2:]) for r in rows)


def _read(spark: Any, address: str, **options: str) -> Any:
    reader = spark.read.format("txmq").option("broker", address)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _stream(spark: Any, address: str, checkpoint: Path, **options: str) -> Any:
    reader = spark.readStream.format("txmq").option("broker", address)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load().writeStream.option("checkpointLocation", str(checkpoint))


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def _batches(query: Any) -> list[dict[str, Any]]:
    """The progress of the micro-batches that read something."""
    return [p for p in query.recentProgress if p["numInputRows"]]


def test_starting_timestamp_and_offsets_by_timestamp(
    spark: Any, spark_broker: BrokerThread
) -> None:
    address = spark_broker.address
    _publish(address, "ts-orders", range(0, 20))
    stored = max(m.store_timestamp for m in pull_all(address, "ts-orders"))
    _wait(lambda: time.time() * 1000 > stored + 2, 5, "the clock to pass the last store time")
    _publish(address, "ts-orders", range(20, 40))
    since = stored + 1

    rows = _read(spark, address, topic="ts-orders", startingTimestamp=str(since)).collect()
    assert _ids(rows) == list(range(20, 40))
    # Only queue 0 from the time on; queue 1 (odd ids), not named, from its earliest message.
    rows = _read(
        spark,
        address,
        topic="ts-orders",
        startingOffsetsByTimestamp=json.dumps({"ts-orders": {"0": since}}),
    ).collect()
    assert _ids(rows) == sorted(list(range(20, 40, 2)) + list(range(1, 40, 2)))
    # A time after the last message: nothing to read.
    future = str(int(time.time() * 1000) + 60_000)
    assert _read(spark, address, topic="ts-orders", startingTimestamp=future).count() == 0


def test_ending_offsets_bound_a_batch_read_and_are_refused_in_streams(
    spark: Any, spark_broker: BrokerThread, tmp_path: Path
) -> None:
    address = spark_broker.address
    _publish(address, "end-orders", range(30))  # 15 per queue
    ending = json.dumps({"end-orders": {"0": 5, "1": -1}})
    rows = _read(spark, address, topic="end-orders", endingOffsets=ending).collect()
    assert _ids(rows) == sorted(list(range(0, 10, 2)) + list(range(1, 30, 2)))
    assert {(r.queue_id, r.queue_offset) for r in rows if r.queue_id == 0} == {
        (0, o) for o in range(5)
    }
    with pytest.raises(Exception, match="'endingOffsets' is for batch reads"):
        q = (
            _stream(spark, address, tmp_path / "ckpt", topic="end-orders", endingOffsets=ending)
            .format("memory")
            .queryName("ending_offsets_stream")
            .start()
        )
        try:
            q.awaitTermination(60)
        finally:
            q.stop()


def test_subscribe_pattern_reads_every_matching_topic(
    spark: Any, spark_broker: BrokerThread
) -> None:
    address = spark_broker.address
    _publish(address, "pat-eu", range(0, 10))
    _publish(address, "pat-us", range(10, 20))
    _publish(address, "xpat-eu", range(20, 30))  # matches only part of its name
    rows = _read(spark, address, subscribePattern="pat-.*").collect()
    assert {r.topic for r in rows} == {"pat-eu", "pat-us"}
    assert _ids(rows) == list(range(20))


def test_min_partitions_splits_a_queue_across_tasks(spark: Any, spark_broker: BrokerThread) -> None:
    address = spark_broker.address
    _publish(address, "split-orders", range(40), queues=1)
    df = _read(spark, address, topic="split-orders", minPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    assert _ids(df.collect()) == list(range(40))
    assert _read(spark, address, topic="split-orders").rdd.getNumPartitions() == 1


def test_max_bytes_per_trigger_caps_each_micro_batch(
    spark: Any, spark_broker: BrokerThread, tmp_path: Path
) -> None:
    address = spark_broker.address
    _publish(address, "bytes-orders", range(60), size=1024)
    seen: list[tuple[int, Any]] = []
    query = (
        _stream(
            spark,
            address,
            tmp_path / "ckpt",
            topic="bytes-orders",
            maxBytesPerTrigger=str(10 * 1024),
        )
        .foreachBatch(lambda df, b: seen.extend((b, r) for r in df.collect()))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120) and query.exception() is None
    assert _ids([r for _, r in seen]) == list(range(60))
    sizes = [p["numInputRows"] for p in _batches(query)]
    assert len(sizes) >= 6 and max(sizes) <= 10, sizes


def test_min_offsets_per_trigger_waits_up_to_max_trigger_delay(
    spark: Any, spark_broker: BrokerThread, tmp_path: Path
) -> None:
    address = spark_broker.address
    _publish(address, "min-orders", range(5))
    query = (
        _stream(
            spark,
            address,
            tmp_path / "ckpt",
            topic="min-orders",
            minOffsetsPerTrigger="50",
            maxTriggerDelay="3s",
        )
        .format("memory")
        .queryName("min_offsets")
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        # The first batch of a run is not held back.
        _wait(lambda: len(_batches(query)) >= 1, 60, "the first batch")
        _publish(address, "min-orders", range(5, 10))
        _wait(lambda: len(_batches(query)) >= 2, 60, "the delayed batch")
        # Sixty in two requests (a batch a queue): a trigger between them finds 30 (< 50), held
        # back; one after them finds all 60.
        with Producer("source-options-test", broker=address) as producer:
            for q in (0, 1):
                batch = [Message("min-orders", f"m-{i}|".encode()) for i in range(10 + q, 70, 2)]
                producer.send_batch(batch, queue_id=q)
        _wait(lambda: len(_batches(query)) >= 3, 60, "the batch over minOffsetsPerTrigger")
        b0, b1, b2 = _batches(query)[:3]
        assert [b["numInputRows"] for b in (b0, b1, b2)] == [5, 5, 60]
        gap = _time(b1["timestamp"]) - _time(b0["timestamp"])
        assert gap >= 2.5, f"5 new messages (< 50) were read after {gap:.2f}s, not ~3s"
        assert _ids(spark.sql("select body from min_offsets").collect()) == list(range(70))
    finally:
        query.stop()


def _time(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_query_progress_shows_offsets_behind_latest(
    spark: Any, spark_broker: BrokerThread, tmp_path: Path
) -> None:
    address = spark_broker.address
    _publish(address, "lag-orders", range(40))
    query = (
        _stream(spark, address, tmp_path / "ckpt", topic="lag-orders", maxMessagesPerTrigger="10")
        .format("memory")
        .queryName("lag_orders")
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120) and query.exception() is None
    progress = _batches(query)
    assert [p["numInputRows"] for p in progress] == [10, 10, 10, 10]
    behind = [offsets_behind(p["sources"][0])["totalOffsetsBehindLatest"] for p in progress]
    assert behind == [30, 20, 10, 0]
    assert json.loads(progress[0]["sources"][0]["latestOffset"]) == {
        "lag-orders": {"0": 20, "1": 20, "2": 0, "3": 0}
    }


def test_unknown_options_are_refused_by_name(spark: Any, spark_broker: BrokerThread) -> None:
    with pytest.raises(
        Exception, match=r"(?i)unknown option for the txmq source: 'startingOffset'"
    ):
        _read(spark, spark_broker.address, topic="lag-orders", startingOffset="earliest").collect()
