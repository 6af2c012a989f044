"""The read side of the message store: messages read from a consume queue, the entries
it repairs on the way, and the lookups by offset and by time."""

from __future__ import annotations

from collections.abc import Callable

from txmq.protocol.errors import ProtocolError, QueryNotFoundError
from txmq.protocol.message import MessageExt, decode_message

from .commit_log import CommitLog
from .consume_queue import CQ_ENTRY, HOLE_SIZE, ConsumeQueue, first_false
from .recovery import queue_log, valid_destination
from .results import GetMessageResult, GetMessageStatus

#: How many consume-queue entries one get may scan past filtered ones (RocketMQ's
#: maxFilterMessageSize of 16000 bytes = 800 entries).
MAX_FILTER_SCAN = 800


class QueueReads:
    """The reads of :class:`~.message_store.MessageStore` (a part of it: the state is the
    store's)."""

    _commit_log: CommitLog
    _cqs: dict[tuple[str, int], ConsumeQueue]
    visible_end: int | None
    _get_found: int
    _get_miss: int

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int = 32,
        tag_codes: frozenset[int] | None = None,
        max_bytes: int = 4 * 1024 * 1024,
        joined: bool = False,
        message_filter: Callable[[bytes], bool] | None = None,
        for_consumer: bool = False,
    ) -> GetMessageResult:
        """Read up to ``max_msgs`` messages (and about ``max_bytes``) from a queue, starting at
        queue offset ``offset``.

        Statuses follow RocketMQ's ``DefaultMessageStore.getMessage``; a queue the store has
        never written (but could) is an empty queue, NO_MESSAGE_IN_QUEUE, so the broker can
        hold a long-polling pull on it; NO_MATCHED_LOGIC_QUEUE is for a topic or queue id that
        cannot exist.

        Args:
            topic: the topic.
            queue_id: the queue.
            offset: the first queue offset wanted.
            max_msgs: most messages returned.
            tag_codes: tag codes to keep (None: all messages).
            max_bytes: stop before exceeding this many bytes (the first message is returned
                whatever its size).
            joined: return the messages back to back in one buffer (``joined``), copied once
                from the commit log, rather than one bytes object each.
            message_filter: keep only the stored records it accepts (a SQL92 filter), read
                and tested one by one; the next offset moves past the ones it refused.
            for_consumer: a read for a consumer: only records below :attr:`visible_end` (the
                rest is answered as not there yet, OFFSET_OVERFLOW_ONE, the offset unchanged).
                The broker's own readers (recovery, timers, dedup) read everything.
        """
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            self._get_miss += 1
            status = (
                GetMessageStatus.NO_MESSAGE_IN_QUEUE
                if valid_destination(topic, queue_id)
                else GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
            )
            return GetMessageResult(status, [], 0, 0, 0)
        min_o, max_o = cq.min_offset, cq.max_offset
        visible = self.visible_end
        end = max_o if visible is None or not for_consumer else self._visible_max(cq, visible)
        if max_o == 0:
            status, next_offset = GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0
        elif offset < min_o:
            status, next_offset = GetMessageStatus.OFFSET_TOO_SMALL, min_o
        elif offset == end or end < offset <= max_o:
            # past the end, or in the part not yet confirmed: wait for it, offset unchanged
            status, next_offset = GetMessageStatus.OFFSET_OVERFLOW_ONE, offset
        elif offset > max_o:
            status, next_offset = GetMessageStatus.OFFSET_OVERFLOW_BADLY, max_o
        else:
            return self._read_queue(
                cq, offset, max_msgs, tag_codes, max_bytes, joined, message_filter, end
            )
        self._get_miss += 1
        return GetMessageResult(status, [], next_offset, min_o, end)

    @staticmethod
    def _visible_max(cq: ConsumeQueue, visible_end: int) -> int:
        """The queue offset past the last entry whose record ends at or below ``visible_end``
        (entries of a queue are in commit-log order: a binary search over the tail)."""
        lo, hi = cq.min_offset, cq.max_offset

        def visible(idx: int) -> bool:
            entry = cq.read(idx, 1)
            if not entry:
                return True  # outside the files: nothing to hold back
            phy, size, _tags = CQ_ENTRY.unpack_from(entry)
            return bool(size >= HOLE_SIZE or phy + size <= visible_end)

        if hi <= lo or visible(hi - 1):
            return hi
        return first_false(lo, hi, visible)

    # One scan of the consume queue, the hot path of every read: kept whole like the append.
    def _read_queue(
        self,
        cq: ConsumeQueue,
        offset: int,
        max_msgs: int,
        tag_codes: frozenset[int] | None,
        max_bytes: int,
        joined: bool = False,
        message_filter: Callable[[bytes], bool] | None = None,
        end: int | None = None,
    ) -> GetMessageResult:
        cl = self._commit_log
        cl_min = cl.min_offset
        max_o = cq.max_offset if end is None else end
        limit = min(max_o, offset + max(MAX_FILTER_SCAN, max_msgs))
        messages: list[bytes] = []
        #: joined: the records to read (read together at the end).
        wanted: list[tuple[int, int]] = []
        total = 0
        found_null = False
        idx = offset
        full = False
        while idx < limit:  # (not `while not full and ...`: mypyc mis-compiles that loop)
            chunk = cq.read(idx, limit - idx)
            if not chunk:  # outside the queue's files: nothing there
                found_null = True
                idx += 1
                continue
            for phy, size, tags in CQ_ENTRY.iter_unpack(chunk):
                if len(messages) + len(wanted) >= max_msgs:
                    full = True
                    break
                if size >= HOLE_SIZE or 0 <= phy < cl_min:  # filler, hole, or deleted
                    found_null = True
                    idx += 1
                    continue
                if (messages or wanted) and total + size > max_bytes:
                    full = True
                    break
                idx += 1
                if tag_codes is not None and tags not in tag_codes:
                    continue
                if joined and message_filter is None:
                    wanted.append((phy, size))
                    total += size
                    continue
                payload = cl.read_payload(phy, size)
                if payload is None:
                    fixed = self._repair_entry(cq, idx - 1)
                    if fixed is not None:
                        phy, size = fixed
                        payload = cl.read_payload(phy, size)
                if payload is None:
                    found_null = True
                    self._log_read_failed(cq, idx - 1, phy, size)
                    continue
                if message_filter is not None and not message_filter(payload):
                    continue
                messages.append(payload)
                total += size
            if full:
                break
        body = b""
        count = len(messages)
        if joined and messages:  # filtered: read one by one, joined here
            body, messages = b"".join(messages), []
        if wanted:
            read = cl.read_payloads(wanted)
            if read is None:
                # A record that cannot be read (damaged on disk) is left out and the read goes
                # on past it: read one by one, as a separate read does (and logs).
                separate = self._read_queue(cq, offset, max_msgs, tag_codes, max_bytes, end=max_o)
                separate.joined = b"".join(separate.messages)
                separate.messages = []
                return separate
            body, count = read, len(wanted)
        if count:
            status = GetMessageStatus.FOUND
            self._get_found += 1
        else:
            status = (
                GetMessageStatus.OFFSET_FOUND_NULL
                if found_null
                else GetMessageStatus.NO_MATCHED_MESSAGE
            )
            self._get_miss += 1
        return GetMessageResult(status, messages, idx, cq.min_offset, max_o, body, count)

    def _repair_entry(self, cq: ConsumeQueue, index: int) -> tuple[int, int] | None:
        """The entry at ``index`` names no intact record: a damaged entry (the consume queue
        is derived from the commit log) or a damaged record.  Look for the message between its
        neighbours' records; when found, rewrite the entry (logged) and return ``(offset,
        size)``; None when the record itself is gone."""
        cl = self._commit_log
        start, end = cl.min_offset, cl.write_pos
        before = cq.entry(index - 1) if index > cq.min_offset else None
        if before is not None and before[1] < HOLE_SIZE and cl.read_payload(before[0], before[1]):
            start = before[0] + before[1]
        after = cq.entry(index + 1) if index + 1 < cq.max_offset else None
        if after is not None and after[1] < HOLE_SIZE and cl.read_payload(after[0], after[1]):
            end = after[0]
        topic, qid = cq.topic, cq.queue_id
        hit = cl.find_record(
            start,
            end,
            lambda i: i.queue_offset == index and i.queue_id == qid and i.topic == topic,
        )
        if hit is None:
            return None
        offset, size, info = hit
        if cq.repair(index, offset, size, info.tags_code):
            queue_log((topic, qid)).warning(
                "consume_queue_entry_repaired", queue_offset=index, commit_log_offset=offset
            )
        return offset, size

    def _log_read_failed(self, cq: ConsumeQueue, queue_offset: int, phy: int, size: int) -> None:
        seg = self._commit_log._segment_for(phy)
        queue_log((cq.topic, cq.queue_id)).error(
            "message_read_failed",
            queue_offset=queue_offset,
            commit_log_offset=phy,
            size=size,
            file=seg.path if seg is not None else "(no segment holds it)",
        )

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """The queue's next offset to be written (0 for a queue never written)."""
        cq = self._cqs.get((topic, queue_id))
        return cq.max_offset if cq is not None else 0

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """The queue's first offset whose message is still stored."""
        cq = self._cqs.get((topic, queue_id))
        return cq.min_offset if cq is not None else 0

    def get_offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose message was stored at or after ``timestamp_ms``; the
        max offset when there is none.  Assumes store timestamps grow with offsets (they do
        unless the clock jumps back)."""
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            return 0
        lo, hi = cq.min_offset, cq.max_offset
        cl = self._commit_log
        while lo < hi:
            mid = (lo + hi) // 2
            e = cq.entry(mid)
            ts = cl.read_store_timestamp(e[0]) if e is not None else None
            if ts is not None and ts >= timestamp_ms:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def read_message_bytes(self, commit_log_offset: int) -> bytes:
        """The raw stored message at a commit-log offset.

        Raises:
            QueryNotFoundError: no intact message starts there.
        """
        payload = self._commit_log.read_payload(commit_log_offset)
        if payload is None:
            raise QueryNotFoundError(f"no message at commit-log offset {commit_log_offset}")
        return payload

    def lookup_message(self, commit_log_offset: int) -> MessageExt:
        """The message at a commit-log offset (an offsetMsgId's offset), decoded.

        Raises:
            QueryNotFoundError: no intact message starts there.
        """
        payload = self.read_message_bytes(commit_log_offset)
        try:
            return decode_message(payload)
        except ProtocolError:
            raise QueryNotFoundError(
                f"no message at commit-log offset {commit_log_offset}"
            ) from None

    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int | None:
        """The store timestamp (ms) of the message at ``offset`` of a queue, or None when the
        queue holds no such offset."""
        cq = self._cqs.get((topic, queue_id))
        e = cq.entry(offset) if cq is not None else None
        return self._commit_log.read_store_timestamp(e[0]) if e is not None else None
