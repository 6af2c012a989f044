"""The broker process SIGKILLed while a streaming query writes into it (``local[2]``): the
query fails; the broker restarts on the same store and port, the query restarts from the same
checkpoint, and in the end the topic holds every source row exactly once, with no transaction
left pending.

The broker is a real child process (``txmq broker``, as in tests/integration/test_crash.py);
Spark runs in the test process.  A slow UDF keeps each micro-batch's tasks writing halves for
about a second, and the kills are aimed at that window: once when the broker holds halves of a
batch (the batch undecided), once at a random moment after that (writing halves, the batch
decision, or Spark's commit).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.spark.helpers import (
    by_state,
    order_ids,
    pull_all,
    slow_body_udf,
    spark_fixture,
    transactions,
)
from tests.support.process import BrokerProcess, running
from tests.support.waiting import wait_until_sync

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'txmq[spark]')")

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FILES, ROWS = 5, 400
#: Seconds of UDF work per row: two tasks of 200 rows take about a second per micro-batch.
SECONDS_PER_ROW = 0.005
#: Bound of one query run.
RUN_TIMEOUT = 150.0


spark = spark_fixture("local[2]", "txmq-broker-crash-tests", batch_rows=50)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with running(str(tmp_path / "store"), flush="ASYNC_FLUSH") as bp:
        yield bp


def _inputs(folder: Path) -> str:
    folder.mkdir()
    for f in range(FILES):
        rows = range(f * ROWS, (f + 1) * ROWS)
        lines = [json.dumps({"id": i, "customer": f"c{i % 7}"}) for i in rows]
        (folder / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")
    return str(folder)


def _batch_of(transaction_id: str) -> int:
    """The micro-batch of a sink transaction id ``<queryId>-<batchId>-<p>-<a>-<nonce>``."""
    return int(transaction_id.rsplit("-", 4)[1])


class Run:
    """The module's query: started, killed with the broker, restarted on one checkpoint."""

    def __init__(self, spark: Any, broker: BrokerProcess, tmp: Path) -> None:
        self.spark, self.broker = spark, broker
        self.folder, self.checkpoint = _inputs(tmp / "input"), str(tmp / "ckpt")
        self.topic = "broker-crash-orders"
        self.history: list[str] = []

    def start(self) -> Any:
        from pyspark.sql import functions as F

        return (
            self.spark.readStream.schema("id INT, customer STRING")
            .option("maxFilesPerTrigger", 1)
            .json(self.folder)
            .repartition(2)
            .select(slow_body_udf(SECONDS_PER_ROW)(F.col("id")).alias("body"), "customer")
            .writeStream.format("txmq")
            .option("broker", self.broker.address)
            .option("topic", self.topic)
            .option("queueColumn", "customer")
            .option("batchSize", "20")
            .option("requestTimeout", "10")
            .option("checkpointLocation", self.checkpoint)
            .trigger(availableNow=True)
            .start()
        )

    def pending_batches(self, group: str) -> set[int]:
        """The micro-batches of which the broker holds pending halves."""
        return {
            _batch_of(r["transactionId"])
            for r in transactions(self.broker.address, group, "PENDING")
            if r["halves"]
        }

    def delivered(self) -> list[int]:
        """The ids the topic holds, checked: no id twice, only whole micro-batches."""
        ids = order_ids(pull_all(self.broker.address, self.topic))
        assert len(ids) == len(set(ids)), f"a row was delivered twice\n{self.context()}"
        assert len(ids) % ROWS == 0, f"a batch is partly visible: {len(ids)}\n{self.context()}"
        return ids

    def kill_broker_while_writing(self, min_batch: int, delay: float) -> None:
        """Start the query, SIGKILL the broker ``delay`` s after it holds halves of a batch
        ``>= min_batch``, check that the query fails, and restart the broker."""
        query = self.start()
        group = f"txmq-spark-{query.id}"
        try:
            wait_until_sync(
                lambda: any(b >= min_batch for b in self.pending_batches(group)),
                timeout=RUN_TIMEOUT,
                what=f"halves of batch >= {min_batch} on the broker\n{self.context()}",
            )
            if delay:
                query.awaitTermination(delay)
            self.broker.kill()
            failure = _failure(query)
        finally:
            query.stop()
        self.broker.start()
        self.history.append(
            f"broker killed {delay:.2f}s after halves of batch >= {min_batch}: "
            f"query failed with {failure[:300]!r}; {len(self.delivered())} rows visible"
        )

    def context(self) -> str:
        return "\n".join(self.history)


def _failure(query: Any) -> str:
    """The error that ended ``query``, which must end within the bound."""
    from pyspark.errors import StreamingQueryException

    try:
        finished = query.awaitTermination(RUN_TIMEOUT)
    except StreamingQueryException as exc:
        return str(exc)
    raise AssertionError(
        f"the query did not fail after the broker was killed (finished: {finished})"
    )


def test_broker_killed_mid_query_and_restarted_delivers_every_row_exactly_once(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    seed = int(os.environ.get("TXMQ_CRASH_SEED", random.randrange(1 << 30)))
    run = Run(spark, broker, tmp_path)
    run.history.append(f"seed {seed}")
    # Batch 0 committed, the broker killed while batch 1's tasks store halves ...
    run.kill_broker_while_writing(min_batch=1, delay=0.0)
    # ... then at a random moment of a later batch (halves, decision or Spark's commit).
    run.kill_broker_while_writing(min_batch=2, delay=random.Random(seed).uniform(0.0, 1.5))

    query = run.start()
    try:
        assert query.awaitTermination(RUN_TIMEOUT), f"the last run did not finish\n{run.context()}"
        assert query.exception() is None, run.context()
        group = f"txmq-spark-{query.id}"
    finally:
        query.stop()
    print(run.context())  # shown with -s or on failure
    assert run.delivered() == list(range(FILES * ROWS)), run.context()
    # The killed attempts' halves were rolled back by their batches' decisions.
    assert "PENDING" not in by_state(transactions(broker.address, group)), run.context()
