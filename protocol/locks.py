"""The JSON bodies of LOCK_BATCH_MQ and UNLOCK_BATCH_MQ (RocketMQ's ``LockBatchRequestBody``,
``UnlockBatchRequestBody`` and ``LockBatchResponseBody``).

A queue travels as RocketMQ's ``MessageQueue`` object, ``{"brokerName":..,"queueId":..,
"topic":..}`` (fastjson writes the fields in that order); a set of queues as a JSON array.
Requests look like ``{"clientId":..,"consumerGroup":..,"mqSet":[..],"onlyThisBroker":false}``
and the lock answer like ``{"lockOKMQSet":[..]}``.  Decoding accepts what the Java and C++
clients write (the C++ client leaves ``mqSet`` out when it is empty and ends with a newline).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .errors import InvalidParameterError

#: One queue: (topic, broker name, queue id), the order and meaning of the SDK's MessageQueue.
QueueRef = tuple[str, str, int]


def queue_json(mq: QueueRef) -> dict[str, Any]:
    """One queue as RocketMQ's MessageQueue JSON object."""
    topic, broker, queue_id = mq
    return {"brokerName": broker, "queueId": int(queue_id), "topic": topic}


def _queue_of(doc: Any, field: str) -> QueueRef:
    if not isinstance(doc, dict):
        raise InvalidParameterError(f"{field} holds {doc!r}, not a message queue object")
    topic, broker, queue_id = doc.get("topic"), doc.get("brokerName"), doc.get("queueId")
    if not isinstance(topic, str) or not topic:
        raise InvalidParameterError(f"a queue of {field} has no topic: {doc!r}")
    if broker is not None and not isinstance(broker, str):
        raise InvalidParameterError(f"a queue of {field} has a brokerName that is no string")
    if isinstance(queue_id, bool) or not isinstance(queue_id, int) or queue_id < 0:
        raise InvalidParameterError(f"a queue of {field} has an invalid queueId: {doc!r}")
    return (topic, broker or "", queue_id)


def _queues_of(value: Any, field: str) -> frozenset[QueueRef]:
    if value is None:
        return frozenset()
    if not isinstance(value, list):
        raise InvalidParameterError(f"{field} is not a list of message queues")
    return frozenset(_queue_of(v, field) for v in value)


def _json_of(body: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(body.decode("utf-8")) if body.strip() else None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvalidParameterError(f"{what} body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidParameterError(f"{what} body is not a JSON object")
    return doc


def _sorted(mqs: Iterable[QueueRef]) -> list[dict[str, Any]]:
    return [queue_json(mq) for mq in sorted(mqs)]


@dataclass(frozen=True)
class LockBatchRequest:
    """LOCK_BATCH_MQ's and UNLOCK_BATCH_MQ's body: who asks, for which group, which queues.

    ``only_this_broker`` is RocketMQ's flag for a lock asked from one replica by another (its
    strict lock mode); txmq reads and writes it but locks on the broker asked either way.
    """

    consumer_group: str
    client_id: str
    mq_set: frozenset[QueueRef]
    only_this_broker: bool = False

    def encode(self) -> bytes:
        doc = {
            "clientId": self.client_id,
            "consumerGroup": self.consumer_group,
            "mqSet": _sorted(self.mq_set),
            "onlyThisBroker": self.only_this_broker,
        }
        return json.dumps(doc, separators=(",", ":")).encode("utf-8")

    @classmethod
    def decode(cls, body: bytes, what: str = "LOCK_BATCH_MQ") -> LockBatchRequest:
        """Raises:
        InvalidParameterError: not such a body, or no group or client id.
        """
        doc = _json_of(body, what)
        group, client_id = doc.get("consumerGroup"), doc.get("clientId")
        if not isinstance(group, str) or not group:
            raise InvalidParameterError(f"{what} body has no consumerGroup")
        if not isinstance(client_id, str) or not client_id:
            raise InvalidParameterError(f"{what} body has no clientId")
        only = doc.get("onlyThisBroker", False)
        return cls(group, client_id, _queues_of(doc.get("mqSet"), "mqSet"), only is True)


def encode_lock_response(granted: Iterable[QueueRef]) -> bytes:
    """LOCK_BATCH_MQ's answer: the queues now locked by the caller."""
    return json.dumps({"lockOKMQSet": _sorted(granted)}, separators=(",", ":")).encode("utf-8")


def decode_lock_response(body: bytes) -> frozenset[QueueRef]:
    """The queues a LOCK_BATCH_MQ answer grants (an empty body grants none).

    Raises:
        InvalidParameterError: not such a body.
    """
    if not body.strip():
        return frozenset()
    return _queues_of(_json_of(body, "LOCK_BATCH_MQ answer").get("lockOKMQSet"), "lockOKMQSet")


__all__ = [
    "LockBatchRequest",
    "QueueRef",
    "decode_lock_response",
    "encode_lock_response",
    "queue_json",
]
