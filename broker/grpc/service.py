"""``apache.rocketmq.v2.MessagingService`` on the broker: the servicer, the gRPC client registry
and the check-back sender.

Clients are known by their ``x-mq-client-id`` metadata.  A client's Telemetry stream is kept
for server-to-client commands; a producer with a live stream is registered in the broker's
:class:`~txmq.broker.clients.ClientManager` as a producer of the *group named after each topic it
publishes to* (RocketMQ's proxy does the same: 5.x producers have no group), through a
:class:`GrpcPeer` that stands in for a remoting connection.  A 5.x half message carries that
group (``PGROUP`` = its topic), so the broker's check loop finds the 5.x producers of the topic
and :class:`GrpcCheckSender` writes a RecoverOrphanedTransactionCommand on one of their streams;
checks for remoting producers still go to the sender that was there before.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import grpc
import structlog

from txmq.protocol.aio import Connection
from txmq.protocol.errors import (
    ProtocolError,
    QueryNotFoundError,
    TxmqError,
)
from txmq.protocol.headers import CheckTransactionStateRequestHeader
from txmq.protocol.message import (
    MessageConst,
    MessageExt,
    decode_message,
    java_string_hash,
    properties_to_string,
)

from ..acl import AclDenied
from ..clients import ClientChannel
from ..messaging.admission import Caller
from ..messaging.core import DeliveryTimeError, MessagingCore
from ..messaging.fastpath import PlainSend
from ..messaging.outcome import SendOutcome
from ..messaging.pop import Delivery, ReceiptHandleError
from ..messaging.read import EVERYTHING, ReadFilter, read_filter
from ..quota import QuotaManager
from ..topics import PERM_READ, PERM_WRITE, retry_topic, validate_topic
from ..transaction.service import CheckSender
from ..transaction.state import Decision
from . import convert
from .auth import CALLER, Context, GrpcAccess
from .auth import metadata as _metadata
from .auth import peer_address as _peer_address
from .convert import Code, GrpcStatusError, status, status_of
from .vendor.v2 import definition_pb2 as pb
from .vendor.v2 import service_pb2 as spb

if TYPE_CHECKING:
    from ..acl import AclManager

log = structlog.get_logger(__name__)

#: Message types a txmq topic accepts (it has no type attribute: RocketMQ's MIXED).
ACCEPTED_TYPES = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)
#: Most messages one ReceiveMessage returns.
MAX_RECEIVE_BATCH = 32
#: Invisible durations RocketMQ's proxy accepts for ReceiveMessage / ChangeInvisibleDuration.
MIN_INVISIBLE_S, MAX_INVISIBLE_S = 1.0, 12 * 3600.0
#: Default long-polling time when the request has none.
DEFAULT_LONG_POLLING_S = 20.0
#: ``Code.OK`` read once: each read of a ``Code`` value goes through the enum wrapper's
#: ``__getattr__`` (some 1.5 µs, twice a send).
_OK = Code.OK
#: Remoting language codes of the ``x-mq-language`` values (for the client table).
_LANGUAGES = {"JAVA": 0, "CPP": 1, "DOTNET": 2, "PYTHON": 3, "GOLANG": 9, "RUST": 12, "NODE_JS": 13}


@dataclass
class Malformed:
    """A request (or Telemetry command) that did not parse as protobuf."""

    error: str


# -- clients ------------------------------------------------------------------------------------


class TelemetryStream:
    """One open Telemetry call; writes are serialised and bounded.  ``access_key``: the
    account it was authenticated as ("" trusted peer, None ACL off)."""

    def __init__(self, context: Context, access_key: str | None = None) -> None:
        self.context = context
        self.access_key = access_key
        self.live = True
        self.task: asyncio.Task[Any] | None = asyncio.current_task()
        self._lock = asyncio.Lock()

    async def write(self, cmd: Any, timeout: float) -> bool:
        """Write one command; False (and the stream is dead) if it could not be written."""
        if not self.live:
            return False
        try:
            async with self._lock:
                await asyncio.wait_for(self.context.write(cmd), timeout)
            return True
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.live = False
            log.info("telemetry_write_failed", error=repr(exc))
            return False


class GrpcPeer:
    """Stands in for a remoting :class:`~txmq.protocol.aio.Connection` in the broker's client
    table: ``closed`` while the client has no live Telemetry stream."""

    def __init__(self, client_id: str, peer: tuple[str, int]) -> None:
        self.client_id = client_id
        self.peer = peer
        self.context: dict[str, Any] = {"client_id": client_id, "protocol": "grpc"}
        self.streams: list[TelemetryStream] = []

    @property
    def closed(self) -> bool:
        return not any(s.live for s in self.streams)

    def stream(
        self, allowed: Callable[[TelemetryStream], bool] | None = None
    ) -> TelemetryStream | None:
        """The newest live stream (that ``allowed`` accepts)."""
        for s in reversed(self.streams):
            if s.live and (allowed is None or allowed(s)):
                return s
        return None

    def close(self) -> None:
        """The client table expired the client: nothing to close here (its streams end when
        the client goes away); it registers again with its next heartbeat."""

    def send_oneway(self, cmd: Any) -> None:
        """Remoting notifications (NOTIFY_CONSUMER_IDS_CHANGED) do not apply to gRPC clients."""


@dataclass
class GrpcClient:
    client_id: str
    peer: GrpcPeer
    language: int = 3
    client_type: int = pb.CLIENT_TYPE_UNSPECIFIED
    group: str = ""
    topics: set[str] = field(default_factory=set)
    last_seen: float = field(default_factory=time.monotonic)
    #: The account that registered the client id (see :data:`.auth.CALLER`).
    access_key: str | None = None


# -- check-back ---------------------------------------------------------------------------------


class GrpcCheckSender:
    """The transaction service's :class:`CheckSender`: gRPC producers get a
    RecoverOrphanedTransactionCommand on their Telemetry stream, everyone else goes to
    ``fallback``.  A check counts as delivered when it was written to a live stream."""

    def __init__(self, service: MessagingService, fallback: CheckSender) -> None:
        self.service = service
        self.fallback = fallback

    async def __call__(
        self, channel: ClientChannel, header: CheckTransactionStateRequestHeader, body: bytes
    ) -> bool:
        peer: Any = channel.conn
        if not isinstance(peer, GrpcPeer):
            return await self.fallback(channel, header, body)
        return await self.service.recover_orphaned(peer, header, body)


# -- the service --------------------------------------------------------------------------------

Handler = Callable[[Any, Context], Awaitable[Any]]


class MessagingService:
    """The RPCs; :func:`txmq.broker.grpc.server.handlers` binds them by name."""

    def __init__(
        self,
        core: MessagingCore,
        acl: AclManager | None,
        port: int,
        quota: QuotaManager | None = None,
    ) -> None:
        self.core = core
        self.ctx = core.ctx
        self.tx = core.tx
        self.port = port
        self.clients: dict[str, GrpcClient] = {}
        self.closing = False
        self._rr = 0
        #: The ACL check of every call (``aclEnable``); None when off.
        self.access = GrpcAccess(acl, core.tx) if acl is not None else None
        #: The broker's quotas (shared with the remoting port); None when none apply.
        self.quota = quota

    def quota_key(self, context: Context) -> str:
        """What a call's quotas are counted under: its account, else its client address."""
        return QuotaManager.key_for(CALLER.get(), _peer_address(context)[0])

    # -- helpers --------------------------------------------------------------------------------

    @property
    def cfg(self) -> Any:
        return self.ctx.config

    def _count(self, method: str) -> None:
        self.ctx.metrics.record_request(f"grpc:{method}")

    def admit(self, method: str, request: Any, context: Context) -> Any:
        """The ACL check of one call (``request`` None: authenticate only): None when it may
        go on (its caller is then in :data:`.auth.CALLER`), else the refusal's ``Status``."""
        assert self.access is not None
        try:
            CALLER.set(self.access.admit(method, request, context))
        except AclDenied as exc:
            return status(Code.UNAUTHORIZED if exc.authentication else Code.FORBIDDEN, str(exc))
        return None

    def _owner_check(self, c: GrpcClient) -> None:
        """With the ACL on, a client id belongs to the account that registered it."""
        if self.access is not None and c.access_key != CALLER.get():
            raise GrpcStatusError(
                Code.FORBIDDEN,
                f"ACL: x-mq-client-id {c.client_id} is registered by another AccessKey",
            )

    def _client(self, context: Context, create: bool = True) -> GrpcClient:
        cid = _metadata(context, "x-mq-client-id")
        if not cid:
            raise GrpcStatusError(Code.CLIENT_ID_REQUIRED, "x-mq-client-id metadata is required")
        c = self.clients.get(cid)
        if c is None:
            if not create:
                raise GrpcStatusError(Code.CLIENT_ID_REQUIRED, f"unknown client {cid}")
            lang = _LANGUAGES.get(_metadata(context, "x-mq-language").upper(), 7)
            c = GrpcClient(
                cid, GrpcPeer(cid, _peer_address(context)), language=lang, access_key=CALLER.get()
            )
            self.clients[cid] = c
        else:
            self._owner_check(c)
        c.last_seen = time.monotonic()
        return c

    def _register_producer(self, c: GrpcClient) -> None:
        """(Re)register a producer with a live stream as a producer of each of its topics."""
        if c.peer.closed or not c.topics:
            return
        data = {"clientID": c.client_id, "producerDataSet": [{"groupName": t} for t in c.topics]}
        self.ctx.clients.heartbeat(cast(Connection, c.peer), data, c.language, 0)

    def _forget(self, c: GrpcClient) -> None:
        self.clients.pop(c.client_id, None)
        self.ctx.clients.connection_closed(cast(Connection, c.peer))

    def _topic_config(self, topic: str, create: bool) -> Any:
        try:
            validate_topic(topic)
        except TxmqError as exc:
            raise GrpcStatusError(Code.ILLEGAL_TOPIC, str(exc)) from None
        topics = self.ctx.topics
        tc = topics.get(topic)
        if tc is None and create and self.cfg.auto_create_topic_enable:
            tc = topics.for_send(topic, self.cfg.default_topic_queue_nums)
        if tc is None:
            raise GrpcStatusError(Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        return tc

    def _endpoints(self, requested: Any) -> Any:
        if requested is not None and len(requested.addresses):
            return requested
        host = self.cfg.broker_i_p1
        return pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host=host, port=self.port)])

    def _queue(
        self, topic: str, qid: int, perm: int, endpoints: Any, broker_name: str | None = None
    ) -> Any:
        read, write = bool(perm & PERM_READ), bool(perm & PERM_WRITE)
        p = pb.READ_WRITE if read and write else pb.READ if read else pb.WRITE if write else pb.NONE
        q = pb.MessageQueue(id=qid, permission=p, accept_message_types=ACCEPTED_TYPES)
        q.topic.name = topic
        q.broker.name = broker_name or self.cfg.broker_name
        q.broker.id = 0
        q.broker.endpoints.CopyFrom(endpoints)
        return q

    async def _durable(self, end_offset: int) -> None:
        await self.ctx.flush.wait_durable(end_offset)

    def _shutting_down(self) -> bool:
        return self.closing or self.ctx.lifecycle.shutting_down

    # -- route, heartbeat, settings ---------------------------------------------------------

    async def QueryRoute(self, request: Any, context: Context) -> Any:
        self._count("QueryRoute")
        try:
            topic = convert.resource_name(request.topic)
            tc = self._topic_config(topic, create=True)
            eps = self._endpoints(request.endpoints if request.HasField("endpoints") else None)
            groups: list[tuple[str | None, int, int, int, Any]] = [
                (None, tc.read_queue_nums, tc.write_queue_nums, tc.perm, eps)
            ]
            if self.ctx.cluster is not None:
                # Cluster mode: every group that has the topic, each at its leader's endpoint.
                groups = [
                    (group, int(c["read"]), int(c["write"]), int(c["perm"]), _endpoints_of(addr))
                    for group, c, addr in self.ctx.cluster.grpc_route(topic)
                ] or groups
            queues = []
            for group, nread, nwrite, tperm, geps in groups:
                for qid in range(max(nread, nwrite)):
                    perm = tperm
                    if qid >= nread:
                        perm &= ~PERM_READ
                    if qid >= nwrite:
                        perm &= ~PERM_WRITE
                    queues.append(self._queue(topic, qid, perm, geps, group))
            return spb.QueryRouteResponse(status=status(), message_queues=queues)
        except Exception as exc:
            return spb.QueryRouteResponse(status=self._failed("QueryRoute", exc))

    async def Heartbeat(self, request: Any, context: Context) -> Any:
        self._count("Heartbeat")
        try:
            c = self._client(context)
            if request.client_type:
                c.client_type = request.client_type
            if request.HasField("group") and request.group.name:
                c.group = convert.resource_name(request.group)
                self.ctx.topics.ensure(retry_topic(c.group), 1)
            elif c.client_type in (pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER):
                raise GrpcStatusError(Code.ILLEGAL_CONSUMER_GROUP, "a consumer needs a group")
            self._register_producer(c)
            return spb.HeartbeatResponse(status=status())
        except Exception as exc:
            return spb.HeartbeatResponse(status=self._failed("Heartbeat", exc))

    async def NotifyClientTermination(self, request: Any, context: Context) -> Any:
        self._count("NotifyClientTermination")
        cid = _metadata(context, "x-mq-client-id")
        c = self.clients.get(cid)
        if c is not None:
            try:
                self._owner_check(c)
            except GrpcStatusError as exc:
                return spb.NotifyClientTerminationResponse(
                    status=self._failed("NotifyClientTermination", exc)
                )
            log.info("grpc_client_terminated", client_id=cid)
            self._forget(c)
        return spb.NotifyClientTerminationResponse(status=status())

    def _apply_settings(self, c: GrpcClient, s: Any) -> Any:
        """Record a client's settings; answer with the settings the broker enforces."""
        if s.HasField("client_type"):
            c.client_type = s.client_type
        out = pb.Settings()
        out.client_type = c.client_type
        if s.HasField("access_point"):
            out.access_point.CopyFrom(s.access_point)
        if s.HasField("request_timeout"):
            out.request_timeout.CopyFrom(s.request_timeout)
        else:
            out.request_timeout.seconds = 3
        out.user_agent.CopyFrom(s.user_agent)
        out.metric.on = False
        which = s.WhichOneof("pub_sub")
        if which == "publishing":
            for t in s.publishing.topics:
                c.topics.add(convert.resource_name(t))
            out.publishing.topics.extend(s.publishing.topics)
            out.publishing.max_body_size = self.cfg.max_message_size
            out.publishing.validate_message_type = True
            attempts = s.backoff_policy.max_attempts if s.HasField("backoff_policy") else 0
            bp = out.backoff_policy
            bp.max_attempts = attempts or 3
            convert.set_duration(bp.exponential_backoff.initial, 0.01)
            convert.set_duration(bp.exponential_backoff.max, 1.0)
            bp.exponential_backoff.multiplier = 2.0
        elif which == "subscription":
            sub = s.subscription
            if sub.HasField("group"):
                c.group = convert.resource_name(sub.group)
            # The group's settings decide, not the client (RocketMQ's proxy merges the
            # group's SubscriptionGroupConfig into the answer the same way).
            group_config = self.ctx.groups.effective(c.group)
            out.subscription.CopyFrom(sub)
            out.subscription.fifo = group_config.consume_message_orderly
            out.subscription.receive_batch_size = MAX_RECEIVE_BATCH
            if not sub.HasField("long_polling_timeout"):
                convert.set_duration(out.subscription.long_polling_timeout, DEFAULT_LONG_POLLING_S)
            bp = out.backoff_policy
            bp.max_attempts = group_config.retry_max_times + 1
            for ms in self.ctx.delay_levels:
                convert.set_duration(bp.customized_backoff.next.add(), ms / 1000.0)
        return out

    async def Telemetry(self, request_iterator: AsyncIterator[Any], context: Context) -> None:
        self._count("Telemetry")
        if self.access is not None:
            refused = self.admit("Telemetry", None, context)
            if refused is not None:
                await context.write(spb.TelemetryCommand(status=refused))
                return
        try:
            c = self._client(context)
        except GrpcStatusError as exc:
            await context.write(spb.TelemetryCommand(status=status(exc.code, exc.message)))
            return
        quota_key: str | None = None
        if self.quota is not None:
            # each Telemetry stream (a client's hold on this endpoint) counts as a connection
            quota_key = self.quota_key(context)
            refused = self.quota.admit(quota_key, _peer_address(context), "stream")
            if refused is not None:
                await context.write(
                    spb.TelemetryCommand(status=status(Code.TOO_MANY_REQUESTS, refused))
                )
                return
        stream = TelemetryStream(context, CALLER.get())
        c.peer.streams.append(stream)
        timeout = self.cfg.transaction_check_request_timeout / 1000.0
        log.info("grpc_telemetry_opened", client_id=c.client_id, peer=c.peer.peer)
        try:
            async for cmd in request_iterator:
                if isinstance(cmd, Malformed):
                    await context.abort(grpc.StatusCode.INTERNAL, "Invalid protobuf byte sequence")
                which = cmd.WhichOneof("command")
                if which == "settings" and self.access is not None:
                    refused = self.admit("Telemetry", cmd, context)
                    if refused is not None:
                        await stream.write(spb.TelemetryCommand(status=refused), timeout)
                        break
                if which == "settings":
                    settings = self._apply_settings(c, cmd.settings)
                    reply = spb.TelemetryCommand(status=status(), settings=settings)
                    if not await stream.write(reply, timeout):
                        break
                    self._register_producer(c)
                elif cmd.HasField("status") and cmd.status.code != Code.OK:
                    log.info(
                        "grpc_telemetry_client_status",
                        client_id=c.client_id,
                        code=cmd.status.code,
                        message=cmd.status.message,
                    )
                if self._shutting_down():
                    break
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("grpc_telemetry_ended", client_id=c.client_id, error=repr(exc))
        finally:
            if quota_key is not None and self.quota is not None:
                self.quota.release(quota_key)
            stream.live = False
            if stream in c.peer.streams:
                c.peer.streams.remove(stream)
            if c.peer.closed and self.clients.get(c.client_id) is c:
                self.ctx.clients.connection_closed(cast(Connection, c.peer))
            log.info("grpc_telemetry_closed", client_id=c.client_id)

    async def close_streams(self) -> None:
        """On shutdown: end every Telemetry call now."""
        self.closing = True
        tasks = []
        for c in list(self.clients.values()):
            for s in list(c.peer.streams):
                s.live = False
                if s.task is not None and not s.task.done():
                    s.task.cancel()
                    tasks.append(s.task)
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)

    # -- send -------------------------------------------------------------------------------

    async def SendMessage(self, request: Any, context: Context) -> Any:
        self._count("SendMessage")
        try:
            return await self._send(request, context)
        except Exception as exc:
            st = self._failed("SendMessage", exc)
            entries = [spb.SendResultEntry(status=st) for _ in request.messages]
            return spb.SendMessageResponse(status=st, entries=entries)

    def _pick_queue(self, write_queues: int, group: str | None) -> int:
        if group is not None:
            return abs(java_string_hash(group)) % write_queues
        self._rr += 1
        return (self._rr + random.randrange(write_queues)) % write_queues

    def _caller(self, request: Any, context: Context) -> Caller:
        """Who sends, as this front end authenticated it (see :mod:`..messaging.admission`)."""
        host, port = _peer_address(context)
        return Caller(
            CALLER.get(),
            self.quota_key(context) if self.quota is not None else None,
            "RPC SendMessage",
            {"peer": f"{host}:{port}", "rpc": "SendMessage"},
            sum(len(m.body) for m in request.messages),
        )

    async def _send(self, request: Any, context: Context) -> Any:
        core = self.core
        caller = None
        if core.admission is not None:  # first, as any call's ACL check
            caller = self._caller(request, context)
            topics = [convert.resource_name(m.topic) for m in request.messages]
            await core.admit(caller, [t for t in topics if t])
        if not request.messages:
            raise GrpcStatusError(Code.BAD_REQUEST, "no message in the request")
        c = self._client(context)
        ctx = self.ctx
        peer_host = c.peer.peer[0]
        now = ctx.now_ms()
        if len(request.messages) == 1 and core.fast.enabled:
            answer = await self._send_plain(request.messages[0], peer_host, now)
            if answer is not None:
                return answer
        # Check everything before anything is stored: a bad request changes nothing.
        prepared: list[MessageExt] = []
        for m in request.messages:
            convert.check_message(m, self.cfg.max_message_size)
            topic = convert.resource_name(m.topic)
            try:
                validate_topic(topic)
            except TxmqError as exc:
                raise GrpcStatusError(Code.ILLEGAL_TOPIC, str(exc)) from None
            tc = ctx.topics.get(topic)
            if tc is None and not self.cfg.auto_create_topic_enable:
                raise GrpcStatusError(Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
            msg = convert.to_message_ext(m, topic, peer_host, now, self.cfg.max_message_size)
            sp = m.system_properties
            if sp.message_type == pb.TRANSACTION:
                # The 5.x producer has no group: its halves belong to the group named after
                # the topic (RocketMQ's proxy does the same).
                msg.properties[MessageConst.TRAN_MSG] = "true"
                msg.properties.setdefault(MessageConst.PGROUP, topic)
            elif sp.HasField("delivery_timestamp"):
                try:
                    core.deliver_at(msg, convert.timestamp_ms(sp.delivery_timestamp))
                except DeliveryTimeError as exc:
                    raise GrpcStatusError(Code.ILLEGAL_DELIVERY_TIME, str(exc)) from None
            prepared.append(msg)
        for msg in prepared:
            tc = await core.topic_for_send(msg.topic, self.cfg.default_topic_queue_nums)
            group = msg.properties.get(convert.SHARDING_KEY)
            msg.queue_id = self._pick_queue(tc.write_queue_nums, group)
            if MessageConst.TRAN_MSG in msg.properties and msg.topic not in c.topics:
                c.topics.add(msg.topic)  # a producer of the topic's halves: check-backs reach it
                self._register_producer(c)
        # The send use case, as a remoting send takes it: a resend (the same message id within
        # the duplicate window, a lost answer) is answered with the first send's receipt.
        # A half's group is in its PGROUP property (set above).
        outcome = await core.send(prepared, "", caller)
        return self._send_answer(outcome)

    async def _send_plain(self, m: Any, peer_host: str, now: int) -> Any:
        """One plain message (normal or FIFO, no delivery time, body as sent) stored as the
        remoting port stores a plain SEND_MESSAGE: straight from its properties string
        (:meth:`~txmq.broker.messaging.fastpath.FastPaths.read_one`), the same record the
        generic path writes.  None: the generic path takes it (nothing was stored)."""
        sp = m.system_properties
        t = sp.message_type
        if (t != pb.NORMAL and t != pb.FIFO) or sp.body_encoding == pb.GZIP:
            return None
        if sp.HasField("delivery_timestamp"):
            return None
        cfg = self.cfg
        convert.check_message(m, cfg.max_message_size)
        topic = convert.resource_name(m.topic)
        try:
            validate_topic(topic)
        except TxmqError as exc:
            raise GrpcStatusError(Code.ILLEGAL_TOPIC, str(exc)) from None
        if not cfg.auto_create_topic_enable and self.ctx.topics.get(topic) is None:
            raise GrpcStatusError(Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        # what convert.to_message_ext makes of it, without the message object
        props = convert.properties_of(m)
        core = self.core
        ext = {
            "a": "",
            "b": topic,
            "d": cfg.default_topic_queue_nums,
            "g": convert.born_timestamp_of(sp, now),
            "i": properties_to_string(props),
        }
        p = core.fast.read_one(True, ext, m.body)
        if p is None or p.__class__ is not PlainSend:
            return None
        tc = await core.topic_for_send(topic, cfg.default_topic_queue_nums)
        qid = self._pick_queue(tc.write_queue_nums, props.get(convert.SHARDING_KEY))
        outcome = core.fast.try_store(p, qid, convert.born_host_of(sp.born_host, peer_host))
        if outcome is None:
            return None  # perhaps a resend: the generic path answers it with the first send
        if not core.durable_at_once():
            outcome = await core.durable(outcome)
        return self._send_answer(outcome)

    def _send_answer(self, outcome: SendOutcome) -> Any:
        batch = outcome.batch
        if batch is not None and outcome.flush_error is None and len(batch.placed) == 1:
            # one record stored by the direct path: answered from where it went (no receipt)
            out = spb.SendMessageResponse()
            st = out.status
            st.code = _OK
            st.message = "OK"
            e = out.entries.add()
            est = e.status
            est.code = _OK
            est.message = "OK"
            e.message_id = batch.uniq_keys[0]
            if batch.transaction_id:
                e.transaction_id = batch.transaction_id
            e.offset = batch.placed[0][2]
            return out
        # Filled in place: building the entries and the answer from keyword arguments copies
        # each message once more (a third of the answer's cost).
        code, text = _OK, "OK"
        if outcome.flush_error is not None:
            code, text = Code.MASTER_PERSISTENCE_TIMEOUT, str(outcome.flush_error)
        out = spb.SendMessageResponse()
        st = out.status
        st.code = code
        st.message = text
        add = out.entries.add
        for r in outcome.receipts:
            e = add()
            est = e.status
            est.code = code
            est.message = text
            e.message_id = r.uniq_key
            if r.transaction_id:
                e.transaction_id = r.transaction_id
            e.offset = r.queue_offset
            if r.recall_handle:
                e.recall_handle = r.recall_handle
        return out

    # -- transactions -----------------------------------------------------------------------

    async def EndTransaction(self, request: Any, context: Context) -> Any:
        self._count("EndTransaction")
        try:
            return spb.EndTransactionResponse(status=await self._end_transaction(request))
        except Exception as exc:
            return spb.EndTransactionResponse(status=self._failed("EndTransaction", exc))

    async def _end_transaction(self, request: Any) -> Any:
        tx = self.tx
        topic = convert.resource_name(request.topic)
        rec = tx.records.get(request.transaction_id) if request.transaction_id else None
        if rec is None:
            raise GrpcStatusError(
                Code.INVALID_TRANSACTION_ID,
                f"no half message with transaction id {request.transaction_id!r}",
            )
        if topic and not any(h.real_topic == topic for h in rec.halves):
            raise GrpcStatusError(
                Code.INVALID_TRANSACTION_ID,
                f"transaction {rec.transaction_id} has no half message in topic {topic}",
            )
        if request.message_id and not any(h.uniq_key == request.message_id for h in rec.halves):
            raise GrpcStatusError(
                Code.INVALID_TRANSACTION_ID,
                f"message {request.message_id} is not a half message of transaction "
                f"{rec.transaction_id}",
            )
        if request.resolution == pb.COMMIT:
            decision = Decision.COMMIT
        elif request.resolution == pb.ROLLBACK:
            decision = Decision.ROLLBACK
        else:
            decision = Decision.UNKNOWN
        text = await self.core.end_transaction(
            rec, decision, from_check=request.source == pb.SOURCE_SERVER_CHECK, remark="grpc"
        )
        return status(message=text)

    def may_check(self, peer: GrpcPeer, group: str) -> bool:
        """With the ACL on, whether check-backs of ``group`` (a 5.x half's group is its topic)
        may go to ``peer``: one of its live streams is authenticated for an account with PUB
        on that topic."""
        return peer.stream(self._check_allowed(peer, (group,))) is not None

    def _check_allowed(
        self, peer: GrpcPeer, topics: tuple[str, ...]
    ) -> Callable[[TelemetryStream], bool] | None:
        access = self.access
        if access is None:
            return None
        host = peer.peer[0]
        return lambda s: all(access.may_publish(host, s.access_key, t) for t in topics)

    async def recover_orphaned(
        self, peer: GrpcPeer, header: CheckTransactionStateRequestHeader, body: bytes
    ) -> bool:
        try:
            msg = decode_message(body)
        except ProtocolError as exc:
            log.warning("check_message_undecodable", error=str(exc))
            return False
        topic = msg.properties.get(MessageConst.REAL_TOPIC) or msg.topic
        group = msg.properties.get(MessageConst.PGROUP) or topic
        stream = peer.stream(self._check_allowed(peer, (topic, group)))
        if stream is None:
            return False
        proto = convert.to_proto(msg, self.ctx.store_host)
        proto.system_properties.message_type = pb.TRANSACTION
        cmd = spb.TelemetryCommand(
            recover_orphaned_transaction_command=spb.RecoverOrphanedTransactionCommand(
                message=proto, transaction_id=header.transaction_id or ""
            )
        )
        timeout = self.cfg.transaction_check_request_timeout / 1000.0
        ok = await stream.write(cmd, timeout)
        log.info(
            "grpc_check_sent" if ok else "grpc_check_not_written",
            client_id=peer.client_id,
            transaction_id=header.transaction_id,
        )
        return ok

    # -- consumption ------------------------------------------------------------------------

    async def QueryAssignment(self, request: Any, context: Context) -> Any:
        self._count("QueryAssignment")
        try:
            topic = convert.resource_name(request.topic)
            tc = self._topic_config(topic, create=False)
            if not request.group.name:
                raise GrpcStatusError(Code.ILLEGAL_CONSUMER_GROUP, "the group is empty")
            eps = self._endpoints(request.endpoints if request.HasField("endpoints") else None)
            # One assignment per broker, queue id -1: the broker serves every queue of the
            # topic to each ReceiveMessage (as RocketMQ's proxy does in pop mode).  In cluster
            # mode, one per group, at its leader.
            assigned = [self._queue(topic, -1, tc.perm, eps)]
            if self.ctx.cluster is not None:
                assigned = [
                    self._queue(topic, -1, int(c["perm"]), _endpoints_of(addr), group)
                    for group, c, addr in self.ctx.cluster.grpc_route(topic)
                ] or assigned
            return spb.QueryAssignmentResponse(
                status=status(), assignments=[pb.Assignment(message_queue=q) for q in assigned]
            )
        except Exception as exc:
            return spb.QueryAssignmentResponse(status=self._failed("QueryAssignment", exc))

    async def ReceiveMessage(self, request: Any, context: Context) -> AsyncIterator[Any]:
        self._count("ReceiveMessage")
        try:
            found = await self._receive(request, context)
        except Exception as exc:
            yield spb.ReceiveMessageResponse(status=self._failed("ReceiveMessage", exc))
            return
        if not found:
            yield spb.ReceiveMessageResponse(
                status=status(Code.MESSAGE_NOT_FOUND, "no new message")
            )
            return
        yield spb.ReceiveMessageResponse(status=status())
        for m in found:
            yield spb.ReceiveMessageResponse(message=m)
        ts = spb.ReceiveMessageResponse()
        convert.set_timestamp(ts.delivery_timestamp, int(time.time() * 1000))
        yield ts

    def _filter(self, request: Any) -> ReadFilter:
        """The receive's filter (the remoting grammar and semantics)."""
        if not request.HasField("filter_expression"):
            return EVERYTHING
        fe = request.filter_expression
        kind = "SQL92" if fe.type == pb.SQL else "TAG"
        return read_filter(kind, fe.expression, self.cfg.enable_property_filter)

    async def _receive(self, request: Any, context: Context) -> list[Any]:
        """ReceiveMessage translated to the core's receive (:mod:`..messaging.pop`)."""
        self._client(context)
        group = convert.resource_name(request.group)
        if not group:
            raise GrpcStatusError(Code.ILLEGAL_CONSUMER_GROUP, "the group is empty")
        topic = convert.resource_name(request.message_queue.topic)
        read = self._filter(request)
        batch = request.batch_size
        if batch <= 0:
            raise GrpcStatusError(Code.BAD_REQUEST, "batch_size must be positive")
        invisible = (
            convert.duration_s(request.invisible_duration)
            if request.HasField("invisible_duration")
            else 30.0
        )
        if not MIN_INVISIBLE_S <= invisible <= MAX_INVISIBLE_S:
            raise GrpcStatusError(
                Code.ILLEGAL_INVISIBLE_TIME,
                f"invisible duration must be {MIN_INVISIBLE_S:.0f}s..{MAX_INVISIBLE_S:.0f}s",
            )
        poll = (
            convert.duration_s(request.long_polling_timeout)
            if request.HasField("long_polling_timeout")
            else DEFAULT_LONG_POLLING_S
        )
        remaining = context.time_remaining()
        if remaining is not None:
            poll = min(poll, max(0.0, remaining - 0.5))
        found = await self.core.pop.receive(
            group,
            topic,
            batch=min(batch, MAX_RECEIVE_BATCH),
            invisible_ms=int(invisible * 1000),
            poll_s=poll,
            filter=read,
            stopping=self._shutting_down,
        )
        return [self._delivered(d) for d in found]

    def _delivered(self, d: Delivery) -> Any:
        p = convert.to_proto(d.message, self.ctx.store_host)
        sp = p.system_properties
        sp.receipt_handle = d.handle
        sp.delivery_attempt = d.attempts
        convert.set_duration(sp.invisible_duration, d.invisible_ms / 1000)
        return p

    async def AckMessage(self, request: Any, context: Context) -> Any:
        self._count("AckMessage")
        try:
            group = convert.resource_name(request.group)
            topic = convert.resource_name(request.topic)
            if not request.entries:
                raise GrpcStatusError(Code.BAD_REQUEST, "no entry to ack")
            refused = self.core.pop.ack(
                group,
                topic,
                [e.receipt_handle for e in request.entries],
                [e.message_id for e in request.entries],
            )
            results = [
                spb.AckMessageResultEntry(
                    message_id=e.message_id,
                    receipt_handle=e.receipt_handle,
                    status=status(Code.INVALID_RECEIPT_HANDLE, why) if why else status(),
                )
                for e, why in zip(request.entries, refused, strict=True)
            ]
            codes = {r.status.code for r in results}
            top = (
                results[0].status
                if len(codes) == 1
                else status(Code.MULTIPLE_RESULTS, "some entries failed")
            )
            return spb.AckMessageResponse(status=top, entries=results)
        except Exception as exc:
            return spb.AckMessageResponse(status=self._failed("AckMessage", exc))

    async def ChangeInvisibleDuration(self, request: Any, context: Context) -> Any:
        self._count("ChangeInvisibleDuration")
        try:
            secs = convert.duration_s(request.invisible_duration)
            if not 0 <= secs <= MAX_INVISIBLE_S:
                raise GrpcStatusError(
                    Code.ILLEGAL_INVISIBLE_TIME, f"invisible duration must be 0..{MAX_INVISIBLE_S}s"
                )
            handle = self.core.pop.change_invisible(
                convert.resource_name(request.group),
                convert.resource_name(request.topic),
                request.receipt_handle,
                int(secs * 1000),
                request.message_id,
            )
            return spb.ChangeInvisibleDurationResponse(status=status(), receipt_handle=handle)
        except Exception as exc:
            return spb.ChangeInvisibleDurationResponse(
                status=self._failed("ChangeInvisibleDuration", exc)
            )

    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Context) -> Any:
        self._count("ForwardMessageToDeadLetterQueue")
        try:
            group = convert.resource_name(request.group)
            topic = convert.resource_name(request.topic)
            pop = self.core.pop
            m = pop.message_of(group, topic, request.receipt_handle)
            [why] = pop.ack(group, topic, [request.receipt_handle], [""])
            if why:
                raise ReceiptHandleError(why)
            await self.core.dead_letter(group, m, request.delivery_attempt)
            if self.core.trace is not None:
                self.core.trace.sent_back(group, m, dead_letter=True)
            return spb.ForwardMessageToDeadLetterQueueResponse(status=status())
        except Exception as exc:
            return spb.ForwardMessageToDeadLetterQueueResponse(
                status=self._failed("ForwardMessageToDeadLetterQueue", exc)
            )

    # -- not implemented --------------------------------------------------------------------

    def _not_implemented(self, method: str) -> Any:
        self._count(method)
        return status(Code.NOT_IMPLEMENTED, f"{method} is not implemented by txmq")

    async def PullMessage(self, request: Any, context: Context) -> AsyncIterator[Any]:
        yield spb.PullMessageResponse(status=self._not_implemented("PullMessage"))

    async def UpdateOffset(self, request: Any, context: Context) -> Any:
        return spb.UpdateOffsetResponse(status=self._not_implemented("UpdateOffset"))

    async def GetOffset(self, request: Any, context: Context) -> Any:
        return spb.GetOffsetResponse(status=self._not_implemented("GetOffset"))

    async def QueryOffset(self, request: Any, context: Context) -> Any:
        return spb.QueryOffsetResponse(status=self._not_implemented("QueryOffset"))

    async def RecallMessage(self, request: Any, context: Context) -> Any:
        """A pending timer message, named by the recall handle its send answered, is never
        delivered (RocketMQ 5.3)."""
        self._count("RecallMessage")
        try:
            topic = convert.resource_name(request.topic)
            msg_id = await self.core.recall(topic, request.recall_handle)
            return spb.RecallMessageResponse(status=status(), message_id=msg_id)
        except QueryNotFoundError as exc:
            self._failed("RecallMessage", exc)  # logged; no such pending timer message
            return spb.RecallMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, str(exc)))
        except Exception as exc:
            return spb.RecallMessageResponse(status=self._failed("RecallMessage", exc))

    async def SyncLiteSubscription(self, request: Any, context: Context) -> Any:
        return spb.SyncLiteSubscriptionResponse(
            status=self._not_implemented("SyncLiteSubscription")
        )

    # -- errors -----------------------------------------------------------------------------

    def _failed(self, method: str, exc: Exception) -> Any:
        # a store file the disk refused: the store's one refusal, naming the cause
        refused = self.ctx.store.refusal(exc)
        if refused is not None:
            exc = refused
        st = status_of(exc)
        if isinstance(exc, (GrpcStatusError, TxmqError, QueryNotFoundError)):
            log.info("grpc_request_failed", method=method, code=st.code, error=st.message)
        else:
            log.exception("grpc_request_crashed", method=method)
        return st


__all__ = ["GrpcCheckSender", "GrpcPeer", "Malformed", "MessagingService"]


def _endpoints_of(addr: str) -> Any:
    """``host:port`` as gRPC Endpoints."""
    host, _, port = addr.rpartition(":")
    return pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host=host, port=int(port))])
