"""POP consumption survives SIGKILL: receipt handles, invisible times and delivery attempts are
in the commit log (``TXMQ_SYS_POP_STATE``) and rebuilt at start (``broker/messaging/pop.py``).

A real broker in a child process with its gRPC port on, RocketMQ 5 requests made with grpcio and
the broker's own stubs (what a SimpleConsumer sends), SIGKILL between the steps."""

from __future__ import annotations

import asyncio
import sys
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.ports import free_port
from tests.support.process import BrokerProcess
from tests.support.raw import connected
from tests.support.waiting import wait_until
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.headers import CreateTopicRequestHeader

grpc = pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")

from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2 as spb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc  # noqa: E402

TOPIC = "pop-durable"
GROUP = "pop-durable-consumers"
MD = (("x-mq-client-id", "pop-durable-test"), ("x-mq-language", "PYTHON"))
WAIT_S = 30.0


@dataclass(frozen=True)
class Got:
    body: bytes
    handle: str
    attempt: int
    message_id: str


class Consumer:
    """A SimpleConsumer's requests against one broker's gRPC port."""

    def __init__(self, port: int) -> None:
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.stub = sgrpc.MessagingServiceStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()

    async def send(self, body: bytes) -> None:
        m = pb.Message(topic=pb.Resource(name=TOPIC), body=body)
        m.system_properties.message_id = f"0A0B{zlib.crc32(body):028X}"
        m.system_properties.message_type = pb.NORMAL
        m.system_properties.born_host = "127.0.0.1"
        r = await self.stub.SendMessage(
            spb.SendMessageRequest(messages=[m]), metadata=MD, timeout=WAIT_S
        )
        assert r.status.code == pb.OK, f"SendMessage answered {r.status}"

    async def receive(self, n: int, invisible_s: int, poll_ms: int = 500) -> list[Got]:
        req = spb.ReceiveMessageRequest(
            group=pb.Resource(name=GROUP),
            message_queue=pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=-1),
            batch_size=n,
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
        )
        req.invisible_duration.FromSeconds(invisible_s)
        req.long_polling_timeout.FromMilliseconds(poll_ms)
        out = [r async for r in self.stub.ReceiveMessage(req, metadata=MD, timeout=WAIT_S)]
        assert out[0].status.code in (pb.OK, pb.MESSAGE_NOT_FOUND), out[0].status
        return [
            Got(
                r.message.body,
                r.message.system_properties.receipt_handle,
                r.message.system_properties.delivery_attempt,
                r.message.system_properties.message_id,
            )
            for r in out
            if r.HasField("message")
        ]

    async def ack(self, g: Got) -> Any:
        r = await self.stub.AckMessage(
            spb.AckMessageRequest(
                group=pb.Resource(name=GROUP),
                topic=pb.Resource(name=TOPIC),
                entries=[spb.AckMessageEntry(message_id=g.message_id, receipt_handle=g.handle)],
            ),
            metadata=MD,
            timeout=WAIT_S,
        )
        return r.status.code

    async def change_invisible(self, g: Got, seconds: int) -> Got:
        req = spb.ChangeInvisibleDurationRequest(
            group=pb.Resource(name=GROUP),
            topic=pb.Resource(name=TOPIC),
            receipt_handle=g.handle,
            message_id=g.message_id,
        )
        req.invisible_duration.FromSeconds(seconds)
        r = await self.stub.ChangeInvisibleDuration(req, metadata=MD, timeout=WAIT_S)
        assert r.status.code == pb.OK, f"ChangeInvisibleDuration answered {r.status}"
        return Got(g.body, r.receipt_handle, g.attempt, g.message_id)


async def receive_until(c: Consumer, n: int, invisible_s: int, what: str) -> list[Got]:
    """Receive until ``n`` messages came (bounded), each kept invisible ``invisible_s``."""
    got: list[Got] = []

    async def enough() -> bool:
        got.extend(await c.receive(max(1, n - len(got)), invisible_s=invisible_s))
        return len(got) >= n

    await wait_until(enough, WAIT_S, what, interval=0.05)
    return got


async def create_topic(address: str, topic: str) -> None:
    async with connected(address) as admin:
        h = CreateTopicRequestHeader(topic=topic, read_queue_nums=2, write_queue_nums=2)
        r = await admin.call(RequestCode.UPDATE_AND_CREATE_TOPIC, h.to_ext_fields())
        assert r.code == ResponseCode.SUCCESS, r.remark


async def dlq_count(address: str) -> int:
    async with connected(address) as admin:
        r = await admin.call(RequestCode.GET_MAX_OFFSET, {"topic": f"%DLQ%{GROUP}", "queueId": 0})
        return int(r.ext_fields.get("offset", 0)) if r.code == ResponseCode.SUCCESS else 0


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[BrokerProcess]:
    bp = BrokerProcess(
        str(tmp_path / "store"),
        flush="ASYNC_FLUSH",
        settings={
            "grpcServerEnable": "true",
            "grpcServerPort": free_port(),
            "maxReconsumeTimes": 2,
        },
    )
    await asyncio.to_thread(bp.start)
    try:
        yield bp
    finally:
        bp.stop_quietly()


