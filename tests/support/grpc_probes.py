"""What each RPC of ``apache.rocketmq.v2.MessagingService`` docs/compatibility.md calls *served*
does, tried on a running broker over ``grpc.aio``: one probe per RPC sends it (after what it
needs) and checks the answer and its effect.  ``tests/broker/test_request_code_audit.py`` runs
one per served RPC and fails for a served RPC without a probe."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tests.support.brokers import stored
from tests.support.raw import RawClient
from tests.support.waiting import wait_until
from txmq.broker.server import BrokerController
from txmq.protocol.codes import RequestCode, ResponseCode

TOPIC = "audit-grpc"
GROUP = "audit-grpc-g"
CLIENT = "audit-grpc-client"
MD = (("x-mq-client-id", CLIENT), ("x-mq-language", "PYTHON"))

#: ``(broker, stub)``: the stub is a ``MessagingServiceStub`` on a ``grpc.aio`` channel.
Probe = Callable[[BrokerController, Any], Awaitable[None]]


def _pb() -> tuple[Any, Any]:
    from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb
    from txmq.broker.grpc.vendor.v2 import service_pb2 as spb

    return pb, spb


def message(body: bytes, mid: str, **sp: Any) -> Any:
    return grpc_message(TOPIC, body, mid, **sp)


def grpc_message(topic: str, body: bytes, mid: str, **sp: Any) -> Any:
    """A RocketMQ 5 ``Message`` of ``topic`` with the message id ``mid`` (``sp``: more system
    properties; ``message_type`` NORMAL unless given)."""
    pb, _ = _pb()
    m = pb.Message(topic=pb.Resource(name=topic), body=body)
    m.system_properties.message_id = mid
    m.system_properties.message_type = sp.pop("message_type", pb.NORMAL)
    m.system_properties.born_host = "127.0.0.1"
    for k, v in sp.items():
        setattr(m.system_properties, k, v)
    return m


async def send(stub: Any, *msgs: Any) -> Any:
    pb, spb = _pb()
    r = await stub.SendMessage(spb.SendMessageRequest(messages=list(msgs)), metadata=MD)
    assert r.status.code == pb.OK, r.status
    return r


def receive_request(
    group: str,
    topic: str,
    *,
    queue_id: int = 0,
    batch: int = 32,
    expression: str = "*",
    sql: bool = False,
    invisible_ms: int = 10_000,
    poll_ms: int | None = 200,
) -> Any:
    """A ``ReceiveMessageRequest`` of ``group`` on ``topic`` (``queue_id`` -1: any queue) for
    up to ``batch`` messages matching ``expression`` (a tag expression, SQL92 when ``sql``),
    invisible ``invisible_ms`` once received, long-polling ``poll_ms`` (None: not set)."""
    pb, spb = _pb()
    req = spb.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=queue_id),
        batch_size=batch,
        filter_expression=pb.FilterExpression(
            type=pb.SQL if sql else pb.TAG, expression=expression
        ),
    )
    req.invisible_duration.FromMilliseconds(invisible_ms)
    if poll_ms is not None:
        req.long_polling_timeout.FromMilliseconds(poll_ms)
    return req


def change_invisible_request(
    group: str, topic: str, handle: str, message_id: str, seconds: int = 30
) -> Any:
    """A ``ChangeInvisibleDurationRequest``: the message ``handle`` names (``message_id``)
    invisible to ``group`` for ``seconds`` more."""
    pb, spb = _pb()
    req = spb.ChangeInvisibleDurationRequest(
        group=pb.Resource(name=group),
        topic=pb.Resource(name=topic),
        receipt_handle=handle,
        message_id=message_id,
    )
    req.invisible_duration.FromSeconds(seconds)
    return req


def end_transaction_request(
    topic: str, txid: str, resolution: int, source: int, message_id: str = ""
) -> Any:
    """An ``EndTransactionRequest`` deciding transaction ``txid`` of ``topic`` (``resolution``:
    COMMIT or ROLLBACK; ``source``: the client's own decision or a check's answer)."""
    pb, spb = _pb()
    return spb.EndTransactionRequest(
        topic=pb.Resource(name=topic),
        message_id=message_id,
        transaction_id=txid,
        resolution=resolution,
        source=source,
    )


async def receive(stub: Any, invisible_ms: int = 10_000) -> list[Any]:
    req = receive_request(GROUP, TOPIC, invisible_ms=invisible_ms)
    return [r.message async for r in stub.ReceiveMessage(req, metadata=MD) if r.HasField("message")]


async def ack(stub: Any, m: Any) -> Any:
    pb, spb = _pb()
    entry = spb.AckMessageEntry(
        message_id=m.system_properties.message_id,
        receipt_handle=m.system_properties.receipt_handle,
    )
    req = spb.AckMessageRequest(
        group=pb.Resource(name=GROUP), topic=pb.Resource(name=TOPIC), entries=[entry]
    )
    return await stub.AckMessage(req, metadata=MD)


def committed(b: BrokerController) -> int:
    return sum(b.offsets.offsets(GROUP, TOPIC).values())


async def _route(b: BrokerController, stub: Any) -> None:
    pb, spb = _pb()
    r = await stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name=TOPIC)), metadata=MD)
    assert r.status.code == pb.OK, r.status
    assert len(r.message_queues) == b.config.default_topic_queue_nums
    assert {q.broker.endpoints.addresses[0].port for q in r.message_queues} == {b.grpc_port}


async def _heartbeat(b: BrokerController, stub: Any) -> None:
    """A consumer's heartbeat needs its group (and makes the group's retry topic)."""
    pb, spb = _pb()
    req = spb.HeartbeatRequest(client_type=pb.SIMPLE_CONSUMER)
    assert (await stub.Heartbeat(req, metadata=MD)).status.code == pb.ILLEGAL_CONSUMER_GROUP
    req.group.name = GROUP
    r = await stub.Heartbeat(req, metadata=MD)
    assert r.status.code == pb.OK, r.status
    assert b.topics.get(f"%RETRY%{GROUP}") is not None


async def _send(b: BrokerController, stub: Any) -> None:
    pb, _ = _pb()
    r = await send(stub, message(b"sent", "C0A8000100002A9F0000000000000B01", tag="T"))
    assert r.entries[0].message_id == "C0A8000100002A9F0000000000000B01"
    [m] = stored(b, TOPIC)
    assert (m.body, m.tags, m.msg_id) == (b"sent", "T", "C0A8000100002A9F0000000000000B01")


async def _assignment(b: BrokerController, stub: Any) -> None:
    pb, spb = _pb()
    await send(stub, message(b"a", "C0A8000100002A9F0000000000000B00"))  # the topic exists
    req = spb.QueryAssignmentRequest(topic=pb.Resource(name=TOPIC), group=pb.Resource(name=GROUP))
    r = await stub.QueryAssignment(req, metadata=MD)
    assert r.status.code == pb.OK, r.status
    assert [a.message_queue.id for a in r.assignments] == [-1]


async def _receive_and_ack(b: BrokerController, stub: Any) -> None:
    """ReceiveMessage hands the message out once (invisible then); AckMessage commits it."""
    pb, _ = _pb()
    await send(stub, message(b"r", "C0A8000100002A9F0000000000000B02"))
    [m] = await receive(stub)
    assert m.body == b"r" and m.system_properties.delivery_attempt == 1
    assert await receive(stub) == []
    assert (await ack(stub, m)).status.code == pb.OK
    assert committed(b) == 1


async def _change_invisible(b: BrokerController, stub: Any) -> None:
    """ChangeInvisibleDuration answers a new handle; the old one no longer acks."""
    pb, _ = _pb()
    await send(stub, message(b"c", "C0A8000100002A9F0000000000000B03"))
    [m] = await receive(stub)
    sp = m.system_properties
    req = change_invisible_request(GROUP, TOPIC, sp.receipt_handle, sp.message_id)
    r = await stub.ChangeInvisibleDuration(req, metadata=MD)
    assert r.status.code == pb.OK and r.receipt_handle != m.system_properties.receipt_handle
    assert (await ack(stub, m)).status.code == pb.INVALID_RECEIPT_HANDLE
    m.system_properties.receipt_handle = r.receipt_handle
    assert (await ack(stub, m)).status.code == pb.OK


async def _dead_letter(b: BrokerController, stub: Any) -> None:
    pb, spb = _pb()
    await send(stub, message(b"dead", "C0A8000100002A9F0000000000000B04"))
    [m] = await receive(stub)
    req = spb.ForwardMessageToDeadLetterQueueRequest(
        group=pb.Resource(name=GROUP),
        topic=pb.Resource(name=TOPIC),
        receipt_handle=m.system_properties.receipt_handle,
        message_id=m.system_properties.message_id,
        delivery_attempt=1,
        max_delivery_attempts=1,
    )
    r = await stub.ForwardMessageToDeadLetterQueue(req, metadata=MD)
    assert r.status.code == pb.OK, r.status
    assert [x.body for x in stored(b, f"%DLQ%{GROUP}")] == [b"dead"]
    assert committed(b) == 1


async def _end_transaction(b: BrokerController, stub: Any) -> None:
    pb, _ = _pb()
    mid = "C0A8000100002A9F0000000000000B05"
    await send(stub, message(b"half", mid, message_type=pb.TRANSACTION))
    assert stored(b, TOPIC) == []
    req = end_transaction_request(TOPIC, mid, pb.COMMIT, pb.SOURCE_CLIENT, message_id=mid)
    r = await stub.EndTransaction(req, metadata=MD)
    assert r.status.code == pb.OK, r.status
    assert [m.body for m in stored(b, TOPIC)] == [b"half"]


async def _telemetry_and_termination(b: BrokerController, stub: Any) -> None:
    """Telemetry's settings register the producer (the remoting producer list shows it) and
    are answered; NotifyClientTermination forgets it."""
    pb, spb = _pb()
    c = await RawClient.connect(b.address)

    async def producers() -> list[str]:
        """The group's producers (a group without any is answered "not exist")."""
        resp = await c.call(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": TOPIC})
        if resp.code != ResponseCode.SUCCESS:
            assert "not exist" in (resp.remark or ""), (resp.code, resp.remark)
            return []
        return [x["clientId"] for x in json.loads(resp.body)["connectionSet"]]

    call = stub.Telemetry(metadata=MD)
    try:
        settings = pb.Settings(
            client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name=TOPIC)])
        )
        await call.write(spb.TelemetryCommand(settings=settings))
        first = await call.read()
        assert first.status.code == pb.OK, first.status
        assert first.settings.publishing.max_body_size == b.config.max_message_size
        assert await wait_until(producers, 10, "the producer registered") == [CLIENT]
        r = await stub.NotifyClientTermination(spb.NotifyClientTerminationRequest(), metadata=MD)
        assert r.status.code == pb.OK
        assert await producers() == []
    finally:
        call.cancel()
        await c.close()


