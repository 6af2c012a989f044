"""The gRPC front end's share of the metrics: latency per method and messages out per (topic,
group), read over HTTP from a broker serving RocketMQ 5 clients."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import BrokerThread
from tests.support.ports import free_port
from tests.support.scrape import scrape, value

grpc = pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")

from tests.compat.test_grpc_frontend import MD, message, receive  # noqa: E402
from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2 as spb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc  # noqa: E402


def test_grpc_methods_are_timed_and_receives_counted_per_group(
    broker_thread_factory: Callable[..., BrokerThread],
) -> None:
    port = free_port()
    bt = broker_thread_factory(grpc_server_enable=True, grpc_server_port=0, metrics_port=port)
    assert bt.controller is not None
    topic, group = "t-grpc-metrics", "g-grpc-metrics"
    with grpc.insecure_channel(f"127.0.0.1:{bt.controller.grpc_port}") as ch:
        stub = sgrpc.MessagingServiceStub(ch)
        for i in range(3):
            r = stub.SendMessage(
                spb.SendMessageRequest(messages=[message(topic, b"m", f"mid-{i}")]),
                metadata=MD,
                timeout=10,
            )
            assert r.status.code == pb.OK, r.status
        status, got = receive(stub, topic, group)
        assert status.code == pb.OK and len(got) == 3
    s = scrape(port)
    assert value(s, "txmq_request_latency_seconds_count", code="grpc:SendMessage") == 3
    assert value(s, "txmq_request_latency_seconds_count", code="grpc:ReceiveMessage") == 1
    assert (value(s, "txmq_request_latency_seconds_sum", code="grpc:SendMessage") or 0) > 0
    assert value(s, "txmq_messages_out_total", topic=topic, group=group) == 3
