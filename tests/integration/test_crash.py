"""Durability by killing the broker process (SIGKILL) and starting it again."""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest

from tests.support.brokers import started
from tests.support.process import BrokerProcess
from tests.support.raw import RawClient
from tests.support.waiting import wait_until
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.errors import TxmqError
from txmq.protocol.headers import CheckTransactionStateRequestHeader, EndTransactionRequestHeader
from txmq.protocol.message import MessageConst, decode_message

pytestmark = pytest.mark.slow

COMMIT, ROLLBACK = 8, 12


async def _load(address: str, acked: list[bytes], stop: asyncio.Event, worker: int) -> None:
    try:
        c = await RawClient.connect(address)
    except TxmqError:
        return
    i = 0
    try:
        while not stop.is_set():
            body = f"w{worker}-{i}".encode()
            try:
                r = await c.send("durable", body, queue_id=i % 4)
            except TxmqError:
                return
            if r.code == ResponseCode.SUCCESS:
                acked.append(body)
            i += 1
    finally:
        c.conn.close()


@pytest.mark.parametrize("flush", ["SYNC_FLUSH", "ASYNC_FLUSH"])
@pytest.mark.parametrize("seed", [1, 2])
async def test_sigkill_under_load_loses_no_acknowledged_message(tmp_path, flush, seed):
    rnd = random.Random(seed)
    bp = BrokerProcess(
        str(tmp_path / "store"),
        flush=flush,
        settings={"mappedFileSizeCommitLog": 256 * 1024, "maxMessageSize": 65536},
    )
    address = bp.start()
    acked: list[bytes] = []
    stop = asyncio.Event()
    workers = [asyncio.ensure_future(_load(address, acked, stop, w)) for w in range(4)]
    # SIGKILL at a random moment of the load: after a random 0.5-1.5 s of sending, and not
    # before more than 50 sends were acknowledged (however slow the machine), so the check
    # below has something to find.
    started, run_for = time.monotonic(), rnd.uniform(0.5, 1.5)
    await wait_until(
        lambda: len(acked) > 50 and time.monotonic() - started >= run_for,
        60,
        f"more than 50 acknowledged sends and {run_for:.2f}s of load",
    )
    bp.kill()
    stop.set()
    await asyncio.gather(*workers, return_exceptions=True)
    assert len(acked) > 50
    bp.port = int(address.rpartition(":")[2])
    address = bp.start()
    try:
        c = await RawClient.connect(address)
        got = [m.body for m in await c.pull_all("durable")]
        await c.close()
        assert len(got) == len(set(got)), "a message is stored twice"
        missing = set(acked) - set(got)
        assert not missing, f"{len(missing)} acknowledged messages lost"
        recovered = [line for line in bp.log_lines if line.get("event") == "store_recovered"]
        assert recovered
    finally:
        bp.terminate()


