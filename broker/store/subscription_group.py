"""Consumer group settings (RocketMQ's ``SubscriptionGroupConfig`` /
``SubscriptionGroupManager``), persisted as JSON.

File: ``<root>/config/subscriptionGroup.json``, RocketMQ's shape with its camelCase keys,
replaced atomically on every change (changes are rare: mqadmin ``updateSubGroup``,
``txmq group update``, ``deleteSubGroup``)::

    {"subscriptionGroupTable": {"G": {"groupName": "G", "consumeEnable": true,
                                      "consumeMessageOrderly": true, "retryMaxTimes": 16, ...}},
     "dataVersion": {"timestamp": 1700000000000, "counter": 3}}

A group that has no entry has RocketMQ's defaults (:meth:`SubscriptionGroupManager.effective`).
Keys this version does not know (a newer RocketMQ's) are kept and written back unchanged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .versioned_table import ConfigJsonTable

#: RocketMQ's ``GroupRetryPolicy`` default: the customized (delay-level) policy.
DEFAULT_RETRY_POLICY: dict[str, Any] = {"type": "CUSTOMIZED"}

#: RocketMQ's JSON key of each field, in the order fastjson writes them (sorted).
_KEYS = {
    "attributes": "attributes",
    "brokerId": "broker_id",
    "consumeBroadcastEnable": "consume_broadcast_enable",
    "consumeEnable": "consume_enable",
    "consumeFromMinEnable": "consume_from_min_enable",
    "consumeMessageOrderly": "consume_message_orderly",
    "consumeTimeoutMinute": "consume_timeout_minute",
    "groupName": "group_name",
    "groupRetryPolicy": "group_retry_policy",
    "groupSysFlag": "group_sys_flag",
    "notifyConsumerIdsChangedEnable": "notify_consumer_ids_changed_enable",
    "retryMaxTimes": "retry_max_times",
    "retryQueueNums": "retry_queue_nums",
    "subscriptionDataSet": "subscription_data_set",
    "whichBrokerWhenConsumeSlowly": "which_broker_when_consume_slowly",
}
_BOOLS = {
    "consumeBroadcastEnable",
    "consumeEnable",
    "consumeFromMinEnable",
    "consumeMessageOrderly",
    "notifyConsumerIdsChangedEnable",
}
_INTS = {
    "brokerId",
    "consumeTimeoutMinute",
    "groupSysFlag",
    "retryMaxTimes",
    "retryQueueNums",
    "whichBrokerWhenConsumeSlowly",
}


@dataclass
class SubscriptionGroupConfig:
    """One consumer group's settings, RocketMQ's fields and defaults.

    txmq acts on ``consume_enable`` (pulls and receives of a disabled group are refused),
    ``consume_message_orderly`` (gRPC consumers of the group consume FIFO) and
    ``retry_max_times`` (the group's deliveries before its dead-letter queue); the other
    fields are stored and answered as given.
    """

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    consume_message_orderly: bool = False
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    group_retry_policy: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_RETRY_POLICY))
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    group_sys_flag: int = 0
    consume_timeout_minute: int = 15
    subscription_data_set: list[Any] | None = None
    attributes: dict[str, str] = field(default_factory=dict)
    #: Keys of a newer RocketMQ, kept as they came.
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """RocketMQ's form as fastjson writes it: keys sorted, a null ``subscriptionDataSet``
        left out."""
        doc: dict[str, Any] = dict(self.extra)
        for key, attr in _KEYS.items():
            value = getattr(self, attr)
            if value is not None:
                doc[key] = value
        return dict(sorted(doc.items()))

    @classmethod
    def from_json(cls, doc: Mapping[str, Any] | str | bytes) -> SubscriptionGroupConfig:
        """Read RocketMQ's form (a dict, or its JSON text): missing keys take RocketMQ's
        defaults; booleans and numbers may come as strings (fastjson reads them so).

        Raises:
            ValueError: ``groupName`` is missing or a field has the wrong type.
        """
        data: Any = json.loads(doc) if isinstance(doc, str | bytes) else doc
        if not isinstance(data, Mapping):
            raise ValueError(f"not a subscription group config: {doc!r}")
        name = data.get("groupName")
        if not isinstance(name, str) or not name:
            raise ValueError(f"a subscription group config needs a groupName: {doc!r}")
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            attr = _KEYS.get(key)
            if attr is None:
                extra[key] = value
            elif value is None:
                continue
            elif key in _BOOLS:
                values[attr] = _as_bool(key, value)
            elif key in _INTS:
                values[attr] = _as_int(key, value)
            elif key == "attributes":
                if not isinstance(value, Mapping):
                    raise ValueError(f"attributes is not an object: {value!r}")
                values[attr] = {str(k): str(v) for k, v in value.items()}
            elif key == "groupRetryPolicy":
                if not isinstance(value, Mapping):
                    raise ValueError(f"groupRetryPolicy is not an object: {value!r}")
                values[attr] = dict(value)
            elif key == "subscriptionDataSet":
                if not isinstance(value, list):
                    raise ValueError(f"subscriptionDataSet is not a list: {value!r}")
                values[attr] = list(value)
            else:
                values[attr] = value
        return cls(**values, extra=extra)

    def changed(self, **changes: Any) -> SubscriptionGroupConfig:
        """A copy with ``changes`` (field names) applied."""
        return replace(self, **changes)


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{key} is not a boolean: {value!r}")


def _as_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{key} is not an integer: {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key} is not an integer: {value!r}") from None


class SubscriptionGroupManager(ConfigJsonTable[SubscriptionGroupConfig]):
    """The persisted table of consumer group settings.

    A change marks the table dirty; :meth:`persist` (on the broker's background thread)
    writes it, and the request that changed it is answered once it is written.

    Args:
        path: ``<root>/config/subscriptionGroup.json`` (its folder is created on first write).
        default_retry_max_times: gives ``retryMaxTimes`` of a group without an entry (the
            broker's ``maxReconsumeTimes``, which may change while it runs); 16 when None.
    """

    what = "subscription group configs"
    table_key = "subscriptionGroupTable"

    def __init__(
        self, path: str, *, default_retry_max_times: Callable[[], int] | None = None
    ) -> None:
        super().__init__(path, SubscriptionGroupConfig.from_json)
        self.default_retry_max_times = default_retry_max_times or (lambda: 16)
        #: When the table last changed (ms), RocketMQ's ``dataVersion.timestamp``.
        self.changed_ms = int(time.time() * 1000)

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        """The stored config of ``group``, None when it has none."""
        with self._lock:
            return self._table.get(group)

    def effective(self, group: str) -> SubscriptionGroupConfig:
        """The settings ``group`` is served with: its stored config, else RocketMQ's defaults
        (with the broker's ``maxReconsumeTimes``)."""
        stored = self.get(group)
        if stored is not None:
            return stored
        return SubscriptionGroupConfig(group, retry_max_times=self.default_retry_max_times())

    def put(self, config: SubscriptionGroupConfig) -> None:
        """Add or replace a group's config (written by the next :meth:`persist`)."""
        self._put(config.group_name, config)

    def delete(self, group: str) -> bool:
        """Remove a group's config; True if there was one."""
        return self._remove(group)

    def all(self) -> dict[str, SubscriptionGroupConfig]:
        """A copy of the table."""
        with self._lock:
            return dict(self._table)

    def data_version(self) -> dict[str, int]:
        """RocketMQ's ``DataVersion`` of the table."""
        with self._lock:
            return {"counter": self._counter, "stateVersion": 0, "timestamp": self.changed_ms}

    def _changed(self) -> None:
        super()._changed()
        self.changed_ms = int(time.time() * 1000)


__all__ = ["DEFAULT_RETRY_POLICY", "SubscriptionGroupConfig", "SubscriptionGroupManager"]
