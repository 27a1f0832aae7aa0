"""Several runs in one file: where each attempt of the job starts (DESIGN §5, trust rules).

A log kept across a restart holds two runs, and NCCL before 2.17 prints no commId: the
members of both would be matched into one communicator and read as one job.  A file is
cut where a new attempt begins:

* ``restart``: the launcher says it restarts the workers
  (``[default] Worker group FAILED. 2/3 attempts left; will restart worker group``,
  ``restart_count=1`` in a rendezvous result);
* ``banner``: a process prints NCCL's version banner a second time
  (``node-1:31:31 [0] NCCL INFO NCCL version 2.7.8+cuda11.0``): NCCL prints it once per
  process, so the pid was reused by a new process (containers restart with the same pids);
* ``init``: a process initialises a communicator again after calls on it (the same
  pointer, or the same (nranks, rank) place as a communicator that made its last call);
* ``pids``: every process of the run stopped logging, and new processes holding the same
  (host, rank) slots started.

Attempt ``k`` of the job is the ``k``-th segment of each file.  Everything here is a
handful of rows per process: no per-line work.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime

import polars as pl

from ncclscope.parsers.nccl.records import LineRecords, ProcKey

__all__ = ["Attempt", "Cut", "find_cuts", "segment_starts"]

#: Launcher lines that start a new attempt: torchelastic's agent, any era.
RESTART_RE = r"(?i)will restart worker group|restarting worker|restart_count\s*[=:]\s*[1-9]"
#: The INFO copy of NCCL's banner, with its process.
_BANNER_RE = r"(\S+?):(\d+):\d+ (?:\[-?\d+\] )?NCCL INFO NCCL version "


@dataclass(frozen=True, order=True)
class Cut:
    """A line of a file where a new attempt starts, why, and the process whose own line
    it is (a banner, an init), if any."""

    file_id: int
    line_no: int
    reason: str
    pid: int | None = None
    host: str | None = None


@dataclass
class Attempt:
    """One run of the job: its segment of each file, and what the diagnosis found in it."""

    index: int
    #: file_id -> (first line, last line) of this attempt's segment (last: None = to the end)
    spans: dict[int, tuple[int, int | None]]
    #: why it started: ``start`` for the first, else the reasons of its cuts
    reasons: list[str]
    hosts: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    world_size: int | None = None
    ts_start: datetime | None = None
    ts_end: datetime | None = None
    #: indices into ``Analysis.findings``
    findings: list[int] = field(default_factory=list)


#: Literal pieces of the lines this module reads, for one cheap filter of the text store:
#: a banner, a launcher's restart.
HINTS = ("NCCL version ", "estart")


def find_cuts(
    hints: pl.DataFrame,
    nccl_kind: int,
    records: LineRecords,
    stats: pl.DataFrame,
    marks: pl.DataFrame,
) -> list[Cut]:
    """Every line where a new attempt starts, over all files, sorted.

    ``hints``: the text store's rows (``file_id``, ``i``, ``kind``, ``text``) holding one
    of :data:`HINTS` (``nccl_kind``: the kind of lines with an NCCL marker); ``stats``:
    per (process, comm) COLL statistics; ``marks``: (``file_id``, ``line_no``) of
    framework lines, which keep a segment of a file without NCCL lines.
    """
    nccl_lines = hints.lazy().filter(pl.col("kind") == nccl_kind)
    other_lines = hints.lazy().filter(pl.col("kind") != nccl_kind)
    banners = _banners(nccl_lines)
    points = _points(records, stats, banners)
    # Work done: the lines that are not a start (banner, Init): a cut separates work.
    starts = {(f, i) for f, i in banners.select("file_id", "i").iter_rows()}
    starts |= {(p[0], line) for p, line, ev in records.comm_events if ev.event == "Init"}
    work = {
        proc: [x for x in lines if (proc[0], x) not in starts] for proc, lines in points.items()
    }
    hard = [*_restart_cuts(other_lines), *_banner_cuts(banners), *_init_cuts(records, stats)]
    # The same restart's later banners and inits go first: a process split at its own
    # redundant cut would look like a process that stopped and started again.
    hard = _keep_separating(sorted(set(hard)), work, marks)
    cuts = sorted({*hard, *_turnover_cuts(_pieces(points, hard, records))})
    # A turnover is new processes in slots that stopped processes held: those processes'
    # own init lines are the run before, even where it stopped before any call (a run
    # that died during start-up), so its inits count as something logged.
    return _keep_separating(cuts, work, marks, turnover=points)


def segment_starts(cuts: list[Cut], file_ids: list[int]) -> pl.DataFrame:
    """Per file, the first line of each segment and its attempt index (``file_id``,
    ``start``, ``attempt``, ``reason``); every file starts attempt 0 at line 0."""
    rows = [{"file_id": f, "start": 0, "attempt": 0, "reason": "start"} for f in file_ids]
    by_file: dict[int, dict[int, set[str]]] = defaultdict(dict)
    for cut in cuts:
        by_file[cut.file_id].setdefault(cut.line_no, set()).add(cut.reason)
    for file_id, merged in by_file.items():
        for k, (line_no, reasons) in enumerate(sorted(merged.items()), start=1):
            if len(reasons) > 1:
                reasons.discard("pids")  # the turnover a process's own restart line shows
            reason = "+".join(sorted(reasons))
            rows.append({"file_id": file_id, "start": line_no, "attempt": k, "reason": reason})
    return pl.DataFrame(
        rows,
        schema={"file_id": pl.UInt32, "start": pl.UInt32, "attempt": pl.Int32, "reason": pl.String},
    ).sort("file_id", "start")


def _restart_cuts(other_lines: pl.LazyFrame) -> list[Cut]:
    rows = (
        other_lines.filter(pl.col("text").str.contains("estart", literal=True))
        .filter(pl.col("text").str.contains(RESTART_RE))
        .select("file_id", "i")
        .collect()
    )
    return [Cut(int(f), int(i), "restart") for f, i in rows.iter_rows()]


def _banners(nccl_lines: pl.LazyFrame) -> pl.DataFrame:
    """(file_id, i, host, pid) of every INFO banner line, in file order."""
    return (
        nccl_lines.filter(pl.col("text").str.contains("NCCL version ", literal=True))
        .select(
            "file_id",
            "i",
            pl.col("text").str.extract_groups(_BANNER_RE).struct.rename_fields(["host", "pid"]),
        )
        .unnest("text")
        .drop_nulls()
        .with_columns(
            pl.col("host").str.split(":").list.last(), pl.col("pid").cast(pl.Int32, strict=False)
        )
        .drop_nulls()
        .sort("file_id", "i")
        .collect()
    )


def _banner_cuts(banners: pl.DataFrame) -> list[Cut]:
    again = banners.filter(pl.int_range(pl.len()).over("file_id", "host", "pid") > 0)
    return [Cut(int(f), int(i), "banner", int(p), str(h)) for f, i, h, p in again.iter_rows()]


def _init_cuts(records: LineRecords, stats: pl.DataFrame) -> list[Cut]:
    """A process initialising a communicator again after calls on it: the same pointer,
    or a new pointer in the same (nranks, rank) place as one whose calls all came before
    (a restarted process with a reused pid: containers start their processes at pid 1).
    A sub-communicator of the same size made while the first still works is not one."""
    calls: dict[tuple[ProcKey, str], tuple[int, int]] = {}
    if not stats.is_empty():
        rows = stats.select(
            "file_id", "host", "pid", "comm", "first_line", pl.col("last_line").fill_null(0)
        ).iter_rows()
        for f, h, p, c, first, last in rows:
            calls[((int(f), str(h), int(p)), str(c))] = (int(first), max(int(first), int(last)))
    cuts = []
    inited: dict[ProcKey, list[tuple[str, int, int]]] = defaultdict(list)
    for proc, line_no, ev in records.comm_events:
        if ev.event != "Init":
            continue
        for comm, nranks, rank in inited[proc]:
            span = calls.get((proc, comm))
            if span is None or span[0] >= line_no:
                continue  # no call on it before this init
            same = comm == ev.comm
            if same or ((nranks, rank) == (ev.nranks, ev.rank) and span[1] < line_no):
                cuts.append(Cut(proc[0], line_no, "init", proc[2], proc[1]))
                break
        inited[proc].append((ev.comm, ev.nranks, ev.rank))
    return cuts


def _points(
    records: LineRecords, stats: pl.DataFrame, banners: pl.DataFrame
) -> dict[ProcKey, list[int]]:
    """Per process, the lines known to be its own (sorted): init, error and banner
    lines, and each communicator's first and last call."""
    points: dict[ProcKey, list[int]] = defaultdict(list)
    if not stats.is_empty():
        rows = stats.select(
            "file_id", "host", "pid", "first_line", pl.col("last_line").fill_null(0)
        ).iter_rows()
        for f, h, p, lo, hi in rows:
            points[(int(f), str(h), int(p))] += [int(lo), int(hi)] if hi else [int(lo)]
    for proc, line_no, _ev in records.comm_events:
        points[proc].append(line_no)
    for group in records.errors:
        points[group.proc].append(group.line_no)
    for f, i, h, p in banners.iter_rows():
        points[(int(f), str(h), int(p))].append(int(i))
    return {proc: sorted(set(lines)) for proc, lines in points.items() if lines}


