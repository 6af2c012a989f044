"""The composition root: :class:`BrokerController` builds every broker component from one
frozen :class:`~txmq.broker.config.BrokerConfig` and serves the remoting protocol over TCP.

Startup order matters for durability: bind (so the advertised port is known), recover the store
(cut torn tails, rebuild consume queues), rebuild the transaction table from the half and op
queues, start the flush and check services, then accept clients.  Shutdown runs the other way:
stop accepting, answer parked pulls, finish in-flight requests, stop services, flush, close.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import functools
import gc
import ipaddress
import os
import resource
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

import structlog

from txmq import __version__
from txmq.protocol.aio import AnswerTooLargeError, Connection, ConnectionLimits, Drop
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.errors import ProtocolError, TxmqError
from txmq.protocol.message import MessageExt
from txmq.protocol.rocketmq_codes import not_supported_remark
from txmq.protocol.topics import INTERNAL_TOPICS

from . import runtime_config
from .acl import CONTEXT_KEY as ACL_KEY
from .acl import AclConfigError, AclManager
from .auth2 import Auth2Manager, Auth2Processor
from .clients import ClientManager
from .config import BrokerConfig, ConfigError, attr_name, delay_levels
from .context import BrokerContext, Lifecycle
from .flush import FlushService
from .messaging.admission import SendAdmission
from .messaging.core import MessagingCore
from .messaging.hold import PullRequestHoldService
from .messaging.index import MessageIndexService, open_message_index
from .messaging.locks import QueueLockTable
from .messaging.timer import TimerService
from .messaging.trace import BrokerTrace
from .messaging.write import WritePath
from .metrics import BrokerMetrics
from .metrics_scrape import BrokerFigures
from .ops import OpsServer, start_ops_server
from .ports import ClusterPort, ReplicationPort
from .processors.admin import AdminProcessor
from .processors.groups import GroupViewProcessor
from .processors.lock import LockProcessor
from .processors.pop import PopMessageProcessor
from .processors.pull import PullMessageProcessor
from .processors.query import QueryMessageProcessor
from .processors.send import SendMessageProcessor
from .processors.tool_views import ToolViewProcessor
from .processors.transaction import TransactionProcessor
from .quota import QuotaLimits, QuotaManager
from .schedule import ScheduleMessageService
from .scrub import CommitLogScrub
from .stats import BrokerStats, Counts
from .store import (
    AppendResult,
    ConsumerOffsetManager,
    EncodedMessage,
    MessageStore,
    PutMessageResult,
    StoreConfig,
    TopicConfigManager,
)
from .store.subscription_group import SubscriptionGroupManager
from .tls import ServerTls, TlsConfigError, TlsFiles, TlsServer
from .topics import TopicManager, config_from_queues
from .transaction.check import CheckLimits
from .transaction.service import CheckSender, TransactionalMessageService

log = structlog.get_logger(__name__)

T = TypeVar("T")


@functools.lru_cache(maxsize=16)
def _ipv4_of(host: str) -> str:
    """``brokerIP1`` may be a host name; stored messages and message ids carry an IPv4 address,
    so it is resolved here, once (the protocol package does no lookups)."""
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        log.warning("broker_ip_unresolved", host=host, error=str(exc), using="127.0.0.1")
        return "127.0.0.1"


def store_config(cfg: BrokerConfig) -> StoreConfig:
    """The store settings of a broker configuration: each one the broker setting of the same
    name, but a stored message may be up to 64 KiB larger than ``maxMessageSize`` (the
    broker's own properties and headers)."""
    settings = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(StoreConfig)}
    settings["max_message_size"] = cfg.max_message_size + 64 * 1024
    return StoreConfig(**settings)


def tls_files(cfg: BrokerConfig) -> TlsFiles:
    """The ``tls.server.*`` files of a broker configuration."""
    return TlsFiles(
        cfg.tls_server_cert_path,
        cfg.tls_server_key_path,
        cfg.tls_server_trust_cert_path,
        cfg.tls_server_need_client_auth,
    )


def _grpc_server_class(cfg: BrokerConfig) -> Any:
    """The gRPC front end's server class when ``grpcServerEnable`` is on (its extra must be
    installed), else None."""
    if not cfg.grpc_server_enable:
        return None
    try:
        from .grpc.server import GrpcServer
    except ImportError as exc:
        raise RuntimeError(
            "grpcServerEnable needs the grpc extra (pip install -e '.[grpc]' in the "
            f"checkout, or the wheel with [grpc]): {exc}"
        ) from exc
    return GrpcServer


def _restore_topics_from_store(store: MessageStore, topics: TopicManager) -> None:
    """The topic table was lost with its backup: give every topic the store has queues
    of a config again (as many queues as it has, read and write), logged per topic."""
    for name in store.topics():
        if name in INTERNAL_TOPICS or topics.get(name) is not None:
            continue
        tc = topics.create_or_update(config_from_queues(name, store.queue_ids(name)))
        log.warning("topic_restored", topic=name, queues=tc.write_queue_nums, source="store")


