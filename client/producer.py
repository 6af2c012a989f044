"""The asynchronous producer.

Sending follows RocketMQ's ``DefaultMQProducerImpl``: the message is checked client-side, gets
its ``UNIQ_KEY`` once (kept across retries, so a consumer can recognise a duplicate), a queue is
chosen (round robin, a sharding key or a selector), and SEND_MESSAGE_V2 goes out.  Retriable
failures (a dropped connection, a timeout, a busy broker) are retried up to
``retry_times_when_send_failed`` times, on the next queue when the queue was chosen round robin,
after a wait with exponential backoff and full jitter (``ClientConfig.retry_policy``).
FLUSH_DISK_TIMEOUT is not a failure to retry: the message is stored, only not fsynced yet; it is
reported in :attr:`SendResult.status`.

When a topic does not exist yet the producer sends anyway, to ``default_topic_queue_nums``
queues; the broker creates the topic on that first send and the route is fetched afterwards.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mypy_extensions import mypyc_attr

from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import (
    ConnectionClosedError,
    InvalidParameterError,
    NoPermissionError,
    ProtocolError,
    RequestTimeoutError,
    TxmqError,
    error_for_code,
)
from txmq.protocol.headers import SendMessageRequestHeader, SendMessageResponseHeader
from txmq.protocol.message import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    ZLIB_COMPRESSED,
    BatchBody,
    Message,
    MessageConst,
    UniqIdGenerator,
    compress_body,
    properties_to_string,
)
from txmq.protocol.topics import AUTO_CREATE_TOPIC_KEY_TOPIC

from . import telemetry
from ._validation import validate_message
from .errors import InvalidMessageError
from .lifecycle import ConnectedClient
from .logs import get_logger
from .remoting import BrokerConnection, local_ip
from .route import MessageQueue, TopicRoute, fetch_route
from .trace import ProducerTrace

log = get_logger(__name__)


#: ``f(queue_ids, message) -> queue_id``: picks the queue for one message.
QueueSelector = Callable[[list[int], Message], int]

_uniq_ids: UniqIdGenerator | None = None


def _id_generator() -> UniqIdGenerator:
    global _uniq_ids
    if _uniq_ids is None:
        _uniq_ids = UniqIdGenerator(local_ip())
    return _uniq_ids


def new_uniq_id() -> str:
    """A new client-side message id (``UNIQ_KEY``), as RocketMQ's MessageClientIDSetter."""
    return (_uniq_ids or _id_generator()).next_id()


def new_uniq_ids(n: int) -> list[str]:
    """``n`` new client-side message ids (a batch's)."""
    return _id_generator().next_ids(n)


class SendStatus(enum.Enum):
    """How a send ended (RocketMQ's SendStatus)."""

    #: Stored (and, under SYNC_FLUSH, fsynced).
    SEND_OK = "SEND_OK"
    #: Stored, but the fsync did not finish in time; do not resend.
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


_STATUS_BY_CODE: dict[int, SendStatus] = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


@mypyc_attr(allow_interpreted_subclasses=True)  # TransactionSendResult
@dataclass(slots=True)
class SendResult:
    """The broker's answer to a send.

    Attributes:
        status: SEND_OK, or FLUSH_DISK_TIMEOUT when stored but not fsynced in time.
        msg_id: the client-made id (``UNIQ_KEY``); for a batch, the ids comma-joined.
        offset_msg_id: the broker-made id (store address + commit-log offset); comma-joined
            for a batch.
        topic: the topic written.
        queue_id: the queue written.
        queue_offset: the message's offset in the queue (the first message's for a batch).
        transaction_id: the transaction id, for transactional sends.
        msg_ids: every message's ``UNIQ_KEY`` (one element for a single send).
        offset_msg_ids: every message's offsetMsgId.
        broker_name: the broker group that stored it (the route's ``brokerName``): with
            ``queue_id``, the queue (RocketMQ's MessageQueue).
    """

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    transaction_id: str | None = None
    msg_ids: list[str] = field(default_factory=list)
    offset_msg_ids: list[str] = field(default_factory=list)
    broker_name: str = ""


#: How the properties of a message with none of its own begin (its UNIQ_KEY follows).
_UNIQ_HEAD = f"{MessageConst.UNIQ_KEY}{NAME_VALUE_SEPARATOR}"
#: The properties every sent message carries after its UNIQ_KEY.
_WAIT_TAIL = (
    f"{PROPERTY_SEPARATOR}{MessageConst.WAIT_STORE_MSG_OK}{NAME_VALUE_SEPARATOR}true"
    f"{PROPERTY_SEPARATOR}"
)


