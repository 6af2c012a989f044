"""PULL_MESSAGE with long polling (RocketMQ's PullMessageProcessor + PullRequestHoldService)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import TYPE_CHECKING

from txmq.protocol.aio import Connection
from txmq.protocol.codes import ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import MessageIllegalError, NoPermissionError, TopicNotExistError
from txmq.protocol.headers import PullMessageRequestHeader, PullMessageResponseHeader
from txmq.protocol.message import parse_subscription, tags_code

from ..store import GetMessageResult, GetMessageStatus
from ..topics import PERM_READ

if TYPE_CHECKING:
    from ..server import BrokerController

FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4

#: The most a long poll is held, whatever the client asks (ms).
MAX_SUSPEND_MS = 60_000


class PullRequestHoldService:
    """Parks pulls that found nothing until a message lands in their queue or they time out."""

    def __init__(self) -> None:
        self._waiters: dict[tuple[str, int], set[asyncio.Future[None]]] = defaultdict(set)
        self._closing = False

    async def wait(self, topic: str, queue_id: int, timeout: float) -> None:
        if self._closing or timeout <= 0:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        key = (topic, queue_id)
        self._waiters[key].add(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            pass
        finally:
            ws = self._waiters.get(key)
            if ws is not None:
                ws.discard(fut)
                if not ws:
                    del self._waiters[key]

    def notify(self, topic: str, queue_id: int) -> None:
        for fut in self._waiters.pop((topic, queue_id), ()):
            if not fut.done():
                fut.set_result(None)

    def wake_all(self) -> None:
        """On shutdown: answer every parked pull now."""
        self._closing = True
        for ws in list(self._waiters.values()):
            for fut in ws:
                if not fut.done():
                    fut.set_result(None)
        self._waiters.clear()


class PullMessageProcessor:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        self.hold = PullRequestHoldService()

    def _tag_codes(self, h: PullMessageRequestHeader) -> frozenset[int] | None:
        expr = h.subscription if h.sys_flag & FLAG_SUBSCRIPTION or h.subscription else None
        if expr is None:
            sub = self.broker.clients.subscription(h.consumer_group, h.topic)
            expr = sub.expression if sub else "*"
        tags = parse_subscription(expr)
        return None if tags is None else frozenset(tags_code(t) for t in tags)

    async def pull_message(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        h = PullMessageRequestHeader.from_ext_fields(cmd.ext_fields)
        tc = self.broker.topics.get(h.topic)
        if tc is None:
            raise TopicNotExistError(f"topic[{h.topic}] not exist, apply first please!")
        if not tc.perm & PERM_READ:
            raise NoPermissionError(f"the topic[{h.topic}] pulling message is forbidden")
        if not 0 <= h.queue_id < tc.read_queue_nums:
            raise MessageIllegalError(
                f"queueId[{h.queue_id}] is illegal, topic:[{h.topic}] topicConfig.readQueueNums:"
                f"[{tc.read_queue_nums}]"
            )
        if h.sys_flag & FLAG_COMMIT_OFFSET and h.commit_offset > 0:
            self.broker.offsets.commit(h.consumer_group, h.topic, h.queue_id, h.commit_offset)
        tag_codes = self._tag_codes(h)
        max_nums = max(1, min(h.max_msg_nums, 1024))
        store = self.broker.store
        result = store.get_messages(
            h.topic, h.queue_id, h.queue_offset, max_nums, tag_codes, joined=True
        )
        suspend = (
            h.sys_flag & FLAG_SUSPEND
            and self.broker.config.long_polling_enable
            and h.suspend_timeout_millis > 0
        )
        if suspend and result.status in (
            GetMessageStatus.NO_MESSAGE_IN_QUEUE,
            GetMessageStatus.OFFSET_OVERFLOW_ONE,
        ):
            timeout = min(h.suspend_timeout_millis, MAX_SUSPEND_MS) / 1000.0
            await self.hold.wait(h.topic, h.queue_id, timeout)
            result = store.get_messages(
                h.topic, h.queue_id, h.queue_offset, max_nums, tag_codes, joined=True
            )
        return self._response(cmd, h, result)

    def _response(
        self, cmd: RemotingCommand, h: PullMessageRequestHeader, r: GetMessageResult
    ) -> RemotingCommand:
        header = PullMessageResponseHeader(
            next_begin_offset=r.next_begin_offset, min_offset=r.min_offset, max_offset=r.max_offset
        )
        s = r.status
        if s is GetMessageStatus.FOUND:
            self.broker.metrics.messages_pulled.inc(r.count)
            return cmd.response(ResponseCode.SUCCESS, None, header.to_ext_fields(), r.joined)
        if s is GetMessageStatus.NO_MATCHED_MESSAGE or s is GetMessageStatus.OFFSET_FOUND_NULL:
            return cmd.response(
                ResponseCode.PULL_RETRY_IMMEDIATELY, "no matched message", header.to_ext_fields()
            )
        if s in (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY):
            return cmd.response(
                ResponseCode.PULL_OFFSET_MOVED,
                f"offset {h.queue_offset} is out of range [{r.min_offset}, {r.max_offset}]",
                header.to_ext_fields(),
            )
        if s is GetMessageStatus.NO_MESSAGE_IN_QUEUE and h.queue_offset != r.next_begin_offset:
            return cmd.response(
                ResponseCode.PULL_OFFSET_MOVED,
                f"offset {h.queue_offset} is out of range of an empty queue",
                header.to_ext_fields(),
            )
        return cmd.response(ResponseCode.PULL_NOT_FOUND, "no new message", header.to_ext_fields())
