"""The messaging core: the broker's use cases written once, for every front end.

The remoting processors (:mod:`txmq.broker.processors`) and the RocketMQ 5 gRPC service
(:mod:`txmq.broker.grpc`) translate their wire format to and from :class:`MessagingCore` and map
its errors to their codes; what a send, a batch, a transaction decision, a delay or a dead
letter *does* is decided here, once.

* :mod:`.write` -- :class:`WritePath`: every append to the store, and who is told of it;
* :mod:`.fastpath` -- the direct paths: sends stored straight from the request, one seam;
* :mod:`.core` -- :class:`MessagingCore`: validation, topic creation, delay routing, halves,
  durability waits, dead-lettering and transaction decisions;
* :mod:`.read` and :mod:`.pop` -- the read side: pulls, filters, POP consumption.

The direction between this package and :mod:`txmq.broker.transaction` is one way: the use
cases here build on the transaction state machine and its service; the transaction package
imports nothing of this one (what it needs of it -- the message trace -- it names in a
protocol of its own).  This file imports nothing either: importing :mod:`.write` or
:mod:`.fastpath` never loads :mod:`.core` through it.  Import names from their modules.
"""
