"""A Spark driver run under pyspark 3.5 (build/venvs/spark35, ``make spark35``) by
tests/spark/test_spark35.py: streams the JSON files of a folder (one file per micro-batch) into a
txmq topic through the documented ``foreachBatch`` helper on ``local[2]``, from a given
checkpoint, until every file is processed (``Trigger.AvailableNow``).

    python spark35_driver.py BROKER INPUT_FOLDER CHECKPOINT TOPIC

Prints one JSON line: the pyspark version, the query id and ``[batchId, numInputRows]`` of the
micro-batches it ran.
"""

from __future__ import annotations

import json
import logging
import os
import sys


def main(argv: list[str]) -> int:
    broker, folder, checkpoint, topic = argv
    # The connector logs through stdlib logging, silent until the application configures it:
    # this driver shows its events (the test reads them) as a pipeline's driver would.
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(message)s")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    import pyspark
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from txmq.spark_connector import txmq_foreach_batch

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("txmq-spark35")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    query = (
        spark.readStream.schema("id INT, customer STRING")
        .option("maxFilesPerTrigger", 1)
        .json(folder)
        .repartition(2)
        .select(
            F.concat(F.lit("order-"), F.col("id").cast("string"), F.lit("|")).alias("body"),
            F.col("customer").alias("keys"),
            "customer",
        )
        .writeStream.foreachBatch(
            txmq_foreach_batch(broker=broker, topic=topic, queue_column="customer", batchSize=50)
        )
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    batches = [[p["batchId"], p["numInputRows"]] for p in query.recentProgress]
    print(json.dumps({"pyspark": pyspark.__version__, "query_id": query.id, "batches": batches}))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