#: A piece of a process's lines: (first line, last line, its (host, rank, nranks) slots).
_Piece = tuple[int, int, frozenset[tuple[str, int, int]]]


def _pieces(
    points: dict[ProcKey, list[int]], hard: list[Cut], records: LineRecords
) -> dict[int, list[_Piece]]:
    """Per file, each process's lines split at its own cuts and the launcher's (a reused
    pid is two processes), sorted, with the slots its Init lines hold."""
    slots: dict[ProcKey, set[tuple[str, int, int]]] = defaultdict(set)
    for proc, _line, ev in records.comm_events:
        if ev.event == "Init":
            slots[proc].add((proc[1], ev.rank, ev.nranks))
    pieces: dict[int, list[_Piece]] = defaultdict(list)
    for proc, lines in points.items():
        edges = sorted(
            c.line_no
            for c in hard
            if c.file_id == proc[0] and (c.pid is None or (c.host, c.pid) == proc[1:])
        )
        held = frozenset(slots.get(proc, set()))
        lo = hi = lines[0]
        for line in lines[1:]:
            if any(hi < e <= line for e in edges):
                pieces[proc[0]].append((lo, hi, held))
                lo = line
            hi = line
        pieces[proc[0]].append((lo, hi, held))
    for file_pieces in pieces.values():
        file_pieces.sort(key=lambda p: (p[0], p[1]))
    return pieces


