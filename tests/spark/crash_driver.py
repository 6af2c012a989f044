"""A Spark driver for the crash tests, run as a subprocess: streams the JSON files of a folder
(one file per micro-batch) into a txmq topic with the exactly-once sink on ``local[2]``, from a
given checkpoint, until every file is processed (``Trigger.AvailableNow``).

    python crash_driver.py BROKER INPUT_FOLDER CHECKPOINT TOPIC

The tests SIGKILL it (its process group) at random moments, or make the sink do so at a named
point (``TXMQ_SPARK_CRASH_AT``, see :mod:`txmq.spark_connector.writer`), and start it again.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    broker, folder, checkpoint, topic = argv
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from txmq.spark_connector import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("txmq-crash-driver")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    query = (
        spark.readStream.schema("id INT, customer STRING, amount DOUBLE")
        .option("maxFilesPerTrigger", 1)
        .json(folder)
        .repartition(2)
        .select(
            F.concat(F.lit("order-"), F.col("id").cast("string"), F.lit("|")).alias("body"),
            "customer",
        )
        .writeStream.format("txmq")
        .option("broker", broker)
        .option("topic", topic)
        .option("batchSize", "50")
        .option("queueColumn", "customer")
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
