"""The RocketMQ 5 gRPC front end: ``apache.rocketmq.v2.MessagingService`` served by the broker
process on its own port (``grpcServerPort``, on with ``grpcServerEnable``), over the same store,
topics, consumer offsets and transaction service as the remoting protocol.

It needs the optional ``grpc`` extra (grpcio and protobuf: ``pip install -e '.[grpc]'`` in the
checkout, or the wheel with ``[grpc]``); the modules of this package import ``grpc`` and are
only imported when the front end is enabled.

The server is ``grpc.aio`` on the broker's own event loop, so every RPC runs on the same thread
as the remoting processors and the store (which is not thread-safe) with no locking.  The broker
runs on uvloop: grpc.aio does not need the default asyncio loop - its completion queue is polled
from a background thread that hands events to whichever loop started the server through that
loop's thread-safe callbacks (``call_soon_threadsafe``), which uvloop implements - so it is
supported there; ``tests/compat/test_grpc_frontend.py`` runs every case on uvloop.

Modules:

* :mod:`.v2` - the generated protobuf/gRPC modules (from ``protos/``, see :mod:`.codegen`);
* :mod:`.convert` - protobuf messages to stored messages and back, status codes;
* POP consumption (receipt handles, invisibility) is the core's: :mod:`..messaging.pop`;
* :mod:`.service` - the servicer, the client registry and the check-back sender;
* :mod:`.server` - start and bounded stop of the ``grpc.aio`` server.
"""
