"""Remoting POP (RocketMQ 5's remoting pop consumers): POP_MESSAGE, ACK_MESSAGE,
CHANGE_MESSAGE_INVISIBLETIME and BATCH_ACK_MESSAGE against a real broker, the requests built as
RocketMQ's Java client builds them (JSON headers; each message's ``extraInfo`` made from the
answer's header as ``MQClientAPIImpl.processPopResponse`` / ``ExtraInfoUtil`` make it)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Any

from tests.support.brokers import raw_broker
from tests.support.raw import RawClient, connected
from tests.support.waiting import wait_until
from txmq.broker.server import BrokerController
from txmq.broker.sql_filter import SUBSCRIPTION_PARSE_FAILED
from txmq.protocol.codes import RequestCode, ResponseCode, SerializeType
from txmq.protocol.command import RemotingCommand
from txmq.protocol.headers import CreateTopicRequestHeader
from txmq.protocol.message import MessageExt, decode_messages

TOPIC = "pop-remoting"
GROUP = "pop-remoting-consumers"
JSON = SerializeType.JSON
BROKER_NAME = "broker-a"


async def create_topic(c: RawClient, topic: str = TOPIC, queues: int = 2) -> None:
    h = CreateTopicRequestHeader(topic=topic, read_queue_nums=queues, write_queue_nums=queues)
    r = await c.call(RequestCode.UPDATE_AND_CREATE_TOPIC, h.to_ext_fields())
    assert r.code == ResponseCode.SUCCESS, r.remark


async def pop(
    c: RawClient, n: int, invisible_ms: int = 60_000, poll_ms: int = 0, **extra: Any
) -> tuple[RemotingCommand, list[MessageExt]]:
    ext = {
        "consumerGroup": GROUP,
        "topic": TOPIC,
        "queueId": -1,
        "maxMsgNums": n,
        "invisibleTime": invisible_ms,
        "pollTime": poll_ms,
        "bornTime": int(time.time() * 1000),
        "initMode": 0,
        "expType": "TAG",
        "exp": "*",
        **extra,
    }
    r = await c.call(RequestCode.POP_MESSAGE, {k: str(v) for k, v in ext.items()}, b"", JSON)
    msgs = decode_messages(r.body) if r.code == ResponseCode.SUCCESS and r.body else []
    return r, msgs


def parse_info(info: str) -> dict[str, list[int]]:
    """``ExtraInfoUtil.parseMsgOffsetInfo`` / ``parseStartOffsetInfo``: "retry queueId
    offsets;..." by "retry@queueId"."""
    out = {}
    for one in info.split(";"):
        retry, qid, offsets = one.split(" ")
        out[f"{retry}@{qid}"] = [int(o) for o in offsets.split(",")]
    return out


def extra_infos(r: RemotingCommand, msgs: list[MessageExt]) -> dict[bytes, str]:
    """Each message's extraInfo, as the Java client builds it from the answer."""
    h = r.ext_fields
    starts = parse_info(h["startOffsetInfo"])
    offsets = parse_info(h["msgOffsetInfo"])
    out = {}
    for m in msgs:
        key = f"0@{m.queue_id}"
        same_queue = sorted(x.queue_offset for x in msgs if x.queue_id == m.queue_id)
        assert offsets[key][same_queue.index(m.queue_offset)] == m.queue_offset, (h, m)
        out[m.body] = " ".join(
            str(x)
            for x in (
                starts[key][0],
                h["popTime"],
                h["invisibleTime"],
                h["reviveQid"],
                0,
                BROKER_NAME,
                m.queue_id,
                m.queue_offset,
            )
        )
    return out


async def pop_all(
    c: RawClient, n: int, answered: Callable[[RemotingCommand], None] | None = None
) -> tuple[list[MessageExt], dict[bytes, str]]:
    """POP_MESSAGE until ``n`` messages came (each answer given to ``answered``): the messages
    and their extraInfo by body."""
    got: list[MessageExt] = []
    infos: dict[bytes, str] = {}

    async def all_in() -> bool:
        r, msgs = await pop(c, n - len(got), poll_ms=200)
        if answered is not None:
            answered(r)
        if msgs:
            infos.update(extra_infos(r, msgs))
        got.extend(msgs)
        return len(got) >= n

    await wait_until(all_in, 20, f"{n} messages popped")
    return got, infos


async def ack(c: RawClient, m: MessageExt, extra_info: str) -> RemotingCommand:
    ext = {
        "consumerGroup": GROUP,
        "topic": TOPIC,
        "queueId": str(m.queue_id),
        "extraInfo": extra_info,
        "offset": str(m.queue_offset),
    }
    return await c.call(RequestCode.ACK_MESSAGE, ext, b"", JSON)


