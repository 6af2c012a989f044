"""The SDK's consumer and transaction traces on a real broker (``enable_trace``): a push
consumer's and an orderly consumer's SubBefore / SubAfter records around each callback, a
transaction producer's EndTransaction records (its decision and its check answer), all in
RocketMQ's encoding and in ``txmq trace``'s timeline; with tracing off nothing is sent."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from tests.client.helpers import FAST_CLIENT
from tests.support.waiting import wait_until
from txmq.broker.server import BrokerController
from txmq.cli.trace import collect, timeline
from txmq.client import (
    AsyncOrderlyPushConsumer,
    AsyncProducer,
    AsyncPushConsumer,
    AsyncTransactionProducer,
    ClientConfig,
    LocalTransactionState,
    Message,
    MessageExt,
    TransactionListener,
)
from txmq.client.admin import AsyncAdminClient
from txmq.protocol.trace import TRACE_TOPIC, TraceRecord, TraceType

TRACED = dataclasses.replace(FAST_CLIENT, enable_trace=True)


def _records_of(
    admin: AsyncAdminClient, msg_id: str, want: Callable[[list[TraceRecord]], bool]
) -> Callable[[], Awaitable[list[TraceRecord]]]:
    async def get() -> list[TraceRecord]:
        got = await collect(admin, msg_id)
        return got if want(got) else []

    return get


def _consumer_records(records: list[TraceRecord], group: str) -> list[TraceRecord]:
    return [
        r
        for r in records
        if r.type in (TraceType.SUB_BEFORE, TraceType.SUB_AFTER) and r.group == group
    ]


async def _consumer_trace(
    admin: AsyncAdminClient, msg_id: str, group: str, at_least: int, what: str
) -> list[TraceRecord]:
    """Wait (30 s at most) until the trace of ``msg_id`` holds ``at_least`` SubBefore and
    SubAfter records of ``group``; return all its records."""
    return await wait_until(
        _records_of(admin, msg_id, lambda r: len(_consumer_records(r, group)) >= at_least),
        30,
        what,
    )


async def test_a_push_consumer_traces_each_callback(broker: BrokerController) -> None:
    """One message consumed at once, one whose callback fails once then succeeds (from the
    retry topic): a SubBefore before each call and a SubAfter after it, sharing a request id,
    success and retry count as they were."""
    addr = broker.address
    calls: list[bytes] = []

    async def callback(m: MessageExt) -> None:
        calls.append(m.body)
        if m.body == b"flaky" and m.reconsume_times == 0:
            raise RuntimeError("not yet")

    consumer = AsyncPushConsumer("billing", addr, consume_from="first", config=TRACED)
    consumer.subscribe("orders", "*", callback)
    async with AsyncProducer("shop", addr, config=FAST_CLIENT) as producer:
        ok = await producer.send(Message("orders", b"fine", keys="order-1"))
        flaky = await producer.send(Message("orders", b"flaky"))
    await consumer.start()
    try:
        await wait_until(lambda: sorted(calls) == [b"fine", b"flaky", b"flaky"], 60, "3 calls")
    finally:
        await consumer.shutdown()
    async with AsyncAdminClient(addr) as admin:
        fine = await _consumer_trace(
            admin, ok.msg_id, "billing", 2, "the first message's consumer records"
        )
        again = await _consumer_trace(
            admin, flaky.msg_id, "billing", 4, "the flaky message's consumer records"
        )
    before, after = _consumer_records(fine, "billing")
    assert (before.type, before.msg_id, before.keys, before.retry_times) == (
        TraceType.SUB_BEFORE,
        ok.msg_id,
        "order-1",
        0,
    )
    assert (after.type, after.msg_id, after.success, after.context_code) == (
        TraceType.SUB_AFTER,
        ok.msg_id,
        True,
        0,
    )
    assert after.request_id == before.request_id != ""
    assert after.timestamp >= before.timestamp > 0 and after.cost_time >= 0
    steps = [(r.type, r.success, r.retry_times) for r in _consumer_records(again, "billing")]
    assert steps == [
        (TraceType.SUB_BEFORE, True, 0),
        (TraceType.SUB_AFTER, False, 0),
        (TraceType.SUB_BEFORE, True, 1),
        (TraceType.SUB_AFTER, True, 0),
    ], steps
    first, failed, second, done = _consumer_records(again, "billing")
    assert failed.request_id == first.request_id != second.request_id == done.request_id
    assert failed.context_code == 2  # RocketMQ's ConsumeReturnType.EXCEPTION
    # the timeline ``txmq trace`` prints names them
    rows = [(r["step"], r["groupName"], r["what"]) for r in timeline(fine)]
    assert [row[:2] for row in rows] == [("consuming", "billing"), ("consumed", "billing")], rows
    assert rows[1][2].startswith("consumed by billing in ")
    failed_rows = [r["step"] for r in timeline(again)]
    assert failed_rows == ["consuming", "consume-failed", "consuming", "consumed"], failed_rows


async def test_an_orderly_consumer_traces_each_callback(broker: BrokerController) -> None:
    addr = broker.address
    got: list[bytes] = []
    consumer = AsyncOrderlyPushConsumer(
        "in-order",
        addr,
        consume_from="first",
        lock_interval=0.5,
        suspend_interval=0.05,
        config=TRACED,
    )
    consumer.subscribe("sequence", "*", lambda m: got.append(m.body))
    async with AsyncProducer("p", addr, config=FAST_CLIENT) as producer:
        sent = [await producer.send(Message("sequence", b"%d" % i), queue_id=0) for i in range(3)]
    await consumer.start()
    try:
        await wait_until(lambda: len(got) == 3, 30, "the consumer gets all 3 messages")
    finally:
        await consumer.shutdown()
    async with AsyncAdminClient(addr) as admin:
        for s in sent:
            records = await _consumer_trace(
                admin, s.msg_id, "in-order", 2, "the orderly consumer's records"
            )
            before, after = _consumer_records(records, "in-order")
            assert (before.type, after.type, after.success) == (
                TraceType.SUB_BEFORE,
                TraceType.SUB_AFTER,
                True,
            )
            assert before.request_id == after.request_id


class UnknownThenCommit(TransactionListener):
    def __init__(self) -> None:
        self.checked = 0

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        if message.body == b"now":
            return LocalTransactionState.COMMIT_MESSAGE
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        self.checked += 1
        return LocalTransactionState.COMMIT_MESSAGE


async def test_a_transaction_producer_traces_its_decisions(broker: BrokerController) -> None:
    """EndTransaction records for the producer's decision (UNKNOW included) and for its answer
    to a check-back (``fromTransactionCheck``), found through the message id."""
    listener = UnknownThenCommit()
    async with AsyncTransactionProducer("shop", listener, broker.address, config=TRACED) as tx:
        now = await tx.send_message_in_transaction(Message("orders", b"now"))
        later = await tx.send_message_in_transaction(Message("orders", b"later"))
        await wait_until(lambda: listener.checked >= 1, 60, "the check-back")

        async def answered() -> bool:
            return tx.checks_answered >= 1

        await wait_until(answered, 30, "the check answered")
    async with AsyncAdminClient(broker.address) as admin:

        def ends(records: list[TraceRecord]) -> list[TraceRecord]:
            return [r for r in records if r.type is TraceType.END_TRANSACTION]

        first = await wait_until(
            _records_of(admin, now.msg_id, lambda r: len(ends(r)) >= 1), 30, "the decision"
        )
        second = await wait_until(
            _records_of(admin, later.msg_id, lambda r: len(ends(r)) >= 2), 30, "both records"
        )
    (decided,) = ends(first)
    assert (decided.group, decided.transaction_state, decided.from_transaction_check) == (
        "shop",
        "COMMIT_MESSAGE",
        False,
    )
    assert decided.transaction_id == now.transaction_id
    assert decided.store_host == broker.address
    states = [(r.transaction_state, r.from_transaction_check) for r in ends(second)]
    assert states[:2] == [("UNKNOW", False), ("COMMIT_MESSAGE", True)], states


def _collecting(
    addr: str, group: str, topic: str, config: ClientConfig
) -> tuple[AsyncPushConsumer, list[bytes]]:
    """A push consumer of ``group`` on all of ``topic`` from the first offset (not started)
    and the list its callback appends each body to."""
    got: list[bytes] = []
    consumer = AsyncPushConsumer(group, addr, consume_from="first", config=config)
    consumer.subscribe(topic, "*", lambda m: got.append(m.body))
    return consumer, got


async def test_consumers_without_trace_send_nothing(broker: BrokerController) -> None:
    addr = broker.address
    consumer, got = _collecting(addr, "quiet", "plain", FAST_CLIENT)
    async with AsyncProducer("p", addr, config=FAST_CLIENT) as producer:
        await producer.send(Message("plain", b"x"))
        await consumer.start()
        try:
            await wait_until(lambda: got == [b"x"], 30, "the message consumed")
        finally:
            await consumer.shutdown()
    assert consumer._trace is None
    assert broker.topics.get(TRACE_TOPIC) is None


async def test_a_push_consumers_sync_callback_is_traced_too(broker: BrokerController) -> None:
    """A plain function runs on the consumer's worker threads: the records are the same."""
    addr = broker.address
    consumer, got = _collecting(addr, "threads", "jobs", TRACED)
    async with AsyncProducer("p", addr, config=FAST_CLIENT) as producer:
        sent = await producer.send(Message("jobs", b"job", keys="job-1"))
    await consumer.start()
    try:
        await wait_until(lambda: got == [b"job"], 30, "the message consumed")
    finally:
        await consumer.shutdown()
    async with AsyncAdminClient(addr) as admin:
        records = await _consumer_trace(admin, sent.msg_id, "threads", 2, "the consumer's records")
    before, after = _consumer_records(records, "threads")
    assert (before.type, before.keys, after.type, after.success, after.keys) == (
        TraceType.SUB_BEFORE,
        "job-1",
        TraceType.SUB_AFTER,
        True,
        "job-1",
    )
    assert before.request_id == after.request_id
