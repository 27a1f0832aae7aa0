"""Recorded logs played through the agent's live path at N times real speed.

Lines are released at the time their NCCL timestamp (else their PyTorch or DeepSpeed
logger header) says, scaled by ``speed``; a line without one keeps the time of the line
before it in its file.  Several files (per-rank logs) are merged by time, each in its
own order and on its own host's clock.  The replay's virtual clock ("now" in the logs'
time) drives the agent's clock too, so ages and seconds left count in the logs' time: a
replayed hang's countdown falls as it did in the job.
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
from ncclscope.parsers.torch.lines import logger_time

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
    """Releases recorded lines as their times come, ``speed`` times faster.

    Several files (one per rank, ``NCCL_DEBUG_FILE=%h.%p``) are merged by time: each
    keeps its own order, and lines go out across files in time order, ties in the order
    the files were given.  Each file's times are its host's clock, offset and all: a
    replay shows what an agent reading them live would have seen, so no offset is
    corrected.

    ``origin`` is the reading of ``clock`` at which the virtual clock reads ``t0``
    (default: when the source is made).  Replays given the same ``origin`` on the wall
    clock (``time.time``) and the same ``t0`` share one virtual clock.
    """

    def __init__(
        self,
        paths: Sequence[Path],
        *,
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        start: datetime | None = None,
        t0: datetime | None = None,
        origin: float | None = None,
    ) -> None:
        self.speed = speed
        self.clock = clock
        self._paths = [str(p) for p in paths]
        files = [_read(path) for path in paths]
        year = _year(files, start, paths)
        for lines in files:
            _settle(lines, year)
        firsts = [f[0][0] for f in files if f and f[0][0] is not None]
        # The replay starts at the logs' first time, or earlier telemetry's.
        candidates = [t for t in (min(firsts, default=None), start) if t is not None]
        default_t0 = min(candidates) if candidates else datetime.now(UTC)
        #: the logs' time the virtual clock reads at ``origin``
        self.t0 = t0 if t0 is not None else default_t0
        # A file without any time goes out at the start (nothing says when it was written).
        merged = [
            (t if t is not None else default_t0, k, text)
            for k, lines in enumerate(files)
            for t, text in lines
        ]
        del files
        # Each file's times never fall (see _settle), so a stable sort on time alone
        # is the k-way merge: a file's lines keep their order, ties keep the input order.
        merged.sort(key=_by_time)
        self._lines = merged
        self._next = 0
        self._origin = clock() if origin is None else origin

    def now(self) -> datetime:
        """The virtual clock: the logs' time that has been replayed up to."""
        return self.t0 + timedelta(seconds=(self.clock() - self._origin) * self.speed)

    @property
    def done(self) -> bool:
        return self._next >= len(self._lines)

    def poll(self) -> list[ReplayLine]:
        """The lines whose time has come."""
        now = self.now()
        if now < self.t0:
            return []  # its start (--start-at) is still to come: lines before t0 wait too
        out = []
        lines = self._lines
        while self._next < len(lines) and lines[self._next][0] <= now:
            t, k, text = lines[self._next]
            out.append(ReplayLine(self._paths[k], text, t))
            self._next += 1
        return out


def _by_time(line: tuple[datetime, int, str]) -> datetime:
    return line[0]


def _read(path: Path) -> list[tuple[datetime | None, str]]:
    """A file's lines with their NCCL timestamps."""
    with path.open(encoding="utf-8", errors="replace", newline="") as fh:
        return [(line_time(text), text) for text in (raw.rstrip("\r\n") for raw in fh)]


def _year(
    files: Sequence[Sequence[tuple[datetime | None, str]]],
    start: datetime | None,
    paths: Sequence[Path],
) -> int | None:
    """The year of year-less (glog) times: the logs' NCCL timestamps', else the
    telemetry's, else the first file's modification time's."""
    for lines in files:
        for t, _text in lines:
            if t is not None:
                return t.year
    if start is not None:
        return start.year
    for path in paths:
        try:
            return datetime.fromtimestamp(path.stat().st_mtime, tz=UTC).year
        except OSError:
            continue
    return None


def _settle(lines: list[tuple[datetime | None, str]], year: int | None) -> None:
    """Give each line of a file the time it goes out at, in place.

    A line's time is its NCCL timestamp, else its PyTorch or DeepSpeed logger's (a
    per-rank file ends with the watchdog's lines, ten minutes after its last NCCL line;
    torchrun's own file has no other).  A line without one keeps the time of the line
    before it, and the leading ones the file's first time; a time earlier than one
    before it (a clock stepped back) is raised to it, so the file's order is never
    changed.  A file without any time keeps None throughout.
    """
    last: datetime | None = None
    untimed = 0  # leading lines waiting for the file's first time
    for i, (t, text) in enumerate(lines):
        if t is None:
            t = logger_time(text, year)
        if t is not None and (last is None or t > last):
            last = t
        if last is None:
            untimed += 1
        else:
            lines[i] = (last, text)
    if untimed and last is not None:
        first = lines[untimed][0]
        for i in range(untimed):
            lines[i] = (first, lines[i][1])


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