async def restart(bp: BrokerProcess) -> None:
    """SIGKILL, then start again on the same store and ports."""
    bp.kill()
    await asyncio.to_thread(bp.start)


async def test_handles_invisible_times_and_attempts_survive_sigkill(broker: BrokerProcess) -> None:
    port = int(broker.settings["grpcServerPort"])
    await create_topic(broker.address, TOPIC)
    c = Consumer(port)
    try:
        for i in range(4):
            await c.send(f"m{i}".encode())
        got = await receive_until(c, 4, 60, "the 4 messages received")
        by_body = {g.body: g for g in got}
        assert sorted(by_body) == [b"m0", b"m1", b"m2", b"m3"], got
        assert all(g.attempt == 1 for g in got), got
        assert await c.ack(by_body[b"m0"]) == pb.OK
        # m1 comes back 1 s from now, under a new handle; the old one no longer acks it
        m1 = await c.change_invisible(by_body[b"m1"], 1)
    finally:
        await c.close()

    await restart(broker)
    c = Consumer(port)
    try:
        # a handle from before the kill still acks its message
        assert await c.ack(by_body[b"m2"]) == pb.OK, "a handle issued before the kill"
        assert await c.ack(by_body[b"m1"]) == pb.INVALID_RECEIPT_HANDLE, (
            "the handle ChangeInvisibleDuration replaced acked its message after the kill"
        )
        await c.send(b"after")
        # m1 (visible again after its 1 s, its second delivery) and the new message; m0 and m2
        # are acked and m3 is invisible for another minute
        again = await receive_until(c, 2, 60, "m1 again and the new message")
        assert sorted((g.body, g.attempt) for g in again) == [(b"after", 1), (b"m1", 2)], again
        assert await c.ack(m1) == pb.INVALID_RECEIPT_HANDLE, "m1's handle of its 1st delivery"
        for g in again:
            assert await c.ack(g) == pb.OK
    finally:
        await c.close()


async def test_attempts_go_on_across_restarts_until_the_dead_letter_queue(
    broker: BrokerProcess,
) -> None:
    """maxReconsumeTimes 2: three deliveries, each followed by a SIGKILL; the fourth time the
    message is due it goes to %DLQ% instead."""
    port = int(broker.settings["grpcServerPort"])
    await create_topic(broker.address, TOPIC)
    c = Consumer(port)
    try:
        await c.send(b"poison")
    finally:
        await c.close()
    for attempt in (1, 2, 3):
        c = Consumer(port)
        try:
            got = await receive_until(c, 1, 1, f"delivery {attempt}")
            assert [(g.body, g.attempt) for g in got] == [(b"poison", attempt)], got
        finally:
            await c.close()
        await restart(broker)

    c = Consumer(port)
    try:
        await c.send(b"marker")
        got = []

        async def dead_lettered() -> bool:
            got.extend(await c.receive(4, invisible_s=30))
            return await dlq_count(broker.address) == 1 and len(got) >= 1

        # the receive that finds the poison message due a fourth time moves it to %DLQ%
        await wait_until(
            lambda: dead_lettered(), WAIT_S, "the poison message in %DLQ%", interval=0.05
        )
        assert [g.body for g in got] == [b"marker"], f"after three deliveries: {got}"
    finally:
        await c.close()


@pytest.mark.parametrize("kill", [False, True], ids=["live", "then SIGKILL"])
async def test_reset_offset_on_a_live_group_delivers_again(
    broker: BrokerProcess, kill: bool
) -> None:
    """A group that received and acked 5 messages, reset to the earliest with the CLI: it gets
    the 5 again (its live view starts again at the reset offsets, and does not write its old
    position back on the next ack) - also after a SIGKILL right after the reset."""
    port = int(broker.settings["grpcServerPort"])
    await create_topic(broker.address, TOPIC)
    c = Consumer(port)
    bodies = sorted(f"r{i}".encode() for i in range(5))
    try:
        for b in bodies:
            await c.send(b)
        got = await receive_until(c, 5, 60, "the 5 messages")
        for g in got:
            assert await c.ack(g) == pb.OK
        reset = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "txmq",
            "group",
            "reset-offset",
            GROUP,
            "--topic",
            TOPIC,
            "--to-earliest",
            "--broker",
            broker.address,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(reset.communicate(), WAIT_S)
        assert reset.returncode == 0, out.decode()
    finally:
        await c.close()
    if kill:
        await restart(broker)
    c = Consumer(port)
    try:
        again = await receive_until(c, 5, 60, "the 5 messages again")
        assert sorted(g.body for g in again) == bodies, again
        assert all(g.attempt == 1 for g in again), again
        for g in again:
            assert await c.ack(g) == pb.OK
    finally:
        await c.close()
