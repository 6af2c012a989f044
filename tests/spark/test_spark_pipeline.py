"""txmq -> Spark -> txmq with the option ``pipeline``: exactly once without trusting the
checkpoint.  A real Spark session reads a topic of uniquely numbered messages and writes them
to another topic in micro-batches of 100; then the checkpoint loses the offsets and commits of
its last batches (or the whole checkpoint is deleted), more input arrives, the query restarts
with larger micro-batches (so a batch planned again would end elsewhere), and every input id
must be in the output exactly once."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BrokerThread
from tests.spark.helpers import by_state, pull_all, spark_fixture, transactions
from txmq.client import Message, Producer
from txmq.protocol.message import MessageExt

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'txmq[spark]')")

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: Bound of one query run.
RUN_TIMEOUT = 180.0


spark = spark_fixture("local[2]", "txmq-pipeline-tests")


def _publish(address: str, topic: str, ids: range) -> None:
    with Producer("pipeline-test-seed", broker=address) as producer:
        for i in ids:
            producer.send(Message(topic, f"id-{i}".encode()), queue_id=i % 2)


def _ids(messages: list[MessageExt]) -> list[int]:
    return sorted(int(m.body.decode().split("-")[1]) for m in messages)


def _run(
    spark: Any,
    address: str,
    source: str,
    out: str,
    ckpt: Path,
    pipeline: str,
    per_batch: int,
    timeout: float = RUN_TIMEOUT,
) -> Any:
    """Copy ``source`` to ``out`` in micro-batches of ``per_batch`` messages until the source's
    end (``Trigger.AvailableNow``); returns the ended query.  Called on the test's own thread:
    Spark finds the session's Python data sources from the thread that registered them."""
    df = (
        spark.readStream.format("txmq")
        .option("broker", address)
        .option("topic", source)
        .option("pipeline", pipeline)
        .option("maxMessagesPerTrigger", str(per_batch))
        .load()
    )
    query = (
        df.select("body")
        .writeStream.format("txmq")
        .option("broker", address)
        .option("topic", out)
        .option("pipeline", pipeline)
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(timeout), f"the query did not end in {timeout}s"
    assert query.exception() is None, query.exception()
    return query


def _forget_batches(ckpt: Path, offsets: list[int], commits: list[int]) -> None:
    """Delete offset-log and commit-log entries (and their checksum files) of ``ckpt``."""
    for folder, ids in (("offsets", offsets), ("commits", commits)):
        for n in ids:
            (ckpt / folder / str(n)).unlink()
            (ckpt / folder / f".{n}.crc").unlink(missing_ok=True)


def _batches(query: Any) -> list[tuple[int, int]]:
    return [(p["batchId"], p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]]


@pytest.mark.parametrize("lost", ["last_batches", "whole_checkpoint"])
def test_lost_checkpoint_neither_repeats_nor_skips(
    spark: Any, spark_broker: BrokerThread, tmp_path: Path, lost: str
) -> None:
    address = spark_broker.address
    source, out, pipeline = f"pipe-in-{lost}", f"pipe-out-{lost}", f"copy-{lost}"
    ckpt = tmp_path / "ckpt"
    _publish(address, source, range(0, 500))
    first = _run(spark, address, source, out, ckpt, pipeline, per_batch=100)
    assert _batches(first) == [(n, 100) for n in range(5)]
    assert _ids(pull_all(address, out)) == list(range(500))

    if lost == "last_batches":
        # Spark runs batch 3 again from its logged offsets and plans batch 4 anew.
        _forget_batches(ckpt, offsets=[4], commits=[3, 4])
    else:
        shutil.rmtree(ckpt)
    _publish(address, source, range(500, 800))
    # Batches of 250 now: batch 4 planned anew would end 150 messages later than it did.
    again = _run(spark, address, source, out, ckpt, pipeline, per_batch=250)
    ran = _batches(again)
    if lost == "last_batches":
        assert again.id == first.id
        # Batch 3 from the log, batch 4 ending where it was decided, then the new input.
        assert ran[:2] == [(3, 100), (4, 100)] and sum(n for _, n in ran[2:]) == 300, ran
    else:
        assert again.id != first.id
        # A new checkpoint starts where the pipeline's last decided batch ended.
        assert sum(n for _, n in ran) == 300, ran

    assert _ids(pull_all(address, out)) == list(range(800))
    states = by_state(transactions(address, f"txmq-spark-{pipeline}"))
    assert "PENDING" not in states
    if lost == "last_batches":
        # The two batches run again wrote halves, rolled back by their replayed decisions.
        assert states.get("ROLLED_BACK"), states.keys()


def test_example_pipeline_bills_once_after_its_checkpoint_is_deleted(
    spark: Any, spark_broker: BrokerThread, tmp_path: Path
) -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "pipeline.py"
    spec = importlib.util.spec_from_file_location("txmq_example_pipeline_eos", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    address = spark_broker.address
    common = ["--broker", address, "--source", "eos-orders", "--sink", "eos-billing"]
    ckpt = tmp_path / "ckpt"
    run = ["run", *common, "--checkpoint", str(ckpt), "--available-now"]
    run += ["--pipeline", "eos-billing"]

    def billed_orders() -> list[str]:
        orders = [json.loads(m.body) for m in pull_all(address, "eos-orders")]
        expected = sorted(o["order_id"] for o in orders if o["amount"] > 0)
        billed = sorted(m.keys or "" for m in pull_all(address, "eos-billing"))
        assert billed == expected  # each order with a positive amount billed exactly once
        return billed

    assert example.main(["seed", *common, "--count", "200"]) == 0
    assert example.main(run) == 0
    first = len(billed_orders())
    shutil.rmtree(ckpt)
    assert example.main(["seed", *common, "--count", "100", "--start", "200"]) == 0
    assert example.main(run) == 0
    assert len(billed_orders()) > first
    assert example.main(["show", *common]) == 0
