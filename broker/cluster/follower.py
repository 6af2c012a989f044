"""A following replica: its store, the fetch loop copying the leader's log, and a small server
on the broker port that answers routes and the name server's views, forwards writes (with
``routeWriteReplicas``) and tells clients where the leader is."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import structlog

from txmq.protocol import fastjson
from txmq.protocol.aio import Connection
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import RequestTimeoutError

from ..config import BrokerConfig
from ..processors.tool_views import cluster_info_body, follower_runtime_table, topic_list_body
from ..server import bind_broker_port, store_config, tls_files
from ..store import MessageStore
from .forward import FORWARDED, WriteForwarder
from .replication import EpochHistory, ReplicaFetcher
from .view import ClusterView

log = structlog.get_logger(__name__)

#: A follower's first wait before it reconnects to its leader (doubling to 2 s while it fails;
#: short again once the leader has served).
FOLLOW_RETRY_S = 0.1


#: What a follower answers itself (any other request is forwarded, or told where the leader
#: is): routes, the cluster's status, the name server's views and its own runtime figures.
_FOLLOWER_VIEWS = frozenset(
    {
        RequestCode.GET_ROUTEINFO_BY_TOPIC,
        RequestCode.TXMQ_CLUSTER_STATUS,
        RequestCode.GET_BROKER_CLUSTER_INFO,
        RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
        RequestCode.GET_TOPICS_BY_CLUSTER,
        RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS,
        RequestCode.GET_BROKER_RUNTIME_INFO,
    }
)


class FollowingNode(Protocol):
    """What a follower asks of its cluster node (:class:`~txmq.broker.cluster.node.ClusterNode`)."""

    config: BrokerConfig
    view: ClusterView
    group: str
    replica: int
    port: int
    store_host: tuple[str, int]

    def client_ssl(self) -> Any: ...

    def replication_signer(self) -> Callable[[RemotingCommand], None] | None: ...

    def leader_reached(self) -> None: ...

    def leader_refused(self, ha_addr: str, epoch: int, *, silent: bool = False) -> None: ...

    def status(self) -> dict[str, Any]: ...


class FollowerRole:
    """A following replica: its store, the fetch loop and a server that redirects clients."""

    def __init__(self, node: FollowingNode) -> None:
        self.node = node
        cfg = node.config
        self.store = MessageStore(store_config(cfg), node.store_host)
        self.epochs = EpochHistory(cfg.store_path_root_dir)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txmq-replica")
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self.target: tuple[str, int] | None = None
        self.fetcher: ReplicaFetcher | None = None
        self._connections: set[Connection] = set()
        self.acl: Any = None
        self.forwarder = (
            WriteForwarder(node.view, node.group, node.replica, node.client_ssl, cfg.max_frame_size)
            if cfg.route_write_replicas
            else None
        )

    async def start(self) -> None:
        await self.run_blocking(self.store.load)
        self.epochs.load()
        if self.node.config.acl_enable:
            from ..acl import AclManager

            acl = AclManager(self.node.config.plain_acl_file)
            await self.run_blocking(acl.load)
            self.acl = acl
        elif self.node.config.authentication_enabled:
            from ..auth2 import Auth2Manager

            # ACL 2.0: the users and policies its leader's copy (replicated with the other
            # state files) holds
            auth = Auth2Manager(
                os.path.join(self.node.config.store_path_root_dir, "config", "auth.json"),
                authorization=self.node.config.authorization_enabled,
                cluster=self.node.config.broker_cluster_name,
            )
            await self.run_blocking(auth.load)
            self.acl = auth
        cfg = self.node.config
        tls = None
        if cfg.tls_server_mode != "disabled":
            # The broker port keeps its TLS rule whichever role the replica has.
            from ..tls import ServerTls

            tls = ServerTls(tls_files(cfg))
            await self.run_blocking(tls.load)
        server = await bind_broker_port(cfg, self.node.port, self._new_connection, tls)
        await server.start_serving()
        self._server = server
        self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())
        log.info("follower_started", group=cfg.broker_name, replica=cfg.broker_id)

    async def run_blocking(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def follow(self, addr: str, epoch: int) -> None:
        if self.target == (addr, epoch) and self._task is not None and not self._task.done():
            return
        self.target = (addr, epoch)
        if self._task is not None:
            self._task.cancel()
        self._task = asyncio.get_running_loop().create_task(
            self._follow(addr, epoch), name="txmq-replica-fetch"
        )

    async def _follow(self, addr: str, epoch: int) -> None:
        cfg = self.node.config
        delay = FOLLOW_RETRY_S
        #: This leader answered a handshake once: it served this epoch.
        served = False

        def connected() -> None:
            nonlocal served
            served = True
            self.node.leader_reached()

        while True:
            self.fetcher = ReplicaFetcher(
                self.store,
                self.epochs,
                addr,
                cfg.broker_name,
                cfg.broker_id,
                epoch,
                segment_size=cfg.mapped_file_size_commit_log,
                sync=cfg.sync_flush,
                run_blocking=self.run_blocking,
                ssl=self.node.client_ssl(),
                signer=self.node.replication_signer(),
                on_connected=connected,
            )
            try:
                await self.fetcher.run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("replica_fetch_failed", leader=addr, epoch=epoch, error=str(exc))
                if served and isinstance(exc.__cause__, ConnectionRefusedError):
                    # Nothing listens any more on the port of a leader that served this epoch:
                    # its process is gone (one just elected may not listen yet, hence
                    # "served"). Say so in etcd.
                    self.node.leader_refused(addr, epoch)
                elif served and isinstance(exc, RequestTimeoutError):
                    # It served this epoch and now does not answer (paused, its host or
                    # network gone, or only slow): say so too; it is deposed only if its
                    # lease also goes unrenewed (ClusterNode._depose).
                    self.node.leader_refused(addr, epoch, silent=True)
            if self.fetcher.fetches:
                delay = FOLLOW_RETRY_S  # it served: a new failure starts from the short wait
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _flush_loop(self) -> None:
        cfg = self.node.config
        while True:
            await asyncio.sleep(cfg.flush_interval_commit_log / 1000.0)
            try:
                await self.run_blocking(self.store.flush)
                await self.run_blocking(self.store.flush_consume_queues)
            except Exception as exc:
                log.error("follower_flush_failed", error=repr(exc))

    def _new_connection(self) -> Connection:
        conn = Connection(
            self._handle,
            max_frame_size=self.node.config.max_frame_size,
            on_close=self._connections.discard,
        )
        self._connections.add(conn)
        return conn

    async def _handle(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        node = self.node
        if self.acl is not None and (
            cmd.code in _FOLLOWER_VIEWS or (self.forwarder is not None and cmd.code in FORWARDED)
        ):
            # A follower serves no messages; routes, the cluster status and the name server's
            # views go to any valid account (the leader checks topic permissions on everything
            # else). A request it forwards is authenticated here against the client's own
            # address first: the leader sees the follower's address, which must not stand in
            # for the client's (whiteRemoteAddress, globalWhiteRemoteAddresses).
            from txmq.protocol.acl import ACCESS_KEY, verify_signature

            from ..acl import AclDenied

            ext = cmd.ext_fields
            ak = ext.get(ACCESS_KEY)
            if not node.config.acl_enable:
                await self.run_blocking(self.acl.poll)  # ACL 2.0: the leader's latest copy
            try:
                self.acl.authenticate(
                    conn.peer[0],
                    ak if isinstance(ak, str) else None,
                    lambda a: verify_signature(ext, cmd.body, a.secret_key),
                    f"request code {cmd.code}",
                    {"peer": f"{conn.peer[0]}:{conn.peer[1]}", "code": cmd.code},
                )
            except AclDenied as exc:
                return cmd.response(ResponseCode.NO_PERMISSION, str(exc))
        if cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            topic = str(cmd.ext_fields.get("topic", ""))
            route = node.view.route(topic)
            if route is None:
                return cmd.response(
                    ResponseCode.TOPIC_NOT_EXIST,
                    f"No topic route info in name server for the topic: {topic}",
                )
            return cmd.response(body=json.dumps(route).encode())
        if cmd.code == RequestCode.TXMQ_CLUSTER_STATUS:
            return cmd.response(body=json.dumps(node.status()).encode())
        named = self._name_server_view(cmd)
        if named is not None:
            return named
        if cmd.code in (RequestCode.HEART_BEAT, RequestCode.UNREGISTER_CLIENT):
            return cmd.response()
        if self.forwarder is not None and cmd.code in FORWARDED:
            return await self.forwarder.forward(cmd)
        leader = node.view.leader(node.group)
        where = f"its leader is at {leader.addr}" if leader else "no leader is elected yet"
        return cmd.response(
            ResponseCode.SERVICE_NOT_AVAILABLE,
            f"this broker is a follower in broker group {node.group!r}; {where}",
        )

    def _name_server_view(self, cmd: RemotingCommand) -> RemotingCommand | None:
        """A follower is a name server too (clients may list any replica's address): the
        cluster's views from the watched copy, and its own runtime figures (it serves no
        clients: ``brokerActive`` false, no traffic)."""
        view, cfg = self.node.view, self.node.config
        code = cmd.code
        if code == RequestCode.GET_BROKER_CLUSTER_INFO:
            return cmd.response(body=cluster_info_body(view.cluster, view.broker_addrs()))
        if code == RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER:
            return cmd.response(body=topic_list_body(view.topic_names()))
        if code == RequestCode.GET_TOPICS_BY_CLUSTER:
            known = cmd.ext_fields.get("cluster") == view.cluster
            return cmd.response(body=topic_list_body(view.topic_names() if known else ()))
        if code == RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS:
            groups = view.broker_addrs()
            leader = next((a[0] for _, a in sorted(groups.items()) if 0 in a), None)
            return cmd.response(body=topic_list_body([view.cluster, *groups], leader))
        if code == RequestCode.GET_BROKER_RUNTIME_INFO:
            table = follower_runtime_table(cfg, self.store)
            return cmd.response(body=fastjson.dumps({"table": table}).encode())
        return None

    async def stop(self) -> None:
        if self.forwarder is not None:
            await self.forwarder.close()
        for t in (self._task, self._flusher):
            if t is not None:
                t.cancel()
                await asyncio.wait({t}, timeout=5.0)
        if self._server is not None:
            self._server.close()
            for c in list(self._connections):
                c.close()
            await asyncio.wait({asyncio.ensure_future(self._server.wait_closed())}, timeout=5.0)
        await self.run_blocking(self.store.close)
        self._executor.shutdown(wait=True)
        log.info("follower_stopped", group=self.node.group)
