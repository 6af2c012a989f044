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
Alongside it prints the CPU used by the broker process and by Spark, and per delivered row the
CPU microseconds of the broker, Spark's JVM, its Python workers (where the connector's writer
runs) and this driver, with the share of the machine other processes took meanwhile: on a
shared machine rows per second vary with the neighbours, CPU per row much less.

Then the source reads back what the sink delivered (``readStream.format("txmq")`` with
``Trigger.AvailableNow`` into Spark's ``noop`` sink) and prints its read rate in rows/s with the
CPU split of that phase (``--no-read`` skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

from _broker import spawn_broker  # noqa: E402
from _scratch import scratch_dir  # noqa: E402

ROW_BYTES = 1024


def _proc_stat(pid: int) -> tuple[str, float] | None:
    """(command name, CPU seconds: user + system) of one process; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw.rsplit(")", 1)[1].split()
    return comm, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


#: The parts whose CPU the bench reports: the broker, Spark's JVM (the rate source, the query's
#: plan, Arrow out to the Python workers), the Python workers (the connector's writer and
#: reader) and this driver program (Spark's Python driver: the commit, the planning calls).
PARTS = ("broker", "jvm", "workers", "driver")


class CpuWatch:
    """CPU seconds of each of :data:`PARTS` over a window, per process: every process below
    this one is sampled every ``interval`` seconds, so the Python workers Spark starts and ends
    during the window count too (a process's CPU before the window is left out; one that ends
    loses at most its last ``interval``)."""

    def __init__(self, broker_pid: int, interval: float = 0.25) -> None:
        self.broker_pid = broker_pid
        self.interval = interval
        self.first: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-watch", daemon=True)

    def _sample(self, start: bool) -> None:
        for pid in [os.getpid(), *_descendants(os.getpid())]:
            stat = _proc_stat(pid)
            if stat is None:
                continue
            if pid not in self.first:
                self.first[pid] = stat[1] if start else 0.0
            self.last[pid] = stat

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample(False)

    def __enter__(self) -> CpuWatch:
        self._sample(True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sample(False)

    def seconds(self) -> dict[str, float]:
        """CPU seconds of each part in the window."""
        out = dict.fromkeys(PARTS, 0.0)
        for pid, (comm, cpu) in self.last.items():
            if pid == os.getpid():
                part = "driver"
            elif pid == self.broker_pid:
                part = "broker"
            else:
                part = "jvm" if comm == "java" else "workers"
            out[part] += max(0.0, cpu - self.first.get(pid, 0.0))
        return out


def _machine_busy() -> float:
    """CPU seconds the whole machine has been busy (every core, every process: /proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _split(cpu: dict[str, float], wall: float, rows: int) -> dict[str, Any]:
    """Each part's share of a core and its CPU microseconds per row."""
    out: dict[str, Any] = {}
    for part in PARTS:
        sec = cpu[part]
        out[part] = {
            "cpu_pct": round(100 * sec / wall) if wall else 0,
            "us_per_row": round(1e6 * sec / rows, 1) if rows else None,
        }
    return out


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

    with scratch_dir("txmq-spark-bench-") as scratch:
        tmp = str(scratch)
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
            m0 = _machine_busy()
            with CpuWatch(broker_pid) as watch:
                time.sleep(args.seconds)
                n1, t1 = delivered(address, "bench-spark"), time.time()
            m1 = _machine_busy()
            cpu = watch.seconds()
            progress = list(query.recentProgress)
            spark.sparkContext.setLogLevel("OFF")  # stopping mid-batch logs cancelled tasks
            query.stop()
            spark.sparkContext.setLogLevel("ERROR")
            read = read_back(spark, args, address, broker_pid, tmp) if args.read else {}
            spark.stop()
    wall = t1 - t0
    ours = sum(cpu.values())
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
        "broker_cpu_pct": round(100 * cpu["broker"] / wall),
        "spark_cpu_pct": round(100 * (ours - cpu["broker"]) / wall),
        "cpu": _split(cpu, wall, n1 - n0),
        "others_cpu_pct": round(100 * max(0.0, (m1 - m0) - ours) / wall),
        "cores": os.cpu_count(),
        **read,
    }


def read_back(
    spark: Any, args: argparse.Namespace, address: str, broker_pid: int, tmp: str
) -> dict[str, Any]:
    """The source's read rate: everything the sink delivered, read with ``AvailableNow``
    into the ``noop`` sink (every row is pulled and turned into a Spark row, nothing kept)."""
    total = delivered(address, "bench-spark")
    t0, m0 = time.time(), _machine_busy()
    watch = CpuWatch(broker_pid).__enter__()
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
    watch.__exit__()
    t1, m1, cpu = time.time(), _machine_busy(), watch.seconds()
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    if rows != total:
        raise SystemExit(f"the source read {rows} rows, the topic holds {total}")
    wall = t1 - t0
    ours = sum(cpu.values())
    broker = cpu["broker"]
    batch_s = sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress) / 1000
    return {
        "read_rows": rows,
        "read_rows_per_s": round(rows / wall),
        "read_batch_rows_per_s": round(rows / batch_s) if batch_s else 0,
        "read_s": round(wall, 1),
        "read_broker_cpu_pct": round(100 * broker / wall),
        "read_spark_cpu_pct": round(100 * (ours - broker) / wall),
        "read_cpu": _split(cpu, wall, rows),
        "read_others_cpu_pct": round(100 * max(0.0, (m1 - m0) - ours) / wall),
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
    others = result["others_cpu_pct"]
    if broker_cpu >= 85:
        bound = f"the broker's single event loop ({broker_cpu}% of a core)"
    elif broker_cpu + spark_cpu + others >= 90 * (os.cpu_count() or 1):
        bound = (
            f"the machine's CPUs (broker {broker_cpu}% + Spark {spark_cpu}% "
            f"+ other processes {others}%)"
        )
    else:
        bound = f"latency, not CPU (broker {broker_cpu}%, Spark {spark_cpu}%)"
    print(
        f"sink: sustained {result['sustained_rows_per_s']} rows/s of 1 KiB rows "
        f"({result['mib_per_s']} MiB/s); bounded by {bound}"
    )
    print(f"sink CPU per delivered row: {_per_row(result['cpu'])}")
    if args.read:
        print(
            f"source: read {result['read_rows']} rows at {result['read_rows_per_s']} rows/s "
            f"(broker {result['read_broker_cpu_pct']}% CPU, Spark {result['read_spark_cpu_pct']}%,"
            f" other processes {result['read_others_cpu_pct']}%)"
        )
        print(f"source CPU per row read: {_per_row(result['read_cpu'])}")


def _per_row(split: dict[str, Any]) -> str:
    parts = [f"{k} {v['us_per_row']} us" for k, v in split.items()]
    total = sum(v["us_per_row"] or 0.0 for v in split.values())
    return ", ".join(parts) + f" (total {total:.1f} us)"


if __name__ == "__main__":
    main()
