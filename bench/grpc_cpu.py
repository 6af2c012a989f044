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

The gRPC load generator (``--client``) is ``grpcio`` (grpc.aio stubs) or ``raw``, a minimal
HTTP/2 client with constant header blocks.  grpc.aio costs the generator several times what the
broker spends on a call, so one-at-a-time runs leave the broker idle between requests longer than
the remoting runs do, and a broker woken from idle pays more per request (cold caches, a sleep
and a wake-up each time): ``raw`` makes the one-at-a-time figures compare what the broker does,
and ``--pace-us`` gives every client the same pause (spent busy) after each request.

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
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

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

    from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb
    from txmq.broker.grpc.vendor.v2 import service_pb2 as spb
    from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = sgrpc.MessagingServiceStub(channel)
    md = (("x-mq-client-id", f"bench-grpc-{os.getpid()}"), ("x-mq-language", "PYTHON"))
    prefix = f"{os.getpid():08X}{int(time.time()):08X}"

    async def send() -> None:
        m = _message(pb, prefix)
        r = await stub.SendMessage(spb.SendMessageRequest(messages=[m]), metadata=md, timeout=30)
        if r.status.code != pb.OK:
            raise RuntimeError(f"SendMessage answered {r.status}")

    return send, channel.close


def _message(pb: Any, prefix: str) -> Any:
    """A message to send, with a new message id, as a gRPC client makes it."""
    m = pb.Message(topic=pb.Resource(name=TOPIC), body=BODY)
    sp = m.system_properties
    sp.message_id = f"{prefix}{next(_ids):016X}"
    sp.message_type = pb.NORMAL
    sp.born_host = "127.0.0.1"
    sp.born_timestamp.FromMilliseconds(int(time.time() * 1000))
    return m


def _request(pb: Any, spb: Any, prefix: str) -> bytes:
    return bytes(spb.SendMessageRequest(messages=[_message(pb, prefix)]).SerializeToString())


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal never indexed (names and values under 127 bytes)."""
    return b"\x10" + bytes([len(name)]) + name + bytes([len(value)]) + value


async def raw_sender(
    port: int,
) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    """A minimal gRPC client on one HTTP/2 connection: constant header blocks, no dynamic
    table, the whole call in one write; it costs the load generator far less than grpcio, so
    a one-at-a-time run waits less between requests (a broker left idle longer pays more per
    wake-up)."""
    from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb
    from txmq.broker.grpc.vendor.v2 import service_pb2 as spb

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    big = 1 << 30
    writer.write(
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        + _frame(4, 0, 0, struct.pack(">HL", 4, big))
        + _frame(8, 0, 0, struct.pack(">L", big - 65535))
    )
    block = (
        b"\x83\x86"  # :method POST, :scheme http
        + _literal(b":path", b"/apache.rocketmq.v2.MessagingService/SendMessage")
        + _literal(b":authority", b"127.0.0.1")
        + _literal(b"content-type", b"application/grpc")
        + _literal(b"te", b"trailers")
        + _literal(b"grpc-timeout", b"30S")
        + _literal(b"x-mq-client-id", f"bench-raw-{os.getpid()}".encode())
        + _literal(b"x-mq-language", b"PYTHON")
    )
    prefix = f"{os.getpid():08X}{int(time.time()):08X}"
    waiting: dict[int, asyncio.Future[bytes]] = {}
    bodies: dict[int, bytearray] = {}
    ids = itertools.count(1, 2)

    async def read() -> None:
        buf = b""
        while True:
            chunk = await reader.read(1 << 16)
            if not chunk:
                break
            buf += chunk
            while len(buf) >= 9:
                n = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + n:
                    break
                kind, flags, sid = buf[3], buf[4], int.from_bytes(buf[5:9], "big")
                payload, buf = buf[9 : 9 + n], buf[9 + n :]
                if kind == 0:
                    bodies.setdefault(sid, bytearray()).extend(payload)
                elif kind == 4 and not flags & 1:
                    writer.write(_frame(4, 1, 0, b""))
                elif kind == 6 and not flags & 1:
                    writer.write(_frame(6, 1, 0, payload))
                if kind in (1, 0) and flags & 1:
                    fut = waiting.pop(sid, None)
                    if fut is not None and not fut.done():
                        fut.set_result(bytes(bodies.pop(sid, b"")))
        for fut in waiting.values():
            fut.set_exception(ConnectionError("the broker closed the connection"))

    reading = asyncio.get_running_loop().create_task(read())

    async def send() -> None:
        sid = next(ids)
        body = _request(pb, spb, prefix)
        fut = waiting[sid] = asyncio.get_running_loop().create_future()
        writer.write(
            _frame(1, 4, sid, block) + _frame(0, 1, sid, struct.pack(">BL", 0, len(body)) + body)
        )
        data = await fut
        r = spb.SendMessageResponse.FromString(data[5:])
        if r.status.code != pb.OK:
            raise RuntimeError(f"SendMessage answered {r.status}")

    async def close() -> None:
        writer.close()
        reading.cancel()

    return send, close


def _frame(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + sid.to_bytes(4, "big") + payload


async def drive(send: Callable[[], Awaitable[None]], n: int, window: int) -> None:
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await send()

    await asyncio.gather(*(worker() for _ in range(window)))


def paced(send: Callable[[], Awaitable[None]], pace_us: float) -> Callable[[], Awaitable[None]]:
    """``send``, then ``pace_us`` µs of the load generator's CPU (a busy wait): every client
    then keeps the broker waiting about as long between its requests."""
    if pace_us <= 0:
        return send
    pace = pace_us / 1e6

    async def send_paced() -> None:
        await send()
        until = time.perf_counter() + pace
        while time.perf_counter() < until:
            pass

    return send_paced


async def measure(
    kind: str,
    address: str,
    grpc_port: int,
    pid: int,
    n: int,
    window: int,
    client: str = "grpcio",
    pace_us: float = 0.0,
) -> float:
    """Broker µs of CPU per send of ``n`` sends."""
    if kind == "remoting":
        send, close = await remoting_sender(address)
    elif client == "raw":
        send, close = await raw_sender(grpc_port)
    else:
        send, close = await grpc_sender(grpc_port)
    send = paced(send, pace_us)
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
    ap.add_argument(
        "--client",
        choices=("grpcio", "raw"),
        default="grpcio",
        help="the gRPC load generator: grpc.aio stubs, or a minimal HTTP/2 client (raw)",
    )
    ap.add_argument(
        "--pace-us",
        type=float,
        default=0.0,
        help="µs of load-generator CPU after each send, for every client (one-at-a-time runs "
        "then compare the broker at the same pace)",
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
                        us = asyncio.run(
                            measure(
                                kind,
                                address,
                                port,
                                pid,
                                args.messages,
                                window,
                                args.client,
                                args.pace_us,
                            )
                        )
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
