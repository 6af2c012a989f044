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
    """Base of the errors that mirror a response code."""


class BrokerSystemError(BrokerResponseError):
    code = ResponseCode.SYSTEM_ERROR


class SystemBusyError(BrokerResponseError):
    code = ResponseCode.SYSTEM_BUSY
    retriable = True


class RequestCodeNotSupportedError(BrokerResponseError):
    code = ResponseCode.REQUEST_CODE_NOT_SUPPORTED


class TransactionFailedError(BrokerResponseError):
    code = ResponseCode.TRANSACTION_FAILED


class FlushDiskTimeoutError(BrokerResponseError):
    code = ResponseCode.FLUSH_DISK_TIMEOUT
    retriable = True


class SlaveNotAvailableError(BrokerResponseError):
    code = ResponseCode.SLAVE_NOT_AVAILABLE
    retriable = True


class FlushSlaveTimeoutError(BrokerResponseError):
    code = ResponseCode.FLUSH_SLAVE_TIMEOUT
    retriable = True


class MessageIllegalError(BrokerResponseError):
    code = ResponseCode.MESSAGE_ILLEGAL


class ServiceNotAvailableError(BrokerResponseError):
    code = ResponseCode.SERVICE_NOT_AVAILABLE
    retriable = True


class NoPermissionError(BrokerResponseError):
    code = ResponseCode.NO_PERMISSION


class TopicNotExistError(BrokerResponseError):
    code = ResponseCode.TOPIC_NOT_EXIST


class PullNotFoundError(BrokerResponseError):
    code = ResponseCode.PULL_NOT_FOUND


class PullRetryImmediatelyError(BrokerResponseError):
    code = ResponseCode.PULL_RETRY_IMMEDIATELY
    retriable = True


class PullOffsetMovedError(BrokerResponseError):
    code = ResponseCode.PULL_OFFSET_MOVED


class QueryNotFoundError(BrokerResponseError):
    code = ResponseCode.QUERY_NOT_FOUND


class SubscriptionNotExistError(BrokerResponseError):
    code = ResponseCode.SUBSCRIPTION_NOT_EXIST


class SubscriptionNotLatestError(BrokerResponseError):
    code = ResponseCode.SUBSCRIPTION_NOT_LATEST
    retriable = True


class SubscriptionGroupNotExistError(BrokerResponseError):
    code = ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST


class InvalidParameterError(BrokerResponseError):
    code = ResponseCode.INVALID_PARAMETER


class IllegalOperationError(BrokerResponseError):
    code = ResponseCode.ILLEGAL_OPERATION


_BY_CODE: dict[int, type[BrokerResponseError]] = {
    cls.code: cls
    for cls in (
        BrokerSystemError,
        SystemBusyError,
        RequestCodeNotSupportedError,
        TransactionFailedError,
        FlushDiskTimeoutError,
        SlaveNotAvailableError,
        FlushSlaveTimeoutError,
        MessageIllegalError,
        ServiceNotAvailableError,
        NoPermissionError,
        TopicNotExistError,
        PullNotFoundError,
        PullRetryImmediatelyError,
        PullOffsetMovedError,
        QueryNotFoundError,
        SubscriptionNotExistError,
        SubscriptionNotLatestError,
        SubscriptionGroupNotExistError,
        InvalidParameterError,
        IllegalOperationError,
    )
}


def error_for_code(code: int, remark: str | None = None) -> BrokerResponseError:
    """The exception for a non-success response code (unknown codes map to SYSTEM_ERROR's class,
    with the number kept in the message)."""
    cls = _BY_CODE.get(code)
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