class Decider:
    """Answers checks with the decision encoded in the body: b'c:...' commit, b'r:...'
    rollback."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.client: RawClient | None = None
        self.checks = 0

    async def handler(self, conn, cmd):
        if cmd.code != RequestCode.CHECK_TRANSACTION_STATE:
            return None
        self.checks += 1
        h = CheckTransactionStateRequestHeader.from_ext_fields(cmd.ext_fields)
        body = decode_message(cmd.body).body
        decision = COMMIT if body.startswith(b"c:") else ROLLBACK
        eh = EndTransactionRequestHeader(
            producer_group=self.group,
            tran_state_table_offset=h.tran_state_table_offset,
            commit_log_offset=h.commit_log_offset,
            commit_or_rollback=decision,
            from_transaction_check=True,
            msg_id=h.msg_id,
            transaction_id=h.transaction_id,
        )
        assert self.client is not None, "connect the client before checks arrive"
        asyncio.get_running_loop().create_task(
            self.client.call(RequestCode.END_TRANSACTION, eh.to_ext_fields())
        )
        return cmd.response()


async def _tx_load(
    address: str, outcome: dict[bytes, str], stop: asyncio.Event, worker: int, rnd: random.Random
) -> None:
    try:
        c = await RawClient.connect(address)
    except TxmqError:
        return
    i = 0
    try:
        while not stop.is_set():
            commit = rnd.random() < 0.5
            body = f"{'c' if commit else 'r'}:w{worker}-{i}".encode()
            i += 1
            try:
                half = await c.send("txload", body, group="txg", transactional=True, queue_id=i % 4)
                if half.code != ResponseCode.SUCCESS:
                    continue
                outcome[body] = "pending"
                r = await c.end_transaction("txg", half, COMMIT if commit else ROLLBACK)
            except TxmqError:
                return
            if r is not None and r.code == ResponseCode.SUCCESS:
                outcome[body] = "commit" if commit else "rollback"
    finally:
        c.conn.close()


@pytest.mark.parametrize(
    ("seed", "snapshot_ms"),
    [(3, 60_000), (4, 60_000), (5, 200)],  # the last one restarts from a snapshot plus the tail
)
async def test_sigkill_under_transactional_load(tmp_path, seed, snapshot_ms):
    rnd = random.Random(seed)
    bp = BrokerProcess(
        str(tmp_path / "store"),
        flush="SYNC_FLUSH",
        settings={
            "mappedFileSizeCommitLog": 256 * 1024,
            "maxMessageSize": 65536,
            "transactionTimeOut": 0,
            "transactionCheckInterval": 100,
            "transactionSnapshotInterval": snapshot_ms,
        },
    )
    address = bp.start()
    outcome: dict[bytes, str] = {}
    stop = asyncio.Event()
    workers = [asyncio.ensure_future(_tx_load(address, outcome, stop, w, rnd)) for w in range(4)]
    snap = tmp_path / "store" / "transaction" / "snapshot.msgpack"

    def decided() -> int:
        return sum(1 for v in outcome.values() if v != "pending")

    # SIGKILL at a random moment of the load: after a random 0.5-1.5 s of transactions, once
    # more than 20 were decided and (for the snapshot variant) a snapshot was written.
    started, run_for = time.monotonic(), rnd.uniform(0.5, 1.5)
    await wait_until(
        lambda: (
            decided() > 20
            and (snapshot_ms >= 1000 or snap.exists())
            and time.monotonic() - started >= run_for
        ),
        60,
        f"more than 20 decided transactions, a snapshot if due, and {run_for:.2f}s of load",
    )
    bp.kill()
    stop.set()
    await asyncio.gather(*workers, return_exceptions=True)
    assert decided() > 20
    if snapshot_ms < 1000:
        assert snap.exists(), "the restart starts from a snapshot plus the tail"
    address = bp.start()
    try:
        d = Decider("txg")
        d.client = await RawClient.connect(address, d.handler)
        await d.client.heartbeat(producer_groups=["txg"])

        # pending halves get checked after the restart and resolved by the body's intent
        async def none_pending() -> bool:
            assert d.client is not None
            pending = (await d.client.call(RequestCode.TXMQ_LIST_TRANSACTIONS, {})).body
            return pending == b"[]"

        await wait_until(none_pending, 60, "every pending half resolved by its check-back")
        got = [m.body for m in await d.client.pull_all("txload")]
        assert len(got) == len(set(got)), "a transaction was committed twice"
        for body, state in outcome.items():
            if state == "commit":
                assert body in got, f"acknowledged commit {body!r} lost"
            elif state == "rollback":
                assert body not in got, f"acknowledged rollback {body!r} delivered"
        assert all(b.startswith(b"c:") for b in got), "a rollback intent was delivered"
        await d.client.close()
    finally:
        bp.terminate()


async def test_kill_mid_commit_of_a_multi_message_transaction_is_completed(make_broker_config):
    """Cut the commit log right after the op record, as a crash in the middle of the commit's
    append would; the restarted broker must deliver all of the transaction's messages."""
    cfg = make_broker_config()
    b = BrokerController(cfg)
    await b.start()
    c = await RawClient.connect(b.address)
    txid = "TX-CUT"
    halves = [
        await c.send(
            "multi",
            f"m{q}".encode(),
            group="g",
            transactional=True,
            queue_id=q,
            props={MessageConst.TRANSACTION_ID: txid},
        )
        for q in range(4)
    ]
    assert (await c.end_transaction("g", halves[0], COMMIT, txid=txid)).code == 0
    delivered = await c.pull_all("multi")
    assert len(delivered) == 4
    first_real = min(m.commit_log_offset for m in delivered)
    await c.close()
    await b.shutdown()
    # zero the commit log from the first committed message on (the op record stays)
    seg_dir = os.path.join(cfg.store_path_root_dir, "commitlog")
    segs = sorted(os.listdir(seg_dir))
    seg = max(s for s in segs if int(s) <= first_real)
    path = os.path.join(seg_dir, seg)
    with open(path, "r+b") as fh:
        fh.seek(first_real - int(seg))
        fh.write(b"\0" * (os.path.getsize(path) - (first_real - int(seg))))
    for s in segs:
        if int(s) > int(seg):
            os.remove(os.path.join(seg_dir, s))
    async with started(cfg) as b:
        assert b.recovery["transactions"]["repaired"] == 4
        c = await RawClient.connect(b.address)
        again = await c.pull_all("multi")
        assert sorted(m.body for m in again) == [b"m0", b"m1", b"m2", b"m3"]
        assert (await c.end_transaction("g", halves[1], COMMIT, txid=txid)).code == 0
        assert len(await c.pull_all("multi")) == 4
        await c.close()
