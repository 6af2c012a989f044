"""Consumer offsets committed inside a transaction (consume-transform-produce, exactly once).

A transaction may hold one half whose real topic is ``TXMQ_SYS_TXN_OFFSETS``
(:mod:`txmq.protocol.txn_offsets`): a consumer group, the generation its consumer rebalanced
under, the consumer's client id and offsets.  Here:

* :meth:`TxnOffsetsLedger.fenced_reason` tells, before a commit is appended, whether the
  consumer is still the owner it was (the group's generation unchanged, the client a live
  member) and the group's committed offset of each queue is still the one the consumer started
  from; the service rolls the transaction back instead when it is not.  The check and the
  append are one synchronous step on the broker's loop, so no membership change falls between.
* :meth:`TxnOffsetsLedger.catch_up` applies committed offsets records (the committed copies in
  queue 0 of the offsets topic) that the offset table has not applied yet, and records how far
  it got in the same table, atomically with the offsets.  It runs after every decision append
  and at start: the offset table is written to disk periodically, so after a crash the records
  committed since its last write are applied again from the commit log.
"""

from __future__ import annotations

import structlog

from txmq.protocol.errors import ProtocolError, QueryNotFoundError
from txmq.protocol.message import MessageSysFlag, decode_message
from txmq.protocol.txn_offsets import TXN_OFFSETS_TOPIC, TxnOffsets

from ..clients import ClientManager
from ..store import ConsumerOffsetManager, GetMessageStatus, MessageStore
from .state import TxRecord

log = structlog.get_logger(__name__)


class TxnOffsetsLedger:
    topic = TXN_OFFSETS_TOPIC

    def __init__(
        self, store: MessageStore, offsets: ConsumerOffsetManager, clients: ClientManager
    ) -> None:
        self.store = store
        self.offsets = offsets
        self.clients = clients
        #: Committed offsets records applied since start (live and replayed).
        self.applied = 0

    def has_offsets(self, rec: TxRecord) -> bool:
        return any(h.real_topic == self.topic for h in rec.halves)

    def fenced_reason(self, rec: TxRecord) -> str | None:
        """None when every offsets half of ``rec`` may be committed; else why not."""
        for h in rec.halves:
            if h.real_topic != self.topic:
                continue
            try:
                body = self.store.lookup_message(h.commit_log_offset).body
                doc = TxnOffsets.decode(body)
            except (ProtocolError, QueryNotFoundError, KeyError) as exc:
                return f"the offsets half of transaction {rec.transaction_id} is unreadable ({exc})"
            reason = self.clients.fenced_reason(doc.group, doc.generation, doc.client_id)
            if reason is not None:
                return reason
            for q in doc.offsets:
                if q.expect < 0:
                    continue
                now = self.offsets.query(doc.group, q.topic, q.queue_id)
                if now != q.expect:
                    return (
                        f"the committed offset of {q.topic}:{q.queue_id} is {now}, not "
                        f"{q.expect} (another attempt committed it)"
                    )
        return None

    def catch_up(self) -> int:
        """Apply the committed offsets records not applied yet; returns how many."""
        store, topic = self.store, self.topic
        end = store.get_max_offset_in_queue(topic, 0)
        offset = self.offsets.txn_applied(topic)
        if offset >= end:
            return 0
        offset = max(offset, store.get_min_offset_in_queue(topic, 0))
        n = 0
        while offset < end:
            r = store.get_messages(topic, 0, offset, 256)
            if r.status is not GetMessageStatus.FOUND:
                if r.next_begin_offset > offset:
                    offset = r.next_begin_offset
                    continue
                break
            for raw in r.messages:
                m = decode_message(raw)
                offset = m.queue_offset + 1
                entries: list[tuple[str, int, int]] = []
                group = ""
                committed = (
                    MessageSysFlag.transaction_value(m.sys_flag)
                    == MessageSysFlag.TRANSACTION_COMMIT_TYPE
                )
                if committed:
                    try:
                        doc = TxnOffsets.decode(m.body)
                    except ProtocolError as exc:
                        log.warning(
                            "txn_offsets_unreadable", queue_offset=m.queue_offset, error=str(exc)
                        )
                    else:
                        group = doc.group
                        entries = [(q.topic, q.queue_id, q.offset) for q in doc.offsets]
                        n += 1
                self.offsets.apply_txn(group, entries, topic, offset)
            if r.next_begin_offset > offset:
                offset = r.next_begin_offset
        self.applied += n
        return n
