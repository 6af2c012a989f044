"""The application's hooks into a client's life: connection state changes and rebalances.

Both run on the client's event loop (for the blocking classes, its private loop thread): keep
them short, and do not call a blocking txmq client from them.  An exception a hook raises is
logged and otherwise ignored.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .logs import get_logger

if TYPE_CHECKING:
    from .route import MessageQueue

log = get_logger(__name__)


class ConnectionState(enum.StrEnum):
    """What happened to a client's connection to a broker."""

    #: The client connected (at start).
    CONNECTED = "connected"
    #: The connection dropped; the client reconnects in the background.
    LOST = "lost"
    #: The connection is back (and the client re-registered with the broker).
    RECONNECTED = "reconnected"


#: ``callback(address, state)``: ``address`` is the broker's ``"host:port"`` as given.
ConnectionStateCallback = Callable[[str, ConnectionState], Any]
#: ``callback(assigned, revoked)``: the queues this member took and gave up in one rebalance.
RebalanceCallback = Callable[["list[MessageQueue]", "list[MessageQueue]"], Any]


def call_hook(hook: Callable[..., Any], *args: Any) -> None:
    """Run an application hook; an exception it raises is logged, not raised."""
    try:
        hook(*args)
    except Exception as exc:  # a faulty hook must not break the client
        log.warning(
            "callback_failed", callback=getattr(hook, "__name__", repr(hook)), error=repr(exc)
        )


__all__ = [
    "ConnectionState",
    "ConnectionStateCallback",
    "RebalanceCallback",
    "call_hook",
]
