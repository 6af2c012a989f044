"""The messaging core built in-process, without a socket: the parts the composition root
(``BrokerController.start``) wires, and no more -- a real store in a folder, the offset, group
and topic tables, the write path, the flush service and the transaction service -- so a test
calls the use cases (:class:`~txmq.broker.messaging.core.MessagingCore`, its POP service and
read side) directly and checks their rules.

The wall clock is the one seam faked: ``FakeClock`` is what the context, the store and the
transaction service read, so invisible times, duplicate windows and transaction ages move when a
test says, not when the machine gets round to it.  :meth:`CoreHarness.reopen` closes everything
and builds it again over the same folder (what a restart rebuilds from the commit log).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any

from txmq.broker.clients import ClientManager
from txmq.broker.config import BrokerConfig, delay_levels
from txmq.broker.context import BrokerContext, Lifecycle
from txmq.broker.flush import FlushService
from txmq.broker.messaging.core import MessagingCore, SendOutcome
from txmq.broker.messaging.hold import PullRequestHoldService
from txmq.broker.messaging.write import WritePath
from txmq.broker.metrics import BrokerMetrics
from txmq.broker.server import store_config
from txmq.broker.store import ConsumerOffsetManager, MessageStore, TopicConfigManager
from txmq.broker.store.subscription_group import SubscriptionGroupManager
from txmq.broker.topics import TopicManager
from txmq.broker.transaction.service import TransactionalMessageService
from txmq.protocol.message import MessageConst, MessageExt

#: Where the fake clock starts (epoch seconds; any fixed time will do).
START = 1_800_000_000.0


class FakeClock:
    """A wall clock in seconds that moves only when told."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def ms(self) -> int:
        return int(self.now * 1000)


async def _inline(fn: Callable[[], Any]) -> Any:
    """The context's ``in_background``, run at once (the files are small and nothing else
    runs on the loop)."""
    return fn()


_uniq = itertools.count()


def message(
    topic: str,
    body: bytes = b"x",
    *,
    uniq: str | None = None,
    tags: str | None = None,
    queue_id: int = 0,
    **props: str,
) -> MessageExt:
    """A producer's message as a front end hands it to the core: a UNIQ_KEY (fresh unless
    given), optional tags, other properties as keywords."""
    properties = {MessageConst.UNIQ_KEY: uniq or f"U{next(_uniq):012d}", **props}
    if tags is not None:
        properties[MessageConst.TAGS] = tags
    return MessageExt(topic=topic, body=body, queue_id=queue_id, properties=properties)


def half(topic: str, txid: str, group: str = "pg", body: bytes = b"h") -> MessageExt:
    """A transaction's half as a producer sends it (``TRAN_MSG``, its group, its id)."""
    m = message(topic, body, uniq=txid)
    m.properties.update({MessageConst.TRAN_MSG: "true", MessageConst.PGROUP: group})
    return m


class CoreHarness:
    """The core over a store in ``root``; :meth:`open` builds it, :meth:`close` stops it."""

    def __init__(self, root: str, clock: FakeClock | None = None, **config: Any) -> None:
        values: dict[str, Any] = {"listen_port": 0, "default_topic_queue_nums": 1}
        values.update(config)
        self.config = BrokerConfig(store_path_root_dir=root, **values)
        self.clock = clock or FakeClock()

    def open(self) -> MessagingCore:
        cfg, root = self.config, self.config.store_path_root_dir
        os.makedirs(root, exist_ok=True)
        metrics = BrokerMetrics()
        levels = delay_levels(cfg.message_delay_level)
        self.store = store = MessageStore(store_config(cfg), ("127.0.0.1", 10911), clock=self.clock)
        store.load()
        self.offsets = ConsumerOffsetManager(os.path.join(root, "config", "consumerOffset.json"))
        self.offsets.load()
        self.groups = SubscriptionGroupManager(
            os.path.join(root, "config", "subscriptionGroup.json"),
            default_retry_max_times=lambda: cfg.max_reconsume_times,
        )
        self.groups.load()
        table = TopicConfigManager(os.path.join(root, "config", "topics.json"), write_behind=True)
        table.load()
        topics = TopicManager(
            table,
            auto_create=cfg.auto_create_topic_enable,
            default_queue_nums=cfg.default_topic_queue_nums,
            delay_levels=len(levels),
        )
        self.flush = FlushService(
            store,
            sync=cfg.sync_flush,
            interval_ms=cfg.flush_interval_commit_log,
            sync_timeout_ms=cfg.sync_flush_timeout,
            metrics=metrics,
        )
        write = WritePath(store, metrics)
        self.ctx = ctx = BrokerContext(
            config=cfg,
            clock=self.clock,
            metrics=metrics,
            store=store,
            store_host=("127.0.0.1", 10911),
            offsets=self.offsets,
            groups=self.groups,
            topics=topics,
            clients=ClientManager(),
            flush=self.flush,
            write=write,
            hold=PullRequestHoldService(),
            delay_levels=levels,
            in_background=_inline,
            lifecycle=Lifecycle(),
        )
        self.tx = TransactionalMessageService(ctx)
        self.core = MessagingCore(ctx, self.tx)
        write.subscribe(self.flush)
        write.subscribe(ctx.hold)
        self.tx.load()
        self.core.recover()
        return self.core

    async def close(self) -> None:
        """What a graceful shutdown writes: the flush, the tables, the store."""
        await self.flush.stop()
        self.flush._executor.shutdown(wait=True)
        self.flush._queue_executor.shutdown(wait=True)
        self.offsets.persist()
        self.ctx.topics.table.persist()
        self.groups.persist()
        self.store.close()

    async def reopen(self) -> MessagingCore:
        await self.close()
        return self.open()

    # -- what tests ask of the store ------------------------------------------------------------

    async def send(self, *msgs: MessageExt, group: str = "pg") -> SendOutcome:
        """What a front end does with a send: the topic looked up (created as the broker
        allows), then the send use case."""
        for m in msgs:
            await self.core.topic_for_send(m.topic, 0)
        return await self.core.send(list(msgs), group)

    def stored(self, topic: str, queue_id: int = 0) -> list[MessageExt]:
        """Every message in the queue, in offset order (as a consumer reads it)."""
        from txmq.broker.store import GetMessageStatus
        from txmq.protocol.message import decode_message

        out: list[MessageExt] = []
        offset = self.store.get_min_offset_in_queue(topic, queue_id)
        while True:
            r = self.store.get_messages(topic, queue_id, offset, 32)
            if r.status is not GetMessageStatus.FOUND:
                return out
            out.extend(decode_message(raw) for raw in r.messages)
            offset = r.next_begin_offset

    def bodies(self, topic: str, queue_id: int = 0) -> list[bytes]:
        return [m.body for m in self.stored(topic, queue_id)]