#: The request codes as plain ints (what RemotingCommand.request makes of them).
_SEND_MESSAGE_V2 = int(RequestCode.SEND_MESSAGE_V2)
_SEND_BATCH_MESSAGE = int(RequestCode.SEND_BATCH_MESSAGE)

#: Extra properties that take the place of one a send always writes (so not simply appended).
_UNIQ_OR_WAIT = frozenset((MessageConst.UNIQ_KEY, MessageConst.WAIT_STORE_MSG_OK))


def _plain_properties(msg: Message, uniq: str) -> str:
    """The wire properties of a message with no user properties (nor delay): its tags and keys,
    UNIQ_KEY and WAIT_STORE_MSG_OK, as ``properties_to_string`` would write them."""
    if not msg.tags and not msg.keys:  # the common case
        return f"{_UNIQ_HEAD}{uniq}{_WAIT_TAIL}"
    head = ""
    for name, value in ((MessageConst.TAGS, msg.tags), (MessageConst.KEYS, msg.keys)):
        if value:
            if NAME_VALUE_SEPARATOR in value or PROPERTY_SEPARATOR in value:
                raise InvalidMessageError(f"message {name} contains a reserved control character")
            head += f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}"
    return f"{head}{_UNIQ_HEAD}{uniq}{_WAIT_TAIL}"


def _answer_fields(ext: dict[str, Any]) -> tuple[str, int, int, str | None] | None:
    """``msgId``, ``queueId``, ``queueOffset`` and ``transactionId`` of a send answer whose
    values are already of their types (what the broker's msgpack answers hold), read without
    the typed header; None for anything else (string values, a missing field), which
    :meth:`SendMessageResponseHeader.from_ext_fields` then reads."""
    get = ext.get
    mid, qid, qoff, tid = get("msgId"), get("queueId"), get("queueOffset"), get("transactionId")
    if (
        type(mid) is str
        and type(qid) is int
        and type(qoff) is int
        and (tid is None or type(tid) is str)
        and type(get("batchUniqId", "")) is str
    ):
        return mid, qid, qoff, tid
    return None


def _result(
    resp: RemotingCommand, topic: str, uniq_ids: list[str], status: SendStatus, broker: str
) -> SendResult:
    fields = _answer_fields(resp.ext_fields)
    if fields is None:
        try:
            header = SendMessageResponseHeader.from_ext_fields(resp.ext_fields)
        except InvalidParameterError:
            if status is SendStatus.SEND_OK:
                raise ProtocolError(
                    f"send answer without a valid header: {resp.ext_fields!r}"
                ) from None
            header = SendMessageResponseHeader(msg_id="", queue_id=-1, queue_offset=-1)
        fields = (header.msg_id, header.queue_id, header.queue_offset, header.transaction_id)
    msg_id, queue_id, queue_offset, transaction_id = fields
    if not msg_id:
        offset_ids = []
    elif "," in msg_id:
        offset_ids = [i for i in msg_id.split(",") if i]
    else:
        offset_ids = [msg_id]
    return SendResult(
        status,
        ",".join(uniq_ids) if len(uniq_ids) != 1 else uniq_ids[0],
        msg_id,
        topic,
        queue_id,
        queue_offset,
        transaction_id,
        list(uniq_ids),
        offset_ids,
        broker,
    )


def _log_retry(msg: Message, mq: MessageQueue, attempt: int, error: TxmqError, **more: str) -> None:
    """The INFO line of a send attempt (0-based ``attempt``) that failed and is retried."""
    log.info(
        "send_retried",
        topic=msg.topic,
        broker=mq.broker,
        queue_id=mq.queue_id,
        attempt=attempt + 1,
        error=str(error),
        **more,
    )


@dataclass
class _Gathered:
    """Sends of one topic waiting to leave as one batch (auto batching)."""

    items: list[tuple[Message, asyncio.Future[SendResult]]] = field(default_factory=list)
    bytes: int = 0
    timeout: float | None = None


@dataclass(frozen=True, slots=True)
class _Target:
    """Where a send goes and how long each of its attempts waits: the arguments of
    :meth:`AsyncProducer.send_message` by these names (None: the producer's choice)."""

    queue_id: int | None = None
    sharding_key: str | None = None
    selector: QueueSelector | None = None
    timeout: float | None = None
    broker: str | None = None


