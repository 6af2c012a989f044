"""Broker CPU per send: a RocketMQ 5 gRPC SendMessage against a remoting SEND_MESSAGE_V2, on one
broker with both ports, in interleaved rounds (remoting, gRPC native, gRPC grpcio, remoting, ...).

    python bench/grpc_cpu.py                    # 3 rounds of 5,000 sends per mode
    python bench/grpc_cpu.py --rounds 5 --messages 10000 --window 32
    python bench/grpc_cpu.py --transports native    # leave out the grpc.aio transport

The gRPC port is served by each of ``--transports`` (``grpcTransport``: ``native``, txmq's own
HTTP/2, and ``grpcio``, grpc.aio), each in a broker of its own.

Modes, each one message a request (the txmq SDK without auto-batching; grpcio with the broker's
own stubs, what the 5.x clients send):

* ``one``: one request in flight (each send waits for its answer);
* ``window``: ``--window`` requests in flight.

The CPU counted is the broker process's (utime + stime, /proc) over each run, divided by the
messages sent; the load generator runs in this process.  Linux only.  Each message has its own
id, so the duplicate window is asked and misses, as for real sends.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

from _broker import cpu_ticks, free_port, quiet_logs, spawn_broker
from _scratch import scratch_dir

from txmq.client import AsyncProducer, ClientConfig, Message

TICKS = os.sysconf("SC_CLK_TCK")
TOPIC = "bench-grpc-cpu"
BODY = b"x" * 1024
_ids = itertools.count()


async def remoting_sender(
    address: str,
) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    p = AsyncProducer("bench-remoting", address, config=ClientConfig(auto_batch=False))
    await p.start()

    async def send() -> None:
        await p.send(Message(TOPIC, BODY))

    return send, p.shutdown


async def grpc_sender(
    port: int,
) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    import grpc

    from txmq.broker.grpc.v2 import definition_pb2 as pb
    from txmq.broker.grpc.v2 import service_pb2 as spb
    from txmq.broker.grpc.v2 import service_pb2_grpc as sgrpc

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = sgrpc.MessagingServiceStub(channel)
    md = (("x-mq-client-id", f"bench-grpc-{os.getpid()}"), ("x-mq-language", "PYTHON"))
    prefix = f"{os.getpid():08X}{int(time.time()):08X}"

    async def send() -> None:
        m = pb.Message(topic=pb.Resource(name=TOPIC), body=BODY)
        sp = m.system_properties
        sp.message_id = f"{prefix}{next(_ids):016X}"
        sp.message_type = pb.NORMAL
        sp.born_host = "127.0.0.1"
        sp.born_timestamp.FromMilliseconds(int(time.time() * 1000))
        r = await stub.SendMessage(spb.SendMessageRequest(messages=[m]), metadata=md, timeout=30)
        if r.status.code != pb.OK:
            raise RuntimeError(f"SendMessage answered {r.status}")

    return send, channel.close


async def drive(send: Callable[[], Awaitable[None]], n: int, window: int) -> None:
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await send()

    await asyncio.gather(*(worker() for _ in range(window)))


async def measure(kind: str, address: str, grpc_port: int, pid: int, n: int, window: int) -> float:
    """Broker µs of CPU per send of ``n`` sends."""
    send, close = await (remoting_sender(address) if kind == "remoting" else grpc_sender(grpc_port))
    try:
        await drive(send, 200, window)  # connections and first-time paths, not counted
        before = cpu_ticks(pid)
        await drive(send, n, window)
        used = cpu_ticks(pid) - before
    finally:
        await close()
    return used / TICKS / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--window", type=int, default=32, help="requests in flight in `window` mode")
    ap.add_argument(
        "--transports",
        default="native,grpcio",
        help="comma-separated grpcTransport values to measure (native, grpcio)",
    )
    args = ap.parse_args()
    transports = [t for t in args.transports.split(",") if t]
    kinds = ["remoting", *(f"grpc-{t}" for t in transports)]
    quiet_logs()
    results: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for mode, window in (("one", 1), ("window", args.window)):
            for kind in kinds:
                with scratch_dir("grpc-cpu") as store:
                    port = free_port()
                    settings = {
                        "grpcServerEnable": "true",
                        "grpcServerPort": port,
                        "autoCreateTopicEnable": "true",
                    }
                    if kind.startswith("grpc-"):
                        settings["grpcTransport"] = kind.removeprefix("grpc-")
                    with spawn_broker(str(store), settings) as (address, pid):
                        us = asyncio.run(measure(kind, address, port, pid, args.messages, window))
                results.setdefault((mode, kind), []).append(us)
                print(f"round {r + 1} {mode:6} {kind:13} {us:7.1f} µs/send", file=sys.stderr)
    print(f"\nbroker CPU per send, median of {args.rounds} rounds of {args.messages} sends:")
    head = "".join(f" {k:>13} {'/remoting':>9}" for k in kinds[1:])
    print(f"{'mode':8} {'remoting':>10}{head}")
    for mode in ("one", "window"):
        a = statistics.median(results[(mode, "remoting")])
        row = "".join(
            f" {b:11.1f}µs {b / a:8.2f}x"
            for b in (statistics.median(results[(mode, k)]) for k in kinds[1:])
        )
        print(f"{mode:8} {a:8.1f}µs{row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
