"""The gRPC front end at the wire: statuses for bad input, unimplemented RPCs, the invisibility
model, check budgets.  A plain grpcio client with the broker's own generated stubs (the official
client is exercised in test_grpc_python5.py)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.conftest import BrokerThread
from tests.support.grpc_probes import (
    change_invisible_request,
    end_transaction_request,
    grpc_message,
    receive_request,
)
from tests.support.waiting import wait_until_sync

grpc = pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")

from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2 as spb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc  # noqa: E402

SERVICE = "/apache.rocketmq.v2.MessagingService/"
MD = (("x-mq-client-id", "raw-client-1"), ("x-mq-language", "PYTHON"))


@pytest.fixture
def bt(broker_thread_factory: Callable[..., BrokerThread]) -> BrokerThread:
    return broker_thread_factory(
        grpc_server_enable=True, grpc_server_port=0, max_message_size=64 * 1024
    )


@pytest.fixture
def channel(bt: BrokerThread) -> Iterator[Any]:
    assert bt.controller is not None
    ch = grpc.insecure_channel(f"127.0.0.1:{bt.controller.grpc_port}")
    try:
        yield ch
    finally:
        ch.close()


@pytest.fixture
def stub(channel: Any) -> Any:
    return sgrpc.MessagingServiceStub(channel)


def message(topic: str, body: bytes, mid: str, **sp: Any) -> Any:
    return grpc_message(topic, body, mid, **sp)


def commit_log_end(bt: BrokerThread) -> int:
    def get() -> int:
        assert bt.controller is not None
        return int(bt.controller.store.max_phy_offset)

    return int(bt.run(get))


def receive(stub: Any, topic: str, group: str, invisible: float = 10, poll: float = 0.2) -> Any:
    req = receive_request(
        group, topic, invisible_ms=int(invisible * 1000), poll_ms=int(poll * 1000)
    )
    out = list(stub.ReceiveMessage(req, metadata=MD, timeout=10))
    status = out[0].status
    msgs = [r.message for r in out if r.HasField("message")]
    return status, msgs


def ack(stub: Any, topic: str, group: str, m: Any) -> Any:
    entry = spb.AckMessageEntry(
        message_id=m.system_properties.message_id,
        receipt_handle=m.system_properties.receipt_handle,
    )
    req = spb.AckMessageRequest(
        group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=[entry]
    )
    return stub.AckMessage(req, metadata=MD, timeout=10)


def test_route_auto_creates_and_unknown_topic_is_not_found(
    broker_thread_factory: Callable[..., BrokerThread],
) -> None:
    on = broker_thread_factory(grpc_server_enable=True, grpc_server_port=0)
    off = broker_thread_factory(
        grpc_server_enable=True, grpc_server_port=0, auto_create_topic_enable=False
    )
    for b, expect in ((on, pb.OK), (off, pb.TOPIC_NOT_FOUND)):
        assert b.controller is not None
        with grpc.insecure_channel(f"127.0.0.1:{b.controller.grpc_port}") as ch:
            r = sgrpc.MessagingServiceStub(ch).QueryRoute(
                spb.QueryRouteRequest(topic=pb.Resource(name="fresh-topic")),
                metadata=MD,
                timeout=10,
            )
        assert r.status.code == expect, r.status
        if expect == pb.OK:
            assert len(r.message_queues) == 4
            q = r.message_queues[0]
            assert q.permission == pb.READ_WRITE and q.broker.id == 0
            assert q.broker.endpoints.addresses[0].port == b.controller.grpc_port
            assert set(q.accept_message_types) == {pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION}
        else:
            assert b.run(functools.partial(b.controller.topics.get, "fresh-topic")) is None


def test_unknown_method_is_unimplemented(channel: Any) -> None:
    call = channel.unary_unary(SERVICE + "NoSuchMethod")
    with pytest.raises(grpc.RpcError) as e:
        call(b"", metadata=MD, timeout=10)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_unserved_rpcs_answer_not_implemented(stub: Any) -> None:
    r = stub.QueryOffset(spb.QueryOffsetRequest(), metadata=MD, timeout=10)
    assert r.status.code == pb.NOT_IMPLEMENTED and "QueryOffset" in r.status.message
    r = stub.SyncLiteSubscription(spb.SyncLiteSubscriptionRequest(), metadata=MD, timeout=10)
    assert r.status.code == pb.NOT_IMPLEMENTED
    [p] = list(stub.PullMessage(spb.PullMessageRequest(), metadata=MD, timeout=10))
    assert p.status.code == pb.NOT_IMPLEMENTED


def test_malformed_protobuf_is_refused_and_stores_nothing(bt: BrokerThread, channel: Any) -> None:
    before = commit_log_end(bt)
    call = channel.unary_unary(SERVICE + "SendMessage")
    with pytest.raises(grpc.RpcError) as e:
        call(b"\x0a\xff\xff\xff\xff\x0f garbage", metadata=MD, timeout=10)
    # grpc-java (RocketMQ's proxy) and grpcio both answer a request that does not parse so
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert commit_log_end(bt) == before


def test_bad_messages_get_rocketmq_statuses_and_store_nothing(bt: BrokerThread, stub: Any) -> None:
    before = commit_log_end(bt)
    cases = [
        (message("t-bad", b"x" * (64 * 1024 + 1), "id1"), pb.MESSAGE_BODY_TOO_LARGE),
        (message("t-bad", b"", "id2"), pb.MESSAGE_BODY_EMPTY),
        (message("bad topic!", b"x", "id3"), pb.ILLEGAL_TOPIC),
        (message("t-bad", b"x", "id4", tag="a|b"), pb.ILLEGAL_MESSAGE_TAG),
        (
            message("t-bad", b"x", "id5", message_type=pb.FIFO),
            pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        ),
        (message("t-bad", b"x", ""), pb.ILLEGAL_MESSAGE_ID),
    ]
    reserved = message("t-bad", b"x", "id6")
    reserved.user_properties["PGROUP"] = "x"
    cases.append((reserved, pb.ILLEGAL_MESSAGE_PROPERTY_KEY))
    for m, code in cases:
        r = stub.SendMessage(spb.SendMessageRequest(messages=[m]), metadata=MD, timeout=10)
        assert r.status.code == code, (code, r.status)
        assert r.entries[0].status.code == code
    # a good message next to a bad one: the whole request is refused
    good = message("t-bad", b"fine", "id7")
    r = stub.SendMessage(
        spb.SendMessageRequest(messages=[good, cases[0][0]]), metadata=MD, timeout=10
    )
    assert r.status.code == pb.MESSAGE_BODY_TOO_LARGE
    assert commit_log_end(bt) == before
    # no client id
    r = stub.SendMessage(spb.SendMessageRequest(messages=[good]), timeout=10)
    assert r.status.code == pb.CLIENT_ID_REQUIRED
    assert commit_log_end(bt) == before


def test_oversize_frame_is_refused_by_grpc(bt: BrokerThread, stub: Any) -> None:
    before = commit_log_end(bt)
    huge = message("t-huge", b"x" * (3 * 1024 * 1024), "idh")
    with pytest.raises(grpc.RpcError) as e:
        stub.SendMessage(spb.SendMessageRequest(messages=[huge]), metadata=MD, timeout=10)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert commit_log_end(bt) == before


def test_unknown_topic_on_send_and_receive(
    broker_thread_factory: Callable[..., BrokerThread],
) -> None:
    b = broker_thread_factory(
        grpc_server_enable=True, grpc_server_port=0, auto_create_topic_enable=False
    )
    assert b.controller is not None
    with grpc.insecure_channel(f"127.0.0.1:{b.controller.grpc_port}") as ch:
        s = sgrpc.MessagingServiceStub(ch)
        r = s.SendMessage(
            spb.SendMessageRequest(messages=[message("nope", b"x", "i1")]), metadata=MD, timeout=10
        )
        assert r.status.code == pb.TOPIC_NOT_FOUND
        status, msgs = receive(s, "nope", "g")
        assert status.code == pb.TOPIC_NOT_FOUND and msgs == []


def test_invisible_message_comes_back_with_a_new_handle(bt: BrokerThread, stub: Any) -> None:
    topic, group = "t-inv", "g-inv"
    r = stub.SendMessage(
        spb.SendMessageRequest(messages=[message(topic, b"m", "mid-1", tag="A")]),
        metadata=MD,
        timeout=10,
    )
    assert r.status.code == pb.OK and r.entries[0].message_id == "mid-1"
    status, [m1] = receive(stub, topic, group, invisible=1)
    assert status.code == pb.OK and m1.system_properties.delivery_attempt == 1
    assert m1.system_properties.tag == "A" and m1.body == b"m"
    # invisible: nothing now
    status, none = receive(stub, topic, group, poll=0.1)
    assert status.code == pb.MESSAGE_NOT_FOUND and none == []
    # visible again after 1 s, handed out with a new handle; the old one no longer acks
    status, [m2] = receive(stub, topic, group, invisible=10, poll=5)
    assert m2.system_properties.delivery_attempt == 2
    stale = ack(stub, topic, group, m1)
    assert stale.status.code == pb.INVALID_RECEIPT_HANDLE
    # ChangeInvisibleDuration gives a newer handle, which acks
    cid = stub.ChangeInvisibleDuration(
        change_invisible_request(group, topic, m2.system_properties.receipt_handle, "mid-1"),
        metadata=MD,
        timeout=10,
    )
    assert cid.status.code == pb.OK and cid.receipt_handle != m2.system_properties.receipt_handle
    m2.system_properties.receipt_handle = cid.receipt_handle
    assert ack(stub, topic, group, m2).status.code == pb.OK

    def committed() -> dict[int, int]:
        assert bt.controller is not None
        return dict(bt.controller.offsets.offsets(group, topic))

    assert sum(bt.run(committed).values()) == 1


def test_check_budget_counts_only_checks_written_to_a_live_stream(
    broker_thread_factory: Callable[..., BrokerThread],
) -> None:
    b = broker_thread_factory(grpc_server_enable=True, grpc_server_port=0)
    assert b.controller is not None
    with grpc.insecure_channel(f"127.0.0.1:{b.controller.grpc_port}") as ch:
        s = sgrpc.MessagingServiceStub(ch)
        half = message("t-half", b"h", "half-1", message_type=pb.TRANSACTION)
        r = s.SendMessage(spb.SendMessageRequest(messages=[half]), metadata=MD, timeout=10)
        assert r.status.code == pb.OK and r.entries[0].transaction_id == "half-1"
        due_at = time.monotonic() + b.controller.config.transaction_time_out / 1000

        def rec() -> Any:
            assert b.controller is not None
            return b.controller.transactions.records["half-1"]

        def rounds() -> int:
            assert b.controller is not None
            return b.controller.transactions.rounds

        # No Telemetry stream: a check round that ran after the half was due has nothing to
        # write the check on, and counts nothing.  Wait until the half is due, then for two
        # more rounds (the second began after the half was due).
        wait_until_sync(lambda: time.monotonic() >= due_at, 10, "the half to be due")
        start = b.run(rounds)
        wait_until_sync(lambda: b.run(rounds) >= start + 2, 30, f"two check rounds from {start}")
        assert b.run(rec).check_times == 0
        # open a stream that announces the topic: the next round writes the command on it
        settings = spb.TelemetryCommand(
            settings=pb.Settings(
                client_type=pb.PRODUCER,
                publishing=pb.Publishing(topics=[pb.Resource(name="t-half")]),
            )
        )
        import queue

        q: queue.Queue[Any] = queue.Queue()
        q.put(settings)

        def requests() -> Iterator[Any]:
            while True:
                item = q.get()
                if item is None:
                    return
                yield item

        call = s.Telemetry(requests(), metadata=MD, timeout=30)
        try:
            first = next(call)
            assert first.status.code == pb.OK
            assert first.settings.publishing.max_body_size == b.controller.config.max_message_size
            cmd = next(call)
            assert cmd.HasField("recover_orphaned_transaction_command")
            rc = cmd.recover_orphaned_transaction_command
            assert rc.transaction_id == "half-1" and rc.message.body == b"h"
            assert rc.message.topic.name == "t-half"
            # counted once the write completed (the client may see the command first)
            wait_until_sync(lambda: b.run(rec).check_times >= 1, 10, "the check to be counted")

            def decide(resolution: int, source: int) -> Any:
                req = end_transaction_request(
                    "t-half", "half-1", resolution, source, message_id="half-1"
                )
                return s.EndTransaction(req, metadata=MD, timeout=10)

            end = decide(pb.ROLLBACK, pb.SOURCE_SERVER_CHECK)
            assert end.status.code == pb.OK
            assert b.run(rec).state.value == "ROLLED_BACK"
            # a contradicting decision is refused, the outcome stays
            again = decide(pb.COMMIT, pb.SOURCE_CLIENT)
            assert again.status.code == pb.PRECONDITION_FAILED
            assert b.run(rec).state.value == "ROLLED_BACK"
        finally:
            q.put(None)
            call.cancel()
