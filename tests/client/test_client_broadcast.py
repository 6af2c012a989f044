"""Broadcasting consumers: every member of the group receives every message, keeps its own
offsets in a local file, and resumes from it after a restart; the broker keeps no offsets for
such a group and no retry topic is used."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.client.helpers import topic_and_group
from tests.support.waiting import wait_until
from txmq.broker.server import BrokerController
from txmq.client import AsyncProducer, AsyncPushConsumer, Message, OffsetStoreError


async def _send(address: str, topic: str, bodies: list[bytes]) -> None:
    p = AsyncProducer("broadcast-producer", address)
    await p.start()
    try:
        for b in bodies:
            await p.send(Message(topic, b))
    finally:
        await p.shutdown()


def _member(address: str, group: str, topic: str, path: Path, got: list[bytes], **kw: object):
    c = AsyncPushConsumer(
        group,
        address,
        consume_from="first",
        message_model="BROADCASTING",
        offset_store_path=path,
        **kw,  # type: ignore[arg-type]
    )
    c.subscribe(topic, "*", lambda m: got.append(m.body))
    return c


async def test_every_member_gets_every_message_and_resumes_from_its_file(
    broker: BrokerController, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "news", "screens", 4)
    first = [b"m%d" % i for i in range(8)]
    await _send(broker.address, topic, first)
    got_a: list[bytes] = []
    got_b: list[bytes] = []
    a = _member(broker.address, group, topic, tmp_path / "a.json", got_a)
    b = _member(broker.address, group, topic, tmp_path / "b.json", got_b)
    await a.start()
    await b.start()
    try:
        await wait_until(lambda: len(got_a) == 8 and len(got_b) == 8, 30, "both get all 8")
        assert sorted(got_a) == sorted(first) and sorted(got_b) == sorted(first)
        assert len(a.assignment()) == 4 and len(b.assignment()) == 4  # every queue, each
    finally:
        await a.shutdown()
    # a's offsets are in its file, not on the broker
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["group"] == group and sum(doc["offsets"].values()) == 8
    assert broker.ctx.offsets.topics_of(group) == []
    assert broker.ctx.topics.get(f"%RETRY%{group}") is None

    more = [b"n%d" % i for i in range(3)]
    await _send(broker.address, topic, more)
    try:
        await wait_until(lambda: len(got_b) == 11, 30, "b (still running) gets the 3 new ones")
        got_a.clear()
        a = _member(broker.address, group, topic, tmp_path / "a.json", got_a)
        await a.start()
        await wait_until(lambda: len(got_a) >= 3, 30, "a, restarted, gets what it missed")

        def a_at_end() -> bool:
            offsets: dict[str, int] = json.loads((tmp_path / "a.json").read_text())["offsets"]
            return sum(offsets.values()) == 11

        await wait_until(a_at_end, 30, "a's file reaches the end")
        assert sorted(got_a) == sorted(more), "a restarted from its file: nothing twice"
    finally:
        await a.shutdown()
        await b.shutdown()


async def test_a_failing_message_is_retried_locally_then_skipped(
    broker: BrokerController, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "news", "flaky", 1)
    await _send(broker.address, topic, [b"bad", b"good"])
    calls: list[bytes] = []

    def handle(m: object) -> None:
        body = getattr(m, "body")  # noqa: B009
        calls.append(body)
        if body == b"bad":
            raise RuntimeError("cannot handle it")

    c = AsyncPushConsumer(
        group,
        broker.address,
        consume_from="first",
        message_model="BROADCASTING",
        offset_store_path=tmp_path / "f.json",
        max_reconsume_times=2,
        send_back_retry_delay=0.05,
    )
    c.subscribe(topic, "*", handle)
    await c.start()
    try:
        await wait_until(lambda: calls.count(b"bad") == 3 and b"good" in calls, 30, "3 tries")

        def at_end() -> bool:
            path = tmp_path / "f.json"
            return path.exists() and sum(json.loads(path.read_text())["offsets"].values()) == 2

        await wait_until(at_end, 30, "the skipped message's offset is committed locally")
    finally:
        await c.shutdown()
    assert calls.count(b"bad") == 3  # the first delivery and 2 local retries
    assert broker.ctx.topics.get(f"%RETRY%{group}") is None, "nothing was sent back"


async def test_a_damaged_offset_file_falls_back_to_its_backup_or_says_which_file(
    broker: BrokerController, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    topic, group = await topic_and_group(broker.address, unique, "news", "damaged", 1)
    await _send(broker.address, topic, [b"x"])
    path = tmp_path / "o.json"
    got: list[bytes] = []
    c = _member(broker.address, group, topic, path, got)
    await c.start()
    try:
        await wait_until(lambda: got == [b"x"], 30, "the first message")
    finally:
        await c.shutdown()
    await _send(broker.address, topic, [b"y"])
    c = _member(broker.address, group, topic, path, got)  # writes again: a .bak appears
    await c.start()
    try:
        await wait_until(lambda: got == [b"x", b"y"], 30, "the second message")
    finally:
        await c.shutdown()
    assert path.with_name("o.json.bak").exists()
    path.write_bytes(b"\x00garbage")
    await _send(broker.address, topic, [b"z"])
    got.clear()
    c = _member(broker.address, group, topic, path, got)
    await c.start()  # the backup is used: only what came after "y"
    try:
        await wait_until(lambda: got == [b"z"], 30, "resumed from the backup")
    finally:
        await c.shutdown()
    path.write_bytes(b"\x00garbage")
    path.with_name("o.json.bak").write_bytes(b"{")
    c = _member(broker.address, group, topic, path, [])
    with pytest.raises(OffsetStoreError, match="o.json"):
        await c.start()


def test_message_model_is_checked() -> None:
    with pytest.raises(ValueError, match="BROADCASTING"):
        AsyncPushConsumer("g", message_model="broadcast")
    with pytest.raises(ValueError, match="offset_store_path"):
        AsyncPushConsumer("g", offset_store_path="/tmp/x.json")
