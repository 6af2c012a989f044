"""What TLS and the ACL cost: plain-send and transaction throughput against four brokers in
turn, started the same way but for their security settings: off, TLS (enforcing), ACL
(every request signed and checked), TLS and ACL.

    python bench/security.py --seconds 8 --producers 2 --inflight 8 --size 1024 --rounds 3

Each broker is a fresh child process on a fresh store.  Against each one, N async producers
send plain messages for ``--seconds`` (``--inflight`` sends in flight each), then N
transaction producers run committed transactions for ``--seconds`` (send the half, commit,
the decision acknowledged).  With ``--rounds`` the modes run in turn that many times (the
machine's drift spreads over all of them) and the median of each is kept.  Prints messages/s
and transactions/s per mode and each mode's ratio to "off".  The clients are the txmq SDK over
the remoting port.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import statistics
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

from _broker import CommitAll, broker_process, emit, quiet_logs, run_clients  # noqa: E402
from throughput import self_signed  # noqa: E402

from txmq.client import (  # noqa: E402
    AsyncProducer,
    AsyncTransactionProducer,
    ClientConfig,
    LocalTransactionState,
    Message,
)

PLAIN_TOPIC, TX_TOPIC, TX_GROUP = "sec-plain", "sec-tx", "sec-tx-group"
ACCESS_KEY, SECRET_KEY = "bench-producer", "bench-secret-123"
#: The producer's account: what an application gets, not an admin account.
ACL_FILE = f"""
accounts:
  - accessKey: {ACCESS_KEY}
    secretKey: {SECRET_KEY}
    topicPerms:
      - {PLAIN_TOPIC}=PUB
      - {TX_TOPIC}=PUB
    groupPerms:
      - {TX_GROUP}=PUB
"""
MODES = ("off", "tls", "acl", "tls+acl")


async def measure(args: argparse.Namespace, address: str, config: ClientConfig) -> dict[str, Any]:
    body = b"x" * args.size
    producers = [AsyncProducer(f"sec-{i}", address, config=config) for i in range(args.producers)]
    it = iter(range(1 << 62))

    async def send() -> None:
        await producers[next(it) % len(producers)].send(Message(PLAIN_TOPIC, body))

    sent, send_s = await run_clients(producers, args.seconds, args.producers * args.inflight, send)

    txps = [
        AsyncTransactionProducer(TX_GROUP, CommitAll(), address, config=config)
        for _ in range(args.producers)
    ]

    async def transact() -> None:
        t = txps[next(it) % len(txps)]
        r = await t.send_message_in_transaction(Message(TX_TOPIC, body))
        if r.local_transaction_state is not LocalTransactionState.COMMIT_MESSAGE:
            raise RuntimeError(f"transaction not committed: {r}")

    txs, tx_s = await run_clients(txps, args.seconds, args.producers * args.inflight, transact)
    return {
        "send_msgs_per_s": round(sent / send_s, 1),
        "tx_per_s": round(txs / tx_s, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--inflight", type=int, default=8, help="calls in flight per producer")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of " + ", ".join(MODES))
    ap.add_argument("--rounds", type=int, default=1, help="times each mode is measured")
    args = ap.parse_args()
    quiet_logs()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        ap.error(f"unknown mode(s): {', '.join(unknown)}")
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="txmq-bench-sec-") as tmp:
        cert, key = self_signed(tmp)
        acl_path = os.path.join(tmp, "plain_acl.yml")
        with open(acl_path, "w", encoding="utf-8") as fh:
            fh.write(ACL_FILE)
        ctx = ssl.create_default_context(cafile=cert)
        for mode in [m for _ in range(args.rounds) for m in modes]:
            settings: dict[str, object] = {}
            client: dict[str, Any] = {}
            if "tls" in mode:
                settings.update(
                    {
                        "tls.server.mode": "enforcing",
                        "tls.server.certPath": cert,
                        "tls.server.keyPath": key,
                    }
                )
                client["tls"] = ctx
            if "acl" in mode:
                settings.update({"aclEnable": "true", "plainAclFile": acl_path})
                client.update(access_key=ACCESS_KEY, secret_key=SECRET_KEY)
            with broker_process(settings) as address:
                runs[mode].append(asyncio.run(measure(args, address, ClientConfig(**client))))
            print(f"{mode:8} {runs[mode][-1]}", flush=True)
    results = {
        m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items() if rs
    }
    doc: dict[str, object] = {
        "producers": args.producers,
        "inflight_per_producer": args.inflight,
        "size_bytes": args.size,
        "seconds": args.seconds,
        "rounds": args.rounds,
        **{m: r for m, r in results.items()},
    }
    base = results.get("off")
    if base is not None:
        for m, r in results.items():
            if m != "off":
                doc[f"{m}_vs_off"] = {
                    k: round(float(r[k]) / float(base[k]), 3)
                    for k in ("send_msgs_per_s", "tx_per_s")
                }
    emit(doc)


if __name__ == "__main__":
    main()
