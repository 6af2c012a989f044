"""The consume queue's tag code, cached (most topics use a handful of tags)."""

from __future__ import annotations

from functools import lru_cache

from txmq.protocol.message import tags_code


@lru_cache(maxsize=4096)
def tags_code_of(tags: str | None) -> int:
    """RocketMQ's tagsCode for a message's TAGS property (Java ``String.hashCode``; 0 for
    none)."""
    return int(tags_code(tags))