#: A send with every choice left to the producer.
_NO_TARGET = _Target()


class AsyncProducer(ConnectedClient):
    """Sends messages; every method is a coroutine.

    Args:
        group: the producer group (announced in heartbeats; transactional checks go to it).
        broker: ``"host:port"`` of the broker.
        config: client settings; ``**settings`` override single fields of it, e.g.
            ``AsyncProducer("g", request_timeout=1.0)``.

    Use ``async with AsyncProducer(...) as producer:`` or call :meth:`start` and
    :meth:`shutdown`.
    """

    _kind = "producer"

    def _setup(self) -> None:
        self._routes: dict[str, TopicRoute] = {}
        self._route_fetches: dict[str, asyncio.Future[TopicRoute]] = {}
        self._rr = itertools.count()
        #: auto_batch: sends waiting for the end of this loop turn, per topic, and the batches
        #: on their way.
        self._gathering: dict[str, _Gathered] = {}
        self._gathered_tasks: set[asyncio.Task[None]] = set()
        #: auto_batch: sends on their way alone (made when nothing else was).
        self._direct = 0
        self._trace = ProducerTrace(self) if self.config.enable_trace else None
        #: Per topic, the SEND_MESSAGE_V2 fields every send of this producer shares.
        self._v2_templates: dict[str, dict[str, Any]] = {}

    # -- lifecycle -------------------------------------------------------------------------------

    async def _start(self) -> None:
        """Connect to the broker and register the producer group.

        Raises:
            ConnectionClosedError: the broker cannot be reached.
        """
        conn = BrokerConnection(self.broker, self.config)
        conn.register_producer(self.group)
        await conn.start()
        self._conn = conn
        log.debug(
            "producer_started", group=self.group, broker=self.broker, client_id=conn.client_id
        )

    async def _shutdown(self) -> None:
        """Send what auto batching still holds, unregister from the broker and close the
        connection."""
        if self._trace is not None:
            await self._trace.close()
        for topic, pending in list(self._gathering.items()):
            self._release_gathered(topic, pending)
        if self._gathered_tasks:
            await asyncio.wait(self._gathered_tasks, timeout=self.config.shutdown_timeout)
        conn, self._conn = self._conn, None
        if conn is None:
            return
        await conn.unregister(producer_group=self.group)
        await conn.close()
        log.debug("producer_shut_down", group=self.group)

    # -- public API --------------------------------------------------------------------------------

    async def send(
        self,
        msg: Message,
        *,
        queue_id: int | None = None,
        sharding_key: str | None = None,
        selector: QueueSelector | None = None,
        timeout: float | None = None,
        broker: str | None = None,
    ) -> SendResult:
        """Send one message and wait until the broker stored it.

        Args:
            msg: the message.
            queue_id: write to this queue (of ``broker``'s group when the topic lives in
                several broker groups of a cluster).
            sharding_key: write to queue ``crc32(key) % write_queue_nums``, so the messages of
                one key stay in order in one queue.
            selector: ``f(queue_ids, msg) -> queue_id``.
            timeout: seconds to wait for each attempt (default: ``request_timeout``).
            broker: write to this broker group (a route's ``brokerName``) of a cluster.

        Returns:
            The :class:`SendResult`.

        Raises:
            InvalidMessageError: the message is not valid (nothing was sent).
            TxmqError: the send failed, after the retries for retriable errors.
        """
        config = self.config
        if (
            config.auto_batch
            and queue_id is None
            and sharding_key is None
            and selector is None
            and broker is None
            and not msg.delay_level
            and not (config.compress_over and len(msg.payload) >= config.compress_over)
        ):
            topic = msg.topic
            pending = self._gathering.get(topic)
            if pending is None and not self._gathered_tasks and not self._direct:
                # Nothing of this producer on its way: sent at once, in a request of its own
                # (no wait for the end of the loop's turn); sends made while it travels are
                # batched.
                self._direct += 1
                try:
                    # send_message(msg, timeout=timeout), one coroutine less
                    uniq, build = self._prepare(msg, 0, None)
                    target = _NO_TARGET if timeout is None else _Target(timeout=timeout)
                    return await self._send_with_retries(msg, [uniq], build, target)
                finally:
                    self._direct -= 1
            # Auto batching: queue ``msg`` with the other sends of its topic made in this turn
            # of the event loop; they leave as one batch when the loop gets to it (or when
            # ``batch_max_bytes`` is reached).  Inline, as it runs for every send.
            validate_message(msg, config.max_message_size)
            fut: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
            if pending is None:
                pending = self._gathering[topic] = _Gathered()
                fut.get_loop().call_soon(self._release_gathered, topic, pending)
            pending.items.append((msg, fut))
            pending.bytes += len(msg.body) + 64
            if msg.properties:
                pending.bytes += sum(len(k) + len(v) for k, v in msg.properties.items())
            if timeout is not None:
                pending.timeout = (
                    timeout if pending.timeout is None else max(pending.timeout, timeout)
                )
            if pending.bytes >= config.batch_max_bytes:
                self._release_gathered(topic, pending)
            return await fut
        return await self.send_message(
            msg,
            queue_id=queue_id,
            sharding_key=sharding_key,
            selector=selector,
            timeout=timeout,
            broker=broker,
        )

    # -- auto batching (ClientConfig.auto_batch) ----------------------------------------------------

    def _release_gathered(self, topic: str, pending: _Gathered) -> None:
        if self._gathering.get(topic) is not pending:
            return  # already sent (it reached batch_max_bytes)
        del self._gathering[topic]
        task = asyncio.ensure_future(self._send_gathered_batch(pending))
        self._gathered_tasks.add(task)
        task.add_done_callback(self._gathered_tasks.discard)

    async def _send_gathered_batch(self, pending: _Gathered) -> None:
        items = pending.items
        try:
            if len(items) == 1:
                results = [await self.send_message(items[0][0], timeout=pending.timeout)]
            else:
                r = await self._send_batch(
                    [m for m, _ in items],
                    _Target(timeout=pending.timeout),
                    validated=True,  # by send()
                )
                status, topic, qid, first, name = (
                    r.status,
                    r.topic,
                    r.queue_id,
                    r.queue_offset,
                    r.broker_name,
                )
                offset_ids = r.offset_msg_ids
                if len(offset_ids) != len(items):
                    offset_ids = (offset_ids + [""] * len(items))[: len(items)]
                results = [
                    SendResult(
                        status,
                        uniq,
                        oid,
                        topic,
                        qid,
                        first + i,
                        None,
                        [uniq],
                        [oid] if oid else [],
                        name,
                    )
                    for i, (uniq, oid) in enumerate(zip(r.msg_ids, offset_ids, strict=True))
                ]
        except BaseException as exc:
            for _, fut in items:
                if not fut.done():
                    fut.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, fut), result in zip(items, results, strict=True):
            if not fut.done():
                fut.set_result(result)

    async def send_oneway(
        self, msg: Message, *, queue_id: int | None = None, sharding_key: str | None = None
    ) -> None:
        """Send one message without waiting for (or getting) an answer.

        Raises:
            InvalidMessageError: the message is not valid.
            ConnectionClosedError: no connection to the broker.
        """
        validate_message(msg, self.config.max_message_size)
        route = await self._route_for(msg.topic)
        mq = self._select_queue(route, msg, queue_id, sharding_key, None, None, None)
        conn = await self._connection_for(route, mq)
        props = self._wire_string(msg, msg.msg_id or new_uniq_id(), None)
        cmd = self._send_command(msg, route, mq.queue_id, props, sys_flag=0)
        await conn.send_oneway(cmd)

    async def send_batch(
        self,
        msgs: list[Message],
        *,
        queue_id: int | None = None,
        sharding_key: str | None = None,
        timeout: float | None = None,
    ) -> SendResult:
        """Send several messages of one topic to one queue in one request.

        The messages are stored consecutively in one queue; the result's ``msg_id`` joins the
        ``UNIQ_KEY`` of every message with commas (as RocketMQ) and ``msg_ids`` lists them.

        Raises:
            InvalidMessageError: an empty batch, mixed topics, delay levels, an invalid message,
                or more than ``max_message_size`` bytes in all.
            TxmqError: the send failed, after the retries for retriable errors.
        """
        return await self._send_batch(
            list(msgs), _Target(queue_id=queue_id, sharding_key=sharding_key, timeout=timeout)
        )

    # -- the kernel, shared with the transactional producer ------------------------------------------

    async def send_message(
        self,
        msg: Message,
        *,
        queue_id: int | None = None,
        sharding_key: str | None = None,
        selector: QueueSelector | None = None,
        timeout: float | None = None,
        sys_flag: int = 0,
        extra_properties: dict[str, str] | None = None,
        broker: str | None = None,
    ) -> SendResult:
        """:meth:`send` with the knobs other senders need (transactional half messages set
        ``sys_flag`` and system properties such as ``TRAN_MSG`` and ``PGROUP``).

        ``extra_properties`` may set ``UNIQ_KEY`` to choose the message id; ``broker`` keeps
        the message in that broker group (the halves of one transaction stay together).
        """
        uniq, build = self._prepare(msg, sys_flag, extra_properties)
        target = _Target(queue_id, sharding_key, selector, timeout, broker)
        return await self._send_with_retries(msg, [uniq], build, target)

    def _prepare(
        self, msg: Message, sys_flag: int, extra_properties: dict[str, str] | None
    ) -> tuple[str, Callable[[TopicRoute, int], RemotingCommand]]:
        """Check ``msg`` and fix its id and wire properties: the id and how to build each
        attempt's request."""
        validate_message(msg, self.config.max_message_size)
        uniq = (extra_properties or {}).get(MessageConst.UNIQ_KEY) or msg.msg_id or new_uniq_id()
        props = self._wire_string(msg, uniq, extra_properties)

        def build(route: TopicRoute, qid: int) -> RemotingCommand:
            return self._send_command(msg, route, qid, props, sys_flag=sys_flag)

        return uniq, build

    async def send_messages(
        self,
        msgs: list[Message],
        *,
        queue_id: int | None = None,
        sharding_key: str | None = None,
        timeout: float | None = None,
        sys_flag: int = 0,
        extra_properties: dict[str, str] | None = None,
        broker: str | None = None,
    ) -> SendResult:
        """:meth:`send_message` for several messages of one topic in one SEND_BATCH_MESSAGE
        (one queue, one acknowledged round trip).  Bodies are sent as they are (a batch is not
        compressed); ``extra_properties`` apply to every message.  The result lists each
        message's ids in ``msg_ids`` and ``offset_msg_ids``.

        Raises:
            InvalidMessageError: an empty batch, mixed topics, an invalid message, or more than
                ``max_message_size`` bytes in all.
        """
        target = _Target(
            queue_id=queue_id, sharding_key=sharding_key, timeout=timeout, broker=broker
        )
        return await self._send_batch(
            msgs, target, sys_flag=sys_flag, extra_properties=extra_properties, allow_delay=True
        )

    async def _send_batch(
        self,
        msgs: list[Message],
        target: _Target,
        *,
        sys_flag: int = 0,
        extra_properties: dict[str, str] | None = None,
        allow_delay: bool = False,
        validated: bool = False,
    ) -> SendResult:
        if not msgs:
            raise InvalidMessageError("a batch needs at least one message")
        topic = msgs[0].topic if isinstance(msgs[0], Message) else ""
        limit = self.config.max_message_size
        uniq_ids = [
            getattr(m, "msg_id", None) or u
            for m, u in zip(msgs, new_uniq_ids(len(msgs)), strict=True)
        ]
        body = self._batch_body(
            msgs, uniq_ids, extra_properties, allow_delay=allow_delay, validated=validated
        ).encode()
        if len(body) > limit:
            raise InvalidMessageError(
                f"the batch is {len(body)} bytes, over the limit of {limit} bytes; send it in "
                "smaller parts"
            )
        header_props = properties_to_string({MessageConst.WAIT_STORE_MSG_OK: "true"})
        probe = msgs[0]

        def build(route: TopicRoute, qid: int) -> RemotingCommand:
            fields = self._v2_fields(topic, qid, header_props, sys_flag, probe.flag, True)
            return RemotingCommand(_SEND_BATCH_MESSAGE, ext_fields=fields, body=body)

        return await self._send_with_retries(probe, uniq_ids, build, target)

    def _batch_body(
        self,
        msgs: list[Message],
        uniq_ids: list[str],
        extra: dict[str, str] | None,
        *,
        allow_delay: bool = False,
        validated: bool = False,
    ) -> BatchBody:
        """The entries of a batch (checked unless ``validated``), each message's properties as
        :meth:`_wire_string` writes them; for a message with no properties of its own, written
        here, the extra properties (a transaction's halves share theirs) once for the batch."""
        topic = msgs[0].topic if isinstance(msgs[0], Message) else ""
        limit = self.config.max_message_size
        batch = BatchBody()
        add = batch.add
        shared = not extra or _UNIQ_OR_WAIT.isdisjoint(extra)
        tail: str | None = None if extra else ""  # properties_to_string(extra), once needed
        for m, uniq in zip(msgs, uniq_ids, strict=True):
            if not validated:
                validate_message(m, limit)
            if m.topic != topic:
                raise InvalidMessageError(
                    f"all messages of a batch must have the same topic ({topic!r} and {m.topic!r})"
                )
            if not allow_delay and m.delay_level > 0:
                raise InvalidMessageError("messages of a batch cannot have a delay level")
            if shared and not (m.properties or m.delay_level or m.tags or m.keys):
                if tail is None:
                    tail = properties_to_string(extra or {})
                props = f"{_UNIQ_HEAD}{uniq}{_WAIT_TAIL}{tail}"  # as _wire_string writes it
            else:
                props = self._wire_string(m, uniq, extra)
            body = m.body
            add(body if type(body) is bytes else m.payload, props.encode("utf-8"), m.flag)
        return batch

    async def _send_with_retries(
        self,
        msg: Message,
        uniq_ids: list[str],
        build: Callable[[TopicRoute, int], RemotingCommand],
        target: _Target,
    ) -> SendResult:
        if not telemetry.AVAILABLE:
            return await self._send_attempts(msg, uniq_ids, build, target)
        with telemetry.send_span(msg, self.group, self.broker, len(uniq_ids)) as span:
            result = await self._send_attempts(msg, uniq_ids, build, target)
            telemetry.sent(
                span, result.msg_ids or [result.msg_id], result.queue_id, result.broker_name
            )
            return result

    # One function for the whole retry loop (route, queue, connection, answer): every send runs
    # it, and a helper coroutine per attempt would cost each send another await.
    async def _send_attempts(
        self,
        msg: Message,
        uniq_ids: list[str],
        build: Callable[[TopicRoute, int], RemotingCommand],
        target: _Target,
    ) -> SendResult:
        timeout = self.config.request_timeout if target.timeout is None else target.timeout
        attempts = self.config.send_attempts
        last_error: TxmqError | None = None
        #: The group of the last failed attempt: a retry goes to another one when it can
        #: (RocketMQ's sendLatencyFaultEnable, in its simplest form).
        failed: str | None = None
        #: The group a retry must go to: the one that may have stored the message already.
        pinned = target.broker
        started = time.monotonic()
        topic = msg.topic
        for attempt in range(attempts):
            if attempt:
                await self._backoff(attempt - 1)
            route = self._routes.get(topic)
            if route is None or (
                time.monotonic() - route.fetched_at >= self.config.route_refresh_interval
            ):
                try:
                    route = await self._route_for(topic)
                except TxmqError as exc:
                    if not exc.retriable or attempt + 1 == attempts:
                        raise
                    last_error = exc
                    log.info("route_retried", topic=topic, attempt=attempt + 1, error=str(exc))
                    continue
            mq = self._select_queue(
                route, msg, target.queue_id, target.sharding_key, target.selector, pinned, failed
            )
            cmd = build(route, mq.queue_id)
            try:
                conn = self.connection
                if conn.group_name is not None and mq.broker and mq.broker != conn.group_name:
                    conn = await self._connection_for(route, mq)
                elif (
                    conn.group_name is not None
                    and not mq.broker
                    and target.broker
                    and target.broker != conn.group_name
                ):
                    # A topic no route names (a broker's internal one, e.g. the transactional
                    # offsets topic) written to a named group: that group, not the one this
                    # connection happens to serve.
                    conn = await conn.for_group(target.broker)
                resp = await conn.request(cmd, timeout)
            except TxmqError as exc:
                if not exc.retriable:
                    raise
                if len(route.brokers) > 1:
                    self._routes.pop(msg.topic, None)  # a group may have a new leader
                last_error = exc
                if isinstance(exc, RequestTimeoutError | ConnectionClosedError):
                    # The request may have been stored: resend to the same group, whose
                    # duplicate window answers it with the first send's result.
                    pinned = pinned or mq.broker
                    _log_retry(msg, mq, attempt, last_error, outcome="unknown")
                    continue
            else:
                status = _STATUS_BY_CODE.get(resp.code)
                if status is not None:
                    if not route.exists:
                        # The broker created the topic on this send: learn its real route next
                        # time.
                        self._routes.pop(msg.topic, None)
                    result = _result(
                        resp, msg.topic, uniq_ids, status, mq.broker or conn.group_name or ""
                    )
                    if self._trace is not None:
                        self._trace.sent(msg, result, started)
                    return result
                last_error = error_for_code(resp.code, resp.remark)
                if not last_error.retriable:
                    raise last_error
            failed = mq.broker
            _log_retry(msg, mq, attempt, last_error)
        assert last_error is not None
        raise last_error

    #: How the producer waits between attempts (a seam: tests record the waits).
    _sleep: Callable[[float], Awaitable[None]] = staticmethod(asyncio.sleep)

    async def _backoff(self, retry: int) -> None:
        """Wait before retry ``retry`` (0 for the first) as ``config.retry_policy`` says."""
        delay = self.config.retry_policy.delay(retry)
        if delay > 0:
            await self._sleep(delay)

    # -- helpers ----------------------------------------------------------------------------------

    def _wire_properties(
        self, msg: Message, uniq: str, extra: dict[str, str] | None
    ) -> dict[str, str]:
        props = msg.wire_properties()
        props[MessageConst.UNIQ_KEY] = uniq
        props[MessageConst.WAIT_STORE_MSG_OK] = "true"
        if extra:
            props.update(extra)
        return props

    def _header(
        self, msg: Message, route: TopicRoute, qid: int, properties: str, sys_flag: int
    ) -> SendMessageRequestHeader:
        return SendMessageRequestHeader(
            producer_group=self.group,
            topic=msg.topic,
            default_topic=AUTO_CREATE_TOPIC_KEY_TOPIC,
            default_topic_queue_nums=self.config.default_topic_queue_nums,
            queue_id=qid,
            sys_flag=sys_flag,
            born_timestamp=int(time.time() * 1000),
            flag=msg.flag,
            properties=properties,
            reconsume_times=0,
            unit_mode=False,
            batch=False,
        )

    def _wire_string(self, msg: Message, uniq: str, extra: dict[str, str] | None) -> str:
        """The message's properties on the wire, with ``uniq`` as its UNIQ_KEY."""
        if msg.properties or msg.delay_level:
            return properties_to_string(self._wire_properties(msg, uniq, extra))
        if not extra:
            return _plain_properties(msg, uniq)
        if msg.tags or msg.keys or not _UNIQ_OR_WAIT.isdisjoint(extra):
            return properties_to_string(self._wire_properties(msg, uniq, extra))
        # A half message's (TRAN_MSG, PGROUP, ...): they follow UNIQ_KEY and WAIT in order.
        return f"{_UNIQ_HEAD}{uniq}{_WAIT_TAIL}{properties_to_string(extra)}"

    def _v2_fields(
        self, topic: str, qid: int, properties: str, sys_flag: int, flag: int, batch: bool
    ) -> dict[str, Any]:
        """``self._header(...).to_v2_ext_fields()`` (with ``batch``), from a per-topic copy of
        the fields a producer's sends share: same keys, same order, same values, so the same
        bytes on the wire (``tests/client/test_client_send_path.py`` compares them)."""
        template = self._v2_templates.get(topic)
        if template is None:
            template = SendMessageRequestHeader(
                producer_group=self.group,
                topic=topic,
                default_topic=AUTO_CREATE_TOPIC_KEY_TOPIC,
                default_topic_queue_nums=self.config.default_topic_queue_nums,
                properties="",
                reconsume_times=0,
                unit_mode=False,
                batch=False,
            ).to_v2_ext_fields()
            if len(self._v2_templates) >= 1024:
                self._v2_templates.clear()
            self._v2_templates[topic] = template
        fields = template.copy()
        fields["e"] = qid
        fields["f"] = sys_flag
        fields["g"] = int(time.time() * 1000)
        fields["h"] = flag
        fields["i"] = properties
        if batch:
            fields["m"] = True
        return fields

    def _send_command(
        self, msg: Message, route: TopicRoute, qid: int, props: str, *, sys_flag: int
    ) -> RemotingCommand:
        body = msg.body
        if type(body) is not bytes:
            body = msg.payload
        over = self.config.compress_over
        if over and len(body) >= over:
            body = compress_body(body, self.config.compress_level)
            sys_flag |= ZLIB_COMPRESSED
        return RemotingCommand(
            _SEND_MESSAGE_V2,
            ext_fields=self._v2_fields(msg.topic, qid, props, sys_flag, msg.flag, False),
            body=body,
        )

    def _select_queue(
        self,
        route: TopicRoute,
        msg: Message,
        queue_id: int | None,
        sharding_key: str | None,
        selector: QueueSelector | None,
        broker: str | None,
        avoid: str | None,
    ) -> MessageQueue:
        """The queue to write: ``queue_id``, the key's, the selector's or the next in turn.

        A topic in several broker groups has its write queues numbered in one list (by group
        name, then queue id): ``sharding_key`` and ``selector`` choose among all of them
        (``selector`` gets and returns positions in that list, which for a topic in one group
        are its queue ids); ``queue_id`` is a queue id in ``broker``'s group (needed then).
        Round robin skips the group ``avoid`` (the last one that failed) while another exists.
        """
        queues: Sequence[MessageQueue] = route.write_queues
        if (
            queues
            and route.writable
            and queue_id is None
            and sharding_key is None
            and selector is None
            and broker is None
            and avoid is None
        ):  # round robin over every writable queue: what most sends ask
            return queues[next(self._rr) % len(queues)]
        if not route.writable:
            raise NoPermissionError(f"topic {route.topic!r} is not writable")
        if broker is not None and route.exists:
            queues = [q for q in queues if q.broker == broker]
            if not queues:
                raise NoPermissionError(
                    f"topic {route.topic!r} has no writable queue in broker group {broker!r} "
                    f"(its groups: {', '.join(route.groups) or 'none'})"
                )
        if not queues:
            raise NoPermissionError(f"topic {route.topic!r} has no writable queue")
        chosen = sum(x is not None for x in (queue_id, sharding_key, selector))
        if chosen > 1:
            raise ValueError("give at most one of queue_id, sharding_key and selector")
        if queue_id is not None:
            groups = {q.broker for q in queues}
            if len(groups) > 1:
                raise InvalidMessageError(
                    f"topic {route.topic!r} has queues in broker groups {sorted(groups)}: "
                    "queue_id needs the group too (broker=...), or use sharding_key"
                )
            for q in queues:
                if q.queue_id == queue_id:
                    return q
            raise InvalidMessageError(
                f"queue {queue_id} does not exist in topic {route.topic!r} "
                f"(queues {[q.queue_id for q in queues]})"
            )
        if sharding_key is not None:
            return queues[zlib.crc32(str(sharding_key).encode("utf-8")) % len(queues)]
        if selector is not None:
            positions = list(range(len(queues)))
            pos = selector(positions, msg)
            if pos not in positions:
                raise InvalidMessageError(
                    f"the queue selector chose queue {pos!r}, which is not one of {positions}"
                )
            return queues[int(pos)]
        if avoid is not None:
            others = [q for q in queues if q.broker != avoid]
            if others:
                queues = others
        return queues[next(self._rr) % len(queues)]

    async def _connection_for(self, route: TopicRoute, mq: MessageQueue) -> BrokerConnection:
        """The connection to ``mq``'s broker group (its leader)."""
        return await self.connection.for_group(mq.broker)

    async def connection_for_group(self, group: str) -> BrokerConnection:
        """The connection to broker group ``group`` (for decisions on what was stored there).

        Raises:
            ConnectionClosedError: no route named the group, or it cannot be reached.
        """
        return await self.connection.for_group(group)

    async def _route_for(self, topic: str) -> TopicRoute:
        route = self._routes.get(topic)
        if route is not None and (
            time.monotonic() - route.fetched_at < self.config.route_refresh_interval
        ):
            return route
        pending = self._route_fetches.get(topic)
        if pending is None:
            pending = asyncio.ensure_future(self._fetch_route(topic, route))
            self._route_fetches[topic] = pending
            pending.add_done_callback(lambda _f: self._route_fetches.pop(topic, None))
        return await asyncio.shield(pending)

    async def _fetch_route(self, topic: str, cached: TopicRoute | None) -> TopicRoute:
        try:
            fetched = await fetch_route(self.connection, topic)
        except TxmqError as exc:
            if cached is not None:
                log.info("route_refresh_failed", topic=topic, error=str(exc))
                return cached
            raise
        if fetched is None:
            # Not created yet: the broker creates it on the first send (autoCreateTopicEnable).
            n = self.config.default_topic_queue_nums
            fetched = TopicRoute(
                topic,
                write_queue_nums=n,
                read_queue_nums=n,
                exists=False,
                write_queues=tuple(MessageQueue(topic, "", i) for i in range(n)),
            )
        self._routes[topic] = fetched
        return fetched