async def test_pop_ack_change_invisible_and_batch_ack(broker: BrokerController) -> None:
    async with connected(broker.address) as c:
        await create_topic(c)
        bodies = [f"p{i}".encode() for i in range(5)]
        for i, b in enumerate(bodies):
            r = await c.send(TOPIC, b, queue_id=i % 2)
            assert r.code == ResponseCode.SUCCESS, r.remark

        def answered(r: RemotingCommand) -> None:
            assert r.code in (ResponseCode.SUCCESS, ResponseCode.POLLING_TIMEOUT), r.remark
            for k in ("popTime", "invisibleTime", "reviveQid", "restNum"):
                assert k in r.ext_fields, f"{k} missing from {r.ext_fields}"

        got, infos = await pop_all(c, 5, answered)
        by = {m.body: m for m in got}
        assert sorted(by) == bodies
        assert all(m.reconsume_times == 0 for m in got)

        # ack p0; p1 visible again in 1 s (a new popTime: its old extraInfo no longer acks it)
        assert (await ack(c, by[b"p0"], infos[b"p0"])).code == ResponseCode.SUCCESS
        ext = {
            "consumerGroup": GROUP,
            "topic": TOPIC,
            "queueId": str(by[b"p1"].queue_id),
            "extraInfo": infos[b"p1"],
            "offset": str(by[b"p1"].queue_offset),
            "invisibleTime": "1000",
        }
        r = await c.call(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, ext, b"", JSON)
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert r.ext_fields["invisibleTime"] == "1000" and "popTime" in r.ext_fields
        old = await ack(c, by[b"p1"], infos[b"p1"])
        assert old.code == ResponseCode.NO_MESSAGE, (old.code, old.remark)
        assert "expired" in (old.remark or ""), old.remark

        again: list[MessageExt] = []
        again_info: dict[bytes, str] = {}

        async def p1_again() -> bool:
            r, msgs = await pop(c, 5, poll_ms=200)
            if msgs:
                again_info.update(extra_infos(r, msgs))
            again.extend(msgs)
            return bool(again)

        await wait_until(p1_again, 20, "p1 popped again after its 1 s")
        assert [(m.body, m.reconsume_times) for m in again] == [(b"p1", 1)], again
        assert (await ack(c, again[0], again_info[b"p1"])).code == ResponseCode.SUCCESS

        # p2, p3, p4 acked in one BATCH_ACK_MESSAGE, per queue a BitSet from its first offset
        acks = []
        for qid in (0, 1):
            rest = [by[b] for b in (b"p2", b"p3", b"p4") if by[b].queue_id == qid]
            if not rest:
                continue
            start = min(m.queue_offset for m in rest)
            bits = 0
            for m in rest:
                bits |= 1 << (m.queue_offset - start)
            raw = bits.to_bytes((bits.bit_length() + 7) // 8, "little")
            pop_time = infos[rest[0].body].split(" ")[1]
            acks.append(
                {
                    "c": GROUP,
                    "t": TOPIC,
                    "r": "0",
                    "so": start,
                    "q": qid,
                    "rq": 0,
                    "pt": int(pop_time),
                    "it": 60000,
                    "b": base64.b64encode(raw).decode(),
                }
            )
        body = json.dumps({"brokerName": BROKER_NAME, "acks": acks}).encode()
        r = await c.call(RequestCode.BATCH_ACK_MESSAGE, {}, body, JSON)
        assert r.code == ResponseCode.SUCCESS and not r.remark, (r.code, r.remark)

        # everything acked: the group's committed offsets are the queues' ends
        for qid in (0, 1):
            end = broker.store.get_max_offset_in_queue(TOPIC, qid)
            assert broker.offsets.query(GROUP, TOPIC, qid) == end, qid
        r, msgs = await pop(c, 5)
        assert (r.code, msgs) == (ResponseCode.PULL_NOT_FOUND, []), r.remark


async def test_pop_refuses_a_bad_filter_and_a_bad_invisible_time(make_broker_config: Any) -> None:
    async with raw_broker(make_broker_config(enable_property_filter=False)) as (broker, c):
        await create_topic(c)
        r, _ = await pop(c, 1, invisible_ms=10)
        assert r.code == ResponseCode.INVALID_PARAMETER and "invisibleTime" in (r.remark or "")
        r, _ = await pop(c, 1, expType="SQL92", exp="a >")
        assert r.code == ResponseCode.SYSTEM_ERROR, (r.code, r.remark)
        assert "does not support consumer to filter message by SQL92" in (r.remark or "")
        r, _ = await pop(c, 1, queueId=7)
        assert r.code == ResponseCode.INVALID_PARAMETER and "queueId 7" in (r.remark or "")
        bad = await c.call(
            RequestCode.ACK_MESSAGE,
            {
                "consumerGroup": GROUP,
                "topic": TOPIC,
                "queueId": "0",
                "extraInfo": "nonsense",
                "offset": "0",
            },
            b"",
            JSON,
        )
        assert bad.code == ResponseCode.INVALID_PARAMETER and "extraInfo" in (bad.remark or "")
        # the broker goes on serving
        assert (await c.send(TOPIC, b"still", queue_id=0)).code == ResponseCode.SUCCESS


async def test_pop_sql_filter(make_broker_config: Any) -> None:
    async with raw_broker(make_broker_config(enable_property_filter=True)) as (b, c):
        await create_topic(c, queues=1)
        for i in range(4):
            r = await c.send(TOPIC, f"s{i}".encode(), props={"n": str(i)})
            assert r.code == ResponseCode.SUCCESS
        got: list[MessageExt] = []

        async def two() -> bool:
            _, msgs = await pop(c, 4, poll_ms=200, expType="SQL92", exp="n >= 2")
            got.extend(msgs)
            return len(got) >= 2

        await wait_until(two, 20, "the two messages the filter keeps")
        assert sorted(m.body for m in got) == [b"s2", b"s3"]
        r, _ = await pop(c, 1, expType="SQL92", exp="n >")
        assert r.code == SUBSCRIPTION_PARSE_FAILED, (r.code, r.remark)
