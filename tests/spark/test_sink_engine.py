"""The sink's engine against a real broker, without Spark: what a task attempt writes stays
invisible until the batch decision, the decision commits exactly the listed attempts and rolls
back the rest, and a decided batch refuses late writers."""

from __future__ import annotations

import zlib
from typing import Any

import pyarrow as pa
import pytest

from tests.spark.helpers import bodies, by_state, pull_all, transactions
from txmq.protocol.errors import IllegalOperationError
from txmq.spark_connector.options import SinkOptions
from txmq.spark_connector.sink import decide_batch, write_partition


def _batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "topic": pa.array([r.get("topic") for r in rows], pa.string()),
            "body": pa.array([r["body"] for r in rows], pa.binary()),
            "tags": pa.array([r.get("tags") for r in rows], pa.string()),
            "keys": pa.array([r.get("keys") for r in rows], pa.string()),
            "properties": pa.array(
                [list(r.get("properties", {}).items()) for r in rows],
                pa.map_(pa.string(), pa.string()),
            ),
            "customer": pa.array([r.get("customer") for r in rows], pa.string()),
        }
    )


def test_halves_stay_invisible_until_the_batch_is_decided(broker_thread: Any) -> None:
    address = broker_thread.address
    rows = [
        {
            "topic": "eng-a" if i % 3 else "eng-b",
            "body": f"row-{i}".encode(),
            "tags": "t1" if i % 2 else None,
            "keys": f"k{i}",
            "properties": {"n": str(i)},
            "customer": f"c{i % 5}",
        }
        for i in range(200)
    ]
    opts = SinkOptions(
        broker=address, topic="eng-a", queue_column="customer", batch_size=16, max_in_flight=2
    )
    # Two record batches, as Spark's Arrow writer hands them over.
    result = write_partition(
        [_batch(rows[:120]), _batch(rows[120:])],
        opts,
        group="g-eng",
        batch_key="q-0",
        transaction_id="q-0-0-0-aa",
    )
    assert (result.rows, result.transaction_id) == (200, "q-0-0-0-aa")
    assert pull_all(address, "eng-a") == [] and pull_all(address, "eng-b") == []

    answer = decide_batch(address, "g-eng", "q-0", [result])
    assert answer["first"] and answer["committed"] == ["q-0-0-0-aa"]

    got = pull_all(address, "eng-a") + pull_all(address, "eng-b")
    assert bodies(got) == sorted(f"row-{i}" for i in range(200))
    for m in got:
        i = int(m.body.decode().split("-")[1])
        assert m.topic == ("eng-a" if i % 3 else "eng-b")
        assert m.tags == ("t1" if i % 2 else None)
        assert m.keys == f"k{i}"
        assert m.user_properties == {"n": str(i)}
        # The queue column picks the queue as the SDK's sharding key does.
        assert m.queue_id == zlib.crc32(f"c{i % 5}".encode()) % 4
    # Ordering by key: the rows of one customer are in input order in their queue.
    for c in range(5):
        for topic in ("eng-a", "eng-b"):
            seq = [
                int(m.body.decode().split("-")[1])
                for m in sorted(
                    (
                        m
                        for m in got
                        if m.topic == topic and m.queue_id == zlib.crc32(f"c{c}".encode()) % 4
                    ),
                    key=lambda m: m.queue_offset,
                )
                if int(m.body.decode().split("-")[1]) % 5 == c
            ]
            assert seq == sorted(seq)


def test_decision_rolls_back_other_attempts_and_refuses_late_writers(broker_thread: Any) -> None:
    address = broker_thread.address
    opts = SinkOptions(broker=address, topic="eng-z", batch_size=50)
    rows = [pa.record_batch({"body": pa.array([f"r{i}".encode() for i in range(300)])})]
    orphan = write_partition(
        rows, opts, group="g-z", batch_key="q-7", transaction_id="q-7-0-0-orphan"
    )
    retry = write_partition(
        rows, opts, group="g-z", batch_key="q-7", transaction_id="q-7-0-1-retry"
    )
    assert orphan.rows == retry.rows == 300

    decide_batch(address, "g-z", "q-7", [retry, None])
    assert bodies(pull_all(address, "eng-z")) == sorted(f"r{i}" for i in range(300))
    states = by_state(transactions(address, "g-z"))
    assert [r["transactionId"] for r in states["COMMITTED"]] == ["q-7-0-1-retry"]
    assert [r["transactionId"] for r in states["ROLLED_BACK"]] == ["q-7-0-0-orphan"]
    assert len(states["ROLLED_BACK"][0]["halves"]) == 300
    assert "PENDING" not in states

    # A replayed task asks first and writes nothing ...
    replay = write_partition(
        rows, opts, group="g-z", batch_key="q-7", transaction_id="q-7-0-0-replay"
    )
    assert replay.already_decided and replay.rows == 0 and replay.transaction_id is None
    # ... and a zombie that does not ask is refused by the broker.
    with pytest.raises(IllegalOperationError):
        write_partition(
            rows,
            opts,
            group="g-z",
            batch_key="q-7",
            transaction_id="q-7-0-2-zombie",
            skip_if_decided=False,
        )
    # Deciding again returns the first decision and delivers nothing more.
    again = decide_batch(address, "g-z", "q-7", [replay])
    assert not again["first"] and again["committed"] == ["q-7-0-1-retry"]
    assert len(pull_all(address, "eng-z")) == 300


def test_rows_that_cannot_be_sent_fail_the_task(broker_thread: Any) -> None:
    opts = SinkOptions(broker=broker_thread.address, topic="eng-bad")
    null_body = pa.record_batch({"body": pa.array([b"x", None], pa.binary())})
    with pytest.raises(ValueError, match="null 'body'"):
        write_partition([null_body], opts, group="g", batch_key="b1", transaction_id="t1")
    reserved = pa.record_batch(
        {
            "body": pa.array([b"x"]),
            "properties": pa.array([[("TRAN_MSG", "false")]], pa.map_(pa.string(), pa.string())),
        }
    )
    with pytest.raises(ValueError, match="reserved"):
        write_partition([reserved], opts, group="g", batch_key="b2", transaction_id="t2")
