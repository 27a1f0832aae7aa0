"""The live path: followed lines into a bounded window, the window through the same
parsers and detectors as ``analyze``, the result as metric rows.

The window keeps the last lines of each followed file (``max_lines`` over all files), on
disk: each file's lines are appended to segment files of ``segment_lines`` lines, and
the oldest segment goes once the newer ones hold the file's share.  Holding the window
on disk rather than in Python objects keeps the agent's memory small and flat, and the
analysis reads the segments as they are, with no per-line work.

A job's COLL lines soon push its init lines (ranks, devices, communicators, the
DeepSpeed config) out of any window, and without them the live analysis would not know
who is who.  So a dropped segment's other lines are kept: the first ``keep_lines`` of
them for good, and the last ``keep_lines`` after those.  They all came before every line
still in the window, so writing them first keeps the file's order.

NCCL versions that print no INFO timestamps get the time each line arrived (DESIGN §4:
``stamped``): the window writes it in front of the line's NCCL header in NCCL's own
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
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TextIO

import polars as pl

from ncclscope.agent.progress import MARK_EVERY
from ncclscope.analysis import Analysis, build
from ncclscope.detect.straggler import lateness
from ncclscope.detect.timeout import countdown
from ncclscope.detect.waits import BOUND_METRIC, wait_bounds
from ncclscope.diagnose import Diagnosis, diagnose
from ncclscope.export.exclude import host_verdicts
from ncclscope.model.collectives import P2P_OPS
from ncclscope.parsers.nccl.patterns import HEADER_RE, PREFIX_TS_RE

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MARK_EVERY",
    "LiveWindow",
    "countdown_rows",
    "diagnosis_rows",
    "job_rows",
    "stamp",
    "timeout_of",
]

#: The collective timeout assumed where the logs state none: PyTorch's NCCL default
#: since 2.2 (``default_pg_nccl_timeout``, 10 minutes).
DEFAULT_TIMEOUT_S = 600.0


def _ts_text(arrived: datetime) -> str:
    return f"[{arrived:%Y-%m-%d %H:%M:%S.%f}] "


def stamp(text: str, arrived: datetime) -> str | None:
    """``text`` with ``arrived`` written as an NCCL timestamp in front of its NCCL header;
    None when the line has no header (nothing to stamp).

    >>> from datetime import UTC, datetime
    >>> stamp("[rank3]:node-0:41:41 [3] NCCL INFO x", datetime(2026, 1, 2, 3, 4, 5, 6, UTC))
    '[rank3]:[2026-01-02 03:04:05.000006] node-0:41:41 [3] NCCL INFO x'
    """
    return _stamped(text, _ts_text(arrived))


def _stamped(text: str, ts_text: str) -> str | None:
    """``text`` with ``ts_text`` in front of its NCCL header; None without one."""
    m = HEADER_RE.search(text)
    if m is None:
        return None
    at = m.start()
    return f"{text[:at]}{ts_text}{text[at:]}"


@dataclass
class _Segment:
    """One segment file: its lines, and where each poll's lines begin (line index in the
    segment, the arrival time as NCCL would print it)."""

    path: Path
    lines: int = 0
    marks: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class _Segments:
    """One followed file's window: closed segments and the open one."""

    stem: str
    done: list[_Segment] = field(default_factory=list)
    open: _Segment | None = None
    fh: TextIO | None = None
    #: lines in ``done``
    held: int = 0
    #: the first other (not COLL) lines of dropped segments, and the latest after those
    head: list[str] = field(default_factory=list)
    tail: deque[str] = field(default_factory=deque)


def _arrivals(seg: _Segment, n: int) -> list[str]:
    """Each of the segment's first ``n`` lines' arrival time (as NCCL would print it)."""
    out: list[str] = []
    for k, (at, ts) in enumerate(seg.marks):
        upto = seg.marks[k + 1][0] if k + 1 < len(seg.marks) else n
        out.extend([ts] * (min(upto, n) - at))
    return out


def _stamp_lines(lines: list[str], arrived: list[str]) -> list[str]:
    """``stamp`` over many lines at once: each line with an NCCL header gets its arrival
    time (as NCCL would print it) in front of the header.  Plain Python: the agent reads
    no frame for its window (``agent.reference``); only NCCL lines are searched."""
    out = lines.copy()
    for k, line in enumerate(lines):
        if " NCCL " in line and (stamped := _stamped(line, arrived[k])) is not None:
            out[k] = stamped
    return out


