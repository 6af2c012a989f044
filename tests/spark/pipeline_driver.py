"""A Spark driver for the pipeline crash test, run as a subprocess: copies a txmq topic to
another with the option ``pipeline`` on ``local[2]``, from a given checkpoint, in micro-batches
of at most PER_BATCH messages, until the source's end (``Trigger.AvailableNow``).

    python pipeline_driver.py BROKER SOURCE OUT CHECKPOINT PIPELINE PER_BATCH

The test makes the sink SIGKILL it at a named point (``TXMQ_SPARK_CRASH_AT``, see
:mod:`txmq.spark_connector.writer`) and starts it again.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    broker, source, out, checkpoint, pipeline, per_batch = argv
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from txmq.spark_connector import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("txmq-pipeline-driver")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    query = (
        spark.readStream.format("txmq")
        .option("broker", broker)
        .option("topic", source)
        .option("pipeline", pipeline)
        .option("maxMessagesPerTrigger", per_batch)
        .load()
        .select("body")
        .writeStream.format("txmq")
        .option("broker", broker)
        .option("topic", out)
        .option("pipeline", pipeline)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    print(f"query {query.id} started", flush=True)
    query.awaitTermination()
    print(f"query {query.id} done: {query.lastProgress and query.lastProgress['batchId']}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
