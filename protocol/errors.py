"""One error table, used both ways.

Every non-success :class:`~txmq.protocol.codes.ResponseCode` has an exception class.  The broker
turns an exception into a response with ``error.code`` and ``str(error)`` as remark; the client
turns a response back into the same class with :func:`error_for_code`.  ``retriable`` tells a
client whether sending the same request again may succeed.
"""

from __future__ import annotations

from .codes import ResponseCode


class TxmqError(Exception):
    """Root of every txmq error."""

    code: int = ResponseCode.SYSTEM_ERROR
    retriable: bool = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.remark = message


class ProtocolError(TxmqError):
    """Bytes that are not a valid txmq/RocketMQ frame or header.  The only error the decoder
    raises."""


class FrameTooLargeError(ProtocolError):
    """The length prefix announces a frame above the limit; the connection must be closed."""


class MalformedFrameError(ProtocolError):
    """A well-delimited frame whose header cannot be decoded.  The stream stays in sync, so the
    connection can answer with an error and go on."""


class ConnectionClosedError(TxmqError, ConnectionError):
    """The connection closed before the answer arrived."""

    retriable = True


class RequestTimeoutError(TxmqError, TimeoutError):
    """No answer arrived within the timeout."""

    retriable = True


class BrokerResponseError(TxmqError):
    """Base of the errors that mirror a response code.

    A subclass names its code, and whether a retry may succeed, in its class statement
    (``class SystemBusyError(BrokerResponseError, code=..., retriable=True)``); that also enters
    it in the table :func:`error_for_code` reads.  Subclasses that name no code (narrower errors
    of the broker's own) keep their parent's code and stay out of the table.
    """

    def __init_subclass__(cls, code: int | None = None, retriable: bool = False) -> None:
        super().__init_subclass__()
        if code is None:
            return
        if code in _BY_CODE:
            raise TypeError(f"response code {code} has two error classes")
        cls.code = code
        cls.retriable = retriable
        _BY_CODE[code] = cls


_BY_CODE: dict[int, type[BrokerResponseError]] = {}


class BrokerSystemError(BrokerResponseError, code=ResponseCode.SYSTEM_ERROR):
    """The broker failed to handle the request (also the class of unknown codes)."""


class SystemBusyError(BrokerResponseError, code=ResponseCode.SYSTEM_BUSY, retriable=True):
    """The broker is overloaded; the request may succeed later."""


class RequestCodeNotSupportedError(
    BrokerResponseError, code=ResponseCode.REQUEST_CODE_NOT_SUPPORTED
):
    """The broker does not know the request code."""


class TransactionFailedError(BrokerResponseError, code=ResponseCode.TRANSACTION_FAILED):
    """The transaction could not be ended as asked."""


class FencedError(TransactionFailedError):
    """A commit carrying consumer offsets was refused because the consumer is no longer the
    owner it was (its group rebalanced since, or it left the group): the whole transaction was
    rolled back.  Answered as TRANSACTION_FAILED with a remark starting ``fenced: ``."""


class FlushDiskTimeoutError(
    BrokerResponseError, code=ResponseCode.FLUSH_DISK_TIMEOUT, retriable=True
):
    """The message is stored but was not flushed to disk in time."""


class SlaveNotAvailableError(
    BrokerResponseError, code=ResponseCode.SLAVE_NOT_AVAILABLE, retriable=True
):
    """The message is stored but no replica is there to copy it."""


class FlushSlaveTimeoutError(
    BrokerResponseError, code=ResponseCode.FLUSH_SLAVE_TIMEOUT, retriable=True
):
    """The message is stored but was not replicated in time."""


class MessageIllegalError(BrokerResponseError, code=ResponseCode.MESSAGE_ILLEGAL):
    """The message breaks a rule of the broker (size, topic, properties)."""


class ServiceNotAvailableError(
    BrokerResponseError, code=ResponseCode.SERVICE_NOT_AVAILABLE, retriable=True
):
    """The broker does not take this request now (starting, stopping, a replica)."""


class NoPermissionError(BrokerResponseError, code=ResponseCode.NO_PERMISSION):
    """The account or the topic's permissions do not allow the request."""


class TopicNotExistError(BrokerResponseError, code=ResponseCode.TOPIC_NOT_EXIST):
    """The topic does not exist and is not created automatically."""


class PullNotFoundError(BrokerResponseError, code=ResponseCode.PULL_NOT_FOUND):
    """No message at the asked offset yet."""


class PullRetryImmediatelyError(
    BrokerResponseError, code=ResponseCode.PULL_RETRY_IMMEDIATELY, retriable=True
):
    """Nothing matched the filter; pull again at once."""


class PullOffsetMovedError(BrokerResponseError, code=ResponseCode.PULL_OFFSET_MOVED):
    """The asked offset is outside what the queue holds."""


class QueryNotFoundError(BrokerResponseError, code=ResponseCode.QUERY_NOT_FOUND):
    """No message matched the query."""


class SubscriptionNotExistError(BrokerResponseError, code=ResponseCode.SUBSCRIPTION_NOT_EXIST):
    """The group has no subscription to the topic."""


class SubscriptionNotLatestError(
    BrokerResponseError, code=ResponseCode.SUBSCRIPTION_NOT_LATEST, retriable=True
):
    """The subscription sent is older than the broker's."""


class SubscriptionGroupNotExistError(
    BrokerResponseError, code=ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
):
    """The consumer group does not exist."""


class InvalidParameterError(BrokerResponseError, code=ResponseCode.INVALID_PARAMETER):
    """A header field has an invalid value."""


class NoMessageError(BrokerResponseError, code=ResponseCode.NO_MESSAGE):
    """A pop consumer's ack or change of invisible time names no live delivery (acked,
    replaced by a later delivery, or unknown)."""


class PollingFullError(BrokerResponseError, code=ResponseCode.POLLING_FULL, retriable=True):
    """Too many pops are parked on the queue; pop again later."""


class PollingTimeoutError(BrokerResponseError, code=ResponseCode.POLLING_TIMEOUT, retriable=True):
    """A long-polled pop found nothing before its poll time ended."""


class IllegalOperationError(BrokerResponseError, code=ResponseCode.ILLEGAL_OPERATION):
    """The request is not allowed in the current state."""


def error_for_code(code: int, remark: str | None = None) -> BrokerResponseError:
    """The exception for a non-success response code (unknown codes map to SYSTEM_ERROR's class,
    with the number kept in the message)."""
    cls = _BY_CODE.get(code)
    if code == ResponseCode.TRANSACTION_FAILED and (remark or "").startswith("fenced: "):
        cls = FencedError
    if cls is None:
        err: BrokerResponseError = BrokerSystemError(
            f"response code {code}: {remark or ''}".strip()
        )
        err.code = code
        return err
    return cls(remark or cls.__name__)


def error_classes() -> dict[int, type[BrokerResponseError]]:
    """The table, for tests that assert it is total."""
    return dict(_BY_CODE)


#: What decoding a document of the wrong shape can raise (a missing key, a value of the wrong
#: type, a number past the range, nesting too deep): each parser turns these into its own
#: documented error.
MALFORMED_DOCUMENT: tuple[type[Exception], ...] = (
    ValueError,
    KeyError,
    TypeError,
    AttributeError,
    OverflowError,
    RecursionError,
)
