"""Helpers shared by the store tests (imported by name; this folder has no __init__.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from txmq.broker.store import GetMessageStatus, MessageStore
from txmq.protocol.message import MessageExt, decode_message


class FakeClock:
    """A clock that only moves when told to (seconds since the epoch)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_msg(
    topic: str = "TopicA",
    body: bytes = b"hello",
    queue_id: int = 0,
    tags: str | None = None,
    sys_flag: int = 0,
    **props: str,
) -> MessageExt:
    properties = dict(props)
    if tags is not None:
        properties["TAGS"] = tags
    return MessageExt(
        topic=topic,
        body=body,
        queue_id=queue_id,
        sys_flag=sys_flag,
        born_timestamp=1_699_999_999_000,
        born_host=("192.168.0.7", 50123),
        properties=properties,
    )


def read_queue(
    store: MessageStore, topic: str, queue_id: int, start: int | None = None
) -> list[MessageExt]:
    """Every message of a queue from ``start`` (default: its min offset), decoded."""
    offset = store.get_min_offset_in_queue(topic, queue_id) if start is None else start
    out: list[MessageExt] = []
    while True:
        r = store.get_messages(topic, queue_id, offset, 64)
        if r.status is not GetMessageStatus.FOUND:
            assert r.status in (
                GetMessageStatus.OFFSET_OVERFLOW_ONE,
                GetMessageStatus.NO_MESSAGE_IN_QUEUE,
            ), r.status
            return out
        out.extend(decode_message(m) for m in r.messages)
        offset = r.next_begin_offset


def crash_image(store_dir: Path, dest: Path) -> Path:
    """Copy a store folder while its store is open: what a disk holds after ``kill -9`` (the
    page cache survives a process crash, so the copy sees every write)."""
    shutil.copytree(store_dir, dest)
    os.unlink(dest / "lock")
    return dest


def commit_log_files(store_dir: Path) -> list[Path]:
    return sorted((store_dir / "commitlog").iterdir())
