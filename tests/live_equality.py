"""Live against post-mortem on the same lines: what the agent's live progress says
(``agent.progress``) against what ``analyze`` says, for ``tests/test_live_progress.py``
and ``benchmarks/bench_live_equality.py``.

The lines go to a ``LiveWindow`` and a ``LiveProgress`` as the agent feeds them, in
polls of random size over the files interleaved, each poll one second after the last.
The reference is ``analyze``'s pipeline on the window the agent would analyse (for logs
without NCCL times the window stamps each line's arrival, as the agent does), and, where
NCCL printed its own times, ``analyze`` on the files themselves too.  Compared: each
member's calls and last sequence (``Context.progress``), the countdown (the collective
waited in, its op, who entered, who is behind, seconds left within 1 s), and the job rows
the agent exports against ``live.job_rows`` of the reference.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from ncclscope.agent.live import LiveWindow, job_rows, timeout_of
from ncclscope.agent.progress import (
    LiveContext,
    LiveProgress,
    MemberIndex,
    member_rows,
    might_stall,
)
from ncclscope.analysis import build
from ncclscope.detect.context import Context
from ncclscope.detect.timeout import countdown
from ncclscope.diagnose import diagnose

__all__ = ["compare", "read_files"]

_PROGRESS = ["comm_key", "comm_rank", "rank", "host", "calls", "last_seq"]
_WHO = ["comm_key", "seq", "op", "entered_ranks", "culprit_ranks"]
#: the job rows the live progress computes (the others come from the reference itself)
_LIVE_METRICS = (
    "ncclscope_collective_seq",
    "ncclscope_collective_entered_timestamp_seconds",
    "ncclscope_collective_op_info",
    "ncclscope_communicator_ranks",
    "ncclscope_rank_info",
    "ncclscope_collective_mark_seq",
    "ncclscope_collective_mark_timestamp_seconds",
)
_T0 = datetime(2026, 11, 27, 12, tzinfo=UTC)


def read_files(folder: Path) -> dict[str, list[str]]:
    """A folder's log files as the follower splits them (at ``\\n``, one ``\\r`` before it
    dropped)."""
    out = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.suffix not in (".md", ".json", ".parquet", ".pkl"):
            text = path.read_bytes().decode("utf-8", errors="replace")
            lines = text.split("\n")
            if lines and lines[-1] == "":
                lines.pop()
            out[str(path)] = [ln.removesuffix("\r") for ln in lines]
    return out


def _feed(
    files: Mapping[str, Sequence[str]], rng: random.Random, window: LiveWindow, live: LiveProgress
) -> datetime:
    """Every line, in polls of 1 to 400 lines over the files interleaved; returns the
    last poll's time."""
    at = {name: 0 for name in files}
    now = _T0
    while any(at[n] < len(files[n]) for n in files):
        now += timedelta(seconds=1)
        batch = []
        for name in files:
            take = rng.randint(0, 400)
            batch.extend((name, text, now) for text in files[name][at[name] : at[name] + take])
            at[name] += take
        window.add(batch)
        live.add(batch, own_times=window.own_times)
    return now


def _pending(ctx: Context, now: datetime, timeout_s: float) -> pl.DataFrame:
    return countdown(ctx, now, timeout_s).sort("comm_key")


def _differ(what: str, ref: pl.DataFrame, got: pl.DataFrame) -> list[str]:
    if ref.equals(got):
        return []
    return [f"{what}: reference {ref.rows()} live {got.rows()}"]


def _countdown_differs(
    what: str, ref: pl.DataFrame, got: pl.DataFrame, *, timed: bool
) -> list[str]:
    out = _differ(f"{what} (who)", ref.select(_WHO), got.select(_WHO))
    if timed and not out:
        for a, b in zip(ref["left_s"], got["left_s"], strict=True):
            if (a is None) != (b is None) or (a is not None and b is not None and abs(a - b) > 1):
                out.append(f"{what} (seconds left): reference {a} live {b}")
    return out


def compare(files: Mapping[str, Sequence[str]], *, seed: int = 0) -> list[str]:
    """Where the live progress over ``files`` (path -> lines) differs from ``analyze``
    on the same lines; empty when they agree."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="ncclscope-eq-") as tmp:
        work = Path(tmp)
        window = LiveWindow(work / "window", max_lines=10**8)
        live = LiveProgress()
        try:
            last = _feed(files, rng, window, live)
        finally:
            window.close()
        now = last + timedelta(seconds=rng.uniform(0, 200))
        d = window.analyse(work / "live", now=now)
        if d is None:
            return []
        ref = d.context
        ids = window.file_ids(d.analysis.paths)
        got = LiveContext(ref.analysis, now=now, live=live, file_ids=ids)
        out = _differ("progress", ref.progress.select(_PROGRESS), got.progress.select(_PROGRESS))
        timeout_s = timeout_of(d)
        pending = _pending(got, now, timeout_s)
        out += _countdown_differs("countdown", _pending(ref, now, timeout_s), pending, timed=True)
        index = MemberIndex.of(ref.analysis.identity.members)
        if not might_stall(live, index, ids) and not pending.is_empty():
            out.append(f"might_stall said no stall, the countdown found {pending.rows()}")
        rows = member_rows(live, index, ids)
        reference_rows = job_rows(d, now)
        for name in _LIVE_METRICS:
            if reference_rows.get(name, []) != rows.get(name, []):
                out.append(f"{name}: reference {reference_rows.get(name)} live {rows.get(name)}")
        if window.own_times:
            # NCCL printed its times: analyze on the files themselves reads the same.
            written = work / "files"
            written.mkdir()
            paths = []
            for k, (name, lines) in enumerate(files.items()):
                path = written / f"{k:03d}-{Path(name).name}"
                path.write_text("".join(f"{ln}\n" for ln in lines), encoding="utf-8")
                paths.append(str(path))
            post = diagnose(build(paths, workdir=work / "post"), now=now).context
            out += _differ(
                "progress (analyze)",
                post.progress.select(_PROGRESS),
                got.progress.select(_PROGRESS),
            )
            out += _countdown_differs(
                "countdown (analyze)", _pending(post, now, timeout_s), pending, timed=True
            )
        return out
