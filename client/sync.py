"""The synchronous facade: thin wrappers that run the async core on one private event loop.

The loop lives in a daemon thread (:class:`~txmq.client.bridge.LoopThread`), shared by every
sync client of the process and started on first use.  Each sync method submits the matching
coroutine to it and waits for its result, so there is one copy of the logic.  Sync message
callbacks of a :class:`PushConsumer` run in the consumer's own thread pool, never on the
private loop.
"""

from __future__ import annotations

from collections.abc import Coroutine
from datetime import datetime
from types import TracebackType
from typing import Any, Self, TypeVar

from txmq.protocol.message import Message

from .bridge import LoopThread
from .config import DEFAULT_BROKER, ClientConfig
from .consumer import AsyncPushConsumer, ConsumeFrom, MessageCallback
from .lifecycle import AsyncClient
from .producer import AsyncProducer, QueueSelector, SendResult
from .pull_consumer import AsyncPullConsumer, PullResult
from .route import MessageQueue

R = TypeVar("R")


class _SyncClient:
    #: The async client this facade drives.
    _core: AsyncClient

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


class Producer(_SyncClient):
    """The blocking producer; see :class:`~txmq.client.AsyncProducer` for the arguments.

    Example::

        with Producer("orders-producer", broker="127.0.0.1:10911") as producer:
            result = producer.send(Message("orders", b"...", tags="created"))
    """

    def __init__(
        self,
        group: str,
        broker: str = DEFAULT_BROKER,
        *,
        config: ClientConfig | None = None,
        **settings: Any,
    ) -> None:
        super().__init__()
        self._core = self.core = AsyncProducer(group, broker, config=config, **settings)

    def send(
        self,
        msg: Message,
        *,
        queue_id: int | None = None,
        sharding_key: str | None = None,
        selector: QueueSelector | None = None,
        timeout: float | None = None,
        broker: str | None = None,
    ) -> SendResult:
        """Send one message and wait until it is stored; see :meth:`AsyncProducer.send`."""
        return self._run(
            self.core.send(
                msg,
                queue_id=queue_id,
                sharding_key=sharding_key,
                selector=selector,
                timeout=timeout,
                broker=broker,
            )
        )

    def send_oneway(
        self, msg: Message, *, queue_id: int | None = None, sharding_key: str | None = None
    ) -> None:
        """Send without an answer; see :meth:`AsyncProducer.send_oneway`."""
        self._run(self.core.send_oneway(msg, queue_id=queue_id, sharding_key=sharding_key))

    def send_batch(
        self,
        msgs: list[Message],
        *,
        queue_id: int | None = None,
        sharding_key: str | None = None,
        timeout: float | None = None,
    ) -> SendResult:
        """Send messages of one topic to one queue at once; see :meth:`AsyncProducer.send_batch`."""
        return self._run(
            self.core.send_batch(
                msgs, queue_id=queue_id, sharding_key=sharding_key, timeout=timeout
            )
        )


class PushConsumer(_SyncClient):
    """The blocking-lifecycle push consumer; see :class:`~txmq.client.AsyncPushConsumer`.

    Example::

        consumer = PushConsumer("billing", broker="127.0.0.1:10911")
        consumer.subscribe("orders", "created || paid", on_message)
        consumer.start()
        ...
        consumer.shutdown()
    """

    def __init__(
        self,
        group: str,
        broker: str = DEFAULT_BROKER,
        *,
        consume_from: ConsumeFrom | str | int | float | datetime = ConsumeFrom.LAST,
        max_reconsume_times: int = 16,
        config: ClientConfig | None = None,
        **settings: Any,
    ) -> None:
        super().__init__()
        self._core = self.core = AsyncPushConsumer(
            group,
            broker,
            consume_from=consume_from,
            max_reconsume_times=max_reconsume_times,
            config=config,
            **settings,
        )

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


class PullConsumer(_SyncClient):
    """The blocking pull consumer; see :class:`~txmq.client.AsyncPullConsumer`.

    Example::

        with PullConsumer("audit", broker="127.0.0.1:10911") as consumer:
            for queue_id in consumer.fetch_queues("orders"):
                result = consumer.pull("orders", queue_id, 0)
    """

    def __init__(
        self,
        group: str,
        broker: str = DEFAULT_BROKER,
        *,
        config: ClientConfig | None = None,
        **settings: Any,
    ) -> None:
        super().__init__()
        self._core = self.core = AsyncPullConsumer(group, broker, config=config, **settings)

    def fetch_queues(self, topic: str) -> list[int]:
        """The readable queue ids of ``topic``."""
        return self._run(self.core.fetch_queues(topic))

    def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of ``topic`` in every broker group that has it."""
        return self._run(self.core.fetch_message_queues(topic))

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int = 32,
        expression: str = "*",
        timeout: float | None = None,
        long_poll: float = 0.0,
        *,
        broker: str | None = None,
    ) -> PullResult:
        """Read up to ``max_nums`` messages from ``offset`` on; see
        :meth:`AsyncPullConsumer.pull`."""
        return self._run(
            self.core.pull(
                topic,
                queue_id,
                offset,
                max_nums=max_nums,
                expression=expression,
                timeout=timeout,
                long_poll=long_poll,
                broker=broker,
            )
        )

    def commit_offset(
        self, topic: str, queue_id: int, offset: int, *, broker: str | None = None
    ) -> None:
        """Store the group's next offset to consume for a queue."""
        self._run(self.core.commit_offset(topic, queue_id, offset, broker=broker))

    def committed_offset(
        self, topic: str, queue_id: int, *, broker: str | None = None
    ) -> int | None:
        """The group's stored offset for a queue, or None."""
        return self._run(self.core.committed_offset(topic, queue_id, broker=broker))

    def max_offset(self, topic: str, queue_id: int, *, broker: str | None = None) -> int:
        """The queue's next free offset."""
        return self._run(self.core.max_offset(topic, queue_id, broker=broker))

    def min_offset(self, topic: str, queue_id: int, *, broker: str | None = None) -> int:
        """The queue's smallest stored offset."""
        return self._run(self.core.min_offset(topic, queue_id, broker=broker))

    def offset_for_timestamp(
        self,
        topic: str,
        queue_id: int,
        ts_ms: int | float | datetime,
        *,
        broker: str | None = None,
    ) -> int:
        """The first offset stored at or after ``ts_ms``."""
        return self._run(self.core.offset_for_timestamp(topic, queue_id, ts_ms, broker=broker))
