"""Start and stop the ``grpc.aio`` server of the RocketMQ 5 front end on the broker's loop."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
import structlog
from google.protobuf.message import DecodeError

from .service import GrpcCheckSender, Malformed, MessagingService
from .v2 import service_pb2 as spb

if TYPE_CHECKING:
    from ..server import BrokerController
    from ..transaction.service import CheckSender

log = structlog.get_logger(__name__)

#: Seconds in-flight RPCs get to finish when the broker stops.
STOP_GRACE_S = 2.0


class GrpcServer:
    """``apache.rocketmq.v2.MessagingService`` on ``grpcServerPort`` of ``bindAddress``."""

    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        self.port = broker.config.grpc_server_port
        self._server: grpc.aio.Server | None = None
        self.service: MessagingService | None = None
        self._previous_sender: CheckSender | None = None

    async def start(self) -> int:
        cfg = self.broker.config
        # A request may carry a body of maxMessageSize plus its properties and framing; a
        # larger one is refused by gRPC itself (RESOURCE_EXHAUSTED) before it is parsed.
        limit = cfg.max_message_size + 1024 * 1024
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
            ]
        )
        port = server.add_insecure_port(f"{cfg.bind_address}:{self.port}")
        if port == 0:
            raise OSError(f"cannot bind the gRPC port {cfg.bind_address}:{self.port}")
        self.port = port
        self.service = MessagingService(self.broker, port)
        server.add_generic_rpc_handlers((handlers(self.service),))
        await server.start()
        self._server = server
        tx = self.broker.transactions
        self._previous_sender = tx.check_sender
        tx.check_sender = GrpcCheckSender(self.service, tx.check_sender)
        log.info("grpc_server_started", address=f"{cfg.bind_address}:{port}")
        return int(port)

    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Stop accepting, end the Telemetry streams, give other calls ``grace`` seconds."""
        server, self._server = self._server, None
        if server is None:
            return
        if self.service is not None:
            await self.service.close_streams()
        await server.stop(grace)
        if self._previous_sender is not None:
            self.broker.transactions.check_sender = self._previous_sender
        log.info("grpc_server_stopped")


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


def _unary(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INTERNAL, MALFORMED_DETAILS)
        return await method(request, context)

    return call


def _server_streaming(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INTERNAL, MALFORMED_DETAILS)
        async for item in method(request, context):
            yield item

    return call


def handlers(service: MessagingService) -> grpc.GenericRpcHandler:
    """The method handlers of every RPC declared in service.proto, bound to ``service``."""
    desc = spb.DESCRIPTOR.services_by_name["MessagingService"]
    table: dict[str, grpc.RpcMethodHandler] = {}
    for m in desc.methods:
        req = _deserializer(getattr(spb, m.input_type.name))
        resp = getattr(spb, m.output_type.name).SerializeToString
        impl = getattr(service, m.name)
        if m.client_streaming and m.server_streaming:
            table[m.name] = grpc.stream_stream_rpc_method_handler(
                impl, request_deserializer=req, response_serializer=resp
            )
        elif m.server_streaming:
            table[m.name] = grpc.unary_stream_rpc_method_handler(
                _server_streaming(impl), request_deserializer=req, response_serializer=resp
            )
        else:
            table[m.name] = grpc.unary_unary_rpc_method_handler(
                _unary(impl), request_deserializer=req, response_serializer=resp
            )
    return grpc.method_handlers_generic_handler(SERVICE_NAME, table)
