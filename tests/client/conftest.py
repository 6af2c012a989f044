"""Fixtures of the SDK tests."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Callable

import pytest

from tests.support.brokers import started
from txmq.broker.config import BrokerConfig
from txmq.broker.server import BrokerController

_names = itertools.count()


@pytest.fixture
def unique() -> Callable[[str], str]:
    """``unique("orders")`` -> a topic or group name not used by any other test."""

    def make(prefix: str) -> str:
        return f"{prefix}-{next(_names)}-{int(time.time() * 1000) % 100000}"

    return make


@pytest.fixture
async def shifted_broker(
    make_broker_config: Callable[..., BrokerConfig],
) -> AsyncIterator[tuple[BrokerController, list[float]]]:
    """A started broker and ``shift``: its clock (store timestamps) runs ``shift[0]`` seconds
    ahead of the wall clock, so a test can place messages on either side of a timestamp
    without waiting for the clock to move."""
    shift = [0.0]
    async with started(make_broker_config(), clock=lambda: time.time() + shift[0]) as controller:
        yield controller, shift
