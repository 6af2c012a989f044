"""Plain-message throughput and latency: N async producers send for a while, then one pull
consumer drains the topic.

    python bench/throughput.py --producers 4 --seconds 10 --size 1024 [--flush SYNC_FLUSH]
    python bench/throughput.py --batch 64          # SEND_BATCH_MESSAGE, 64 messages a request
    python bench/throughput.py --tls               # plain TCP, then TLS, on one permissive broker
    python bench/throughput.py --producers 1 --inflight 1000   # pipelined (auto-batched)
    python bench/throughput.py --producers 1 --inflight 1000 --no-auto-batch

Prints messages/s and MB/s for sending and for pulling, send latency percentiles, and the SDK's
CPU time per sent message (this process: producers and load loop, while sending).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

from _broker import broker_process, drain_topic, emit, percentiles, quiet_logs  # noqa: E402

from txmq.client import AsyncProducer, ClientConfig, Message  # noqa: E402


def self_signed(folder: str) -> tuple[str, str]:
    """A throw-away certificate for 127.0.0.1 (the openssl command line)."""
    cert, key = os.path.join(folder, "broker.pem"), os.path.join(folder, "broker.key")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
        + ["-nodes", "-days", "1", "-keyout", key, "-out", cert, "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return cert, key


async def run(
    args: argparse.Namespace, address: str, tls: ssl.SSLContext | None = None
) -> dict[str, object]:
    body = b"x" * args.size
    config = ClientConfig(tls=tls or False, auto_batch=args.auto_batch)
    producers = [AsyncProducer(f"bench-{i}", address, config=config) for i in range(args.producers)]
    for p in producers:
        await p.start()
    latencies: list[float] = []
    sent = 0
    stop_at = time.monotonic() + args.seconds

    async def worker(p: AsyncProducer) -> None:
        nonlocal sent
        while time.monotonic() < stop_at:
            t0 = time.perf_counter()
            if args.batch > 1:
                await p.send_batch([Message(args.topic, body) for _ in range(args.batch)])
                sent += args.batch
            else:
                await p.send(Message(args.topic, body))
                sent += 1
            latencies.append((time.perf_counter() - t0) * 1000)

    t0 = time.monotonic()
    cpu0 = time.process_time()
    await asyncio.gather(*(worker(p) for p in producers for _ in range(args.inflight)))
    send_s = time.monotonic() - t0
    sdk_cpu_s = time.process_time() - cpu0
    for p in producers:
        await p.shutdown()

    t0 = time.monotonic()
    pulled = len(await drain_topic(address, args.topic))
    pull_s = time.monotonic() - t0
    return {
        "flush": args.flush,
        "producers": args.producers,
        "inflight_per_producer": args.inflight,
        "batch": args.batch,
        "auto_batch": args.auto_batch,
        "loop": args.loop,
        "size_bytes": args.size,
        "sent": sent,
        "send_msgs_per_s": round(sent / send_s, 1),
        "send_MB_per_s": round(sent * args.size / send_s / 1e6, 2),
        "send_latency_ms": {k: round(v, 2) for k, v in percentiles(latencies).items()},
        "sdk_cpu_us_per_msg": round(sdk_cpu_s / max(sent, 1) * 1e6, 1),
        "pulled": pulled,
        "pull_msgs_per_s": round(pulled / pull_s, 1),
        "lost": sent - pulled,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--broker", help="use this broker instead of starting one")
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--inflight", type=int, default=4, help="concurrent sends per producer")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--topic", default="bench-plain")
    ap.add_argument(
        "--auto-batch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="producers with auto_batch, the SDK's default (concurrent sends leave as "
        "SEND_BATCH_MESSAGE); --no-auto-batch sends each message in a request of its own",
    )
    ap.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    ap.add_argument(
        "--tls",
        action="store_true",
        help="measure plain TCP, then TLS, against one broker in permissive mode",
    )
    ap.add_argument(
        "--loop",
        default="uvloop",
        choices=["uvloop", "asyncio"],
        help="the client's event loop (uvloop, as the sync clients and the peer harness use)",
    )
    args = ap.parse_args()
    quiet_logs()
    if args.loop == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    if not args.tls:
        with broker_process(flush=args.flush, address=args.broker) as address:
            emit(asyncio.run(run(args, address)))
        return
    with tempfile.TemporaryDirectory(prefix="txmq-bench-tls-") as tmp:
        cert, key = self_signed(tmp)
        settings: dict[str, object] = {
            "tls.server.mode": "permissive",
            "tls.server.certPath": cert,
            "tls.server.keyPath": key,
        }
        ctx = ssl.create_default_context(cafile=cert)
        with broker_process(settings, flush=args.flush) as address:
            topic = args.topic
            args.topic = f"{topic}-tcp"
            plain = asyncio.run(run(args, address))
            args.topic = f"{topic}-tls"
            secure = asyncio.run(run(args, address, ctx))
    ratio = float(secure["send_msgs_per_s"]) / float(plain["send_msgs_per_s"])  # type: ignore[arg-type]
    emit({"plain": plain, "tls": secure, "tls_send_throughput_vs_plain": round(ratio, 3)})


if __name__ == "__main__":
    main()
