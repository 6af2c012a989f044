"""gRPC ``delivery_timestamp`` is exact (the timer) and refused beyond ``timerMaxDelaySec``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import BrokerThread
from tests.support.waiting import wait_until_sync

grpc = pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")

from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2 as spb  # noqa: E402
from txmq.protocol.message import decode_message  # noqa: E402

MD = (("x-mq-client-id", "timer-client-1"), ("x-mq-language", "PYTHON"))
TOPIC = "grpc-timed"


@pytest.fixture
def bt(broker_thread_factory: Callable[..., BrokerThread]) -> BrokerThread:
    return broker_thread_factory(
        grpc_server_enable=True, grpc_server_port=0, timer_max_delay_sec=60
    )


def send_at(stub: Any, body: bytes, mid: str, deliver_ms: int) -> Any:
    m = pb.Message(topic=pb.Resource(name=TOPIC), body=body)
    sp = m.system_properties
    sp.message_id = mid
    sp.message_type = pb.DELAY
    sp.born_host = "127.0.0.1"
    sp.delivery_timestamp.FromMilliseconds(deliver_ms)
    return stub.SendMessage(spb.SendMessageRequest(messages=[m]), metadata=MD, timeout=10)


def stored_in_topic(bt: BrokerThread) -> list[Any]:
    def get() -> list[Any]:
        assert bt.controller is not None
        store = bt.controller.store
        out = []
        for qid in store.queue_ids(TOPIC):
            r = store.get_messages(TOPIC, qid, 0, 32)
            out.extend(r.messages)
        return out

    return [decode_message(raw) for raw in bt.run(get)]


def test_delivery_timestamp_is_exact(bt: BrokerThread, stub: Any) -> None:
    deliver = int(time.time() * 1000) + 1300  # between the test config's delay levels
    r = send_at(stub, b"exact", "C0A8000100002A9F0000000000000001", deliver)
    assert r.status.code == pb.OK, r.status
    assert stored_in_topic(bt) == [], "delivered at once"
    [m] = wait_until_sync(lambda: stored_in_topic(bt), 10, "the message delivered")
    assert 0 <= m.store_timestamp - deliver <= 1000, m.store_timestamp - deliver


def test_delivery_timestamp_beyond_the_limit_is_refused(bt: BrokerThread, stub: Any) -> None:
    r = send_at(stub, b"far", "C0A8000100002A9F0000000000000002", int(time.time() * 1000) + 61_000)
    assert r.status.code == pb.ILLEGAL_DELIVERY_TIME, r.status
    assert "timerMaxDelaySec" in r.status.message
