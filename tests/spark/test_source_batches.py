"""The source's read path without Spark: one queue's range comes back as Arrow record batches of
Spark's schema, several pulls gathered per batch up to its row limit, every message once and
in queue order with its columns as stored."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from tests.spark.helpers import pull_all
from txmq.spark_connector import reader
from txmq.spark_connector.options import SinkOptions, parse_source_options
from txmq.spark_connector.sink import decide_batch, write_partition

ROWS = 1000


def test_a_range_reads_back_as_record_batches_of_several_pulls(
    broker_thread: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = broker_thread.address
    rows = pa.record_batch(
        {
            "body": pa.array([f"m-{i}".encode() for i in range(ROWS)], pa.binary()),
            "tags": pa.array(["t" if i % 2 else None for i in range(ROWS)], pa.string()),
            "keys": pa.array([f"k{i}" for i in range(ROWS)], pa.string()),
            "properties": pa.array(
                [[("n", str(i))] for i in range(ROWS)], pa.map_(pa.string(), pa.string())
            ),
            "customer": pa.array(["one"] * ROWS, pa.string()),  # one queue
        }
    )
    opts = SinkOptions(broker=address, topic="src-batches", queue_column="customer")
    result = write_partition([rows], opts, group="g-src", batch_key="b-0", transaction_id="b-0-x")
    decide_batch(address, "g-src", "b-0", [result])
    stored = {(m.queue_id, m.queue_offset): m for m in pull_all(address, "src-batches")}
    (queue,) = {q for q, _ in stored}

    monkeypatch.setattr(reader, "BATCH_ROWS", 350)
    source = parse_source_options(
        {"broker": address, "topic": "src-batches", "pullBatchSize": "100"}
    )
    part = reader.TxmqInputPartition("src-batches", queue, 50, 950)
    batches = list(reader.read_range(source, part))

    # Pulls of 100 gathered until 350 rows: 400, 400, then the rest.
    assert [b.num_rows for b in batches] == [400, 400, 100]
    assert all(b.schema.equals(reader.arrow_schema()) for b in batches)
    got = pa.Table.from_batches(batches).to_pylist()
    assert [r["queue_offset"] for r in got] == list(range(50, 950))
    for r in got:
        m = stored[(queue, r["queue_offset"])]
        assert (r["topic"], r["queue_id"], r["msg_id"], r["body"]) == (
            "src-batches",
            queue,
            m.msg_id,
            m.body,
        )
        assert (r["tags"], r["keys"], dict(r["properties"])) == (
            m.tags,
            m.keys,
            {"n": m.body[2:].decode()},
        )
        assert int(r["born_timestamp"].timestamp() * 1000) == m.born_timestamp
        assert int(r["store_timestamp"].timestamp() * 1000) == m.store_timestamp
        assert r["broker"]
