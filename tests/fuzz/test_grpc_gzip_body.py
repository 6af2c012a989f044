"""A GZIP-encoded body sent over gRPC is inflated up to maxMessageSize and no further: a small
request that would inflate to far more is refused before anything is stored, and a body that
does not inflate is MESSAGE_CORRUPTED."""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.conftest import BrokerThread

grpc = pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")

from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2 as spb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc  # noqa: E402

MD = (("x-mq-client-id", "gzip-client-1"), ("x-mq-language", "PYTHON"))
LIMIT = 64 * 1024


@pytest.fixture
def bt(broker_thread_factory: Callable[..., BrokerThread]) -> BrokerThread:
    return broker_thread_factory(
        grpc_server_enable=True, grpc_server_port=0, max_message_size=LIMIT
    )


@pytest.fixture
def stub(bt: BrokerThread) -> Iterator[Any]:
    assert bt.controller is not None
    with grpc.insecure_channel(f"127.0.0.1:{bt.controller.grpc_port}") as ch:
        yield sgrpc.MessagingServiceStub(ch)


def send(stub: Any, body: bytes, mid: str) -> Any:
    m = pb.Message(topic=pb.Resource(name="gz"), body=body)
    m.system_properties.message_id = mid
    m.system_properties.message_type = pb.NORMAL
    m.system_properties.body_encoding = pb.GZIP
    m.system_properties.born_host = "127.0.0.1"
    return stub.SendMessage(spb.SendMessageRequest(messages=[m]), metadata=MD, timeout=10)


def commit_log_end(bt: BrokerThread) -> int:
    def get() -> int:
        assert bt.controller is not None
        return int(bt.controller.store.max_phy_offset)

    return int(bt.run(get))


def test_gzip_bodies_over_grpc(bt: BrokerThread, stub: Any) -> None:
    ok = send(stub, gzip.compress(b"z" * LIMIT), "g-ok")
    assert ok.status.code == pb.OK, ok.status.message
    stored = commit_log_end(bt)

    # 4 MiB of zeros from about 4 KiB: refused, nothing stored.
    bomb = gzip.compress(bytes(4 * 1024 * 1024))
    assert len(bomb) < LIMIT
    r = send(stub, bomb, "g-bomb")
    assert r.status.code == pb.MESSAGE_BODY_TOO_LARGE, r.status
    assert "maxMessageSize" in r.status.message

    r = send(stub, gzip.compress(b"z" * 100)[:-4], "g-cut")
    assert r.status.code == pb.MESSAGE_CORRUPTED, r.status
    assert commit_log_end(bt) == stored
