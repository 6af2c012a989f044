"""What each message property docs/compatibility.md calls *served* does, tried on a running
broker: one probe per property sends a message carrying it (or makes the broker set it) and
checks the effect the table names, or the refusal it documents.
``tests/broker/test_property_audit.py`` runs one per served property and fails for a served
property without a probe."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from tests.support.brokers import stored
from tests.support.decisions import now_ms
from tests.support.raw import RawClient
from tests.support.waiting import wait_until
from txmq.broker.delivery import (
    TIMER_DEL_UNIQKEY,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
)
from txmq.broker.server import BrokerController
from txmq.broker.topics import TIMER_TOPIC
from txmq.protocol.aio import Connection
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import (
    MessageConst,
    MessageExt,
    MessageSysFlag,
    decode_message,
    decode_messages,
    properties_to_string,
)
from txmq.protocol.topics import SCHEDULE_TOPIC

C = MessageConst
TOPIC = "audit-served"
#: The broker's levels in the tests (tests/conftest.py): level 10 is 1 s.
LEVEL, LEVEL_MS = 10, 1000
FAR_FUTURE = 4_102_444_800_000
SHARDING_KEY = "__SHARDINGKEY"
COMMIT, ROLLBACK = 8, 12

Probe = Callable[[BrokerController, RawClient], Awaitable[None]]


def ok(resp: RemotingCommand) -> RemotingCommand:
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    return resp


async def half(c: RawClient, body: bytes, props: dict[str, str] | None = None) -> RemotingCommand:
    """A half of producer group ``audit-tx`` in the topic (``props``: its properties), stored
    (the send answered SUCCESS)."""
    return ok(await c.send(TOPIC, body, props=props, group="audit-tx", transactional=True))


async def in_topic(c: RawClient, topic: str = TOPIC, **kw: Any) -> list[MessageExt]:
    return await c.pull_all(topic, queues=1, **kw)


async def _keys(b: BrokerController, c: RawClient) -> None:
    ok(await c.send(TOPIC, b"keyed", props={C.KEYS: "order-7 order-8"}))

    async def found() -> list[MessageExt]:
        ext = {"topic": TOPIC, "key": "order-8", "maxNum": 4, "beginTimestamp": 0}
        resp = await c.call(RequestCode.QUERY_MESSAGE, dict(ext, endTimestamp=FAR_FUTURE))
        return decode_messages(resp.body) if resp.code == ResponseCode.SUCCESS else []

    got = await wait_until(found, 10, "the message found by its second key")
    assert [m.body for m in got] == [b"keyed"]


async def _tags(b: BrokerController, c: RawClient) -> None:
    ok(await c.send(TOPIC, b"a", props={C.TAGS: "TagA"}))
    ok(await c.send(TOPIC, b"b", props={C.TAGS: "TagB"}))
    assert [m.body for m in await in_topic(c, expression="TagA")] == [b"a"]
    assert [m.body for m in await in_topic(c, expression="TagA || TagB")] == [b"a", b"b"]


async def _delay(b: BrokerController, c: RawClient) -> None:
    before = now_ms()
    ok(await c.send(TOPIC, b"later", props={C.DELAY: str(LEVEL)}))
    assert [m.body for m in stored(b, SCHEDULE_TOPIC)] == [b"later"]
    got = await wait_until(lambda: in_topic(c), 10, "the delayed message delivered")
    assert [m.body for m in got] == [b"later"]
    assert got[0].store_timestamp >= before + LEVEL_MS, "delivered before its level's delay"
    bad = await c.send(TOPIC, b"x", props={C.DELAY: "soon"})
    assert bad.code == ResponseCode.MESSAGE_ILLEGAL and "DELAY" in (bad.remark or "")


async def _sent_back(b: BrokerController, c: RawClient) -> None:
    """RETRY_TOPIC and ORIGIN_MESSAGE_ID: a message sent back is copied to the group's retry
    topic, then to its dead-letter topic, both copies naming the topic and message."""
    sent = RawClient.send_header(await c.send(TOPIC, b"failing"))
    [orig] = await in_topic(c)
    for delay_level, topic in ((1, "%RETRY%audit-g"), (-1, "%DLQ%audit-g")):
        ext = {
            "group": "audit-g",
            "offset": orig.commit_log_offset,
            "delayLevel": delay_level,
            "originTopic": TOPIC,
            "originMsgId": sent.msg_id,
        }
        ok(await c.call(RequestCode.CONSUMER_SEND_MSG_BACK, ext))
        copies: list[MessageExt] = await wait_until(
            partial(stored, b, topic), 10, f"the copy in {topic}"
        )
        [copy] = copies
        assert copy.body == b"failing"
        assert copy.properties[C.RETRY_TOPIC] == TOPIC, copy.properties
        assert copy.properties[C.ORIGIN_MESSAGE_ID] == sent.msg_id, copy.properties


async def _real_topic_and_queue(b: BrokerController, c: RawClient) -> None:
    """Set on timer (and delayed, half) messages, and where their copy is delivered."""
    ok(await c.send(TOPIC, b"timed", props={TIMER_DELAY_MS: "300"}, queue_id=1))
    [held] = [m for m in stored(b, TIMER_TOPIC) if m.queue_id == 0]
    assert (held.properties[C.REAL_TOPIC], held.properties[C.REAL_QID]) == (TOPIC, "1")
    got = await wait_until(lambda: c.pull_all(TOPIC, queues=2), 10, "the timer fired")
    assert [(m.body, m.queue_id) for m in got] == [(b"timed", 1)]
    assert not {C.REAL_TOPIC, C.REAL_QID} & set(got[0].properties)


async def _half(b: BrokerController, c: RawClient) -> None:
    """TRAN_MSG makes a half: invisible until committed; a rolled-back one never shows."""
    h1 = await half(c, b"committed")
    h2 = await half(c, b"rolled")
    assert await in_topic(c) == []
    ok(await c.end_transaction("audit-tx", h1, COMMIT))
    ok(await c.end_transaction("audit-tx", h2, ROLLBACK))
    assert [m.body for m in await in_topic(c)] == [b"committed"]


async def _transaction_id(b: BrokerController, c: RawClient) -> None:
    """``__transactionId__`` is the half's transaction id: answered, and what decides it."""
    sent = await half(c, b"tx", {C.TRANSACTION_ID: "audit-txid-1"})
    assert RawClient.send_header(sent).transaction_id == "audit-txid-1"
    assert "audit-txid-1" in b.transactions.records
    ok(await c.end_transaction("audit-tx", sent, COMMIT, txid="audit-txid-1"))
    assert [m.body for m in await in_topic(c)] == [b"tx"]


