"""Topic names with a meaning on the wire: the broker's system topics, the per-group retry and
dead-letter topics, the auto-create template, and the rules a topic name follows.

Broker, SDK and Spark connector take these names from here, so a name is spelt once.
"""

from __future__ import annotations

import re

#: Where half messages wait for their decision.
RMQ_SYS_TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
#: Decisions (op records) about half messages.
RMQ_SYS_TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
#: Halves that used up their check budget, waiting for an operator.
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
#: Delayed messages, one queue per delay level.
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: The route a stock client asks for when its topic has none yet; it then sends with this
#: route and the broker creates the topic (``autoCreateTopicEnable``).
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
#: ``%RETRY%<group>``: messages a consumer group asked to get again later.
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
#: ``%DLQ%<group>``: messages a consumer group gave up on.
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"

#: POP consumption's state (receipt handles, invisible times, attempts), replayed at start.
POP_STATE_TOPIC = "TXMQ_SYS_POP_STATE"

#: Topics the broker owns; clients cannot send to them.
SYSTEM_TOPICS = frozenset(
    {
        POP_STATE_TOPIC,
        RMQ_SYS_TRANS_HALF_TOPIC,
        RMQ_SYS_TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        SCHEDULE_TOPIC,
    }
)

#: The timer's own topic (RocketMQ 5's name): messages wait there until their delivery time.
TIMER_TOPIC = "rmq_sys_wheel_timer"
#: The committed copies of consumer offsets sent inside transactions (see txn_offsets).
TXN_OFFSETS_TOPIC = "TXMQ_SYS_TXN_OFFSETS"

#: Every topic the broker makes for itself: the system topics, and the two a client's request
#: reaches only through the broker (a timer message, a transaction's offsets).  Views, metrics
#: and replication leave them out; only :data:`SYSTEM_TOPICS` refuse a client's send.
INTERNAL_TOPICS = SYSTEM_TOPICS | {TIMER_TOPIC, TXN_OFFSETS_TOPIC}

#: Topic names RocketMQ accepts (``Validators.VALID_PATTERN_STR``); at most
#: :data:`TOPIC_MAX_LENGTH` characters.
TOPIC_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")
TOPIC_MAX_LENGTH = 127


def retry_topic(group: str) -> str:
    """The retry topic of a consumer group."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    """The dead-letter topic of a consumer group."""
    return DLQ_GROUP_TOPIC_PREFIX + group


__all__ = [
    "AUTO_CREATE_TOPIC_KEY_TOPIC",
    "DLQ_GROUP_TOPIC_PREFIX",
    "RETRY_GROUP_TOPIC_PREFIX",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "SCHEDULE_TOPIC",
    "INTERNAL_TOPICS",
    "POP_STATE_TOPIC",
    "SYSTEM_TOPICS",
    "TIMER_TOPIC",
    "TOPIC_MAX_LENGTH",
    "TOPIC_PATTERN",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "TXN_OFFSETS_TOPIC",
    "dlq_topic",
    "retry_topic",
]
