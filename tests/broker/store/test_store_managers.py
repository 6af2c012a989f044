"""Topic configs, consumer offsets and the atomic write they rely on."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from txmq.broker.store import (
    ConsumerOffsetManager,
    TopicConfig,
    TopicConfigManager,
    atomic_write,
)


def test_topic_config_json_uses_rocketmq_keys() -> None:
    tc = TopicConfig(
        "Orders", read_queue_nums=8, write_queue_nums=6, perm=4, topic_sys_flag=1, order=True
    )
    doc = tc.to_json()
    assert doc == {
        "topicName": "Orders",
        "readQueueNums": 8,
        "writeQueueNums": 6,
        "perm": 4,
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": 1,
        "order": True,
    }
    assert TopicConfig.from_json(doc) == tc
    assert TopicConfig.from_json(json.dumps(doc)) == tc
    # RocketMQ's JSON (strings for numbers in places, extra keys) is accepted
    assert TopicConfig.from_json({"topicName": "X", "readQueueNums": "2", "attributes": {}}) == (
        TopicConfig("X", read_queue_nums=2)
    )
    for bad in ({}, {"topicName": 3}, {"topicName": "X", "perm": [6]}, "[1]"):
        with pytest.raises(ValueError):
            TopicConfig.from_json(bad)


def test_topic_configs_persist_on_every_change(tmp_path: Path) -> None:
    path = tmp_path / "config" / "topics.json"
    mgr = TopicConfigManager(str(path))
    mgr.load()
    assert mgr.all() == {} and mgr.get("A") is None
    mgr.put(TopicConfig("A"))
    mgr.put(TopicConfig("B", read_queue_nums=1, write_queue_nums=1))
    mgr.put(TopicConfig("A", perm=2))
    assert mgr.delete("B") and not mgr.delete("B")

    again = TopicConfigManager(str(path))
    again.load()
    assert again.all() == {"A": TopicConfig("A", perm=2)}
    doc = json.loads(path.read_text())
    assert doc["topicConfigTable"]["A"]["perm"] == 2
    assert doc["dataVersion"]["counter"] == 4


def test_a_damaged_table_is_read_from_its_backup_or_started_empty(tmp_path: Path) -> None:
    """Each write keeps the previous version as ``.bak``; a damaged file is set aside and the
    table read from the backup (the change after it is lost), or, with the backup damaged too,
    started empty; never an error that stops a start."""
    path = tmp_path / "topics.json"
    mgr = TopicConfigManager(str(path))
    mgr.put(TopicConfig("A"))
    mgr.put(TopicConfig("B"))  # each put writes: the backup holds A only
    assert json.loads((tmp_path / "topics.json.bak").read_text())["topicConfigTable"].keys() == {
        "A"
    }
    path.write_text("{not json")
    again = TopicConfigManager(str(path))
    again.load()
    assert again.damaged and set(again.all()) == {"A"}
    aside = [p.name for p in tmp_path.iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and aside[0].startswith("topics.json.damaged-"), aside
    again.persist()  # written again from what was read
    assert set(json.loads(path.read_text())["topicConfigTable"]) == {"A"}

    path.write_text("[1, 2")
    (tmp_path / "topics.json.bak").write_text("garbage")
    lost = TopicConfigManager(str(path))
    lost.load()
    assert lost.damaged and lost.all() == {}
    assert not path.exists() and not (tmp_path / "topics.json.bak").exists()


def test_consumer_offsets_commit_query_persist_reload(tmp_path: Path) -> None:
    path = tmp_path / "config" / "consumerOffset.json"
    mgr = ConsumerOffsetManager(str(path))
    mgr.load()
    assert mgr.query("g1", "T", 0) == -1
    assert not mgr.persist()  # nothing to write
    mgr.commit("g1", "T", 0, 17)
    mgr.commit("g1", "T", 3, 4)
    mgr.commit("g2", "T", 0, 1)
    mgr.commit("g2", "%RETRY%g2", 0, 9)
    assert mgr.query("g1", "T", 0) == 17
    assert mgr.offsets("g1", "T") == {0: 17, 3: 4}
    assert mgr.groups() == ["g1", "g2"]
    assert mgr.topics_of("g2") == ["%RETRY%g2", "T"]
    assert mgr.persist()
    assert not mgr.persist()
    mgr.commit("g1", "T", 0, 17)  # unchanged: still clean
    assert not mgr.persist()

    again = ConsumerOffsetManager(str(path))
    again.load()
    assert again.offsets("g1", "T") == {0: 17, 3: 4}
    assert again.query("g2", "%RETRY%g2", 0) == 9
    doc = json.loads(path.read_text())
    assert doc["offsetTable"]["T@g1"] == {"0": 17, "3": 4}

    assert again.remove_group("g2") and not again.remove_group("g2")
    assert again.persist()
    third = ConsumerOffsetManager(str(path))
    third.load()
    assert third.groups() == ["g1"]


def test_atomic_write_replaces_the_file(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    atomic_write(str(path), b"one")
    atomic_write(str(path), b"two")
    assert path.read_bytes() == b"two"
    assert sorted(os.listdir(tmp_path)) == ["f.json"]


def test_failed_atomic_write_leaves_the_old_file_intact(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    atomic_write(str(path), b"old content")

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "injected fsync failure")

    with pytest.raises(OSError, match="injected"):
        atomic_write(str(path), b"new content", fsync=failing_fsync)
    assert path.read_bytes() == b"old content"
    assert sorted(os.listdir(tmp_path)) == ["f.json"]  # no temporary file left behind


def test_failed_persist_keeps_offsets_dirty(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the config folder should be")
    mgr = ConsumerOffsetManager(str(blocker / "consumerOffset.json"))
    mgr.commit("g", "T", 0, 5)
    with pytest.raises(OSError):
        mgr.persist()
    blocker.unlink()
    assert mgr.persist()  # still dirty: the next call writes
    again = ConsumerOffsetManager(str(blocker / "consumerOffset.json"))
    again.load()
    assert again.query("g", "T", 0) == 5


def test_temporary_files_of_an_interrupted_write_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    mgr = ConsumerOffsetManager(str(path))
    mgr.commit("g", "T", 0, 3)
    mgr.persist()
    stale = tmp_path / "consumerOffset.json.k3j2h1.tmp"
    stale.write_text("half a write")
    unrelated = tmp_path / "other.json.x.tmp"
    unrelated.write_text("not ours")
    again = ConsumerOffsetManager(str(path))
    again.load()
    assert again.query("g", "T", 0) == 3
    assert not stale.exists() and unrelated.exists()
