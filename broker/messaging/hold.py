"""Parked long polls (RocketMQ's PullRequestHoldService), shared by the remoting PULL and the
gRPC ReceiveMessage: a pull that found nothing waits until an append reaches its queue (the
write path's subscriber) or it times out."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable


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

    def on_append(self, destinations: Iterable[tuple[str, int]]) -> None:
        """The write path's subscriber: wake the pulls parked on these queues."""
        waiters = self._waiters
        if not waiters:
            return
        for topic, qid in destinations:
            if (topic, qid) in waiters:
                self.notify(topic, qid)

    def parked(self, topic: str, queue_id: int) -> int:
        """How many pulls are parked on a queue now."""
        return len(self._waiters.get((topic, queue_id), ()))
