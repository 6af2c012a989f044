"""Rows of nothing but a body are encoded column-wise from Arrow (``PlainRows``): what the broker
stores is what the row-by-row encoding stores -- the same bodies in the same queues at the same
offsets, with the same properties bar the message id -- and every message id is new."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import Row

from tests.spark.helpers import pull_all
from txmq.protocol.message import MessageConst
from txmq.spark_connector.options import SinkOptions
from txmq.spark_connector.sink import PlainRows, chunks, decide_batch, write_partition

ROWS = 1500


def _body(i: int) -> bytes:
    # Lengths 0..300 bytes, so requests fill up by count and by bytes at varying rows.
    return (b"%d:" % i + b"x" * (i * 37 % 300))[: i * 37 % 300]


def _arrow_batches() -> list[pa.RecordBatch]:
    rows = [_body(i) for i in range(ROWS)]
    out = []
    for lo, hi in ((0, 700), (700, 701), (701, ROWS)):  # buffers carry over between batches
        out.append(
            pa.record_batch(
                {
                    "body": pa.array(rows[lo:hi], pa.binary()),
                    "tags": pa.array([None] * (hi - lo), pa.string()),  # all null: still plain
                }
            )
        )
    return out


def _write(address: str, topic: str, batches: list[Any], key: str) -> None:
    # Keys of one length: the properties of both writes take as many bytes.
    # One request in flight: each queue stores its requests in the order they were made.
    opts = SinkOptions(
        broker=address, topic=topic, batch_size=64, max_request_bytes=9000, max_in_flight=1
    )
    result = write_partition(
        batches, opts, group="g-plain", batch_key=key, transaction_id=f"{key}-1-0-x", partition_id=1
    )
    assert result.rows == ROWS
    assert decide_batch(address, "g-plain", key, [result])["committed"] == [f"{key}-1-0-x"]


def _stored(address: str, topic: str) -> list[tuple[int, int, bytes, int, dict[str, str]]]:
    out = []
    for m in pull_all(address, topic):
        props = {
            k: v
            for k, v in m.properties.items()
            if k not in (MessageConst.UNIQ_KEY, MessageConst.TRANSACTION_ID)
            and not k.startswith("__")
        }
        out.append((m.queue_id, m.queue_offset, m.body, m.flag, props))
    return sorted(out)


def test_plain_rows_are_stored_as_the_row_path_stores_them(broker_thread: Any) -> None:
    address = broker_thread.address
    batches = _arrow_batches()
    assert all(isinstance(c, PlainRows) for c in chunks(batches, ("body", "tags")))
    _write(address, "plain-arrow", batches, "arrow-0")
    rows = [Row(body=_body(i)) for i in range(ROWS)]
    assert not any(isinstance(c, PlainRows) for c in chunks(rows, ("body",)))
    _write(address, "plain-rows", rows, "rowss-0")

    arrow, by_row = _stored(address, "plain-arrow"), _stored(address, "plain-rows")
    assert len(arrow) == ROWS
    assert arrow == by_row
    assert sorted(m[2] for m in arrow) == sorted(_body(i) for i in range(ROWS))
    ids = [m.msg_id for m in pull_all(address, "plain-arrow")]
    assert len(set(ids)) == ROWS and all(len(i) == 32 for i in ids)


def test_rows_with_more_than_a_body_keep_the_row_path() -> None:
    extra = pa.record_batch(
        {"body": pa.array([b"a", b"b"]), "tags": pa.array([None, "t"], pa.string())}
    )
    keyed = pa.record_batch({"body": pa.array([b"a"]), "customer": pa.array(["c1"])})
    null_body = pa.record_batch({"body": pa.array([b"a", None], pa.binary())})
    text = pa.record_batch({"body": pa.array(["héllo"], pa.string())})
    assert not isinstance(next(chunks([extra], ("body", "tags"))), PlainRows)
    assert not isinstance(next(chunks([keyed], ("body", "customer"))), PlainRows)
    assert not isinstance(next(chunks([null_body], ("body",))), PlainRows)
    plain = next(chunks([text], ("body",)))
    assert isinstance(plain, PlainRows) and plain.body.to_pylist() == ["héllo".encode()]
