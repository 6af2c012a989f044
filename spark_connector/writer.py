"""The sink as Spark sees it: a streaming writer and a batch writer for ``format("txmq")``.

Both write each task attempt's rows as the halves of one transaction (:mod:`.sink`) and decide
the whole batch on the driver with one TXMQ_DECIDE_BATCH:

* **streaming** -- batch key ``<queryId>-<batchId>``, producer group ``txmq-spark-<queryId>``
  unless ``producerGroup`` is set.  The query id lives in the checkpoint, so a batch replayed
  after a restart has the same key and finds its earlier decision.  ``commit`` decides the batch;
  ``abort`` only rolls back the transactions it knows and leaves the batch undecided, so a later
  replay of the same batch id can still commit.
* **streaming with** ``pipeline`` -- batch key ``<pipeline>-<run>-<batchId>`` (``run`` made at
  each query start), producer group ``txmq-spark-<pipeline>``; the commit also records the
  source offsets the batch consumed, or rolls the batch back when they were decided already
  (:mod:`.pipeline`).
* **batch** -- batch key ``job-<uuid>`` made once per job on the driver, producer group
  ``txmq-spark-batch`` unless ``producerGroup`` is set.  ``commit`` decides the job; ``abort``
  decides it with nothing committed, which also rolls back every failed attempt's halves.

With pyspark >= 4.1 the writers receive Arrow record batches (no per-row conversion to
``Row``); with 4.0 they receive rows.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)

from txmq.client.logs import get_logger

from .options import (
    DEFAULT_BATCH_PRODUCER_GROUP,
    SinkOptions,
    TxmqOptionError,
    pipeline_producer_group,
    stream_producer_group,
)
from .pipeline import commit_pipeline_batch, pipeline_batch_key, run_token
from .sink import (
    PartitionResult,
    decide_batch,
    new_transaction_id,
    rollback_transactions,
    stream_batch_key,
    write_partition,
)

try:  # pyspark >= 4.1: Arrow batches instead of rows
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
except ImportError:  # pragma: no cover - pyspark 4.0
    _StreamWriterBase = DataSourceStreamWriter  # type: ignore[misc,assignment]
try:
    from pyspark.sql.datasource import DataSourceArrowWriter as _BatchWriterBase
except ImportError:  # pragma: no cover - pyspark 4.0
    _BatchWriterBase = DataSourceWriter  # type: ignore[misc,assignment]

log = get_logger(__name__)

#: Test seam of the crash tests, never set in production: ``<point>:<batchId>`` makes the
#: streaming commit of that batch SIGKILL the process group of its session's leader at
#: ``<point>`` -- with ``local[...]`` and the driver program started as a session leader, the
#: driver program and its JVM, as a lost driver host would (the Python workers, in groups of
#: their own, end when the JVM is gone; the one that commits kills itself too):
#: ``before_decide`` (the tasks' halves are stored, the batch is undecided) or
#: ``after_decide`` (the broker decided the batch; Spark has not written its commit log).
CRASH_AT_ENV = "TXMQ_SPARK_CRASH_AT"


def _crash_point(point: str, batch_id: int) -> None:
    if os.environ.get(CRASH_AT_ENV) == f"{point}:{batch_id}":
        log.warning("sink_crash_point", point=point, batch_id=batch_id)
        os.killpg(os.getsid(0), signal.SIGKILL)
        # The commit runs in a Python worker of a process group of its own: without this it
        # would go on (and decide the batch) until it noticed the JVM was gone.
        os.kill(os.getpid(), signal.SIGKILL)


#: TaskContext local properties Spark sets for streaming micro-batches.
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"


@dataclass
class TxmqCommitMessage(PartitionResult, WriterCommitMessage):
    """What a task attempt hands to ``commit``: its transaction id and row count (see
    :class:`~txmq.spark_connector.sink.PartitionResult`)."""


def _task_context() -> TaskContext:
    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("the txmq writer must run inside a Spark task")
    return ctx


def _results(messages: list[WriterCommitMessage | None]) -> list[PartitionResult]:
    out: list[PartitionResult] = []
    for m in messages:
        if isinstance(m, PartitionResult):
            out.append(m)
    return out


class TxmqStreamWriter(_StreamWriterBase):
    """Exactly-once streaming sink (see the module docstring)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        #: A pipeline's batch keys carry a token made at each query start (on the driver;
        #: Spark ships this writer to every task; the commit runs in a writer of its own, so
        #: it takes the key from the tasks' results).
        self.run_id = run_token()
        if options.pipeline is not None and options.checkpoint_location is None:
            raise TxmqOptionError(
                "option 'pipeline' needs the query's option 'checkpointLocation': each batch "
                "decision records the source offsets of the checkpoint's offset log"
            )

    def _key(self, query_id: str, batch_id: int | str) -> tuple[str, str]:
        """The producer group and batch key of a micro-batch."""
        pipeline = self.options.pipeline
        if pipeline is not None:
            group = self.options.producer_group or pipeline_producer_group(pipeline)
            return group, pipeline_batch_key(pipeline, self.run_id, batch_id)
        group = self.options.producer_group or stream_producer_group(query_id)
        return group, stream_batch_key(query_id, batch_id)

    def write(self, iterator: Iterator[Any]) -> TxmqCommitMessage:
        """Write this task attempt's rows as the halves of a new transaction."""
        ctx = _task_context()
        batch_id = ctx.getLocalProperty(BATCH_ID_PROPERTY)
        query_id = ctx.getLocalProperty(QUERY_ID_PROPERTY)
        if batch_id is None or query_id is None:
            raise RuntimeError(
                "the txmq streaming writer found no streaming batch id in the task context"
            )
        group, batch_key = self._key(query_id, batch_id)
        partition, attempt = ctx.partitionId(), ctx.attemptNumber()
        result = write_partition(
            iterator,
            self.options,
            group=group,
            batch_key=batch_key,
            transaction_id=new_transaction_id(batch_key, partition, attempt),
            partition_id=partition,
            attempt=attempt,
            run_id=None if self.options.pipeline is None else self.run_id,
        )
        return TxmqCommitMessage(**asdict(result))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Commit the successful attempts' transactions and roll back every other one of the
        batch, in one broker request (a replayed, already decided batch is accepted)."""
        results = _results(messages)
        if not results and self.options.pipeline is None:
            log.info("sink_batch_empty", batch_id=batchId)
            return
        if results:
            group, key = results[0].producer_group, results[0].batch_key
        else:  # a pipeline records the input range of a batch without output too
            group, key = self._key("", batchId)
        if not key.endswith(f"-{batchId}") or any(
            (r.producer_group, r.batch_key) != (group, key) for r in results
        ):
            raise RuntimeError(
                f"commit messages of batch {batchId} disagree on the producer group or batch key: "
                f"{sorted({(r.producer_group, r.batch_key) for r in results})}"
            )
        _crash_point("before_decide", batchId)
        if self.options.pipeline is not None:
            commit_pipeline_batch(self.options, key, batchId, results)
        else:
            decide_batch(
                self.options.broker,
                group,
                key,
                results,
                self.options.request_timeout,
                self.options.credentials,
                self.options.tls,
            )
        _crash_point("after_decide", batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Roll back the transactions of the attempts that reported one.  The batch stays
        undecided: a later run of the same batch id must still be able to commit; orphans of
        failed attempts stay invisible until then."""
        ids = [r.transaction_id for r in _results(messages) if r.transaction_id]
        log.warning("sink_batch_aborted", batch_id=batchId, transactions=len(ids))
        rollback_transactions(
            self.options.broker,
            ids,
            self.options.request_timeout,
            self.options.credentials,
            self.options.tls,
        )


