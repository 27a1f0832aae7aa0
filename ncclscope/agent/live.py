"""The live path: followed lines into a bounded window, the window through the same
parsers and detectors as ``analyze``, the result as metric rows.

The window keeps the last ``max_lines`` lines of each followed file.  NCCL versions
that print no INFO timestamps get the time each line arrived (DESIGN §4: ``stamped``):
the window writes it in front of the line's NCCL header in NCCL's own
``[%F %T.%6f] `` form, so the first pass reads it like a timestamp NCCL printed, and the
analysis marks those times ``stamped``.  A window whose NCCL lines carry times of their
own is not stamped at all.

Sample stamped line (a 2.21 COLL line as the window writes it)::

    [rank3]:[2026-11-23 19:58:02.113402] node-0:4103:4103 [3] NCCL INFO AllGather: ...
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import polars as pl

from ncclscope.analysis import Analysis, run_analysis
from ncclscope.detect.context import Context
from ncclscope.detect.straggler import lateness
from ncclscope.detect.timeout import countdown
from ncclscope.parsers.nccl.patterns import HEADER_RE, PREFIX_TS_RE

__all__ = ["LiveWindow", "job_rows", "stamp"]


def stamp(text: str, arrived: datetime) -> str | None:
    """``text`` with ``arrived`` written as an NCCL timestamp in front of its NCCL header;
    None when the line has no header (nothing to stamp).

    >>> from datetime import UTC, datetime
    >>> stamp("[rank3]:node-0:41:41 [3] NCCL INFO x", datetime(2026, 1, 2, 3, 4, 5, 6, UTC))
    '[rank3]:[2026-01-02 03:04:05.000006] node-0:41:41 [3] NCCL INFO x'
    """
    m = HEADER_RE.search(text)
    if m is None:
        return None
    at = m.start()
    return f"{text[:at]}[{arrived:%Y-%m-%d %H:%M:%S.%f}] {text[at:]}"


def _has_own_time(text: str) -> bool:
    m = HEADER_RE.search(text)
    return m is not None and PREFIX_TS_RE.search(text[: m.start()]) is not None


@dataclass
class LiveWindow:
    """The last ``max_lines`` lines of every followed file, with their arrival times."""

    max_lines: int = 200_000
    _files: dict[str, deque[tuple[str, datetime]]] = field(default_factory=dict)
    #: the job's NCCL lines carry their own times: no stamping
    own_times: bool | None = None
    added: int = 0

    @property
    def files(self) -> int:
        """Files with lines in the window."""
        return len(self._files)

    def add(self, lines: Iterable[tuple[str, str, datetime]]) -> int:
        """Add ``(path, text, arrived)`` lines; returns how many."""
        n = 0
        for path, text, arrived in lines:
            window = self._files.get(path)
            if window is None:
                window = self._files[path] = deque(maxlen=self.max_lines)
            window.append((text, arrived))
            if self.own_times is None and " NCCL " in text and HEADER_RE.search(text):
                self.own_times = _has_own_time(text)
            n += 1
        self.added += n
        return n

    def write(self, folder: Path) -> list[Path]:
        """Write each file's window to ``folder``; returns the paths written."""
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        stamping = self.own_times is False
        for path, window in self._files.items():
            name = hashlib.sha1(path.encode(), usedforsecurity=False).hexdigest()[:12]
            out = folder / f"{Path(path).name}.{name}.log"
            with out.open("w", encoding="utf-8", errors="replace") as fh:
                for text, arrived in window:
                    line = (stamp(text, arrived) if stamping else None) or text
                    fh.write(line.rstrip("\n") + "\n")
            written.append(out)
        return written

    def analyse(self, workdir: Path) -> Analysis | None:
        """The window through ``analyze``'s pipeline; None while it is empty."""
        if not self._files:
            return None
        paths = self.write(workdir / "window")
        return run_analysis(
            [str(p) for p in paths],
            workdir=workdir / "analysis",
            coll_ts_source="stamped" if self.own_times is False else "nccl",
        )


def job_rows(analysis: Analysis, now: datetime) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """The job's metric rows from an analysis of the window at time ``now``."""
    ctx = Context(analysis)
    rows: dict[str, list[tuple[tuple[str, ...], float]]] = {}
    progress = ctx.progress
    rows["ncclscope_collective_seq"] = [
        ((str(r["comm_key"]), str(r["rank"] if r["rank"] is not None else r["comm_rank"])),
         float(r["last_seq"]))
        for r in progress.iter_rows(named=True)
    ]  # fmt: skip
    late = lateness(ctx)
    if len(late):
        world = late.filter(pl.col("members") == late["members"].max())
        typical = world["median_s"].median()
        for r in world.iter_rows(named=True):
            who = str(r["rank"] if r["rank"] is not None else r["comm_rank"])
            rows.setdefault("ncclscope_collective_lateness_seconds", []).append(
                ((who,), float(r["median_s"]))
            )
            if r["gap_s"] and isinstance(typical, float):
                score = max(0.0, (r["median_s"] - typical) / r["gap_s"])
                rows.setdefault("ncclscope_straggler_score", []).append(((who,), score))
    timeout_s, _source = analysis.frameworks.timeout
    pending = countdown(ctx, now, timeout_s if timeout_s is not None else 600.0)
    for r in pending.iter_rows(named=True):
        comm = str(r["comm_key"])
        if r["age_s"] is not None:
            rows.setdefault("ncclscope_pending_collective_age_seconds", []).append(
                ((comm,), float(r["age_s"]))
            )
        if r["left_s"] is not None:
            rows.setdefault("ncclscope_timeout_remaining_seconds", []).append(
                ((comm,), float(r["left_s"]))
            )
        for rank in r["culprit_ranks"]:
            rows.setdefault("ncclscope_timeout_culprit_info", []).append(
                ((comm, str(rank), str(r["op"]), str(r["seq"])), 1.0)
            )
    errors = analysis.errors.group_by("kind", "severity").len()
    rows["ncclscope_nccl_errors"] = [((str(k), str(s)), float(n)) for k, s, n in errors.iter_rows()]
    counts: dict[tuple[str, str], int] = {}
    for f in analysis.findings:
        counts[(f.kind, f.severity)] = counts.get((f.kind, f.severity), 0) + 1
    rows["ncclscope_findings"] = [(k, float(n)) for k, n in sorted(counts.items())]
    unparsed = analysis.inputs["unparsed"].sum()
    rows["ncclscope_log_window_lines_unparsed"] = [((), float(unparsed))]
    return rows
