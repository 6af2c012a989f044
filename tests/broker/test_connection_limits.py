"""What one client connection may hold of the broker: a client that sends pulls and never reads
its answers is dropped once they pass maxConnectionWriteBuffer (reading its requests pauses
before), a client holding a partial frame past frameReadTimeout (a slow-loris) is dropped, and
every other client is served meanwhile."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from tests.support.brokers import closed_by_peer, dropped, raw_broker
from tests.support.raw import unread_pulls
from tests.support.waiting import wait_until
from txmq.broker.config import BrokerConfig
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.frame import encode_frame


async def test_a_client_that_never_reads_is_dropped_and_others_are_served(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    async with raw_broker(make_broker_config(max_connection_write_buffer=1024 * 1024)) as (b, c):
        frames = await unread_pulls(c, "flood")  # 25 MiB of answers never read
        host, port = b.address.rsplit(":", 1)
        greedy = socket.create_connection((host, int(port)))
        greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        greedy.sendall(frames)
        await wait_until(
            lambda: dropped(b, "write_buffer") >= 1, 30, "the client that never reads dropped"
        )
        # Everyone else is served as before.
        assert (await c.send("flood", b"after", queue_id=1)).code == ResponseCode.SUCCESS
        _resp, got = await c.pull("flood", 1, 0)
        assert [m.body for m in got] == [b"after"]
        await wait_until(
            lambda: len(b._connections) == 1, 10, "the dropped connection gone from the broker"
        )
        greedy.close()


async def test_a_partial_frame_held_too_long_is_dropped(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    async with raw_broker(make_broker_config(frame_read_timeout=500)) as (b, c):
        host, port = b.address.rsplit(":", 1)
        lorises = [socket.create_connection((host, int(port))) for _ in range(20)]
        try:
            for s in lorises:
                s.sendall(b"\x00\x00\x01\x00\x00\x00")  # half a frame's head, then nothing
            # Slow but steady: a frame sent in pieces within the timeout is served.
            steady = socket.create_connection((host, int(port)))
            frame = encode_frame(RemotingCommand.request(RequestCode.HEART_BEAT, {}, b"{}"))
            for i in range(0, len(frame), 8):
                steady.sendall(frame[i : i + 8])
                await asyncio.sleep(0.01)  # pacing the pieces, not waiting for a result
            await wait_until(
                lambda: dropped(b, "partial_frame") >= 20,
                30,
                "the 20 slow-loris connections dropped",
            )
            # counted when the broker closes them; the close reaches the socket a moment later
            await wait_until(
                lambda: all(closed_by_peer(s) for s in lorises), 10, "the lorises' sockets closed"
            )
            steady.settimeout(10)
            assert len(steady.recv(4096)) > 0, "the steady client got no answer"
            steady.close()
            assert (await c.send("loris", b"fine")).code == ResponseCode.SUCCESS
        finally:
            for s in lorises:
                s.close()
