"""Reading a whole consume queue back, message by message (for the components that rebuild
their state from a queue of their own at start)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from txmq.protocol.message import MessageExt, decode_message

from .results import GetMessageStatus

if TYPE_CHECKING:
    from .message_store import MessageStore


def read_queue(
    store: MessageStore, topic: str, queue_id: int, start: int = 0, *, chunk: int = 256
) -> Iterator[MessageExt]:
    """The messages of one queue from offset ``start`` (or the oldest one still stored, when
    retention removed ``start``) to its end, read ``chunk`` at a time; a gap in the queue is
    stepped over."""
    offset = max(start, store.get_min_offset_in_queue(topic, queue_id))
    while True:
        r = store.get_messages(topic, queue_id, offset, chunk)
        if r.status is GetMessageStatus.FOUND:
            for raw in r.messages:
                yield decode_message(raw)
            offset = r.next_begin_offset
        elif r.next_begin_offset > offset:
            offset = r.next_begin_offset
        else:
            return
