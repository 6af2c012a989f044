"""The broker's traffic figures as RocketMQ's tools read them: the TPS triples and daily totals
of GET_BROKER_RUNTIME_INFO (``putTps``, ``msgPutTotalTodayMorning``, ...) and the per-topic and
per-group windows of VIEW_BROKER_STATS_DATA (``TOPIC_PUT_NUMS``, ``GROUP_GET_NUMS``).

The counts themselves are the ones the broker keeps anyway (the store's puts and gets, the
metrics' messages per topic and per topic and group); :class:`BrokerStats` only samples them
(:meth:`BrokerStats.tick`, once a second from the broker's housekeeping), in three tiers like
RocketMQ's ``StatsItem``: every 10 s for ten minutes, every 10 min for an hour, every hour for a
day.  A window's figure is the count now less the count at the oldest sample inside it (the
broker's start while it is younger than the window), so a put shows at once rather than at the
next sample."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import date
from typing import Any

#: (seconds between samples, seconds kept) of each tier.
TIERS = ((10.0, 610.0), (600.0, 4200.0), (3600.0, 90000.0))
#: Samples of the first tier older than this keep only the totals (the 10-minute TPS figure
#: needs no more): the per-key tables of a broker with many topics and groups are kept in
#: about as many copies as RocketMQ keeps samples (7 a minute, 7 an hour, 25 a day).
PER_KEY_KEPT = 75.0
#: The windows of RocketMQ's TPS triples (``putTps`` = "10 s, 1 min, 10 min").
TPS_WINDOWS = (10.0, 60.0, 600.0)
MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0

#: The VIEW_BROKER_STATS_DATA names served: the admin tools' (``statsAll``, the dashboard).
TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
GROUP_GET_NUMS = "GROUP_GET_NUMS"


@dataclass(frozen=True)
class Counts:
    """What the broker has counted since its start."""

    #: messages stored (every record, the broker's own included)
    put: int
    #: messages returned to consumers
    out: int
    #: store reads that found messages, and that found none
    get_found: int
    get_miss: int
    #: messages stored per topic
    put_by_topic: dict[str, int]
    #: messages returned per ``topic@group``
    out_by_key: dict[str, int]

    def totals(self) -> Counts:
        """These counts without the per-key tables."""
        return replace(self, put_by_topic={}, out_by_key={})


@dataclass(frozen=True)
class Sample:
    at: float
    counts: Counts


@dataclass(frozen=True)
class Window:
    """RocketMQ's ``BrokerStatsItem``: what was counted in a window, its rate per second and
    the average per count (``avgpt``: txmq does not keep per-call counts, so 0.0)."""

    sum: int
    tps: float
    avgpt: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"avgpt": self.avgpt, "sum": self.sum, "tps": self.tps}


@dataclass(eq=False)
class BrokerStats:
    """Samples of :class:`Counts`; see the module docstring.

    Args:
        read: the counts now.
        monotonic: the clock the windows are measured on.
        today: the local date (the daily totals roll over at local midnight, as RocketMQ's).
    """

    read: Callable[[], Counts]
    monotonic: Callable[[], float] = time.monotonic
    today: Callable[[], date] = date.today
    _tiers: list[deque[Sample]] = field(init=False)
    _day: date = field(init=False)
    #: The put and get totals at the start of today and of yesterday (RocketMQ's
    #: ``msgPutTotalTodayMorning`` ...): zero until the broker has seen a midnight.
    morning_today: tuple[int, int] = field(init=False, default=(0, 0))
    morning_yesterday: tuple[int, int] = field(init=False, default=(0, 0))

    def __post_init__(self) -> None:
        first = Sample(self.monotonic(), self.read())
        self._tiers = [deque([first]) for _ in TIERS]
        self._day = self.today()

    def tick(self) -> None:
        """Take the samples that are due (call it about once a second)."""
        now = self.monotonic()
        sample: Sample | None = None
        for (every, keep), tier in zip(TIERS, self._tiers, strict=True):
            if now - tier[-1].at < every:
                continue
            if sample is None:
                sample = Sample(now, self.read())
            tier.append(sample)
            while len(tier) > 1 and now - tier[0].at > keep:
                tier.popleft()
        fine = self._tiers[0]
        for i in range(len(fine) - 1, -1, -1):
            old = fine[i]
            if now - old.at <= PER_KEY_KEPT:
                continue
            if not (old.counts.put_by_topic or old.counts.out_by_key):
                break  # those before were slimmed already
            fine[i] = Sample(old.at, old.counts.totals())
        day = self.today()
        if day != self._day:
            counts = sample.counts if sample is not None else self.read()
            self.morning_yesterday = self.morning_today
            self.morning_today = (counts.put, counts.out)
            self._day = day

    def _since(self, seconds: float) -> tuple[Sample, Sample]:
        """(the oldest sample at most ``seconds`` old, or the newest of all when none is;
        the counts now)."""
        now = self.monotonic()
        tier = next(
            (t for (_, keep), t in zip(TIERS, self._tiers, strict=True) if keep >= seconds),
            self._tiers[-1],
        )
        base = next((s for s in tier if now - s.at <= seconds), tier[-1])
        return base, Sample(now, self.read())

    def window(self, seconds: float, pick: Callable[[Counts], int]) -> Window:
        base, now = self._since(seconds)
        n = max(0, pick(now.counts) - pick(base.counts))
        elapsed = now.at - base.at
        return Window(n, n / elapsed if elapsed > 0 else 0.0)

    def tps(self, pick: Callable[[Counts], int]) -> str:
        """RocketMQ's TPS triple: the rates over 10 s, 1 min and 10 min, space-separated."""
        return " ".join(repr(self.window(w, pick).tps) for w in TPS_WINDOWS)

    def out_tps(self, key: str) -> float:
        """Messages per second returned to ``topic@group`` over the last minute."""

        def pick(c: Counts) -> int:
            return c.out_by_key.get(key, 0)

        return self.window(MINUTE, pick).tps

    def stats_data(self, name: str, key: str) -> dict[str, Any] | None:
        """RocketMQ's ``BrokerStatsData`` of ``name`` / ``key`` (minute, hour, day), or None
        when the broker has counted nothing under that key since its start."""
        pick: Callable[[Counts], int]
        if name == TOPIC_PUT_NUMS:

            def pick(c: Counts) -> int:
                return c.put_by_topic.get(key, 0)

            known = key in self.read().put_by_topic
        elif name == GROUP_GET_NUMS:

            def pick(c: Counts) -> int:
                return c.out_by_key.get(key, 0)

            known = key in self.read().out_by_key
        else:
            return None
        if not known:
            return None
        return {
            "statsDay": self.window(DAY, pick).to_json(),
            "statsHour": self.window(HOUR, pick).to_json(),
            "statsMinute": self.window(MINUTE, pick).to_json(),
        }


def human_bytes(n: int) -> str:
    """RocketMQ's ``MixAll.humanReadableByteCount(n, false)``: ``512 B``, ``1.5 KiB``..."""
    if n < 1024:
        return f"{n} B"
    exp = 0
    value = float(n)
    while value >= 1024 and exp < 6:
        value /= 1024
        exp += 1
    return f"{n / 1024**exp:.1f} {'KMGTPE'[exp - 1]}iB"


def runtime_text(seconds: float) -> str:
    """RocketMQ's ``runtime`` figure: ``[ 0 days, 1 hours, 2 minutes, 3 seconds ]``."""
    s = int(seconds)
    return (
        f"[ {s // 86400} days, {s // 3600 % 24} hours, {s // 60 % 60} minutes, {s % 60} seconds ]"
    )


def boot_millis(started_monotonic: float) -> int:
    """The wall-clock time (ms) of a start measured on the monotonic clock."""
    return int((time.time() - (time.monotonic() - started_monotonic)) * 1000)
