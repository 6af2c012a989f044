"""Topic management: system topics, auto-creation, permissions, validation (the names are
in :mod:`txmq.protocol.topics`)."""

from __future__ import annotations

from dataclasses import KW_ONLY, InitVar, dataclass

import structlog

from txmq.protocol.errors import (
    MessageIllegalError,
    NoPermissionError,
    TopicNotExistError,
)
from txmq.protocol.topics import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    DLQ_GROUP_TOPIC_PREFIX,
    INTERNAL_TOPICS,
    POP_STATE_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    SCHEDULE_TOPIC,
    SYSTEM_TOPICS,
    TIMER_TOPIC,
    TOPIC_MAX_LENGTH,
    TOPIC_PATTERN,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TXN_OFFSETS_TOPIC,
    dlq_topic,
    retry_topic,
)

from .store import TopicConfig, TopicConfigManager

log = structlog.get_logger(__name__)

# TIMER_TOPIC: queue 0 holds timer messages waiting for their delivery time, queue 1 the record
# of which of them fired, queue 2 the record of which were recalled (see
# :mod:`txmq.broker.messaging.timer`).

PERM_PRIORITY = 0x8
PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1


def validate_topic(topic: str) -> None:
    """RocketMQ's rules: ``[%|a-zA-Z0-9_-]``, at most 127 characters."""
    if not topic:
        raise MessageIllegalError("the topic name is empty")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise MessageIllegalError(f"the topic name is longer than {TOPIC_MAX_LENGTH} characters")
    if not TOPIC_PATTERN.match(topic):
        raise MessageIllegalError(
            f"the topic name {topic!r} contains characters outside [%|a-zA-Z0-9_-]"
        )


@dataclass(eq=False)
class TopicManager:
    """Topic configs with RocketMQ's auto-creation rules, over the persisted table."""

    table: TopicConfigManager
    _: KW_ONLY
    auto_create: bool
    default_queue_nums: int
    delay_levels: InitVar[int]

    def __post_init__(self, delay_levels: int) -> None:
        table = self.table
        for name, queues in (
            (RMQ_SYS_TRANS_HALF_TOPIC, 1),
            (RMQ_SYS_TRANS_OP_HALF_TOPIC, 1),
            (TRANS_CHECK_MAX_TIME_TOPIC, 1),
            (SCHEDULE_TOPIC, delay_levels),
            # the committed copies of consumer offsets sent inside transactions
            (TXN_OFFSETS_TOPIC, 1),
            (TIMER_TOPIC, 3),
            (POP_STATE_TOPIC, 1),
        ):
            tc = table.get(name)
            if tc is None or tc.read_queue_nums < queues:
                table.put(
                    TopicConfig(
                        name,
                        read_queue_nums=queues,
                        write_queue_nums=queues,
                        perm=PERM_READ | PERM_WRITE,
                    )
                )

    def get(self, topic: str) -> TopicConfig | None:
        return self.table.get(topic)

    def route_config(self, topic: str) -> TopicConfig | None:
        """The config a route answer describes: the topic's own, or, for ``TBW102`` while
        auto-creation is on, an inheritable template with the default queue count (RocketMQ
        keeps it as a real topic; here it is never stored, listed or consumable)."""
        tc = self.table.get(topic)
        if tc is None and topic == AUTO_CREATE_TOPIC_KEY_TOPIC and self.auto_create:
            n = self.default_queue_nums
            tc = TopicConfig(
                topic,
                read_queue_nums=n,
                write_queue_nums=n,
                perm=PERM_READ | PERM_WRITE | PERM_INHERIT,
            )
        return tc

    def all(self) -> dict[str, TopicConfig]:
        return self.table.all()

    def create_or_update(self, tc: TopicConfig) -> TopicConfig:
        validate_topic(tc.topic_name)
        self.table.put(tc)
        log.info(
            "topic_updated",
            topic=tc.topic_name,
            read_queues=tc.read_queue_nums,
            write_queues=tc.write_queue_nums,
            perm=tc.perm,
        )
        return tc

    def delete(self, topic: str) -> bool:
        """Remove a topic's config (refused for the broker's own topics); True if it had one."""
        if topic in INTERNAL_TOPICS or topic == AUTO_CREATE_TOPIC_KEY_TOPIC:
            raise NoPermissionError(f"the topic[{topic}] is a system topic and cannot be deleted")
        removed = self.table.delete(topic)
        if removed:
            log.warning("topic_deleted", topic=topic)
        return removed

    def ensure(
        self, topic: str, queues: int = 1, perm: int = PERM_READ | PERM_WRITE
    ) -> TopicConfig:
        """Get a broker-owned topic (retry, DLQ), creating it if needed."""
        tc = self.table.get(topic)
        if tc is None:
            tc = TopicConfig(topic, read_queue_nums=queues, write_queue_nums=queues, perm=perm)
            self.table.put(tc)
            log.info("topic_created", topic=topic, queues=queues, reason="system")
        return tc

    def for_send(self, topic: str, requested_queue_nums: int) -> TopicConfig:
        """The config of a topic a client sends to; auto-creates it when allowed."""
        if topic in SYSTEM_TOPICS or topic == AUTO_CREATE_TOPIC_KEY_TOPIC:
            raise NoPermissionError(f"topic {topic} is a system topic; clients cannot send to it")
        validate_topic(topic)
        tc = self.table.get(topic)
        if tc is None:
            if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                return self.ensure(topic, 1)
            if not self.auto_create:
                raise TopicNotExistError(
                    f"topic[{topic}] not exist, apply first please! (autoCreateTopicEnable=false)"
                )
            n = max(
                1, min(requested_queue_nums or self.default_queue_nums, self.default_queue_nums)
            )
            tc = TopicConfig(
                topic, read_queue_nums=n, write_queue_nums=n, perm=PERM_READ | PERM_WRITE
            )
            self.table.put(tc)
            log.info("topic_created", topic=topic, queues=n, reason="auto_create")
        if not tc.perm & PERM_WRITE:
            raise NoPermissionError(f"the topic[{topic}] sending message is forbidden")
        return tc


# The topic names are defined in txmq.protocol.topics; those some broker modules take from
# here are re-exported.
__all__ = [
    "DLQ_GROUP_TOPIC_PREFIX",
    "INTERNAL_TOPICS",
    "PERM_INHERIT",
    "PERM_PRIORITY",
    "PERM_READ",
    "PERM_WRITE",
    "RETRY_GROUP_TOPIC_PREFIX",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "SCHEDULE_TOPIC",
    "SYSTEM_TOPICS",
    "TIMER_TOPIC",
    "TopicManager",
    "dlq_topic",
    "retry_topic",
    "validate_topic",
]


def config_from_queues(name: str, queue_ids: list[int], at_least: int = 1) -> TopicConfig:
    """A lost topic config made again from the consume queues the store has of it: as many
    read and write queues as its highest queue id needs (``at_least`` more if asked)."""
    n = max(max(queue_ids, default=0) + 1, at_least)
    return TopicConfig(name, read_queue_nums=n, write_queue_nums=n)
