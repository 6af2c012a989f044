"""OpenTelemetry spans and metrics of the SDK (the ``otel`` extra: ``pip install txmq[otel]``).

With ``opentelemetry-api`` installed, the clients report through the global tracer and meter
providers (or those given to :func:`configure`):

* spans: ``send <topic>`` (PRODUCER) around each send with its retries, ``process <topic>``
  (CONSUMER) around each push-consumer callback, ``receive <topic>`` (CONSUMER) around each
  receive of a simple consumer, ``end_transaction <topic>`` (PRODUCER) around each transaction
  decision; with the messaging semantic conventions' attributes (``messaging.system`` =
  ``rocketmq``, ``messaging.destination.name``, ``messaging.operation.name`` / ``.type``,
  ``messaging.message.id``, ``messaging.consumer.group.name``, ``messaging.rocketmq.*``);
* metrics: ``messaging.client.operation.duration`` (histogram, seconds, per send),
  ``messaging.client.sent.messages`` and ``messaging.client.consumed.messages`` (counters).

Without the package every hook is a no-op that costs one attribute check.  Spans are only
recorded when an SDK (``opentelemetry-sdk``) or another implementation is set up: the API alone
records nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from txmq.protocol.message import Message, MessageExt

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span, TracerProvider

try:
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
    from opentelemetry.trace import SpanKind, StatusCode
except ImportError:  # the otel extra is not installed: every hook is a no-op
    _trace = None  # type: ignore[assignment]
    _metrics = None  # type: ignore[assignment]

#: The instrumentation scope's name.
SCOPE = "txmq.client"
#: ``messaging.system``: txmq speaks RocketMQ's protocol.
SYSTEM = "rocketmq"

#: opentelemetry-api is importable: the hooks report.
AVAILABLE = _trace is not None


class _Instruments:
    def __init__(
        self, tracer_provider: TracerProvider | None, meter_provider: MeterProvider | None
    ) -> None:
        assert _trace is not None and _metrics is not None
        from txmq import __version__

        self.tracer = _trace.get_tracer(SCOPE, __version__, tracer_provider)
        meter = _metrics.get_meter(SCOPE, __version__, meter_provider)
        self.duration = meter.create_histogram(
            "messaging.client.operation.duration",
            unit="s",
            description="Duration of a send (its retries included)",
        )
        self.sent = meter.create_counter(
            "messaging.client.sent.messages", unit="{message}", description="Messages sent"
        )
        self.consumed = meter.create_counter(
            "messaging.client.consumed.messages",
            unit="{message}",
            description="Messages handed to the application",
        )


_instruments: _Instruments | None = _Instruments(None, None) if AVAILABLE else None


def configure(
    tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None
) -> None:
    """Report to these providers instead of the global ones (None: the global one).

    Raises:
        RuntimeError: opentelemetry-api is not installed (``pip install txmq[otel]``).
    """
    global _instruments
    if not AVAILABLE:
        raise RuntimeError("OpenTelemetry is not installed: pip install 'txmq[otel]'")
    _instruments = _Instruments(tracer_provider, meter_provider)


def _message_attributes(msg: Message | MessageExt) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    if msg.tags:
        attrs["messaging.rocketmq.message.tag"] = msg.tags
    if msg.keys:
        attrs["messaging.rocketmq.message.keys"] = msg.keys.split(" ")
    return attrs


@contextlib.contextmanager
def send_span(msg: Message, group: str, broker: str, count: int = 1) -> Iterator[Span | None]:
    """The span and metrics of one send (``count`` messages); the caller sets the outcome's
    attributes with :func:`sent`."""
    inst = _instruments
    if inst is None:
        yield None
        return
    attrs: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": msg.topic,
        "messaging.rocketmq.client_group": group,
        "server.address": broker,
    }
    if count > 1:
        attrs["messaging.batch.message_count"] = count
    else:
        attrs.update(_message_attributes(msg))
    metric_attrs = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": "send",
        "messaging.destination.name": msg.topic,
    }
    started = time.perf_counter()
    error: BaseException | None = None
    with inst.tracer.start_as_current_span(
        f"send {msg.topic}", kind=SpanKind.PRODUCER, attributes=attrs
    ) as span:
        try:
            yield span
        except BaseException as exc:
            error = exc
            span.set_attribute("error.type", type(exc).__name__)
            raise
        finally:
            if error is not None:
                metric_attrs["error.type"] = type(error).__name__
            inst.duration.record(time.perf_counter() - started, metric_attrs)
            if error is None:
                inst.sent.add(count, metric_attrs)


def sent(span: Span | None, msg_ids: Sequence[str], queue_id: int, broker: str) -> None:
    """What a successful send adds to its span."""
    if span is None or not span.is_recording():
        return
    if len(msg_ids) == 1:
        span.set_attribute("messaging.message.id", msg_ids[0])
    span.set_attribute("messaging.destination.partition.id", str(queue_id))
    if broker:
        span.set_attribute("messaging.rocketmq.broker_name", broker)


def _consumer_attributes(topic: str, group: str, operation: str) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.name": operation,
        "messaging.operation.type": operation,
        "messaging.destination.name": topic,
        "messaging.consumer.group.name": group,
        "messaging.rocketmq.client_group": group,
    }


@contextlib.contextmanager
def process_span(msg: MessageExt, group: str) -> Iterator[None]:
    """The span of one message handed to a push consumer's callback."""
    inst = _instruments
    if inst is None:
        yield
        return
    attrs = _consumer_attributes(msg.topic, group, "process")
    attrs.update(_message_attributes(msg))
    attrs["messaging.message.id"] = msg.msg_id
    attrs["messaging.destination.partition.id"] = str(msg.queue_id)
    attrs["messaging.rocketmq.message.reconsume_times"] = msg.reconsume_times
    inst.consumed.add(
        1,
        {
            "messaging.system": SYSTEM,
            "messaging.operation.name": "process",
            "messaging.destination.name": msg.topic,
            "messaging.consumer.group.name": group,
        },
    )
    with inst.tracer.start_as_current_span(
        f"process {msg.topic}", kind=SpanKind.CONSUMER, attributes=attrs
    ) as span:
        try:
            yield
        except Exception as exc:
            span.set_attribute("error.type", type(exc).__name__)
            raise


