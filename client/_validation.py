"""The checks a message and a topic name pass before they are sent or subscribed (RocketMQ's
``Validators``)."""

from __future__ import annotations

from typing import cast

from txmq.protocol.message import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR, Message, MessageConst
from txmq.protocol.topics import TOPIC_MAX_LENGTH, TOPIC_PATTERN

from .errors import InvalidMessageError

#: Topic names found valid (checked once each; bounded).
_VALID_TOPICS: set[str] = set()


def validate_topic(topic: str) -> None:
    """Check a topic name the way RocketMQ's ``Validators.checkTopic`` does.

    Raises:
        InvalidMessageError: the name is empty, too long or has characters outside
            ``[%|a-zA-Z0-9_-]``.
    """
    if topic in _VALID_TOPICS:
        return
    if not isinstance(topic, str) or not topic:
        raise InvalidMessageError("the topic name is empty")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise InvalidMessageError(
            f"the topic name is longer than {TOPIC_MAX_LENGTH} characters: {topic[:40]!r}..."
        )
    if not TOPIC_PATTERN.match(topic):
        raise InvalidMessageError(
            f"the topic name {topic!r} contains characters other than letters, digits, "
            "'%', '|', '_' and '-'"
        )
    if len(_VALID_TOPICS) >= 4096:
        _VALID_TOPICS.clear()
    _VALID_TOPICS.add(topic)


#: Longest message id (``Message.msg_id``) a producer sends.
MAX_MSG_ID_LENGTH = 128


def validate_message(msg: Message, max_size: int) -> None:
    """Check one message before it is sent.

    Raises:
        InvalidMessageError: what is wrong, in words.
    """
    if (
        type(msg) is Message
        and msg.topic in _VALID_TOPICS
        and type(msg.body) is bytes
        and 0 < len(msg.body) <= max_size
        and msg.tags is None
        and msg.keys is None
        and msg.msg_id is None
        and not msg.properties
        and msg.delay_level >= 0
    ):
        return  # a message with a body and nothing else, to a topic already checked
    if not isinstance(msg, Message):
        raise InvalidMessageError(f"expected a txmq Message, got {type(msg).__name__}")
    validate_topic(msg.topic)
    if not isinstance(msg.body, (bytes, bytearray, memoryview)):
        raise InvalidMessageError(
            f"the message body must be bytes or str, got {type(msg.body).__name__}"
        )
    size = len(msg.body)
    if size == 0:
        raise InvalidMessageError("the message body is empty")
    if size > max_size:
        raise InvalidMessageError(
            f"the message body is {size} bytes, over the limit of {max_size} bytes"
        )
    for name, value in (("tags", msg.tags), ("keys", msg.keys), ("msg_id", msg.msg_id)):
        if value is not None and not isinstance(value, str):
            raise InvalidMessageError(f"message {name} must be a string, got {value!r}")
    if msg.msg_id is not None and (
        not 0 < len(msg.msg_id) <= MAX_MSG_ID_LENGTH
        or NAME_VALUE_SEPARATOR in msg.msg_id
        or PROPERTY_SEPARATOR in msg.msg_id
    ):
        raise InvalidMessageError(
            f"a message id must have 1 to {MAX_MSG_ID_LENGTH} characters and no control "
            f"separators, got {msg.msg_id!r}"
        )
    # read as objects: the checks below are for what the annotations do not hold
    for k, v in cast("dict[object, object]", msg.properties).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidMessageError(f"message property {k!r}: keys and values must be strings")
        if k in MessageConst.SYSTEM_KEYS:
            raise InvalidMessageError(f"message property {k!r} is reserved for the system")
        for s in (k, v, msg.tags or "", msg.keys or ""):
            if NAME_VALUE_SEPARATOR in s or PROPERTY_SEPARATOR in s:
                raise InvalidMessageError(
                    f"message property {k!r} contains a reserved control character"
                )
    if msg.delay_level < 0:
        raise InvalidMessageError(f"delay_level must not be negative, got {msg.delay_level}")
