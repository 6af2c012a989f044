"""What the broker's message trace costs: pipelined sends to a broker with ``traceTopicEnable``
off, then to one with it on (each send then also writes a ``Pub`` record to the trace topic),
in alternating rounds so a change of load on the machine hits both.

    python bench/trace.py --messages 50000 --rounds 3 [--in-flight 256 --conns 2] [--flush SYNC_FLUSH]

Prints, for each setting, the median send throughput (messages/s) and the broker's CPU time
per message (its process's user + system time while sending), and on/off ratios; with trace
on, the number of trace messages the broker wrote is checked to cover every send.

    python bench/trace.py --path --messages 50000

measures the trace path alone, in this process, on a broker's own store: the hooks of the
stored messages, the writes of their Pub records (``--per-write`` records at a time) and the
message index reading the trace messages' keys, in CPU µs per message (steadier than the
whole broker's CPU on a shared machine).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

from _broker import emit, quiet_logs, send_raw, spawn_broker  # noqa: E402


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process ``pid``, all its threads (Linux /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


async def traced_count(address: str, topic: str) -> int:
    """Messages stored in the trace topic (0 when it does not exist)."""
    from txmq.client.admin import AsyncAdminClient

    async with AsyncAdminClient(address) as admin:
        if topic not in await admin.list_topics():
            return 0
        stats = await admin.topic_stats(topic)
    return sum(int(q["maxOffset"]) - int(q["minOffset"]) for q in stats["offsetTable"])


def one_round(args: argparse.Namespace, address: str, pid: int) -> tuple[float, float, float]:
    """(messages/s, broker user and system CPU µs per message) of one round of sends."""
    user0, sys0 = cpu_seconds(pid)
    seconds = asyncio.run(
        send_raw(
            address,
            group="bench-trace",
            topic=args.topic,
            queues=4,
            sys_flag=0,
            body=b"x" * args.size,
            properties=({} for _ in range(args.messages)),
            in_flight=args.in_flight,
            conns=args.conns,
        )
    )
    user, system = cpu_seconds(pid)
    n = args.messages
    return n / seconds, (user - user0) / n * 1e6, (system - sys0) / n * 1e6


class _Receipt:
    def __init__(self, uniq_key: str, offset_msg_id: str) -> None:
        self.uniq_key = uniq_key
        self.offset_msg_id = offset_msg_id
        self.transaction_id: str | None = None


async def trace_path(n: int, per_write: int, size: int) -> dict[str, float]:
    """CPU µs per message of the broker's trace path (see the module docstring)."""
    import time

    from txmq.broker.config import BrokerConfig
    from txmq.broker.server import BrokerController
    from txmq.protocol.message import MessageConst, MessageExt

    with tempfile.TemporaryDirectory(prefix="txmq-bench-trace-path-") as tmp:
        c = BrokerController(
            BrokerConfig(store_path_root_dir=tmp, listen_port=0, trace_topic_enable=True)
        )
        await c.start()
        try:
            trace, index = c.core.trace, c.index
            assert trace is not None and index is not None
            now = int(time.time() * 1000)
            stored = []
            for i in range(n):
                uniq = f"C0A8000100002A9F{i:016X}"
                m = MessageExt(
                    topic="bench-trace",
                    body=b"x" * size,
                    queue_id=i % 4,
                    properties={MessageConst.UNIQ_KEY: uniq, MessageConst.PGROUP: "bench"},
                )
                m.store_timestamp = now
                stored.append(([m], [_Receipt(uniq, f"7F00000100002A9F{i * 400:016X}")]))
            index.catch_up()
            t0 = time.process_time()
            for j in range(0, n, per_write):
                for msgs, receipts in stored[j : j + per_write]:
                    trace.stored(msgs, receipts)
                trace.flush()
            t1 = time.process_time()
            index.catch_up()
            t2 = time.process_time()
        finally:
            await c.shutdown()
    return {
        "hooks_and_writes_us_per_msg": round((t1 - t0) / n * 1e6, 2),
        "index_us_per_msg": round((t2 - t1) / n * 1e6, 2),
        "trace_path_us_per_msg": round((t2 - t0) / n * 1e6, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=50_000, help="sends per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--in-flight", type=int, default=256)
    ap.add_argument("--conns", type=int, default=2)
    ap.add_argument("--topic", default="bench-trace")
    ap.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a broker setting for both brokers (repeatable), e.g. messageIndexEnable=false",
    )
    ap.add_argument("--path", action="store_true", help="measure the trace path alone, in process")
    ap.add_argument("--per-write", type=int, default=250, help="--path: records per trace write")
    args = ap.parse_args()
    quiet_logs()
    if args.path:
        result = asyncio.run(trace_path(args.messages, args.per_write, args.size))
        emit({"messages": args.messages, "records_per_write": args.per_write, **result})
        return
    common: dict[str, object] = dict(kv.split("=", 1) for kv in args.set)
    traced = {**common, "traceTopicEnable": "true"}
    rates: dict[str, list[float]] = {"off": [], "on": []}
    cpus: dict[str, list[float]] = {"off": [], "on": []}
    users: dict[str, list[float]] = {"off": [], "on": []}
    with (
        tempfile.TemporaryDirectory(prefix="txmq-bench-trace-") as tmp,
        spawn_broker(os.path.join(tmp, "off"), common, args.flush) as (off_addr, off_pid),
        spawn_broker(os.path.join(tmp, "on"), traced, args.flush) as (on_addr, on_pid),
    ):
        for _ in range(args.rounds):
            for name, addr, pid in (("off", off_addr, off_pid), ("on", on_addr, on_pid)):
                rate, user, system = one_round(args, addr, pid)
                rates[name].append(rate)
                cpus[name].append(user + system)
                users[name].append(user)
        trace_messages = asyncio.run(traced_count(on_addr, "RMQ_SYS_TRACE_TOPIC"))
        untraced = asyncio.run(traced_count(off_addr, "RMQ_SYS_TRACE_TOPIC"))
    off_rate, on_rate = statistics.median(rates["off"]), statistics.median(rates["on"])
    off_cpu, on_cpu = statistics.median(cpus["off"]), statistics.median(cpus["on"])
    emit(
        {
            "flush": args.flush,
            "settings": common,
            "messages_per_round": args.messages,
            "rounds": args.rounds,
            "size_bytes": args.size,
            "in_flight": f"{args.in_flight} x {args.conns} connections",
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "off_send_msgs_per_s": round(off_rate),
            "on_send_msgs_per_s": round(on_rate),
            "on_vs_off_throughput": round(on_rate / off_rate, 3),
            "off_broker_cpu_us_per_msg": round(off_cpu, 1),
            "on_broker_cpu_us_per_msg": round(on_cpu, 1),
            "on_vs_off_broker_cpu": round(on_cpu / off_cpu, 3),
            "broker_user_cpu_us_per_msg": {
                k: round(statistics.median(v), 1) for k, v in users.items()
            },
            "all_rounds_msgs_per_s": {k: [round(r) for r in v] for k, v in rates.items()},
            "trace_messages_written": trace_messages,
            "trace_messages_with_trace_off": untraced,
        }
    )


if __name__ == "__main__":
    main()