async def bind_broker_port(
    cfg: BrokerConfig,
    port: int,
    protocol_factory: Callable[[], asyncio.Protocol],
    tls: ServerTls | None,
    on_rejected: Callable[[str, str], None] | None = None,
) -> asyncio.Server | TlsServer:
    """The listener of the broker port (``bindAddress``:``port``), not serving yet: TLS by
    ``tls.server.mode`` with ``tls``, plain TCP without.  Raises OSError."""
    if tls is None:
        return await asyncio.get_running_loop().create_server(
            protocol_factory, cfg.bind_address, port, start_serving=False, reuse_address=True
        )
    return await TlsServer.bind(
        cfg.bind_address,
        port,
        protocol_factory,
        tls,
        mode=cfg.tls_server_mode,
        handshake_timeout=cfg.tls_handshake_timeout,
        first_byte_timeout=cfg.channel_expired_timeout / 1000.0,
        on_rejected=on_rejected,
    )


#: Bytes of answers a client may leave unread before its next request waits for it to read
#: them (``maxConnectionWriteBuffer`` when smaller): what a client that stops reading holds.
ANSWER_WINDOW = 1024 * 1024

Processor = Callable[[Connection, RemotingCommand], Awaitable[RemotingCommand | None]]

#: Requests still served while shutting down (answers to in-flight transactions).
_SHUTDOWN_ALLOWED = frozenset({RequestCode.END_TRANSACTION, RequestCode.UNREGISTER_CLIENT})


