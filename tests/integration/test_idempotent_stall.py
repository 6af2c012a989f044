"""A broker stalled longer than the SDK's request timeout (SIGSTOP), then resumed: the SDK's
resends are answered with the first send's result, and every message -- plain, batched, a
committed half -- is delivered once.  Also across SIGKILL and a restart."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import pytest

from tests.support.process import BrokerProcess
from tests.support.raw import RawClient, connected
from txmq.client import (
    AsyncProducer,
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
    TransactionListener,
)
from txmq.protocol.codes import RequestCode
from txmq.protocol.message import MessageConst

pytestmark = pytest.mark.slow

#: The SDK's request timeout, and how long the broker is stopped (longer: every request in
#: flight times out and is sent again while the broker cannot answer).
TIMEOUT_S, STALL_S = 1.0, 1.6


class Commit(TransactionListener):
    def execute_local_transaction(self, message: Any, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


async def _metric(address: str, name: str) -> float:
    async with connected(address) as c:
        resp = await c.call(RequestCode.TXMQ_GET_METRICS)
        return float(json.loads(resp.body).get(name, 0.0))


async def _bodies(address: str, topic: str) -> list[bytes]:
    async with connected(address) as c:
        return sorted(m.body for m in await c.pull_all(topic))


async def _stalled(bp: BrokerProcess, *sends: Any) -> list[Any]:
    """Run ``sends`` (coroutines) while the broker is stopped for STALL_S seconds."""
    assert bp.proc is not None
    os.kill(bp.proc.pid, signal.SIGSTOP)
    try:
        tasks = [asyncio.ensure_future(s) for s in sends]
        # The stall itself: the broker cannot answer for longer than the request timeout.
        await asyncio.sleep(STALL_S)
    finally:
        os.kill(bp.proc.pid, signal.SIGCONT)
    return list(await asyncio.wait_for(asyncio.gather(*tasks), 30))


async def test_a_stall_longer_than_the_request_timeout_delivers_once(tmp_path: Any) -> None:
    bp = BrokerProcess(str(tmp_path / "store"), flush="ASYNC_FLUSH")
    address = bp.start()
    try:
        async with (
            AsyncProducer("stall-p", address, request_timeout=TIMEOUT_S) as p,
            AsyncTransactionProducer(
                "stall-tx", Commit(), address, request_timeout=TIMEOUT_S
            ) as tp,
        ):
            # Topics, routes and connections first, so the stall hits the sends themselves (a
            # send that created its topic makes the next one fetch the route again).
            for _ in range(2):
                await p.send(Message("stall-plain", b"warm"))
                await p.send_batch([Message("stall-batch", b"warm")])
                await tp.send_message_in_transaction(Message("stall-tx", b"warm"))

            async def in_transaction() -> Any:
                async with tp.transaction() as txn:
                    await txn.send(Message("stall-tx", b"half-1"))
                    await txn.send(Message("stall-tx", b"half-2"))

            results = await _stalled(
                bp,
                p.send(Message("stall-plain", b"plain")),
                p.send_batch([Message("stall-batch", f"b{i}".encode()) for i in range(3)]),
                tp.send_message_in_transaction(Message("stall-tx", b"single")),
                in_transaction(),
            )
        assert results[0].msg_id and results[1].msg_id
        assert await _metric(address, "txmq_dedup_hits_total") >= 3, (
            "the SDK did not resend during the stall: the test did not test anything"
        )
        assert await _bodies(address, "stall-plain") == [b"plain", b"warm", b"warm"]
        assert await _bodies(address, "stall-batch") == [b"b0", b"b1", b"b2", b"warm", b"warm"]
        assert await _bodies(address, "stall-tx") == [
            b"half-1",
            b"half-2",
            b"single",
            b"warm",
            b"warm",
        ]
    finally:
        bp.terminate()


async def test_a_resend_after_sigkill_and_restart_is_answered_once(tmp_path: Any) -> None:
    bp = BrokerProcess(str(tmp_path / "store"), flush="SYNC_FLUSH")
    address = bp.start()
    props = {MessageConst.UNIQ_KEY: "0A0000010000AAAA0000000000000001"}
    c = await RawClient.connect(address)
    first = RawClient.send_header(await c.send("killed", b"once", props=props))
    await c.close()
    bp.kill()
    address = bp.start()  # the same port
    try:
        c = await RawClient.connect(address)
        again = RawClient.send_header(await c.send("killed", b"once", props=props, queue_id=2))
        await c.close()
        assert (again.msg_id, again.queue_id, again.queue_offset) == (
            first.msg_id,
            first.queue_id,
            first.queue_offset,
        )
        assert await _bodies(address, "killed") == [b"once"]
        rebuilt = [x for x in bp.log_lines if x.get("event") == "dedup_index_rebuilt"]
        assert rebuilt and rebuilt[-1]["keys"] == 1
    finally:
        bp.terminate()
