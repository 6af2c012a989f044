"""ReceiveMessage / AckMessage / ChangeInvisibleDuration: a simple invisibility model on top of
the broker's consumer offsets.

Per (consumer group, topic, queue) a :class:`QueueView` keeps:

* ``committed`` - every offset below it is acked; it is the group's consumer offset in the
  broker's offset table (the one remoting consumers and ``txmq`` admin commands see), committed
  whenever the acked prefix grows;
* ``next`` - the first offset never handed out;
* ``inflight`` - offsets handed out and not acked: receipt handle nonce, when the message
  becomes visible again, how many times it was delivered;
* ``acked`` - acked offsets above ``committed`` (acks may come in any order).

A receipt handle names (queue, offset, nonce) and the broker run that issued it.  A message
becomes visible again once its invisible duration has passed and is then handed out with a new
handle (the old one no longer acks it).  After ``retryMaxTimes + 1`` deliveries (the group's
settings, else the broker's ``maxReconsumeTimes``) it is moved to ``%DLQ%<group>`` instead.

A group whose settings say ``consumeMessageOrderly`` is FIFO (the broker decides, as RocketMQ's
proxy does): a queue with an invisible message hands out nothing else, and what became visible
again is handed out first, in offset order; one message group is one queue, so its order holds
across redelivery (RocketMQ's orderly pop also blocks per queue).

Differences from RocketMQ's pop consumption (also listed in docs/compatibility.md): the in-flight
state is in memory only, so after a broker restart every unacked message is delivered again from
the committed offset (at least once, never lost); a new group starts at the queue's minimum
offset.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .convert import Code, GrpcStatusError

if TYPE_CHECKING:
    from txmq.protocol.message import MessageExt

    from ..messaging.trace import BrokerTrace

#: A handle of this broker run; handles of an earlier run are refused as expired.
RUN_ID = secrets.token_hex(4)


@dataclass
class InFlight:
    offset: int
    nonce: str
    visible_at: float
    attempts: int


@dataclass
class QueueView:
    committed: int
    next: int
    inflight: dict[int, InFlight] = field(default_factory=dict)
    acked: set[int] = field(default_factory=set)

    def due(self, now: float) -> list[InFlight]:
        """In-flight messages whose invisible duration has passed, in offset order."""
        return sorted(
            (x for x in self.inflight.values() if x.visible_at <= now), key=lambda x: x.offset
        )

    def blocked(self, now: float) -> bool:
        """FIFO: a queue with an invisible message hands out nothing else."""
        return any(x.visible_at > now for x in self.inflight.values())

    def next_visible(self) -> float | None:
        return min((x.visible_at for x in self.inflight.values()), default=None)

    def hand_out(self, offset: int, now: float, invisible_s: float, attempts: int) -> InFlight:
        x = InFlight(offset, secrets.token_hex(6), now + invisible_s, attempts)
        self.inflight[offset] = x
        return x

    def ack(self, offset: int) -> bool:
        """Mark ``offset`` acked; True if ``committed`` moved."""
        self.inflight.pop(offset, None)
        if offset < self.committed:
            return False
        self.acked.add(offset)
        moved = False
        while self.committed in self.acked:
            self.acked.discard(self.committed)
            self.committed += 1
            moved = True
        return moved

    def skip_to(self, offset: int) -> None:
        """Offsets in [next, offset) were filtered out: they count as acked."""
        for o in range(self.next, offset):
            if o not in self.inflight:
                self.acked.add(o)
        self.next = max(self.next, offset)

    def reset(self, offset: int) -> None:
        """The queue moved under us (retention, or an offset beyond its end)."""
        self.committed = self.next = offset
        self.inflight = {k: v for k, v in self.inflight.items() if k >= offset}
        self.acked = {o for o in self.acked if o >= offset}


def make_handle(queue_id: int, x: InFlight) -> str:
    return f"{RUN_ID}-{queue_id}-{x.offset}-{x.nonce}"


def parse_handle(handle: str) -> tuple[int, int, str]:
    """(queue id, offset, nonce) of a receipt handle this broker run issued."""
    parts = handle.split("-")
    if len(parts) != 4 or not all(p.isascii() and p.isdigit() for p in parts[1:3]):
        raise GrpcStatusError(Code.INVALID_RECEIPT_HANDLE, f"invalid receipt handle {handle!r}")
    if parts[0] != RUN_ID:
        raise GrpcStatusError(
            Code.INVALID_RECEIPT_HANDLE,
            "receipt handle is expired (issued before the broker restarted)",
        )
    return int(parts[1]), int(parts[2]), parts[3]


class ConsumptionState:
    """All queue views; ``initial(group, topic, queue)`` gives a new view's start offset and
    ``commit(group, topic, queue, offset)`` records a moved committed offset."""

    def __init__(
        self,
        initial: Callable[[str, str, int], int],
        commit: Callable[[str, str, int, int], None],
    ) -> None:
        self._initial = initial
        self._commit = commit
        self.views: dict[tuple[str, str, int], QueueView] = {}
        #: the broker's message trace (``traceTopicEnable``): acks, changes of invisible
        #: duration and dead letters are recorded as SubAfter records
        self.trace: BrokerTrace | None = None

    def view(self, group: str, topic: str, queue_id: int) -> QueueView:
        key = (group, topic, queue_id)
        v = self.views.get(key)
        if v is None:
            start = self._initial(group, topic, queue_id)
            v = QueueView(start, start)
            self.views[key] = v
        return v

    def existing(self, group: str, topic: str, queue_id: int) -> QueueView | None:
        return self.views.get((group, topic, queue_id))

    def ack(self, group: str, topic: str, handle: str, msg_id: str = "") -> None:
        """Ack one handle.  Acking an offset that is already acked is fine; a handle that was
        replaced (the message was handed out again) is refused.  ``msg_id``: the message the
        client acks, traced (none: the ack is not the client's, e.g. before a dead letter)."""
        qid, offset, nonce = parse_handle(handle)
        v = self.existing(group, topic, qid)
        if v is None:
            raise GrpcStatusError(
                Code.INVALID_RECEIPT_HANDLE, "receipt handle does not belong to this group/topic"
            )
        x = v.inflight.get(offset)
        if x is None:
            if offset < v.committed or offset in v.acked:
                return
            raise GrpcStatusError(Code.INVALID_RECEIPT_HANDLE, "receipt handle is unknown")
        if x.nonce != nonce:
            raise GrpcStatusError(
                Code.INVALID_RECEIPT_HANDLE,
                "receipt handle is expired: the message was delivered again since",
            )
        if v.ack(offset):
            self._commit(group, topic, qid, v.committed)
        if self.trace is not None and msg_id:
            self.trace.settled(group, msg_id, "ack", True)

    def dead_lettered(self, group: str, msg: MessageExt) -> None:
        """``msg`` went to the group's dead-letter queue (traced as a remoting send-back to
        it is)."""
        if self.trace is not None:
            self.trace.sent_back(group, msg, dead_letter=True)

    def change_invisible(
        self,
        group: str,
        topic: str,
        handle: str,
        invisible_s: float,
        now: float,
        msg_id: str = "",
    ) -> str:
        qid, offset, nonce = parse_handle(handle)
        v = self.existing(group, topic, qid)
        x = v.inflight.get(offset) if v is not None else None
        if x is None or x.nonce != nonce:
            raise GrpcStatusError(
                Code.INVALID_RECEIPT_HANDLE, "receipt handle is expired or already acked"
            )
        x.visible_at = now + invisible_s
        x.nonce = secrets.token_hex(6)
        if self.trace is not None and msg_id:
            # not consumed (yet): a client's nack, or more time asked for
            self.trace.settled(group, msg_id, "invisible", False)
        return make_handle(qid, x)