class PortInUseError(OSError):
    """Another process already listens on the broker's port."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(errno.EADDRINUSE, f"port {port} on {host} is already in use")
        self.host = host
        self.port = port


class BrokerController:
    """One broker: store, services and TCP server.

    Args:
        config: the resolved configuration.
        clock: wall clock in seconds (store timestamps, transaction ages); a seam for tests.
        check_sender: how CHECK_TRANSACTION_STATE reaches a producer; a seam for tests.
    """

    version = __version__

    def __init__(
        self,
        config: BrokerConfig,
        *,
        clock: Callable[[], float] = time.time,
        check_sender: CheckSender | None = None,
        cluster: ClusterPort | None = None,
    ) -> None:
        self.config = config
        #: Cluster mode: the node's hooks (routes from etcd, status); None for a single node.
        self.cluster = cluster
        #: Cluster mode: builds the leader's replication once the store is open, and what to
        #: do just before clients are served (record the new epoch).
        self.make_replication: (
            Callable[[BrokerContext, TransactionalMessageService], ReplicationPort] | None
        ) = None
        self.before_serving: Callable[[], None] | None = None
        #: The leader's replication (cluster mode), None otherwise.
        self.replication: ReplicationPort | None = None
        self.lifecycle = Lifecycle()
        #: The operations port (``metricsPort``): /metrics, /healthz, /readyz.
        self.ops: OpsServer | None = None
        self._serving = False
        #: What one client connection may hold of the broker.
        self._limits = ConnectionLimits(
            max_write_buffer=config.max_connection_write_buffer,
            frame_timeout=config.frame_read_timeout / 1000.0,
            answer_window=min(config.max_connection_write_buffer, ANSWER_WINDOW),
            write_stall_timeout=config.client_write_stall_timeout / 1000.0,
            first_frame_timeout=config.client_first_frame_timeout / 1000.0,
            on_dropped=self._connection_dropped,
        )
        self.clock = clock
        self.metrics = BrokerMetrics()
        self.delay_levels = delay_levels(config.message_delay_level)
        self._check_sender = check_sender
        self._server: asyncio.AbstractServer | TlsServer | None = None
        #: The TLS context in force (``tls.server.mode`` not disabled); None when off.
        self.tls: ServerTls | None = None
        self._connections: set[Connection] = set()
        self._tasks: list[asyncio.Task[None]] = []
        #: Blocking work that must not run on the event loop: state-file writes (offsets, topic
        #: configs, transaction check state) and retention.  One thread keeps them in order.
        self._meta_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txmq-meta")
        self._stopped = asyncio.Event()
        self.port = config.listen_port
        self.started_monotonic = time.monotonic()
        self.recovery: dict[str, Any] = {}
        #: The RocketMQ 5 gRPC front end (``grpcServerEnable``) and its bound port.
        self.grpc: Any = None
        self.grpc_port = 0
        #: The ACL in force (``aclEnable``); None when off, so the dispatch pays one check.
        self.acl: AclManager | None = None
        self.index: MessageIndexService | None = None
        #: The commit-log scrub (None: commitLogScrubBytesPerSecond is 0).
        self.scrub: CommitLogScrub | None = None
        #: Produce, consume and connection quotas; None when none can apply.
        self.quota: QuotaManager | None = None

    # -- addresses ------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """Where a client on this machine connects."""
        host = self.config.bind_address
        if host in ("0.0.0.0", "", "::"):
            host = "127.0.0.1"
        return f"{host}:{self.port}"

    @property
    def advertised_address(self) -> str:
        return f"{self.config.broker_i_p1}:{self.port}"

    @property
    def store_host(self) -> tuple[str, int]:
        return (_ipv4_of(self.config.broker_i_p1), self.port)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Build the broker in dependency order, each part from what it needs, and serve:
        the settings; what a bad setting or file refuses (gRPC, ACL, TLS), before the port or
        the store opens; the port; the store and its tables; the context every component gets;
        the components and their recovery; replication; then clients."""
        # settings an operator changed at run time (txmq config set) apply over the file's
        self.config = cfg = await self.in_background(
            functools.partial(runtime_config.load_saved, self.config)
        )
        grpc_server = _grpc_server_class(cfg)
        self.acl = await self._load_acl(cfg)
        self.tls = await self._load_tls(cfg)
        self._server = await self._bind(cfg, self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        self.store = self._open_store(cfg, self._server)
        self.offsets = self._open_offsets(cfg, self.store)
        groups = self._open_groups(cfg)
        self.topics = self._open_topics(cfg, self.store)
        ctx = self.ctx = self._context(cfg, self.store, self.offsets, groups, self.topics)
        await self._build_components(ctx)
        self._processors = self.metrics.timed(self._build_processors())
        self._start_replication(ctx)
        self._subscribe_to_appends(ctx)
        await self._serve(cfg, self._server, grpc_server)

    async def _load_acl(self, cfg: BrokerConfig) -> AclManager | None:
        """The ACL in force: ``aclEnable``'s file, or ACL 2.0's users and policies."""
        if cfg.acl_enable:
            acl = AclManager(cfg.plain_acl_file)
            try:
                await self.in_background(acl.load)
            except AclConfigError as exc:
                raise ConfigError(f"aclEnable: {exc}") from None
            return acl
        if cfg.authentication_enabled:
            return await self._auth2(cfg)
        return None

    async def _load_tls(self, cfg: BrokerConfig) -> ServerTls | None:
        """The TLS context of the broker port, unless ``tls.server.mode`` is disabled."""
        if cfg.tls_server_mode == "disabled":
            return None
        tls = ServerTls(tls_files(cfg))
        try:
            await self.in_background(tls.load)
        except TlsConfigError as exc:
            raise ConfigError(f"tls.server.mode = {cfg.tls_server_mode}: {exc}") from None
        return tls

    async def _bind(self, cfg: BrokerConfig, tls: ServerTls | None) -> asyncio.Server | TlsServer:
        """The broker port, bound (so the advertised port is known) but not serving yet."""
        try:
            return await bind_broker_port(
                cfg, cfg.listen_port, self._new_connection, tls, self._tls_rejected
            )
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(cfg.bind_address, cfg.listen_port) from exc
            raise

    def _open_store(self, cfg: BrokerConfig, server: asyncio.Server | TlsServer) -> MessageStore:
        """The message store, recovered (the port closed again when it cannot be)."""
        os.makedirs(cfg.store_path_root_dir, exist_ok=True)
        store = MessageStore(store_config(cfg), self.store_host, clock=self.clock)
        try:
            report = store.load()
        except BaseException:
            server.close()
            raise
        self.recovery["store"] = report
        return store

    def _open_offsets(self, cfg: BrokerConfig, store: MessageStore) -> ConsumerOffsetManager:
        root = cfg.store_path_root_dir
        offsets = ConsumerOffsetManager(os.path.join(root, "config", "consumerOffset.json"))
        offsets.load()
        # Offsets consumers committed are offsets handed out: never again (a log cut shorter
        # than them by a failed disk goes on above them).
        skipped = store.raise_queue_floors(offsets.highest(), source="consumer offsets")
        for (topic, qid), n in skipped.items():
            self.metrics.queue_offsets_skipped.labels(topic, str(qid)).inc(n)
        self.recovery["queue_offsets_skipped"] = sum(skipped.values())
        return offsets

    def _open_groups(self, cfg: BrokerConfig) -> SubscriptionGroupManager:
        groups = SubscriptionGroupManager(
            os.path.join(cfg.store_path_root_dir, "config", "subscriptionGroup.json"),
            default_retry_max_times=lambda: self.config.max_reconsume_times,
        )
        groups.load()
        return groups

    def _open_topics(self, cfg: BrokerConfig, store: MessageStore) -> TopicManager:
        path = os.path.join(cfg.store_path_root_dir, "config", "topics.json")
        table = TopicConfigManager(path, write_behind=True)
        table.load()
        topics = TopicManager(
            table,
            auto_create=cfg.auto_create_topic_enable,
            default_queue_nums=cfg.default_topic_queue_nums,
            delay_levels=len(self.delay_levels),
        )
        if table.damaged:
            _restore_topics_from_store(store, topics)
        return topics

    def _context(
        self,
        cfg: BrokerConfig,
        store: MessageStore,
        offsets: ConsumerOffsetManager,
        groups: SubscriptionGroupManager,
        topics: TopicManager,
    ) -> BrokerContext:
        """Everything the components get, in one piece, before any of them is built: the
        store and its tables, the clients, the flusher and the write path."""
        acl = self.acl
        self.clients = ClientManager(
            # the transaction service is built with the context, after it
            on_producer_registered=lambda group: self.transactions.on_producer_registered(group),
            producer_filter=acl.may_produce if acl is not None else None,
        )
        self.flush = FlushService(
            store,
            sync=cfg.sync_flush,
            interval_ms=cfg.flush_interval_commit_log,
            sync_timeout_ms=cfg.sync_flush_timeout,
            metrics=self.metrics,
        )
        self.write = WritePath(store, self.metrics)
        return BrokerContext(
            config=cfg,
            clock=self.clock,
            metrics=self.metrics,
            store=store,
            store_host=self.store_host,
            offsets=offsets,
            groups=groups,
            topics=topics,
            clients=self.clients,
            flush=self.flush,
            write=self.write,
            hold=PullRequestHoldService(),
            delay_levels=self.delay_levels,
            in_background=self.in_background,
            lifecycle=self.lifecycle,
            cluster=self.cluster,
        )

    async def _build_components(self, ctx: BrokerContext) -> None:
        """The transaction service, the messaging core and the services around them, then
        what each rebuilds from the store (transactions, the duplicate window, timers)."""
        cfg = ctx.config
        #: the message trace (``traceTopicEnable``): the send use cases and the transaction
        #: service report to the same one
        trace = BrokerTrace(ctx) if cfg.trace_topic_enable else None
        self.transactions = TransactionalMessageService(ctx, self._check_sender, trace)
        if self.acl is not None:
            # The ACL is read before the port is bound (a bad file stops the start before
            # anything opens); the transactions it looks decisions up in exist only now.
            self.acl.transactions = self.transactions
        self.timer = TimerService(ctx)
        self.quota = self._quotas()
        # a send's permission and produce quota: the send use case's, for both front ends
        admission = (
            SendAdmission(self.acl, self.quota)
            if self.acl is not None or self.quota is not None
            else None
        )
        self.core = MessagingCore(
            ctx, self.transactions, trace, timer=self.timer, admission=admission
        )
        self.schedule = ScheduleMessageService(
            ctx.store, ctx.offsets, ctx.write, self.clock, self.delay_levels
        )
        # Told of every append, in this order: the flusher, replication, parked long polls,
        # the delay levels, the message index, the timers (_subscribe_to_appends).
        ctx.write.subscribe(ctx.flush)
        self.sender = SendMessageProcessor(self.core)
        self.puller = PullMessageProcessor(ctx, self.core.reads)
        self.admin = AdminProcessor(ctx, self.transactions, self.advertised_address)
        self.tx_processor = TransactionProcessor(self.core, self.cluster)
        self.locks = QueueLockTable(ctx.clock)
        self.locker = LockProcessor(self.locks)
        self.index = await open_message_index(cfg, ctx.store, self.in_background)
        self.recovery["transactions"] = self.transactions.load()
        self.recovery["dedup_keys"] = self.core.recover()
        self.recovery["timers"] = self.timer.recover()
        self.stats = BrokerStats(self._traffic_counts)

    def _start_replication(self, ctx: BrokerContext) -> None:
        """Cluster mode: the leader's replication, built once the store is open; the flusher
        (built before it, in the context) waits on it for durability."""
        if self.make_replication is None:
            return
        rep = self.replication = self.make_replication(ctx, self.transactions)
        self.flush.replication = rep
        ctx.write.subscribe(rep)
        self._processors.update(rep.processors())
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(rep.run(), name="txmq-replication"))

    def _subscribe_to_appends(self, ctx: BrokerContext) -> None:
        self.metrics.watch(BrokerFigures(ctx, self.transactions, lambda: self.replication))
        if self.replication is None:
            ctx.write.subscribe(ctx.hold)  # a leader's replication wakes them once confirmed
        ctx.write.subscribe(self.schedule)
        if self.index is not None:
            ctx.write.subscribe(self.index)
            self.index.start()
        ctx.write.subscribe(self.timer)

    async def _serve(
        self, cfg: BrokerConfig, server: asyncio.Server | TlsServer, grpc_server: Any
    ) -> None:
        """Start the services, then take clients (remoting, and gRPC when enabled)."""
        if self.before_serving is not None:
            self.before_serving()
        self.flush.start()
        self.schedule.start()
        self.timer.start()
        self.transactions.start()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._housekeeping(), name="txmq-housekeeping"))
        if cfg.commit_log_scrub_bytes_per_second > 0:
            self.scrub = CommitLogScrub(
                self.store,
                self.in_background,
                cfg.commit_log_scrub_bytes_per_second,
                cfg.commit_log_scrub_interval_seconds,
                on_damaged=self.metrics.scrub_damaged.set,
                on_checked=self.metrics.scrub_bytes.inc,
            )
            self._tasks.append(loop.create_task(self.scrub.run(), name="txmq-scrub"))
        if self.cluster is None:  # a replica's node serves the port for all its roles
            self.ops = start_ops_server(cfg, lambda: self.metrics.registry, self.readiness)
        if grpc_server is not None:
            self.grpc = grpc_server(self.core, self.acl, self.tls, self.quota)
            self.grpc_port = await self.grpc.start()
        self.started_monotonic = time.monotonic()
        await server.start_serving()
        self._serving = True
        log.info(
            "broker_started",
            address=self.address,
            advertised=self.advertised_address,
            store=cfg.store_path_root_dir,
            flush=cfg.flush_disk_type,
            version=self.version,
            tls=cfg.tls_server_mode,
            max_phy_offset=self.store.max_phy_offset,
            pending_transactions=len(self.transactions.pending),
        )

    async def _auth2(self, cfg: BrokerConfig) -> Auth2Manager:
        """ACL 2.0's users and policies, read from the store (and the initial super user)."""
        auth = Auth2Manager(
            os.path.join(cfg.store_path_root_dir, "config", "auth.json"),
            authorization=cfg.authorization_enabled,
            cluster=cfg.broker_cluster_name,
        )
        try:
            await self.in_background(auth.load)
            if cfg.init_authentication_user:
                await self.in_background(
                    functools.partial(auth.init_user, cfg.init_authentication_user)
                )
        except AclConfigError as exc:
            raise ConfigError(f"authenticationEnabled: {exc}") from None
        if not any(u.super for u in auth.state.users.values()):
            log.warning(
                "auth_no_super_user",
                file=auth.path,
                hint="no user can manage users and policies: set initAuthenticationUser",
            )
        return auth

    def _quotas(self) -> QuotaManager | None:
        cfg, acl = self.config, self.acl
        defaults = QuotaLimits(
            cfg.quota_produce_byte_rate, cfg.quota_consume_byte_rate, cfg.quota_max_connections
        )
        if acl is None and not any(vars(defaults).values()):
            return None
        return QuotaManager(
            defaults,
            cfg.quota_max_throttle_ms / 1000.0,
            self.clock,
            acl.quota_of if acl is not None else lambda _: None,
            self.metrics.registry,
        )

    def _traffic_counts(self) -> Counts:
        """What :class:`BrokerStats` samples: the store's puts and reads, the messages stored
        per topic and returned per topic and group."""
        st = self.store.stats()
        out = {f"{t}@{g}": n for (t, g), n in self.metrics.out_by_topic_group().items()}
        return Counts(
            put=int(st["put_messages_total"]),
            out=sum(out.values()),
            get_found=int(st["get_found_total"]),
            get_miss=int(st["get_miss_total"]),
            put_by_topic=self.metrics.puts_by_topic(),
            out_by_key=out,
        )

    def served_request_codes(self) -> frozenset[int]:
        """The remoting request codes this broker serves (every other one is answered
        REQUEST_CODE_NOT_SUPPORTED, naming it)."""
        return frozenset(self._processors)

    def _build_processors(self) -> dict[int, Processor]:
        s, p, a, t = self.sender, self.puller, self.admin, self.tx_processor
        g = GroupViewProcessor(self.ctx, self.update_config, self.core.pop.reset, stats=self.stats)
        pop = PopMessageProcessor(self.core)
        v = ToolViewProcessor(self.ctx, self.transactions, self.advertised_address, self.stats)
        R = RequestCode
        auth = self.acl if isinstance(self.acl, Auth2Manager) else None
        return Auth2Processor(auth, self.in_background).processors() | {
            R.SEND_MESSAGE: s.send_message,
            R.SEND_MESSAGE_V2: s.send_message,
            R.SEND_BATCH_MESSAGE: s.send_batch,
            R.CONSUMER_SEND_MSG_BACK: s.consumer_send_msg_back,
            R.RECALL_MESSAGE: s.recall_message,
            R.PULL_MESSAGE: p.pull_message,
            R.HEART_BEAT: a.heart_beat,
            R.UNREGISTER_CLIENT: a.unregister_client,
            R.GET_CONSUMER_LIST_BY_GROUP: a.get_consumer_list_by_group,
            R.CHECK_CLIENT_CONFIG: a.check_client_config,
            R.QUERY_CONSUMER_OFFSET: a.query_consumer_offset,
            R.UPDATE_CONSUMER_OFFSET: a.update_consumer_offset,
            R.GET_MAX_OFFSET: a.get_max_offset,
            R.GET_MIN_OFFSET: a.get_min_offset,
            R.SEARCH_OFFSET_BY_TIMESTAMP: a.search_offset_by_timestamp,
            R.VIEW_MESSAGE_BY_ID: a.view_message_by_id,
            R.QUERY_MESSAGE: QueryMessageProcessor(self.ctx, self.index).query_message,
            R.UPDATE_AND_CREATE_TOPIC: a.update_and_create_topic,
            R.GET_ALL_TOPIC_CONFIG: a.get_all_topic_config,
            R.GET_ROUTEINFO_BY_TOPIC: a.get_route_info_by_topic,
            R.GET_TOPIC_STATS_INFO: v.get_topic_stats_info,
            R.GET_BROKER_RUNTIME_INFO: v.get_broker_runtime_info,
            R.GET_BROKER_CLUSTER_INFO: v.get_broker_cluster_info,
            R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: v.get_all_topic_list,
            R.GET_TOPICS_BY_CLUSTER: v.get_topics_by_cluster,
            R.GET_SYSTEM_TOPIC_LIST_FROM_NS: v.get_system_topic_list_from_ns,
            R.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: v.get_system_topic_list_from_broker,
            R.QUERY_TOPIC_CONSUME_BY_WHO: v.query_topic_consume_by_who,
            R.QUERY_TOPICS_BY_CONSUMER: v.query_topics_by_consumer,
            R.VIEW_BROKER_STATS_DATA: v.view_broker_stats_data,
            R.GET_TOPIC_CONFIG: v.get_topic_config,
            R.TXMQ_GET_METRICS: a.get_metrics,
            R.END_TRANSACTION: t.end_transaction,
            R.RESUME_CHECK_HALF_MESSAGE: t.resume_check_half_message,
            R.TXMQ_LIST_TRANSACTIONS: t.list_transactions,
            R.TXMQ_GET_TRANSACTION: t.get_transaction,
            R.TXMQ_FORCE_DECIDE: t.force_decide,
            R.TXMQ_DECIDE_BATCH: t.decide_batch,
            R.TXMQ_CLUSTER_STATUS: a.cluster_status,
            R.GET_CONSUME_STATS: g.get_consume_stats,
            R.GET_CONSUMER_CONNECTION_LIST: g.get_consumer_connection_list,
            R.GET_PRODUCER_CONNECTION_LIST: g.get_producer_connection_list,
            R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: g.update_subscription_group,
            R.GET_SUBSCRIPTIONGROUP_CONFIG: g.get_subscription_group,
            R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: g.get_all_subscription_group_config,
            R.DELETE_SUBSCRIPTIONGROUP: g.delete_subscription_group,
            R.DELETE_TOPIC_IN_BROKER: a.delete_topic_in_broker,
            R.INVOKE_BROKER_TO_RESET_OFFSET: g.reset_offset,
            R.GET_BROKER_CONFIG: g.get_broker_config,
            R.UPDATE_BROKER_CONFIG: g.update_broker_config,
            R.POP_MESSAGE: pop.pop_message,
            R.ACK_MESSAGE: pop.ack_message,
            R.CHANGE_MESSAGE_INVISIBLETIME: pop.change_invisible_time,
            R.BATCH_ACK_MESSAGE: pop.batch_ack_message,
            R.LOCK_BATCH_MQ: self.locker.lock_batch_mq,
            R.UNLOCK_BATCH_MQ: self.locker.unlock_batch_mq,
        }

    async def update_config(self, changes: dict[str, str]) -> BrokerConfig:
        """Apply settings changed at run time (RocketMQ key names) and keep them in the store.

        Raises:
            ConfigError: a key that cannot change while the broker runs, or a bad value; nothing
                changed.
            OSError: the change could not be kept in the store (nothing changed).
        """
        new = runtime_config.updated(self.config, changes, "updateBrokerConfig")
        try:
            store_cfg = store_config(new)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        await self.in_background(functools.partial(runtime_config.save, new, changes))
        old, self.config = self.config, new
        self.ctx.reconfigure(new)
        self.store.config = store_cfg
        self.topics.auto_create = new.auto_create_topic_enable
        self.transactions.checks.set_limits(CheckLimits.of(new))
        for key in sorted(changes):
            attr = attr_name(key)
            log.warning("config_changed", key=key, old=getattr(old, attr), new=getattr(new, attr))
        return new

    async def shutdown(self) -> None:
        """Graceful stop: no new connections, parked pulls answered, in-flight requests
        finished (up to ``shutdownTimeout`` s), services stopped, everything flushed."""
        if self.lifecycle.shutting_down:
            await self._stopped.wait()
            return
        self.lifecycle.shutting_down = True
        if self.replication is not None:
            self.replication.close("the broker is shutting down")
        log.info("broker_stopping", connections=len(self._connections))
        if self._server is not None:
            self._server.close()
        self.ctx.hold.wake_all()
        if self.grpc is not None:
            await self.grpc.stop()
        inflight = [c.wait_handlers() for c in list(self._connections)]
        if inflight:
            done = await asyncio.wait(
                [asyncio.ensure_future(x) for x in inflight], timeout=self.config.shutdown_timeout
            )
            if done[1]:
                log.warning("shutdown_requests_abandoned", count=len(done[1]))
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            _, stuck = await asyncio.wait(self._tasks, timeout=self.config.shutdown_timeout)
            if stuck:
                log.warning("shutdown_tasks_did_not_stop", tasks=[t.get_name() for t in stuck])
        # Each step runs even when one before it fails (a read-only or failed disk).
        steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("transactions", self.transactions.stop),
            ("schedule", self.schedule.stop),
            ("timer", self.timer.stop),
            ("flush", self.flush.stop),
            ("offsets", lambda: self.in_background(self.offsets.persist)),
            ("topics", self.persist_topics),
        ]
        if self.index is not None:
            steps.append(("index", self.index.close))
        steps.append(("store", lambda: self.in_background(self.store.close)))  # fsyncs
        for name, step in steps:
            try:
                await step()
            except Exception as exc:
                log.error("shutdown_step_failed", step=name, error=repr(exc))
        self._meta_executor.shutdown(wait=True)
        if self.ops is not None:
            self.ops.stop()
        for c in list(self._connections):
            c.close()
        if self._server is not None:
            closed = asyncio.ensure_future(self._server.wait_closed())
            if (await asyncio.wait({closed}, timeout=self.config.shutdown_timeout))[1]:
                closed.cancel()
                log.warning("shutdown_connections_still_open")
        log.info("broker_stopped")
        self._stopped.set()

    def readiness(self) -> tuple[bool, str]:
        """``/readyz``: serving and taking writes (called from the operations port's thread:
        it only reads fields)."""
        if not self._serving:
            return False, "starting (recovering the store)"
        if self.lifecycle.shutting_down:
            return False, "shutting down"
        refused = self.store.writes_refused
        if refused is not None:
            return False, refused
        return True, "serving"

    # -- connections ----------------------------------------------------------------------------

    def _new_connection(self) -> Connection:
        conn = Connection(
            self.handle,
            max_frame_size=self.config.max_frame_size,
            on_close=self._connection_closed,
            on_protocol_error=self._protocol_error,
            limits=self._limits,
        )
        self._connections.add(conn)
        self.metrics.connections.set(len(self._connections))
        return conn

    def _connection_dropped(self, conn: Connection, drop: Drop) -> None:
        self.metrics.connections_dropped.labels(drop.reason).inc()
        fields: dict[str, Any] = {"pending_bytes": drop.pending_bytes}
        if drop.stalled_s is not None:
            fields["stalled_s"] = drop.stalled_s
        log.warning(
            "connection_dropped",
            peer=f"{conn.peer[0]}:{conn.peer[1]}",
            reason=drop.reason,
            detail=drop.detail,
            **fields,
        )

    def _connection_closed(self, conn: Connection) -> None:
        self._connections.discard(conn)
        self.metrics.connections.set(len(self._connections))
        if self.quota is not None:
            self.quota.connection_closed(conn)
        if not self.lifecycle.shutting_down:
            self.clients.connection_closed(conn)
            self.locks.connection_closed(conn)

    def _tls_rejected(self, peer: str, reason: str) -> None:
        self.metrics.protocol_errors.inc()

    def _protocol_error(self, conn: Connection, exc: ProtocolError) -> None:
        peer = f"{conn.peer[0]}:{conn.peer[1]}"
        if isinstance(exc, AnswerTooLargeError):  # the request was answered with an error
            log.warning("answer_too_large", peer=peer, error=str(exc))
            return
        self.metrics.protocol_errors.inc()
        log.warning("frame_rejected", peer=peer, error=str(exc))

    async def handle(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        """Dispatch one request to its processor; every failure becomes a precise answer."""
        proc = self._processors.get(cmd.code)
        self.metrics.record_request(cmd.code)
        if proc is None:
            return cmd.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, not_supported_remark(cmd.code)
            )
        if self.lifecycle.shutting_down and cmd.code not in _SHUTDOWN_ALLOWED:
            return cmd.response(ResponseCode.SERVICE_NOT_AVAILABLE, "the broker is shutting down")
        try:
            if self.acl is not None:
                self.acl.check(conn, cmd)
            if self.quota is not None:
                return await self.quota.serve(conn, cmd, conn.context.get(ACL_KEY), proc)
            return await proc(conn, cmd)
        except (TxmqError, OSError) as failed:
            # a store file (the log, the topic table, offsets, groups) the disk refused: the
            # same retriable refusal, naming the cause, whichever file it was
            exc = self.store.refusal(failed) or failed
            if not isinstance(exc, TxmqError):
                return self._crashed(cmd, exc)
            self.metrics.record_error(exc.code)
            log.info(
                "request_failed",
                code=cmd.code,
                response_code=int(exc.code),
                error=str(exc),
                peer=f"{conn.peer[0]}:{conn.peer[1]}",
            )
            return cmd.response(exc.code, str(exc) or type(exc).__name__)
        except Exception as exc:
            return self._crashed(cmd, exc)

    def _crashed(self, cmd: RemotingCommand, exc: BaseException) -> RemotingCommand:
        self.metrics.record_error(ResponseCode.SYSTEM_ERROR)
        log.error("request_crashed", code=cmd.code, exc_info=exc)
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")

    # -- the write path (see :class:`~txmq.broker.messaging.WritePath`) -----------------------

    def put_message(self, msg: MessageExt) -> PutMessageResult:
        return self.write.put_message(msg)

    def put_messages(self, msgs: list[MessageExt]) -> list[PutMessageResult]:
        return self.write.put_messages(msgs)

    def put_encoded(self, records: list[EncodedMessage]) -> AppendResult:
        return self.write.put_encoded(records)

    # -- blocking work, off the loop ------------------------------------------------------------

    async def in_background(self, fn: Callable[[], T]) -> T:
        """Run a blocking call (a state-file write, retention) on the broker's metadata thread,
        never on the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._meta_executor, fn)

    async def persist_topics(self) -> None:
        """Write the topic table if a change is not written yet."""
        await self.ctx.persist_topics()

    # -- housekeeping ---------------------------------------------------------------------------

    async def _housekeeping(self) -> None:
        cfg = self.config
        last_offsets = last_clean = last_expire = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            try:
                # Clients whose answers sit unread in their sockets (those whose writing
                # paused are watched by their connections).
                for conn in list(self._connections):
                    conn.check_unread()
                refused = self.store.check_space()
                self.metrics.writes_refused.set(0 if refused is None else 1)
                for reason in ("disk_full", "read_only"):
                    on = self.store.writes_refused_cause == reason
                    self.metrics.writes_refused_reason.labels(reason).set(1 if on else 0)
                if self.store.writes_refused_cause != "read_only":  # kept until writable
                    await self.flush.flush_queues(force=False)
                    if now - last_offsets >= cfg.flush_consumer_offset_interval / 1000.0:
                        await self.in_background(self.offsets.persist)
                        last_offsets = now
                    await self.persist_topics()
                if self.acl is not None:
                    changed = await self.in_background(self.acl.poll)
                    if changed is not None:
                        self.acl.install(changed)
                if self.tls is not None:
                    material = await self.in_background(self.tls.poll)
                    if material is not None:
                        self.tls.install(material)
                if now - last_expire >= 10.0:
                    self.clients.expire(cfg.channel_expired_timeout / 1000.0)
                    last_expire = now
                if now - last_clean >= cfg.clean_resource_interval / 1000.0:
                    deleted = await self.in_background(self.store.delete_expired_files)
                    if deleted:
                        log.info("retention_ran", segments_deleted=deleted)
                        await self.flush.flush_queues()  # close what retention retired
                    last_clean = now
            except Exception as exc:
                log.error("housekeeping_failed", error=repr(exc))
            try:
                self.stats.tick()
            except Exception as exc:
                log.error("stats_sampling_failed", error=repr(exc))


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.new_event_loop()


#: ``gc.set_threshold`` of a broker process (see :func:`run_until_signal`).
BROKER_GC_THRESHOLDS = (50_000, 20, 10)


class _Service(Protocol):
    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...


def run_until_signal(make: Callable[[], _Service]) -> int:
    """Start what ``make()`` builds on a fresh event loop, run it until SIGTERM or SIGINT, then
    shut it down gracefully.  Returns the exit status."""
    # A batch decision allocates hundreds of thousands of short-lived objects while the
    # transaction table holds as many long-lived ones: with Python's default thresholds the
    # collector runs thousands of times per batch and rescans the table, about a tenth of the
    # broker's time.  Young collections every 50,000 allocations make that negligible.
    gc.set_threshold(*BROKER_GC_THRESHOLDS)
    # Every client connection is a file: take the hard limit on open files, not the soft one.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):  # an unlimited hard limit is refused
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    async def main() -> int:
        service = make()
        await service.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("signal_received")
        await service.shutdown()
        return 0

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main())


def serve(config: BrokerConfig) -> int:
    """Run a broker until SIGTERM or SIGINT, then shut it down gracefully.  Returns the exit
    status."""
    return run_until_signal(lambda: BrokerController(config))
