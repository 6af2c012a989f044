"""What the broker's components are given: :class:`BrokerContext`, built in one piece by the
composition root (:mod:`txmq.broker.server`) once the store is open, before any processor.

Components take the context (or the few members of it they use), never the controller; what
points upward (the cluster layer, the check sender) is a typed port (:mod:`.ports`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .store.errors import StoreIOError

if TYPE_CHECKING:
    from .clients import ClientManager
    from .config import BrokerConfig
    from .flush import FlushService
    from .messaging.hold import PullRequestHoldService
    from .messaging.write import WritePath
    from .metrics import BrokerMetrics
    from .ports import ClusterPort
    from .store import ConsumerOffsetManager, MessageStore
    from .store.subscription_group import SubscriptionGroupManager
    from .topics import TopicManager

#: Runs a blocking call off the event loop (the broker's metadata thread).
Background = Callable[[Callable[[], Any]], Awaitable[Any]]


class Lifecycle:
    """Where the broker is in its life, for components that answer differently then."""

    __slots__ = ("shutting_down",)

    def __init__(self) -> None:
        self.shutting_down = False


@dataclass(frozen=True, slots=True)
class BrokerContext:
    config: BrokerConfig
    #: Wall clock in seconds (store timestamps, transaction ages); a seam for tests.
    clock: Callable[[], float]
    metrics: BrokerMetrics
    store: MessageStore
    #: The IPv4 address and port stored messages carry as their store host.
    store_host: tuple[str, int]
    offsets: ConsumerOffsetManager
    #: Consumer group settings (``config/subscriptionGroup.json``).
    groups: SubscriptionGroupManager
    topics: TopicManager
    clients: ClientManager
    flush: FlushService
    write: WritePath
    #: Parked long polls (remoting PULL, gRPC ReceiveMessage), woken by appends.
    hold: PullRequestHoldService
    #: The delay levels in ms (``messageDelayLevel``).
    delay_levels: list[int]
    #: Runs a blocking call (a state-file write, retention) off the event loop.
    in_background: Background
    lifecycle: Lifecycle
    #: Cluster mode: routes, status and cross-group decisions; None for a single broker.
    cluster: ClusterPort | None = None

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def reconfigure(self, config: BrokerConfig) -> None:
        """Swap in a configuration changed while the broker runs (only keys of
        :data:`txmq.broker.runtime_config.RUNTIME_KEYS` differ); every other field stays."""
        object.__setattr__(self, "config", config)

    async def persist_topics(self) -> None:
        """Write the topic table if a change is not written yet (a request that created a topic
        waits for this before it is answered).

        Raises:
            StoreIOError: the table could not be written (a full disk); it stays dirty and is
                written by a later call.
        """
        table = self.topics.table
        if table.dirty:
            try:
                await self.in_background(table.persist)
            except OSError as exc:
                if isinstance(exc, StoreIOError):
                    raise
                raise StoreIOError.wrapping(
                    f"cannot write the topic table {table.path}: {exc}", exc
                ) from exc