class TxmqBatchWriter(_BatchWriterBase):
    """All-or-nothing batch writer: one batch key per job."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.producer_group = options.producer_group or DEFAULT_BATCH_PRODUCER_GROUP
        #: Made on the driver; Spark ships this writer (and so the key) to every task and to
        #: the commit.
        self.batch_key = f"job-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[Any]) -> TxmqCommitMessage:
        """Write this task attempt's rows as the halves of a new transaction."""
        ctx = _task_context()
        partition, attempt = ctx.partitionId(), ctx.attemptNumber()
        result = write_partition(
            iterator,
            self.options,
            group=self.producer_group,
            batch_key=self.batch_key,
            transaction_id=new_transaction_id(self.batch_key, partition, attempt),
            partition_id=partition,
            attempt=attempt,
        )
        return TxmqCommitMessage(**asdict(result))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Commit the job: every successful attempt's rows become visible at once."""
        decide_batch(
            self.options.broker,
            self.producer_group,
            self.batch_key,
            _results(messages),
            self.options.request_timeout,
            self.options.credentials,
            self.options.tls,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Decide the job with nothing committed: every half of it is rolled back, and the
        broker refuses any half a straggling attempt still sends."""
        log.warning("sink_job_aborted", batch_key=self.batch_key)
        decide_batch(
            self.options.broker,
            self.producer_group,
            self.batch_key,
            [],
            self.options.request_timeout,
            self.options.credentials,
            self.options.tls,
        )
