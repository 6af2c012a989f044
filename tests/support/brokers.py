"""Brokers as tests use them: one started for a block and shut down after it (with a raw
client connected to it when asked), and what tests read of a broker's store."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

from tests.support.raw import RawClient, connected
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.protocol.message import MessageExt, decode_message


@contextlib.asynccontextmanager
async def started(
    config: BrokerConfig, *, stop_within: float | None = None, **kwargs: Any
) -> AsyncIterator[BrokerController]:
    """A broker started with ``config`` (``kwargs``: the controller's seams), shut down when
    the block ends (``stop_within``: a shutdown taking longer fails)."""
    b = BrokerController(config, **kwargs)
    await b.start()
    try:
        yield b
    finally:
        await asyncio.wait_for(b.shutdown(), stop_within)


async def start_broker(config: BrokerConfig, **kwargs: Any) -> BrokerController:
    """A broker started with ``config`` (``kwargs``: the controller's seams), for a test that
    stops it part-way (a restart, an outage): the test shuts it down."""
    b = BrokerController(config, **kwargs)
    await b.start()
    return b


async def restart_on(config: BrokerConfig, port: int) -> BrokerController:
    """A broker started again on ``config`` (what the first one was given: its store) at
    ``port`` (the first one's, so at its address) once that one has shut down; the test shuts
    it down."""
    return await start_broker(config.replace(listen_port=port))


@contextlib.asynccontextmanager
async def raw_broker(
    config: BrokerConfig, **kwargs: Any
) -> AsyncIterator[tuple[BrokerController, RawClient]]:
    """:func:`started`, with a :class:`RawClient` connected to it (closed first)."""
    async with started(config, **kwargs) as b:
        async with connected(b.address) as c:
            yield b, c


def stored(broker: BrokerController, topic: str) -> list[MessageExt]:
    """Every message of ``topic`` in the broker's store, queue by queue."""
    out: list[MessageExt] = []
    for qid in broker.store.queue_ids(topic):
        offset = 0
        while True:
            r = broker.store.get_messages(topic, qid, offset, 256)
            if not r.messages:
                break
            out.extend(decode_message(raw) for raw in r.messages)
            offset = r.next_begin_offset
    return out


async def pulled(address: str, topic: str) -> list[MessageExt]:
    """Every message a raw client pulls from ``topic`` (all its queues)."""
    async with connected(address) as c:
        return await c.pull_all(topic)


def dropped(b: BrokerController, reason: str) -> float:
    """Connections the broker dropped for ``reason`` (its metric)."""
    key = f"txmq_connections_dropped_total{{reason={reason}}}"
    return float(b.metrics.snapshot().get(key, 0.0))


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the broker closed ``sock`` (reads what is there without blocking)."""
    try:
        while True:
            data = sock.recv(1 << 20, socket.MSG_DONTWAIT)
            if not data:
                return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


async def with_transactions(
    config: BrokerConfig,
    topic: str,
    decisions: Sequence[int],
    pending: int = 1,
    *,
    padding: bytes = b"",
) -> BrokerController:
    """A started broker holding transactions of group ``g`` in ``topic`` (halves ``h0``,
    ``h1``, ...): the first decided as ``decisions`` say (8 commit, 12 roll back), then
    ``pending`` undecided; ``padding``: a plain message stored first.  The caller shuts it
    down."""
    b = BrokerController(config)
    await b.start()
    try:
        async with connected(b.address) as c:
            if padding:
                await c.send("padding", padding)
            sent = [
                await c.send(topic, f"h{i}".encode(), group="g", transactional=True)
                for i in range(len(decisions) + pending)
            ]
            for resp, decision in zip(sent, decisions, strict=False):
                assert (await c.end_transaction("g", resp, decision)).code == 0
    except BaseException:
        await b.shutdown()
        raise
    return b
