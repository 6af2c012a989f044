"""Receive and acknowledge: RocketMQ 5's SimpleConsumer over remoting POP, and the ``async for``
consumer built on it.

:class:`AsyncSimpleConsumer` asks the broker for messages (POP_MESSAGE); each comes with a
receipt handle and stays invisible to the group's other receivers for ``invisible_duration``.
:meth:`~AsyncSimpleConsumer.ack` (ACK_MESSAGE) removes it for good; a message not acked in time
is delivered again (to this or another member of the group), its ``reconsume_times`` one higher;
:meth:`~AsyncSimpleConsumer.change_invisible_duration` (CHANGE_MESSAGE_INVISIBLETIME) gives a
slow one more time, or (0) hands it back at once.  There is no rebalance: any number of members
receive from every queue, and the broker hands each message to one of them at a time.

:class:`AsyncStreamConsumer` is the same consumer as an async iterator::

    async with AsyncStreamConsumer("billing", "orders") as stream:
        async for msg in stream:
            handle(msg.body)

A message is acknowledged when the loop asks for the next one, or when the ``async with`` block
ends without an error; one whose loop body raised is left unacknowledged, so the broker delivers
it again once its invisible time is over (at least once: a body that finished but whose ack was
lost runs again too).
"""

from __future__ import annotations

import collections
import itertools
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.errors import TxmqError
from txmq.protocol.headers import (
    AckMessageRequestHeader,
    ChangeInvisibleTimeRequestHeader,
    PopMessageRequestHeader,
)
from txmq.protocol.message import MessageExt, MessageSysFlag, decode_messages, inflate_body

from . import telemetry
from ._validation import validate_topic
from .config import DEFAULT_BROKER, ClientConfig
from .errors import ClientStateError
from .filter import SqlExpression
from .lifecycle import ConnectedClient
from .logs import get_logger
from .pull_consumer import normalize_expression
from .remoting import BrokerConnection

log = get_logger(__name__)

#: The invisible times the broker accepts for a receive, in seconds.
MIN_INVISIBLE, MAX_INVISIBLE = 1.0, 12 * 3600.0
#: Most messages one receive returns (the broker's limit).
MAX_RECEIVE = 32


@dataclass
class ReceivedMessage:
    """A message handed out by a receive, with what its ack needs.

    Attributes:
        message: the message (body, properties, ``reconsume_times``: earlier deliveries).
        receipt_handle: names this delivery (RocketMQ's ``extraInfo``); an ack or a change of
            the invisible time with a handle the broker has since replaced is refused.
        invisible_until: ``time.monotonic()`` when the broker may deliver it again.
    """

    message: MessageExt
    receipt_handle: str
    invisible_until: float

    @property
    def topic(self) -> str:
        return self.message.topic

    @property
    def body(self) -> bytes:
        return self.message.body

    @property
    def msg_id(self) -> str:
        return self.message.msg_id

    @property
    def tags(self) -> str | None:
        return self.message.tags

    @property
    def keys(self) -> str | None:
        return self.message.keys

    @property
    def reconsume_times(self) -> int:
        return self.message.reconsume_times


def _parse_info(info: str | None) -> dict[str, list[int]]:
    """``"<retry> <queueId> <o1>,<o2>;..."`` -> offsets by ``"<retry>@<queueId>"``."""
    out: dict[str, list[int]] = {}
    for one in (info or "").split(";"):
        parts = one.split(" ")
        if len(parts) == 3:
            out[f"{parts[0]}@{parts[1]}"] = [int(o) for o in parts[2].split(",")]
    return out


