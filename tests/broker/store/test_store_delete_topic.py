"""Deleting a topic's consume queues: files and folders go, the other queues and the commit log
stay, and neither a clean restart nor a crash after the deletion brings the queues back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from store_helpers import crash_image, make_msg, read_queue

from txmq.broker.store import MessageStore

MakeStore = Callable[..., MessageStore]


def _fill(store: MessageStore) -> None:
    for i in range(30):  # 10 entries a consume-queue file: several files per queue
        store.put_message(make_msg("Doomed", b"d%d" % i, i % 2))
    for i in range(5):
        store.put_message(make_msg("Kept", b"k%d" % i, 0))


def test_delete_topic_drops_its_queues_only(make_store: MakeStore, tmp_path: Path) -> None:
    store = make_store()
    _fill(store)
    store.flush_consume_queues()
    cq_root = tmp_path / "store" / "consumequeue"
    assert len(list((cq_root / "Doomed" / "0").iterdir())) >= 2
    end = store.max_phy_offset

    assert store.delete_topic("Doomed") == 2
    store.flush_consume_queues()
    assert not (cq_root / "Doomed").exists()
    assert store.queue_ids("Doomed") == [] and "Doomed" not in store.topics()
    assert store.get_max_offset_in_queue("Doomed", 0) == 0
    assert [m.body for m in read_queue(store, "Kept", 0)] == [b"k%d" % i for i in range(5)]
    assert store.max_phy_offset == end  # the messages stay in the commit log
    assert store.delete_topic("Doomed") == 0

    # the image of a crash right after the deletion, and a clean restart: no queue comes back
    image = crash_image(tmp_path / "store", tmp_path / "image")
    store.put_message(make_msg("Doomed", b"again", 0))  # a new topic of the same name
    store.close()
    for path, doomed in ((image, []), (tmp_path / "store", [b"again"])):
        reopened = make_store(path)
        assert [m.body for m in read_queue(reopened, "Doomed", 0)] == doomed, path
        assert reopened.queue_ids("Doomed") == ([0] if doomed else [])
        assert len(read_queue(reopened, "Kept", 0)) == 5
        reopened.close()


def test_a_crash_before_the_checkpoint_is_written(make_store: MakeStore, tmp_path: Path) -> None:
    """The deletion is durable once the next checkpoint is written (the broker writes it at
    once); an image taken before that still names the queues, and recovery keeps what the
    checkpoint promised rather than losing offsets consumers know."""
    store = make_store()
    _fill(store)
    store.flush_consume_queues()
    store.delete_topic("Doomed")
    image = crash_image(tmp_path / "store", tmp_path / "image")
    reopened = make_store(image)
    assert reopened.get_max_offset_in_queue("Doomed", 0) == 15  # not below what was promised
    assert len(read_queue(reopened, "Kept", 0)) == 5
