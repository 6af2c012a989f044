"""The broker's side of the Spark sink without Spark: per batch, ``--partitions`` transactions
write ``--rows`` 1 KiB halves in all (SEND_BATCH_MESSAGE requests of ``--batch-size`` entries
tagged with TXMQ_BATCH_KEY, up to ``--max-in-flight`` per transaction, one connection each, as
the sink's tasks do), then one TXMQ_DECIDE_BATCH commits them.  Prints rows/s and the broker's
CPU.

    python bench/sink_path.py                          # 6 batches of 2 x 50,000 rows
    python bench/sink_path.py --batches 3 --rows 20000
    python bench/sink_path.py --writer --profile       # the sink's own encoder, profiled

The request bodies of a batch are encoded before its clock starts, so the figure is the
broker's (and the wire's), not the client's encoder.  ``--writer`` instead has the sink's
``HalfWriter`` encode and send each partition from Arrow record batches of 10,000 rows (what
Spark hands a Python data source's writer), on this process's event loop, and adds this
process's CPU per row -- the Python worker's share of a Spark task; ``--profile`` prints a
cProfile of it.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import tempfile
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

from _broker import emit, quiet_logs, send_request, spawn_broker  # noqa: E402

from txmq.protocol.message import (  # noqa: E402
    BatchBody,
    MessageConst,
    MessageSysFlag,
    UniqIdGenerator,
    properties_to_string,
)
from txmq.spark_connector.options import SinkOptions  # noqa: E402
from txmq.spark_connector.session import BrokerSession  # noqa: E402
from txmq.spark_connector.sink import HalfWriter, PlainRows, chunks  # noqa: E402

TOPIC = "bench-sink-path"
GROUP = "bench-sink-path"
QUEUES = 4
ROW_BYTES = 1024
ARROW_BATCH_ROWS = 10_000


def _proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def encode_partition(
    batch_key: str, txid: str, rows: int, first: int, batch_size: int, part: int
) -> list[tuple[int, bytes]]:
    """(queue id, SEND_BATCH_MESSAGE body) of one transaction's rows, as the sink builds them."""
    ids = UniqIdGenerator()
    const = properties_to_string(
        {
            MessageConst.TRAN_MSG: "true",
            MessageConst.PGROUP: GROUP,
            MessageConst.TRANSACTION_ID: txid,
            MessageConst.TXMQ_BATCH_KEY: batch_key,
        }
    ).encode()
    out = []
    qid = part % QUEUES
    buf = BatchBody()
    for i in range(first, first + rows):
        body = str(i).encode().ljust(ROW_BYTES, b"x")
        buf.add(body, b"UNIQ_KEY\x01" + ids.next_id().encode() + b"\x02" + const)
        if buf.count >= batch_size:
            out.append((qid, buf.encode()))
            buf = BatchBody()
            qid = (qid + 1) % QUEUES
    if buf.count:
        out.append((qid, buf.encode()))
    return out


async def send_partition(
    address: str, requests: list[tuple[int, bytes]], max_in_flight: int
) -> None:
    async with BrokerSession(address) as session:
        sem = asyncio.Semaphore(max_in_flight)

        async def one(qid: int, body: bytes) -> None:
            try:
                await send_request(
                    session.connection,
                    group=GROUP,
                    topic=TOPIC,
                    queues=QUEUES,
                    queue_id=qid,
                    sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE,
                    properties=properties_to_string({MessageConst.WAIT_STORE_MSG_OK: "true"}),
                    body=body,
                    timeout=60.0,
                    batch=True,
                )
            finally:
                sem.release()

        tasks = []
        for qid, body in requests:
            await sem.acquire()
            tasks.append(asyncio.ensure_future(one(qid, body)))
        await asyncio.gather(*tasks)


def arrow_partition(rows: int, first: int) -> list[Any]:
    """A partition's rows as Spark hands them to the writer: record batches of 10,000 rows
    with one binary ``body`` column of 1 KiB values."""
    import pyarrow as pa

    out = []
    for lo in range(first, first + rows, ARROW_BATCH_ROWS):
        hi = min(first + rows, lo + ARROW_BATCH_ROWS)
        bodies = [str(i).encode().ljust(ROW_BYTES, b"x") for i in range(lo, hi)]
        out.append(pa.record_batch({"body": pa.array(bodies, pa.binary())}))
    return out


