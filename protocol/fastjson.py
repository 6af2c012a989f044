"""The JSON RocketMQ's Java side writes and reads for bodies with maps keyed by objects.

RocketMQ encodes remoting bodies with fastjson, which writes a ``Map<MessageQueue, ...>`` with
the key objects themselves as keys: ``{{"brokerName":"b","queueId":0,"topic":"t"}:{...}}``.
That is not JSON; Java tools (mqadmin, rocketmq-dashboard) read it, so txmq writes it for the
admin bodies that hold such maps (ConsumeStats, ResetOffsetBody, ...), and the SDK reads it.

:class:`ObjectKeyMap` is such a map: a list of ``(key, value)`` pairs whose keys are dicts.
:func:`dumps` writes documents that contain them; :func:`loads` reads any JSON plus object
keys, giving an :class:`ObjectKeyMap` for an object whose keys are not all strings.
"""

from __future__ import annotations

import json
from typing import Any

_scalar = json.JSONDecoder()
_WS = " \t\n\r"


class ObjectKeyMap(list[tuple[Any, Any]]):
    """A map whose keys are JSON objects (fastjson's ``Map<MessageQueue, V>``)."""


def dumps(doc: Any) -> str:
    """Compact JSON, with :class:`ObjectKeyMap` written as fastjson writes object-keyed maps.

    Keys of object keys are written sorted, as fastjson does for a bean's fields."""
    if isinstance(doc, ObjectKeyMap):
        items = (f"{dumps(_sorted(k))}:{dumps(v)}" for k, v in doc)
        return "{" + ",".join(items) + "}"
    if isinstance(doc, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dumps(v)}" for k, v in doc.items()) + "}"
    if isinstance(doc, list | tuple | set | frozenset):
        return "[" + ",".join(dumps(v) for v in doc) + "]"
    return json.dumps(doc, separators=(",", ":"))


def _sorted(key: Any) -> Any:
    return dict(sorted(key.items())) if isinstance(key, dict) else key


def loads(text: str | bytes) -> Any:
    """Read JSON that may have objects as keys.

    Raises:
        ValueError: the text is neither JSON nor fastjson's object-keyed form (or is nested
            deeper than the interpreter's recursion limit).
    """
    s = text.decode("utf-8") if isinstance(text, bytes) else text
    try:
        value, end = _value(s, _skip(s, 0))
    except RecursionError:
        raise ValueError("document nested too deeply") from None
    if _skip(s, end) != len(s):
        raise ValueError(f"extra data at {end}")
    return value


def _skip(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _expect(s: str, i: int, ch: str) -> int:
    i = _skip(s, i)
    if i >= len(s) or s[i] != ch:
        raise ValueError(f"expected {ch!r} at {i}")
    return i + 1


def _value(s: str, i: int) -> tuple[Any, int]:
    if i >= len(s):
        raise ValueError("unexpected end of document")
    if s[i] == "{":
        return _object(s, i + 1)
    if s[i] == "[":
        out: list[Any] = []
        i = _skip(s, i + 1)
        if i < len(s) and s[i] == "]":
            return out, i + 1
        while True:
            v, i = _value(s, _skip(s, i))
            out.append(v)
            i = _skip(s, i)
            if i < len(s) and s[i] == ",":
                i += 1
                continue
            return out, _expect(s, i, "]")
    return _scalar.raw_decode(s, i)


def _object(s: str, i: int) -> tuple[Any, int]:
    pairs: list[tuple[Any, Any]] = []
    i = _skip(s, i)
    if i < len(s) and s[i] == "}":
        return {}, i + 1
    while True:
        key, i = _value(s, _skip(s, i))
        if isinstance(key, list):
            raise ValueError(f"an array as a key at {i}")
        i = _expect(s, i, ":")
        value, i = _value(s, _skip(s, i))
        pairs.append((key, value))
        i = _skip(s, i)
        if i < len(s) and s[i] == ",":
            i += 1
            continue
        i = _expect(s, i, "}")
        if all(isinstance(k, str) for k, _ in pairs):
            return dict(pairs), i
        return ObjectKeyMap(pairs), i
