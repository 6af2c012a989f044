"""Fixtures for the store tests: real stores in temporary folders, a fake clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from store_helpers import FakeClock

from txmq.broker.store import MessageStore, StoreConfig

STORE_HOST = ("10.1.2.3", 10911)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_store(tmp_path: Path, clock: FakeClock) -> Iterator[Callable[..., MessageStore]]:
    """``make_store(path=None, **config)``: a loaded store with small segments (4 KiB commit
    log, 10-entry consume-queue files) unless overridden; closed at the end of the test."""
    opened: list[MessageStore] = []

    def make(path: Path | str | None = None, **overrides: Any) -> MessageStore:
        values: dict[str, Any] = {
            "mapped_file_size_commit_log": 4096,
            "mapped_file_size_consume_queue": 200,
        }
        values.update(overrides)
        cfg = StoreConfig(str(path or tmp_path / "store"), **values)
        store = MessageStore(cfg, STORE_HOST, clock=clock)
        store.load()
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()
