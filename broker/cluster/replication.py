"""Commit-log replication inside a broker group.

A follower opens one connection to its leader, shakes hands (cutting its log back to where it
diverged) and then asks for a stream: from then on the leader pushes the commit-log bytes it
appends, as it appends them (one push per turn of its event loop, whatever the number of writes
in it; at most :data:`PUSH_WINDOW` pushes not yet acknowledged), and the follower writes them
at the same offsets (the logs stay byte-identical, so commit-log offsets, offsetMsgIds and
consume-queue positions mean the same on every replica) and acknowledges each push with the
end of its log, a oneway request of a few fields.  That end acknowledges everything below it.
An idle follower asks the leader for its end every :data:`FETCH_WAIT_MS` (its liveness, and
the leader's).  A leader that does not offer streams is followed the old way, a fetch request
per chunk.

A write is acknowledged to its client once every member of the in-sync set (ISR) has it and the
ISR holds at least ``minInSyncReplicas`` replicas (the leader included).  A follower that has
not caught up with the leader's end for ``haMaxTimeSlaveNotCatchup`` ms leaves the ISR; one that
reaches the end joins it again.  Both changes are etcd transactions that compare the leader key
the leader holds, so only the current leader can make them, and an acknowledged write is always
on every ISR member: electing any of them loses nothing.

Epochs: each election increments the group's epoch; the new leader records ``(epoch, its log
end)`` in its epoch history (``<store>/ha/epochs.json``).  A replica that rejoins asks the leader
for that history and cuts its own log back to where it diverged (the start of the first epoch
newer than its own last one) before fetching: what a deposed leader wrote and nobody
acknowledged is cut.  The file is ``{"epochs": [[epoch, start], ...], "txmqCrc32": n}`` (the
CRC-32 of the rest in canonical JSON); one written before checksums is the bare list, read as
before.  A damaged history (not JSON, a checksum that does not match) is set aside with an ERROR
and treated as unknown: the replica cannot tell where its log diverged, so when it rejoins it
cuts its log back to the start of the leader's history and fetches it all again.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from txmq.protocol.aio import Connection, open_connection
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import (
    MALFORMED_DOCUMENT,
    ConnectionClosedError,
    FlushSlaveTimeoutError,
    ServiceNotAvailableError,
    SlaveNotAvailableError,
)

from ..store import MessageStore, atomic_write
from ..store.fileio import checked_json, dumps_with_checksum, set_aside_quietly
from ..transaction.persistence import set_aside_snapshot_past

if TYPE_CHECKING:
    from ..context import BrokerContext
    from ..transaction.service import TransactionalMessageService

log = structlog.get_logger(__name__)

#: Most bytes one fetch answer carries.
FETCH_MAX_BYTES = 4 * 1024 * 1024
#: How long a fetch waits for new data at the leader's end; how long a streaming follower
#: waits for a push before it asks the leader for its end.
FETCH_WAIT_MS = 500
#: Seconds a streaming follower waits for the leader to answer its probe: longer and the leader
#: is taken for silent (the follower says so in etcd: ``ClusterNode.leader_refused``).
PROBE_TIMEOUT_S = 0.5
#: How often a write held for a lease renewal looks again (LeaderReplication.wait_replicated).
LEASE_RECHECK_S = 0.05
#: Pushes a leader sends a follower before the first of them is acknowledged.
PUSH_WINDOW = 2
#: How often the leader looks for writes that waited for their replicas too long (their
#: ``syncFlushTimeout`` is honoured to within this).
EXPIRE_EVERY_S = 0.1
#: State files a follower copies from its leader (relative to the store root).
META_FILES = (
    "config/consumerOffset.json",
    "config/subscriptionGroup.json",
    "config/topics.json",
    "transaction/checkState.json",
    "config/auth.json",  # ACL 2.0's users and policies
)


class EpochHistory:
    """``[(epoch, start offset), ...]`` of the leaders whose writes this log holds."""

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, "ha", "epochs.json")
        self.entries: list[tuple[int, int]] = []
        #: The file was damaged: which leaders' writes this log holds is unknown until the
        #: history is written again (:meth:`begin`, :meth:`adopt`).
        self.lost = False

    def load(self) -> None:
        self.lost = False
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            self.entries = []
            return
        try:
            doc, _ = checked_json(raw, self.path)
            rows = doc["epochs"] if isinstance(doc, dict) else doc  # a bare list: older files
            self.entries = [(int(e), int(o)) for e, o in rows]
        except MALFORMED_DOCUMENT as exc:
            self.entries = []
            self.lost = True
            log.error(
                "epoch_history_damaged",
                file=self.path,
                set_aside=set_aside_quietly(self.path),
                error=str(exc),
                action="when it rejoins its group this replica cuts its log back to the start "
                "of the leader's history and fetches it again",
            )

    def known(self) -> list[tuple[int, int]]:
        """The history to compare with a leader's: one that diverges from any leader's at its
        start when this one was lost."""
        return [(-1, 0)] if self.lost else self.entries

    def save(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        atomic_write(self.path, dumps_with_checksum({"epochs": self.entries}))
        self.lost = False

    @property
    def last_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else -1

    def begin(self, epoch: int, offset: int) -> None:
        """This replica leads ``epoch`` from ``offset`` on."""
        self.entries = [(e, o) for e, o in self.entries if e < epoch and o <= offset]
        self.entries.append((epoch, offset))
        self.save()

    def adopt(self, leader: list[tuple[int, int]], end: int) -> None:
        """Follow the leader's history as far as this log reaches."""
        mine = [(e, o) for e, o in leader if o <= end]
        if mine != self.entries:
            self.entries = mine
            self.save()


