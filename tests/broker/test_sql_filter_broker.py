"""SQL92 property filters served by a real broker: over remoting (a raw client's PULL_MESSAGE with
the expression in the pull or registered by the heartbeat; CHECK_CLIENT_CONFIG) and over gRPC
(ReceiveMessage with a SQL FilterExpression).  Messages the filter refuses never cross the wire
and the queue's next offset moves past them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import BrokerThread
from tests.support.grpc_probes import receive_request
from tests.support.raw import RawClient, connected
from tests.support.waiting import parked_pulls, wait_until
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.headers import PullMessageRequestHeader
from txmq.protocol.message import decode_messages

SQL = "a > 5 AND region = 'eu'"
SUBSCRIPTION_PARSE_FAILED = 23


def _pull_header(topic: str, offset: int, expression: str | None, group: str = "g") -> Any:
    return PullMessageRequestHeader(
        consumer_group=group,
        topic=topic,
        queue_id=0,
        queue_offset=offset,
        max_msg_nums=32,
        sys_flag=0x4 if expression is not None else 0,
        subscription=expression,
        expression_type="SQL92" if expression is not None else None,
    )


async def _send_numbered(c: RawClient, topic: str, n: int) -> None:
    for i in range(n):
        region = "eu" if i % 2 == 0 else "us"
        resp = await c.send(topic, f"m{i}".encode(), props={"a": str(i), "region": region})
        assert resp.code == ResponseCode.SUCCESS, resp.remark


async def test_pull_carries_sql92_and_gets_only_matching_messages(broker: BrokerController) -> None:
    async with connected(broker.address) as c:
        await _send_numbered(c, "sqlt", 20)
        resp = await c.call(RequestCode.PULL_MESSAGE, _pull_header("sqlt", 0, SQL).to_ext_fields())
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        got = decode_messages(resp.body)
        assert [m.body for m in got] == [f"m{i}".encode() for i in (6, 8, 10, 12, 14, 16, 18)]
        # Only the matching records are in the body; the next offset is past the whole scan.
        assert len(resp.body) == sum(m.store_size for m in got)
        assert int(resp.ext_fields["nextBeginOffset"]) == 20

        # From an offset where nothing more matches: retry immediately from past them.
        resp = await c.call(RequestCode.PULL_MESSAGE, _pull_header("sqlt", 19, SQL).to_ext_fields())
        assert resp.code == ResponseCode.PULL_RETRY_IMMEDIATELY
        assert int(resp.ext_fields["nextBeginOffset"]) == 20

        # A missing property is NULL: never matched, not even under NOT.
        resp = await c.call(
            RequestCode.PULL_MESSAGE,
            _pull_header("sqlt", 0, "NOT (missing > 1) OR a = 3").to_ext_fields(),
        )
        assert [m.body for m in decode_messages(resp.body)] == [b"m3"]

        # TAGS is a variable like the user properties.
        await c.send("sqltags", b"tagged", props={"TAGS": "TagA", "a": "1"})
        await c.send("sqltags", b"other", props={"TAGS": "TagB", "a": "1"})
        resp = await c.call(
            RequestCode.PULL_MESSAGE,
            _pull_header("sqltags", 0, "TAGS IN ('TagA') AND a = 1").to_ext_fields(),
        )
        assert [m.body for m in decode_messages(resp.body)] == [b"tagged"]


async def test_heartbeat_registered_sql92_filters_pulls_without_expression(
    broker: BrokerController,
) -> None:
    async with connected(broker.address) as c:
        await _send_numbered(c, "sqlhb", 10)
        await c.heartbeat(consumer_groups={"sql-hb": {"sqlhb": "a <= 2"}}, expression_type="SQL92")
        resp = await c.call(
            RequestCode.PULL_MESSAGE, _pull_header("sqlhb", 0, None, "sql-hb").to_ext_fields()
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert [m.body for m in decode_messages(resp.body)] == [b"m0", b"m1", b"m2"]

        # A heartbeat with an expression that does not compile: its pulls are refused.
        await c.heartbeat(consumer_groups={"sql-hb": {"sqlhb": "a <="}}, expression_type="SQL92")
        resp = await c.call(
            RequestCode.PULL_MESSAGE, _pull_header("sqlhb", 0, None, "sql-hb").to_ext_fields()
        )
        assert resp.code == SUBSCRIPTION_PARSE_FAILED
        assert "unexpected end of expression" in (resp.remark or "")


async def test_invalid_expression_in_a_pull_is_refused(broker: BrokerController) -> None:
    async with connected(broker.address) as c:
        await _send_numbered(c, "sqlbad", 1)
        resp = await c.call(
            RequestCode.PULL_MESSAGE, _pull_header("sqlbad", 0, "a > 'x'").to_ext_fields()
        )
        assert resp.code == SUBSCRIPTION_PARSE_FAILED
        assert "cannot be compared" in (resp.remark or "")


@pytest.mark.parametrize(
    ("expression", "code", "remark"),
    [
        (SQL, ResponseCode.SUCCESS, None),
        ("a > 5 AND", SUBSCRIPTION_PARSE_FAILED, "unexpected end of expression"),
        ("a > 5 AND ) b", SUBSCRIPTION_PARSE_FAILED, "unexpected token ')' at line 1, column 11"),
        ("a = NULL", SUBSCRIPTION_PARSE_FAILED, "IS NULL"),
    ],
)
async def test_check_client_config_compiles_sql92(
    broker: BrokerController, expression: str, code: int, remark: str | None
) -> None:
    async with connected(broker.address) as c:
        resp = await c.check_client_config("sql-g", "filtered", expression)
        assert resp.code == code, resp.remark
        if remark is not None:
            assert remark in (resp.remark or "")
            assert expression in (resp.remark or "")


async def test_long_polled_pull_answers_with_the_matching_message(
    broker: BrokerController,
) -> None:
    async with connected(broker.address) as c:
        await c.send("sqlpoll", b"first", props={"a": "1"})
        h = _pull_header("sqlpoll", 1, "a = 7")
        h.sys_flag |= 0x2
        h.suspend_timeout_millis = 5000
        pending = asyncio.ensure_future(c.call(RequestCode.PULL_MESSAGE, h.to_ext_fields()))
        await wait_until(lambda: parked_pulls(broker, "sqlpoll", 0) == 1, what="the pull parked")
        await c.send("sqlpoll", b"seven", props={"a": "7"})
        resp = await asyncio.wait_for(pending, 10)
        # Woken by the new message: either it (matched) or a retry from past it.
        if resp.code == ResponseCode.SUCCESS:
            assert [m.body for m in decode_messages(resp.body)] == [b"seven"]
        else:
            assert resp.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY)
            resp = await c.call(
                RequestCode.PULL_MESSAGE, _pull_header("sqlpoll", 1, "a = 7").to_ext_fields()
            )
            assert [m.body for m in decode_messages(resp.body)] == [b"seven"]


# -- gRPC -------------------------------------------------------------------------------------


def test_grpc_receive_with_sql_filter(broker_thread_factory: Callable[..., BrokerThread]) -> None:
    grpc = pytest.importorskip("grpc", reason="the grpc extra is not installed")
    from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb
    from txmq.broker.grpc.vendor.v2 import service_pb2 as spb
    from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc

    md = (("x-mq-client-id", "sql-client-1"), ("x-mq-language", "PYTHON"))
    bt = broker_thread_factory(grpc_server_enable=True, grpc_server_port=0)
    assert bt.controller is not None
    ch = grpc.insecure_channel(f"127.0.0.1:{bt.controller.grpc_port}")
    try:
        stub = sgrpc.MessagingServiceStub(ch)
        topic = "sqlgrpc"
        msgs = []
        for i in range(10):
            m = pb.Message(topic=pb.Resource(name=topic), body=f"m{i}".encode())
            m.system_properties.message_id = f"mid-{i}"
            m.system_properties.message_type = pb.NORMAL
            m.system_properties.born_host = "127.0.0.1"
            m.system_properties.tag = "A" if i < 5 else "B"
            m.user_properties["a"] = str(i)
            m.user_properties["region"] = "eu" if i % 2 == 0 else "us"
            msgs.append(m)
        for m in msgs:
            r = stub.SendMessage(spb.SendMessageRequest(messages=[m]), metadata=md, timeout=10)
            assert r.status.code == pb.OK, r.status.message

        def receive(expression: str, group: str) -> tuple[Any, list[Any]]:
            # One receive reads every queue of the topic (up to batch_size).
            req = receive_request(
                group, topic, expression=expression, sql=True, invisible_ms=30_000, poll_ms=100
            )
            out = list(stub.ReceiveMessage(req, metadata=md, timeout=10))
            return out[0].status, [r.message.body for r in out if r.HasField("message")]

        status, bodies = receive("a >= 5 AND region = 'eu' OR TAGS = 'A' AND a = 1", "gs1")
        assert sorted(bodies) == [b"m1", b"m6", b"m8"]
        status, bodies = receive("a > 'x'", "gs2")
        assert status.code == pb.ILLEGAL_FILTER_EXPRESSION
        assert "cannot be compared" in status.message
    finally:
        ch.close()


def test_grpc_refuses_sql_with_the_setting_off(
    broker_thread_factory: Callable[..., BrokerThread],
) -> None:
    grpc = pytest.importorskip("grpc", reason="the grpc extra is not installed")
    from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb
    from txmq.broker.grpc.vendor.v2 import service_pb2 as spb
    from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc

    md = (("x-mq-client-id", "sql-client-2"), ("x-mq-language", "PYTHON"))
    bt = broker_thread_factory(
        grpc_server_enable=True, grpc_server_port=0, enable_property_filter=False
    )
    assert bt.controller is not None
    ch = grpc.insecure_channel(f"127.0.0.1:{bt.controller.grpc_port}")
    try:
        stub = sgrpc.MessagingServiceStub(ch)
        m = pb.Message(topic=pb.Resource(name="sqloff"), body=b"m")
        m.system_properties.message_id = "mid-off"
        m.system_properties.message_type = pb.NORMAL
        m.system_properties.born_host = "127.0.0.1"
        m.user_properties["a"] = "2"
        r = stub.SendMessage(spb.SendMessageRequest(messages=[m]), metadata=md, timeout=10)
        assert r.status.code == pb.OK, r.status.message
        req = receive_request(
            "g", "sqloff", batch=1, expression="a > 1", sql=True, invisible_ms=30_000, poll_ms=None
        )
        out = list(stub.ReceiveMessage(req, metadata=md, timeout=10))
        assert out[0].status.code == pb.ILLEGAL_FILTER_EXPRESSION
        assert "enablePropertyFilter" in out[0].status.message
    finally:
        ch.close()
