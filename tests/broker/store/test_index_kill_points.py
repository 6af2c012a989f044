"""The message index stopped by SIGKILL at every step of its work, roll-overs included.

A SIGKILL leaves the files as the page cache holds them: every write through the mapping, synced
or not.  So a copy of the folder taken between two steps is what a restart finds if the broker
was killed there.  The steps are the index's own, in its own order: a chunk of records indexed
(several files may fill and roll over in one), the index's position advanced, the snapshot of
a sync taken, and the worker's sync of each file of it (its slots, then its header), which runs
while the owner thread goes on indexing.  At every step a copy is loaded and must resume at a
position that is never ahead of what was indexed, with every entry below it found; indexing the
rest again from there (as the broker re-reads its commit log) must then find every entry.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from txmq.broker.store.index import HEADER_SIZE, IndexFiles, Snapshot

T0 = 1_700_000_000_000
RECORD = 100  # commit-log bytes per message


class Run:
    """One index driven step by step, with a copy of its folder loaded at every step."""

    def __init__(self, root: Path, rng: random.Random, slots: int, entries: int) -> None:
        self.root = root
        self.rng = rng
        self.files = IndexFiles(str(root / "index"), slots, entries)
        self.files.load(0)
        #: Per message (in commit-log order): its offset, store time and key hashes.
        self.messages: list[tuple[int, int, list[int]]] = []
        self.pending: list[Snapshot] = []
        self.kills = 0

    # -- the index's steps -------------------------------------------------------------------

    def index_chunk(self) -> None:
        items: list[tuple[int, int, int]] = []
        for _ in range(self.rng.randint(1, 8)):
            n = len(self.messages)
            phy, ts = n * RECORD, T0 + n
            hashes = [self.rng.randrange(1, 2**32) for _ in range(self.rng.randint(1, 3))]
            self.messages.append((phy, ts, hashes))
            items += [(h, phy, ts) for h in hashes]
        if self.rng.random() < 0.5:
            self.files.add_many(items)
        else:  # message by message, killed inside each new file's creation too
            for phy in sorted({phy for _h, phy, _ts in items}):
                before = len(self.files.files)
                self.files.add_many([it for it in items if it[1] == phy])
                if len(self.files.files) > before:
                    self.kill_point(creating=self.files.files[-1].path)
        self.kill_point()
        self.files.advance(len(self.messages) * RECORD)

    def take_snapshot(self) -> None:
        self.pending += self.files.sync_snapshots()

    def sync_one(self) -> None:
        """The worker's sync of the next file of the snapshot, stopped between its slots and
        its header too."""
        f, header, slots, seal = self.pending.pop(0)
        if slots is not None:
            f.mm[HEADER_SIZE : HEADER_SIZE + len(slots)] = slots
            self.kill_point()
        self.files.sync([(f, header, slots, seal)])

    # -- a SIGKILL here ---------------------------------------------------------------------

    def kill_point(self, creating: str | None = None) -> None:
        """``creating``: killed while that (newest) file was being created, after it got its
        size but before its first header: all zeros."""
        self.kills += 1
        copy = self.root / f"kill{self.kills}"
        shutil.copytree(self.root / "index", copy)
        if creating is not None:
            torn = copy / os.path.basename(creating)
            torn.write_bytes(bytes(torn.stat().st_size))
        indexed = len(self.messages) * RECORD  # at most: advance() may not have run yet
        again = IndexFiles(str(copy), self.files.slot_num, self.files.max_entries)
        again.load(0)
        try:
            pos = again.position
            assert pos <= indexed, f"resumes at {pos}, past what was indexed ({indexed})"
            for phy, _ts, hashes in self.messages:
                if phy < pos:
                    self.assert_found(again, phy, hashes, f"below the resumed position {pos}")
            # The broker re-reads the commit log from there.
            for phy, ts, hashes in self.messages:
                if phy >= pos:
                    again.add_many([(h, phy, ts) for h in hashes])
            again.advance(indexed)
            for phy, _ts, hashes in self.messages:
                self.assert_found(again, phy, hashes, f"after re-indexing from {pos}")
        finally:
            for f in again.files:  # a copy: closed without syncing
                f.close()
            shutil.rmtree(copy)

    @staticmethod
    def assert_found(files: IndexFiles, phy: int, hashes: list[int], when: str) -> None:
        for h in hashes:
            assert phy in set(files.lookup(h, 0, 2**62)), (
                f"the entry of the message at {phy} (hash {h:#x}) is not found {when}; "
                f"files: {[(f.name, f.count, f.end_phy, f.flags) for f in files.files]}"
            )


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """In memory (/dev/shm) where there is one: the test makes and deletes thousands of small
    files, and a tmpfs's page cache is all a SIGKILL leaves anyway."""
    if not os.path.isdir("/dev/shm"):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="txmq-index-kills-", dir="/dev/shm"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("seed", range(12))
def test_a_kill_at_any_step_loses_no_entry_and_the_rebuild_finds_all(
    folder: Path, seed: int
) -> None:
    rng = random.Random(seed)
    # Few entries a file: chunks roll over one file or several at a time.
    run = Run(folder, rng, slots=rng.choice([1, 4, 16]), entries=rng.choice([3, 6, 10]))
    for _ in range(40):
        step = rng.random()
        if step < 0.5:
            run.index_chunk()
        elif step < 0.65 or not run.pending:
            run.take_snapshot()
        else:
            run.sync_one()
        run.kill_point()
    while run.pending:
        run.sync_one()
        run.kill_point()
    assert len(run.files.files) > 3, "the index never rolled over: the test tested nothing"
    run.files.close()