class Checks:
    """A producer connection that records the CHECK_TRANSACTION_STATE requests it gets."""

    def __init__(self) -> None:
        self.got: list[MessageExt] = []

    async def __call__(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            self.got.append(decode_message(cmd.body))
        return cmd.response()  # received (a check asked oneway gets nothing)

    def bodies(self) -> list[bytes]:
        return [bytes(m.body) for m in self.got]


async def _checked_by(b: BrokerController, group: str) -> tuple[RawClient, Checks]:
    checks = Checks()
    p = await RawClient.connect(b.address, checks)
    await p.heartbeat(producer_groups=[group])
    return p, checks


async def _pgroup(b: BrokerController, c: RawClient) -> None:
    """The half's check-back goes to the group PGROUP names, not the header's group."""
    named, named_checks = await _checked_by(b, "audit-pgroup")
    header, header_checks = await _checked_by(b, "audit-header-group")
    try:
        h = SendMessageRequestHeader(
            producer_group="audit-header-group",
            topic=TOPIC,
            queue_id=0,
            sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE,
            born_timestamp=now_ms(),
            properties=properties_to_string(
                {
                    C.UNIQ_KEY: "C0A80001000000000000000000A0B0C0",
                    C.TRAN_MSG: "true",
                    C.PGROUP: "audit-pgroup",
                }
            ),
        )
        ok(await c.call(RequestCode.SEND_MESSAGE_V2, h.to_v2_ext_fields(), b"whose"))
        await wait_until(lambda: named_checks.got, 10, "a check sent to PGROUP's producer")
        assert named_checks.bodies()[0] == b"whose"
        assert header_checks.got == []
    finally:
        await named.close()
        await header.close()


async def _check_times_and_immunity(b: BrokerController, c: RawClient) -> None:
    """CHECK_IMMUNITY_TIME_IN_SECONDS holds a half's first check back while another half is
    checked; the check carries TRANSACTION_CHECK_TIMES, counting."""
    p, checks = await _checked_by(b, "audit-tx")
    try:
        await half(c, b"immune", {C.CHECK_IMMUNITY_TIME_IN_SECONDS: "60"})
        await half(c, b"checked")
        await wait_until(lambda: len(checks.got) >= 2, 10, "two checks of the plain half")
        assert set(checks.bodies()) == {b"checked"}, "the immune half was checked"
        times = [int(m.properties[C.TRANSACTION_CHECK_TIMES]) for m in checks.got]
        assert times[:2] == [1, 2], times
    finally:
        await p.close()


async def _uniq_key(b: BrokerController, c: RawClient) -> None:
    """The msgId: a resend with the same UNIQ_KEY is answered with the first send and stored
    once; the id finds the message."""
    props = {C.UNIQ_KEY: "C0A80001000000000000000000A0D17A"}
    first = RawClient.send_header(await c.send(TOPIC, b"once", props=props))
    again = RawClient.send_header(await c.send(TOPIC, b"once", props=props))
    assert (again.msg_id, again.queue_offset) == (first.msg_id, first.queue_offset)
    [m] = await in_topic(c)
    assert m.msg_id == props[C.UNIQ_KEY]

    async def found() -> list[MessageExt]:
        ext = {"topic": TOPIC, "key": props[C.UNIQ_KEY], "maxNum": 4, "beginTimestamp": 0}
        ext.update(endTimestamp=FAR_FUTURE, _UNIQUE_KEY_QUERY="true")
        resp = await c.call(RequestCode.QUERY_MESSAGE, ext)
        return decode_messages(resp.body) if resp.code == ResponseCode.SUCCESS else []

    assert [x.body for x in await wait_until(found, 10, "found by its id")] == [b"once"]


async def _sharding_key(b: BrokerController, c: RawClient) -> None:
    """gRPC's message_group: stored as __SHARDINGKEY, one group's messages in one queue."""
    import grpc

    from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb
    from txmq.broker.grpc.vendor.v2 import service_pb2 as spb
    from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc

    md = (("x-mq-client-id", "audit-fifo"), ("x-mq-language", "PYTHON"))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{b.grpc_port}") as ch:
        stub: Any = sgrpc.MessagingServiceStub(ch)
        for i in range(8):
            m = pb.Message(topic=pb.Resource(name=TOPIC), body=f"g{i}".encode())
            sp = m.system_properties
            sp.message_id = f"C0A8000100002A9F00000000000001{i:02X}"
            sp.message_type = pb.FIFO
            sp.message_group = "order-42"
            sp.born_host = "127.0.0.1"
            r = await stub.SendMessage(spb.SendMessageRequest(messages=[m]), metadata=md)
            assert r.status.code == pb.OK, r.status
    got = stored(b, TOPIC)
    assert len(got) == 8 and len({m.queue_id for m in got}) == 1, got
    assert {m.properties.get(SHARDING_KEY) for m in got} == {"order-42"}


def _timer_probe(key: str, value: Callable[[int], str], wait_ms: int) -> Probe:
    async def probe(b: BrokerController, c: RawClient) -> None:
        t0 = now_ms()
        ok(await c.send(TOPIC, key.encode(), props={key: value(t0)}))
        assert await in_topic(c) == [], f"{key}: delivered at once"
        [m] = await wait_until(lambda: in_topic(c), 10, f"{key}: delivered")
        assert m.store_timestamp >= t0 + wait_ms, f"{key}: delivered early"

    return probe


async def _timer_del_uniqkey(b: BrokerController, c: RawClient) -> None:
    """The marker recalls the pending timer it names; in a transaction it is refused."""
    deliver = now_ms() + 2000
    sent = ok(await c.send(TOPIC, b"recalled", props={TIMER_DELIVER_MS: str(deliver)}))
    handle = str(sent.ext_fields["recallHandle"])
    msg_id = base64.urlsafe_b64decode(handle).decode().split(" ")[4]
    ok(await c.send(TOPIC, b"kept", props={TIMER_DELIVER_MS: str(deliver)}))
    marker = {TIMER_DEL_UNIQKEY: f"{TOPIC}+{msg_id}", TIMER_DELIVER_MS: str(deliver)}
    refused = await c.send(TOPIC, b"0", props=marker, group="audit-tx", transactional=True)
    assert refused.code == ResponseCode.MESSAGE_ILLEGAL, refused.remark
    assert TIMER_DEL_UNIQKEY in (refused.remark or "")
    no_time = await c.send(TOPIC, b"0", props={TIMER_DEL_UNIQKEY: marker[TIMER_DEL_UNIQKEY]})
    assert no_time.code == ResponseCode.MESSAGE_ILLEGAL, no_time.remark
    ok(await c.send(TOPIC, b"0", props=marker))
    await wait_until(lambda: in_topic(c), 10, "the kept one delivered")
    await wait_until(lambda: b.timer.pending == 0, 10, "nothing pending")
    assert [m.body for m in await in_topic(c)] == [b"kept"]


#: One probe per served property (REAL_TOPIC and REAL_QID share theirs, as do RETRY_TOPIC and
#: ORIGIN_MESSAGE_ID, TRANSACTION_CHECK_TIMES and CHECK_IMMUNITY_TIME_IN_SECONDS).
PROBES: dict[str, Probe] = {
    C.KEYS: _keys,
    C.TAGS: _tags,
    C.DELAY: _delay,
    C.RETRY_TOPIC: _sent_back,
    C.ORIGIN_MESSAGE_ID: _sent_back,
    C.REAL_TOPIC: _real_topic_and_queue,
    C.REAL_QID: _real_topic_and_queue,
    C.TRAN_MSG: _half,
    C.PGROUP: _pgroup,
    C.UNIQ_KEY: _uniq_key,
    C.CHECK_IMMUNITY_TIME_IN_SECONDS: _check_times_and_immunity,
    C.TRANSACTION_ID: _transaction_id,
    C.TRANSACTION_CHECK_TIMES: _check_times_and_immunity,
    SHARDING_KEY: _sharding_key,
    TIMER_DELAY_SEC: _timer_probe(TIMER_DELAY_SEC, lambda t: "2", 2000),
    TIMER_DELIVER_MS: _timer_probe(TIMER_DELIVER_MS, lambda t: str(t + 2000), 2000),
    TIMER_DELAY_MS: _timer_probe(TIMER_DELAY_MS, lambda t: "2000", 2000),
    TIMER_DEL_UNIQKEY: _timer_del_uniqkey,
}
