"""Start and stop the RocketMQ 5 front end on the broker's loop: the method table, served by the
native transport (:mod:`.h2`, ``grpcTransport = native``) or by ``grpc.aio`` (``grpcio``).

TLS.  With ``tls.server.mode = enforcing`` the port serves TLS only, with the broker's
certificate.  Native: the broker's own TLS (:class:`~txmq.broker.tls.TlsServer` with the ``h2``
context of :class:`~txmq.broker.tls.TlsMaterial`, the current one for each new connection).
grpcio: gRPC's own TLS (``grpc.dynamic_ssl_server_credentials``); with
``need.client.auth = require`` a client certificate signed by ``trustCertPath`` is required.
gRPC asks for a certificate only when it requires one, so ``optional`` is ``none`` here.
A rotated certificate reaches gRPC through its certificate fetcher, which gRPC calls before
every new handshake: it hands over the files the broker's TLS poll last loaded
(:class:`~txmq.broker.tls.ServerTls`), so remoting and gRPC always serve the same certificate.
``permissive`` leaves the gRPC port plain: one gRPC port cannot serve both (see
docs/security.md).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
import structlog
from google.protobuf.message import DecodeError

from txmq.protocol.errors import SystemBusyError

from ..tls import TlsServer
from .auth import Context
from .convert import Code, status
from .h2 import H2Server
from .h2calls import Method
from .service import GrpcCheckSender, GrpcPeer, Malformed, MessagingService
from .vendor.v2 import service_pb2 as spb

if TYPE_CHECKING:
    from ..acl import AclManager
    from ..config import BrokerConfig
    from ..messaging.core import MessagingCore
    from ..quota import QuotaManager
    from ..tls import ServerTls, TlsMaterial
    from ..transaction.service import CheckSender

log = structlog.get_logger(__name__)

#: Seconds in-flight RPCs get to finish when the broker stops.
STOP_GRACE_S = 2.0


#: Clients may ping this often (ms), also without calls in flight, without being told to
#: stop (grpcio's default allows one ping in 5 minutes without data, then sends GOAWAY).
CLIENT_PING_MIN_INTERVAL_MS = 10_000


def connection_options(cfg: BrokerConfig) -> list[tuple[str, int]]:
    """grpcio server options bounding what one connection may hold: message sizes (a request
    may carry a body of maxMessageSize plus its properties and framing; a larger one is
    refused by gRPC itself, RESOURCE_EXHAUSTED, before it is parsed), the HTTP/2 handshake
    deadline (``clientFirstFrameTimeout``: a connection that sends not even its preface and
    settings is closed), and the clients' keepalive pings let in."""
    options = [
        ("grpc.max_receive_message_length", cfg.max_message_size + 1024 * 1024),
        ("grpc.max_send_message_length", -1),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", CLIENT_PING_MIN_INTERVAL_MS),
    ]
    if cfg.client_first_frame_timeout > 0:
        options.append(("grpc.server_handshake_timeout_ms", cfg.client_first_frame_timeout))
    return options


