"""POP consumption in the core (both front ends' receive, ack and change of invisible time):
a received message is invisible for its invisible time, then delivered again with its attempt
counted and its old handle expired; an ack ends it; a change of invisible time gives a new
handle and a new deadline; after the group's ``retryMaxTimes + 1`` deliveries the message goes
to the group's dead-letter queue; and the state survives a restart."""

from __future__ import annotations

import pytest

from tests.support.core import CoreHarness, message
from txmq.broker.messaging.pop import Delivery, ReceiptHandleError
from txmq.broker.messaging.read import EVERYTHING
from txmq.broker.store.subscription_group import SubscriptionGroupConfig
from txmq.broker.topics import dlq_topic

TOPIC = "Jobs"
GROUP = "workers"
INVISIBLE_MS = 30_000


async def _receive(h: CoreHarness, batch: int = 10) -> list[Delivery]:
    """One receive that does not wait (what is visible now)."""
    return await h.core.pop.receive(
        GROUP,
        TOPIC,
        batch=batch,
        invisible_ms=INVISIBLE_MS,
        poll_s=0,
        filter=EVERYTHING,
        stopping=lambda: False,
    )


def _ack(h: CoreHarness, *handles: str) -> list[str]:
    return h.core.pop.ack(GROUP, TOPIC, list(handles), [""] * len(handles))


async def test_a_received_message_is_invisible_until_its_time(harness: CoreHarness) -> None:
    await harness.send(message(TOPIC, b"job"))

    [first] = await _receive(harness)
    assert (first.message.body, first.attempts) == (b"job", 1)
    assert await _receive(harness) == []

    harness.clock.advance(INVISIBLE_MS / 1000 - 1)
    assert await _receive(harness) == [], "visible again before its invisible time"

    harness.clock.advance(1)
    [second] = await _receive(harness)
    assert (second.message.body, second.attempts) == (b"job", 2)
    assert second.handle != first.handle
    assert "expired" in _ack(harness, first.handle)[0], "the replaced handle must not ack"
    assert _ack(harness, second.handle) == [""]


async def test_an_acked_message_is_not_delivered_again(harness: CoreHarness) -> None:
    await harness.send(message(TOPIC, b"once"))
    [d] = await _receive(harness)

    assert _ack(harness, d.handle) == [""]
    assert _ack(harness, d.handle) == [""], "acking again is fine"

    harness.clock.advance(10 * INVISIBLE_MS / 1000)
    assert await _receive(harness) == []
    assert harness.offsets.query(GROUP, TOPIC, 0) == 1


async def test_a_change_of_invisible_time_moves_the_deadline_and_the_handle(
    harness: CoreHarness,
) -> None:
    await harness.send(message(TOPIC, b"slow job"))
    [d] = await _receive(harness)

    handle = harness.core.pop.change_invisible(GROUP, TOPIC, d.handle, 120_000)

    assert handle != d.handle
    harness.clock.advance(INVISIBLE_MS / 1000)
    assert await _receive(harness) == [], "the first invisible time no longer applies"
    with pytest.raises(ReceiptHandleError):
        harness.core.pop.change_invisible(GROUP, TOPIC, d.handle, 1_000)
    assert "expired" in _ack(harness, d.handle)[0]

    harness.clock.advance(90)
    [again] = await _receive(harness)
    assert (again.message.body, again.attempts) == (b"slow job", 2)


async def test_a_change_of_invisible_time_after_the_ack_is_refused(harness: CoreHarness) -> None:
    await harness.send(message(TOPIC, b"done"))
    [d] = await _receive(harness)
    _ack(harness, d.handle)

    with pytest.raises(ReceiptHandleError, match="already acked"):
        harness.core.pop.change_invisible(GROUP, TOPIC, d.handle, 1_000)


async def test_after_its_last_attempt_a_message_goes_to_the_dead_letter_queue(
    harness: CoreHarness,
) -> None:
    harness.groups.put(SubscriptionGroupConfig(GROUP, retry_max_times=2))
    await harness.send(message(TOPIC, b"poison", uniq="POISON"), message(TOPIC, b"fine"))

    attempts = []
    for _ in range(3):
        got = await _receive(harness)
        attempts += [(d.message.body, d.attempts) for d in got]
        for d in got:
            if d.message.body == b"fine":
                _ack(harness, d.handle)
        harness.clock.advance(INVISIBLE_MS / 1000)
    assert attempts == [(b"poison", 1), (b"fine", 1), (b"poison", 2), (b"poison", 3)]

    assert await _receive(harness) == [], "a message past its attempts is not delivered"
    [dead] = harness.stored(dlq_topic(GROUP))
    assert dead.body == b"poison"
    assert dead.reconsume_times == 3
    assert harness.offsets.query(GROUP, TOPIC, 0) == 2


async def test_handles_deadlines_and_attempts_survive_a_restart(harness: CoreHarness) -> None:
    await harness.send(message(TOPIC, b"a"), message(TOPIC, b"b"))
    first, second = await _receive(harness)

    await harness.reopen()

    assert await _receive(harness) == [], "still invisible after the restart"
    assert _ack(harness, first.handle) == [""]
    harness.clock.advance(INVISIBLE_MS / 1000)
    [again] = await _receive(harness)
    assert (again.message.body, again.attempts) == (second.message.body, 2)
    assert harness.offsets.query(GROUP, TOPIC, 0) == 1
