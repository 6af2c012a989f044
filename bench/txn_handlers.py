"""The broker's request handlers for a transaction, in one process, no sockets: a half sent
alone (``--messages 1``: SEND_MESSAGE_V2) or the halves of one SEND_BATCH_MESSAGE
(``--messages 100``), then END_TRANSACTION commit, through ``BrokerController.handle`` on a
real store in a temporary folder.  What is left of the broker's CPU per transaction once the
network and the event loop are taken out (the message-key index runs on its own turns, not
counted).

    python bench/txn_handlers.py --messages 1 --count 3000
    PYTHONPATH=/other/checkout python bench/txn_handlers.py --messages 100 --count 150 --profile

Prints CPU µs per transaction and per message (process time around the two handlers) and,
with ``--profile``, Python calls per transaction and per message (cProfile, the handlers only).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import logging
import pstats
import time
from types import SimpleNamespace
from typing import Any

import structlog
from _scratch import scratch_dir

from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import (
    BatchBody,
    MessageConst,
    MessageSysFlag,
    decode_offset_msg_id,
    properties_to_string,
)

C = MessageConst
BODY = b"x" * 1024
_seq = itertools.count()


def _header(qid: int, props: str, batch: bool) -> dict[str, Any]:
    return SendMessageRequestHeader(
        producer_group="bench-tx",
        topic="bench-txn",
        default_topic_queue_nums=4,
        queue_id=qid,
        sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE,
        born_timestamp=int(time.time() * 1000),
        flag=0,
        properties=props,
        reconsume_times=0,
        unit_mode=False,
        batch=batch,
    ).to_v2_ext_fields()


def _props(txid: str) -> str:
    """A half's properties as the SDK writes them."""
    return properties_to_string(
        {
            C.UNIQ_KEY: f"7F00000100{next(_seq):022X}",
            C.WAIT_STORE_MSG_OK: "true",
            C.TRAN_MSG: "true",
            C.PGROUP: "bench-tx",
            C.TRANSACTION_ID: txid,
        }
    )


def halves(k: int, txid: str) -> RemotingCommand:
    qid = next(_seq) % 4
    if k == 1:
        return RemotingCommand(
            int(RequestCode.SEND_MESSAGE_V2),
            ext_fields=_header(qid, _props(txid), False),
            body=BODY,
        )
    batch = BatchBody()
    for _ in range(k):
        batch.add(BODY, _props(txid).encode(), 0)
    wait = properties_to_string({C.WAIT_STORE_MSG_OK: "true"})
    return RemotingCommand(
        int(RequestCode.SEND_BATCH_MESSAGE),
        ext_fields=_header(qid, wait, True),
        body=batch.encode(),
    )


def commit(answer: RemotingCommand, txid: str) -> RemotingCommand:
    e = answer.ext_fields
    msg_id = str(e["msgId"]).split(",")[0]
    _, offset = decode_offset_msg_id(msg_id)
    return RemotingCommand(
        int(RequestCode.END_TRANSACTION),
        ext_fields={
            "producerGroup": "bench-tx",
            "tranStateTableOffset": e["queueOffset"],
            "commitLogOffset": offset,
            "commitOrRollback": 8,
            "fromTransactionCheck": False,
            "msgId": msg_id,
            "transactionId": txid,
        },
    )


async def run(args: argparse.Namespace, folder: str) -> dict[str, float]:
    broker = BrokerController(BrokerConfig(store_path_root_dir=folder, listen_port=0))
    await broker.start()
    conn: Any = SimpleNamespace(peer=("127.0.0.1", 40000), context={})
    k = args.messages

    async def handled(cmd: RemotingCommand, prof: cProfile.Profile | None) -> tuple[Any, float]:
        """The broker's answer to ``cmd`` and the CPU seconds it took (profiled with ``prof``)."""
        t0 = time.process_time()
        if prof:
            prof.enable()
        answer = await broker.handle(conn, cmd)
        if prof:
            prof.disable()
        return answer, time.process_time() - t0

    async def one(i: int, prof: cProfile.Profile | None) -> float:
        txid = f"bench-{i}"
        answer, half_cpu = await handled(halves(k, txid), prof)
        assert answer is not None and answer.code == 0, answer and answer.remark
        done, end_cpu = await handled(commit(answer, txid), prof)
        assert done is not None and done.code == 0, done and done.remark
        await asyncio.sleep(0)  # the index's turn, as between requests
        return half_cpu + end_cpu

    try:
        for i in range(args.warmup):
            await one(-i - 1, None)
        prof = cProfile.Profile() if args.profile else None
        cpu = 0.0
        for i in range(args.count):
            cpu += await one(i, prof)
    finally:
        await broker.shutdown()
    out = {
        "us_per_txn": round(cpu / args.count * 1e6, 1),
        "us_per_msg": round(cpu / args.count / k * 1e6, 2),
    }
    if prof is not None:
        st: Any = pstats.Stats(prof)
        calls = sum(v[1] for v in st.stats.values())
        out["calls_per_txn"] = round(calls / args.count, 1)
        out["calls_per_msg"] = round(calls / args.count / k, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1, help="halves per transaction")
    ap.add_argument("--count", type=int, default=3000, help="timed transactions")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        cache_logger_on_first_use=True,
    )
    with scratch_dir("txmq-txnhandlers-") as folder:
        out = asyncio.run(run(args, str(folder)))
    for key, v in out.items():
        print(f"{key:16} {v}")


if __name__ == "__main__":
    main()
