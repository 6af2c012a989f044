"""Fixtures of the core's in-process tests: the messaging core over a real store in the test's
folder, no socket, a fake wall clock (``tests/support/core.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.core import CoreHarness


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[CoreHarness]:
    """The core, open; closed at the end (also after a :meth:`CoreHarness.reopen`)."""
    h = CoreHarness(str(tmp_path / "store"))
    h.open()
    try:
        yield h
    finally:
        await h.close()
