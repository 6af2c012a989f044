"""The message index's files on real disk: chains, hash collisions, roll-over to a new file,
the time-range filter, repair after an unclean stop, and a damaged file set aside."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from txmq.broker.store.index import (
    ENTRY_SIZE,
    HEADER_SIZE,
    IndexFile,
    IndexFileDamaged,
    IndexFiles,
    file_name,
    index_keys,
    key_hash,
)

T0 = 1_700_000_000_000


def _files(tmp_path: Path, slots: int = 64, entries: int = 1000) -> IndexFiles:
    f = IndexFiles(str(tmp_path / "index"), slots, entries)
    f.load(0)
    return f


def _reopen(files: IndexFiles, clean: bool) -> IndexFiles:
    """Open the folder again: after a clean close, or as a SIGKILL leaves it (whatever the
    last sync wrote, plus later writes in the page cache)."""
    if clean:
        files.close()
    else:
        for f in files.files:
            f.close()
    again = IndexFiles(files.directory, files.slot_num, files.max_entries)
    again.load(0)
    return again


def test_index_keys_split_keys_on_spaces_and_add_the_unique_key() -> None:
    props = b"TAGS\x01t\x02KEYS\x01order-1  order-2 order-1\x02UNIQ_KEY\x01ABC\x02"
    assert index_keys(props) == [b"order-1", b"order-2", b"ABC"]
    # A property whose name ends in KEYS is not KEYS.
    assert index_keys(b"MYKEYS\x01x\x02UNIQ_KEY\x01U\x02") == [b"U"]
    assert index_keys(b"") == []


def test_a_chain_returns_every_entry_of_a_key_newest_first(tmp_path: Path) -> None:
    files = _files(tmp_path)
    h = key_hash(b"T", b"k")
    other = key_hash(b"T", b"other")
    for i in range(10):
        files.add(h if i % 2 == 0 else other, 100 * i, T0 + i)
    files.advance(1000)
    assert list(files.lookup(h, 0, 2**62)) == [800, 600, 400, 200, 0]
    assert list(files.lookup(other, 0, 2**62)) == [900, 700, 500, 300, 100]
    assert list(files.lookup(key_hash(b"U", b"k"), 0, 2**62)) == []  # per topic


def test_keys_sharing_a_slot_stay_apart_by_hash(tmp_path: Path) -> None:
    files = _files(tmp_path, slots=1)  # every key collides in the one slot
    keys = [key_hash(b"T", f"k{i}".encode()) for i in range(5)]
    for n, h in enumerate(keys * 3):
        files.add(h, n, T0 + n)
    for i, h in enumerate(keys):
        assert list(files.lookup(h, 0, 2**62)) == [10 + i, 5 + i, i]


def test_a_full_file_rolls_over_and_lookups_walk_newest_file_first(tmp_path: Path) -> None:
    files = _files(tmp_path, slots=8, entries=4)
    h = key_hash(b"T", b"k")
    for i in range(10):
        files.advance(i * 50)
        files.add(h, i * 50, T0 + i)
    files.advance(500)
    assert [f.count for f in files.files] == [4, 4, 2]
    assert [f.name for f in files.files] == [file_name(0), file_name(200), file_name(400)]
    assert list(files.lookup(h, 0, 2**62)) == [450, 400, 350, 300, 250, 200, 150, 100, 50, 0]
    # Sealed files say which commit-log range they cover.
    assert [f.end_phy for f in files.files] == [201, 401, 500]


def test_the_time_range_filters_entries_and_skips_files(tmp_path: Path) -> None:
    files = _files(tmp_path, entries=3)
    h = key_hash(b"T", b"k")
    for i in range(9):
        files.add(h, i, T0 + 1000 * i)
    assert list(files.lookup(h, T0 + 2000, T0 + 5000)) == [5, 4, 3, 2]
    assert list(files.lookup(h, T0 + 2500, T0 + 2999)) == []
    assert list(files.lookup(h, T0 + 8000, T0 + 10**9)) == [8]
    assert [(f.min_ts, f.max_ts) for f in files.files] == [
        (T0, T0 + 2000),
        (T0 + 3000, T0 + 5000),
        (T0 + 6000, T0 + 8000),
    ]
    assert not files.files[0].overlaps(T0 + 2001, T0 + 10**9)


def test_a_store_time_beyond_a_files_delta_starts_a_new_file(tmp_path: Path) -> None:
    files = _files(tmp_path)
    h = key_hash(b"T", b"k")
    files.add(h, 0, T0)
    files.add(h, 1, T0 + 2**31 + 5)  # about 25 days later
    assert len(files.files) == 2
    assert list(files.lookup(h, 0, 2**62)) == [1, 0]


def test_a_clean_close_keeps_everything(tmp_path: Path) -> None:
    files = _files(tmp_path, entries=4)
    h = key_hash(b"T", b"k")
    for i in range(6):
        files.add(h, i, T0 + i)
    files.advance(6)
    again = _reopen(files, clean=True)
    assert again.position == 6
    assert list(again.lookup(h, 0, 2**62)) == [5, 4, 3, 2, 1, 0]
    again.add(h, 6, T0 + 6)
    assert list(again.lookup(h, 0, 2**62))[:2] == [6, 5]


def test_after_an_unclean_stop_only_what_the_last_sync_covered_is_kept(tmp_path: Path) -> None:
    files = _files(tmp_path)
    h = key_hash(b"T", b"k")
    for i in range(5):
        files.add(h, i, T0 + i)
    files.advance(5)
    files.sync(files.sync_snapshots())
    for i in range(5, 9):  # written after the last sync: the header does not know them
        files.add(h, i, T0 + i)
    files.advance(9)
    again = _reopen(files, clean=False)
    assert again.position == 5, "indexing resumes where the last sync left it"
    assert list(again.lookup(h, 0, 2**62)) == [4, 3, 2, 1, 0]
    again.add(h, 5, T0 + 5)
    assert list(again.lookup(h, 0, 2**62)) == [5, 4, 3, 2, 1, 0]


def test_garbage_after_the_synced_entries_is_repaired_by_rebuilding_the_slots(
    tmp_path: Path,
) -> None:
    files = _files(tmp_path, slots=4)
    hs = [key_hash(b"T", f"k{i}".encode()) for i in range(4)]
    for i in range(8):
        files.add(hs[i % 4], i, T0 + i)
    files.advance(8)
    files.sync(files.sync_snapshots())
    for i in range(8, 12):
        files.add(hs[i % 4], i, T0 + i)
    f = files.files[0]
    # The unsynced entries are torn (a power loss): their previous pointers are garbage.
    at = HEADER_SIZE + f.slot_num * 4 + 8 * ENTRY_SIZE
    f.mm[at : at + 4 * ENTRY_SIZE] = b"\xff" * (4 * ENTRY_SIZE)
    again = _reopen(files, clean=False)
    for i, h in enumerate(hs):
        assert list(again.lookup(h, 0, 2**62)) == [4 + i, i]


#: The key of :func:`_three_files`' entries.
KEY = key_hash(b"T", b"k")


def _three_files(tmp_path: Path) -> IndexFiles:
    """Six entries of :data:`KEY` (at offsets 0, 10, ... 50), two a file: three files."""
    files = _files(tmp_path, entries=2)
    for i in range(6):
        files.advance(i * 10)
        files.add(KEY, i * 10, T0 + i)
    files.advance(60)
    return files


def test_a_damaged_file_is_set_aside_and_indexing_restarts_at_its_offset(tmp_path: Path) -> None:
    files = _three_files(tmp_path)
    names = [f.name for f in files.files]
    files.close()
    damaged = os.path.join(files.directory, names[1])
    with open(damaged, "r+b") as fh:
        fh.write(b"garbage!")
    again = IndexFiles(files.directory, 64, 2)
    with capture_logs() as logs:
        again.load(0)
    events = {e["event"]: e for e in logs}
    assert events["index_file_damaged"]["file"] == damaged
    assert events["index_file_damaged"]["rebuild_from"] == int(names[1])
    assert again.position == int(names[1])
    assert [f.name for f in again.files] == names[:1]
    assert os.path.exists(damaged + ".damaged")
    assert not os.path.exists(os.path.join(files.directory, names[2])), "newer files are rebuilt"
    with pytest.raises(IndexFileDamaged, match="bad magic"):
        IndexFile.open(damaged + ".damaged")


def test_files_whose_messages_are_all_gone_are_deleted_but_never_the_newest(
    tmp_path: Path,
) -> None:
    files = _three_files(tmp_path)
    paths = [f.path for f in files.files]
    files.drop_below(25)  # the first file's entries point at 0 and 10, below 25
    files.sync(files.sync_snapshots())
    assert [os.path.exists(p) for p in paths] == [False, True, True]
    assert list(files.lookup(KEY, 0, 2**62)) == [50, 40, 30, 20]
    files.drop_below(10**9)
    files.sync(files.sync_snapshots())
    assert [f.path for f in files.files] == paths[2:], "the newest file stays"
    assert list(files.lookup(KEY, 0, 2**62)) == [50, 40]
