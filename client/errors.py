"""Errors raised by the SDK itself (the broker's errors come from :mod:`txmq.protocol.errors`)."""

from __future__ import annotations

from txmq.protocol.codes import ResponseCode
from txmq.protocol.errors import TxmqError


class InvalidMessageError(TxmqError, ValueError):
    """A message that the SDK refuses before sending it (bad topic name, empty or oversized
    body, ...).  Nothing was sent."""

    code = ResponseCode.MESSAGE_ILLEGAL


class ClientStateError(TxmqError, RuntimeError):
    """The client is used while not started, or after it was shut down."""
