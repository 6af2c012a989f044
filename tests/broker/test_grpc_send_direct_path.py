"""A gRPC SendMessage of one plain message (normal or FIFO) is stored as the remoting port
stores a plain SEND_MESSAGE: straight from its properties string.  Two brokers, one with
``batchFastPathEnable`` off (the generic path), get the same gRPC sends and must answer the
same and store the same bytes; sends the direct path leaves (a delivery time, a transaction, a
GZIP body, a resend) are answered as before."""

from __future__ import annotations

import gzip
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.fastpath import BrokerPair, broker_pair, same_record
from txmq.broker.server import BrokerController

grpc = pytest.importorskip("grpc", reason="the grpc extra (grpcio, protobuf) is not installed")

from txmq.broker.grpc.vendor.v2 import definition_pb2 as pb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2 as spb  # noqa: E402
from txmq.broker.grpc.vendor.v2 import service_pb2_grpc as sgrpc  # noqa: E402

MD = (("x-mq-client-id", "direct-client-1"), ("x-mq-language", "PYTHON"))
TOPIC = "grpc-direct"


@pytest.fixture
async def pair(make_broker_config: Any) -> AsyncIterator[BrokerPair]:
    async with broker_pair(
        make_broker_config, grpc_server_enable=True, grpc_server_port=0, default_topic_queue_nums=1
    ) as p:
        yield p


def message(mid: str, **sp: Any) -> Any:
    m = pb.Message(topic=pb.Resource(name=TOPIC), body=sp.pop("body", f"body-{mid}".encode()))
    for k, v in sp.pop("user", {}).items():
        m.user_properties[k] = v
    s = m.system_properties
    s.message_id = mid
    s.message_type = sp.pop("message_type", pb.NORMAL)
    s.born_host = "10.1.2.3"
    s.born_timestamp.FromMilliseconds(1_700_000_000_000)
    for k, v in sp.items():
        if k == "keys":
            s.keys.extend(v)
        elif k == "delivery_ms":
            s.delivery_timestamp.FromMilliseconds(v)
        else:
            setattr(s, k, v)
    return m


def _clock_free(answer: Any) -> str:
    return re.sub(r"delivery in \d+s", "delivery in Ns", str(answer))


async def send_both(pair: BrokerPair, stubs: list[Any], m: Any) -> list[Any]:
    """The answers of both brokers; the record each stored at the same offset is the same."""
    offset = pair.fast.store.max_phy_offset
    assert offset == pair.generic.store.max_phy_offset
    answers = []
    for stub in stubs:
        r = await stub.SendMessage(spb.SendMessageRequest(messages=[m]), metadata=MD, timeout=10)
        answers.append(r)
    a, b = answers
    # the same answer, but for a delay counted from each broker's own clock ("delivery in Ns"):
    # the two answers may straddle a second on a loaded machine
    assert _clock_free(a) == _clock_free(b), (a, b)
    if pair.fast.store.max_phy_offset > offset:
        same_record(pair, offset)
    return answers


def direct(b: BrokerController) -> int:
    """Plain messages a direct path stored (the one seam counts every send it takes)."""
    return b.core.fast.counts.one_plain


async def test_plain_grpc_sends_are_stored_directly_with_the_same_bytes(pair: BrokerPair) -> None:
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{b.grpc_port}") for b in (pair.fast, pair.generic)
    ]
    stubs = [sgrpc.MessagingServiceStub(ch) for ch in channels]
    try:
        plain = [
            message("m-1"),
            message("m-2", tag="TagA", keys=["k1", "k2"], user={"région": "Zürich ✓", "e": ""}),
            message("m-3", message_type=pb.FIFO, message_group="g-1", tag="T"),
            message("m-4", user={"a": "1", "b": "2"}),
        ]
        for m in plain:
            before = direct(pair.fast)
            [r, _] = await send_both(pair, stubs, m)
            assert r.status.code == pb.OK, r.status
            assert direct(pair.fast) == before + 1, m
        assert direct(pair.generic) == 0
        # left to the generic path, answered alike
        others = [
            message("m-1"),  # a resend: the first send's receipt
            message("d-1", message_type=pb.DELAY, delivery_ms=4_000_000_000_000),
            message("t-1", message_type=pb.TRANSACTION),
            message("z-1", body=gzip.compress(b"zipped"), body_encoding=pb.GZIP),
            message("bad\x01id"),
        ]
        for m in others:
            before = direct(pair.fast)
            await send_both(pair, stubs, m)
            assert direct(pair.fast) == before, m
    finally:
        for ch in channels:
            await ch.close()
