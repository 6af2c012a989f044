"""Compressed bodies (sys flag bit 0): the SDK compresses above ``compress_over`` as RocketMQ's
clients do, stores them compressed, and every SDK consumer path gets them inflated."""

from __future__ import annotations

import dataclasses
import os
import zlib
from collections.abc import Callable

from tests.client.helpers import FAST_CLIENT
from tests.support.raw import connected
from txmq.broker.server import BrokerController
from txmq.client import AsyncProducer, AsyncPullConsumer, Message, PullStatus
from txmq.protocol.codes import RequestCode
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.message import MessageSysFlag, properties_to_string

LZ4_FRAME = b"\x04\x22\x4d\x18lz4-frame"


async def test_a_large_body_is_stored_compressed_and_read_back_inflated(
    broker: BrokerController, unique: Callable[[str], str]
) -> None:
    topic = unique("zipped")
    big, small = b"order line;" * 600, b"tiny"  # 6.6 KiB of text compresses well
    cfg = dataclasses.replace(FAST_CLIENT, compress_over=4096)
    async with AsyncProducer("zip-producer", broker=broker.address, config=cfg) as p:
        r_big = await p.send(Message(topic, big), queue_id=0)
        r_small = await p.send(Message(topic, small), queue_id=0)
    # On the wire and in the store: zlib, flagged (what a stock consumer inflates).
    async with connected(broker.address) as raw:
        _, stored = await raw.pull(topic, 0, 0)
    assert stored[0].sys_flag & MessageSysFlag.COMPRESSED
    assert zlib.decompress(stored[0].body) == big and len(stored[0].body) < len(big) // 4
    assert not stored[1].sys_flag & MessageSysFlag.COMPRESSED and stored[1].body == small
    # The SDK's consumers see the original bodies and no compression flag.
    async with AsyncPullConsumer("zip-reader", broker=broker.address, config=FAST_CLIENT) as c:
        pr = await c.pull(topic, 0, 0)
    assert pr.status is PullStatus.FOUND
    assert [m.body for m in pr.messages] == [big, small]
    assert [m.msg_id for m in pr.messages] == [r_big.msg_id, r_small.msg_id]
    assert not any(m.sys_flag & MessageSysFlag.COMPRESSED for m in pr.messages)


async def test_compression_is_off_by_default_and_a_foreign_codec_is_left_alone(
    broker: BrokerController, unique: Callable[[str], str]
) -> None:
    topic = unique("plain")
    body = os.urandom(8192)
    async with AsyncProducer("plain-producer", broker=broker.address, config=FAST_CLIENT) as p:
        await p.send(Message(topic, body), queue_id=0)
    # A body flagged compressed in a codec the SDK does not have (LZ4, from a 5.x client) is
    # delivered as stored, flag included, so the application can tell.
    async with connected(broker.address) as raw:
        lz4_flag = MessageSysFlag.COMPRESSED | (0x1 << 8)
        h = SendMessageRequestHeader(
            producer_group="raw",
            topic=topic,
            queue_id=0,
            sys_flag=lz4_flag,
            properties=properties_to_string({"UNIQ_KEY": "AB12"}),
        )
        resp = await raw.call(RequestCode.SEND_MESSAGE, h.to_ext_fields(), LZ4_FRAME)
        assert resp.code == 0, resp.remark
    async with AsyncPullConsumer("plain-reader", broker=broker.address, config=FAST_CLIENT) as c:
        pr = await c.pull(topic, 0, 0)
    first, foreign = pr.messages
    assert first.body == body and not first.sys_flag & MessageSysFlag.COMPRESSED
    assert foreign.body == LZ4_FRAME
    assert foreign.sys_flag & MessageSysFlag.COMPRESSED
