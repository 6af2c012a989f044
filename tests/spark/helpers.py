"""Helpers of the Spark connector tests: a module-scoped broker, a quiet local Spark session,
and reading back what reached the broker through the SDK."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FAST, BrokerThread
from txmq.broker.config import BrokerConfig
from txmq.client import ClientConfig, PullConsumer, PullStatus
from txmq.client.admin import AsyncAdminClient
from txmq.protocol.message import MessageExt

#: The broker of the Spark tests.  The transaction check-back stays slow: the sink's groups are
#: never registered, so no check is ever sent for their halves anyway.
BROKER_SETTINGS: dict[str, Any] = dict(
    FAST, transaction_check_interval=1000, transaction_time_out=1000
)


def start_broker(store: Path) -> BrokerThread:
    """A broker on a free port, storing under ``store``."""
    bt = BrokerThread(BrokerConfig(**{**BROKER_SETTINGS, "store_path_root_dir": str(store)}))
    bt.start()
    return bt


def spark_session(master: str, app: str, **conf: str) -> Any:
    """A local Spark session whose Python workers run this interpreter, with quiet logs and
    few shuffle partitions."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .config("spark.driver.extraJavaOptions", "-Dlog4j.rootLogger=ERROR,console")
    )
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from txmq.spark_connector import register

    register(spark)
    _ship_by_value()
    return spark


@contextlib.contextmanager
def running_spark(master: str, app: str, **conf: str) -> Iterator[Any]:
    """:func:`spark_session` for a module's tests: stops its streaming queries and the session
    at the end."""
    session = spark_session(master, app, **conf)
    try:
        yield session
    finally:
        for q in session.streams.active:
            q.stop()
        session.stop()


def spark_fixture(master: str, app: str, *, batch_rows: int | None = None) -> Any:
    """A module's ``spark`` fixture (``spark = spark_fixture(...)``): :func:`running_spark`
    once for the module; ``batch_rows``: ``spark.sql.execution.arrow.maxRecordsPerBatch``."""
    conf = (
        {}
        if batch_rows is None
        else {"spark.sql.execution.arrow.maxRecordsPerBatch": str(batch_rows)}
    )

    @pytest.fixture(scope="module")
    def spark() -> Iterator[Any]:
        with running_spark(master, app, **conf) as session:
            yield session

    return spark


def order_rows(spark: Any, folder: str) -> Any:
    """The rows ``{"id", "customer", "amount"}`` of the JSON files in ``folder`` (what the
    ``json_input`` fixture writes) as a stream, one file per micro-batch, in two partitions."""
    return (
        spark.readStream.schema("id INT, customer STRING, amount DOUBLE")
        .option("maxFilesPerTrigger", 1)
        .json(folder)
        .repartition(2)
    )


def pull_all(address: str, topic: str, config: ClientConfig | None = None) -> list[MessageExt]:
    """Every message of every queue of ``topic`` (in every broker group of a cluster), pulled
    with the SDK's pull consumer (with ``config``: e.g. TLS)."""
    out: list[MessageExt] = []
    with PullConsumer("spark-test-check", broker=address, config=config) as consumer:
        try:
            queues = consumer.fetch_message_queues(topic)
        except Exception:  # the topic was never created: nothing was delivered
            return []
        for q in queues:
            offset = 0
            while True:
                r = consumer.pull(topic, q.queue_id, offset, max_nums=256, broker=q.broker)
                if r.status is not PullStatus.FOUND:
                    break
                out.extend(r.messages)
                offset = r.next_begin_offset
    return out


def bodies(messages: list[MessageExt]) -> list[str]:
    """The bodies as text, sorted."""
    return sorted(m.body.decode() for m in messages)


def transactions(
    address: str, group: str, states: str = "PENDING,COMMITTED,ROLLED_BACK"
) -> list[dict[str, Any]]:
    """The broker's records of ``group``'s transactions in ``states``."""

    async def go() -> list[dict[str, Any]]:
        async with AsyncAdminClient(address) as admin:
            return await admin.list_transactions(group=group, state=states, limit=100_000)

    return asyncio.run(go())


