"""Commit-log replication inside a broker group.

Followers pull (like a Kafka follower): a follower asks its leader for the commit-log bytes from
its own end offset, writes them at the same offsets (the logs stay byte-identical, so
commit-log offsets, offsetMsgIds and consume-queue positions mean the same on every replica)
and asks again.  The offset a follower asks from acknowledges everything below it.

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
acknowledged is cut.
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
    FlushSlaveTimeoutError,
    ServiceNotAvailableError,
    SlaveNotAvailableError,
)

from ..store import MessageStore, atomic_write

if TYPE_CHECKING:
    from ..context import BrokerContext
    from ..transaction.service import TransactionalMessageService

log = structlog.get_logger(__name__)

#: Most bytes one fetch answer carries.
FETCH_MAX_BYTES = 4 * 1024 * 1024
#: How long a fetch waits for new data at the leader's end.
FETCH_WAIT_MS = 500
#: How often the leader looks for writes that waited for their replicas too long (their
#: ``syncFlushTimeout`` is honoured to within this).
EXPIRE_EVERY_S = 0.1
#: State files a follower copies from its leader (relative to the store root).
META_FILES = (
    "config/consumerOffset.json",
    "config/subscriptionGroup.json",
    "config/topics.json",
    "transaction/checkState.json",
)


class EpochHistory:
    """``[(epoch, start offset), ...]`` of the leaders whose writes this log holds."""

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, "ha", "epochs.json")
        self.entries: list[tuple[int, int]] = []

    def load(self) -> None:
        try:
            with open(self.path, "rb") as f:
                self.entries = [(int(e), int(o)) for e, o in json.loads(f.read())]
        except FileNotFoundError:
            self.entries = []

    def save(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        atomic_write(self.path, json.dumps(self.entries).encode())

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
        lease_valid: whether this replica's etcd lease is surely still alive (a leader whose
            lease may have expired acknowledges nothing).
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
        if not self._lease_valid():
            raise ServiceNotAvailableError(
                "this broker's etcd lease may have expired: it cannot acknowledge writes"
            )

    async def wait_replicated(self, end: int) -> None:
        """Return once ``end`` is on every ISR member; raise a retriable error otherwise.

        One future per waiting write, kept in end-offset order: a follower's fetch (which
        confirms everything below its offset) resolves the prefix it covers in one pass, and
        :meth:`run` fails the writes whose ``syncFlushTimeout`` passed (no timer per write)."""
        self._check_can_ack()
        if self._replicated(end):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        item = (end, time.monotonic() + self.timeout, fut)
        waiters = self._waiters
        if not waiters or waiters[-1][0] <= end:
            waiters.append(item)
        else:  # a write that waited for its fsync may come after a later one
            bisect.insort(waiters, item, key=lambda w: w[0])
        await fut
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

    async def fetch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        replica = self._check_follower(cmd)
        pos = int(cmd.ext_fields["offset"])
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
        return cmd.response(
            ext_fields={
                "offset": pos,
                "next": nxt,
                "leaderEnd": end,
                "epoch": self.epoch,
            },
            body=data,
        )

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

    def _fields(self, **more: Any) -> dict[str, Any]:
        return {"brokerName": self.group, "replicaId": self.replica, "epoch": self.epoch, **more}

    async def run(self) -> None:
        host, _, port = self.leader_addr.rpartition(":")
        conn = await open_connection(host, int(port), timeout=3.0, ssl=self.ssl, signer=self.signer)
        try:
            await self._handshake(conn)
            if self.on_connected is not None:
                self.on_connected()
            last_meta = 0.0
            while True:
                await self._fetch_once(conn)
                now = time.monotonic()
                if now - last_meta >= 1.0:
                    last_meta = now
                    await self._meta(conn)
        finally:
            conn.close()

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
        cut = divergence(self.epochs.entries, leader_epochs)
        if cut is not None and cut < end:
            log.warning(
                "replica_truncating",
                offset=cut,
                end=end,
                reason="records past the point where this log diverged from the leader's",
            )
            await self.run_blocking(lambda: self.store.truncate(cut))
            end = self.store.max_phy_offset
        elif end > int(info["end"]):
            log.warning("replica_truncating", offset=int(info["end"]), end=end, reason="ahead")
            leader_end = int(info["end"])
            await self.run_blocking(lambda: self.store.truncate(leader_end))
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

    async def _fetch_once(self, conn: Connection) -> None:
        pos = self.store.max_phy_offset
        resp = await self._request(
            conn,
            RequestCode.TXMQ_HA_FETCH,
            FETCH_WAIT_MS / 1000.0 + 5.0,
            offset=pos,
            waitMs=FETCH_WAIT_MS,
        )
        f = resp.ext_fields
        start, nxt = int(f["offset"]), int(f["next"])
        self.leader_end = int(f["leaderEnd"])
        self.fetches += 1
        if resp.body or nxt != start:
            end = self.store.append_replicated(start, resp.body, nxt)
            if self.sync:
                await self.run_blocking(self.store.flush)
            self.epochs.adopt(self._leader_epochs, end)
        if self.store.max_phy_offset >= self.leader_end:
            self.caught_up_at = time.monotonic()
            self.caught_up.set()

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
