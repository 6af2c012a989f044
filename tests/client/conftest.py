"""Fixtures of the SDK tests."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import pytest

_names = itertools.count()


@pytest.fixture
def unique() -> Callable[[str], str]:
    """``unique("orders")`` -> a topic or group name not used by any other test."""

    def make(prefix: str) -> str:
        return f"{prefix}-{next(_names)}-{int(time.time() * 1000) % 100000}"

    return make
