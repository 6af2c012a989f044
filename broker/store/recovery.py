"""Recovery of the store at start (steps 1-6 in :mod:`.message_store`'s docstring), and the
dispatcher that also puts a follower's replicated records into their consume queues."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from txmq.protocol.message import MessageSysFlag

from .checkpoint import StoreCheckpoint
from .commit_log import RECORD_HEADER_SIZE, CommitLog, DispatchInfo, parse_dispatch_info
from .consume_queue import CQ_ENTRY, FILLER_SIZE, ConsumeQueue

log = structlog.get_logger(__name__)

#: RocketMQ's topic name rule (TopicValidator); topics are directory names here too.
VALID_TOPIC = re.compile(r"^[%|a-zA-Z0-9_-]+$")
MAX_TOPIC_BYTES = 255
#: The transaction types that get no consume-queue entry (halves and rollbacks).
TX_NO_DISPATCH = (
    MessageSysFlag.TRANSACTION_PREPARED_TYPE,
    MessageSysFlag.TRANSACTION_ROLLBACK_TYPE,
)


@dataclass(frozen=True)
class RecoveryReport:
    """What :meth:`MessageStore.load` found and did.

    Attributes:
        max_phy_offset: end of the commit log after recovery.
        truncated_bytes: non-zero bytes cut after the last valid record (a torn tail).
        redispatched: consume-queue entries written by the recovery scan.
        consume_queues: number of consume queues.
        min_phy_offset: start of the commit log.
        checkpoint_offset: the checkpoint's commit-log offset (-1: none was readable).
        scan_start_offset: where the recovery scan started.
        deleted_segments: commit-log segments removed because they lay after the cut.
        damaged_records: bad records found (and skipped, not cut) below the checkpoint.
        rebuilt_queues: consume queues that had lost entries below the checkpoint.
        elapsed_ms: how long recovery took.
    """

    max_phy_offset: int
    truncated_bytes: int
    redispatched: int
    consume_queues: int
    min_phy_offset: int = 0
    checkpoint_offset: int = -1
    scan_start_offset: int = 0
    deleted_segments: int = 0
    damaged_records: int = 0
    rebuilt_queues: int = 0
    elapsed_ms: float = 0.0


def queue_log(key: tuple[str, int]) -> Any:
    """The log of one consume queue's events (topic and queue id on every line)."""
    return log.bind(topic=key[0], queue_id=key[1])


def fill_holes(cq: ConsumeQueue, key: tuple[str, int], to_offset: int, phy: int) -> None:
    """Fill the entries of messages lost from ``key``'s queue up to ``to_offset`` (logged as an
    error: a consumer skips them)."""
    queue_log(key).error(
        "consume_queue_holes_filled", from_offset=cq.max_offset, to_offset=to_offset
    )
    cq.fill_holes(to_offset, phy)


def valid_destination(topic: str, queue_id: int) -> bool:
    return (
        0 <= queue_id <= 0x7FFFFFFF
        and len(topic) <= MAX_TOPIC_BYTES
        and VALID_TOPIC.match(topic) is not None
    )


class RecoveryDispatcher:
    """The recovery scan's ``on_record``: puts each dispatchable message into its consume
    queue unless it is there already (see the module docstring, step 4)."""

    def __init__(
        self,
        cqs: dict[tuple[str, int], ConsumeQueue],
        new_cq: Callable[[tuple[str, int]], ConsumeQueue],
        logic: int,
        cl_min: int,
    ) -> None:
        self._cqs = cqs
        self._new_cq = new_cq
        self.logic = logic
        self.cl_min = cl_min
        self.redispatched = 0

    def __call__(self, offset: int, size: int, info: DispatchInfo) -> None:
        if info.sys_flag & MessageSysFlag.TRANSACTION_MASK in TX_NO_DISPATCH:
            return
        key = (info.topic, info.queue_id)
        cq = self._cqs.get(key)
        if cq is None:
            if not valid_destination(*key):
                log.error(
                    "message_not_dispatched",
                    offset=offset,
                    topic=info.topic,
                    queue_id=info.queue_id,
                    reason="invalid_destination",
                )
                return
            cq = self._new_cq(key)
        qo = info.queue_offset
        if qo < cq.max_offset:
            # Indexed before the crash.  Below the checkpoint (a queue being rebuilt) the entry
            # is checked too: a damaged one would hide the message.
            if offset < self.logic and cq.repair(qo, offset, size, info.tags_code):
                queue_log(key).warning(
                    "consume_queue_entry_repaired", queue_offset=qo, commit_log_offset=offset
                )
            return
        if qo > cq.max_offset:
            last = cq.last_entry()
            if last is None or last[1] == FILLER_SIZE or last[0] < self.cl_min:
                # The queue's older messages went with deleted segments: it restarts here.
                queue_log(key).warning(
                    "consume_queue_restarted",
                    from_offset=cq.max_offset,
                    to_offset=qo,
                    reason="older_messages_deleted",
                )
                cq.reset_to(qo)
            else:
                # Messages in the middle were lost (a damaged record was skipped).
                fill_holes(cq, key, qo, offset)
        cq.append(offset, size, info.tags_code)
        self.redispatched += 1

    def dispatch_many(self, records: list[tuple[int, int, DispatchInfo]]) -> None:
        """As a call per record, the entries that go on where their queue ends (a follower's
        replicated chunk) written in one write per queue instead of one each."""
        cqs = self._cqs
        runs: dict[tuple[str, int], tuple[ConsumeQueue, list[bytes]]] = {}
        for offset, size, info in records:
            if info.sys_flag & MessageSysFlag.TRANSACTION_MASK in TX_NO_DISPATCH:
                continue
            run = runs.get(key := (info.topic, info.queue_id))
            cq = run[0] if run is not None else cqs.get(key)
            if cq is not None and info.queue_offset == cq.max_offset + (len(run[1]) if run else 0):
                (run or runs.setdefault(key, (cq, [])))[1].append(
                    CQ_ENTRY.pack(offset, size, info.tags_code)
                )
                continue
            self._write_runs(runs)  # anything else: in order, the careful way
            self(offset, size, info)
        self._write_runs(runs)

    def _write_runs(self, runs: dict[tuple[str, int], tuple[ConsumeQueue, list[bytes]]]) -> None:
        for cq, entries in runs.values():
            cq.append_many(b"".join(entries))
            self.redispatched += len(entries)
        runs.clear()