def divergence(mine: list[tuple[int, int]], leader: list[tuple[int, int]]) -> int | None:
    """Where a rejoining replica's log stops agreeing with its leader's: the start of the first
    leader epoch newer than the replica's last one (None: no cut needed)."""
    if not mine:
        return None
    last = mine[-1][0]
    for epoch, start in leader:
        if epoch > last:
            return start
    return None


@dataclass(eq=False)
class _Stream:
    """A follower's streaming connection, on the leader."""

    conn: Connection
    replica: int
    #: Bytes pushed up to here.
    sent: int
    #: Pushes not acknowledged yet.
    unacked: int = 0


@dataclass
class _Follower:
    offset: int = 0
    fetched: bool = False
    fetched_at: float = field(default_factory=time.monotonic)
    caught_up_at: float = field(default_factory=time.monotonic)


class LeaderReplication:
    """The leader side: serves fetches, keeps the ISR, releases waiting writes.

    Args:
        broker: the leader's broker (its store and config).
        replica: this replica's id.
        epoch: the epoch this leadership runs under.
        isr: the in-sync set from the election.
        update_isr: writes a new ISR to etcd if this replica still leads; False if not.
        lease_valid: whether this replica may acknowledge: its etcd lease is surely still
            alive and was renewed recently enough that the followers cannot have revoked it
            (``ClusterNode.may_acknowledge``).
        on_stale: called when a follower shows a newer epoch (this leader is deposed).
    """

    def __init__(
        self,
        broker: BrokerContext,
        transactions: TransactionalMessageService,
        replica: int,
        epoch: int,
        isr: tuple[int, ...],
        epochs: EpochHistory,
        update_isr: Callable[[tuple[int, ...]], Any],
        lease_valid: Callable[[], bool],
        on_stale: Callable[[str], None],
    ) -> None:
        self.broker = broker
        self.transactions = transactions
        self.store = broker.store
        cfg = broker.config
        self.replica = replica
        self.epoch = epoch
        self.isr: tuple[int, ...] = tuple(sorted(set(isr) | {replica}))
        self.epochs = epochs
        self.min_isr = cfg.min_in_sync_replicas
        self.max_lag_s = cfg.ha_max_time_slave_not_catchup / 1000.0
        self.timeout = cfg.sync_flush_timeout / 1000.0
        self._update_isr = update_isr
        self._lease_valid = lease_valid
        self._on_stale = on_stale
        self.followers: dict[int, _Follower] = {r: _Follower() for r in self.isr if r != replica}
        #: Writes waiting for the in-sync replicas: ``(end offset, deadline, future)`` in the
        #: order of their end offsets, so a confirm releases a prefix.
        self._waiters: deque[tuple[int, float, asyncio.Future[None]]] = deque()
        #: Fetches parked at the leader's end, woken by the next append (or their wait).
        self._parked: list[asyncio.Future[None]] = []
        #: The offset every in-sync follower holds (None: no follower in sync).
        self._confirmed: int | None = None
        self._isr_changing = False
        self._closed: str | None = None
        self.metrics = broker.metrics
        self.metrics.in_sync_replicas.set(len(self.isr))
        self._lag_gauges: dict[int, Any] = {}
        #: The last chunk read for a fetch: ``(offset, log end then, data, next)``; the
        #: followers ask for the same bytes one after the other.
        self._last_chunk: tuple[int, int, bytes, int] | None = None
        #: Fetches answered, and how many of them with the chunk read for the previous one.
        self.fetches_served = 0
        self.chunks_shared = 0
        #: Appends consumers may not see yet: (end offset, queues written), oldest first.
        self._unconfirmed: deque[tuple[int, Iterable[tuple[str, int]]]] = deque()
        #: The followers' streaming connections, by replica.
        self._streams: dict[int, _Stream] = {}
        #: A push to the streams is scheduled for the end of this turn of the loop.
        self._push_due = False
        self._confirm()

    # -- acknowledgements -------------------------------------------------------------------

    def _replicated(self, end: int) -> bool:
        confirmed = self._confirmed
        return confirmed is None or confirmed >= end

    def _check_can_ack(self) -> None:
        if self._closed is not None:
            raise ServiceNotAvailableError(f"this broker no longer leads: {self._closed}")
        if len(self.isr) < self.min_isr:
            raise SlaveNotAvailableError(
                f"only {len(self.isr)} in-sync replica(s) {list(self.isr)}, minInSyncReplicas is "
                f"{self.min_isr}: the write is stored on the leader but not acknowledged"
            )

    async def wait_replicated(self, end: int) -> None:
        """Return once ``end`` is on every ISR member; raise a retriable error otherwise.

        One future per waiting write, kept in end-offset order: a follower's fetch (which
        confirms everything below its offset) resolves the prefix it covers in one pass, and
        :meth:`run` fails the writes whose ``syncFlushTimeout`` passed (no timer per write).

        Then the lease: a leader whose last renewal is too old (``lease_valid`` false: etcd
        electing its own leader, or this leader cut off from etcd or just woken from a pause)
        holds the acknowledgement until a renewal succeeds, and refuses it if none does within
        the write's ``syncFlushTimeout`` or the leadership ends meanwhile."""
        self._check_can_ack()
        deadline = time.monotonic() + self.timeout
        if not self._replicated(end):
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            item = (end, deadline, fut)
            waiters = self._waiters
            if not waiters or waiters[-1][0] <= end:
                waiters.append(item)
            else:  # a write that waited for its fsync may come after a later one
                bisect.insort(waiters, item, key=lambda w: w[0])
            await fut
            self._check_can_ack()
        while not self._lease_valid():
            if time.monotonic() >= deadline:
                raise ServiceNotAvailableError(
                    "this broker could not renew its etcd lease in time (it may be deposed): "
                    "the write is stored on the leader but not acknowledged"
                )
            await asyncio.sleep(LEASE_RECHECK_S)
            self._check_can_ack()

    def _release(self) -> None:
        waiters = self._waiters
        if not waiters:
            return
        confirmed = self._confirmed
        while waiters and (confirmed is None or waiters[0][0] <= confirmed):
            fut = waiters.popleft()[2]
            if not fut.done():
                fut.set_result(None)

    def _expire(self, now: float) -> None:
        """Fail the writes whose replicas did not confirm them within ``syncFlushTimeout``."""
        if not self._waiters:
            return
        still: deque[tuple[int, float, asyncio.Future[None]]] = deque()
        for item in self._waiters:
            fut = item[2]
            if fut.done():
                continue
            if item[1] <= now:
                fut.set_exception(
                    FlushSlaveTimeoutError(
                        f"the write is stored on the leader but the in-sync replicas "
                        f"{list(self.isr)} did not confirm it within {self.timeout:.1f}s"
                    )
                )
            else:
                still.append(item)
        self._waiters = still

    def _fail_all(self, exc: Exception) -> None:
        for _end, _deadline, fut in self._waiters:
            if not fut.done():
                fut.set_exception(exc)
        self._waiters = deque()

    def _wake_fetches(self) -> None:
        parked = self._parked
        if parked:
            self._parked = []
            for fut in parked:
                if not fut.done():
                    fut.set_result(None)

    async def _park(self, wait: float) -> None:
        """Wait until something is appended (or ``wait`` seconds pass)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._parked.append(fut)
        timer = loop.call_later(wait, _resolve, fut)
        try:
            await fut
        finally:
            timer.cancel()

    def on_append(self, destinations: Iterable[tuple[str, int]]) -> None:
        """The write path's subscriber: the parked fetches have more to send; the pulls parked
        on the queues written wake once the in-sync replicas confirm the append."""
        self._wake_fetches()
        if self._streams and not self._push_due:
            self._push_due = True
            asyncio.get_running_loop().call_soon(self._push)
        if self.store.visible_end is None:
            self.broker.hold.on_append(destinations)
        else:
            self._unconfirmed.append((self.store.max_phy_offset, tuple(destinations)))

    # -- what consumers may read ------------------------------------------------------------

    def _confirmed_end(self) -> int | None:
        """The commit-log offset every in-sync follower holds (None: no follower in sync, the
        leader's own log is the group's)."""
        followers = self.followers
        end: int | None = None
        for r in self.isr:
            if r != self.replica:
                f = followers.get(r)
                offset = f.offset if f is not None else 0
                if end is None or offset < end:
                    end = offset
        return end

    def _confirm(self) -> None:
        """Let consumers read what the in-sync replicas hold (a message only the leader has
        could be lost in a failover, so no consumer may see it: no dirty reads), and wake the
        pulls parked on queues whose appends became readable."""
        self._confirmed = end = self._confirmed_end()
        if self._closed is not None:
            return  # a deposed leader shows nothing more
        self.store.visible_end = end
        pending, hold = self._unconfirmed, self.broker.hold
        while pending and (end is None or pending[0][0] <= end):
            hold.on_append(pending.popleft()[1])

    def processors(self) -> dict[int, Any]:
        """The requests the followers send to this leader."""
        R = RequestCode
        return {
            R.TXMQ_HA_HANDSHAKE: self.handshake,
            R.TXMQ_HA_FETCH: self.fetch,
            R.TXMQ_HA_META: self.meta,
        }

    def close(self, reason: str) -> None:
        self._closed = reason
        self._fail_all(ServiceNotAvailableError(f"this broker no longer leads: {reason}"))
        self._wake_fetches()
        self._streams.clear()  # nothing more is pushed; the followers' next request is refused

    # -- streams ----------------------------------------------------------------------------

    def _push(self) -> None:
        """Push what the streams lack, each within its window; followers at the same offset
        get the same bytes, read once."""
        self._push_due = False
        if self._closed is not None:
            return
        end = self.store.max_phy_offset
        chunk: tuple[int, bytes, int] | None = None
        for replica, s in list(self._streams.items()):
            if s.sent >= end or s.unacked >= PUSH_WINDOW:
                continue
            if s.conn.closed:
                del self._streams[replica]
                continue
            if chunk is not None and chunk[0] == s.sent:
                self.chunks_shared += 1
            else:
                try:
                    data, nxt = self.store.read_replica_chunk(s.sent, FETCH_MAX_BYTES)
                except ValueError as exc:
                    log.warning("replica_stream_dropped", replica=replica, error=str(exc))
                    del self._streams[replica]
                    s.conn.close()  # it reconnects and fetches the old way
                    continue
                chunk = (s.sent, data, nxt)
            fields = self._chunk_fields(s.sent, chunk[2], end)
            s.conn.send_oneway(RemotingCommand.request(RequestCode.TXMQ_HA_FETCH, fields, chunk[1]))
            s.sent = chunk[2]
            s.unacked += 1
            self.fetches_served += 1

    def _open_stream(
        self, conn: Connection, cmd: RemotingCommand, replica: int, pos: int
    ) -> RemotingCommand:
        """A follower at ``pos`` asks for a stream on ``conn``: it replaces the one it had."""
        old = self._streams.get(replica)
        if old is not None and old.conn is not conn:
            old.conn.close()
        self._streams[replica] = _Stream(conn, replica, pos)
        if not self._push_due:
            self._push_due = True
            asyncio.get_running_loop().call_soon(self._push)
        end = self.store.max_phy_offset
        return cmd.response(ext_fields={**self._chunk_fields(pos, pos, end), "stream": 1})

    def _chunk_fields(self, pos: int, nxt: int, end: int) -> dict[str, Any]:
        """The fields of a chunk sent to a follower: where it starts (``offset``), where the
        next one starts, where the leader's log ends, and the leader's epoch."""
        return {"offset": pos, "next": nxt, "leaderEnd": end, "epoch": self.epoch}

    def _acked(self, conn: Connection, replica: int, offset: int) -> None:
        s = self._streams.get(replica)
        if s is not None and s.conn is conn and s.unacked:
            s.unacked -= 1
        self._progress(replica, offset)
        if s is not None and s.unacked < PUSH_WINDOW and s.sent < self.store.max_phy_offset:
            self._push()

    # -- requests from followers ------------------------------------------------------------

    def _check_follower(self, cmd: RemotingCommand) -> int:
        f = cmd.ext_fields
        group = str(f.get("brokerName", ""))
        if group != self.broker.config.broker_name:
            raise ServiceNotAvailableError(
                f"this broker leads group {self.broker.config.broker_name!r}, not {group!r}"
            )
        epoch = int(f.get("epoch", -1))
        if epoch > self.epoch:
            self._on_stale(f"a follower is at epoch {epoch}, this leader at {self.epoch}")
            raise ServiceNotAvailableError(f"this leader's epoch {self.epoch} is stale")
        if self._closed is not None:
            raise ServiceNotAvailableError(f"this broker no longer leads: {self._closed}")
        return int(f.get("replicaId", -1))

    async def handshake(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        replica = self._check_follower(cmd)
        log.info("replica_handshake", replica=replica, peer=f"{conn.peer[0]}:{conn.peer[1]}")
        body = {
            "epoch": self.epoch,
            "epochs": self.epochs.entries,
            "segmentSize": self.broker.config.mapped_file_size_commit_log,
            "minOffset": self.store.min_phy_offset,
            "end": self.store.max_phy_offset,
        }
        return cmd.response(body=json.dumps(body).encode())

    async def fetch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        replica = self._check_follower(cmd)
        fields = cmd.ext_fields
        pos = int(fields["offset"])
        if "ack" in fields:  # a streaming follower has appended up to pos (oneway)
            self._acked(conn, replica, pos)
            return None
        if "stream" in fields:
            self._progress(replica, pos)
            if pos < self.store.min_phy_offset and pos == 0:
                pos = self.store.min_phy_offset  # an empty follower starts at the oldest segment
            return self._open_stream(conn, cmd, replica, pos)
        if "probe" in fields:  # an idle streaming follower: where the log ends, no bytes
            self._progress(replica, pos)
            self.fetches_served += 1
            end = self.store.max_phy_offset
            return cmd.response(ext_fields=self._chunk_fields(pos, pos, end))
        wait = min(int(cmd.ext_fields.get("waitMs", FETCH_WAIT_MS)), 5000) / 1000.0
        self._progress(replica, pos)
        if pos >= self.store.max_phy_offset and wait > 0 and self._closed is None:
            await self._park(wait)
        if pos < self.store.min_phy_offset and pos == 0:
            pos = self.store.min_phy_offset  # an empty follower starts at the oldest segment
        end = self.store.max_phy_offset
        last = self._last_chunk
        self.fetches_served += 1
        if last is not None and last[0] == pos and last[1] == end:
            data, nxt = last[2], last[3]  # the other follower asked for the same bytes
            self.chunks_shared += 1
        else:
            try:
                data, nxt = self.store.read_replica_chunk(pos, FETCH_MAX_BYTES)
            except ValueError as exc:
                return cmd.response(ResponseCode.SYSTEM_ERROR, f"cannot serve offset {pos}: {exc}")
            self._last_chunk = (pos, end, data, nxt)
        return cmd.response(ext_fields=self._chunk_fields(pos, nxt, end), body=data)

    async def meta(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        self._check_follower(cmd)
        b = self.broker
        root = b.config.store_path_root_dir

        def read() -> dict[str, str]:
            b.offsets.persist()
            out: dict[str, str] = {}
            for rel in META_FILES:
                try:
                    with open(os.path.join(root, rel), encoding="utf-8") as f:
                        out[rel] = f.read()
                except FileNotFoundError:
                    pass
            return out

        await b.persist_topics()
        await self.transactions.persist_check_state()
        files = await b.in_background(read)
        return cmd.response(body=json.dumps(files).encode())

    def _progress(self, replica: int, offset: int) -> None:
        now = time.monotonic()
        f = self.followers.setdefault(replica, _Follower(caught_up_at=now))
        f.offset = max(f.offset, offset) if f.fetched else offset
        f.fetched = True
        f.fetched_at = now
        end = self.store.max_phy_offset
        if offset >= end:
            f.caught_up_at = now
        gauge = self._lag_gauges.get(replica)
        if gauge is None:
            gauge = self._lag_gauges[replica] = self.metrics.replication_lag.labels(str(replica))
        gauge.set(max(0, end - offset))
        self._confirm()
        self._release()
        if replica not in self.isr and offset >= end:
            self._change_isr(tuple(sorted((*self.isr, replica))), f"replica {replica} caught up")

    # -- the ISR ----------------------------------------------------------------------------

    def _change_isr(self, new: tuple[int, ...], why: str) -> None:
        if self._isr_changing or self._closed is not None or new == self.isr:
            return
        self._isr_changing = True
        asyncio.get_running_loop().create_task(self._write_isr(new, why), name="txmq-isr")

    async def _write_isr(self, new: tuple[int, ...], why: str) -> None:
        try:
            ok = await self._update_isr(new)
            if ok:
                old, self.isr = self.isr, new
                self.metrics.in_sync_replicas.set(len(new))
                log.warning("isr_changed", old=list(old), new=list(new), reason=why)
                if len(new) < self.min_isr:
                    self._fail_all(
                        SlaveNotAvailableError(
                            f"in-sync replicas {list(new)} are fewer than minInSyncReplicas "
                            f"{self.min_isr}: the write is stored on the leader but not "
                            "acknowledged"
                        )
                    )
                self._confirm()
                self._release()
            else:
                self._on_stale("the ISR update was refused: another replica leads")
        except Exception as exc:
            log.warning("isr_update_failed", new=list(new), error=str(exc))
        finally:
            self._isr_changing = False

    async def run(self) -> None:
        """Drop followers that fall behind from the ISR; fail writes that waited too long."""
        last_isr_check = 0.0
        while self._closed is None:
            await asyncio.sleep(EXPIRE_EVERY_S)
            now = time.monotonic()
            self._expire(now)
            if now - last_isr_check < 0.2:
                continue
            last_isr_check = now
            end = self.store.max_phy_offset
            for r in self.isr:
                if r == self.replica:
                    continue
                f = self.followers.setdefault(r, _Follower())
                if now - f.fetched_at > self.max_lag_s:
                    self._change_isr(
                        tuple(x for x in self.isr if x != r),
                        f"replica {r} has not fetched for {now - f.fetched_at:.1f}s",
                    )
                    break
                if f.offset >= end:
                    f.caught_up_at = now
                elif now - f.caught_up_at > self.max_lag_s:
                    self._change_isr(
                        tuple(x for x in self.isr if x != r),
                        f"replica {r} behind by {end - f.offset} bytes for more than "
                        f"{self.max_lag_s:.1f}s",
                    )
                    break

    def status(self) -> dict[str, Any]:
        return {
            "end": self.store.max_phy_offset,
            "replicas": {str(r): f.offset for r, f in self.followers.items()},
            "isr": list(self.isr),
            "epoch": self.epoch,
        }


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


@dataclass(eq=False)
class ReplicaFetcher:
    """The follower side: handshake (cut back to the divergence point), then fetch forever.

    Args:
        store: this replica's open store.
        epochs: its epoch history.
        leader_addr: ``host:port`` of the leader's remoting port.
        group, replica, epoch: who asks, under which epoch (from the watched cluster view).
        sync: fsync each fetched chunk before acknowledging it (``SYNC_FLUSH``).
        ssl: the client TLS context when the leader's port enforces TLS.
    """

    store: MessageStore
    epochs: EpochHistory
    leader_addr: str
    group: str
    replica: int
    epoch: int
    _: KW_ONLY
    segment_size: int
    sync: bool
    run_blocking: Callable[[Callable[[], Any]], Any]
    ssl: Any = None
    signer: Callable[[RemotingCommand], None] | None = None
    #: Called once the leader has answered the handshake.
    on_connected: Callable[[], None] | None = None
    leader_end: int = field(default=0, init=False)
    caught_up: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    fetches: int = field(default=0, init=False)
    #: When a fetch last reached the leader's end (``time.monotonic()``).
    caught_up_at: float = field(default_factory=time.monotonic, init=False)
    _leader_epochs: list[tuple[int, int]] = field(default_factory=list, init=False)
    #: The leader pushes to this follower (else it fetches chunk by chunk).
    streaming: bool = field(default=False, init=False)
    #: Done when the connection closed or a push could not be taken (its result: why).
    _broken: asyncio.Future[BaseException] | None = field(default=None, init=False)

    def _fields(self, **more: Any) -> dict[str, Any]:
        return {"brokerName": self.group, "replicaId": self.replica, "epoch": self.epoch, **more}

    async def run(self) -> None:
        host, _, port = self.leader_addr.rpartition(":")
        self._broken = asyncio.get_running_loop().create_future()
        conn = await open_connection(
            host,
            int(port),
            self._on_push,
            timeout=3.0,
            ssl=self.ssl,
            signer=self.signer,
            on_close=self._on_close,
        )
        # The state files are copied beside the log, not in its way: a leader that falls silent
        # during a copy is still seen by the next probe (PROBE_TIMEOUT_S).
        meta: asyncio.Task[None] | None = None
        try:
            await self._handshake(conn)
            if self.on_connected is not None:
                self.on_connected()
            self.streaming = await self._open_stream(conn)
            last_meta = 0.0
            while True:
                if self.streaming:
                    await self._stream_wait(conn)
                else:
                    await self._fetch_once(conn)
                now = time.monotonic()
                if now - last_meta >= 1.0 and (meta is None or meta.done()):
                    if meta is not None:
                        meta.result()  # a failed copy ends this connection, as before
                    last_meta = now
                    meta = asyncio.get_running_loop().create_task(self._meta(conn))
        finally:
            if meta is not None:
                if not meta.done():
                    meta.cancel()
                elif not meta.cancelled():
                    meta.exception()  # retrieved: the connection's end is reported instead
            conn.close()

    def _on_close(self, conn: Connection) -> None:
        self._break(ConnectionClosedError(f"the leader {self.leader_addr} closed the connection"))

    def _break(self, exc: BaseException) -> None:
        if self._broken is not None and not self._broken.done():
            self._broken.set_result(exc)

    async def _open_stream(self, conn: Connection) -> bool:
        """Ask for a stream; False if the leader answered a plain fetch instead (it offers no
        streams: its bytes are taken, and the follower fetches from then on)."""
        resp = await self._request(
            conn,
            RequestCode.TXMQ_HA_FETCH,
            5.0,
            offset=self.store.max_phy_offset,
            waitMs=0,
            stream=1,
        )
        if "stream" not in resp.ext_fields:
            await self._take(resp)
            return False
        self.leader_end = int(resp.ext_fields["leaderEnd"])
        self._note_end()
        return True

    async def _stream_wait(self, conn: Connection) -> None:
        """One wait of a streaming follower: the pushes are taken meanwhile by
        :meth:`_on_push`; after a wait without any, ask the leader where its log ends (the
        leader sees this follower is alive, and it sees the leader is)."""
        broken = self._broken
        assert broken is not None
        seen = self.fetches
        await asyncio.wait({broken}, timeout=FETCH_WAIT_MS / 1000.0)
        if broken.done():
            raise broken.result()
        if self.fetches == seen:
            resp = await self._request(
                conn,
                RequestCode.TXMQ_HA_FETCH,
                PROBE_TIMEOUT_S,
                offset=self.store.max_phy_offset,
                probe=1,
            )
            self.fetches += 1
            self.leader_end = int(resp.ext_fields["leaderEnd"])
            self._note_end()

    async def _on_push(self, conn: Connection, cmd: RemotingCommand) -> None:
        """Bytes the leader pushed: write them, then acknowledge the new end of the log."""
        if cmd.code != RequestCode.TXMQ_HA_FETCH:
            return None
        try:
            f = cmd.ext_fields
            start, nxt = int(f["offset"]), int(f["next"])
            end = self.store.append_replicated(start, cmd.body, nxt)
            self.leader_end = int(f["leaderEnd"])
            self.fetches += 1
            if self.sync:
                await self.run_blocking(self.store.flush)
            self.epochs.adopt(self._leader_epochs, end)
            self._note_end()
            conn.send_oneway(
                RemotingCommand.request(
                    RequestCode.TXMQ_HA_FETCH, self._fields(offset=end, ack=1), oneway=True
                )
            )
        except Exception as exc:  # a push that does not continue this log, a full disk
            log.warning("replica_push_refused", leader=self.leader_addr, error=str(exc))
            self._break(exc)
            conn.close()
        return None

    def _note_end(self) -> None:
        if self.store.max_phy_offset >= self.leader_end:
            self.caught_up_at = time.monotonic()
            self.caught_up.set()

    async def _request(self, conn: Connection, code: int, timeout: float, **fields: Any) -> Any:
        resp = await conn.request(RemotingCommand.request(code, self._fields(**fields)), timeout)
        if resp.code != ResponseCode.SUCCESS:
            raise ServiceNotAvailableError(
                f"leader {self.leader_addr} refused replication request {code}: {resp.remark}"
            )
        return resp

    async def _handshake(self, conn: Connection) -> None:
        resp = await self._request(conn, RequestCode.TXMQ_HA_HANDSHAKE, 5.0)
        info = json.loads(resp.body)
        if int(info["segmentSize"]) != self.segment_size:
            raise ValueError(
                f"the leader's mappedFileSizeCommitLog is {info['segmentSize']}, this broker's "
                f"{self.segment_size}: replicas of a group need the same value"
            )
        leader_epochs = [(int(e), int(o)) for e, o in info["epochs"]]
        end = self.store.max_phy_offset
        cut = divergence(self.epochs.known(), leader_epochs)
        if cut is not None and cut < end:
            log.warning(
                "replica_truncating",
                offset=cut,
                end=end,
                reason="records past the point where this log diverged from the leader's",
            )
            await self.run_blocking(lambda: self._cut(cut))
            end = self.store.max_phy_offset
        elif end > int(info["end"]):
            log.warning("replica_truncating", offset=int(info["end"]), end=end, reason="ahead")
            leader_end = int(info["end"])
            await self.run_blocking(lambda: self._cut(leader_end))
            end = self.store.max_phy_offset
        self._leader_epochs = leader_epochs
        self.epochs.adopt(leader_epochs, end)
        log.info(
            "replica_following",
            leader=self.leader_addr,
            epoch=self.epoch,
            offset=end,
            leader_end=int(info["end"]),
        )

    def _cut(self, offset: int) -> None:
        """Cut the log back to ``offset``; a transaction snapshot covering the cut part is set
        aside (the log grows again with other records at those offsets)."""
        self.store.truncate(offset)
        set_aside_snapshot_past(self.store.config.store_path_root_dir, offset)

    async def _fetch_once(self, conn: Connection) -> None:
        pos = self.store.max_phy_offset
        resp = await self._request(
            conn,
            RequestCode.TXMQ_HA_FETCH,
            FETCH_WAIT_MS / 1000.0 + 5.0,
            offset=pos,
            waitMs=FETCH_WAIT_MS,
        )
        await self._take(resp)

    async def _take(self, resp: RemotingCommand) -> None:
        """Write the bytes of a fetch answer."""
        f = resp.ext_fields
        start, nxt = int(f["offset"]), int(f["next"])
        self.leader_end = int(f["leaderEnd"])
        self.fetches += 1
        if resp.body or nxt != start:
            end = self.store.append_replicated(start, resp.body, nxt)
            if self.sync:
                await self.run_blocking(self.store.flush)
            self.epochs.adopt(self._leader_epochs, end)
        self._note_end()

    async def _meta(self, conn: Connection) -> None:
        resp = await self._request(conn, RequestCode.TXMQ_HA_META, 5.0)
        files: dict[str, str] = json.loads(resp.body)
        root = self.store.config.store_path_root_dir

        def write() -> None:
            for rel, text in files.items():
                if rel not in META_FILES:
                    continue
                path = os.path.join(root, rel)
                try:
                    with open(path, encoding="utf-8") as f:
                        if f.read() == text:
                            continue
                except FileNotFoundError:
                    pass
                os.makedirs(os.path.dirname(path), exist_ok=True)
                atomic_write(path, text.encode())

        await self.run_blocking(write)
