"""The message index: lookup latency, and what it costs sends.

    python bench/index_lookup.py                          # 200,000 messages through a broker
    python bench/index_lookup.py --messages 10000000      # the index component on its own
    python bench/index_lookup.py --skip-throughput        # lookups only
    python bench/index_lookup.py --messages 1000 --batch 1 --producers 16   # single sends

1. Through a broker (up to ``--broker-max`` messages): send ``--messages`` messages with a key
   (and their message id) in batches, wait until the index has caught up, then time
   ``--lookups`` QUERY_MESSAGE round trips by key and by message id (random, each expected to
   find its one message) from one admin connection.
2. Larger counts are measured on the index files directly (what a query walks before it reads
   the candidates from the commit log): N messages of two keys each are indexed with the
   broker's default file geometry (1 M slots, 4 M entries a file), then random keys are looked
   up.
3. Send throughput with the index on and off: ``--producers`` producers send batches of
   ``--batch`` messages (1: one at a time) for ``--seconds`` to a fresh broker with
   ``messageIndexEnable`` true, then false.

Prints latency percentiles in ms, index build rates, and send rates.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

from _broker import broker_process, emit, percentiles, quiet_logs  # noqa: E402

from txmq.broker.store.index import IndexFiles, key_hash  # noqa: E402
from txmq.client import AsyncProducer, Message  # noqa: E402
from txmq.client.admin import AsyncAdminClient  # noqa: E402

TOPIC = "bench-index"
BATCH = 100


async def _fill(address: str, n: int, body: bytes) -> list[tuple[str, str]]:
    """Send ``n`` keyed messages in batches from 4 producers; ``(key, msg id)`` of each."""
    out: list[tuple[str, str]] = []
    per = (n + 3) // 4

    async def one(w: int) -> None:
        async with AsyncProducer(f"bench-index-{w}", address) as p:
            for at in range(w * per, min(n, (w + 1) * per), BATCH):
                keys = [f"order-{i}" for i in range(at, min(n, (w + 1) * per, at + BATCH))]
                res = await p.send_batch([Message(TOPIC, body, keys=k) for k in keys])
                out.extend(zip(keys, res.msg_ids, strict=True))

    await asyncio.gather(*(one(w) for w in range(4)))
    return out


async def broker_lookups(args: argparse.Namespace) -> dict[str, object]:
    body = b"x" * args.size
    with broker_process({"maxMessageSize": 4 * 1024 * 1024}) as address:
        t0 = time.perf_counter()
        sent = await _fill(address, args.messages, body)
        send_s = time.perf_counter() - t0
        async with AsyncAdminClient(address, timeout=30.0) as admin:
            last_key, last_id = sent[-1]
            while not (await admin.query_messages(TOPIC, last_id, unique=True)).messages:
                await asyncio.sleep(0.05)
            caught_up_s = time.perf_counter() - t0
            rnd = random.Random(1)
            by_key: list[float] = []
            by_id: list[float] = []
            for _ in range(args.lookups):
                key, msg_id = sent[rnd.randrange(len(sent))]
                t = time.perf_counter()
                r = await admin.query_messages(TOPIC, key)
                by_key.append((time.perf_counter() - t) * 1000)
                assert [m.msg_id for m in r.messages] == [msg_id], key
                t = time.perf_counter()
                r = await admin.query_messages(TOPIC, msg_id, unique=True)
                by_id.append((time.perf_counter() - t) * 1000)
                assert len(r.messages) == 1, msg_id
    return {
        "broker.messages": len(sent),
        "broker.send_s": round(send_s, 2),
        "broker.indexed_after_s": round(caught_up_s, 2),
        "broker.lookup_by_key_ms": {k: round(v, 3) for k, v in percentiles(by_key).items()},
        "broker.lookup_by_id_ms": {k: round(v, 3) for k, v in percentiles(by_id).items()},
    }


def direct_lookups(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="txmq-bench-index-") as tmp:
        files = IndexFiles(os.path.join(tmp, "index"), 1_000_000, 4_000_000)
        files.load(0)
        topic = TOPIC.encode()
        t0 = time.perf_counter()
        ts = 1_700_000_000_000
        phy = 0
        for i in range(args.messages):
            files.add(key_hash(topic, b"order-%d" % i), phy, ts + i // 1000)
            files.add(key_hash(topic, b"%032X" % i), phy, ts + i // 1000)
            phy += 200
        files.advance(phy)
        build_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        files.sync(files.sync_snapshots())
        sync_s = time.perf_counter() - t1
        rnd = random.Random(2)
        lat: list[float] = []
        for _ in range(args.lookups):
            i = rnd.randrange(args.messages)
            t = time.perf_counter()
            found = list(files.lookup(key_hash(topic, b"order-%d" % i), 0, 2**62))
            lat.append((time.perf_counter() - t) * 1000)
            assert i * 200 in found, i
        n_files = len(files.files)
        files.close()
    return {
        "direct.messages": args.messages,
        "direct.entries": 2 * args.messages,
        "direct.files": n_files,
        "direct.build_entries_per_s": round(2 * args.messages / build_s),
        "direct.sync_s": round(sync_s, 2),
        "direct.lookup_ms": {k: round(v, 4) for k, v in percentiles(lat).items()},
    }


async def send_rate(args: argparse.Namespace, index_on: bool) -> tuple[float, float]:
    """Messages/s sent with the index on or off, and (index on) the seconds the index took
    after the last send to have indexed everything."""
    settings: dict[str, object] = {"messageIndexEnable": str(index_on).lower()}
    body = b"x" * args.size
    with broker_process(settings) as address:
        producers = [AsyncProducer(f"bench-rate-{i}", address) for i in range(args.producers)]
        for p in producers:
            await p.start()
        # Warm up (routes, topic creation).
        await producers[0].send_batch([Message(TOPIC, body, keys="warm")])
        sent = 0
        last_id = ""
        stop_at = time.monotonic() + args.seconds

        async def worker(p: AsyncProducer, w: int) -> None:
            nonlocal sent, last_id
            i = 0
            while time.monotonic() < stop_at:
                if args.batch == 1:
                    res = await p.send(Message(TOPIC, body, keys=f"k-{w}-{i}"))
                else:
                    res = await p.send_batch(
                        [Message(TOPIC, body, keys=f"k-{w}-{i + j}") for j in range(args.batch)]
                    )
                last_id = res.msg_ids[-1]
                sent += args.batch
                i += args.batch

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(p, w) for w, p in enumerate(producers)))
        elapsed = time.perf_counter() - t0
        for p in producers:
            await p.shutdown()
        lag = 0.0
        if index_on:
            async with AsyncAdminClient(address, timeout=30.0) as admin:
                while not (await admin.query_messages(TOPIC, last_id, unique=True)).messages:
                    await asyncio.sleep(0.01)
            lag = time.perf_counter() - t0 - elapsed
    return sent / elapsed, lag


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--lookups", type=int, default=2000)
    ap.add_argument("--size", type=int, default=256, help="body bytes")
    ap.add_argument(
        "--broker-max",
        type=int,
        default=1_000_000,
        help="above this many messages, lookups are measured on the index component only",
    )
    ap.add_argument("--seconds", type=float, default=10.0, help="per throughput run")
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=BATCH, help="messages a send (1: single sends)")
    ap.add_argument("--skip-throughput", action="store_true")
    args = ap.parse_args()
    quiet_logs()
    doc: dict[str, object] = {}
    if args.messages <= args.broker_max:
        doc.update(await broker_lookups(args))
    doc.update(direct_lookups(args))
    if not args.skip_throughput:
        on, lag = await send_rate(args, True)
        off, _ = await send_rate(args, False)
        doc["send_msgs_per_s.index_on"] = round(on)
        doc["send_msgs_per_s.index_off"] = round(off)
        doc["send_cost_of_index_pct"] = round((off - on) / off * 100, 1)
        doc["index_caught_up_s_after_sends"] = round(lag, 2)
    emit(doc)


if __name__ == "__main__":
    asyncio.run(main())
