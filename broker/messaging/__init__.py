"""The messaging core: the broker's use cases written once, for every front end.

The remoting processors (:mod:`txmq.broker.processors`) and the RocketMQ 5 gRPC service
(:mod:`txmq.broker.grpc`) translate their wire format to and from :class:`MessagingCore` and map
its errors to their codes; what a send, a batch, a transaction decision, a delay or a dead
letter *does* is decided here, once.

* :mod:`.write` -- :class:`WritePath`: every append to the store, and who is told of it;
* :mod:`.fastpath` -- batches stored straight from the request body, behind one switch;
* :mod:`.core` -- :class:`MessagingCore`: validation, topic creation, delay routing, halves,
  durability waits, dead-lettering and transaction decisions.
"""

from .core import MessagingCore, SendOutcome, SendReceipt
from .write import AppendSubscriber, WritePath

__all__ = ["AppendSubscriber", "MessagingCore", "SendOutcome", "SendReceipt", "WritePath"]
