"""Transactions on the broker, driven over the wire without the SDK."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable

import pytest

from tests.support.brokers import started
from tests.support.raw import RawClient
from tests.support.waiting import rounds_pass, wait_until
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.headers import CheckTransactionStateRequestHeader, EndTransactionRequestHeader
from txmq.protocol.message import MessageConst, decode_message

COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0
G = "tx-group"


async def restart(ctl: BrokerController) -> BrokerController:
    await ctl.shutdown()
    new = BrokerController(ctl.config)
    await new.start()
    return new


@pytest.fixture
async def ctl(make_broker_config):
    c = BrokerController(make_broker_config(transaction_check_interval=60_000))
    await c.start()
    holder = {"ctl": c}
    yield holder
    await holder["ctl"].shutdown()


async def test_commit_makes_the_message_visible_once_with_its_real_topic(ctl):
    c = await RawClient.connect(ctl["ctl"].address)
    half = await c.send(
        "orders",
        b"paid",
        group=G,
        transactional=True,
        queue_id=1,
        props={"TAGS": "t", "KEYS": "k1", "region": "eu"},
    )
    h = c.send_header(half)
    assert h.transaction_id and h.queue_id == 1
    assert await c.pull_all("orders") == []  # invisible before the decision
    resp = await c.end_transaction(G, half, COMMIT)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    [m] = await c.pull_all("orders")
    assert (m.topic, m.queue_id, m.body, m.tags, m.keys) == ("orders", 1, b"paid", "t", "k1")
    assert m.user_properties == {"region": "eu"}
    assert m.msg_id == h.transaction_id  # UNIQ_KEY kept
    for k in (MessageConst.REAL_TOPIC, MessageConst.REAL_QID, MessageConst.TRAN_MSG):
        assert k not in m.properties
    assert m.sys_flag & 0xC == 0x8
    # the same decision again: same answer, no second copy
    again = await c.end_transaction(G, half, COMMIT)
    assert (
        again.code == ResponseCode.SUCCESS
        and again.remark is not None
        and "already" in again.remark
    )
    assert len(await c.pull_all("orders")) == 1
    # a contradicting decision is refused and changes nothing
    contra = await c.end_transaction(G, half, ROLLBACK)
    assert (
        contra.code == ResponseCode.ILLEGAL_OPERATION
        and contra.remark is not None
        and "COMMITTED" in contra.remark
    )
    await c.close()
    ctl["ctl"] = await restart(ctl["ctl"])
    c = await RawClient.connect(ctl["ctl"].address)
    assert (await c.end_transaction(G, half, ROLLBACK)).code == ResponseCode.ILLEGAL_OPERATION
    assert (await c.end_transaction(G, half, COMMIT)).code == ResponseCode.SUCCESS
    assert len(await c.pull_all("orders")) == 1
    await c.close()


async def test_rollback_is_never_delivered_also_after_restart(ctl):
    c = await RawClient.connect(ctl["ctl"].address)
    half = await c.send("orders", b"x", group=G, transactional=True)
    assert (await c.end_transaction(G, half, ROLLBACK)).code == ResponseCode.SUCCESS
    assert (await c.end_transaction(G, half, COMMIT)).code == ResponseCode.ILLEGAL_OPERATION
    await c.close()
    ctl["ctl"] = await restart(ctl["ctl"])
    c = await RawClient.connect(ctl["ctl"].address)
    assert (await c.end_transaction(G, half, COMMIT)).code == ResponseCode.ILLEGAL_OPERATION
    assert await c.pull_all("orders") == []
    await c.close()


async def test_unknown_changes_nothing(ctl):
    c = await RawClient.connect(ctl["ctl"].address)
    half = await c.send("orders", b"x", group=G, transactional=True)
    assert (await c.end_transaction(G, half, UNKNOWN)).code == ResponseCode.SUCCESS
    assert len(ctl["ctl"].transactions.pending) == 1
    await c.close()


async def test_mismatched_end_transaction_names_the_reason(ctl):
    c = await RawClient.connect(ctl["ctl"].address)
    half = await c.send("orders", b"x", group=G, transactional=True)
    r = await c.end_transaction("other-group", half, COMMIT)
    assert (
        r.code == ResponseCode.SYSTEM_ERROR
        and r.remark is not None
        and "producer group wrong" in r.remark
    )
    h = c.send_header(half)
    r = await c.end_transaction(G, half, COMMIT, tran_state_table_offset=h.queue_offset + 5)
    assert (
        r.code == ResponseCode.SYSTEM_ERROR
        and r.remark is not None
        and "state table offset wrong" in r.remark
    )
    r = await c.end_transaction(G, half, COMMIT, commit_log_offset=123456)
    assert (
        r.code == ResponseCode.SYSTEM_ERROR
        and r.remark is not None
        and "commit log offset wrong" in r.remark
    )
    r = await c.end_transaction(G, half, COMMIT, transaction_id="nope", commit_log_offset=999_999)
    assert (
        r.code == ResponseCode.SYSTEM_ERROR and r.remark is not None and "Find prepared" in r.remark
    )
    assert await c.pull_all("orders") == []  # nothing was decided
    assert (await c.end_transaction(G, half, COMMIT)).code == ResponseCode.SUCCESS
    await c.close()


async def test_oneway_end_transaction_is_accepted(ctl):
    c = await RawClient.connect(ctl["ctl"].address)
    half = await c.send("orders", b"x", group=G, transactional=True)
    await c.end_transaction_oneway(G, half, COMMIT)
    # no answer to wait for: wait until the commit shows
    got = await wait_until(lambda: c.pull_all("orders"), what="the oneway commit to deliver")
    assert len(got) == 1
    await c.close()


async def test_reject_transaction_message(make_broker_config):
    async with started(make_broker_config(reject_transaction_message=True)) as b:
        c = await RawClient.connect(b.address)
        r = await c.send("orders", b"x", group=G, transactional=True)
        assert r.code == ResponseCode.NO_PERMISSION
        await c.close()


async def test_multi_message_transaction_is_all_or_nothing(ctl):
    c = await RawClient.connect(ctl["ctl"].address)
    txid = "TX-MULTI-1"
    halves = [
        await c.send(
            "orders",
            f"m{q}".encode(),
            group=G,
            transactional=True,
            queue_id=q,
            props={MessageConst.TRANSACTION_ID: txid},
        )
        for q in range(4)
    ]
    assert all(c.send_header(h).transaction_id == txid for h in halves)
    assert await c.pull_all("orders") == []
    r = await c.end_transaction(G, halves[2], COMMIT, txid=txid)
    assert r.code == ResponseCode.SUCCESS
    got = await c.pull_all("orders")
    assert sorted(m.body for m in got) == [b"m0", b"m1", b"m2", b"m3"]
    # a late message cannot join a decided transaction
    late = await c.send(
        "orders", b"late", group=G, transactional=True, props={MessageConst.TRANSACTION_ID: txid}
    )
    assert late.code == ResponseCode.ILLEGAL_OPERATION
    await c.close()


async def test_decide_batch_commits_listed_and_rolls_back_the_rest(ctl):
    c = await RawClient.connect(ctl["ctl"].address)
    sends = {}
    for name in ["a", "b", "orphan"]:
        sends[name] = await c.send(
            "sink",
            name.encode(),
            group="spark-g",
            transactional=True,
            props={MessageConst.TRANSACTION_ID: f"batch7-{name}", MessageConst.TXMQ_BATCH_KEY: "7"},
        )
    body = json.dumps({"commit": ["batch7-a", "batch7-b"]}).encode()
    hdr = {"producerGroup": "spark-g", "batchKey": "7"}
    r = await c.call(RequestCode.TXMQ_DECIDE_BATCH, hdr, body)
    doc = json.loads(r.body)
    assert doc["first"] and doc["committed"] == ["batch7-a", "batch7-b"]
    assert doc["rolledBack"] == ["batch7-orphan"]
    assert sorted(m.body for m in await c.pull_all("sink")) == [b"a", b"b"]
    # asking again (even with another list) returns the first decision
    r2 = await c.call(RequestCode.TXMQ_DECIDE_BATCH, hdr, json.dumps({"commit": []}).encode())
    doc2 = json.loads(r2.body)
    assert not doc2["first"] and doc2["committed"] == doc["committed"]
    # a zombie attempt writing into the decided batch is refused
    z = await c.send(
        "sink",
        b"zombie",
        group="spark-g",
        transactional=True,
        props={MessageConst.TRANSACTION_ID: "batch7-z", MessageConst.TXMQ_BATCH_KEY: "7"},
    )
    assert z.code == ResponseCode.ILLEGAL_OPERATION
    await c.close()
    ctl["ctl"] = await restart(ctl["ctl"])
    c = await RawClient.connect(ctl["ctl"].address)
    r3 = await c.call(RequestCode.TXMQ_DECIDE_BATCH, hdr, body)
    assert json.loads(r3.body)["committed"] == ["batch7-a", "batch7-b"]
    assert sorted(m.body for m in await c.pull_all("sink")) == [b"a", b"b"]
    await c.close()


class CheckingProducer:
    """A producer connection that answers checks with a scripted decision."""

    def __init__(self, decision: int | None) -> None:
        self.decision = decision
        self.checks: list[CheckTransactionStateRequestHeader] = []
        self.client: RawClient | None = None

    async def handler(self, conn, cmd):
        if cmd.code != RequestCode.CHECK_TRANSACTION_STATE:
            return None
        h = CheckTransactionStateRequestHeader.from_ext_fields(cmd.ext_fields)
        self.checks.append(h)
        msg = decode_message(cmd.body)
        assert msg.topic == "orders"  # real topic restored for the listener
        if self.decision is not None:
            asyncio.get_running_loop().create_task(self._answer(h))
        return cmd.response()

    async def _answer(self, h):
        assert self.decision is not None, "only a scripted decision is sent"
        eh = EndTransactionRequestHeader(
            producer_group=G,
            tran_state_table_offset=h.tran_state_table_offset,
            commit_log_offset=h.commit_log_offset,
            commit_or_rollback=self.decision,
            from_transaction_check=True,
            msg_id=h.msg_id,
            transaction_id=h.transaction_id,
        )
        assert self.client is not None
        await self.client.call(RequestCode.END_TRANSACTION, eh.to_ext_fields())

    async def connect(self, address: str) -> RawClient:
        self.client = await RawClient.connect(address, self.handler)
        await self.client.heartbeat(producer_groups=[G])
        return self.client


async def _half(c: RawClient) -> tuple[RemotingCommand, str]:
    """A half of group ``G`` in ``orders``: the answer and its transaction id."""
    half = await c.send("orders", b"x", group=G, transactional=True)
    txid = c.send_header(half).transaction_id
    assert txid is not None
    return half, txid


def _checked_often(
    make_broker_config: Callable[..., BrokerConfig], check_max: int
) -> contextlib.AbstractAsyncContextManager[BrokerController]:
    """A broker that checks every half at once, every 50 ms, at most ``check_max`` times."""
    return started(
        make_broker_config(
            transaction_time_out=0, transaction_check_interval=50, transaction_check_max=check_max
        )
    )


async def test_check_back_commit_and_no_checks_after_the_decision(make_broker_config):
    async with started(
        make_broker_config(transaction_time_out=200, transaction_check_interval=100)
    ) as b:
        p = CheckingProducer(COMMIT)
        c = await p.connect(b.address)
        half = await c.send("orders", b"x", group=G, transactional=True)
        await wait_until(lambda: len(p.checks) >= 1)
        await wait_until(lambda: not b.transactions.pending)
        assert len(await c.pull_all("orders")) == 1
        await rounds_pass(lambda: b.transactions.rounds, 5)
        assert len(p.checks) == 1  # zero checks for a decided transaction
        assert c.send_header(half).transaction_id == p.checks[0].transaction_id
        await c.close()


async def test_unknown_forever_uses_exactly_the_budget_then_parks_and_resumes(make_broker_config):
    async with _checked_often(make_broker_config, check_max=3) as b:
        p = CheckingProducer(UNKNOWN)
        c = await p.connect(b.address)
        half, txid = await _half(c)
        await wait_until(lambda: b.transactions.records[txid].state.value == "DISCARDED")
        assert len(p.checks) == 3
        _, parked = await c.pull("TRANS_CHECK_MAX_TIME_TOPIC", 0, 0)
        assert [m.transaction_id for m in parked] == [txid]
        r = await c.call(RequestCode.RESUME_CHECK_HALF_MESSAGE, {"msgId": parked[0].offset_msg_id})
        assert r.code == ResponseCode.SUCCESS, r.remark
        await wait_until(lambda: len(p.checks) >= 4)
        p.decision = COMMIT
        await wait_until(lambda: b.transactions.records[txid].state.value == "COMMITTED")
        assert len(await c.pull_all("orders")) == 1
        await c.close()


async def test_no_producer_online_keeps_the_budget(make_broker_config):
    async with _checked_often(make_broker_config, check_max=2) as b:
        c = await RawClient.connect(b.address)  # sends, but registers no producer group
        half, txid = await _half(c)
        await rounds_pass(lambda: b.transactions.rounds, 10)  # nobody to ask
        rec = b.transactions.records[txid]
        assert rec.state.value == "PENDING" and rec.check_times == 0
        p = CheckingProducer(COMMIT)
        pc = await p.connect(b.address)
        await wait_until(lambda: rec.state.value == "COMMITTED")
        assert len(p.checks) == 1
        await pc.close()
        await c.close()


async def test_immunity_delays_the_first_check(make_broker_config):
    now = [time.time()]  # the broker's clock, moved by the test
    async with started(
        make_broker_config(transaction_time_out=0, transaction_check_interval=50),
        clock=lambda: now[0],
    ) as b:
        p = CheckingProducer(COMMIT)
        c = await p.connect(b.address)
        await c.send(
            "orders",
            b"x",
            group=G,
            transactional=True,
            props={MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS: "1"},
        )
        await rounds_pass(lambda: b.transactions.rounds, 5)
        assert p.checks == []  # 5 rounds, and the broker's clock has not moved: immune
        now[0] += 1.5
        await wait_until(lambda: len(p.checks) == 1)
        await c.close()


async def test_operator_force_decide_and_listing(ctl):
    b = ctl["ctl"]
    c = await RawClient.connect(b.address)
    half, txid = await _half(c)
    listed = json.loads((await c.call(RequestCode.TXMQ_LIST_TRANSACTIONS, {})).body)
    assert [t["transactionId"] for t in listed] == [txid]
    assert listed[0]["halves"][0]["topic"] == "orders"
    r = await c.call(
        RequestCode.TXMQ_FORCE_DECIDE, {"transactionId": txid, "commitOrRollback": ROLLBACK}
    )
    assert r.code == ResponseCode.SUCCESS
    r = await c.end_transaction(G, half, COMMIT)
    assert r.code == ResponseCode.ILLEGAL_OPERATION
    shown = json.loads(
        (await c.call(RequestCode.TXMQ_GET_TRANSACTION, {"transactionId": txid})).body
    )
    assert shown["state"] == "ROLLED_BACK" and shown["decidedBy"] == "operator"
    await c.close()
