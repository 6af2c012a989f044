"""Timers that fall due while the disk is full fire once space is back, each once."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tests.broker.test_disk_full import _fill_to, disk_config  # noqa: F401  (a fixture)
from tests.support.brokers import raw_broker
from tests.support.waiting import wait_until
from txmq.broker.config import BrokerConfig
from txmq.protocol.codes import ResponseCode


async def test_timers_due_on_a_full_disk_fire_once_space_is_back(
    small_disk: Path,
    disk_config: Callable[..., BrokerConfig],  # noqa: F811
) -> None:
    async with raw_broker(disk_config()) as (b, c):
        due = int(time.time() * 1000) + 1000
        for i in range(5):
            r = await c.send("full-timers", b"t%d" % i, props={"TIMER_DELIVER_MS": str(due)})
            assert r.code == ResponseCode.SUCCESS, r.remark
        filler = _fill_to(small_disk, 82)
        assert b.store.check_space() is not None
        await wait_until(lambda: b.timer.failures >= 2, 15, "the timer refused twice (disk full)")
        assert await c.pull_all("full-timers") == []
        filler.unlink()
        await wait_until(lambda: b.timer.pending == 0 and b.timer.failures == 0, 15, "fired")
        got = sorted(m.body for m in await c.pull_all("full-timers"))
        assert got == [b"t%d" % i for i in range(5)], got
