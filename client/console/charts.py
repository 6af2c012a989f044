"""The console's charts: a sampler that reads the broker's figures every few seconds into
bounded in-memory series, and server-rendered SVG line charts of them (no script).

The series are: messages sent per second (from the growth of the user topics' queue ends),
messages consumed per second (from the growth of the consumer groups' committed offsets), each
group's total lag, and the pending transactions.  They live as long as the console does and
hold the last :data:`POINTS` samples each; a restart starts them afresh.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape
from typing import Any

from ..logs import get_logger

log = get_logger(__name__)

#: Samples kept per series (at 10 s a sample: the last hour and a bit).
POINTS = 400

SEND_RATE = "send rate"
CONSUME_RATE = "consume rate"
PENDING = "pending transactions"


def lag_series(group: str) -> str:
    return f"lag {group}"


@dataclass
class Figures:
    """One reading of the broker: totals at ``at`` (seconds since the epoch)."""

    at: float
    sent: int
    consumed: int
    lag: dict[str, int]
    pending: int


@dataclass
class Series:
    points: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=POINTS))


class Sampler:
    """Calls ``read`` every ``interval`` seconds on a thread of its own and keeps the series.

    Args:
        read: one reading of the broker (raising is logged and the sample skipped).
        interval: seconds between samples.
    """

    def __init__(self, read: Callable[[], Figures], interval: float = 10.0) -> None:
        self.read = read
        self.interval = interval
        self.series: dict[str, Series] = {}
        self._last: Figures | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="txmq-console-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.add(self.read())
            except Exception as exc:  # noqa: BLE001 - a broker away for a while: try again later
                log.debug("console_sample_failed", error=str(exc))
            self._stop.wait(self.interval)

    def add(self, f: Figures) -> None:
        with self._lock:
            last, self._last = self._last, f
            self._put(PENDING, f.at, f.pending)
            for group, lag in f.lag.items():
                self._put(lag_series(group), f.at, lag)
            if last is not None and f.at > last.at:
                span = f.at - last.at
                self._put(SEND_RATE, f.at, max(0, f.sent - last.sent) / span)
                self._put(CONSUME_RATE, f.at, max(0, f.consumed - last.consumed) / span)

    def _put(self, name: str, at: float, value: float) -> None:
        self.series.setdefault(name, Series()).points.append((at, float(value)))

    def points(self, name: str) -> list[tuple[float, float]]:
        with self._lock:
            s = self.series.get(name)
            return list(s.points) if s else []


async def read_figures(admin: Any, internal: Callable[[str], bool]) -> Figures:
    """One :class:`Figures` from the broker through an admin client."""
    sent = 0
    for name in await admin.list_topics():
        if internal(name):
            continue
        stats = await admin.topic_stats(name)
        sent += sum(q["maxOffset"] for q in stats.get("offsetTable") or [])
    consumed = 0
    lag: dict[str, int] = {}
    for g in await admin.consumer_groups():
        rows = await admin.consume_stats(g)
        rows = [r for r in rows if not internal(r["topic"])]
        consumed += sum(r["consumerOffset"] for r in rows)
        lag[g] = sum(r["lag"] for r in rows)
    info = await admin.runtime_info()
    return Figures(time.time(), sent, consumed, lag, int(info.get("txn.pending") or 0))


# -- SVG ----------------------------------------------------------------------------------------

WIDTH, HEIGHT = 560, 170
_LEFT, _RIGHT, _TOP, _BOTTOM = 52, 12, 12, 26


def _nice(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.2g}" if value < 1 else f"{value:.1f}"


def svg(
    points: Iterable[tuple[float, float]], *, title: str, unit: str = "", css_id: str = ""
) -> str:
    """A line chart of ``points`` (time in seconds, value) as inline SVG; a chart saying
    "no samples yet" when there are fewer than two."""
    pts = list(points)
    ident = f' id="{escape(css_id)}"' if css_id else ""
    head = (
        f'<svg{ident} class="chart" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
        f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#fff" stroke="#d7dee8"/>'
    )
    if len(pts) < 2:
        return (
            head + f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" fill="#68717c">'
            "no samples yet</text></svg>"
        )
    t0, t1 = pts[0][0], pts[-1][0]
    top = max(v for _, v in pts)
    top = top * 1.1 if top > 0 else 1.0
    w, h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM

    def x(t: float) -> float:
        return _LEFT + (t - t0) / ((t1 - t0) or 1.0) * w

    def y(v: float) -> float:
        return _TOP + h - v / top * h

    grid = []
    for frac in (0.0, 0.5, 1.0):
        gy = _TOP + h - frac * h
        grid.append(
            f'<line x1="{_LEFT}" y1="{gy:.1f}" x2="{WIDTH - _RIGHT}" y2="{gy:.1f}" '
            'stroke="#e9eef5"/>'
            f'<text x="{_LEFT - 6}" y="{gy + 4:.1f}" text-anchor="end" font-size="11" '
            f'fill="#68717c">{escape(_nice(top * frac))}</text>'
        )
    line = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
    dots = "".join(
        f'<circle class="point" cx="{x(t):.1f}" cy="{y(v):.1f}" r="2" fill="#1f5fa8">'
        f"<title>{escape(_stamp(t))}: {escape(_nice(v))} {escape(unit)}</title></circle>"
        for t, v in pts
    )
    labels = (
        f'<text x="{_LEFT}" y="{HEIGHT - 8}" font-size="11" fill="#68717c">{_stamp(t0)}</text>'
        f'<text x="{WIDTH - _RIGHT}" y="{HEIGHT - 8}" font-size="11" fill="#68717c" '
        f'text-anchor="end">{_stamp(t1)}</text>'
    )
    return (
        head
        + "".join(grid)
        + f'<polyline fill="none" stroke="#1f5fa8" stroke-width="1.8" points="{line}"/>'
        + dots
        + labels
        + "</svg>"
    )


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")
