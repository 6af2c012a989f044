"""The messaging core: the broker's use cases written once, for every front end.

The remoting processors (:mod:`txmq.broker.processors`) and the RocketMQ 5 gRPC service
(:mod:`txmq.broker.grpc`) translate their wire format to and from :class:`MessagingCore` and map
its errors to their codes; what a send, a batch, a transaction decision, a delay or a dead
letter *does* is decided here, once.

* :mod:`.write` -- :class:`WritePath`: every append to the store, and who is told of it;
* :mod:`.fastpath` -- batches stored straight from the request body, behind one switch;
* :mod:`.core` -- :class:`MessagingCore`: validation, topic creation, delay routing, halves,
  durability waits, dead-lettering and transaction decisions;
* :mod:`.read` and :mod:`.pop` -- the read side: pulls, filters, POP consumption.

The names below are loaded when first asked for: :mod:`.core` builds on the transaction
service, which itself uses this package's lower modules (fast paths, timers, trace), so
importing one of those must not import :mod:`.core` through this file.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core import MessagingCore, SendOutcome, SendReceipt
    from .write import AppendSubscriber, WritePath

_WHERE = {
    "MessagingCore": ".core",
    "SendOutcome": ".core",
    "SendReceipt": ".core",
    "AppendSubscriber": ".write",
    "WritePath": ".write",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where, __name__), name)


__all__ = ["AppendSubscriber", "MessagingCore", "SendOutcome", "SendReceipt", "WritePath"]