def recover(
    cl: CommitLog,
    cqs: dict[tuple[str, int], ConsumeQueue],
    new_cq: Callable[[tuple[str, int]], ConsumeQueue],
    cq_dir: str,
    checkpoint_path: str,
    flush_queues: Callable[[], None],
    root: str,
    t0: float,
) -> RecoveryReport:
    """Steps 1-6 of the store's recovery (see :mod:`.message_store`): the commit log and the
    consume queues back in step, durable, and what was found."""
    cl.load()
    cp = StoreCheckpoint.read(checkpoint_path)
    cl_min = cl.min_offset
    if cp is None:
        logic = cl_min
        if cl.segments:
            log.warning(
                "checkpoint_not_found",
                path=checkpoint_path,
                action="rebuilding consume queues from the whole commit log",
            )
    else:
        logic = min(max(cp.logic_offset, cl_min), cl.write_pos)

    load_consume_queues(cq_dir, new_cq, logic)
    scan_start = logic
    incomplete: dict[tuple[str, int], int] = {}
    for key, expected in (cp.queues if cp is not None else {}).items():
        if not valid_destination(*key):
            continue
        cq = cqs.get(key) or new_cq(key)
        if cq.max_offset < expected:
            resume = resume_point(cl, cq, cl_min)
            queue_log(key).warning(
                "consume_queue_found_incomplete",
                entries=cq.max_offset,
                expected=expected,
                rebuild_from=resume,
            )
            incomplete[key] = expected
            scan_start = min(scan_start, resume)

    dispatcher = RecoveryDispatcher(cqs, new_cq, logic, cl_min)
    rec = cl.recover(scan_start, logic, dispatcher)
    end = rec.end  # never below the checkpoint: only the torn tail is cut
    for key, expected in incomplete.items():
        # The queue's remaining messages are gone from the commit log; keep the offsets
        # consumers know (offsets are never reused).
        cq = cqs[key]
        if cq.max_offset < expected:
            last = cq.last_entry()
            if last is None or last[1] == FILLER_SIZE or last[0] < cl_min:
                cq.reset_to(expected)  # all of them went with deleted segments
            else:
                fill_holes(cq, key, expected, end)
    for cq in cqs.values():
        cq.correct_min_offset(cl_min)

    # Make what recovery found and changed durable before serving: the commit log from the
    # scan start (a killed process leaves written but unsynced pages), then the queues and
    # a new checkpoint.
    cl.flush()
    flush_queues()
    report = RecoveryReport(
        max_phy_offset=end,
        truncated_bytes=rec.truncated_bytes,
        redispatched=dispatcher.redispatched,
        consume_queues=len(cqs),
        min_phy_offset=cl_min,
        checkpoint_offset=cp.logic_offset if cp is not None else -1,
        scan_start_offset=scan_start,
        deleted_segments=rec.deleted_segments,
        damaged_records=rec.damaged_records,
        rebuilt_queues=len(incomplete),
        elapsed_ms=round((time.monotonic() - t0) * 1000, 3),
    )
    log.info("store_recovered", path=root, **dataclasses.asdict(report))
    return report


def load_consume_queues(
    cq_dir: str, new_cq: Callable[[tuple[str, int]], ConsumeQueue], logic: int
) -> None:
    """Open every ``consumequeue/<topic>/<queueId>`` folder, keeping entries below
    ``logic``."""
    for topic in sorted(os.listdir(cq_dir)):
        topic_dir = os.path.join(cq_dir, topic)
        if not os.path.isdir(topic_dir) or not VALID_TOPIC.match(topic):
            log.warning("unknown_file_ignored", path=topic_dir)
            continue
        for qid_name in sorted(os.listdir(topic_dir)):
            path = os.path.join(topic_dir, qid_name)
            if (
                not (qid_name.isascii() and qid_name.isdigit())
                or not os.path.isdir(path)
                or not valid_destination(topic, int(qid_name))
            ):
                log.warning("unknown_file_ignored", path=path)
                continue
            new_cq((topic, int(qid_name))).load(logic)


def resume_point(cl: CommitLog, cq: ConsumeQueue, cl_min: int) -> int:
    """Where a scan must start to rebuild ``cq``: just after the message of its last
    entry, if that entry really names that message (a damaged entry must not send the
    scan into the middle of a record), else the commit-log start."""
    last = cq.last_entry()
    if last is None or last[1] == FILLER_SIZE or last[0] < cl_min:
        return cl_min
    payload = cl.read_payload(last[0], last[1])
    if payload is not None:
        try:
            info = parse_dispatch_info(payload)
        except ValueError:
            pass
        else:
            if (info.topic, info.queue_id, info.queue_offset) == (
                cq.topic,
                cq.queue_id,
                cq.max_offset - 1,
            ):
                return last[0] + RECORD_HEADER_SIZE + last[1]
    return cl_min
