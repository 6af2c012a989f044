"""Restart time: how long a broker takes to start over a large store.

Fills a store in a temporary folder (or ``--store``) with about ``--gib`` GiB of commit log
through the broker itself (in-process, no network): plain messages and one-message
transactions (half, decision record, committed message) in the ratio given, then stops the
broker cleanly and times a fresh start, split into store recovery and transaction recovery.
Run it twice with ``--store`` to compare: the first start after filling replays the half and
op queues if the store has no transaction snapshot yet; later ones read the snapshot.

    python bench/restart.py --gib 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from _broker import quiet_logs  # noqa: E402
from _scratch import scratch_dir  # noqa: E402

from txmq.broker.config import BrokerConfig  # noqa: E402
from txmq.broker.server import BrokerController, new_event_loop  # noqa: E402
from txmq.broker.transaction.state import Decision  # noqa: E402
from txmq.protocol.message import MessageConst, MessageExt, UniqIdGenerator  # noqa: E402


async def fill(
    cfg: BrokerConfig, gib: float, body_size: int, tx_share: float, crash: bool = False
) -> int:
    b = BrokerController(cfg)
    await b.start()
    ids = UniqIdGenerator()
    body = b"x" * body_size
    target = int(gib * (1 << 30))
    n = 0
    every = max(1, round(1 / tx_share)) if tx_share > 0 else 0
    batches = 0
    while b.store.max_phy_offset < target:
        batch = []
        for _ in range(256):
            batch.append(
                MessageExt(
                    topic="plain",
                    body=body,
                    queue_id=n % 8,
                    properties={MessageConst.UNIQ_KEY: ids.next_id()},
                )
            )
            n += 1
        b.put_messages(batch)
        if every and (n // 256) % every == 0:
            for _ in range(64):
                half = MessageExt(
                    topic="orders",
                    body=body,
                    queue_id=n % 8,
                    properties={
                        MessageConst.UNIQ_KEY: ids.next_id(),
                        MessageConst.TRAN_MSG: "true",
                        MessageConst.PGROUP: "restart-tx",
                    },
                )
                b.transactions.prepare_half(half, "restart-tx")
                r = b.put_message(half)
                b.transactions.on_half_stored(half, r)
                txid = b.transactions.transaction_id_of(half.properties)
                b.transactions.decide(b.transactions.records[str(txid)], Decision.COMMIT, "bench")
                n += 1
        batches += 1
        if batches % 20 == 0:
            await asyncio.sleep(0.01)  # a broker between requests: flush, housekeeping, checks run
    if crash:  # no shutdown: the store and the transaction table as a SIGKILL leaves them
        os.kill(os.getpid(), signal.SIGKILL)
    await b.shutdown()
    return n


async def start_once(cfg: BrokerConfig) -> tuple[float, dict[str, object]]:
    b = BrokerController(cfg)
    t0 = time.perf_counter()
    await b.start()
    elapsed = time.perf_counter() - t0
    rec = dict(b.recovery)
    await b.shutdown()
    return elapsed, rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="commit log size to fill")
    ap.add_argument("--body", type=int, default=1024, help="message body size, bytes")
    ap.add_argument(
        "--tx-share",
        type=float,
        default=0.2,
        help="share of transactions among the messages (about)",
    )
    ap.add_argument("--store", help="reuse this store folder (filled if empty)")
    ap.add_argument(
        "--crash",
        action="store_true",
        help="fill in a child process that is SIGKILLed at the end, then time the start",
    )
    ap.add_argument("--fill-and-die", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    quiet_logs()
    if args.fill_and_die:  # the child of --crash: fills the store its parent named
        run(args, args.store)
        return
    with scratch_dir("txmq-restart-", keep=args.store) as root:
        run(args, str(root))


def run(args: argparse.Namespace, root: str) -> None:
    cfg = BrokerConfig(listen_port=0, store_path_root_dir=root)
    if args.fill_and_die:
        loop = new_event_loop()
        loop.run_until_complete(fill(cfg, args.gib, args.body, args.tx_share, crash=True))
        return
    if args.crash and not os.path.exists(os.path.join(root, "commitlog")):
        t0 = time.perf_counter()
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--fill-and-die",
                "--store",
                root,
                "--gib",
                str(args.gib),
                "--body",
                str(args.body),
                "--tx-share",
                str(args.tx_share),
            ],
            check=False,
        )
        assert child.returncode == -signal.SIGKILL, f"the filler exited {child.returncode}"
        print(f"filled {root} and SIGKILLed the broker in {time.perf_counter() - t0:,.1f}s")
    loop = new_event_loop()
    try:
        if not os.path.exists(os.path.join(root, "commitlog")):
            t0 = time.perf_counter()
            n = loop.run_until_complete(fill(cfg, args.gib, args.body, args.tx_share))
            print(f"filled {root}: {n:,} messages in {time.perf_counter() - t0:,.1f}s")
        elapsed, rec = loop.run_until_complete(start_once(cfg))
    finally:
        loop.close()
    size = int(getattr(rec.get("store"), "max_phy_offset", 0))
    store_ms = float(getattr(rec.get("store"), "elapsed_ms", 0.0))
    tx = rec.get("transactions") or {}
    print(
        f"restart over a {size / (1 << 30):.2f} GiB commit log: {elapsed:.2f}s "
        f"(store recovery {store_ms / 1000:.2f}s), "
        f"transactions {tx}; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB"
    )


if __name__ == "__main__":
    main()
