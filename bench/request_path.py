"""The broker's own work for one request, without sockets or the event loop's I/O: a real
broker (store on disk) in this process, each request's frame decoded, dispatched through
``BrokerController.handle`` (the processors, the core, the store) and its answer encoded, in a
loop.  What compiling changes is all here; the kernel's part of a request is not.

    python bench/request_path.py                      # as this process imports txmq
    python bench/request_path.py --compare            # compiled against TXMQ_PURE_PYTHON=1,
                                                      # interleaved, in child processes
    python bench/request_path.py --compare --variant a= --variant b=1   # named variants

Figures: ``send`` (SEND_MESSAGE_V2 of one 1 KiB message, the direct path), ``txn`` (a half,
then its END_TRANSACTION commit) and ``pull`` (PULL_MESSAGE of 32 of those messages): process
CPU µs per request (per transaction for ``txn``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from _scratch import scratch_dir

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


async def measure(count: int, store: str) -> dict[str, float]:
    from tests.support.raw import RawClient
    from txmq.broker.config import BrokerConfig
    from txmq.broker.server import BrokerController
    from txmq.protocol.codes import RequestCode
    from txmq.protocol.frame import FrameDecoder, encode_frame
    from txmq.protocol.headers import (
        EndTransactionRequestHeader,
        PullMessageRequestHeader,
        SendMessageRequestHeader,
    )
    from txmq.protocol.message import MessageConst as C
    from txmq.protocol.message import decode_messages, decode_offset_msg_id, properties_to_string

    b = BrokerController(BrokerConfig(store_path_root_dir=store, listen_port=0))
    await b.start()
    client = await RawClient.connect(b.address)
    try:
        await client.heartbeat(producer_groups=["g"])
        conn = next(iter(b._connections))
        body = b"x" * 1024

        def frame(i: int, sys_flag: int = 0, extra: dict[str, str] | None = None) -> bytes:
            props = {C.UNIQ_KEY: f"{i:032X}", C.WAIT_STORE_MSG_OK: "true", **(extra or {})}
            h = SendMessageRequestHeader(
                producer_group="g",
                topic="reqpath",
                queue_id=i % 4,
                sys_flag=sys_flag,
                born_timestamp=1_700_000_000_000,
                properties=properties_to_string(props),
            )
            cmd = client_request(RequestCode.SEND_MESSAGE_V2, h.to_v2_ext_fields(), body)
            return encode_frame(cmd)

        from txmq.protocol.command import RemotingCommand

        def client_request(code: int, ext: dict[str, Any], payload: bytes) -> RemotingCommand:
            return RemotingCommand.request(code, ext, payload)

        decoder = FrameDecoder()

        async def one(raw: bytes) -> Any:
            decoder.feed(raw)
            cmd = decoder.next_command()
            assert cmd is not None
            resp = await b.handle(conn, cmd)
            assert resp is not None and resp.code == 0, (resp and resp.code, resp and resp.remark)
            encode_frame(resp)
            return resp

        out: dict[str, float] = {}
        # sends: frames made beforehand, then timed
        await one(frame(10**9))
        frames = [frame(i) for i in range(count)]
        c0 = time.process_time()
        for raw in frames:
            await one(raw)
        out["send"] = (time.process_time() - c0) / count * 1e6
        # transactions: a half, then its commit
        halves = [
            frame(2 * 10**9 + i, 0x4, {C.TRAN_MSG: "true", C.PGROUP: "g"})
            for i in range(count // 2)
        ]
        c0 = time.process_time()
        for raw in halves:
            resp = await one(raw)
            ext = resp.ext_fields
            end = EndTransactionRequestHeader(
                producer_group="g",
                tran_state_table_offset=int(ext["queueOffset"]),
                commit_log_offset=decode_offset_msg_id(ext["msgId"])[1],
                commit_or_rollback=0x8,
                msg_id=ext["msgId"],
                transaction_id=ext.get("transactionId"),
            )
            cmd = RemotingCommand.request(RequestCode.END_TRANSACTION, end.to_ext_fields())
            await one(encode_frame(cmd))
        out["txn"] = (time.process_time() - c0) / (count // 2) * 1e6
        # pulls: PULL_MESSAGE of up to 32 of the messages sent above, queue by queue
        pulls = []
        for i in range(count // 8):
            q = i % 4
            pull = PullMessageRequestHeader(
                consumer_group="reqpath-c",
                topic="reqpath",
                queue_id=q,
                queue_offset=(i // 4 * 32) % max(1, count // 4 - 32),
                max_msg_nums=32,
                sys_flag=0x4,  # the subscription is in the header; no suspend
                subscription="*",
            )
            cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, pull.to_ext_fields())
            pulls.append(encode_frame(cmd))
        first = await one(pulls[0])
        assert first.body and len(decode_messages(first.body)) == 32, "a pull of 32 expected"
        c0 = time.process_time()
        for raw in pulls:
            await one(raw)
        out["pull"] = (time.process_time() - c0) / len(pulls) * 1e6
        return out
    finally:
        await client.close()
        await b.shutdown()


def child(switch: str, count: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("TXMQ_PURE_PYTHON", None)
    if switch:
        env["TXMQ_PURE_PYTHON"] = switch
    out = subprocess.run(
        [sys.executable, __file__, "--count", str(count), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
        check=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compare", action="store_true")
    ap.add_argument(
        "--variant",
        action="append",
        metavar="NAME=SWITCH",
        help="with --compare: TXMQ_PURE_PYTHON's value for one child (empty: compiled, "
        "anything else: pure Python; default: compiled= and pure=1)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not args.compare:
        import logging

        import uvloop

        from txmq.broker.logging import configure_logging

        configure_logging("WARNING")
        logging.disable(logging.WARNING)
        with scratch_dir("txmq-reqpath-") as store:
            result = uvloop.run(measure(args.count, str(store)))
        if args.json:
            print(json.dumps(result))
        else:
            from txmq import _compiled

            print(_compiled.STATUS.describe(), result)
        return
    variants = dict(v.partition("=")[::2] for v in args.variant or ["compiled=", "pure=1"])
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for r in range(args.rounds):
        for name in runs:
            res = child(variants[name], args.count)
            runs[name].append(res)
            print(f"round {r + 1} {name:8} " + "  ".join(f"{k} {v:.1f} µs" for k, v in res.items()))
    for name, values in runs.items():
        med = {k: statistics.median(v[k] for v in values) for k in values[0]}
        print(f"median {name:8} " + "  ".join(f"{k} {v:.1f} µs" for k, v in med.items()))


if __name__ == "__main__":
    main()
