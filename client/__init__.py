"""The txmq Python SDK: an asyncio core with a thin synchronous facade.

Example::

    from txmq.client import Producer, PushConsumer, Message

    with Producer("orders-producer", broker="127.0.0.1:10911") as producer:
        result = producer.send(Message("orders", b"...", tags="created", keys="order-1"))

    def on_message(msg):          # return = consumed; raise = deliver again later
        ...

    consumer = PushConsumer("billing", broker="127.0.0.1:10911")
    consumer.subscribe("orders", "created || paid", on_message)
    consumer.start()
"""

from txmq.protocol.errors import (
    BrokerResponseError,
    BrokerSystemError,
    ConnectionClosedError,
    FencedError,
    FlushDiskTimeoutError,
    FlushSlaveTimeoutError,
    FrameTooLargeError,
    IllegalOperationError,
    InvalidParameterError,
    MalformedFrameError,
    MessageIllegalError,
    NoMessageError,
    NoPermissionError,
    PollingFullError,
    PollingTimeoutError,
    ProtocolError,
    PullNotFoundError,
    PullOffsetMovedError,
    PullRetryImmediatelyError,
    QueryNotFoundError,
    RequestCodeNotSupportedError,
    RequestTimeoutError,
    ServiceNotAvailableError,
    SlaveNotAvailableError,
    SubscriptionGroupNotExistError,
    SubscriptionNotExistError,
    SubscriptionNotLatestError,
    SystemBusyError,
    TopicNotExistError,
    TransactionFailedError,
    TxmqError,
)
from txmq.protocol.message import Message, MessageExt

from . import telemetry
from ._txn_common import RollbackOnCheck, TransactionInDoubtError
from .admin import AsyncAdminClient
from .callbacks import ConnectionState
from .config import ClientConfig, RetryPolicy
from .consumer import AsyncPushConsumer, ConsumeFrom
from .errors import ClientStateError, InvalidMessageError
from .filter import SqlExpression, sql
from .offset_store import OffsetStoreError
from .orderly import AsyncOrderlyPushConsumer, QueueLockedError
from .producer import AsyncProducer, SendResult, SendStatus
from .pull_consumer import AsyncPullConsumer, PullResult, PullStatus
from .remoting import BrokerConnection
from .route import MessageQueue
from .simple_consumer import AsyncSimpleConsumer, AsyncStreamConsumer, ReceivedMessage
from .sync import (
    AdminClient,
    OrderlyPushConsumer,
    Producer,
    PullConsumer,
    PushConsumer,
    SimpleConsumer,
)
from .transaction import (
    AsyncTransaction,
    AsyncTransactionProducer,
    CrossGroupUnavailableError,
    LocalTransactionState,
    Transaction,
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
)
from .two_phase import PreparedTransaction, PreparedTransactionUnknownError

__all__ = [
    "AdminClient",
    "AsyncAdminClient",
    "SqlExpression",
    "sql",
    "telemetry",
    "AsyncProducer",
    "AsyncTransaction",
    "AsyncTransactionProducer",
    "CrossGroupUnavailableError",
    "TransactionInDoubtError",
    "LocalTransactionState",
    "RollbackOnCheck",
    "Transaction",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "PreparedTransaction",
    "PreparedTransactionUnknownError",
    "AsyncOrderlyPushConsumer",
    "AsyncPullConsumer",
    "AsyncPushConsumer",
    "AsyncSimpleConsumer",
    "AsyncStreamConsumer",
    "ReceivedMessage",
    "SimpleConsumer",
    "BrokerConnection",
    "ClientConfig",
    "ConnectionState",
    "RetryPolicy",
    "ClientStateError",
    "ConnectionClosedError",
    "ConsumeFrom",
    "InvalidMessageError",
    "OffsetStoreError",
    "Message",
    "MessageExt",
    "MessageQueue",
    "OrderlyPushConsumer",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "QueueLockedError",
    "RequestTimeoutError",
    "SendResult",
    "SendStatus",
    "TopicNotExistError",
    "TxmqError",
    "BrokerResponseError",
    "BrokerSystemError",
    "FencedError",
    "FlushDiskTimeoutError",
    "FlushSlaveTimeoutError",
    "FrameTooLargeError",
    "IllegalOperationError",
    "InvalidParameterError",
    "MalformedFrameError",
    "MessageIllegalError",
    "NoMessageError",
    "NoPermissionError",
    "ProtocolError",
    "PullNotFoundError",
    "PullOffsetMovedError",
    "PollingFullError",
    "PollingTimeoutError",
    "PullRetryImmediatelyError",
    "QueryNotFoundError",
    "RequestCodeNotSupportedError",
    "ServiceNotAvailableError",
    "SlaveNotAvailableError",
    "SubscriptionGroupNotExistError",
    "SubscriptionNotExistError",
    "SubscriptionNotLatestError",
    "SystemBusyError",
    "TransactionFailedError",
]
