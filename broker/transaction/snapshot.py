"""Snapshots of the transaction table, so a restart reads the snapshot plus the tail of the
half and op queues instead of both queues from their start.

A snapshot holds every transaction the machine remembers (pending ones with their check
counts, decided ones still inside their idempotency window), the batch decisions, and the
positions it covers: the next offsets of the half queue and the op queue, and the commit-log
offset they end at.  It is written only once the commit log is flushed past that offset, so
it never claims more than a crash leaves on disk; a snapshot that still reaches past the
recovered commit log (a lost disk tail) is ignored and the queues are replayed in full.

Taking a snapshot (:func:`take`) runs on the event loop and copies only what can still change
(pending records are copied; decided records never change again); encoding and writing run on
a worker thread.

File: ``<store>/transaction/snapshot.msgpack``: the 4 bytes ``TXS1``, the CRC-32 (``zlib.crc32``,
4 bytes big-endian) of everything after these 8 bytes, then a msgpack map.  A snapshot written
before the checksum is the map alone: a msgpack map starts with a map header (0x80-0x8f, 0xde,
0xdf), never with ``T`` (0x54), so the first byte tells the two apart; the old form is read as
before.  A checksum that does not match makes the snapshot damaged (:class:`SnapshotError`):
it is set aside and the table rebuilt from the half and op queues.  The map::

    {"v": 1, "clog": int, "tip": [clOffset, size, crc, storeTs],
     "halfFrom": int, "opFrom": int,
     "records": [[txid, group, state, batchKey, checkTimes, lastCheckMs, decidedMs, decidedBy,
                  decisionEndOffset, remark, [[clOffset, qOffset, topic, queueId, storeTs,
                                               uniqKey, offsetMsgId, immunityMs], ...]], ...],
     "batches": [[group, batchKey, decidedMs, [committed...], [rolledBack...]
                  (, [pipeline, start, end])], ...],
     "pipelines": [[group, pipeline, end, batchKey], ...],   (only when there are some)
     "forgotten": {state: count, ...}}   (decided transactions pruned from the table; optional)

A batch row has the input range its pipeline consumed as a sixth element when the decision
recorded one; ``pipelines`` (optional: older snapshots have none) holds where each pipeline
is, which outlives the batch decisions.

``tip`` identifies the newest half or op record the snapshot covers: its commit-log offset,
its payload size, the CRC its record header stores and its store timestamp.  It is absent when
the snapshot covers no such record (an empty table) and in snapshots written before it was
recorded: those are used as before, unless they reach past the recovered commit log, which
sets them aside for good (see :mod:`.persistence`).  A snapshot is only used on the
log it was taken from: when the commit log was cut back below that record and written again
(a replica cutting its divergent tail, a torn tail cut at start followed by new appends), the
offset holds another record or none, and the snapshot is set aside (:mod:`.persistence`).
Records after the tip and before ``clog`` hold no half or op record, so a cut among them
changes nothing the snapshot stands for: the queues are replayed from ``halfFrom`` and
``opFrom`` whatever follows.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import msgpack

from .machine import TransactionStateMachine
from .state import HalfRef, TxRecord, TxState

SNAPSHOT_VERSION = 1
#: How a snapshot with a checksum starts; the CRC-32 of the rest follows (big-endian).
CHECKSUM_MAGIC = b"TXS1"
_CRC = struct.Struct(">I")
#: Bytes before the msgpack map in a snapshot with a checksum.
PREFIX_SIZE = len(CHECKSUM_MAGIC) + _CRC.size


class SnapshotError(ValueError):
    """A snapshot file that cannot be used (the queues are then replayed in full)."""


@dataclass
class Snapshot:
    clog_offset: int
    half_from: int
    op_from: int
    records: list[list[Any]]
    batches: list[list[Any]]
    pipelines: list[list[Any]] = field(default_factory=list)
    #: The newest half or op record the snapshot covers, ``(commit-log offset, size, CRC,
    #: store timestamp)``: the snapshot is used only while the commit log holds exactly that
    #: record there (None: it covers none, or it was written before tips were recorded).
    tip: tuple[int, int, int, int] | None = None
    #: Decided transactions the machine has forgotten, by state (its ``forgotten``).
    forgotten: dict[str, int] = field(default_factory=dict)


def _record_row(r: TxRecord) -> list[Any]:
    """A record's row; a two-phase one has a twelfth element, ``1`` (rows without it, from
    before, are not two-phase)."""
    row = [
        r.transaction_id,
        r.producer_group,
        r.state.value,
        r.batch_key,
        r.check_times,
        r.last_check_ms,
        r.decided_ms,
        r.decided_by,
        r.decision_end_offset,
        r.remark,
        [
            [
                h.commit_log_offset,
                h.queue_offset,
                h.real_topic,
                h.real_queue_id,
                h.store_timestamp,
                h.uniq_key,
                h.offset_msg_id,
                h.immunity_ms,
            ]
            for h in r.halves
        ],
    ]
    if r.two_phase:
        row.append(1)
    return row


def take(
    m: TransactionStateMachine,
    clog_offset: int,
    half_from: int,
    op_from: int,
    tip: tuple[int, int, int, int] | None = None,
) -> Snapshot:
    """What the table holds now (on the event loop: pending records are copied here);
    ``tip``: the newest half or op record it covers (see :attr:`Snapshot.tip`)."""
    records: list[Any] = []
    for r in m.records.values():
        # Decided records never change again: the row is built on the writer's thread.
        records.append(r if r.state.decided else _record_row(r))
    batch_ts = dict((key, ts) for ts, key in m._decided_batches)
    positions = m.batch_positions
    batches = [
        [g, bk, batch_ts.get((g, bk), 0), list(d["committed"]), list(d["rolledBack"])]
        + ([list(positions[(g, bk)])] if (g, bk) in positions else [])
        for (g, bk), d in m.batches.items()
    ]
    pipelines = [[g, p, end, bk] for (g, p), (end, bk) in m.pipelines.items()]
    return Snapshot(
        clog_offset, half_from, op_from, records, batches, pipelines, tip, dict(m.forgotten)
    )


def encode(s: Snapshot) -> bytes:
    """The file's bytes (on a worker thread): the msgpack map above, packed part by part so
    that each decided record's row is packed once and reused by later snapshots (a table
    holding a few minutes of Spark batches has millions of halves)."""
    packer = msgpack.Packer(use_bin_type=True)
    pack = packer.pack
    parts = [
        packer.pack_map_header(6 + bool(s.pipelines) + (s.tip is not None) + bool(s.forgotten)),
        pack("v"),
        pack(SNAPSHOT_VERSION),
        pack("clog"),
        pack(s.clog_offset),
        *((pack("tip"), pack(list(s.tip))) if s.tip is not None else ()),
        pack("halfFrom"),
        pack(s.half_from),
        pack("opFrom"),
        pack(s.op_from),
        pack("records"),
        packer.pack_array_header(len(s.records)),
    ]
    for r in s.records:
        if isinstance(r, list):
            parts.append(pack(r))
            continue
        cached = r.snapshot_row
        if cached is None or cached[0] != len(r.halves):
            cached = r.snapshot_row = (len(r.halves), pack(_record_row(r)))
        parts.append(cached[1])
    parts += (pack("batches"), pack(s.batches))
    if s.pipelines:  # only when a batch decision recorded a pipeline position
        parts += (pack("pipelines"), pack(s.pipelines))
    if s.forgotten:
        parts += (pack("forgotten"), pack(s.forgotten))
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    return b"".join([CHECKSUM_MAGIC, _CRC.pack(crc), *parts])


def _map_bytes(data: bytes) -> memoryview:
    """The msgpack map of a snapshot file, its checksum verified when it has one.

    Raises:
        SnapshotError: the checksum does not match, or the file is too short to hold one.
    """
    view = memoryview(data)
    if not data.startswith(CHECKSUM_MAGIC):
        return view  # written before snapshots had a checksum
    if len(data) < PREFIX_SIZE:
        raise SnapshotError("transaction snapshot cut short in its checksum")
    (stored,) = _CRC.unpack_from(data, len(CHECKSUM_MAGIC))
    actual = zlib.crc32(view[PREFIX_SIZE:])
    if stored != actual:
        raise SnapshotError(
            f"transaction snapshot checksum mismatch (the file says {stored:#010x}, "
            f"its content has {actual:#010x})"
        )
    return view[PREFIX_SIZE:]


def decode(data: bytes) -> Snapshot:
    """Raises :class:`SnapshotError` for anything but a version-1 snapshot (with a checksum
    that matches, or written before checksums)."""
    body = _map_bytes(data)
    try:
        doc = msgpack.unpackb(body, raw=False, strict_map_key=False)
        if not isinstance(doc, dict) or doc.get("v") != SNAPSHOT_VERSION:
            raise SnapshotError("not a version-1 transaction snapshot")
        tip = doc.get("tip")
        return Snapshot(
            int(doc["clog"]),
            int(doc["halfFrom"]),
            int(doc["opFrom"]),
            list(doc["records"]),
            list(doc["batches"]),
            list(doc.get("pipelines", [])),
            None if tip is None else (int(tip[0]), int(tip[1]), int(tip[2]), int(tip[3])),
            {str(k): int(v) for k, v in dict(doc.get("forgotten", {})).items()},
        )
    except SnapshotError:
        raise
    except Exception as exc:  # msgpack and the conversions raise many types on garbage
        raise SnapshotError(f"unreadable transaction snapshot: {exc!r}") from None


def peek_clog(path: str) -> int:
    """The commit-log offset the snapshot file at ``path`` covers, read from the head of the
    file (``clog`` comes before the records).

    Raises:
        OSError: the file cannot be read (FileNotFoundError: there is none).
        SnapshotError: it is not a version-1 snapshot.
    """
    with open(path, "rb") as fh:
        if fh.read(len(CHECKSUM_MAGIC)) == CHECKSUM_MAGIC:
            fh.seek(PREFIX_SIZE)  # the checksum is verified when the snapshot is read
        else:
            fh.seek(0)
        try:
            unpacker = msgpack.Unpacker(fh, raw=False, strict_map_key=False)
            for _ in range(unpacker.read_map_header()):
                key = unpacker.unpack()
                if key == "v" and unpacker.unpack() != SNAPSHOT_VERSION:
                    break
                if key == "clog":
                    return int(unpacker.unpack())
                if key != "v":
                    unpacker.skip()
        except Exception as exc:  # msgpack raises many types on garbage
            raise SnapshotError(f"unreadable transaction snapshot: {exc!r}") from None
    raise SnapshotError("not a version-1 transaction snapshot")


def restore(m: TransactionStateMachine, s: Snapshot) -> None:
    """Load a snapshot into an empty machine (decisions keep their order for pruning).

    Every row is converted before the machine is touched, so a damaged snapshot raises
    :class:`SnapshotError` and leaves the machine empty (recovery then replays the queues)."""
    try:
        rows = [_restored(row) for row in s.records]
        batches = sorted(
            (
                (str(g), str(bk), int(ts), list(c), list(rb), _position(rest))
                for g, bk, ts, c, rb, *rest in s.batches
            ),
            key=lambda b: b[2],
        )
        pipelines = [((str(g), str(p)), (str(end), str(bk))) for g, p, end, bk in s.pipelines]
    except Exception as exc:  # a row of the wrong shape, a state name that is not one, ...
        raise SnapshotError(f"unreadable transaction snapshot record: {exc!r}") from None
    decided: list[tuple[int, str]] = []
    decided_two_phase: list[tuple[int, str]] = []
    for rec, bk in rows:
        for half in rec.halves:
            m.by_half_offset[half.commit_log_offset] = rec.transaction_id
        m.records[rec.transaction_id] = rec
        if rec.state is TxState.PENDING:
            m.pending[rec.transaction_id] = rec
        elif rec.state.decided:
            (decided_two_phase if rec.two_phase else decided).append(
                (rec.decided_ms, rec.transaction_id)
            )
        if bk is not None:
            m.batch_members.setdefault((rec.producer_group, str(bk)), set()).add(rec.transaction_id)
    decided.sort()
    m._decided.extend(decided)
    decided_two_phase.sort()
    m._decided_two_phase.extend(decided_two_phase)
    for g, bk, ts, committed, rolled_back, position in batches:
        key = (g, bk)
        m.batches[key] = {"committed": committed, "rolledBack": rolled_back}
        m._decided_batches.append((ts, key))
        if position is not None:
            m.record_position(key, position)
    m.pipelines.update(pipelines)
    m.forgotten.update(s.forgotten)


def _position(rest: list[Any]) -> tuple[str, str, str] | None:
    if not rest:
        return None
    pipeline, start, end = rest[0]
    return (str(pipeline), str(start), str(end))


def _restored(row: Any) -> tuple[TxRecord, Any]:
    """A snapshot row as a record (and its batch key); raises on anything malformed."""
    (txid, group, state, bk, times, last, dms, dby, dend, remark, halves, *extra) = row
    rec = TxRecord(
        str(txid),
        str(group),
        state=TxState(state),
        batch_key=bk,
        check_times=int(times),
        last_check_ms=int(last),
        decided_ms=int(dms),
        decided_by=str(dby),
        decision_end_offset=int(dend),
        remark=str(remark),
        two_phase=bool(extra and extra[0]),
    )
    for h in halves:
        rec.halves.append(
            HalfRef(
                int(h[0]),
                int(h[1]),
                str(h[2]),
                int(h[3]),
                int(h[4]),
                str(h[5]),
                str(h[6]),
                None if h[7] is None else int(h[7]),
            )
        )
    return rec, bk