async def write_arrow(
    address: str, batches: list[Any], batch_key: str, txid: str, part: int, args: Any
) -> None:
    """One partition through the sink's writer (what a Spark task's ``write`` runs)."""
    options = SinkOptions(
        broker=address,
        topic=TOPIC,
        batch_size=args.batch_size,
        max_in_flight=args.max_in_flight,
        request_timeout=60.0,
    )
    async with BrokerSession(address, 60.0) as session:
        writer = HalfWriter(session, options, GROUP, txid, batch_key, part)
        for chunk in chunks(batches, ("body",)):
            if isinstance(chunk, PlainRows):
                await writer.write_plain(chunk.body)
            else:
                await writer.write_chunk(chunk)
        await writer.finish()


async def run(args: argparse.Namespace, address: str, pid: int) -> dict[str, object]:
    per_part = args.rows // args.partitions
    times: list[float] = []
    cpu = own = 0.0
    profile = cProfile.Profile() if args.profile else None
    async with BrokerSession(address, 120.0) as driver:
        for b in range(args.batches + args.warmup):
            key = f"sink-path-{uuid.uuid4().hex[:8]}-{b}"
            txids = [f"{key}-{p}" for p in range(args.partitions)]
            if args.writer:
                inputs = [arrow_partition(per_part, p * per_part) for p in range(args.partitions)]
            else:
                parts = [
                    encode_partition(key, txids[p], per_part, p * per_part, args.batch_size, p)
                    for p in range(args.partitions)
                ]
            c0, t0, o0 = _proc_cpu(pid), time.monotonic(), time.process_time()
            if profile is not None and b >= args.warmup:
                profile.enable()
            if args.writer:
                await asyncio.gather(
                    *(
                        write_arrow(address, inputs[p], key, txids[p], p, args)
                        for p in range(args.partitions)
                    )
                )
            else:
                await asyncio.gather(
                    *(send_partition(address, reqs, args.max_in_flight) for reqs in parts)
                )
            answer = await driver.decide_batch(GROUP, key, txids)
            if profile is not None:
                profile.disable()
            t1, c1, o1 = time.monotonic(), _proc_cpu(pid), time.process_time()
            if sorted(answer["committed"]) != sorted(txids):
                raise RuntimeError(f"batch not committed: {answer}")
            if b >= args.warmup:
                times.append(t1 - t0)
                cpu += c1 - c0
                own += o1 - o0
    rows = per_part * args.partitions
    total = sum(times)
    if profile is not None:
        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    return {
        "rows_per_s": round(rows * len(times) / total),
        "batch_s": [round(t, 2) for t in times],
        "best_batch_rows_per_s": round(rows / min(times)),
        "broker_cpu_pct": round(100 * cpu / total),
        "broker_cpu_us_per_row": round(1e6 * cpu / (rows * len(times)), 1),
        # This process: the sink's writer with --writer, else only sending ready bodies.
        "client_cpu_us_per_row": round(1e6 * own / (rows * len(times)), 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=6, help="measured batches")
    p.add_argument("--warmup", type=int, default=1, help="batches before measuring")
    p.add_argument("--rows", type=int, default=100_000, help="rows per batch")
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=512, help="entries per request")
    p.add_argument("--max-in-flight", type=int, default=8)
    p.add_argument(
        "--writer", action="store_true", help="encode with the sink's writer from Arrow batches"
    )
    p.add_argument("--profile", action="store_true", help="cProfile this process (stderr)")
    args = p.parse_args()
    quiet_logs()
    with tempfile.TemporaryDirectory(prefix="txmq-sink-path-") as tmp:
        with spawn_broker(os.path.join(tmp, "store")) as (address, pid):
            emit(asyncio.run(run(args, address, pid)))


if __name__ == "__main__":
    main()
