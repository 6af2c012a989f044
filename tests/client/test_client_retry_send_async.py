"""Retries with exponential backoff and full jitter, and ``Producer.send_async`` for blocking
callers, against real brokers."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest

from tests.client.helpers import FAST_CLIENT, wait_until
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController
from txmq.client import (
    AsyncProducer,
    ClientConfig,
    ConnectionClosedError,
    Message,
    Producer,
    RetryPolicy,
    SendResult,
    SendStatus,
)


def test_backoff_caps_grow_exponentially_up_to_max_delay() -> None:
    policy = RetryPolicy(base_delay=0.1, multiplier=2.0, max_delay=1.0)
    assert [policy.cap(n) for n in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    no_jitter = RetryPolicy(base_delay=0.1, max_delay=1.0, jitter=False)
    assert [no_jitter.delay(n) for n in range(5)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0])


def test_full_jitter_draws_vary_within_the_cap() -> None:
    policy = RetryPolicy(base_delay=0.1, max_delay=10.0)
    rng = random.Random(35)
    for retry in range(5):
        draws = [policy.delay(retry, rng) for _ in range(200)]
        assert all(0.0 <= d <= policy.cap(retry) for d in draws)
        assert len(set(draws)) > 150  # jittered, not one value
        # full jitter: spread over the whole range, so the mean sits near half the cap
        assert 0.35 * policy.cap(retry) < sum(draws) / len(draws) < 0.65 * policy.cap(retry)
    # a fixed seed gives the same waits: reproducible
    assert policy.delay(3, random.Random(1)) == policy.delay(3, random.Random(1))


def test_retry_policy_settings() -> None:
    assert ClientConfig().send_attempts == 3  # 1 + retry_times_when_send_failed, as before
    assert ClientConfig(retry_times_when_send_failed=0).send_attempts == 1
    assert ClientConfig(retry_policy=RetryPolicy(max_attempts=5)).send_attempts == 5
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(multiplier=0.5)


async def test_producer_waits_longer_before_each_retry_of_a_failing_send(
    make_broker_config: Callable[..., BrokerConfig], unique: Callable[[str], str]
) -> None:
    broker = BrokerController(make_broker_config())
    await broker.start()
    topic = unique("retry")
    producer = AsyncProducer(
        "p",
        broker=broker.address,
        config=FAST_CLIENT,
        request_timeout=0.2,
        retry_policy=RetryPolicy(max_attempts=4, base_delay=0.05, max_delay=0.15, jitter=False),
    )
    waits: list[float] = []

    async def record(seconds: float) -> None:  # the sleep seam: no wall-clock asserts
        waits.append(seconds)

    producer._sleep = record
    try:
        await producer.start()
        await producer.send(Message(topic, b"ok"))
        assert waits == []  # a send that succeeds at once never waits
        await broker.shutdown()
        await wait_until(lambda: not producer.connection.connected, what="the disconnect")
        with pytest.raises(ConnectionClosedError):
            await producer.send(Message(topic, b"while down"))
        assert waits == pytest.approx([0.05, 0.1, 0.15])  # 4 attempts: 3 growing waits, capped
    finally:
        await producer.shutdown()
        await broker.shutdown()


def test_send_async_from_blocking_code(
    broker_thread: BrokerController, unique: Callable[[str], str]
) -> None:
    topic = unique("async-send")
    called: list[tuple[SendResult | None, BaseException | None, str]] = []
    done = threading.Event()

    def callback(result: SendResult | None, error: BaseException | None) -> None:
        called.append((result, error, threading.current_thread().name))
        if len(called) == 10:
            done.set()

    with Producer("p", broker=broker_thread.address, config=FAST_CLIENT) as producer:
        futures = [
            producer.send_async(Message(topic, f"m{i}".encode()), callback) for i in range(10)
        ]
        results = [f.result(timeout=10) for f in futures]
        assert all(r.status is SendStatus.SEND_OK for r in results)
        assert len({r.msg_id for r in results}) == 10
        # each callback has returned before its future was resolved
        assert done.is_set(), f"{len(called)} of 10 callbacks ran before the futures resolved"
        assert all(r is not None and e is None for r, e, _ in called)
        assert {r.msg_id for r, _, _ in called if r} == {r.msg_id for r in results}
        # options of send() pass through; an error reaches both the future and the callback
        one = producer.send_async(Message(topic, b"q1"), queue_id=1).result(timeout=10)
        assert one.queue_id == 1
        errors: list[BaseException | None] = []
        bad = producer.send_async(Message(topic, b"x"), lambda r, e: errors.append(e), queue_id=99)
        with pytest.raises(Exception) as failed:
            bad.result(timeout=10)
        assert errors and errors[0] is failed.value
        # a slow callback: the future waits for it, so the waiting thread sees its effect
        seen: list[str] = []

        def slow(result: SendResult | None, error: BaseException | None) -> None:
            time.sleep(0.2)
            seen.append("called")

        producer.send_async(Message(topic, b"z"), slow).result(timeout=10)
        assert seen == ["called"]

        # a callback that raises is logged; the future still gets the result
        def raises(result: SendResult | None, error: BaseException | None) -> None:
            raise ValueError("a bug in the callback")

        ok = producer.send_async(Message(topic, b"y"), raises).result(timeout=10)
        assert ok.status is SendStatus.SEND_OK
