"""The write side of the message store: messages checked, encoded and appended to the commit
log as one contiguous write, with their consume-queue entries."""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from txmq.protocol.errors import MessageIllegalError
from txmq.protocol.message import FIXED_SIZE, STORED_HEAD, MessageExt, MessageSysFlag

from .commit_log import RECORD_HEADER, RECORD_HEADER_SIZE, RECORD_MAGIC
from .config import StoreConfig
from .consume_queue import CQ_ENTRY, ConsumeQueue
from .disk import DiskGuard
from .errors import StoreIOError
from .reads import QueueReads
from .recovery import TX_NO_DISPATCH, valid_destination
from .results import AppendResult, EncodedMessage, PutMessageResult, _put_result, encode_for_store

_body_of = itemgetter(4)
_tail_of = itemgetter(5)


class Appends(QueueReads):
    """The appends of :class:`~.message_store.MessageStore` (a part of it: the state is the
    store's).  The parts stand in one line, reads <- appends <- store, not side by side:
    mypyc compiles single inheritance only (the store is on the compiled request path)."""

    config: StoreConfig
    store_host: tuple[str, int]
    disk: DiskGuard
    _clock: Callable[[], float]
    _lock: threading.Lock
    _host_bytes: bytes
    _msg_id_prefix: str
    _put_count: int
    _put_bytes: int

    def _new_cq(self, key: tuple[str, int]) -> ConsumeQueue:
        """The consume queue ``key`` (topic, queue id), made and opened: the store's."""
        raise NotImplementedError

    def _check_writable(self) -> None:
        """Raise ServiceNotAvailableError unless the store takes writes: the store's."""
        raise NotImplementedError

    def put_message(self, msg: MessageExt) -> PutMessageResult:
        """Append one message; see :meth:`put_messages`."""
        return self.put_messages([msg])[0]

    def put_messages(self, msgs: list[MessageExt]) -> list[PutMessageResult]:
        """Append messages as one contiguous write, all or none.

        The store sets ``store_timestamp``, ``store_host``, ``commit_log_offset``,
        ``queue_offset`` and ``store_size`` on each message object (and in the stored bytes).
        The append is written to the file (visible to readers, survives the death of the
        process) but not yet fsynced: call :meth:`flush` until ``flushed_offset`` reaches the
        results' ``end_offset`` for that.

        Raises:
            MessageIllegalError: a message is larger than ``max_message_size``, has an invalid
                topic or queue id, or the batch does not fit in one commit-log segment; nothing
                is written.
            StoreIOError: the write failed; nothing is visible.
            ServiceNotAvailableError: the store is not open, or writes are refused (the disk is
                full: see :meth:`check_space`).
        """
        self._check_writable()
        if not msgs:
            return []
        max_size = self.config.max_message_size
        # First every check (nothing is reserved or written before all messages pass): the
        # destination, the tail of the stored form (topic and properties), the size.
        records: list[EncodedMessage] = []
        counts: dict[tuple[str, int], int] = {}  # dispatchable messages per consume queue
        valid: set[tuple[str, int]] = set()  # destinations checked already (a batch has few)
        total = 0
        for m in msgs:
            dest = (m.topic, m.queue_id)
            if dest not in valid:
                if not valid_destination(m.topic, m.queue_id):
                    raise MessageIllegalError(
                        f"cannot store a message for topic {m.topic!r} queue {m.queue_id}: "
                        f"invalid topic name or queue id"
                    )
                valid.add(dest)
            r = encode_for_store(m)
            n = FIXED_SIZE + len(r.body) + len(r.tail)
            if n > max_size:
                raise MessageIllegalError(
                    f"message size {n} bytes exceeds the maximum message size of {max_size} bytes"
                )
            total += RECORD_HEADER_SIZE + n
            if m.sys_flag & MessageSysFlag.TRANSACTION_MASK not in TX_NO_DISPATCH:
                counts[dest] = counts.get(dest, 0) + 1
            records.append(r)
        self._check_fits(total, len(msgs))
        placed, now_ms = self._append(records, total, counts)
        results = []
        store_host, prefix = self.store_host, self._msg_id_prefix
        for (phy, n, qo), m, r in zip(placed, msgs, records, strict=True):
            m.store_timestamp = now_ms
            m.store_host = store_host
            m.commit_log_offset = phy
            m.queue_offset = qo
            m.store_size = n
            m.body_crc = r.body_crc
            results.append(
                _put_result(phy, n, qo, now_ms, f"{prefix}{phy:016X}", phy + RECORD_HEADER_SIZE + n)
            )
        return results

    def put_encoded(self, records: list[EncodedMessage], *, one_run: bool = False) -> AppendResult:
        """:meth:`put_messages` of messages already encoded (:func:`encode_for_store`, or built
        field by field the same way): the same checks, the same stored bytes, all or none; no
        message objects and no per-message results, just where each record went.

        ``one_run``: the caller vouches that every record has the first one's topic, queue id
        and sys flag (a batch from one request): checked as a whole, in C, not record by record.

        Raises:
            MessageIllegalError, StoreIOError, ServiceNotAvailableError: as :meth:`put_messages`.
        """
        self._check_writable()
        if not records:
            pos = self._commit_log.write_pos
            return AppendResult([], int(self._clock() * 1000), pos, {}, 0)
        max_size = self.config.max_message_size
        if one_run:
            return self._put_run(records, max_size)
        per_dest: dict[tuple[str, int], int] = {}
        counts: dict[tuple[str, int], int] = {}  # dispatchable records per consume queue
        total = 0
        # Records come in runs to one destination: counted per run, checked once.
        dest = ("", -1)
        run = dispatched = 0
        tx_mask = MessageSysFlag.TRANSACTION_MASK
        for (
            topic,
            queue_id,
            _magic,
            _crc,
            body,
            tail,
            _flag,
            sys_flag,
            _born_ts,
            _born_host,
            _reconsume,
            _prepared,
            _tags,
        ) in records:
            if queue_id != dest[1] or topic != dest[0]:
                if run:
                    per_dest[dest] = per_dest.get(dest, 0) + run
                    if dispatched:
                        counts[dest] = counts.get(dest, 0) + dispatched
                dest = (topic, queue_id)
                run = dispatched = 0
                if dest not in per_dest and not valid_destination(topic, queue_id):
                    raise MessageIllegalError(
                        f"cannot store a message for topic {topic!r} queue {queue_id}: "
                        f"invalid topic name or queue id"
                    )
            run += 1
            n = FIXED_SIZE + len(body) + len(tail)
            if n > max_size:
                raise MessageIllegalError(
                    f"message size {n} bytes exceeds the maximum message size of {max_size} bytes"
                )
            total += RECORD_HEADER_SIZE + n
            if sys_flag & tx_mask not in TX_NO_DISPATCH:
                dispatched += 1
        per_dest[dest] = per_dest.get(dest, 0) + run
        if dispatched:
            counts[dest] = counts.get(dest, 0) + dispatched
        self._check_fits(total, len(records))
        placed, now_ms = self._append(records, total, counts)
        last, size, _qo = placed[-1]
        return AppendResult(
            placed,
            now_ms,
            last + RECORD_HEADER_SIZE + size,
            per_dest,
            total - RECORD_HEADER_SIZE * len(records),
        )

    def _put_run(self, records: list[EncodedMessage], max_size: int) -> AppendResult:
        """:meth:`put_encoded` of records to one destination with one sys flag: the same
        checks and errors (the first record found too large is the one named), made with a
        few passes in C over the bodies and tails."""
        first = records[0]
        topic, queue_id, sys_flag = first[0], first[1], first[7]
        if not valid_destination(topic, queue_id):
            raise MessageIllegalError(
                f"cannot store a message for topic {topic!r} queue {queue_id}: "
                f"invalid topic name or queue id"
            )
        count = len(records)
        body_lens = list(map(len, map(_body_of, records)))
        tail_lens = list(map(len, map(_tail_of, records)))
        if FIXED_SIZE + max(body_lens) + max(tail_lens) > max_size:
            for b, t in zip(body_lens, tail_lens, strict=True):
                n = FIXED_SIZE + b + t
                if n > max_size:
                    raise MessageIllegalError(
                        f"message size {n} bytes exceeds the maximum message size of "
                        f"{max_size} bytes"
                    )
        payload = FIXED_SIZE * count + sum(body_lens) + sum(tail_lens)
        total = payload + RECORD_HEADER_SIZE * count
        dest = (topic, queue_id)
        dispatched = sys_flag & MessageSysFlag.TRANSACTION_MASK not in TX_NO_DISPATCH
        self._check_fits(total, count)
        placed, now_ms = self._append(records, total, {dest: count} if dispatched else {})
        last, size, _qo = placed[-1]
        return AppendResult(
            placed, now_ms, last + RECORD_HEADER_SIZE + size, {dest: count}, payload
        )

    def _check_fits(self, total: int, count: int) -> None:
        segment = self.config.mapped_file_size_commit_log
        if total > segment:
            what = "the message" if count == 1 else f"the batch of {count} messages"
            raise MessageIllegalError(
                f"{what} needs {total} bytes, more than a commit-log segment of "
                f"{segment} bytes holds"
            )

    def _append(
        self,
        records: list[EncodedMessage],
        total: int,
        counts: dict[tuple[str, int], int],
    ) -> tuple[list[tuple[int, int, int]], int]:
        """:meth:`_append_records`; a write the filesystem refuses as read-only turns writes
        off (ServiceNotAvailableError saying so) until it takes writes again."""
        try:
            return self._append_records(records, total, counts)
        except OSError as exc:
            refused = self.disk.refusal(exc)
            if refused is None:
                raise
            raise refused from exc

    # One pass over the records under the lock, the hot path of every append: kept whole so
    # its locals stay locals (split, each part would look them up again).
    def _append_records(
        self,
        records: list[EncodedMessage],
        total: int,
        counts: dict[tuple[str, int], int],
    ) -> tuple[list[tuple[int, int, int]], int]:
        """Write checked records (``total`` bytes with their record headers; ``counts``: how
        many go to each consume queue) as one contiguous append.  Each record is built with its
        final offsets: record header, fixed head, body (not copied here) and tail, joined once
        by the write.  Returns ``(commit-log offset, size, queue offset)`` of each record and
        the store timestamp."""
        parts: list[bytes | bytearray] = []
        placed: list[tuple[int, int, int]] = []
        host = self._host_bytes
        pack_head = STORED_HEAD.pack
        pack_record = RECORD_HEADER.pack
        pack_entry = CQ_ENTRY.pack
        crc32 = zlib.crc32
        no_v6 = ~(MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOST_V6)
        tx_mask = MessageSysFlag.TRANSACTION_MASK
        no_dispatch = TX_NO_DISPATCH
        hsize = RECORD_HEADER_SIZE
        with self._lock:
            now_ms = int(self._clock() * 1000)
            cl = self._commit_log
            phy = cl.reserve(total)
            base = phy
            # per consume queue: [next queue offset, packed entries], and the queue
            queues: dict[tuple[str, int], list[Any]] = {}
            filled: list[tuple[ConsumeQueue, list[bytes]]] = []
            for key, count in counts.items():
                cq = self._cqs.get(key) or self._new_cq(key)
                try:
                    cq.prepare_range(cq.max_offset, count)
                except OSError as exc:
                    raise StoreIOError.wrapping(
                        f"cannot extend consume queue {key[0]}/{key[1]}: {exc}", exc
                    ) from exc
                packed: list[bytes] = []
                queues[key] = [cq.max_offset, packed]
                filled.append((cq, packed))
            slot: list[Any] = []
            slot_topic, slot_qid = "", -1
            for (
                topic,
                queue_id,
                magic,
                crc,
                body,
                tail,
                flag,
                sys_flag,
                born_ts,
                born_host,
                reconsume,
                prepared,
                tags,
            ) in records:
                n = FIXED_SIZE + len(body) + len(tail)
                if sys_flag & tx_mask in no_dispatch:
                    qo = 0
                else:
                    if queue_id != slot_qid or topic != slot_topic:
                        slot = queues[(topic, queue_id)]
                        slot_topic, slot_qid = topic, queue_id
                    qo = slot[0]
                    slot[0] = qo + 1
                    slot[1].append(pack_entry(phy, n, tags))
                head = pack_head(
                    n,
                    magic,
                    crc,
                    queue_id,
                    flag,
                    qo,
                    phy,
                    sys_flag & no_v6,
                    born_ts,
                    born_host,
                    now_ms,
                    host,
                    reconsume,
                    prepared,
                    len(body),
                )
                parts += (
                    pack_record(RECORD_MAGIC, n, crc32(tail, crc32(body, crc32(head)))),
                    head,
                    body,
                    tail,
                )
                placed.append((phy, n, qo))
                phy += hsize + n
            cl.write(base, parts)
            for cq, packed in filled:
                cq.append_many(b"".join(packed))
        self._put_count += len(records)
        self._put_bytes += total
        return placed, now_ms