def by_state(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Transaction records grouped by state."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault(r["state"], []).append(r)
    return out


def attempt_of(transaction_id: str) -> tuple[int, int]:
    """``(partition, attempt)`` of a sink transaction id ``<batchKey>-<p>-<a>-<nonce>``."""
    _, p, a, _ = transaction_id.rsplit("-", 3)
    return int(p), int(a)


def wait_for_pending_halves(
    address: str, group: str, partition: int, attempt: int, timeout: float = 20.0
) -> bool:
    """Wait until the broker holds pending halves of ``group`` written by that task attempt."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in transactions(address, group, "PENDING"):
            if attempt_of(r["transactionId"]) == (partition, attempt) and r["halves"]:
                return True
        time.sleep(0.05)
    return False


def failing_body_udf(
    address: str,
    *,
    ids: range,
    after: int,
    partition: int = 0,
    attempts: tuple[int, ...] | None = None,
    marker: str | None = None,
    group: str | None = None,
) -> Any:
    """A Python UDF ``id -> body`` (``"order-<id>|"`` padded to 1 KiB) that fails the task of
    ``partition`` which processes the rows with ``ids`` (one micro-batch), once it has produced
    ``after`` bodies -- only on the given attempt numbers, and only while the file ``marker``
    exists, when those are given.

    Before failing it waits until the task's own writer has stored half messages, so the failed
    attempt really leaves orphans behind (the padding makes Spark stream earlier rows on to the
    writer instead of buffering them).  The group defaults to the one the sink derives from
    the streaming query id.
    """
    from pyspark.sql import functions as F

    produced = [0]  # per task: Spark deserialises the UDF for every task

    def body(i: Any) -> Any:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None, "a UDF runs inside a Spark task"
        if (
            i in ids
            and ctx.partitionId() == partition
            and (attempts is None or ctx.attemptNumber() in attempts)
            and (marker is None or os.path.exists(marker))
        ):
            if produced[0] >= after:
                g = group
                if not g:
                    query_id = ctx.getLocalProperty("sql.streaming.queryId")
                    assert query_id is not None, "the sink runs in a streaming query"
                    g = "txmq-spark-" + query_id
                wait_for_pending_halves(address, g, partition, ctx.attemptNumber())
                raise RuntimeError(f"injected failure after {after} rows")
            produced[0] += 1
        return f"order-{i}|".ljust(1024, "x")

    return F.udf(body, "string", useArrow=False)


def slow_body_udf(seconds_per_row: float) -> Any:
    """A Python UDF ``id -> "order-<id>|"`` that takes ``seconds_per_row`` per row: a
    micro-batch's writers then store halves for a while before the batch is decided, a window
    in which a test can kill the broker."""
    from pyspark.sql import functions as F

    def body(i: Any) -> Any:
        time.sleep(seconds_per_row)
        return f"order-{i}|"

    return F.udf(body, "string", useArrow=False)


def order_ids(messages: list[MessageExt]) -> list[int]:
    """The ids in ``order-<id>|...`` bodies, sorted."""
    return sorted(int(m.body.split(b"|")[0].split(b"-")[1]) for m in messages)


def _ship_by_value() -> None:
    """The UDFs above are shipped to Spark's Python workers by value, so the workers need not
    import this test module."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def forget_commit(checkpoint: Path, batch_id: int) -> None:
    """Delete Spark's commit-log entry of ``batch_id`` (and its checksum file), as if the driver
    had crashed after the sink committed the batch but before Spark recorded it: the next start
    runs the batch again with the same id."""
    (checkpoint / "commits" / str(batch_id)).unlink()
    (checkpoint / "commits" / f".{batch_id}.crc").unlink(missing_ok=True)
