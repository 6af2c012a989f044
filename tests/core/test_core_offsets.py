"""Consumer offsets as the core keeps them: a pull commits the progress its consumer reports,
a POP group's committed offset moves only over the acked prefix (acks in any order, never
backwards), a reset moves it back and the queue is delivered again from there, and committed
offsets outlive a restart."""

from __future__ import annotations

from tests.support.core import CoreHarness, message
from txmq.broker.messaging.pop import Delivery
from txmq.broker.messaging.read import EVERYTHING

TOPIC = "Ledger"
GROUP = "bookkeepers"


async def _fill(h: CoreHarness, n: int) -> None:
    await h.send(*(message(TOPIC, f"m{i}".encode()) for i in range(n)))


async def _receive(h: CoreHarness) -> list[Delivery]:
    return await h.core.pop.receive(
        GROUP,
        TOPIC,
        batch=32,
        invisible_ms=60_000,
        poll_s=0,
        filter=EVERYTHING,
        stopping=lambda: False,
    )


def _ack(h: CoreHarness, d: Delivery) -> None:
    assert h.core.pop.ack(GROUP, TOPIC, [d.handle], [""]) == [""]


def _committed(h: CoreHarness) -> int:
    return h.offsets.query(GROUP, TOPIC, 0)


async def test_a_pull_commits_the_progress_its_consumer_reports(harness: CoreHarness) -> None:
    await _fill(harness, 3)
    reads = harness.core.reads

    await reads.pull(GROUP, TOPIC, 0, 0, 32, EVERYTHING)
    assert _committed(harness) == -1, "a pull without progress commits nothing"

    await reads.pull(GROUP, TOPIC, 0, 2, 32, EVERYTHING, commit_offset=2)
    assert _committed(harness) == 2
    await reads.pull(GROUP, TOPIC, 0, 3, 32, EVERYTHING, commit_offset=0)
    assert _committed(harness) == 2, "a reported 0 is no progress"


async def test_acks_out_of_order_commit_only_the_acked_prefix(harness: CoreHarness) -> None:
    await _fill(harness, 4)
    d0, d1, d2, d3 = await _receive(harness)

    _ack(harness, d2)
    _ack(harness, d1)
    assert _committed(harness) == -1, "offset 0 is not acked: nothing is committed yet"
    _ack(harness, d0)
    assert _committed(harness) == 3, "0, 1 and 2 are acked: the group goes on at 3"

    _ack(harness, d1)  # again, late
    assert _committed(harness) == 3, "a late ack must not move the offset back"
    _ack(harness, d3)
    assert _committed(harness) == 4


async def test_a_reset_moves_the_offset_back_and_delivers_again(harness: CoreHarness) -> None:
    await _fill(harness, 3)
    for d in await _receive(harness):
        _ack(harness, d)
    assert _committed(harness) == 3

    harness.offsets.commit(GROUP, TOPIC, 0, 1)
    harness.core.pop.reset(GROUP, TOPIC, 0, 1)

    assert [d.message.body for d in await _receive(harness)] == [b"m1", b"m2"]
    assert _committed(harness) == 1, "the reset offset stands until the acks move it"


async def test_a_reset_survives_a_restart(harness: CoreHarness) -> None:
    await _fill(harness, 3)
    for d in await _receive(harness):
        _ack(harness, d)
    harness.offsets.commit(GROUP, TOPIC, 0, 0)
    harness.core.pop.reset(GROUP, TOPIC, 0, 0)

    await harness.reopen()

    assert _committed(harness) == 0
    assert [d.message.body for d in await _receive(harness)] == [b"m0", b"m1", b"m2"]


async def test_committed_offsets_outlive_a_restart(harness: CoreHarness) -> None:
    await _fill(harness, 5)
    got = await _receive(harness)
    for d in got[:3]:
        _ack(harness, d)

    await harness.reopen()

    assert _committed(harness) == 3
    harness.clock.advance(60)
    assert [d.message.body for d in await _receive(harness)] == [b"m3", b"m4"]
