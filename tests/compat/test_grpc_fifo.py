"""FIFO consumer groups on the gRPC front end, decided by the broker as in RocketMQ 5: a group is
FIFO when its settings say ``consumeMessageOrderly`` (mqadmin updateSubGroup -o true); the
Telemetry settings answer tells the client so whatever it asked, and ReceiveMessage then keeps
each queue (so each message group) in order across redelivery.  Also consumeEnable and
retryMaxTimes on the gRPC side.  A plain grpcio client with the broker's generated stubs; the
official client is driven in test_grpc_python5_fifo.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import BrokerThread
from tests.support.grpc_probes import receive_request
from txmq.protocol.message import java_string_hash

grpc = pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")

from tests.compat.test_grpc_frontend import MD, ack, message, receive  # noqa: E402
from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2 as spb  # noqa: E402
from txmq.broker.store.subscription_group import SubscriptionGroupConfig  # noqa: E402

QUEUES = 4


@pytest.fixture
def bt(broker_thread_factory: Callable[..., BrokerThread]) -> BrokerThread:
    return broker_thread_factory(
        grpc_server_enable=True, grpc_server_port=0, default_topic_queue_nums=QUEUES
    )


def set_group(bt: BrokerThread, group: str, **fields: Any) -> None:
    """Store the group's settings the way UPDATE_AND_CREATE_SUBSCRIPTIONGROUP does (the
    request itself is tested at the wire in tests/broker/test_subscription_groups.py)."""

    def put() -> None:
        assert bt.controller is not None
        bt.controller.ctx.groups.put(SubscriptionGroupConfig(group, **fields))

    bt.run(put)


def settings_answer(stub: Any, group: str, fifo_asked: bool | None) -> Any:
    """The settings the broker answers a simple consumer of ``group`` on Telemetry."""
    sub = pb.Subscription(group=pb.Resource(name=group))
    if fifo_asked is not None:
        sub.fifo = fifo_asked
    cmd = spb.TelemetryCommand(
        settings=pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=sub)
    )
    for reply in stub.Telemetry(iter([cmd]), metadata=MD, timeout=10):
        if reply.HasField("settings"):
            assert reply.status.code == pb.OK, reply.status
            return reply.settings
    pytest.fail("the Telemetry stream ended without a settings answer")


def test_the_group_settings_decide_fifo_and_max_attempts(bt: BrokerThread, stub: Any) -> None:
    # a group without settings: RocketMQ's defaults, not FIFO even when the client asks
    for asked in (True, False, None):
        s = settings_answer(stub, "plain-group", asked)
        assert s.subscription.fifo is False, asked
        assert s.backoff_policy.max_attempts == 17  # retryMaxTimes 16 + 1
    # an orderly group is FIFO even when the client asks otherwise
    set_group(bt, "fifo-group", consume_message_orderly=True, retry_max_times=3)
    for asked in (False, None):
        s = settings_answer(stub, "fifo-group", asked)
        assert s.subscription.fifo is True, asked
        assert s.backoff_policy.max_attempts == 4
    # and back
    set_group(bt, "fifo-group", consume_message_orderly=False)
    assert settings_answer(stub, "fifo-group", True).subscription.fifo is False


def two_message_groups(queues: int) -> tuple[str, str]:
    """Two message groups the broker puts in different queues (``|hash| % queues``)."""
    names = [f"order-{i}" for i in range(50)]
    first = names[0]
    q = abs(java_string_hash(first)) % queues
    other = next(n for n in names if abs(java_string_hash(n)) % queues != q)
    return first, other


def send_fifo(stub: Any, topic: str, specs: list[tuple[str, str]]) -> None:
    msgs = []
    for i, (group, body) in enumerate(specs):
        m = message(topic, body.encode(), f"fifo-{topic}-{i}", message_type=pb.FIFO)
        m.system_properties.message_group = group
        msgs.append(m)
    r = stub.SendMessage(spb.SendMessageRequest(messages=msgs), metadata=MD, timeout=10)
    assert r.status.code == pb.OK, r.status


def receive_n(stub: Any, topic: str, group: str, batch: int, **kw: Any) -> list[Any]:
    req = receive_request(
        group,
        topic,
        queue_id=-1,
        batch=batch,
        invisible_ms=int(kw.get("invisible", 10) * 1000),
        poll_ms=int(kw.get("poll", 0.2) * 1000),
    )
    out = list(stub.ReceiveMessage(req, metadata=MD, timeout=10))
    return [r.message for r in out if r.HasField("message")]


def test_an_orderly_group_keeps_message_group_order_across_redelivery(
    bt: BrokerThread, stub: Any
) -> None:
    topic, group = "fifo-order", "fifo-consumers"
    a, b = two_message_groups(QUEUES)
    send_fifo(stub, topic, [(a, "a1"), (b, "b1"), (a, "a2"), (b, "b2"), (a, "a3")])
    set_group(bt, group, consume_message_orderly=True)
    log: list[tuple[bytes, int]] = []  # every delivery, in order
    # one message at a time until a1 comes; a1 is not acked (invisible for 3 s), the rest is
    deadline = time.monotonic() + 15
    while (b"a1", 1) not in log:
        assert time.monotonic() < deadline, f"a1 never came: {log}"
        for m in receive_n(stub, topic, group, 1, invisible=3, poll=1):
            log.append((m.body, m.system_properties.delivery_attempt))
            if m.body != b"a1":
                assert ack(stub, topic, group, m).status.code == pb.OK
    # then everything, acking all, until a3 was handled
    while (b"a3", 1) not in log:
        assert time.monotonic() < deadline, f"a3 never came: {log}"
        for m in receive_n(stub, topic, group, 32, invisible=30, poll=1):
            log.append((m.body, m.system_properties.delivery_attempt))
            assert ack(stub, topic, group, m).status.code == pb.OK
    # group a: a1 again (attempt 2) before anything after it, then a2, a3
    assert [x for x in log if x[0].startswith(b"a")] == [
        (b"a1", 1),
        (b"a1", 2),
        (b"a2", 1),
        (b"a3", 1),
    ], log
    # group b (another queue) was not held up: both came before a1 was visible again
    b_at = [i for i, x in enumerate(log) if x[0].startswith(b"b")]
    assert [log[i] for i in b_at] == [(b"b1", 1), (b"b2", 1)], log
    assert max(b_at) < log.index((b"a1", 2)), log


def test_without_orderly_the_same_group_is_not_held_back(bt: BrokerThread, stub: Any) -> None:
    """The counterpart: a group that is not orderly gets a2 while a1 is invisible."""
    topic, group = "fifo-unordered", "plain-consumers"
    a, _ = two_message_groups(QUEUES)
    send_fifo(stub, topic, [(a, "a1"), (a, "a2")])
    [a1] = receive_n(stub, topic, group, 1, invisible=30, poll=2)
    assert a1.body == b"a1"
    [a2] = receive_n(stub, topic, group, 1, invisible=30, poll=2)
    assert a2.body == b"a2"


def test_a_disabled_group_cannot_receive(bt: BrokerThread, stub: Any) -> None:
    topic = "fifo-disabled"
    send_fifo(stub, topic, [("x", "m")])
    set_group(bt, "off-group", consume_enable=False)
    status, msgs = receive(stub, topic, "off-group")
    assert (status.code, status.message) == (
        pb.FORBIDDEN,
        "subscription group no permission, off-group",
    )
    assert msgs == []
    status, msgs = receive(stub, topic, "on-group", poll=2)
    assert status.code == pb.OK and [m.body for m in msgs] == [b"m"]


def test_retry_max_times_of_an_orderly_group_sends_to_the_dlq_and_unblocks(
    bt: BrokerThread, stub: Any
) -> None:
    topic, group = "fifo-dlq", "fifo-dlq-consumers"
    a, _ = two_message_groups(QUEUES)
    send_fifo(stub, topic, [(a, "poison"), (a, "next")])
    set_group(bt, group, consume_message_orderly=True, retry_max_times=1)
    attempts = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        got = receive_n(stub, topic, group, 1, invisible=1, poll=2)
        if got and got[0].body == b"next":
            assert ack(stub, topic, group, got[0]).status.code == pb.OK
            break
        attempts += [(m.body, m.system_properties.delivery_attempt) for m in got]
    # retryMaxTimes 1: two deliveries, then the dead-letter queue, then the queue moves on
    assert attempts == [(b"poison", 1), (b"poison", 2)]

    def dead_letters() -> int:
        assert bt.controller is not None
        return int(bt.controller.store.get_max_offset_in_queue(f"%DLQ%{group}", 0))

    assert bt.run(dead_letters) == 1
