"""SYNC_FLUSH's group commit: every answer leaves only after an fsync covering its record, sends
in flight share fsyncs, and a send alone is synced at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tests.client.helpers import FAST_CLIENT, create_topic
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.client import AsyncProducer, ClientConfig, Message, SendStatus

NO_AUTO_BATCH = ClientConfig(**{**FAST_CLIENT.__dict__, "auto_batch": False})


def _flushes(b: BrokerController) -> float:
    return float(b.metrics.snapshot()["txmq_flushes_total"])


async def _sync_broker(make: Callable[..., BrokerConfig]) -> BrokerController:
    b = BrokerController(make(flush_disk_type="SYNC_FLUSH", sync_flush_timeout=20_000))
    await b.start()
    return b


async def test_every_answer_leaves_after_an_fsync_covering_its_record(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    b = await _sync_broker(make_broker_config)
    released: list[tuple[int, int]] = []
    b.flush.on_release = lambda end, flushed: released.append((end, flushed))
    late: list[tuple[int, int]] = []
    try:
        await create_topic(b.address, "sync-groups", 2)
        for cfg, in_flight, per in ((FAST_CLIENT, 200, 5), (NO_AUTO_BATCH, 100, 4)):
            async with AsyncProducer("p", broker=b.address, config=cfg) as p:

                async def one(i: int, p: AsyncProducer = p) -> None:
                    r = await p.send(Message("sync-groups", b"%06d" % i))
                    assert r.status is SendStatus.SEND_OK, r.status
                    # The record starts at the offset in its message id; an fsync covers it
                    # once the flushed offset is past that start (fsyncs end on records' ends).
                    start = int(r.offset_msg_id[-16:], 16)
                    if b.store.flushed_offset <= start:
                        late.append((start, b.store.flushed_offset))

                async def worker(k: int, per: int = per) -> None:
                    for j in range(per):
                        await one(k * per + j)

                await asyncio.wait_for(asyncio.gather(*(worker(k) for k in range(in_flight))), 60)
    finally:
        await b.shutdown()
    assert not late, f"answers before the fsync of their record: {late[:5]}"
    assert released, "no request waited for an fsync"
    bad = [(end, flushed) for end, flushed in released if flushed < end]
    assert not bad, f"released before their end was flushed: {bad[:5]}"


async def test_sends_in_flight_share_fsyncs_and_one_alone_has_its_own(
    make_broker_config: Callable[..., BrokerConfig],
) -> None:
    b = await _sync_broker(make_broker_config)
    try:
        await create_topic(b.address, "sync-share", 1)
        async with AsyncProducer("p", broker=b.address, config=NO_AUTO_BATCH) as p:
            # One at a time: each send is a group of its own (nothing else is in flight).
            before = _flushes(b)
            for i in range(20):
                r = await p.send(Message("sync-share", b"alone %d" % i))
                assert r.status is SendStatus.SEND_OK
            alone = _flushes(b) - before
            assert alone >= 20, f"{alone} fsyncs for 20 sends one at a time"
            # 400 single-message requests, 100 in flight: fsyncs shared by groups of them.
            before = _flushes(b)

            async def worker(k: int) -> None:
                for j in range(4):
                    r = await p.send(Message("sync-share", b"group %d" % (k * 4 + j)))
                    assert r.status is SendStatus.SEND_OK

            await asyncio.wait_for(asyncio.gather(*(worker(k) for k in range(100))), 60)
            shared = _flushes(b) - before
            assert shared <= 100, f"{shared} fsyncs for 400 requests, 100 in flight"
    finally:
        await b.shutdown()
