"""The RocketMQ 5 gRPC front end: ``apache.rocketmq.v2.MessagingService`` served by the broker
process on its own port (``grpcServerPort``, on with ``grpcServerEnable``), over the same store,
topics, consumer offsets and transaction service as the remoting protocol.

It needs the optional ``grpc`` extra (grpcio and protobuf: ``pip install -e '.[grpc]'`` in the
checkout, or the wheel with ``[grpc]``); the modules of this package import ``grpc`` and are
only imported when the front end is enabled.

Two transports serve it on the broker's own event loop (``grpcTransport``), so every RPC runs on
the same thread as the remoting processors and the store (which is not thread-safe) with no
locking: ``native`` (:mod:`.h2`, txmq's own HTTP/2 server for gRPC, an asyncio protocol like the
remoting port's) and ``grpcio`` (``grpc.aio``, the fallback).  grpc.aio does not need the
default asyncio loop - its completion queue is polled from a background thread that hands events
to whichever loop started the server through that loop's thread-safe callbacks
(``call_soon_threadsafe``), which uvloop implements - so it is supported there;
``tests/compat/test_grpc_frontend.py`` runs every case on uvloop.

Modules:

* :mod:`.vendor.v2` - the generated protobuf/gRPC modules (from ``vendor/protos/``, see
  :mod:`.codegen`);
* :mod:`.convert` - protobuf messages to stored messages and back, status codes;
* POP consumption (receipt handles, invisibility) is the core's: :mod:`..messaging.pop`;
* :mod:`.service` - the servicer, the client registry and the check-back sender;
* :mod:`.h2` - the native transport: HTTP/2 framing, flow control, gRPC calls;
* :mod:`.server` - the method table both transports serve, start and bounded stop.
"""