def _turnover_cuts(pieces: dict[int, list[_Piece]]) -> list[Cut]:
    """Where every process of a file stopped logging and new processes started that hold
    a (host, rank, nranks) slot held before in the file, or held in another file (two
    runs' files of different ranks joined).  New processes in slots no other process
    holds are not a new run (two ranks' files of one run joined end to end)."""
    holders: dict[tuple[str, int, int], set[int]] = defaultdict(set)
    for file_id, file_pieces in pieces.items():
        for _lo, _hi, piece_slots in file_pieces:
            for slot in piece_slots:
                holders[slot].add(file_id)
    cuts = []
    #: per file, where processes whose slots no line says (their init lines were cut
    #: away) all stopped and processes holding slots started
    unknown: list[Cut] = []
    for file_id, file_pieces in pieces.items():
        end = -1
        slots: set[tuple[str, int, int]] = set()
        for lo, hi, piece_slots in file_pieces:
            elsewhere = any(holders[slot] - {file_id} for slot in piece_slots)
            if end >= 0 and lo > end and (piece_slots & slots or elsewhere):
                cuts.append(Cut(file_id, lo, "pids"))
                slots = set()
            elif end >= 0 and lo > end and piece_slots and not slots:
                unknown.append(Cut(file_id, lo, "pids"))
            end = max(end, hi)
            slots |= piece_slots
    # Those are a new run where the job turned over in another file too (a launcher
    # restarts every host at once); alone, they may be two ranks' files joined end to end.
    turned = {c.file_id for c in cuts}
    cuts += [c for c in unknown if c.file_id not in turned and turned]
    if not turned:
        # No slot known before (the whole job's head cut away, init lines and all): the
        # same turnover once in each of several files is a restart; one file turning
        # over, or one file several times, may be ranks' files joined end to end.
        per_file = Counter(c.file_id for c in unknown)
        if len(per_file) >= 2 and set(per_file.values()) == {1}:
            cuts += unknown
    return cuts


def _keep_separating(
    cuts: list[Cut],
    points: dict[ProcKey, list[int]],
    marks: pl.DataFrame,
    turnover: dict[ProcKey, list[int]] | None = None,
) -> list[Cut]:
    """The cuts that separate work (``points``: lines of work per process).  A process's
    own cut (a banner, an init) counts when that process worked since the last kept
    cut: the next processes' banners and inits of the same restart are not new
    attempts.  A launcher's or a turnover cut counts when anything was logged since the
    last kept cut (``will restart``, then ``restart_count=1``, is one restart); for a
    turnover, ``turnover`` (every line of the processes, starts included) says what was
    logged."""
    if not cuts:
        return []  # the common case: marks (framework lines, many) are not even read
    any_line: dict[int, list[int]] = defaultdict(list)
    for proc, lines in points.items():
        any_line[proc[0]] += lines
    if any(c.pid is None for c in cuts):
        for (f,), part in marks.group_by("file_id"):
            any_line[int(f)] += part["line_no"].to_list()
    per_file = {f: sorted(lines) for f, lines in any_line.items()}
    started: dict[int, list[int]] = defaultdict(list)
    for proc, lines in (turnover or {}).items():
        started[proc[0]] += lines
    for f, lines in per_file.items():
        started[f] += lines
    per_file_turnover = {f: sorted(lines) for f, lines in started.items()}
    per_proc = {proc: lines for proc, lines in points.items()}  # sorted by _points
    kept: list[Cut] = []
    last: dict[int, int] = {}
    for cut in cuts:
        before = last.get(cut.file_id, 0)
        if cut.pid is not None and cut.host is not None:
            lines = per_proc.get((cut.file_id, cut.host, cut.pid), [])
        elif cut.reason == "pids" and turnover is not None:
            lines = per_file_turnover.get(cut.file_id, [])
        else:
            lines = per_file.get(cut.file_id, [])
        # Any line strictly between the last kept cut and this one.
        k = bisect_right(lines, before)
        if cut.line_no == before or (k < len(lines) and lines[k] < cut.line_no):
            kept.append(cut)
            last[cut.file_id] = cut.line_no
    return kept