@contextlib.contextmanager
def receive_span(topic: str, group: str) -> Iterator[Span | None]:
    """The span of one receive of a simple consumer; :func:`received` completes it."""
    inst = _instruments
    if inst is None:
        yield None
        return
    with inst.tracer.start_as_current_span(
        f"receive {topic}",
        kind=SpanKind.CONSUMER,
        attributes=_consumer_attributes(topic, group, "receive"),
    ) as span:
        yield span


def received(span: Span | None, topic: str, group: str, msgs: Sequence[MessageExt]) -> None:
    """Count a receive's messages and name them on its span."""
    inst = _instruments
    if inst is None or not msgs:
        return
    inst.consumed.add(
        len(msgs),
        {
            "messaging.system": SYSTEM,
            "messaging.operation.name": "receive",
            "messaging.destination.name": topic,
            "messaging.consumer.group.name": group,
        },
    )
    if span is not None and span.is_recording():
        span.set_attribute("messaging.batch.message_count", len(msgs))
        if len(msgs) == 1:
            span.set_attribute("messaging.message.id", msgs[0].msg_id)


@contextlib.contextmanager
def end_transaction_span(
    topic: str | None, group: str, msg_id: str, transaction_id: str | None, decision: str
) -> Iterator[None]:
    """The span of one END_TRANSACTION (``decision``: COMMIT, ROLLBACK or UNKNOWN)."""
    inst = _instruments
    if inst is None:
        yield
        return
    attrs: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": "end_transaction",
        "messaging.operation.type": "settle",
        "messaging.rocketmq.client_group": group,
        "messaging.message.id": msg_id,
        "messaging.rocketmq.message.type": "transaction",
        "messaging.rocketmq.transaction.resolution": decision,
    }
    if topic:
        attrs["messaging.destination.name"] = topic
    if transaction_id:
        attrs["messaging.rocketmq.transaction.id"] = transaction_id
    name = f"end_transaction {topic}" if topic else "end_transaction"
    with inst.tracer.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attrs) as span:
        try:
            yield
        except Exception as exc:
            span.set_attribute("error.type", type(exc).__name__)
            span.set_status(StatusCode.ERROR, str(exc))
            raise


__all__ = [
    "AVAILABLE",
    "configure",
    "end_transaction_span",
    "process_span",
    "receive_span",
    "received",
    "send_span",
    "sent",
]
