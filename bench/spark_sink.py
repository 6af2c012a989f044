"""Throughput of the exactly-once Spark sink: a streaming query on ``local[2]`` writes 1 KiB rows
from the rate source into a fresh broker (a child process); delivered (committed, visible) rows
per second are counted at the broker.

    python bench/spark_sink.py                               # 45 s, 100k rows per batch
    python bench/spark_sink.py --source rate --rate 20000    # does it keep up with 20k rows/s?
    python bench/spark_sink.py --batch-size 1000 --max-in-flight 8

``rate-micro-batch`` (default) hands the sink a fixed number of rows per micro-batch as fast as
it takes them: ``sustained_rows_per_s`` is the sink's ceiling (rows of the batches that ran
inside the window over their time; a batch is the halves' write plus the commit).  ``rate``
offers rows at a fixed rate: if the sink keeps up, ``delivered_rows_per_s`` equals the rate.
Alongside it prints the CPU used by the broker process and by Spark (the JVM, its Python
workers and this driver), which shows what bounds the figure on this machine.

Then the source reads back what the sink delivered (``readStream.format("txmq")`` with
``Trigger.AvailableNow`` into Spark's ``noop`` sink) and prints its read rate in rows/s with the
CPU split of that phase (``--no-read`` skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

from _broker import spawn_broker  # noqa: E402

ROW_BYTES = 1024


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by one process; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants(root: int) -> list[int]:
    """Every live process below ``root`` (Spark's JVM and its Python workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _cpu(broker_pid: int) -> tuple[float, float]:
    """(broker CPU seconds, Spark CPU seconds: this process and its other descendants)."""
    spark = _proc_cpu(os.getpid()) + sum(
        _proc_cpu(p) for p in _descendants(os.getpid()) if p != broker_pid
    )
    return _proc_cpu(broker_pid), spark


def delivered(address: str, topic: str) -> int:
    """Committed messages in the topic (sum of the queues' max offsets)."""
    from txmq.client import ClientConfig, PullConsumer

    # The broker may take seconds to answer while it decides a big batch: wait as the sink does.
    patient = ClientConfig(connect_timeout=30.0, request_timeout=30.0)
    with PullConsumer("bench-spark-sink", broker=address, config=patient) as c:
        try:
            queues = c.fetch_queues(topic)
        except Exception:
            return 0
        return sum(c.max_offset(topic, q) for q in queues)


def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from txmq.spark_connector import register

    tmp = tempfile.mkdtemp(prefix="txmq-spark-bench-")
    try:
        with spawn_broker(os.path.join(tmp, "store")) as (address, broker_pid):
            spark = (
                SparkSession.builder.master(args.master)
                .appName("txmq-spark-sink-bench")
                .config("spark.ui.enabled", "false")
                .config("spark.sql.shuffle.partitions", str(args.partitions))
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
            register(spark)
            if args.source == "rate":
                source = spark.readStream.format("rate").option("rowsPerSecond", args.rate)
            else:
                source = spark.readStream.format("rate-micro-batch").option(
                    "rowsPerBatch", args.rows_per_batch
                )
            rows = (
                source.option("numPartitions", args.partitions)
                .load()
                .select(
                    F.rpad(F.col("value").cast("string"), ROW_BYTES, "x")
                    .cast("binary")
                    .alias("body")
                )
            )
            query = (
                rows.writeStream.format("txmq")
                .option("broker", address)
                .option("topic", "bench-spark")
                .option("batchSize", args.batch_size)
                .option("maxInFlight", args.max_in_flight)
                .option("checkpointLocation", os.path.join(tmp, "ckpt"))
                .trigger(processingTime="0 seconds")
                .start()
            )
            time.sleep(args.warmup)
            n0, t0 = delivered(address, "bench-spark"), time.time()
            b0, s0 = _cpu(broker_pid)
            time.sleep(args.seconds)
            n1, t1 = delivered(address, "bench-spark"), time.time()
            b1, s1 = _cpu(broker_pid)
            progress = list(query.recentProgress)
            spark.sparkContext.setLogLevel("OFF")  # stopping mid-batch logs cancelled tasks
            query.stop()
            spark.sparkContext.setLogLevel("ERROR")
            read = read_back(spark, args, address, broker_pid, tmp) if args.read else {}
            spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wall = t1 - t0
    # Batches that ran entirely inside the window: their rows over their total time (the
    # micro-batches run back to back, so this is the sink's sustained rate).
    inside = []
    for p in progress:
        start = _epoch(p["timestamp"])
        end = start + p["durationMs"].get("triggerExecution", 0) / 1000
        if p["numInputRows"] and t0 <= start and end <= t1:
            inside.append((start, end, p))
    sustained = (
        (sum(p["numInputRows"] for _, _, p in inside) / (inside[-1][1] - inside[0][0]))
        if inside
        else 0.0
    )
    return {
        "delivered_rows_per_s": round((n1 - n0) / wall),
        "sustained_rows_per_s": round(sustained),
        "mib_per_s": round(sustained * ROW_BYTES / 2**20, 1),
        "window_s": round(wall, 1),
        "batches_in_window": len(inside),
        "batch_rows": [p["numInputRows"] for _, _, p in inside],
        "batch_add_ms": [p["durationMs"].get("addBatch") for _, _, p in inside],
        "broker_cpu_pct": round(100 * (b1 - b0) / wall),
        "spark_cpu_pct": round(100 * (s1 - s0) / wall),
        "cores": os.cpu_count(),
        **read,
    }


def read_back(
    spark: Any, args: argparse.Namespace, address: str, broker_pid: int, tmp: str
) -> dict[str, Any]:
    """The source's read rate: everything the sink delivered, read with ``AvailableNow``
    into the ``noop`` sink (every row is pulled and turned into a Spark row, nothing kept)."""
    total = delivered(address, "bench-spark")
    t0, (b0, s0) = time.time(), _cpu(broker_pid)
    query = (
        spark.readStream.format("txmq")
        .option("broker", address)
        .option("topic", "bench-spark")
        .option("pullBatchSize", args.pull_batch_size)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", os.path.join(tmp, "read-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    if not query.awaitTermination(args.read_timeout):
        query.stop()
        raise SystemExit(f"reading {total} rows back took over {args.read_timeout}s")
    t1, (b1, s1) = time.time(), _cpu(broker_pid)
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    if rows != total:
        raise SystemExit(f"the source read {rows} rows, the topic holds {total}")
    wall = t1 - t0
    batch_s = sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress) / 1000
    return {
        "read_rows": rows,
        "read_rows_per_s": round(rows / wall),
        "read_batch_rows_per_s": round(rows / batch_s) if batch_s else 0,
        "read_s": round(wall, 1),
        "read_broker_cpu_pct": round(100 * (b1 - b0) / wall),
        "read_spark_cpu_pct": round(100 * (s1 - s0) / wall),
    }


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=45.0, help="measuring window")
    p.add_argument("--warmup", type=float, default=20.0, help="seconds before measuring")
    p.add_argument(
        "--source",
        choices=["rate-micro-batch", "rate"],
        default="rate-micro-batch",
        help="rate-micro-batch: fixed rows per batch, as fast as the sink goes; "
        "rate: rows offered per second (batches grow when the sink falls behind)",
    )
    p.add_argument("--rows-per-batch", type=int, default=100_000)
    p.add_argument("--rate", type=int, default=20_000, help="rows per second offered (rate)")
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--batch-size", type=int, default=512, help="sink option batchSize")
    p.add_argument("--max-in-flight", type=int, default=8, help="sink option maxInFlight")
    p.add_argument(
        "--no-read", dest="read", action="store_false", help="skip reading back with the source"
    )
    p.add_argument("--pull-batch-size", type=int, default=1024, help="source option pullBatchSize")
    p.add_argument("--read-timeout", type=float, default=600.0, help="bound of the read-back")
    args = p.parse_args()
    result = run(args)
    print(json.dumps(result, indent=2))
    broker_cpu, spark_cpu = result["broker_cpu_pct"], result["spark_cpu_pct"]
    if broker_cpu >= 85:
        bound = f"the broker's single event loop ({broker_cpu}% of a core)"
    elif broker_cpu + spark_cpu >= 90 * (os.cpu_count() or 1):
        bound = f"the machine's CPUs (broker {broker_cpu}% + Spark {spark_cpu}%)"
    else:
        bound = f"latency, not CPU (broker {broker_cpu}%, Spark {spark_cpu}%)"
    print(
        f"sink: sustained {result['sustained_rows_per_s']} rows/s of 1 KiB rows "
        f"({result['mib_per_s']} MiB/s); bounded by {bound}"
    )
    if args.read:
        print(
            f"source: read {result['read_rows']} rows at {result['read_rows_per_s']} rows/s "
            f"(broker {result['read_broker_cpu_pct']}% CPU, Spark {result['read_spark_cpu_pct']}%)"
        )


if __name__ == "__main__":
    main()
