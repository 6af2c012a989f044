"""OpenTelemetry spans and metrics (the ``otel`` extra), asserted with the OpenTelemetry SDK's
in-memory exporter and reader against a real broker; and the no-op without the package."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.client.helpers import FAST_CLIENT, wait_until
from txmq.broker.server import BrokerController
from txmq.client import (
    AsyncProducer,
    AsyncPushConsumer,
    AsyncSimpleConsumer,
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
    MessageExt,
    TransactionListener,
    telemetry,
)


class Recorded:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        telemetry.configure(tracer_provider, MeterProvider(metric_readers=[self.reader]))

    def spans(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def metric(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return [
            point
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == name
            for point in m.data.data_points
        ]


@pytest.fixture
def otel() -> Iterator[Recorded]:
    recorded = Recorded()
    try:
        yield recorded
    finally:
        telemetry.configure()  # back to the global providers


async def test_send_and_process_spans_and_metrics(
    broker: BrokerController, otel: Recorded, unique: Callable[[str], str]
) -> None:
    topic, group = unique("otel"), unique("g")
    got = threading.Event()

    def on_message(msg: MessageExt) -> None:
        if msg.body == b"traced":
            got.set()

    async with AsyncProducer("otel-producer", broker=broker.address, config=FAST_CLIENT) as p:
        result = await p.send(Message(topic, b"traced", tags="created", keys="k1 k2"))
        consumer = AsyncPushConsumer(
            group, broker=broker.address, config=FAST_CLIENT, consume_from="first"
        )
        consumer.subscribe(topic, "*", on_message)
        async with consumer:
            await wait_until(got.is_set, what="the message consumed")
            await wait_until(lambda: otel.spans(f"process {topic}"), what="the process span")

    [send] = otel.spans(f"send {topic}")
    assert send.kind is SpanKind.PRODUCER
    attrs = dict(send.attributes or {})
    assert attrs["messaging.system"] == "rocketmq"
    assert attrs["messaging.destination.name"] == topic
    assert attrs["messaging.operation.type"] == "send"
    assert attrs["messaging.message.id"] == result.msg_id
    assert attrs["messaging.rocketmq.message.tag"] == "created"
    assert attrs["messaging.rocketmq.message.keys"] == ("k1", "k2")
    assert attrs["messaging.rocketmq.client_group"] == "otel-producer"
    assert attrs["messaging.destination.partition.id"] == str(result.queue_id)

    [process] = otel.spans(f"process {topic}")
    assert process.kind is SpanKind.CONSUMER
    pattrs = dict(process.attributes or {})
    assert pattrs["messaging.message.id"] == result.msg_id
    assert pattrs["messaging.consumer.group.name"] == group
    assert pattrs["messaging.operation.type"] == "process"
    assert process.status.status_code is not StatusCode.ERROR

    [duration] = [
        d
        for d in otel.metric("messaging.client.operation.duration")
        if d.attributes["messaging.destination.name"] == topic
    ]
    assert duration.count == 1 and duration.sum > 0
    [sent] = [
        d
        for d in otel.metric("messaging.client.sent.messages")
        if d.attributes["messaging.destination.name"] == topic
    ]
    assert sent.value == 1
    consumed = [
        d
        for d in otel.metric("messaging.client.consumed.messages")
        if d.attributes["messaging.destination.name"] == topic
    ]
    assert sum(d.value for d in consumed) == 1


async def test_a_failing_callback_marks_its_span(
    broker: BrokerController, otel: Recorded, unique: Callable[[str], str]
) -> None:
    topic, group = unique("otel-fail"), unique("g")

    async def on_message(msg: MessageExt) -> None:
        raise ValueError("not now")

    async with AsyncProducer("p", broker=broker.address, config=FAST_CLIENT) as p:
        await p.send(Message(topic, b"x"))
    consumer = AsyncPushConsumer(
        group, broker=broker.address, config=FAST_CLIENT, consume_from="first"
    )
    consumer.subscribe(topic, "*", on_message)
    async with consumer:
        await wait_until(lambda: otel.spans(f"process {topic}"), what="the process span")
    span = otel.spans(f"process {topic}")[0]
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["error.type"] == "ValueError"


async def test_receive_and_end_transaction_spans(
    broker: BrokerController, otel: Recorded, unique: Callable[[str], str]
) -> None:
    topic, group = unique("otel-txn"), unique("g")

    class Commit(TransactionListener):
        def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE

        def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
            return LocalTransactionState.COMMIT_MESSAGE

    async with AsyncTransactionProducer(
        unique("txp"), Commit(), broker=broker.address, config=FAST_CLIENT
    ) as producer:
        sent = await producer.send_message_in_transaction(Message(topic, b"t1"))
    [end] = otel.spans(f"end_transaction {topic}")
    eattrs = dict(end.attributes or {})
    assert eattrs["messaging.rocketmq.transaction.resolution"] == "COMMIT_MESSAGE"
    assert eattrs["messaging.message.id"] == sent.msg_id
    assert eattrs["messaging.system"] == "rocketmq"

    async with AsyncSimpleConsumer(
        group, broker=broker.address, subscriptions={topic: "*"}, config=FAST_CLIENT
    ) as consumer:
        got: list[Any] = []
        for _ in range(20):
            got += await consumer.receive(4, 5.0, await_duration=0.5)
            if got:
                break
        assert [m.body for m in got] == [b"t1"]
    spans = [s for s in otel.spans(f"receive {topic}") if s.attributes]
    full = [s for s in spans if (s.attributes or {}).get("messaging.batch.message_count")]
    assert len(full) == 1 and dict(full[0].attributes or {})["messaging.message.id"] == sent.msg_id
    assert all(s.kind is SpanKind.CONSUMER for s in spans)


def test_without_opentelemetry_every_hook_is_a_no_op() -> None:
    code = """
import sys
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
from txmq.client import telemetry
from txmq.protocol.message import Message, MessageExt
assert not telemetry.AVAILABLE
with telemetry.send_span(Message("t", b"x"), "g", "b") as span:
    assert span is None
with telemetry.process_span(MessageExt("t", b"x"), "g"):
    pass
try:
    telemetry.configure()
except RuntimeError as exc:
    print("no-op:", exc)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "no-op: OpenTelemetry is not installed" in out.stdout
