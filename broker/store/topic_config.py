"""Topic configs (RocketMQ's ``TopicConfig`` / ``TopicConfigManager``), persisted as JSON.

File: ``<root>/config/topics.json``, RocketMQ's shape with its camelCase keys, replaced
atomically on every change (changes are rare: topic creation, perm or queue-count updates)::

    {"topicConfigTable": {"TopicA": {"topicName": "TopicA", "readQueueNums": 4,
                                     "writeQueueNums": 4, "perm": 6,
                                     "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0,
                                     "order": false}},
     "dataVersion": {"timestamp": 1700000000000, "counter": 3}}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .versioned_table import ConfigJsonTable

PERM_INHERIT = 1
PERM_WRITE = 2
PERM_READ = 4


@dataclass
class TopicConfig:
    """One topic's queue counts and permissions.

    Attributes:
        topic_name: the topic.
        read_queue_nums: queues consumers read.
        write_queue_nums: queues producers write.
        perm: PERM_READ | PERM_WRITE (6) by default.
        topic_sys_flag: RocketMQ's topic system flag.
        order: whether the topic is ordered.
    """

    topic_name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = PERM_READ | PERM_WRITE
    topic_sys_flag: int = 0
    order: bool = False

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with RocketMQ's keys."""
        return {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": self.topic_sys_flag,
            "order": self.order,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any] | str | bytes) -> TopicConfig:
        """Read RocketMQ's form (a dict, or its JSON text); unknown keys are ignored.

        Raises:
            ValueError: ``topicName`` is missing or a field has the wrong type.
        """
        data: Any = json.loads(doc) if isinstance(doc, str | bytes) else doc
        if not isinstance(data, Mapping) or not isinstance(data.get("topicName"), str):
            raise ValueError(f"not a topic config: {doc!r}")

        def as_int(key: str, default: int) -> int:
            value = data.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise ValueError(f"topic config {key} is not an integer: {value!r}")
            return int(value)

        order = data.get("order", False)
        if isinstance(order, str):
            order = order.strip().lower() == "true"
        return cls(
            topic_name=data["topicName"],
            read_queue_nums=as_int("readQueueNums", 4),
            write_queue_nums=as_int("writeQueueNums", 4),
            perm=as_int("perm", PERM_READ | PERM_WRITE),
            topic_sys_flag=as_int("topicSysFlag", 0),
            order=bool(order),
        )


class TopicConfigManager(ConfigJsonTable[TopicConfig]):
    """The persisted table of topic configs, written atomically.

    By default every change is written at once.  With ``write_behind`` a change only marks the
    table dirty and :meth:`persist` writes it; that method may run on another thread (the
    broker calls it off its event loop and waits for it before answering a request that
    created a topic).

    Args:
        path: ``<root>/config/topics.json`` (its folder is created on first write).
        write_behind: leave writing to :meth:`persist`.
    """

    what = "topic configs"
    table_key = "topicConfigTable"

    def __init__(self, path: str, *, write_behind: bool = False) -> None:
        super().__init__(path, TopicConfig.from_json)
        self.write_behind = write_behind

    def get(self, name: str) -> TopicConfig | None:
        return self._table.get(name)

    def put(self, tc: TopicConfig) -> None:
        """Add or replace a topic config (and persist the table unless ``write_behind``)."""
        self._put(tc.topic_name, tc)
        if not self.write_behind:
            self.persist()

    def delete(self, name: str) -> bool:
        """Remove a topic config; True if there was one."""
        if not self._remove(name):
            return False
        if not self.write_behind:
            self.persist()
        return True

    @property
    def dirty(self) -> bool:
        """A change is not written yet."""
        return self._dirty

    def all(self) -> dict[str, TopicConfig]:
        """A copy of the table."""
        return dict(self._table)
