"""What the logs say about a job that stopped: stop evidence, and PyTorch's watchdog
reports grouped per process group.

A hang is a claim that the job stopped.  The claim needs evidence, and this module
collects it once for the hang and timeout detectors (``stop_evidence``): the watchdog's
own lines (timeouts, heartbeat monitor, the abort that follows a timeout)::

    [rank2]:[E1105 10:11:12.000 711 ProcessGroupNCCL.cpp:616] [Rank 2] Watchdog caught
    collective operation timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE, NumelIn=64,
    NumelOut=64, Timeout(ms)=600000) ran for 600021 milliseconds before timing out.

an NCCL error, a launcher's failure summary or closing signals, and, from timestamps,
no progress for far longer than the job's normal gap between collectives.  A log that
simply ends while its ranks are a collective or two apart carries none of these: it is
the normal picture of a running job copied mid-run.

``pg_timeouts`` groups the watchdog reports per (process group, SeqNum): who reported
(timeout lines and their companion lines), what each called (op and sizes: a different
op or size at the same SeqNum is a collective mismatch), how far each had enqueued, the
group's members where they can be known, and whether the kept lines hold the whole block
of reports (a log cut inside it loses reporters, which must not make them culprits).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from statistics import median
from typing import TYPE_CHECKING

import polars as pl

from ncclscope.detect.waits import wait_bounds
from ncclscope.model.identity import listable_size

if TYPE_CHECKING:
    from ncclscope.detect.context import Context

__all__ = [
    "GAP_MULTIPLE",
    "MIN_STALL_S",
    "PgTimeout",
    "StopEvidence",
    "consequence_deaths",
    "log_continues",
    "pg_timeouts",
    "report_extent",
    "stop_evidence",
]

#: No progress for this many times the job's normal gap between collectives...
GAP_MULTIPLE = 20.0
#: ...and for at least this long, before the timestamps alone say the job stopped.  A
#: healthy job pauses its collectives for minutes on purpose: a checkpoint written by
#: rank 0 while the others wait at a barrier, an evaluation pass, the first step's
#: compilation.  Five minutes sits above those and below PyTorch's own collective
#: timeout (10 minutes from 2.2; DeepSpeed passes 30), which is the next evidence to come.
MIN_STALL_S = 300.0

#: torch_events kinds that only a watchdog that fired (or a monitor that gave up) prints.
_WATCHDOG_EVENTS = (
    "heartbeat_timeout",
    "watchdog_stuck",
    "watchdog_terminated",
    "process_abort",
    "desync_timeout",
    "desync_lagging",
    "work_status",
)
#: torch_events kinds printed with a rank's watchdog report, around its timeout line.
_REPORT_PARTS = ("work_status", "process_abort", "watchdog_terminated")
#: Signals that are a consequence of the hang, not its cause: the watchdog aborts its own
#: process after a timeout (SIGABRT), the launcher stops the survivors (SIGTERM).
_CONSEQUENCE_SIGNALS = ("SIGABRT", "SIGTERM")


@dataclass(frozen=True)
class StopEvidence:
    """Why the logs say the job stopped (``kinds``, empty when they do not)."""

    kinds: list[str]
    #: seconds without progress measured from timestamps, and the bound it was held to
    idle_s: float | None = None
    idle_bound_s: float | None = None

    @property
    def stopped(self) -> bool:
        """Evidence that the job was stuck: anything but a later run alone (a run that a
        restart followed ended there, but a preempted or killed healthy run ends so too)."""
        return any(k != "restarted" for k in self.kinds)

    @property
    def direct(self) -> bool:
        """Evidence printed by the job itself, not inferred from timestamps."""
        return any(k not in ("no_progress", "restarted") for k in self.kinds)

    def json(self) -> dict[str, object]:
        out: dict[str, object] = {"stop_evidence": list(self.kinds)}
        if self.idle_s is not None:
            out["idle_s"] = round(self.idle_s, 3)
            out["idle_bound_s"] = self.idle_bound_s
        return out


def stop_evidence(
    ctx: Context, last_active: datetime | None = None, comm_key: str | None = None
) -> StopEvidence:
    """The job-level evidence that it stopped.  ``last_active``: when the stalled members
    last logged anything; with it, no progress for longer than the bound counts too: live,
    the stalled communicator's (``comm_key``) own history where it has one (``waits``),
    else ``MIN_STALL_S`` or ``GAP_MULTIPLE`` gaps."""
    a = ctx.analysis
    fw = a.frameworks
    kinds: list[str] = []
    if len(fw.timeouts):
        kinds.append("watchdog_timeout")
    if len(fw.torch_events.filter(pl.col("kind").is_in(_WATCHDOG_EVENTS))):
        kinds.append("watchdog")
    nccl_errors = fw.torch_events.filter(pl.col("kind") == "nccl_error")
    if len(a.errors.filter(pl.col("severity") == "error")) or len(nccl_errors):
        kinds.append("nccl_error")
    if len(fw.failures):
        kinds.append("launcher_failure")
    if len(fw.torch_events.filter(pl.col("kind") == "closing_signal")):
        kinds.append("launcher_stop")
    if ctx.followed_by:
        # A later run followed this one (``Context.followed_by``): this run ended here.
        kinds.append("restarted")
    idle = bound = None
    # Live, the idle time runs to the wall clock: a job that stopped logging is idle for
    # as long as the clock has run since, not only until its last line.
    end = ctx.now if ctx.now is not None else ctx.last_ts
    if last_active is not None and end is not None:
        idle = (end - last_active).total_seconds()
        gap = _normal_gap_s(ctx)
        bound = max(MIN_STALL_S, GAP_MULTIPLE * gap) if gap is not None else MIN_STALL_S
        # Live (``now``: the clock runs past the last line), the stalled communicator's
        # own history bounds it; post-mortem a log that simply goes on past a stall (a
        # first evaluation logged by one rank while the others wait) keeps the long one.
        if comm_key is not None and ctx.now is not None:
            own = wait_bounds(ctx).filter(pl.col("comm_key") == comm_key)["bound_s"]
            if len(own):
                bound = min(bound, float(own[0]))
        if idle > bound:
            kinds.append("no_progress")
    return StopEvidence(kinds, idle, bound)


def _normal_gap_s(ctx: Context) -> float | None:
    """The median time between consecutive collectives of a communicator (first
    arrivals), over the sampled instances; None without timestamps."""
    inst = ctx.instances.filter(pl.col("ts_min").is_not_null())
    if len(inst) < 3:
        return None
    gaps = (
        inst.sort("comm_key", "seq")
        .with_columns(
            (pl.col("ts_min").diff().over("comm_key").dt.total_microseconds() / 1e6)
            / pl.col("seq").diff().over("comm_key").cast(pl.Float64)
        )["ts_min"]
        .drop_nulls()
        .to_list()
    )
    positive = [g for g in gaps if g is not None and g >= 0]
    return float(median(positive)) if positive else None


def report_extent(
    ctx: Context, rows: pl.DataFrame | None = None
) -> tuple[datetime | None, set[int]]:
    """When the watchdog reports (``rows``, else every timeout line) began, and the files
    holding them or their companion lines: what ``log_continues`` holds a member to."""
    fw = ctx.analysis.frameworks
    t = fw.timeouts if rows is None else rows
    first = t["ts"].min()
    files = set(t["file_id"].to_list())
    status = fw.torch_events.filter(pl.col("kind") == "work_status")
    if rows is not None:
        status = status.filter(pl.col("seq").is_in(rows["seq"].unique().implode()))
    files |= set(status["file_id"].to_list())
    return (first if isinstance(first, datetime) else None), {int(f) for f in files}


def log_continues(
    ctx: Context,
    rank: int,
    at: datetime | None,
    reporter_files: set[int],
    group_size: int | None = None,
) -> bool:
    """Could ``rank``'s own log have shown a line at time ``at`` (the watchdog's)?  Only
    then does its silence say something.  Yes when a file holding its lines also holds a
    reporter's watchdog line (the same stream: its line would be there), or carries a
    time at or after ``at``.  A rank that left no line, or whose file ends before the
    reports (a file cut short, copied early, lost its tail), cannot be said to have
    stayed silent: its report may only have been lost."""
    files = ctx.files_of(rank, group_size)
    if files & reporter_files:
        return True
    if rank in ctx.ranks_without_logs:
        return False  # no line of its own, and no stream it shares with the reporters
    ends = ctx.file_ends

    def goes_on(f: int) -> bool:
        return f in reporter_files or (at is not None and f in ends and not _before(ends[f], at))

    if not files:
        # Which file is its own no line says (its init lines were cut): as many NCCL
        # processes logged as the group has members, so one of them is it, and every
        # file they logged in goes on past the reports: wherever it is, it could have
        # reported.
        size = group_size or ctx.analysis.world_size or ctx.analysis.identity.world_size
        procs = ctx.processes_per_file
        if bool(size and procs and sum(procs.values()) >= size and all(map(goes_on, procs))):
            return True
        own = _one_unnamed_process(ctx, size)
        return own is not None and goes_on(own)
    return any(goes_on(f) for f in files)


def _one_unnamed_process(ctx: Context, size: int | None) -> int | None:
    """The file of the one rank no line names, where it can be told: one rank of the
    group is named nowhere, and one file alone holds one NCCL process more than the
    ranks its lines name (a host's stream whose other ranks' reports are in it, the
    stuck rank's init lines cut away).  Where NCCL's lines and PyTorch's go to separate
    files (stdout and stderr), every NCCL file holds more: then nothing is told."""
    if not size or not listable_size(size):
        return None
    named = ctx.ranks_named_per_file
    every: set[int] = set().union(*named.values()) if named else set()
    if len(every & set(range(size))) != size - 1:
        return None
    excess = {f: n - len(named.get(f, frozenset())) for f, n in ctx.processes_per_file.items()}
    over = [f for f, k in excess.items() if k > 0]
    if len(over) != 1 or excess[over[0]] != 1 or not named.get(over[0]):
        return None
    return over[0]


def consequence_deaths(ctx: Context) -> set[int]:
    """Ranks whose death the hang caused: SIGTERM from the launcher, or SIGABRT at or
    after the first watchdog timeout (the watchdog takes its own process down)."""
    fw = ctx.analysis.frameworks
    first_timeout = fw.timeouts["ts"].min()
    out: set[int] = set()
    for r in fw.failures.iter_rows(named=True):
        if r["rank"] is None or r["signal"] not in _CONSEQUENCE_SIGNALS:
            continue
        if r["signal"] == "SIGABRT" and isinstance(first_timeout, datetime):
            died = r["ts"]
            if isinstance(died, datetime) and _before(died, first_timeout):
                continue  # aborted before any watchdog fired: a cause
        if r["signal"] == "SIGABRT" and fw.timeouts.is_empty():
            continue  # no watchdog fired: its own abort (an assertion, a CUDA error)
        out.add(int(r["rank"]))
    return out


def _before(a: datetime, b: datetime) -> bool:
    """``a`` strictly before ``b``, to the second.  glog headers print no year, so their
    times may carry a guessed one: where the years differ, compare within the year."""
    if a.year != b.year:
        a = a.replace(year=b.year)
    return (b - a).total_seconds() >= 1.0


@dataclass(frozen=True)
class PgTimeout:
    """The watchdog reports of one process group at one SeqNum."""

    pg: str | None  # as printed (``0``, ``1``); None when no line of the group said
    pg_desc: str | None
    seq: int
    rows: pl.DataFrame  # TIMEOUTS_SCHEMA rows
    #: global ranks (default group) or group ranks that reported, timeout or companion
    reporters: list[int]
    #: every member of the group, in the same numbering, where known
    members: list[int] | None
    #: the reporters' numbering is the job's global ranks
    global_ranks: bool
    #: (rank, op, numel_in, numel_out) per reporting rank that printed a timeout
    calls: list[tuple[int, str | None, int | None, int | None]] = field(default_factory=list)
    #: last enqueued work per reporting rank (companion lines)
    enqueued: dict[int, int] = field(default_factory=dict)
    #: the kept lines hold the whole block of reports (not cut inside it)
    intact: bool = True

    @property
    def label(self) -> str:
        """``0 (default_pg)``, ``1``, or ``(not printed)``."""
        if self.pg is None:
            return "(not printed)"
        return self.pg + (f" ({self.pg_desc})" if self.pg_desc else "")

    @property
    def silent(self) -> list[int] | None:
        """Members that did not report, where the members are known."""
        if self.members is None:
            return None
        return sorted(set(self.members) - set(self.reporters))

    @property
    def shapes(self) -> dict[tuple[str | None, int | None, int | None], list[int]]:
        """Ranks per (op, numel_in, numel_out) they timed out in."""
        out: dict[tuple[str | None, int | None, int | None], list[int]] = {}
        for rank, op, nin, nout in self.calls:
            out.setdefault((op, nin, nout), []).append(rank)
        return out


def _is_default(pg: str | None, desc: str | None) -> bool:
    return desc == "default_pg" or pg == "0"


@cache
def _world_from_numel(op: str, nin: int, nout: int) -> int | None:
    """Group size from an all-gather's or reduce-scatter's sizes (out = in x size)."""
    if nin <= 0 or nout <= 0:
        return None
    if "ALLGATHER" in op and nout % nin == 0:
        return nout // nin
    if "REDUCE_SCATTER" in op and nin % nout == 0:
        return nin // nout
    return None


def _call_order(call: tuple[int, str | None, int | None, int | None]) -> tuple[int, str, int, int]:
    """Sort key of a timed-out call: a field a damaged line left empty sorts first
    (None does not compare with a value)."""
    rank, op, nin, nout = call
    return rank, op or "", -1 if nin is None else nin, -1 if nout is None else nout


def pg_timeouts(ctx: Context) -> list[PgTimeout]:
    """One entry per (process group, SeqNum) that timed out, the earliest first.

    A row that names no group (its companion line was cut away, or an old release
    printed none) joins the one group that timed out at the same SeqNum, if only one did.
    """
    fw = ctx.analysis.frameworks
    t = fw.timeouts.filter(pl.col("seq").is_not_null())
    if t.is_empty():
        return []
    named = t.filter(pl.col("pg").is_not_null()).select("seq", "pg", "pg_desc").unique()
    by_seq: dict[int, list[tuple[str, str | None]]] = {}
    for seq, pg, desc in named.iter_rows():
        by_seq.setdefault(int(seq), []).append((str(pg), desc))
    descs: dict[str, str | None] = {}
    for pairs in by_seq.values():
        for pg, desc in pairs:
            descs[pg] = descs.get(pg) or desc
    pg_of = [
        r["pg"]
        if r["pg"] is not None
        else (
            by_seq[r["seq"]][0][0] if len({p for p, _ in by_seq.get(r["seq"], [])}) == 1 else None
        )
        for r in t.iter_rows(named=True)
    ]
    t = t.with_columns(pl.Series("pg_key", pg_of, dtype=pl.String))
    status = fw.torch_events.filter((pl.col("kind") == "work_status") & pl.col("seq").is_not_null())
    world = ctx.analysis.identity.world_size or fw.world_size
    out: list[PgTimeout] = []
    groups = t.group_by("pg_key", "seq", maintain_order=True)
    for (pg, seq), rows in sorted(groups, key=lambda g: _first_line(g[1])):
        pg_s = str(pg) if pg is not None else None
        desc = descs.get(pg_s) if pg_s is not None else None
        size = None
        for op, nin, nout in rows.select("op", "numel_in", "numel_out").iter_rows():
            if op and nin is not None and nout is not None:
                size = size or _world_from_numel(op, nin, nout)
        # A size its own reports contradict (no more ranks than the highest group rank
        # that reported, ``[Rank r]``: NumelOut written equal to NumelIn) is no size.
        highest = rows["rank"].max()
        if size is not None and (size < 2 or (isinstance(highest, int) and highest >= size)):
            size = None
        # A group no line names is taken for the default one unless its lines say
        # otherwise: a group size other than the world's, or a ``[Rank r]`` that is not
        # the ``[rankG]:`` of its line.
        renumbered = bool(
            rows.select(
                (pl.col("global_rank").is_not_null() & pl.col("rank").is_not_null())
                & (pl.col("global_rank") != pl.col("rank"))
            )[:, 0].any()
        )
        other_size = size is not None and world is not None and size != world
        default = _is_default(pg_s, desc) or (pg_s is None and not renumbered and not other_size)
        # In the default group the global rank is the group rank; elsewhere only the
        # ``[rankG]:`` prefix gives it, and the ``[Rank r]`` inside is the group rank.
        who = pl.coalesce("global_rank", "rank") if default else pl.col("rank")
        calls = [
            (int(r), op, nin, nout)
            for r, op, nin, nout in rows.select(who, "op", "numel_in", "numel_out").iter_rows()
            if r is not None
        ]
        reporters = {c[0] for c in calls}
        enqueued = {
            int(r): int(e)
            for r, e in rows.select(who, "last_enqueued").iter_rows()
            if r is not None and e is not None
        }
        # Companion lines without a timeout line of their own (the watchdog line was cut
        # or lost): the rank's watchdog fired on this work all the same.
        comp = status.filter(pl.col("seq") == seq)
        comp = comp.filter(pl.col("pg") == pg_s) if pg_s is not None else comp
        for r, g, msg in comp.select("rank", "global_rank", "message").iter_rows():
            rank = (g if g is not None else r) if default else r
            if rank is None:
                continue
            reporters.add(int(rank))
            enq = _enqueued(msg)
            if enq is not None:
                enqueued.setdefault(int(rank), enq)
        members: list[int] | None = None
        if default and (world or size):
            n = int(world or size or 0)
            members = list(range(n)) if listable_size(n) else None
        elif size:
            members = list(range(size)) if listable_size(size) else None
        out.append(
            PgTimeout(
                pg=pg_s,
                pg_desc=desc,
                seq=int(seq),
                rows=rows.drop("pg_key"),
                reporters=sorted(reporters),
                members=members,
                global_ranks=default,
                calls=sorted(calls, key=_call_order),
                enqueued=enqueued,
                intact=_intact(ctx, rows),
            )
        )
    return out


def _first_line(rows: pl.DataFrame) -> int:
    return min(int(n) for n in rows["line_no"].to_list())


def _enqueued(message: str | None) -> int | None:
    """``exception_detected last_enqueued=1582`` (the work_status event's message)."""
    if not message or "last_enqueued=" not in message:
        return None
    value = message.rsplit("last_enqueued=", 1)[1].split()[0]
    return int(value) if re.fullmatch(r"-?\d+", value) else None


def _intact(ctx: Context, rows: pl.DataFrame) -> bool:
    """Do the kept lines hold the whole block of watchdog reports?  In a combined log
    every waiting rank's report is printed within moments of the others: a log that
    starts or ends inside that block has lost some.  The block is whole when the file
    holds a record of another kind before its first report and after its last; a
    rank's companion lines (the work status, the abort, the watchdog's own exception)
    are its report, so a file that starts at one of them started inside the block."""
    files = rows["file_id"].unique().to_list()
    if len(files) != 1:
        return True  # one file per rank: each file holds its own rank's report or not
    fid = int(files[0])
    first = _first_line(rows)
    last = max(int(n) for n in rows["line_no"].to_list())
    before = after = False
    fw = ctx.analysis.frameworks
    mine = fw.torch_events.filter(pl.col("file_id") == fid)
    # Before the first report, a companion line is a report whose timeout line was cut
    # away; after the last, the last reporter's companions show the log goes on past it.
    tables = [mine.filter(~pl.col("kind").is_in(_REPORT_PARTS)), fw.failures, fw.timers]
    tables.append(ctx.analysis.errors)
    tables.append(fw.timeouts.filter(~pl.col("seq").is_in(rows["seq"].unique().implode())))
    for table in tables:
        part = table.filter(pl.col("file_id") == fid)["line_no"]
        before = before or bool((part < first).any())
        after = after or bool((part > last).any())
    parts = mine.filter(pl.col("kind").is_in(_REPORT_PARTS))["line_no"]
    after = after or bool((parts > last).any())
    if not before or not after:
        coll = ctx.collectives()
        if coll is not None:
            lines = (
                coll.filter(pl.col("file_id") == fid)
                .select(
                    (pl.col("line_no") < first).any().alias("before"),
                    (pl.col("line_no") > last).any().alias("after"),
                )
                .collect(engine="streaming")
                .row(0)
            )
            before = before or bool(lines[0])
            after = after or bool(lines[1])
    return before and after
