"""Fixtures of the compatibility tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import BrokerThread


@pytest.fixture
def stub(bt: BrokerThread) -> Iterator[Any]:
    """A gRPC MessagingService stub on the module's broker ``bt`` (its gRPC port).  grpc is
    imported here: the modules that use it skip without it."""
    import grpc

    from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc

    assert bt.controller is not None
    with grpc.insecure_channel(f"127.0.0.1:{bt.controller.grpc_port}") as ch:
        yield sgrpc.MessagingServiceStub(ch)
