"""An exactly-once pipeline: topic ``orders`` -> Spark Structured Streaming -> topic ``billing``.

Every order message (JSON ``{"order_id", "customer", "amount"}``) with a positive amount becomes
exactly one billing message (JSON with the amount in cents), keyed by the order id and kept in
order per customer (the customer picks the queue).  The source reads committed orders only, its
offsets live in the checkpoint, and the sink commits each micro-batch atomically: after any
crash and restart, every order is billed exactly once.

Try it against a local broker (``make run`` starts one on 127.0.0.1:10911)::

    python examples/pipeline.py seed --count 1000      # publish 1000 orders
    python examples/pipeline.py run --available-now    # bill what is there, then stop
    python examples/pipeline.py show                   # messages and distinct order ids

``run`` without ``--available-now`` keeps running and bills new orders as they come (Ctrl-C
stops it; the next ``run`` goes on where it stopped).  With ``spark-submit`` see docs/spark.md.

``run --pipeline orders-billing`` names the pipeline: each batch decision then also records
the order offsets it billed, so a lost or rolled-back checkpoint bills nothing twice and skips
nothing (docs/spark.md, "Pipelines").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections.abc import Sequence
from typing import Any

DEFAULT_BROKER = "127.0.0.1:10911"


def build_query(
    spark: Any,
    *,
    broker: str,
    source: str,
    sink: str,
    checkpoint: str,
    available_now: bool = False,
    max_per_trigger: int = 10_000,
    pipeline: str | None = None,
) -> Any:
    """Start the streaming query ``source`` -> billing events -> ``sink`` (with ``pipeline``:
    exactly once even when the checkpoint is lost)."""
    named = {"pipeline": pipeline} if pipeline is not None else {}
    from pyspark.sql import functions as F

    from txmq.spark_connector import register

    register(spark)
    orders = (
        spark.readStream.format("txmq")
        .option("broker", broker)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", str(max_per_trigger))
        .options(**named)
        .load()
    )
    order = F.from_json(
        F.col("body").cast("string"), "order_id STRING, customer STRING, amount DOUBLE"
    )
    billing = (
        orders.select(order.alias("o"), F.col("msg_id"), F.col("queue_offset"))
        .where(F.col("o.amount") > 0)
        .select(
            F.to_json(
                F.struct(
                    F.col("o.order_id").alias("order_id"),
                    F.col("o.customer").alias("customer"),
                    F.round(F.col("o.amount") * 100).cast("long").alias("amount_cents"),
                )
            ).alias("body"),
            F.col("o.order_id").alias("keys"),
            F.when(F.col("o.amount") >= 100, F.lit("large"))
            .otherwise(F.lit("regular"))
            .alias("tags"),
            F.create_map(F.lit("source_msg_id"), F.col("msg_id")).alias("properties"),
            F.col("o.customer").alias("customer"),
        )
    )
    writer = (
        billing.writeStream.format("txmq")
        .option("broker", broker)
        .option("topic", sink)
        .option("queueColumn", "customer")
        .option("checkpointLocation", checkpoint)
        .options(**named)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()


def seed(broker: str, topic: str, count: int, start: int = 0) -> None:
    """Publish ``count`` orders (about one in ten with a non-positive amount, which the
    pipeline drops)."""
    from txmq.client import Message, Producer

    rnd = random.Random(start)
    with Producer("pipeline-seed", broker=broker) as producer:
        for i in range(start, start + count):
            order_id, customer = f"o-{i}", f"customer-{i % 17}"
            order = {
                "order_id": order_id,
                "customer": customer,
                "amount": round(rnd.uniform(-20, 250), 2),
            }
            producer.send(
                Message(topic, json.dumps(order).encode(), keys=order_id), sharding_key=customer
            )


def count_messages(broker: str, topic: str) -> tuple[int, int]:
    """How many messages the topic holds (over all queues), and how many distinct ids among
    them (a billing message's key is its order id): the two differ exactly when something was
    delivered twice."""
    from txmq.client import PullConsumer, PullStatus

    total, ids = 0, set()
    with PullConsumer("pipeline-show", broker=broker) as consumer:
        for q in consumer.fetch_queues(topic):
            offset = consumer.min_offset(topic, q)
            while True:
                result = consumer.pull(topic, q, offset, max_nums=256)
                if result.status is not PullStatus.FOUND:
                    break
                for m in result.messages:
                    total += 1
                    ids.add(m.keys or m.msg_id)
                offset = result.next_begin_offset
    return total, len(ids)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``seed``, ``run`` or ``show``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["seed", "run", "show"])
    parser.add_argument("--broker", default=DEFAULT_BROKER)
    parser.add_argument("--source", default="orders")
    parser.add_argument("--sink", default="billing")
    parser.add_argument("--checkpoint", default="./checkpoints/pipeline")
    parser.add_argument("--count", type=int, default=1000, help="orders to seed")
    parser.add_argument("--start", type=int, default=0, help="first order number to seed")
    parser.add_argument(
        "--available-now", action="store_true", help="process what is there, then stop"
    )
    parser.add_argument(
        "--pipeline", help="name the pipeline: exactly once even if the checkpoint is lost"
    )
    args = parser.parse_args(argv)

    if args.command == "seed":
        seed(args.broker, args.source, args.count, args.start)
        print(f"published {args.count} orders to {args.source}")
        return 0
    if args.command == "show":
        total, distinct = count_messages(args.broker, args.sink)
        duplicates = total - distinct
        print(f"{args.sink}: {total} messages, {distinct} distinct ids, {duplicates} duplicates")
        return 0 if duplicates == 0 else 2

    from pyspark.sql import SparkSession

    # Spark's Python workers need txmq too: by default they run this same interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.appName("txmq-pipeline").getOrCreate()
    query = build_query(
        spark,
        broker=args.broker,
        source=args.source,
        sink=args.sink,
        checkpoint=args.checkpoint,
        available_now=args.available_now,
        pipeline=args.pipeline,
    )
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    except Exception as exc:  # the query failed; Spark's log has the details
        print(f"the pipeline failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