class AsyncSimpleConsumer(ConnectedClient):
    """Receives messages and acknowledges each one (RocketMQ 5's ``SimpleConsumer``); every
    method but :meth:`subscribe` is a coroutine.

    Args:
        group: the consumer group: the members of a group share its messages, each handed to
            one member at a time.
        broker: ``"host:port"`` of the broker.
        subscriptions: ``{topic: expression}`` to start with (see :meth:`subscribe`).
        await_duration: how long a :meth:`receive` that finds nothing waits for a message, in
            seconds (the broker holds the request).
        config: client settings; ``**settings`` override single fields of it.

    Example::

        async with AsyncSimpleConsumer("billing", subscriptions={"orders": "*"}) as consumer:
            for msg in await consumer.receive(16, invisible_duration=30):
                handle(msg.body)
                await consumer.ack(msg)
    """

    _kind = "consumer"

    def __init__(
        self,
        group: str,
        broker: str = DEFAULT_BROKER,
        *,
        subscriptions: dict[str, str] | None = None,
        await_duration: float = 5.0,
        config: ClientConfig | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(group, broker, config=config, **settings)
        if await_duration < 0:
            raise ValueError("await_duration must not be negative")
        self.await_duration = await_duration
        self._subs: dict[str, str] = {}
        self._turn = itertools.count()
        for topic, expression in (subscriptions or {}).items():
            self.subscribe(topic, expression)

    def subscribe(self, topic: str, expression: str | None = "*") -> None:
        """Receive ``topic``'s messages matching ``expression`` (``"*"``, ``"a || b"`` or
        ``sql("...")``)."""
        validate_topic(topic)
        self._subs[topic] = normalize_expression(expression)

    def unsubscribe(self, topic: str) -> None:
        """Stop receiving ``topic``."""
        self._subs.pop(topic, None)

    @property
    def subscriptions(self) -> dict[str, str]:
        """``{topic: expression}``."""
        return dict(self._subs)

    async def _start(self) -> None:
        conn = BrokerConnection(self.broker, self.config)
        await conn.start()
        self._conn = conn
        log.debug("simple_consumer_started", group=self.group, broker=self.broker)

    async def _shutdown(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()
        log.debug("simple_consumer_shut_down", group=self.group)

    async def receive(
        self,
        max_messages: int = 16,
        invisible_duration: float = 30.0,
        *,
        topic: str | None = None,
        await_duration: float | None = None,
    ) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages, each invisible to the group's other receivers for
        ``invisible_duration`` seconds (1 s to 12 h); an empty list when none came within
        ``await_duration``.  With several subscriptions, each call serves the next topic in
        turn (or ``topic``).

        Raises:
            ClientStateError: nothing is subscribed, or the consumer is not started.
            ValueError: ``max_messages`` or ``invisible_duration`` is out of range.
            TxmqError: the broker refused the request.
        """
        if not self._subs:
            raise ClientStateError(f"consumer {self.group!r} has no subscription")
        if not 1 <= max_messages <= MAX_RECEIVE:
            raise ValueError(f"max_messages must be within [1, {MAX_RECEIVE}]")
        if not MIN_INVISIBLE <= invisible_duration <= MAX_INVISIBLE:
            raise ValueError(
                f"invisible_duration must be within [{MIN_INVISIBLE}, {MAX_INVISIBLE}] s"
            )
        if topic is None:
            topics = sorted(self._subs)
            topic = topics[next(self._turn) % len(topics)]
        expression = self._subs[topic]
        wait = self.await_duration if await_duration is None else await_duration
        conn = self.connection
        header = PopMessageRequestHeader(
            consumer_group=self.group,
            topic=topic,
            queue_id=-1,
            max_msg_nums=max_messages,
            invisible_time=int(invisible_duration * 1000),
            poll_time=int(wait * 1000),
            born_time=int(time.time() * 1000),
            init_mode=0,
            exp_type="SQL92" if isinstance(expression, SqlExpression) else "TAG",
            exp=str(expression),
        )
        if not telemetry.AVAILABLE:
            return await self._pop(conn, header, invisible_duration, wait)
        with telemetry.receive_span(topic, self.group) as span:
            out = await self._pop(conn, header, invisible_duration, wait)
            telemetry.received(span, topic, self.group, [m.message for m in out])
            return out

    async def _pop(
        self,
        conn: BrokerConnection,
        header: PopMessageRequestHeader,
        invisible_duration: float,
        wait: float,
    ) -> list[ReceivedMessage]:
        sent_at = time.monotonic()
        resp = await conn.invoke(
            RequestCode.POP_MESSAGE,
            header,
            timeout=self.config.request_timeout + wait,
            accept=(
                ResponseCode.SUCCESS,
                ResponseCode.POLLING_TIMEOUT,
                ResponseCode.PULL_NOT_FOUND,
            ),
        )
        if resp.code != ResponseCode.SUCCESS or not resp.body:
            return []
        ext = resp.ext_fields
        starts = _parse_info(ext.get("startOffsetInfo"))
        pop_time = ext.get("popTime", "0")
        invisible_ms = ext.get("invisibleTime", str(header.invisible_time))
        revive_qid = ext.get("reviveQid", "0")
        broker_name = conn.group_name or "broker"
        out: list[ReceivedMessage] = []
        for m in decode_messages(resp.body):
            if m.sys_flag & MessageSysFlag.COMPRESSED:
                inflate_body(m)
            retry = "0"
            start = starts.get(f"0@{m.queue_id}")
            if start is None:
                retry, start = "1", starts.get(f"1@{m.queue_id}", [m.queue_offset])
            handle = (
                f"{start[0]} {pop_time} {invisible_ms} {revive_qid} {retry} {broker_name} "
                f"{m.queue_id} {m.queue_offset}"
            )
            out.append(ReceivedMessage(m, handle, sent_at + invisible_duration))
        return out

    async def ack(self, msg: ReceivedMessage) -> None:
        """Acknowledge ``msg``: it is not delivered again.

        Raises:
            NoMessageError: its receipt handle no longer names a delivery (its invisible time
                ran out and it was delivered again, or it was acked already).
        """
        await self.connection.invoke(
            RequestCode.ACK_MESSAGE, AckMessageRequestHeader(**self._delivery(msg))
        )

    def _delivery(self, msg: ReceivedMessage) -> dict[str, Any]:
        """The header fields naming ``msg``'s delivery (its receipt handle) to the broker."""
        return {
            "consumer_group": self.group,
            "topic": msg.message.topic,
            "queue_id": msg.message.queue_id,
            "extra_info": msg.receipt_handle,
            "offset": msg.message.queue_offset,
        }

    async def change_invisible_duration(self, msg: ReceivedMessage, duration: float) -> None:
        """Make ``msg`` invisible for ``duration`` seconds from now (0: deliverable again at
        once).  ``msg`` gets a new receipt handle (the old one no longer acks it).

        Raises:
            NoMessageError: its receipt handle no longer names a delivery.
        """
        if not 0 <= duration <= MAX_INVISIBLE:
            raise ValueError(f"duration must be within [0, {MAX_INVISIBLE}] s")
        ms = int(duration * 1000)
        resp = await self.connection.invoke(
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
            ChangeInvisibleTimeRequestHeader(**self._delivery(msg), invisible_time=ms),
        )
        parts = msg.receipt_handle.split(" ")
        parts[1] = str(resp.ext_fields.get("popTime", parts[1]))
        parts[2] = str(ms)
        msg.receipt_handle = " ".join(parts)
        msg.invisible_until = time.monotonic() + duration


class AsyncStreamConsumer(AsyncSimpleConsumer):
    """``async for msg in consumer``: the messages of one topic, each acknowledged when the
    loop asks for the next one (at least once).

    Args:
        group: the consumer group.
        topic: the topic to consume.
        expression: ``"*"``, ``"a || b"`` or ``sql("...")``.
        broker: ``"host:port"`` of the broker.
        batch: messages asked for in one receive (up to 32).
        invisible_duration: how long the loop body may take per batch before the broker
            delivers a message again (seconds; the batch's messages become invisible together).
        await_duration, config, settings: as for :class:`AsyncSimpleConsumer`.

    Semantics: the message the loop body got is acked when the loop asks for the next one, or
    when ``async with`` ends without an error.  When the body raises (and the error leaves the
    ``async with`` block), the message is not acked and the broker delivers it again after its
    invisible time; the batch's messages not yet handed to the loop are given back at once.
    Iteration goes on until the consumer is shut down (``break`` to stop, or
    :meth:`shutdown` from another task, which ends the loop).
    """

    def __init__(
        self,
        group: str,
        topic: str,
        expression: str | None = "*",
        broker: str = DEFAULT_BROKER,
        *,
        batch: int = 16,
        invisible_duration: float = 30.0,
        await_duration: float = 5.0,
        config: ClientConfig | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(
            group,
            broker,
            subscriptions={topic: expression or "*"},
            await_duration=await_duration,
            config=config,
            **settings,
        )
        if not 1 <= batch <= MAX_RECEIVE:
            raise ValueError(f"batch must be within [1, {MAX_RECEIVE}]")
        if not MIN_INVISIBLE <= invisible_duration <= MAX_INVISIBLE:
            raise ValueError(
                f"invisible_duration must be within [{MIN_INVISIBLE}, {MAX_INVISIBLE}] s"
            )
        self.topic = topic
        self.batch = batch
        self.invisible_duration = invisible_duration
        self._buffer: collections.deque[ReceivedMessage] = collections.deque()
        self._current: ReceivedMessage | None = None
        #: Messages acknowledged so far.
        self.acked_count = 0

    def __aiter__(self) -> AsyncStreamConsumer:
        return self

    async def __anext__(self) -> ReceivedMessage:
        await self._ack_current()
        while not self._buffer:
            if not self._started:
                raise StopAsyncIteration
            try:
                self._buffer.extend(await self.receive(self.batch, self.invisible_duration))
            except (TxmqError, ClientStateError):
                if not self._started:  # shut down by another task while receiving
                    raise StopAsyncIteration from None
                raise
        self._current = self._buffer.popleft()
        return self._current

    async def _ack_current(self) -> None:
        msg, self._current = self._current, None
        if msg is None:
            return
        try:
            await self.ack(msg)
        except TxmqError as exc:  # its invisible time ran out: it is delivered again
            log.warning(
                "ack_failed", group=self.group, topic=msg.topic, msg_id=msg.msg_id, error=str(exc)
            )
        else:
            self.acked_count += 1

    async def _give_back(self) -> None:
        while self._buffer:
            msg = self._buffer.popleft()
            try:
                await self.change_invisible_duration(msg, 0)
            except TxmqError:
                pass  # visible again once its invisible time is over

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._started:
                if et is None:
                    await self._ack_current()
                else:
                    self._current = None
                await self._give_back()
        finally:
            await super().__aexit__(et, e, tb)


__all__ = [
    "AsyncSimpleConsumer",
    "AsyncStreamConsumer",
    "ReceivedMessage",
]
