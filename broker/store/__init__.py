"""The durable store: commit log, consume queues, checkpoint, topic configs and consumer
offsets (RocketMQ's store, in synchronous Python; no asyncio, no sockets)."""

from .checkpoint import StoreCheckpoint
from .commit_log import FORMAT_VERSION, CommitLog
from .config import StoreConfig
from .consume_queue import ConsumeQueue
from .consumer_offset import ConsumerOffsetManager
from .errors import StoreCorruptError, StoreIOError, StoreLockedError
from .fileio import atomic_write
from .message_store import MessageStore
from .recovery import RecoveryReport
from .results import (
    AppendResult,
    EncodedMessage,
    GetMessageResult,
    GetMessageStatus,
    PutMessageResult,
    encode_for_store,
)
from .topic_config import PERM_INHERIT, PERM_READ, PERM_WRITE, TopicConfig, TopicConfigManager

__all__ = [
    "FORMAT_VERSION",
    "AppendResult",
    "EncodedMessage",
    "PERM_INHERIT",
    "PERM_READ",
    "PERM_WRITE",
    "CommitLog",
    "ConsumeQueue",
    "ConsumerOffsetManager",
    "GetMessageResult",
    "GetMessageStatus",
    "MessageStore",
    "PutMessageResult",
    "RecoveryReport",
    "StoreCheckpoint",
    "StoreConfig",
    "StoreCorruptError",
    "StoreIOError",
    "StoreLockedError",
    "TopicConfig",
    "TopicConfigManager",
    "atomic_write",
    "encode_for_store",
]
