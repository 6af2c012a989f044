"""The synchronous facade: thin wrappers that run the async core on one private event loop.

The loop lives in a daemon thread (:class:`~txmq.client.bridge.LoopThread`), shared by every
sync client of the process and started on first use.  Each sync method submits the matching
coroutine to it and waits for its result, so there is one copy of the logic.  Sync message
callbacks of a :class:`PushConsumer` run in the consumer's own thread pool, never on the
private loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, ClassVar, Concatenate, Generic, ParamSpec, Protocol, Self, TypeVar

from txmq.protocol.message import Message

from .admin import AsyncAdminClient
from .bridge import LoopThread
from .consumer import AsyncPushConsumer, MessageCallback
from .lifecycle import ConnectedClient
from .logs import get_logger
from .orderly import AsyncOrderlyPushConsumer
from .producer import AsyncProducer, SendResult
from .pull_consumer import AsyncPullConsumer
from .simple_consumer import AsyncSimpleConsumer

R = TypeVar("R")
#: ``callback(result, error)`` of :meth:`Producer.send_async`: one of the two is None.
SendCallback = Callable[[SendResult | None, BaseException | None], None]
_log = get_logger(__name__)
P = ParamSpec("P")
C = TypeVar("C", bound=ConnectedClient)


class _Lifecycle(Protocol):
    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...


class _SyncClient:
    #: The async client this facade drives.
    _core: _Lifecycle

    def __init__(self) -> None:
        self._runner = LoopThread.shared()

    def _run(self, coro: Coroutine[Any, Any, R]) -> R:
        return self._runner.run(coro)

    def start(self) -> None:
        """Connect to the broker (see the async class)."""
        self._run(self._core.start())

    def shutdown(self) -> None:
        """Close cleanly (see the async class).  Idempotent."""
        self._run(self._core.shutdown())

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()


class _GroupClient(_SyncClient, Generic[C]):
    """A facade that builds its async client from the arguments it is given, as they are (the
    async class documents them)."""

    #: The async client class this facade builds.
    _core_type: type[C]
    core: C
    #: What ``help()`` and ``inspect.signature`` show: the async class's parameters.
    __signature__: ClassVar[inspect.Signature]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__signature__ = inspect.signature(cls._core_type)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self._core = self.core = self._core_type(*args, **kwargs)


def blocking(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[_SyncClient, P], R]:
    """The blocking form of an async client's coroutine method, for the facade of that client:
    the same arguments, run on the shared loop with the facade's core as ``self``.

    ``send = blocking(AsyncProducer.send)`` in :class:`Producer` is ``Producer.send``, with
    :meth:`AsyncProducer.send`'s signature (for type checkers and ``help()``) and docstring.
    """

    def run(self: _SyncClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._run(method(self._core, *args, **kwargs))

    functools.update_wrapper(run, method, assigned=("__name__", "__doc__"))
    return run


async def _next(it: AsyncIterator[R]) -> R:
    return await anext(it)


async def _close(it: AsyncIterator[Any]) -> None:
    if isinstance(it, AsyncGenerator):
        await it.aclose()


def blocking_iter(
    method: Callable[Concatenate[Any, P], AsyncIterator[R]],
) -> Callable[Concatenate[_SyncClient, P], Iterator[R]]:
    """The blocking form of an async client's async-iterator method (the paged listings): a
    generator that asks for the next entry on the shared loop each time it is advanced."""

    def run(self: _SyncClient, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[R]:
        it = method(self._core, *args, **kwargs)
        try:
            while True:
                try:
                    entry = self._run(_next(it))
                except StopAsyncIteration:
                    return
                yield entry
        finally:
            self._run(_close(it))

    functools.update_wrapper(run, method, assigned=("__name__", "__doc__"))
    return run


class Producer(_GroupClient[AsyncProducer]):
    """The blocking producer; see :class:`~txmq.client.AsyncProducer` for the arguments.

    Example::

        with Producer("orders-producer", broker="127.0.0.1:10911") as producer:
            result = producer.send(Message("orders", b"...", tags="created"))
    """

    _core_type = AsyncProducer

    send = blocking(AsyncProducer.send)
    send_oneway = blocking(AsyncProducer.send_oneway)
    send_batch = blocking(AsyncProducer.send_batch)

    def send_async(
        self,
        msg: Message,
        callback: SendCallback | None = None,
        **options: Any,
    ) -> concurrent.futures.Future[SendResult]:
        """Send ``msg`` without waiting: the returned :class:`concurrent.futures.Future` is
        resolved with the :class:`SendResult` (or the error) once the broker answered.

        Sends made so from several threads, or in a row from one, travel together (with
        ``auto_batch``, in one request), unlike :meth:`send`, which waits for each answer.

        Args:
            msg: the message.
            callback: ``callback(result, error)``, called once with exactly one of them not
                None (RocketMQ's ``SendCallback``).  It runs on the client's event loop thread:
                keep it short, and do not call a blocking txmq client from it.  It has
                returned before the future is resolved; an exception it raises is logged
                and does not change the future.
            options: what :meth:`AsyncProducer.send` takes (``queue_id``, ``sharding_key``,
                ``selector``, ``timeout``, ``broker``).

        Raises:
            ClientStateError: the client's event loop is closed.
        """
        if callback is None:
            return asyncio.run_coroutine_threadsafe(
                self.core.send(msg, **options), self._runner.loop
            )
        return asyncio.run_coroutine_threadsafe(
            _send_then_call(self.core.send(msg, **options), callback), self._runner.loop
        )


async def _send_then_call(
    send: Coroutine[Any, Any, SendResult], callback: SendCallback
) -> SendResult:
    """Await ``send``, then call ``callback`` before the caller's future is resolved, so a
    thread that waited for the future sees what the callback did."""
    try:
        result = await send
    except BaseException as error:  # noqa: BLE001 - the callback is told, then it propagates
        _call(callback, None, error)
        raise
    _call(callback, result, None)
    return result


def _call(callback: SendCallback, result: SendResult | None, error: BaseException | None) -> None:
    try:
        callback(result, error)
    except Exception:
        _log.exception("send_callback_failed", callback=getattr(callback, "__name__", "?"))


class PushConsumer(_GroupClient[AsyncPushConsumer]):
    """The blocking-lifecycle push consumer; see :class:`~txmq.client.AsyncPushConsumer`.

    Example::

        consumer = PushConsumer("billing", broker="127.0.0.1:10911")
        consumer.subscribe("orders", "created || paid", on_message)
        consumer.start()
        ...
        consumer.shutdown()
    """

    _core_type = AsyncPushConsumer

    def subscribe(self, topic: str, expression: str | None, callback: MessageCallback) -> None:
        """Consume ``topic``'s messages matching ``expression`` (``"*"`` or ``"a || b"``) with
        ``callback(msg)``: return to acknowledge, raise to get the message again later."""

        async def go() -> None:
            self.core.subscribe(topic, expression, callback)

        self._run(go())

    def unsubscribe(self, topic: str) -> None:
        """Stop consuming ``topic``."""

        async def go() -> None:
            self.core.unsubscribe(topic)

        self._run(go())

    def assignment(self) -> list[tuple[str, int]]:
        """The (topic, queue id) pairs this member consumes now."""

        async def go() -> list[tuple[str, int]]:
            return self.core.assignment()

        return self._run(go())

    @property
    def client_id(self) -> str | None:
        """This member's id in the group (None before start)."""
        return self.core.client_id


class OrderlyPushConsumer(PushConsumer):
    """The blocking-lifecycle orderly push consumer; see
    :class:`~txmq.client.AsyncOrderlyPushConsumer`: each queue's messages are handled one at
    a time, in order, by the one member holding the queue's lock.  Used as
    :class:`PushConsumer` is.
    """

    _core_type = AsyncOrderlyPushConsumer


class PullConsumer(_GroupClient[AsyncPullConsumer]):
    """The blocking pull consumer; see :class:`~txmq.client.AsyncPullConsumer`.

    Example::

        with PullConsumer("audit", broker="127.0.0.1:10911") as consumer:
            for queue_id in consumer.fetch_queues("orders"):
                result = consumer.pull("orders", queue_id, 0)
    """

    _core_type = AsyncPullConsumer

    fetch_queues = blocking(AsyncPullConsumer.fetch_queues)
    fetch_message_queues = blocking(AsyncPullConsumer.fetch_message_queues)
    pull = blocking(AsyncPullConsumer.pull)
    commit_offset = blocking(AsyncPullConsumer.commit_offset)
    committed_offset = blocking(AsyncPullConsumer.committed_offset)
    max_offset = blocking(AsyncPullConsumer.max_offset)
    min_offset = blocking(AsyncPullConsumer.min_offset)
    offset_for_timestamp = blocking(AsyncPullConsumer.offset_for_timestamp)


class SimpleConsumer(_GroupClient[AsyncSimpleConsumer]):
    """The blocking receive/ack consumer; see :class:`~txmq.client.AsyncSimpleConsumer`.

    Example::

        with SimpleConsumer("billing", subscriptions={"orders": "*"}) as consumer:
            for msg in consumer.receive(16, invisible_duration=30):
                handle(msg.body)
                consumer.ack(msg)
    """

    _core_type = AsyncSimpleConsumer

    receive = blocking(AsyncSimpleConsumer.receive)
    ack = blocking(AsyncSimpleConsumer.ack)
    change_invisible_duration = blocking(AsyncSimpleConsumer.change_invisible_duration)

    def subscribe(self, topic: str, expression: str | None = "*") -> None:
        """Receive ``topic``'s messages matching ``expression``."""

        async def go() -> None:
            self.core.subscribe(topic, expression)

        self._run(go())

    def unsubscribe(self, topic: str) -> None:
        """Stop receiving ``topic``."""

        async def go() -> None:
            self.core.unsubscribe(topic)

        self._run(go())


class AdminClient(_SyncClient):
    """The blocking admin client; see :class:`~txmq.client.AsyncAdminClient` for the arguments
    and each method (the CLI and the web console use the async one).

    Example::

        with AdminClient("127.0.0.1:10911") as admin:
            print(admin.consume_stats("billing"))
            admin.update_broker_config({"transactionCheckMax": 5})
    """

    __signature__: ClassVar[inspect.Signature] = inspect.signature(AsyncAdminClient)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self._core = self.core = AsyncAdminClient(*args, **kwargs)

    runtime_info = blocking(AsyncAdminClient.runtime_info)
    cluster_status = blocking(AsyncAdminClient.cluster_status)
    metrics = blocking(AsyncAdminClient.metrics)
    create_topic = blocking(AsyncAdminClient.create_topic)
    update_topic = blocking(AsyncAdminClient.update_topic)
    delete_topic = blocking(AsyncAdminClient.delete_topic)
    list_topics = blocking(AsyncAdminClient.list_topics)
    list_topics_page = blocking(AsyncAdminClient.list_topics_page)
    iter_topics = blocking_iter(AsyncAdminClient.iter_topics)
    topic_stats = blocking(AsyncAdminClient.topic_stats)
    route = blocking(AsyncAdminClient.route)
    consumer_groups = blocking(AsyncAdminClient.consumer_groups)
    list_groups_page = blocking(AsyncAdminClient.list_groups_page)
    iter_groups = blocking_iter(AsyncAdminClient.iter_groups)
    consume_stats = blocking(AsyncAdminClient.consume_stats)
    consumer_connections = blocking(AsyncAdminClient.consumer_connections)
    producer_connections = blocking(AsyncAdminClient.producer_connections)
    delete_consumer_group = blocking(AsyncAdminClient.delete_consumer_group)
    group_config = blocking(AsyncAdminClient.group_config)
    update_group_config = blocking(AsyncAdminClient.update_group_config)
    reset_offset = blocking(AsyncAdminClient.reset_offset)
    broker_config = blocking(AsyncAdminClient.broker_config)
    update_broker_config = blocking(AsyncAdminClient.update_broker_config)
    list_transactions = blocking(AsyncAdminClient.list_transactions)
    list_transactions_page = blocking(AsyncAdminClient.list_transactions_page)
    iter_transactions = blocking_iter(AsyncAdminClient.iter_transactions)
    get_transaction = blocking(AsyncAdminClient.get_transaction)
    resume_transaction = blocking(AsyncAdminClient.resume_transaction)
    force_decide = blocking(AsyncAdminClient.force_decide)
    abort_batch = blocking(AsyncAdminClient.abort_batch)
    view_message = blocking(AsyncAdminClient.view_message)
    find_message = blocking(AsyncAdminClient.find_message)
    query_messages = blocking(AsyncAdminClient.query_messages)
    query_messages_page = blocking(AsyncAdminClient.query_messages_page)
    iter_messages = blocking_iter(AsyncAdminClient.iter_messages)
