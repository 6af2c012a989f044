"""SIGKILL tests: a real child process appends to a store and is killed at a random moment;
the store is reopened and checked.  Three rounds per variant, on the same folder, so each
round also recovers on top of earlier recoveries."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from crash_child import TOPIC, message
from store_helpers import read_queue

from tests.support.waiting import wait_until_sync
from txmq.broker.store import MessageStore, StoreConfig
from txmq.protocol.message import MessageExt

CHILD = Path(__file__).with_name("crash_child.py")
SEEDS = (11, 22, 33)


def run_and_kill(store_dir: Path, seed: int, mode: str, out: Path) -> list[str]:
    """Start the child, let it append for a random short time, SIGKILL it; its complete
    stdout lines.  The kill waits, however slow the machine, until the child has reported
    what the checks need: an acknowledged append (sync) or a flush (async)."""
    progress = b"\nA " if mode == "sync" else b"\nF "
    with open(out, "wb") as stdout, open(out.with_suffix(".err"), "wb") as stderr:
        child = subprocess.Popen(
            [sys.executable, str(CHILD), str(store_dir), str(seed), mode],
            stdout=stdout,
            stderr=stderr,
        )
        try:

            def reported(marker: bytes) -> bool:
                assert child.poll() is None, out.with_suffix(".err").read_text()
                return marker in out.read_bytes()

            wait_until_sync(lambda: reported(b"READY\n"), 30, "the child to start")
            started = time.monotonic()
            run_for = random.Random(seed).uniform(0.3, 0.8)  # a random moment to kill at
            wait_until_sync(
                lambda: reported(progress) and time.monotonic() - started >= run_for,
                30,
                f"{progress.decode().strip()!r} lines from the child and {run_for:.2f}s of appends",
            )
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
    assert child.returncode == -signal.SIGKILL, out.with_suffix(".err").read_text()
    text = out.read_bytes().decode()
    lines = text.split("\n")
    return lines[:-1]  # the last piece is either empty or a line cut by the kill


def open_store(store_dir: Path) -> MessageStore:
    store = MessageStore(
        StoreConfig(
            str(store_dir),
            mapped_file_size_commit_log=64 * 1024,
            mapped_file_size_consume_queue=20 * 50,
        ),
        ("127.0.0.1", 10911),
    )
    store.load()
    return store


def messages_by_round(store: MessageStore) -> dict[int, list[tuple[int, MessageExt]]]:
    """Every stored message, grouped by the seed in its body: [(i, message)] in queue order
    per queue, queues concatenated."""
    rounds: dict[int, list[tuple[int, MessageExt]]] = {}
    for qid in store.queue_ids(TOPIC):
        msgs = read_queue(store, TOPIC, qid)
        # gap-free: queue offsets run from 0 without holes
        assert [m.queue_offset for m in msgs] == list(range(len(msgs)))
        for m in msgs:
            seed, i, _ = m.body.split(b":", 2)
            rounds.setdefault(int(seed), []).append((int(i), m))
    return rounds


def check_round(rounds: dict[int, list[tuple[int, MessageExt]]], seed: int) -> int:
    """The round's messages are exactly messages 0..n-1 of its generator, each once, each
    in the queue the generator chose, in order; returns n."""
    got = sorted(rounds.get(seed, []), key=lambda x: x[0])
    n = len(got)
    assert [i for i, _ in got] == list(range(n)), "a message is missing or duplicated"
    rng = random.Random(seed)
    for i, m in got:
        qid, body = message(rng, seed, i)
        assert (m.queue_id, m.body, m.topic) == (qid, body, TOPIC)
        assert m.properties["TAGS"] == f"t{i % 2}"
    return n


@pytest.mark.slow
def test_sync_flush_keeps_every_acknowledged_message_exactly_once(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    acked: dict[int, list[tuple[int, int, int, bytes]]] = {}
    for seed in SEEDS:
        lines = run_and_kill(store_dir, seed, "sync", tmp_path / f"out{seed}")
        acked[seed] = []
        for line in lines:
            if line.startswith("A "):
                _, cl_off_text, qid_text, qoff_text, hexbody = line.split(" ")
                acked[seed].append(
                    (int(cl_off_text), int(qid_text), int(qoff_text), bytes.fromhex(hexbody))
                )
        assert acked[seed], "the child acknowledged nothing"

        store = open_store(store_dir)
        try:
            rounds = messages_by_round(store)
            for s in acked:
                n = check_round(rounds, s)
                assert n >= len(acked[s])
                for cl_off, qid, qoff, body in acked[s]:
                    m = store.lookup_message(cl_off)
                    assert m.body == body and (m.queue_id, m.queue_offset) == (qid, qoff)
                    r = store.get_messages(TOPIC, qid, qoff, 1)
                    assert r.messages == [store.read_message_bytes(cl_off)]
        finally:
            store.close()


@pytest.mark.slow
def test_async_flush_keeps_an_intact_gap_free_prefix(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    for seed in SEEDS:
        lines = run_and_kill(store_dir, seed, "async", tmp_path / f"out{seed}")
        flushed = [int(line[2:]) for line in lines if line.startswith("F ")]
        assert flushed, "the child never flushed"
        store = open_store(store_dir)
        try:
            assert store.max_phy_offset >= max(flushed)
            rounds = messages_by_round(store)
            for s in SEEDS[: SEEDS.index(seed) + 1]:
                assert check_round(rounds, s) > 0
            assert os.path.exists(store_dir / "checkpoint")
        finally:
            store.close()