class GrpcServer:
    """``apache.rocketmq.v2.MessagingService`` on ``grpcServerPort`` of ``bindAddress``."""

    def __init__(
        self,
        core: MessagingCore,
        acl: AclManager | None,
        tls: ServerTls | None,
        quota: QuotaManager | None = None,
    ) -> None:
        self.core = core
        #: The broker's quotas, shared with the remoting port (None: none apply).
        self.quota = quota
        self.ctx = core.ctx
        self.acl = acl
        self.tls = tls
        self.port = core.ctx.config.grpc_server_port
        self._server: grpc.aio.Server | None = None
        #: The native transport (``grpcTransport = native``): its listener and connections.
        self._listener: asyncio.Server | TlsServer | None = None
        self._h2: H2Server | None = None
        self.service: MessagingService | None = None
        self._previous_sender: CheckSender | None = None
        self._previous_filter: Callable[[Any, str], bool] | None = None

    async def start(self) -> int:
        cfg = self.ctx.config
        tls = self.tls
        secure = tls is not None and cfg.tls_server_mode == "enforcing"
        if tls is not None and not secure:
            log.warning(
                "grpc_plaintext",
                reason="tls.server.mode = permissive serves the gRPC port in plain text; "
                "it is TLS only with enforcing",
            )
        if cfg.grpc_transport == "native":
            port = await self._bind_native(secure)
        else:
            port = await self._start_grpcio(secure)
        tx = self.core.tx
        self._previous_sender = tx.check_sender
        assert self.service is not None
        tx.check_sender = GrpcCheckSender(self.service, tx.check_sender)
        if self.service.access is not None:
            clients = self.ctx.clients
            self._previous_filter = clients.producer_filter
            clients.producer_filter = self._producer_filter
        if self._listener is not None:
            await self._listener.start_serving()
        log.info(
            "grpc_server_started",
            address=f"{cfg.bind_address}:{port}",
            tls=secure,
            transport=cfg.grpc_transport,
        )
        return port

    async def _start_grpcio(self, secure: bool) -> int:
        cfg = self.ctx.config
        server = grpc.aio.server(options=[*connection_options(cfg), ("grpc.so_reuseport", 0)])
        address = f"{cfg.bind_address}:{self.port}"
        if secure:
            assert self.tls is not None
            require = cfg.tls_server_need_client_auth == "require"
            port = server.add_secure_port(
                address, CertificateFetcher(self.tls, require).credentials()
            )
        else:
            port = server.add_insecure_port(address)
        if port == 0:
            raise OSError(f"cannot bind the gRPC port {cfg.bind_address}:{self.port}")
        self.port = port
        self.service = MessagingService(self.core, self.acl, port, self.quota)
        server.add_generic_rpc_handlers((handlers(self.service),))
        await server.start()
        self._server = server
        return int(port)

    async def _bind_native(self, secure: bool) -> int:
        """Bind the port for :mod:`.h2` (serving starts once everything is wired)."""
        cfg = self.ctx.config
        h2 = H2Server(
            {},
            max_receive=cfg.max_message_size + 1024 * 1024,
            first_frame_timeout=cfg.client_first_frame_timeout / 1000.0,
            write_stall_timeout=cfg.client_write_stall_timeout / 1000.0,
            on_protocol_error=self._protocol_error,
        )
        listener: asyncio.Server | TlsServer
        if secure:
            assert self.tls is not None
            listener = await TlsServer.bind(
                cfg.bind_address,
                self.port,
                h2.protocol,
                self.tls,
                mode="enforcing",
                handshake_timeout=cfg.tls_handshake_timeout,
                on_rejected=self._protocol_error,
                h2=True,
            )
        else:
            listener = await asyncio.get_running_loop().create_server(
                h2.protocol, cfg.bind_address, self.port, start_serving=False, reuse_address=True
            )
        port = int(listener.sockets[0].getsockname()[1])
        self.port = port
        self.service = MessagingService(self.core, self.acl, port, self.quota)
        h2.methods = native_methods(self.service)
        self._h2 = h2
        self._listener = listener
        return port

    def _protocol_error(self, peer: str, detail: str) -> None:
        """A connection answered with GOAWAY, or a refused TLS handshake: counted as the
        remoting port counts its malformed frames and refused handshakes."""
        self.ctx.metrics.protocol_errors.inc()

    def _producer_filter(self, conn: Any, group: str) -> bool:
        """With the ACL on: which producers may be asked about a transaction of ``group``
        (gRPC clients by the accounts of their streams, remoting connections as before)."""
        if isinstance(conn, GrpcPeer):
            assert self.service is not None
            return self.service.may_check(conn, group)
        previous = self._previous_filter
        return previous is None or previous(conn, group)

    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Stop accepting, end the Telemetry streams, give other calls ``grace`` seconds."""
        server, self._server = self._server, None
        listener, self._listener = self._listener, None
        h2, self._h2 = self._h2, None
        if server is None and listener is None:
            return
        if self.service is not None:
            await self.service.close_streams()
        if server is not None:
            await server.stop(grace)
        if listener is not None and h2 is not None:
            listener.close()
            h2.goaway_all()
            deadline = time.monotonic() + grace
            while h2.busy and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            h2.close_all()
            await asyncio.sleep(0)
        if self._previous_sender is not None:
            self.core.tx.check_sender = self._previous_sender
        if self.service is not None and self.service.access is not None:
            self.ctx.clients.producer_filter = self._previous_filter
        log.info("grpc_server_stopped")


class CertificateFetcher:
    """gRPC's certificate fetcher: the broker's TLS material, anew after each reload.

    gRPC calls it from its own threads before every handshake; it only compares one reference
    (the files are read by the broker's TLS poll, off every loop).
    """

    def __init__(self, tls: ServerTls, require_client_auth: bool) -> None:
        self._tls = tls
        self._require = require_client_auth
        assert tls.material is not None
        self._served: TlsMaterial = tls.material

    def _configuration(self, m: TlsMaterial) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(m.key, m.chain)], root_certificates=m.trust if self._require else None
        )

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._configuration(self._served), self, require_client_authentication=self._require
        )

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        m = self._tls.material
        if m is None or m is self._served:
            return None
        self._served = m
        log.info("grpc_certificate_reloaded", cert=self._tls.files.cert_path)
        return self._configuration(m)


SERVICE_NAME = "apache.rocketmq.v2.MessagingService"
#: What grpc-java (RocketMQ's proxy) answers for a request that is not valid protobuf.
MALFORMED_DETAILS = "Invalid protobuf byte sequence"


def _deserializer(cls: Any) -> Callable[[bytes], Any]:
    """Parse a request; a malformed one becomes :class:`Malformed` (the method answers it with
    INTERNAL, as grpc-java does) instead of an exception logged by grpcio as UNKNOWN."""

    def parse(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except DecodeError as exc:
            return Malformed(str(exc))

    return parse


def _refusal(response: Any, request: Any, st: Any) -> Any:
    """The answer to a call the ACL refused: ``st`` in the response's Status (and in each entry
    of a SendMessage answer, as for any refused send)."""
    out = response(status=st)
    if response is spb.SendMessageResponse and not isinstance(request, Malformed):
        out.entries.extend(spb.SendResultEntry(status=st) for _ in request.messages)
    return out


def _too_many(exc: SystemBusyError) -> Any:
    """A quota's refusal: what RocketMQ's proxy answers a flow-controlled request."""
    return status(Code.TOO_MANY_REQUESTS, str(exc))


def _unary(service: MessagingService, name: str, response: Any) -> Callable[..., Any]:
    method = getattr(service, name)
    metric = f"grpc:{name}"
    clock = time.perf_counter

    @functools.wraps(method)
    async def call(request: Any, context: Context) -> Any:
        if service.access is not None:
            refused = service.admit(name, request, context)
            if refused is not None:
                return _refusal(response, request, refused)
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INTERNAL, MALFORMED_DETAILS)
        # A send's permission and produce quota: the send use case's (messaging/admission.py).
        t0 = clock()
        try:
            return await method(request, context)
        finally:
            service.ctx.metrics.observe_latency(metric, clock() - t0)

    return call


def _server_streaming(service: MessagingService, name: str, response: Any) -> Callable[..., Any]:
    method = getattr(service, name)
    consume = name == "ReceiveMessage"

    @functools.wraps(method)
    async def call(request: Any, context: Context) -> AsyncIterator[Any]:
        if service.access is not None:
            refused = service.admit(name, request, context)
            if refused is not None:
                yield _refusal(response, request, refused)
                return
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INTERNAL, MALFORMED_DETAILS)
        quota = service.quota if consume else None
        key = ""
        if quota is not None:
            key = service.quota_key(context)
            try:
                await quota.throttle(key, "consume", 0)
            except SystemBusyError as exc:
                yield _refusal(response, request, _too_many(exc))
                return
        t0 = time.perf_counter()
        async for item in method(request, context):
            if quota is not None and item.HasField("message"):
                quota.charge(key, "consume", len(item.message.body))
            yield item
        service.ctx.metrics.observe_latency(f"grpc:{name}", time.perf_counter() - t0)

    return call


#: Kinds of RPC (as :mod:`.h2` numbers them).
UNARY, SERVER_STREAMING, BIDI = 0, 1, 2


def method_table(
    service: MessagingService,
) -> dict[str, tuple[int, Callable[[bytes], Any], Callable[..., Any], Callable[[Any], bytes]]]:
    """Every RPC declared in service.proto, by name: its kind, request parser, handler (bound
    to ``service``, with the ACL, quota and metrics around it) and response serializer; what
    both transports serve."""
    desc = spb.DESCRIPTOR.services_by_name["MessagingService"]
    table: dict[
        str, tuple[int, Callable[[bytes], Any], Callable[..., Any], Callable[[Any], bytes]]
    ] = {}
    for m in desc.methods:
        req = _deserializer(getattr(spb, m.input_type.name))
        response = getattr(spb, m.output_type.name)
        resp = response.SerializeToString
        if m.client_streaming and m.server_streaming:
            # Telemetry checks its stream and each Settings command itself
            table[m.name] = (BIDI, req, getattr(service, m.name), resp)
        elif m.server_streaming:
            table[m.name] = (
                SERVER_STREAMING,
                req,
                _server_streaming(service, m.name, response),
                resp,
            )
        else:
            table[m.name] = (UNARY, req, _unary(service, m.name, response), resp)
    return table


def handlers(service: MessagingService) -> grpc.GenericRpcHandler:
    """The ``grpc.aio`` method handlers of every RPC, bound to ``service``."""
    table: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for name, (kind, req, handler, resp) in method_table(service).items():
        make = (
            grpc.stream_stream_rpc_method_handler
            if kind == BIDI
            else grpc.unary_stream_rpc_method_handler
            if kind == SERVER_STREAMING
            else grpc.unary_unary_rpc_method_handler
        )
        table[name] = make(handler, request_deserializer=req, response_serializer=resp)
    return grpc.method_handlers_generic_handler(SERVICE_NAME, table)


def native_methods(service: MessagingService) -> dict[bytes, Method]:
    """The same RPCs for the native transport, by request ``:path``."""
    return {
        f"/{SERVICE_NAME}/{name}".encode(): Method(kind, req, handler)
        for name, (kind, req, handler, _) in method_table(service).items()
    }
