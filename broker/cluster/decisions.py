"""The commit points kept in etcd for transactions that span broker groups: a batch's decision
(the first one recorded wins), the consumer offsets such a batch commits (fenced by a
compare-and-swap per queue) and a pipeline's position (its head and the ranges it decided)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import structlog

from txmq.protocol.errors import IllegalOperationError

from ..config import BrokerConfig
from .etcd import EtcdError, EtcdSession
from .view import Keys

log = structlog.get_logger(__name__)

#: Seconds a cross-group batch decision stays in etcd: every group applies it long before.
BATCH_RECORD_TTL = 3600
#: Where pipelines' positions are kept in etcd (outside every cluster's watched prefix).
PIPELINE_ROOT = "/txmq-pipelines/"
#: Compare-and-swap attempts of a pipeline decision whose head moves under it.
PIPELINE_CAS_ATTEMPTS = 5
#: Where the consumer offsets committed by transactions across broker groups are fenced in
#: etcd (outside every cluster's watched prefix): one key per consumer group, broker group,
#: topic and queue, holding the next offset the last such commit moved it to.
TXN_OFFSETS_ROOT = "/txmq-txn-offsets/"


def _position(value: Any) -> tuple[str, str, str]:
    pipeline, start, end = value
    return (str(pipeline), str(start), str(end))


@dataclass(eq=False)
class CommitPoints:
    """The batch decisions and pipeline positions of one broker group, in etcd."""

    etcd: EtcdSession
    keys: Keys
    config: BrokerConfig
    group: str
    clock: Callable[[], float]

    async def batch_decision(
        self, producer_group: str, batch_key: str, commit: list[str]
    ) -> list[str]:
        """The commit point of a batch (TXMQ_DECIDE_BATCH) that may span broker groups: one
        create-if-absent etcd record.  Returns the decision in force (the first one made)."""
        key = self.keys.batch(producer_group, batch_key)
        lease = await self.etcd.grant(BATCH_RECORD_TTL)
        created = await self.etcd.txn(
            "batch decision",
            [(key, "version", 0)],
            [(key, {"commit": sorted(set(commit)), "ts": int(self.clock() * 1000)}, lease)],
        )
        if created:
            log.info("batch_commit_point", producer_group=producer_group, batch_key=batch_key)
            return sorted(set(commit))
        await self.etcd.revoke(lease)
        got = await self.etcd.get(key)
        if got is None:
            raise EtcdError(f"batch decision {key} vanished while it was read")
        return [str(t) for t in got[0]["commit"]]

    def _offsets_key(self, consumer_group: str, topic: str, queue_id: int) -> str:
        cluster, cgroup, group, name = (
            quote(x, safe="")
            for x in (self.config.broker_cluster_name, consumer_group, self.group, topic)
        )
        return f"{TXN_OFFSETS_ROOT}{cluster}/{cgroup}/{group}/{name}/{queue_id}"

    async def offsets_decision(
        self,
        producer_group: str,
        batch_key: str,
        commit: list[str],
        moves: list[tuple[str, str, str, int, int, int]],
    ) -> tuple[list[str], str | None]:
        """The commit point of a transaction across broker groups that commits consumer offsets
        of this group (``moves``: consumer group, the queue's broker group, topic, queue id,
        the offset the consumer started from, the next one).  One etcd transaction creates the batch's decision record
        (as :meth:`batch_decision`) and moves each queue's offset key from the expected offset
        to the next one, by a compare-and-swap of its revision: of two attempts at the same
        input (a zombie and the queue's new owner) one commits at most.  An offset key that
        is at another offset fences the transaction: its rollback is recorded instead.
        Returns the decision in force and, when this call fenced it, why."""
        batch = self.keys.batch(producer_group, batch_key)
        commit = sorted(set(commit))
        for _ in range(PIPELINE_CAS_ATTEMPTS):
            compare: list[tuple[str, str, int]] = [(batch, "version", 0)]
            puts: list[tuple[str, Any, int | None]] = []
            fenced = None
            for cgroup, owner, topic, queue_id, expect, offset in moves:
                if owner and owner != self.group:
                    # its offsets would land in a table its consumers never read
                    fenced = (
                        f"the offsets of {topic}:{queue_id} (broker group {owner}) were sent to "
                        f"broker group {self.group}"
                    )
                    break
                key = self._offsets_key(cgroup, topic, queue_id)
                got = await self.etcd.get(key)
                if got is None:
                    # no commit across groups yet: the group's offset table holds the start
                    compare.append((key, "version", 0))
                elif int(got[0]["offset"]) != expect:
                    fenced = (
                        f"the committed offset of {topic}:{queue_id} is {got[0]['offset']}, "
                        f"not {expect} (another attempt committed it)"
                    )
                    break
                else:
                    compare.append((key, "mod", got[1]))
                puts.append((key, {"offset": offset, "batchKey": batch_key}, None))
            if fenced is not None:
                decided = await self.batch_decision(producer_group, batch_key, [])
                return decided, fenced
            lease = await self.etcd.grant(BATCH_RECORD_TTL)
            ts = int(self.clock() * 1000)
            puts.insert(0, (batch, {"commit": commit, "ts": ts}, lease))
            if await self.etcd.txn("offsets batch decision", compare, puts):
                log.info("offsets_commit_point", producer_group=producer_group, batch_key=batch_key)
                return commit, None
            await self.etcd.revoke(lease)
            before = await self._recorded_batch(batch)
            if before is not None:
                return before[0], None
            # an offset key moved meanwhile: look again (fenced unless it moved to the start)
        decided = await self.batch_decision(producer_group, batch_key, [])
        return decided, "the consumed queues' offsets kept moving while it was decided"

    # -- pipeline positions -----------------------------------------------------------------

    def _pipeline_key(self, producer_group: str, pipeline: str, leaf: str) -> str:
        """A key of a pipeline's position records: ``/txmq-pipelines/<cluster>/<producer
        group>/<pipeline>/<leaf>``, outside the prefix every broker watches (a pipeline keeps
        one range per batch decided within ``transactionBatchRetention``)."""
        cluster, group, name = (
            quote(x, safe="") for x in (self.config.broker_cluster_name, producer_group, pipeline)
        )
        return f"{PIPELINE_ROOT}{cluster}/{group}/{name}/{leaf}"

    def _range_key(self, producer_group: str, pipeline: str, start: str) -> str:
        digest = hashlib.sha256(start.encode()).hexdigest()
        return self._pipeline_key(producer_group, pipeline, f"ranges/{digest}")

    async def pipeline_decision(
        self,
        producer_group: str,
        batch_key: str,
        commit: list[str],
        position: tuple[str, str, str],
    ) -> tuple[list[str], tuple[str, str, str] | None]:
        """The commit point of a pipeline's batch: one etcd transaction creates the batch's
        decision record (as :meth:`batch_decision`), moves the pipeline's head (the end of its
        last decided batch and that batch's key, kept forever) from ``start`` to ``end`` by a
        compare-and-swap of its revision, and records the decided range ``start -> end`` on a
        lease of ``transactionBatchRetention``.  Returns the decision in force and the position
        it recorded (the first decision's, for a batch decided before).

        Raises:
            IllegalOperationError: the pipeline is not at ``start`` (another query runs it, or
                its source did not resume from it); nothing was recorded.
        """
        pipeline, start, end = position
        batch = self.keys.batch(producer_group, batch_key)
        head_key = self._pipeline_key(producer_group, pipeline, "head")
        range_key = self._range_key(producer_group, pipeline, start)
        commit = sorted(set(commit))
        for _ in range(PIPELINE_CAS_ATTEMPTS):
            head = await self.etcd.get(head_key)
            if head is not None and head[0]["end"] != start:
                before = await self._recorded_batch(batch)
                if before is not None:
                    return before
                raise IllegalOperationError(
                    f"pipeline {pipeline!r} of producer group {producer_group} is at "
                    f"{head[0]['end']} (batch {head[0]['batchKey']!r}); batch {batch_key!r} starts "
                    f"at {start}: another query runs this pipeline, or its source does not resume "
                    "from the pipeline"
                )
            ts = int(self.clock() * 1000)
            retention = max(1, -(-self.config.transaction_batch_retention // 1000))
            lease = await self.etcd.grant(BATCH_RECORD_TTL)
            kept = await self.etcd.grant(retention)
            created = await self.etcd.txn(
                "pipeline batch decision",
                [
                    (batch, "version", 0),
                    (head_key, "version", 0) if head is None else (head_key, "mod", head[1]),
                ],
                [
                    (batch, {"commit": commit, "ts": ts, "position": list(position)}, lease),
                    (head_key, {"end": end, "batchKey": batch_key, "ts": ts}, None),
                    (range_key, {"start": start, "end": end, "batchKey": batch_key}, kept),
                ],
            )
            if created:
                log.info(
                    "pipeline_commit_point",
                    producer_group=producer_group,
                    batch_key=batch_key,
                    pipeline=pipeline,
                )
                return commit, position
            for unused in (lease, kept):
                await self.etcd.revoke(unused)
            before = await self._recorded_batch(batch)
            if before is not None:
                return before
            # The head moved meanwhile: look again (refused unless it moved to ``start``).
        raise IllegalOperationError(
            f"pipeline {pipeline!r} of producer group {producer_group} kept moving while batch "
            f"{batch_key!r} was decided; nothing was recorded"
        )

    async def _recorded_batch(
        self, key: str
    ) -> tuple[list[str], tuple[str, str, str] | None] | None:
        got = await self.etcd.get(key)
        if got is None:
            return None
        pos = got[0].get("position")
        return [str(t) for t in got[0]["commit"]], None if pos is None else _position(pos)

    async def recorded_batch(
        self, producer_group: str, batch_key: str
    ) -> tuple[list[str], tuple[str, str, str] | None] | None:
        """A batch's decision as etcd records it (while its record is kept): the transactions
        it commits in every group, and the pipeline position it recorded."""
        return await self._recorded_batch(self.keys.batch(producer_group, batch_key))

    async def pipeline_where(
        self, producer_group: str, pipeline: str, start: str | None, batch_key: str | None = None
    ) -> dict[str, Any]:
        """Where a pipeline is, read from etcd: ``end`` and ``batchKey`` of its last decided
        batch, ``next``: the end of the decided batch that started at ``start`` (while its
        range is kept), ``position``: the range ``batch_key`` recorded (while its decision
        record is kept)."""
        head = await self.etcd.get(self._pipeline_key(producer_group, pipeline, "head"))
        found: dict[str, Any] = {
            "end": head[0]["end"] if head else None,
            "batchKey": head[0]["batchKey"] if head else None,
            "next": None,
            "position": None,
        }
        if start is not None:
            got = await self.etcd.get(self._range_key(producer_group, pipeline, start))
            if got is not None and got[0]["start"] == start:
                found["next"] = got[0]["end"]
        if batch_key is not None:
            before = await self._recorded_batch(self.keys.batch(producer_group, batch_key))
            if before is not None:
                found["position"] = before[1]
        return found
