"""gRPC RecallMessage (RocketMQ 5.3): a timer message's SendResultEntry carries its recall
handle; a recalled message is never delivered; one not pending is MESSAGE_NOT_FOUND."""

from __future__ import annotations

import base64
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

MD = (("x-mq-client-id", "recall-client-1"), ("x-mq-language", "PYTHON"))
TOPIC = "grpc-recall"


@pytest.fixture
def bt(broker_thread_factory: Callable[..., BrokerThread]) -> BrokerThread:
    return broker_thread_factory(grpc_server_enable=True, grpc_server_port=0)


def send(stub: Any, body: bytes, mid: str, deliver_ms: int | None) -> Any:
    m = pb.Message(topic=pb.Resource(name=TOPIC), body=body)
    sp = m.system_properties
    sp.message_id = mid
    sp.born_host = "127.0.0.1"
    sp.message_type = pb.NORMAL
    if deliver_ms is not None:
        sp.message_type = pb.DELAY
        sp.delivery_timestamp.FromMilliseconds(deliver_ms)
    r = stub.SendMessage(spb.SendMessageRequest(messages=[m]), metadata=MD, timeout=10)
    assert r.status.code == pb.OK, r.status
    return r.entries[0]


def recall(stub: Any, handle: str) -> Any:
    req = spb.RecallMessageRequest(topic=pb.Resource(name=TOPIC), recall_handle=handle)
    return stub.RecallMessage(req, metadata=MD, timeout=10)


def stored_bodies(bt: BrokerThread) -> list[bytes]:
    def get() -> list[bytes]:
        assert bt.controller is not None
        store = bt.controller.store
        out: list[bytes] = []
        for qid in store.queue_ids(TOPIC):
            r = store.get_messages(TOPIC, qid, 0, 32)
            out.extend(bytes(decode_message(raw).body) for raw in r.messages)
        return out

    bodies: list[bytes] = bt.run(get)
    return bodies


def test_recall_message_over_grpc(bt: BrokerThread, stub: Any) -> None:
    plain = send(stub, b"plain", "C0A8000100002A9F00000000000000A0", None)
    assert plain.recall_handle == ""
    deliver = int(time.time() * 1000) + 1500
    gone = send(stub, b"recalled", "C0A8000100002A9F00000000000000A1", deliver)
    kept = send(stub, b"kept", "C0A8000100002A9F00000000000000A2", deliver + 100)
    assert gone.recall_handle and kept.recall_handle
    r = recall(stub, gone.recall_handle)
    assert r.status.code == pb.OK, r.status
    assert r.message_id == "C0A8000100002A9F00000000000000A1"

    def kept_there() -> list[bytes]:
        bodies = stored_bodies(bt)
        return bodies if b"kept" in bodies else []

    bodies = wait_until_sync(kept_there, 10, "the kept one delivered")
    assert sorted(bodies) == [b"kept", b"plain"]
    late = recall(stub, kept.recall_handle)
    assert late.status.code == pb.PRECONDITION_FAILED, late.status
    assert "delivered" in late.status.message
    assert bt.controller is not None
    name = bt.controller.config.broker_name
    future = int(time.time() * 1000) + 30_000
    raw = f"v1 {TOPIC} {name} {future} C0A8000100002A9F00000000000000A3"
    unknown = recall(stub, base64.urlsafe_b64encode(raw.encode()).decode())
    assert unknown.status.code == pb.MESSAGE_NOT_FOUND, unknown.status
    invalid = recall(stub, "???")
    assert invalid.status.code == pb.PRECONDITION_FAILED, invalid.status
    assert invalid.status.message == "recall handle is invalid"
