"""Recorded logs played through the agent's live path at N times real speed.

Lines are released in file order (for one combined log: the job's order) at the time
their NCCL timestamp says, scaled by ``speed``; a line without one keeps the time of
the line before it.  The replay's virtual clock ("now" in the logs' time) drives the
agent's clock too, so ages and seconds left count in the logs' time: a replayed hang's
countdown falls as it did in the job.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from ncclscope.parsers.nccl.patterns import HEADER_RE, PREFIX_TS_RE

__all__ = ["ReplayLine", "ReplaySource", "TelemetryReplay", "line_time"]


@dataclass(frozen=True)
class ReplayLine:
    """A replayed line, shaped like the follower's."""

    path: str
    text: str
    arrived: datetime


def line_time(text: str) -> datetime | None:
    """The NCCL timestamp in front of a line's header, if any.

    >>> line_time("[default0]:[2025-03-14 09:00:09.387136] node-6:5381:5381 [3] NCCL INFO x")
    datetime.datetime(2025, 3, 14, 9, 0, 9, 387136, tzinfo=datetime.timezone.utc)
    """
    m = HEADER_RE.search(text)
    if m is None:
        return None
    ts = PREFIX_TS_RE.search(text[: m.start()])
    if ts is None:
        return None
    frac = (ts["frac"] or "0")[:6].ljust(6, "0")
    try:
        return datetime.fromisoformat(f"{ts['date']}T{ts['time']}.{frac}+00:00")
    except ValueError:
        return None


class ReplaySource:
    """Releases recorded lines as their times come, ``speed`` times faster."""

    def __init__(
        self,
        paths: Sequence[Path],
        *,
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        start: datetime | None = None,
    ) -> None:
        self.speed = speed
        self.clock = clock
        self._lines: list[tuple[datetime | None, str, str]] = []
        for path in paths:
            with path.open(encoding="utf-8", errors="replace", newline="") as fh:
                for raw in fh:
                    text = raw.rstrip("\r\n")
                    self._lines.append((line_time(text), str(path), text))
        first = next((t for t, _p, _x in self._lines if t is not None), None)
        # The replay starts at the logs' first time, or earlier telemetry's.
        candidates = [t for t in (first, start) if t is not None]
        self.t0 = min(candidates) if candidates else datetime.now(UTC)
        times: list[datetime] = []
        last = self.t0
        for t, _p, _x in self._lines:
            last = t if t is not None and t >= last else last
            times.append(last)
        self._times = times
        self._next = 0
        self._start = clock()

    def now(self) -> datetime:
        """The virtual clock: the logs' time that has been replayed up to."""
        return self.t0 + timedelta(seconds=(self.clock() - self._start) * self.speed)

    @property
    def done(self) -> bool:
        return self._next >= len(self._lines)

    def poll(self) -> list[ReplayLine]:
        """The lines whose time has come."""
        now = self.now()
        out = []
        while self._next < len(self._lines) and self._times[self._next] <= now:
            _t, path, text = self._lines[self._next]
            out.append(ReplayLine(path, text, self._times[self._next]))
            self._next += 1
        return out


class TelemetryReplay:
    """Recorded telemetry released as the replay's clock reaches it: the latest value
    of every series so far, as catalog rows."""

    def __init__(self, frame: pl.DataFrame) -> None:
        self._frame = frame.sort("ts")
        self._times = self._frame["ts"].to_list()
        self._next = 0
        self._latest: dict[tuple[str, tuple[str, ...]], float] = {}

    @property
    def first(self) -> datetime | None:
        return self._times[0] if self._times else None

    def rows_until(self, now: datetime) -> dict[str, list[tuple[tuple[str, ...], float]]]:
        """Rows of every series' latest value at or before ``now``."""
        end = bisect.bisect_right(self._times, now, lo=self._next)
        if end > self._next:
            part = self._frame.slice(self._next, end - self._next)
            for metric, labels, value in part.select("metric", "labels", "value").iter_rows():
                key = tuple(labels.split(",")) if labels else ()
                self._latest[(metric, key)] = value
            self._next = end
        rows: dict[str, list[tuple[tuple[str, ...], float]]] = {}
        for (metric, labels), value in self._latest.items():
            rows.setdefault(metric, []).append((labels, value))
        return rows
