"""A broker in cluster mode: one replica of a broker group, leading or following.

The node holds an etcd session (a lease kept alive every third of ``etcdLeaseTtl``), registers
itself as a member of its group, watches the cluster's keys and acts on them:

* no leader key for its group and it is eligible (in the ISR, or the group never had an
  election): campaign — one etcd transaction creates the leader key on its lease, bumps the
  epoch and rewrites the ISR without the previous leader.  The winner opens its store as a full
  :class:`~txmq.broker.server.BrokerController` (the normal recovery, transaction table
  included) and serves clients;
* another replica leads: follow it — a small server on the broker port answers routes and tells
  clients where the leader is, and a :class:`ReplicaFetcher` copies the leader's log;
* it led and lost the lease or the leader key (paused, partitioned): stop serving at once, fail
  every write still waiting for replicas, and rejoin as a follower (cutting what nobody
  acknowledged).

The follower's side is :mod:`.follower`; the commit points of transactions across broker groups
(batch decisions, pipeline positions) are :mod:`.decisions`; what a replica signs and encrypts
its replication requests with is :mod:`.access`.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from txmq.protocol.aio import wait_event
from txmq.protocol.command import RemotingCommand

from ..config import BrokerConfig
from ..context import BrokerContext
from ..metrics_scrape import follower_registry
from ..ops import OpsServer, start_ops_server
from ..server import BrokerController, _ipv4_of, run_until_signal
from ..store import TopicConfig
from ..topics import INTERNAL_TOPICS, config_from_queues
from ..transaction.service import TransactionalMessageService
from .access import client_ssl, replication_signer
from .decisions import CommitPoints
from .etcd import EtcdError, EtcdSession
from .follower import FollowerRole
from .replication import EpochHistory, LeaderReplication
from .view import ClusterView, Keys

log = structlog.get_logger(__name__)

#: Longest wait between two attempts to reach etcd at start.
ETCD_RETRY_MAX_S = 5.0
#: How long one attempt to record a vote against the leader may take before it is made again
#: (a call stuck on a dead etcd member, or in etcd's own election, is not waited for).
VOTE_ATTEMPT_S = 0.5
#: Seconds without a lease renewal after which the followers may depose a silent leader: they
#: revoke its lease only once etcd shows it unrenewed for longer than this (etcd counts a
#: lease's time left in whole seconds, so this is a whole number of seconds).
SILENCE_S = 1
#: A leader acknowledges nothing once its last lease renewal was sent this long ago: before
#: the followers may revoke its lease (:data:`SILENCE_S`), with a margin.
LEADER_FENCE_S = SILENCE_S - 0.2
#: How often a leader renews its lease (a follower renews every third of ``etcdLeaseTtl``):
#: several renewals fit in :data:`LEADER_FENCE_S`, so one slow renewal does not fence it.
LEADER_RENEW_S = 0.2
#: How often a follower that finds a silent leader asks etcd whether its lease went unrenewed
#: long enough.
SILENCE_POLL_S = 0.1


class ClusterHooks:
    """What a leading BrokerController asks its node: routes, status, replication, and the
    group's cross-group decisions (:attr:`decisions`, the node's)."""

    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self.replication: LeaderReplication | None = None
        self.decisions = node.decisions

    def route(self, topic: str) -> dict[str, Any] | None:
        return self.node.view.route(topic)

    def broker_addrs(self) -> dict[str, dict[int, str]]:
        return self.node.view.broker_addrs()

    def topic_names(self, groups: list[str] | None = None) -> set[str]:
        return self.node.view.topic_names(groups)

    def grpc_route(self, topic: str) -> list[tuple[str, dict[str, Any], str]]:
        """``(group, queue config, leader's gRPC host:port)`` of every group that has
        ``topic`` and a leader serving gRPC."""
        view = self.node.view
        out = []
        for group in view.groups():
            tc = view.topics(group).get(topic)
            leader = view.leader(group)
            if tc is not None and leader is not None and leader.grpc_addr:
                out.append((group, tc, leader.grpc_addr))
        return out

    def status(self) -> dict[str, Any]:
        return self.node.status()


class ClusterNode:
    """One replica of a broker group; see the module docstring.

    Args:
        config: the broker configuration (``etcdEndpoints`` set).
    """

    def __init__(self, config: BrokerConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.group = config.broker_name
        self.replica = config.broker_id
        #: The log with this node's group and replica on every line.
        self._log = log.bind(group=self.group, replica=self.replica)
        self.port = config.listen_port
        self.keys = Keys(config.broker_cluster_name)
        self.view = ClusterView(
            config.broker_cluster_name, write_replicas=config.route_write_replicas
        )
        self.etcd = EtcdSession(config.etcd_endpoints, timeout=min(3.0, config.etcd_lease_ttl / 2))
        #: The cross-group batch decisions and pipeline positions this group records in etcd.
        self.decisions = CommitPoints(self.etcd, self.keys, config, self.group, clock)
        self.addr = f"{config.broker_i_p1}:{config.listen_port}"
        #: Where the group's other replicas reach this one (brokerIP2, else brokerIP1).
        self.ha_addr = f"{config.broker_i_p2 or config.broker_i_p1}:{config.listen_port}"
        #: Where RocketMQ 5 clients reach this replica while it leads ("" without gRPC).
        self.grpc_addr = (
            f"{config.broker_i_p1}:{config.grpc_server_port}" if config.grpc_server_enable else ""
        )
        self.store_host = (_ipv4_of(config.broker_i_p1), config.listen_port)
        self.lease = 0
        self.lease_deadline = 0.0
        #: When the last successful renewal (or grant) of the lease was sent (monotonic).
        self.renewed_at = 0.0
        #: Set to renew the lease at once (this replica just took the leadership).
        self._renew_now = asyncio.Event()
        self.role = "starting"
        self.leader_broker: Any = None
        self.hooks: ClusterHooks | None = None
        self.follower: FollowerRole | None = None
        self.epoch = 0
        self._leader_mod = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._stopping = False
        self._transition = asyncio.Lock()
        self.elections = 0
        #: After a won election this replica could not serve: no campaign before this time.
        self._no_campaign_until = 0.0
        #: Why this replica cannot serve (its port taken, its store locked by another
        #: process): while set it neither campaigns nor follows; None when it can.
        self.obstacle: str | None = None
        self.stepped_down = asyncio.Event()
        self.became_leader = asyncio.Event()
        #: The operations port (metricsPort), served for every role of this replica.
        self.ops: OpsServer | None = None
        #: What /metrics serves while this replica does not lead.
        self._follower_metrics = follower_registry(lambda: self.follower, clock)
        #: (epoch, lease) of the leader this replica has said in etcd it cannot reach.
        self._vote: tuple[int, int] | None = None
        self._vote_lock = asyncio.Lock()
        self._vote_tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        if self.config.listen_port == 0:
            raise ValueError("cluster mode needs a fixed listenPort: routes name it")
        await self._reach_etcd()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._keepalive(), name="txmq-etcd-keepalive"))
        self._tasks.append(
            loop.create_task(
                self.etcd.watch_prefix(self.keys.root, self._on_view), name="txmq-etcd-watch"
            )
        )
        if not await wait_event(self.view.loaded, 30.0):
            raise EtcdError(f"could not read the cluster state from etcd at {self.etcd.endpoints}")
        self._tasks.append(loop.create_task(self._roles(), name="txmq-cluster-roles"))
        self.ops = start_ops_server(self.config, self._registry, self.readiness)
        self._log.info(
            "cluster_node_started",
            cluster=self.config.broker_cluster_name,
            etcd=self.etcd.endpoints,
        )

    async def _reach_etcd(self) -> None:
        """Connect to etcd and take a lease, retrying while etcd is not there yet (brokers are
        often started with, or before, their etcd members): a log line per attempt, waits
        doubling from 0.5 s to 5 s.  SIGTERM still stops the broker meanwhile."""
        wait = 0.5
        attempt = 0
        while True:
            attempt += 1
            try:
                await self.etcd.connect()
                await self._new_lease()
                if attempt > 1:
                    log.info("etcd_reached", endpoints=self.etcd.endpoints, attempts=attempt)
                return
            except EtcdError as exc:
                log.warning(
                    "etcd_unreachable",
                    endpoints=self.etcd.endpoints,
                    attempt=attempt,
                    retry_in=wait,
                    error=str(exc),
                )
            await asyncio.sleep(wait)
            wait = min(wait * 2, ETCD_RETRY_MAX_S)

    def _on_view(self, table: dict[str, Any]) -> None:
        self.view.update(table)
        if self.follower is not None and self.follower.forwarder is not None:
            self.follower.forwarder.leader_changed()
        self._wake.set()

    async def shutdown(self) -> None:
        self._stopping = True
        tasks = [*self._tasks, *self._vote_tasks]
        for t in tasks:
            t.cancel()
        await asyncio.wait(tasks, timeout=10.0)
        async with self._transition:
            await self._stop_roles()
        try:
            if self.lease:
                await asyncio.wait_for(self.etcd.revoke(self.lease), 3.0)
        except Exception as exc:
            log.info("etcd_lease_not_revoked", error=str(exc))
        await self.etcd.close()
        if self.ops is not None:
            self.ops.stop()
        self._log.info("cluster_node_stopped")

    # -- the lease --------------------------------------------------------------------------

    async def _new_lease(self) -> None:
        ttl = self.config.etcd_lease_ttl
        sent = time.monotonic()
        self.lease = await self.etcd.grant(ttl)
        self.lease_deadline = sent + ttl - 0.5
        self.renewed_at = sent
        await self._put_member()

    async def _put_member(self) -> None:
        """This replica's member key (on its lease): where it serves, and why it cannot while
        it cannot (``txmq cluster status`` shows it)."""
        value: dict[str, Any] = {
            "addr": self.addr,
            "haAddr": self.ha_addr,
            "replicaId": self.replica,
            "group": self.group,
        }
        if self.obstacle is not None:
            value["obstacle"] = self.obstacle
        await self.etcd.put(self.keys.member(self.group, self.replica), value, lease=self.lease)

    async def _publish_obstacle(self) -> None:
        try:
            await self._put_member()
        except EtcdError as exc:  # said again at the next lease
            log.warning("member_update_failed", error=str(exc))

    def lease_valid(self) -> bool:
        return time.monotonic() < self.lease_deadline

    def may_acknowledge(self) -> bool:
        """A leader acknowledges writes only while its lease is valid and its last renewal
        was sent less than :data:`LEADER_FENCE_S` ago: the followers revoke the lease of a
        silent leader only once etcd shows it unrenewed for longer (:data:`SILENCE_S`), so
        this leader has stopped by then, also when it was paused and just woke up (the clock
        is read at each acknowledgement)."""
        now = time.monotonic()
        return now < self.lease_deadline and now - self.renewed_at < LEADER_FENCE_S

    async def _keepalive(self) -> None:
        ttl = self.config.etcd_lease_ttl
        while True:
            every = LEADER_RENEW_S if self.role == "leader" else ttl / 3.0
            await wait_event(self._renew_now, every)
            self._renew_now.clear()
            sent = time.monotonic()
            try:
                left = await self.etcd.keepalive(self.lease)
            except EtcdError as exc:
                log.warning("etcd_keepalive_failed", error=str(exc))
                if not self.lease_valid() and self.role == "leader":
                    await self._step_down("the etcd lease could not be renewed in time")
                continue
            if left > 0:
                self.lease_deadline = sent + left - 0.5
                self.renewed_at = max(self.renewed_at, sent)
                continue
            log.warning("etcd_lease_lost", lease=self.lease)
            if self.role == "leader":
                await self._step_down("the etcd lease expired")
            try:
                await self._new_lease()
            except EtcdError as exc:
                log.warning("etcd_lease_grant_failed", error=str(exc))
            self._wake.set()

    # -- roles ------------------------------------------------------------------------------

    async def _roles(self) -> None:
        while not self._stopping:
            await wait_event(self._wake, 0.5)
            self._wake.clear()
            try:
                async with self._transition:
                    await self._decide()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("cluster_role_change_failed", error=str(exc))
                await asyncio.sleep(0.5)

    async def _decide(self) -> None:
        if self.role in ("starting", "none") and not self._check_can_serve():
            return
        leader = self.view.leader(self.group)
        if leader is not None and leader.replica == self.replica and leader.lease == self.lease:
            if self.role != "leader":
                # Our own leader key on our lease (a restart in the same session cannot keep
                # one, so this is the election just won).
                try:
                    await self._become_leader(leader.epoch)
                except Exception as exc:
                    await self._give_up_leadership(exc)
            return
        if self.role == "leader":
            await self._step_down_locked("another replica leads or the leader key is gone")
        if leader is None:
            if self._eligible() and time.monotonic() >= self._no_campaign_until:
                await self._campaign()
            elif self.role != "follower":
                await self._become_follower(None)
            return
        if self.role == "follower" and self._leader_gone(leader):
            await self._depose(leader)
            return
        await self._become_follower(leader)

    # -- a dead leader, seen before its lease expires ------------------------------------------

    def leader_refused(self, ha_addr: str, epoch: int, *, silent: bool = False) -> None:
        """The leader this replica follows (at ``ha_addr``, ``epoch``) refuses connections, or
        with ``silent`` does not answer: record it in etcd (``down/<group>/<replica>``, on
        this replica's lease)."""
        leader = self.view.leader(self.group)
        if (
            leader is None
            or leader.replica == self.replica
            or leader.epoch != epoch
            or leader.ha_addr != ha_addr
            or self._vote == (leader.epoch, leader.lease)
        ):
            return
        self._vote = (leader.epoch, leader.lease)
        self._log.warning(
            "leader_unreachable", leader=leader.replica, epoch=leader.epoch, silent=silent
        )
        self._spawn_vote(self._put_vote(leader.epoch, leader.lease, silent))

    def leader_reached(self) -> None:
        """The leader answered a replication handshake: withdraw a vote that it is gone."""
        if self._vote is not None:
            self._vote = None
            self._spawn_vote(self._delete_vote())

    def _spawn_vote(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro, name="txmq-leader-vote")
        self._vote_tasks.add(task)
        task.add_done_callback(self._vote_tasks.discard)

    async def _put_vote(self, epoch: int, lease: int, silent: bool) -> None:
        # Retried at once while it still matters (etcd electing its own leader, a member gone):
        # past the leader's lease the vote is moot.
        give_up = time.monotonic() + self.config.etcd_lease_ttl
        async with self._vote_lock:
            while self._vote == (epoch, lease) and not self._stopping:
                try:
                    await asyncio.wait_for(
                        self.etcd.put(
                            self.keys.down(self.group, self.replica),
                            {"epoch": epoch, "lease": lease, "silent": silent},
                            lease=self.lease,
                        ),
                        VOTE_ATTEMPT_S,
                    )
                    return
                except (EtcdError, TimeoutError) as exc:
                    log.info("leader_vote_failed", error=str(exc) or type(exc).__name__)
                if time.monotonic() >= give_up:
                    self._vote = None  # the next refusal tries again
                    return
                await asyncio.sleep(0.1)

    async def _delete_vote(self) -> None:
        async with self._vote_lock:
            if self._vote is not None:
                return
            try:
                await self.etcd.delete(self.keys.down(self.group, self.replica))
            except EtcdError as exc:
                log.info("leader_vote_not_withdrawn", error=str(exc))

    def _leader_gone(self, leader: Any) -> bool:
        """Every other replica of the group registered in etcd (this one included) finds the
        leader's port refusing connections."""
        votes = self.view.down_votes(self.group, leader)
        others = set(self.view.members(self.group)) - {leader.replica}
        return self.replica in votes and others <= votes

    async def _depose(self, leader: Any) -> None:
        """Revoke the lease of a leader whose process is gone: its leader key goes at once
        instead of when the lease expires, and the group elects another replica (the usual
        campaign, fenced by the epoch and in-sync set).

        A leader that did not answer (rather than refuse) may be alive: its lease is revoked
        only once etcd shows it unrenewed for more than :data:`SILENCE_S`, by when that
        leader acknowledges nothing any more (:meth:`may_acknowledge`); until then this is
        asked again every :data:`SILENCE_POLL_S`."""
        votes = sorted(self.view.down_votes(self.group, leader))
        silent = any(
            (e := self.view.table.get(self.keys.down(self.group, r))) is not None
            and bool(e.value.get("silent"))
            for r in votes
        )
        if silent:
            try:
                granted, left = await asyncio.wait_for(
                    self.etcd.time_to_live(leader.lease), VOTE_ATTEMPT_S
                )
            except (EtcdError, TimeoutError) as exc:
                log.info("leader_lease_unread", error=str(exc) or type(exc).__name__)
                left = granted = 0
            if left < 0:
                return  # gone already: the leader key goes with it
            # etcd rounds the time left down to whole seconds: left <= granted - SILENCE_S - 1
            # means more than SILENCE_S since the last renewal.
            if not granted or left > granted - SILENCE_S - 1:
                asyncio.get_running_loop().call_later(SILENCE_POLL_S, self._wake.set)
                return
        self._log.warning(
            "leader_lease_revoked",
            leader=leader.replica,
            epoch=leader.epoch,
            votes=votes,
            silent=silent,
        )
        try:
            await self.etcd.revoke(leader.lease)
        except EtcdError as exc:  # expired or revoked by another voter meanwhile
            log.info("leader_lease_not_revoked", error=str(exc))

    def _check_can_serve(self) -> bool:
        """Before taking any role: can this replica bind its port and open its store?  One
        that cannot must not campaign (it would win and leave the group leaderless) nor pose
        as a follower; it says why once, at ERROR, and looks again on the next turn."""
        why = serving_obstacle(self.config.bind_address, self.port, self.config.store_path_root_dir)
        if why != self.obstacle:
            if why is not None:
                log.error("replica_cannot_serve", group=self.group, replica=self.replica, why=why)
            else:
                log.info("replica_can_serve", group=self.group, replica=self.replica)
            self.obstacle = why
            if self.lease:
                self._spawn_vote(self._publish_obstacle())
        return why is None

    def _eligible(self) -> bool:
        isr = self.view.isr(self.group)
        return isr is None or self.replica in isr.members

    async def _give_up_leadership(self, exc: Exception) -> None:
        """An election won by a replica that cannot serve (its store does not open, its port
        is taken): let the group elect another one instead of holding the leader key.  The
        lease goes (with the leader key on it); a new one keeps this replica a member, and it
        does not campaign again for a while."""
        self._log.error("leadership_refused", error=f"{type(exc).__name__}: {exc}")
        self.leader_broker = None
        self.role = "none"
        self._no_campaign_until = time.monotonic() + 3 * self.config.etcd_lease_ttl
        try:
            await self.etcd.revoke(self.lease)
        except EtcdError as err:
            log.warning("etcd_lease_not_revoked", error=str(err))
        await self._new_lease()

    async def _campaign(self) -> None:
        epoch, epoch_rev = self.view.epoch(self.group)
        isr = self.view.isr(self.group)
        last = self.view.table.get(self.keys.epoch(self.group))
        previous = int(last.value.get("replicaId", -1)) if last is not None else -1
        members = set(isr.members) if isr is not None else set()
        members.discard(previous)
        members.add(self.replica)
        new_epoch = epoch + 1
        compare = [
            (self.keys.leader(self.group), "version", 0),
            (self.keys.epoch(self.group), "mod", epoch_rev),
            (self.keys.isr(self.group), "mod", isr.mod_revision if isr is not None else 0),
        ]
        ok = await self.etcd.txn(
            "campaign",
            compare,
            [
                (
                    self.keys.leader(self.group),
                    {
                        "replicaId": self.replica,
                        "addr": self.addr,
                        "haAddr": self.ha_addr,
                        "grpcAddr": self.grpc_addr,
                        "epoch": new_epoch,
                    },
                    self.lease,
                ),
                (
                    self.keys.epoch(self.group),
                    {"epoch": new_epoch, "replicaId": self.replica},
                    None,
                ),
                (self.keys.isr(self.group), {"epoch": new_epoch, "members": sorted(members)}, None),
            ],
        )
        if ok:
            self.elections += 1
            self._log.warning("leader_elected", epoch=new_epoch, isr=sorted(members))
        self._wake.set()

    async def _become_leader(self, epoch: int) -> None:
        t0 = time.monotonic()
        self.leader_reached()  # a vote against the previous leader is moot now
        self._renew_now.set()  # a fresh renewal before serving (may_acknowledge)
        if self.follower is not None:
            await self.follower.stop()
            self.follower = None
        self.epoch = epoch
        got = await self.etcd.get(self.keys.leader(self.group))
        self._leader_mod = got[1] if got is not None else 0
        isr = self.view.isr(self.group)
        members = isr.members if isr is not None else (self.replica,)
        self.hooks = ClusterHooks(self)
        broker = BrokerController(self.config, clock=self.clock, cluster=self.hooks)
        epochs = EpochHistory(self.config.store_path_root_dir)
        epochs.load()

        def begin_epoch() -> None:
            epochs.begin(epoch, broker.store.max_phy_offset)
            self._restore_topics(broker)

        broker.before_serving = begin_epoch
        hooks = self.hooks

        def make_replication(
            ctx: BrokerContext, transactions: TransactionalMessageService
        ) -> LeaderReplication:
            rep = hooks.replication = LeaderReplication(
                ctx,
                transactions,
                self.replica,
                epoch,
                members,
                epochs,
                self._update_isr,
                self.may_acknowledge,
                self._stale,
            )
            return rep

        broker.make_replication = make_replication
        await broker.start()
        broker.metrics.elections.inc(self.elections)
        self.leader_broker = broker
        self.role = "leader"
        self._renew_now.set()  # and from now on every LEADER_RENEW_S
        self.became_leader.set()
        self.stepped_down.clear()
        self._log.warning(
            "leading",
            epoch=epoch,
            isr=list(members),
            took_ms=round((time.monotonic() - t0) * 1000),
            max_phy_offset=broker.store.max_phy_offset,
        )
        asyncio.get_running_loop().create_task(self._publish_loop(broker), name="txmq-publish")

    def _restore_topics(self, broker: Any, *, from_etcd: bool = True) -> None:
        """Topics the replicated log has queues of but the copied topic table lacks (created on
        the old leader less than a copy interval before it died): take their config from what
        the old leader published to etcd, else from the queues found in the store. With
        ``from_etcd`` (taking the leadership) a topic the old leader published but never wrote
        to (placed just before it died) is restored too."""
        known = broker.topics.all()
        published = self.view.topics(self.group)
        names = set(broker.store.topics()) | (set(published) if from_etcd else set())
        for name in sorted(names):
            if name in known or name in INTERNAL_TOPICS:
                continue
            pub = published.get(name)
            if pub is not None:
                tc = TopicConfig(
                    name,
                    read_queue_nums=int(pub["read"]),
                    write_queue_nums=int(pub["write"]),
                    perm=int(pub["perm"]),
                    topic_sys_flag=int(pub.get("sysFlag", 0)),
                )
            else:
                tc = config_from_queues(
                    name, broker.store.queue_ids(name), self.config.default_topic_queue_nums
                )
            broker.topics.create_or_update(tc)
            log.warning(
                "topic_restored",
                topic=name,
                queues=tc.write_queue_nums,
                source="etcd" if pub is not None else "store",
            )

    async def _update_isr(self, members: tuple[int, ...]) -> bool:
        return await self.etcd.txn(
            "isr update",
            [(self.keys.leader(self.group), "mod", self._leader_mod)],
            [(self.keys.isr(self.group), {"epoch": self.epoch, "members": list(members)}, None)],
        )

    def _stale(self, why: str) -> None:
        log.warning("leadership_stale", reason=why)
        if self.hooks is not None and self.hooks.replication is not None:
            self.hooks.replication.close(why)
        self._wake.set()

    async def _publish_loop(self, broker: Any) -> None:
        """Keep the group's topics and replication progress in etcd while leading."""
        published: dict[str, Any] = {}
        #: topics this leader has had: one deleted here (txmq topic delete) leaves etcd too
        had: set[str] = set()
        last_progress = 0.0
        while self.leader_broker is broker and self.role == "leader":
            try:
                want: dict[str, Any] = {}
                for name, tc in broker.topics.all().items():
                    if name in INTERNAL_TOPICS:
                        continue
                    want[name] = {
                        "read": tc.read_queue_nums,
                        "write": tc.write_queue_nums,
                        "perm": tc.perm,
                        "sysFlag": tc.topic_sys_flag,
                    }
                tbw = broker.topics.route_config("TBW102")
                if tbw is not None:
                    want["TBW102"] = {
                        "read": tbw.read_queue_nums,
                        "write": tbw.write_queue_nums,
                        "perm": tbw.perm,
                        "sysFlag": 0,
                    }
                for name, value in want.items():
                    if published.get(name) != value:
                        ok = await self.etcd.txn(
                            "topic publish",
                            [(self.keys.leader(self.group), "mod", self._leader_mod)],
                            [(self.keys.topic(self.group, name), value, None)],
                        )
                        if not ok:
                            self._stale("a topic publish was refused: another replica leads")
                            return
                        published[name] = value
                had.update(want)
                gone = sorted(had - set(want))
                if gone:
                    ok = await self.etcd.txn(
                        "topic unpublish",
                        [(self.keys.leader(self.group), "mod", self._leader_mod)],
                        [],
                        tuple(self.keys.topic(self.group, name) for name in gone),
                    )
                    if not ok:
                        self._stale("a topic removal was refused: another replica leads")
                        return
                    for name in gone:
                        published.pop(name, None)
                        had.discard(name)
                await self._apply_batches(broker)
                # A commit (a recorded batch applied here, a check-back) may write to a topic the
                # old leader created just before it died, before its table was copied.
                self._restore_topics(broker, from_etcd=False)
                now = time.monotonic()
                rep = self.hooks.replication if self.hooks is not None else None
                if rep is not None and now - last_progress >= 1.0:
                    last_progress = now
                    await self.etcd.put(
                        self.keys.progress(self.group), rep.status(), lease=self.lease
                    )
            except Exception as exc:
                log.info("cluster_publish_failed", error=str(exc))
            await asyncio.sleep(0.3)

    async def _apply_batches(self, broker: Any) -> None:
        """Apply every batch decision recorded in etcd that this group holds pending members
        of: a batch decided through another group (or through a leader that died before it
        got here) is completed here without anyone asking again."""
        tx = broker.transactions
        head = f"{self.keys.root}batches/"
        for key, entry in list(self.view.table.items()):
            if not key.startswith(head):
                continue
            producer_group, _, batch_key = key[len(head) :].partition("/")
            if (producer_group, batch_key) in tx.batches:
                continue
            if not tx.machine.pending_in_batch(producer_group, batch_key):
                continue
            commit = tx.local_batch_part(producer_group, [str(t) for t in entry.value["commit"]])
            # A pipeline's batch also rolls back the orphans of the pipeline's other runs here.
            pos = entry.value.get("position")
            pipeline = str(pos[0]) if isinstance(pos, list) and pos else None
            try:
                end = tx.decide_batch(producer_group, batch_key, commit, pipeline=pipeline)
            except Exception as exc:  # e.g. a listed transaction was rolled back meanwhile
                log.error(
                    "batch_not_applied",
                    producer_group=producer_group,
                    batch_key=batch_key,
                    error=str(exc),
                )
                continue
            log.warning(
                "batch_applied_from_commit_point",
                producer_group=producer_group,
                batch_key=batch_key,
                committed=len(commit),
            )
            if end is not None:
                await broker.flush.wait_durable(end)

    async def _step_down(self, why: str) -> None:
        async with self._transition:
            await self._step_down_locked(why)

    async def _step_down_locked(self, why: str) -> None:
        if self.role != "leader":
            return
        self._log.warning("stepping_down", reason=why)
        if self.hooks is not None and self.hooks.replication is not None:
            self.hooks.replication.close(why)
        broker, self.leader_broker = self.leader_broker, None
        self.role = "stepping-down"
        if broker is not None:
            await broker.shutdown()
        self.role = "none"
        self.became_leader.clear()
        self.stepped_down.set()
        self._wake.set()

    async def _become_follower(self, leader: Any) -> None:
        if self.follower is None:
            self.follower = FollowerRole(self)
            await self.follower.start()
            self.role = "follower"
        if leader is not None:
            self.follower.follow(leader.ha_addr, leader.epoch)

    async def _stop_roles(self) -> None:
        if self.role == "leader":
            await self._step_down_locked("the broker is shutting down")
        if self.follower is not None:
            await self.follower.stop()
            self.follower = None

    # -- status -----------------------------------------------------------------------------

    def _registry(self) -> CollectorRegistry:
        broker = self.leader_broker
        return broker.metrics.registry if broker is not None else self._follower_metrics

    def readiness(self) -> tuple[bool, str]:
        """``/readyz`` of a replica: a leader that serves and takes writes, or a follower in
        the group's in-sync set (called from the operations port's thread: it reads fields)."""
        role = self.role
        if role == "leader":
            broker = self.leader_broker
            if broker is None:
                return False, "leader, not serving yet"
            ok, why = broker.readiness()
            return ok, f"leader of {self.group}: {why}"
        if role == "follower":
            isr = self.view.isr(self.group)
            if isr is not None and self.replica in isr.members:
                return True, f"in-sync follower of {self.group}"
            return False, f"follower of {self.group}, not in the in-sync set yet"
        if self.obstacle is not None:
            return False, f"cannot serve, not campaigning: {self.obstacle}"
        return False, f"{role}: neither leading nor following"

    def status(self) -> dict[str, Any]:
        st = self.view.status()
        st["self"] = {
            "group": self.group,
            "replicaId": self.replica,
            "role": self.role,
            "addr": self.addr,
        }
        fetcher = self.follower.fetcher if self.follower is not None else None
        if fetcher is not None:
            st["self"]["fetches"] = fetcher.fetches
            st["self"]["streaming"] = fetcher.streaming
        rep = self.hooks.replication if self.hooks is not None and self.role == "leader" else None
        if rep is not None:
            st["self"]["fetchesServed"] = rep.fetches_served
            st["self"]["chunksShared"] = rep.chunks_shared
        return st

    def replication_signer(self) -> Callable[[RemotingCommand], None] | None:
        """With ``aclEnable``, replicas sign replication requests with an admin account of the
        group's shared ``plainAclFile``; with ACL 2.0, as ``initAuthenticationUser``."""
        return replication_signer(self.config)

    def client_ssl(self) -> Any:
        """The TLS context a follower connects to its leader with, when TLS is enforced."""
        return client_ssl(self.config)


def serving_obstacle(host: str, port: int, store_root: str) -> str | None:
    """What keeps a broker from serving on ``host:port`` from ``store_root``, or None: the port
    is bound by another socket, or the store's lock is held by another process (probed and
    released at once)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        probe.bind((host or "0.0.0.0", port))
    except OSError as exc:
        taken = exc.errno == errno.EADDRINUSE
        return f"port {port} on {host or '*'} " + ("is taken" if taken else f"fails: {exc}")
    finally:
        probe.close()
    lock_path = os.path.join(store_root, "lock")
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return None  # a store never opened: nobody holds it
    except OSError as exc:
        return f"store lock {lock_path}: {exc}"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        return f"store {store_root} is locked by another process"
    finally:
        os.close(fd)
    return None


def serve_cluster(config: BrokerConfig) -> int:
    """``txmq broker`` with ``etcdEndpoints`` set: run a cluster node until SIGTERM/SIGINT."""
    return run_until_signal(lambda: ClusterNode(config))