@dataclass
class LiveWindow:
    """The last ``max_lines`` lines (up to one segment more) of every followed file,
    stamped with their arrival times where NCCL printed none, in segment files under
    ``folder``.

    Lines go to disk as they come, a poll at a time, with no per-line work once the
    job's NCCL lines are known to carry their own times or not; each poll's arrival time
    is kept beside its segment, and stamping is done in bulk (in polars) when the window
    is written for a detector run.
    """

    folder: Path
    max_lines: int = 100_000
    segment_lines: int = 10_000
    keep_lines: int = 10_000
    _files: dict[str, _Segments] = field(default_factory=dict)
    #: the job's NCCL lines carry their own times: no stamping
    own_times: bool | None = None
    added: int = 0
    _seq: int = 0

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)

    @property
    def files(self) -> int:
        """Files with lines in the window."""
        return len(self._files)

    def file_paths(self) -> list[str]:
        """The followed files with lines in the window, as the follower named them."""
        return list(self._files)

    @property
    def lines(self) -> int:
        """Lines in the window, over all files."""
        return sum(s.held + (s.open.lines if s.open else 0) for s in self._files.values())

    def add(self, lines: Iterable[tuple[str, str, datetime]]) -> int:
        """Add ``(path, text, arrived)`` lines; returns how many.  Each file's lines keep
        their order; files' lines interleaved in ``lines`` (a replay merges them by
        time) are written a file at a time, one write per file and arrival."""
        n = 0
        runs: dict[str, list[tuple[datetime, list[str]]]] = {}
        for path, text, arrived in lines:
            mine = runs.get(path)
            if mine is None:
                mine = runs[path] = [(arrived, [])]
            elif mine[-1][0] != arrived:
                mine.append((arrived, []))
            if self.own_times is None and " NCCL " in text and (m := HEADER_RE.search(text)):
                self.own_times = PREFIX_TS_RE.search(text[: m.start()]) is not None
            mine[-1][1].append(text.rstrip("\n"))
            n += 1
        for path, mine in runs.items():
            for arrived, batch in mine:
                self._write(path, batch, arrived)
        self.added += n
        return n

    def add_texts(self, batches: Iterable[tuple[str, list[str], datetime]]) -> int:
        """``add`` for runs of one file's lines (``Follower.poll_texts``: texts without
        their newline), each written as it is: no work per line."""
        n = 0
        for path, texts, arrived in batches:
            if not texts:
                continue
            if self.own_times is None:
                self._learn_own_times(texts)
            self._write(path, texts, arrived)
            n += len(texts)
        self.added += n
        return n

    def _learn_own_times(self, texts: list[str]) -> None:
        for text in texts:
            if " NCCL " in text and (m := HEADER_RE.search(text)):
                self.own_times = PREFIX_TS_RE.search(text[: m.start()]) is not None
                return

    def _write(self, path: str, lines: list[str], arrived: datetime) -> None:
        """Append one file's lines of one poll to its segments."""
        seg = self._files.get(path)
        if seg is None:
            name = hashlib.sha1(path.encode(), usedforsecurity=False).hexdigest()[:12]
            seg = self._files[path] = _Segments(
                stem=f"{Path(path).name}.{name}", tail=deque(maxlen=self.keep_lines)
            )
        ts = _ts_text(arrived)
        at = 0
        while at < len(lines):
            if seg.open is None or seg.fh is None or seg.open.lines >= self.segment_lines:
                self._roll(seg)
            assert seg.open is not None
            assert seg.fh is not None
            chunk = lines[at : at + self.segment_lines - seg.open.lines]
            seg.open.marks.append((seg.open.lines, ts))
            seg.fh.write("\n".join(chunk) + "\n")
            seg.open.lines += len(chunk)
            at += len(chunk)
            # The oldest segment goes once the newer ones hold the file's share without it.
            share = max(self.segment_lines, self.max_lines // len(self._files))
            while seg.done and seg.held - seg.done[0].lines + seg.open.lines >= share:
                self._drop(seg)

    def _read(self, seg: _Segment, *, keep_coll: bool = True) -> list[str]:
        """A segment's lines (without its COLL lines unless ``keep_coll``), stamped when
        the job's NCCL prints no times."""
        with seg.path.open(encoding="utf-8", errors="replace", newline="") as fh:
            lines = fh.read().split("\n")[: seg.lines]
        arrived = _arrivals(seg, len(lines)) if self.own_times is False else []
        if not keep_coll:
            kept = [k for k, line in enumerate(lines) if " opCount " not in line]
            lines = [lines[k] for k in kept]
            arrived = [arrived[k] for k in kept] if arrived else []
        if arrived and lines:
            lines = _stamp_lines(lines, arrived)
        return lines

    def _drop(self, seg: _Segments) -> None:
        """Delete the oldest segment, keeping its lines that are not COLL lines."""
        old = seg.done.pop(0)
        for line in self._read(old, keep_coll=False):
            if len(seg.head) < self.keep_lines:
                seg.head.append(line + "\n")
            else:
                seg.tail.append(line + "\n")
        old.path.unlink(missing_ok=True)
        seg.held -= old.lines

    def _roll(self, seg: _Segments) -> None:
        """Close the open segment and open a new one."""
        if seg.open is not None:  # open, or closed by close() and written to again
            if seg.fh is not None:
                seg.fh.close()
            seg.done.append(seg.open)
            seg.held += seg.open.lines
        self._seq += 1
        path = self.folder / f"{seg.stem}.{self._seq:09d}.seg"
        seg.open = _Segment(path)
        seg.fh = path.open("w", encoding="utf-8", errors="replace", newline="")

    def write(self, folder: Path) -> list[Path]:
        """Write each file's window to ``folder`` as one file; returns the paths written."""
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for seg in self._files.values():
            if seg.fh is not None:
                seg.fh.flush()
            out = folder / f"{seg.stem}.log"
            with out.open("w", encoding="utf-8", errors="replace", newline="") as dst:
                dst.writelines(seg.head)
                dst.writelines(seg.tail)
                for part in [*seg.done, *([seg.open] if seg.open else [])]:
                    lines = self._read(part)
                    if lines:
                        dst.write("\n".join(lines) + "\n")
            written.append(out)
        return written

    def analyse(
        self,
        workdir: Path,
        *,
        lock: AbstractContextManager[object] | None = None,
        now: datetime | None = None,
    ) -> Diagnosis | None:
        """The window through ``analyze``'s pipeline; None while it is empty.  ``lock``
        (the agent's, shared with the thread that adds lines) is held only while the
        window is copied out, not through the analysis.  ``now``: the agent's wall
        clock, so that a job that stopped logging is idle until now, not until its last
        line (``Context.now``).  The diagnosis carries the context its detectors read,
        which ``job_rows`` exports from."""
        copied = self.copy_out(workdir, lock=lock)
        if copied is None:
            return None
        paths, stamped = copied
        return diagnose(
            build(
                paths, workdir=workdir / "analysis", coll_ts_source="stamped" if stamped else "nccl"
            ),
            now=now,
        )

    def copy_out(
        self, workdir: Path, *, lock: AbstractContextManager[object] | None = None
    ) -> tuple[list[str], bool] | None:
        """The window written to ``workdir/window`` for an analysis (``write``), under
        ``lock``: the files' paths and whether their NCCL times are the arrival stamps
        the window wrote; None while it is empty."""
        with lock if lock is not None else nullcontext():
            if not self._files:
                return None
            return [str(p) for p in self.write(workdir / "window")], self.own_times is False

    def file_ids(self, paths: list[str]) -> dict[str, int]:
        """Followed path -> its file id in an analysis of the window whose inputs were
        ``paths`` (the files ``write`` wrote)."""
        ids = {Path(p).name: k for k, p in enumerate(paths)}
        return {
            path: ids[f"{seg.stem}.log"]
            for path, seg in self._files.items()
            if f"{seg.stem}.log" in ids
        }

    def close(self) -> None:
        """Close the open segments (the files stay until ``folder`` is removed)."""
        for seg in self._files.values():
            if seg.fh is not None:
                seg.fh.close()
                seg.fh = None


def _counted_seq(analysis: Analysis) -> list[tuple[tuple[str, ...], float]]:
    """Per (communicator, member): the sequence of its last collective counted from the
    start of the lines: its collective calls, less one."""
    stats, members = analysis.stats, analysis.identity.members
    if stats.is_empty() or members.is_empty():
        return []
    key = ["file_id", "host", "pid", "comm"]
    seqs = (
        stats.filter(pl.col("coll_calls") > 0)
        .join(members.select(*key, "comm_key", "comm_rank", "rank"), on=key, how="inner")
        .filter(pl.col("comm_key").is_not_null() & pl.col("comm_rank").is_not_null())
        .group_by("comm_key", pl.coalesce("rank", "comm_rank").alias("who"))
        .agg((pl.col("coll_calls") - 1).max().alias("seq"))
        .sort("comm_key", "who")
    )
    return [((str(c), str(w)), float(s)) for c, w, s in seqs.iter_rows()]


def _member_facts(analysis: Analysis) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """Per (communicator, member): when it entered its last collective, that op, and its
    arrival time at the last mark (``MARK_EVERY``); per communicator: its size; per
    rank: its host.  Sequence numbers count as ``_counted_seq`` does, so that every
    node's agent numbers a collective alike.

    From the window's COLL lines, e.g. ``[2025-03-14 09:00:09.387136] node-6:5381:5381
    [3] NCCL INFO AllGather: opCount 1a ... comm 0x55d4c8a0 [nranks=16] stream 0x55..``.
    """
    rows: dict[str, list[tuple[tuple[str, ...], float]]] = {}
    coll = analysis.collectives
    if coll is None:
        return rows
    key = ["file_id", "host", "pid", "comm"]
    calls = (
        coll.filter(~pl.col("op").is_in(P2P_OPS) & pl.col("comm_key").is_not_null())
        .select(*key, "comm_key", "rank", "op", "nranks", "ts", "line_no")
        .collect()
        .sort("file_id", "line_no")
        .with_columns(
            pl.int_range(pl.len()).over("comm_key", "rank", "file_id", "pid").alias("seq"),
            pl.col("rank").cast(pl.String).alias("who"),
        )
        .filter(pl.col("who").is_not_null())
    )
    if calls.is_empty():
        return rows
    last = (
        calls.group_by("comm_key", "who", maintain_order=True)
        .agg(pl.col("op", "ts", "host").last(), pl.col("nranks").max())
        .sort("comm_key", pl.col("who").cast(pl.Int64, strict=False))
    )
    for comm, who, op, ts, _host, _n in last.iter_rows():
        if ts is not None:
            rows.setdefault("ncclscope_collective_entered_timestamp_seconds", []).append(
                ((str(comm), who), ts.timestamp())
            )
        rows.setdefault("ncclscope_collective_op_info", []).append(((str(comm), who, str(op)), 1.0))
    sizes = last.group_by("comm_key").agg(pl.col("nranks").max()).sort("comm_key")
    rows["ncclscope_communicator_ranks"] = [
        ((str(c),), float(n)) for c, n in sizes.iter_rows() if n is not None
    ]
    hosts = last.filter(pl.col("host").is_not_null()).unique(["who"], maintain_order=True)
    rows["ncclscope_rank_info"] = [
        ((w, str(h)), 1.0) for w, h in hosts.select("who", "host").iter_rows()
    ]
    for every in MARK_EVERY:
        marks = (
            calls.filter((pl.col("seq") % every == 0) & pl.col("ts").is_not_null())
            .group_by("comm_key", "who", maintain_order=True)
            .agg(pl.col("seq", "ts").last())
            .sort("comm_key", pl.col("who").cast(pl.Int64, strict=False))
        )
        for comm, who, seq, ts in marks.iter_rows():
            labels = (str(comm), who, str(every))
            rows.setdefault("ncclscope_collective_mark_seq", []).append((labels, float(seq)))
            rows.setdefault("ncclscope_collective_mark_timestamp_seconds", []).append(
                (labels, ts.timestamp())
            )
    return rows


def job_rows(diagnosis: Diagnosis, now: datetime) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """The job's metric rows from a diagnosis of some lines at time ``now``, read from
    the context its detectors read (lateness and stalls are not computed again): the
    post-mortem reference of what the agent exports live (``agent.progress``), where
    sequences count every call since the agent started, whatever left its window.
    """
    analysis = diagnosis.analysis
    rows: dict[str, list[tuple[tuple[str, ...], float]]] = {}
    rows["ncclscope_collective_seq"] = _counted_seq(analysis)
    rows.update(_member_facts(analysis))
    rows.update(diagnosis_rows(diagnosis))
    rows.update(countdown_rows(countdown(diagnosis.context, now, timeout_of(diagnosis))))
    return rows


def timeout_of(diagnosis: Diagnosis) -> float:
    """The collective timeout in force: as the logs state it, else PyTorch's default."""
    timeout_s, _source = diagnosis.analysis.frameworks.timeout
    return timeout_s if timeout_s is not None else DEFAULT_TIMEOUT_S


def countdown_rows(pending: pl.DataFrame) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """The countdown's rows (``detect.timeout.countdown``): per communicator with a
    collective some members entered and others did not, its age, the seconds left and
    whom it waits for."""
    rows: dict[str, list[tuple[tuple[str, ...], float]]] = {}
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
    return rows


def diagnosis_rows(diagnosis: Diagnosis) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """What only a whole analysis of the window tells: lateness and straggler scores,
    the timeout in force, NCCL errors, findings, Inspector's bandwidth, unread lines."""
    analysis = diagnosis.analysis
    rows: dict[str, list[tuple[tuple[str, ...], float]]] = {}
    late = lateness(diagnosis.context)
    if len(late):
        # One row per rank: of the communicators with the most members, the one it was
        # timed on most often (a node's agent sees the world's members on the node and
        # the node's own communicator alike; two rows would be one series twice).
        who_expr = pl.coalesce(pl.col("rank"), pl.col("comm_rank")).alias("who")
        world = (
            late.filter(pl.col("members") == late["members"].max())
            .sort(["instances", "comm_key"], descending=[True, False])
            .with_columns(who_expr)
            .unique(subset="who", keep="first", maintain_order=True)
            .sort("who")
        )
        typical = world["median_s"].median()
        for r in world.iter_rows(named=True):
            who = str(r["rank"] if r["rank"] is not None else r["comm_rank"])
            rows.setdefault("ncclscope_collective_lateness_seconds", []).append(
                ((who,), float(r["median_s"]))
            )
            if r["gap_s"] and isinstance(typical, float):
                score = max(0.0, (r["median_s"] - typical) / r["gap_s"])
                rows.setdefault("ncclscope_straggler_score", []).append(((who,), score))
    rows["ncclscope_collective_timeout_seconds"] = [((), timeout_of(diagnosis))]
    bounds = wait_bounds(diagnosis.context)
    if len(bounds):
        rows[BOUND_METRIC] = [
            ((str(comm),), float(bound))
            for comm, bound in bounds.select("comm_key", "bound_s").iter_rows()
        ]
    errors = analysis.errors.group_by("kind", "severity").len()
    rows["ncclscope_nccl_errors"] = [((str(k), str(s)), float(n)) for k, s, n in errors.iter_rows()]
    counts: dict[tuple[str, str], int] = {}
    for f in diagnosis.findings:
        counts[(f.kind, f.severity)] = counts.get((f.kind, f.severity), 0) + 1
    rows["ncclscope_findings"] = [(k, float(n)) for k, n in sorted(counts.items())]
    drain: list[tuple[tuple[str, ...], float]] = [
        ((host, reason), 1.0)
        for host, reasons in sorted(host_verdicts(diagnosis).items())
        for reason in reasons
    ]
    if drain:
        rows["ncclscope_node_fault_info"] = drain
    rows.update(_bus_bandwidth(analysis))
    unparsed = analysis.inputs["unparsed"].sum()
    rows["ncclscope_log_window_lines_unparsed"] = [((), float(unparsed))]
    damaged = sum(analysis.inputs[reason].sum() for reason in ("malformed", "binary", "too_long"))
    rows["ncclscope_log_window_lines_damaged"] = [((), float(damaged))]
    return rows


def _bus_bandwidth(analysis: Analysis) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """Inspector's measured bus bandwidth in the window: the median per op and power-of-two
    size bucket (bounded: a few ops times at most 40 buckets)."""
    records = analysis.tools.inspector.filter(
        pl.col("bus_bw_bytes_per_s").is_not_null()
        & (pl.col("msg_size_bytes") > 0)
        & pl.col("op").is_not_null()
    )
    if records.is_empty():
        return {}
    # The bucket's lower bound: 2^floor(log2(size)), capped at 2^40 (a TiB buffer).
    bucket = (
        pl.lit(2, dtype=pl.Int64)
        .pow(pl.col("msg_size_bytes").log(2).floor().clip(0, 40).cast(pl.Int64))
        .alias("bucket")
    )
    per = (
        records.with_columns(bucket)
        .group_by("op", "bucket")
        .agg(pl.col("bus_bw_bytes_per_s").median())
        .sort("op", "bucket")
    )
    return {
        "ncclscope_collective_bus_bandwidth_bytes_per_second": [
            ((str(op), str(b)), float(bw)) for op, b, bw in per.iter_rows()
        ]
    }