async def _recall(b: BrokerController, stub: Any) -> None:
    pb, spb = _pb()
    m = message(b"t", "C0A8000100002A9F0000000000000B06", message_type=pb.DELAY)
    m.system_properties.delivery_timestamp.FromMilliseconds(int(time.time() * 1000) + 30_000)
    entry = (await send(stub, m)).entries[0]
    req = spb.RecallMessageRequest(topic=pb.Resource(name=TOPIC), recall_handle=entry.recall_handle)
    r = await stub.RecallMessage(req, metadata=MD)
    assert r.status.code == pb.OK and r.message_id == "C0A8000100002A9F0000000000000B06"
    assert b.timer.pending == 0
    again = await stub.RecallMessage(spb.RecallMessageRequest(topic=req.topic), metadata=MD)
    assert again.status.code == pb.PRECONDITION_FAILED, again.status


PROBES: dict[str, Probe] = {
    "QueryRoute": _route,
    "Heartbeat": _heartbeat,
    "SendMessage": _send,
    "QueryAssignment": _assignment,
    "ReceiveMessage": _receive_and_ack,
    "AckMessage": _receive_and_ack,
    "ChangeInvisibleDuration": _change_invisible,
    "ForwardMessageToDeadLetterQueue": _dead_letter,
    "EndTransaction": _end_transaction,
    "Telemetry": _telemetry_and_termination,
    "NotifyClientTermination": _telemetry_and_termination,
    "RecallMessage": _recall,
}
