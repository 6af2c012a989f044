"""Exactly-once writes for Spark 3.5 (no Python data sources): a ``foreachBatch`` function.

Usage::

    from txmq.spark_connector import txmq_foreach_batch

    (df.writeStream
       .foreachBatch(txmq_foreach_batch(broker="127.0.0.1:10911", topic="orders"))
       .option("checkpointLocation", "/path/ckpt")
       .start())

Per micro-batch, on the driver: if the broker says the batch is decided already (a replay after
the sink committed), nothing is written.  Otherwise every partition is written as the halves of
one transaction per task attempt (``df.rdd.mapPartitionsWithIndex``), the transaction ids of the
successful attempts are collected, and one TXMQ_DECIDE_BATCH commits them and rolls back every
other half of the batch (failed or speculative attempts).  The guarantee is the data source
sink's; only the plumbing differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from txmq.client.logs import get_logger

from .options import SinkOptions, parse_sink_options, stream_producer_group
from .session import BrokerSession, run, ssl_context
from .sink import (
    PartitionResult,
    decide_batch,
    input_columns,
    new_transaction_id,
    stream_batch_key,
    write_partition,
)

log = get_logger(__name__)

QUERY_ID_PROPERTY = "sql.streaming.queryId"


def txmq_foreach_batch(
    *,
    broker: str,
    topic: str | None = None,
    producer_group: str | None = None,
    queue_column: str | None = None,
    **options: Any,
) -> Callable[[Any, int], None]:
    """A function for ``writeStream.foreachBatch`` that writes each micro-batch to txmq exactly
    once.

    Args:
        broker: ``host:port``.
        topic: default topic (rows may name theirs in a ``topic`` column).
        producer_group: the sink's producer group; default ``txmq-spark-<queryId>``.
        queue_column: column whose value picks the queue.
        **options: further sink options by their Spark names (``batchSize``,
            ``maxRequestBytes``, ``maxInFlight``, ``requestTimeout``, ``accessKey`` /
            ``secretKey``, ``tls``, ``tlsCaPath``, ``tlsCertPath`` / ``tlsKeyPath``).

    Raises:
        TxmqOptionError: an invalid option (raised here, before the query starts).
    """
    raw: dict[str, Any] = {
        "broker": broker,
        "topic": topic,
        "producerGroup": producer_group,
        "queueColumn": queue_column,
        **options,
    }
    sink = parse_sink_options(raw)
    ssl_context(sink.tls)  # a TLS file that cannot be loaded fails here, not in every batch
    columns = input_columns(sink)

    def write_batch(df: Any, batch_id: int) -> None:
        group, batch_key = _batch_names(df, sink, batch_id)
        if _already_decided(sink, group, batch_key):
            log.info("sink_batch_already_decided", group=group, batch_key=batch_key)
            return

        present = [c for c in columns if c in df.columns]

        def write_part(index: int, rows: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            attempt = ctx.attemptNumber() if ctx is not None else 0
            r = write_partition(
                rows,
                sink,
                group=group,
                batch_key=batch_key,
                transaction_id=new_transaction_id(batch_key, index, attempt),
                partition_id=index,
                attempt=attempt,
                skip_if_decided=True,
            )
            yield (r.transaction_id, r.rows, r.already_decided, index, attempt)

        collected = df.select(*present).rdd.mapPartitionsWithIndex(write_part).collect()
        results = [
            PartitionResult(group, batch_key, txid, rows, decided, index, attempt)
            for txid, rows, decided, index, attempt in collected
        ]
        decide_batch(
            sink.broker,
            group,
            batch_key,
            results,
            sink.request_timeout,
            sink.credentials,
            sink.tls,
        )

    return write_batch


def _batch_names(df: Any, sink: SinkOptions, batch_id: int) -> tuple[str, str]:
    """The producer group and batch key of micro-batch ``batch_id`` of ``df``'s query."""
    spark = df.sparkSession
    query_id = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    if query_id is None:
        if sink.producer_group is None:
            raise RuntimeError(
                "txmq_foreach_batch: no streaming query id is visible; pass producer_group="
            )
        query_id = sink.producer_group
    group = sink.producer_group or stream_producer_group(query_id)
    return group, stream_batch_key(query_id, batch_id)


def _already_decided(sink: SinkOptions, group: str, batch_key: str) -> bool:
    """Whether the broker has decided the batch already (a replay after the sink committed)."""

    async def ask() -> dict[str, Any]:
        async with BrokerSession(
            sink.broker, sink.request_timeout, sink.credentials, sink.tls
        ) as s:
            return await s.decide_batch(group, batch_key, query_only=True)

    return bool(run(ask).get("decided"))
