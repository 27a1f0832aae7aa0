"""Culprits: who a stopped job waited for, judged on the evidence, or why nobody is named.

``judge_stall`` weighs a stall (``detect/stalls.py``) against what else the logs say:
the members behind (``last_seen``), checked against the members of the process group
that reported no timeout (``non_reporting_member``), a first death that is a cause and
not the watchdog's abort or the launcher's SIGTERM (``died_first``), PyTorch's desync
report, or a different op/count/datatype at the same sequence (``mismatch``).
``judge_group`` does the same from PyTorch's lines alone.  Evidence that conflicts or is
missing names nobody (``withheld``): a wrong culprit is worse than none.  ``culprit``
is what the timeout detector and the agent read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import polars as pl

from ncclscope.detect.base import HangClass, LineRef, ranks_text
from ncclscope.detect.context import Context
from ncclscope.detect.stalls import (
    WHO,
    Stall,
    hosts_of,
    mismatches,
    quote_lines,
    stalls,
    unranked_mismatches,
)
from ncclscope.detect.watchdog import (
    PgTimeout,
    consequence_deaths,
    log_continues,
    report_extent,
)

__all__ = [
    "Culprit",
    "Verdict",
    "culprit",
    "ended_at_stall",
    "judge_group",
    "judge_stall",
    "limited_by",
    "reported_ranks",
    "to_global",
    "watchdog_summary",
]

#: The members waiting for a stuck rank stop at the same point: the last collective they
#: enqueue before the program syncs with the GPU (PyTorch enqueues ahead, then blocks).
#: Their last sequences a few apart is timing; more is logs cut or lost at different
#: points (files rotated or copied one by one), which says nothing about who stopped.
_MAX_WAITER_SPREAD = 2
#: Non-reporting ranks whose inputs ``limited_by`` lists one by one.
_LIMITS_SHOWN = 8


@dataclass
class Verdict:
    """Who a stopped job waited for, on what evidence (``basis``: ``evidence.
    culprit_basis``), or why nobody is named (``withheld``)."""

    culprits: list[int]
    basis: list[str]
    hang_class: HangClass
    why: str
    withheld: str | None = None
    #: a diagnosis without a culprit that is still an answer (a hang inside a collective)
    decided: bool = False
    evidence: dict[str, Any] = field(default_factory=dict)
    lines: list[LineRef] = field(default_factory=list)
    #: False where the culprit rests on weaker evidence than the policy's best (its own
    #: log ends at the stall, before the others' reports): the severity is lowered
    confident: bool = True

    def basis_json(self) -> dict[str, Any]:
        """``culprit_basis``: the strongest evidence (``non_reporting_member``,
        ``died_first``, ``desync``, ``mismatch``, ``last_seen``, or ``withheld``), and
        ``culprit_bases``: every piece that agreed."""
        return {"culprit_basis": self.basis[0], "culprit_bases": list(self.basis)}


def _withhold(
    reason: str, basis_evidence: dict[str, Any], hang_class: HangClass = "unknown"
) -> Verdict:
    return Verdict(
        [], ["withheld"], hang_class, f"no culprit named: {reason}", reason, evidence=basis_evidence
    )


def reported_ranks(ctx: Context) -> set[int]:
    """Global ranks whose own watchdog fired (a timeout or a companion line, any group):
    they were waiting, whatever else they did."""
    fw = ctx.analysis.frameworks
    default = (
        pl.col("pg").is_null() | (pl.col("pg") == "0") | (pl.col("pg_desc") == "default_pg")
        if "pg_desc" in fw.timeouts.columns
        else pl.lit(value=True)
    )
    out: set[int] = set()
    for table in (
        fw.timeouts,
        fw.torch_events.filter(pl.col("kind") == "work_status").with_columns(
            pl.lit(None, dtype=pl.String).alias("pg_desc")
        ),
    ):
        who = (
            pl.when(pl.col("global_rank").is_not_null())
            .then("global_rank")
            .when(default)
            .then("rank")
            .alias("who")
        )
        out |= {int(r) for r in table.select(who)["who"].drop_nulls().to_list()}
    return out


def _first_cause(ctx: Context, reported: set[int]) -> dict[str, Any] | None:
    """The first process death that is not a consequence of the hang: not the
    watchdog's abort after a timeout, not the launcher's SIGTERM, not a rank that
    reported a timeout itself.  Each host's agent names its own root cause: the job's is
    the earliest."""
    failures = ctx.analysis.frameworks.failures.filter(pl.col("rank").is_not_null())
    if failures.is_empty():
        return None
    after = consequence_deaths(ctx) | reported
    causes = failures.filter(~pl.col("rank").is_in(sorted(after)))
    if causes.is_empty():
        return None
    root = causes.filter(pl.col("root_cause").fill_null(value=False))
    pick = (root if len(root) else causes).sort("ts", "file_id", "line_no", nulls_last=True)
    return pick.row(0, named=True)


def _desync_named(ctx: Context) -> tuple[list[int], pl.DataFrame]:
    desync = ctx.analysis.frameworks.torch_events.filter(
        (pl.col("kind") == "desync_lagging") & pl.col("ranks").list.len().gt(0)
    )
    return sorted({int(r) for rs in desync["ranks"].to_list() for r in rs}), desync


def judge_stall(ctx: Context, stall: Stall) -> Verdict:
    """Who a stopped job's communicator waited for: the members behind (``last_seen``),
    checked against what else the logs say.  A member behind that reported a timeout
    itself was waiting elsewhere; a first death or a desync report that names someone
    else contradicts the picture: then nobody is named."""
    a = ctx.analysis
    evidence: dict[str, Any] = {}
    unmapped = _comm_ranks_only(ctx, stall)
    if unmapped:
        # A rank of a sub-communicator whose init lines were cut: its number there is
        # not its rank in the job, which no kept line gives.
        evidence["culprit_comm_ranks"] = unmapped
        return _withhold(
            f"communicator rank {ranks_text(unmapped)} of {stall.comm_key} is the one behind, "
            "but its rank in the job is not in the logs (the init lines that map it were "
            "cut)",
            evidence,
        )
    if stall.ahead:
        return Verdict(list(stall.culprits), ["mismatch"], "mismatch", "called one more")
    spread = stall.others_last
    if spread is not None and spread[1] - spread[0] > _MAX_WAITER_SPREAD:
        return _withhold(
            f"the other members' logs end at scattered collectives (#{spread[0]} to "
            f"#{spread[1]}): stuck ranks stop together, so these logs were cut or lost at "
            "different points",
            evidence,
        )
    reported = reported_ranks(ctx)
    cands = [c for c in stall.culprits if c not in reported]
    lines: list[LineRef] = []
    basis = ["last_seen"]
    confident = True
    if reported:
        evidence["reported_timeout"] = sorted(reported)
        if not cands:
            return _withhold(
                f"rank {ranks_text(stall.culprits)}, behind on this communicator, reported a "
                "watchdog timeout itself: it was waiting too, on something the logs do not show",
                evidence,
            )
        # Its silence counts only where its log could have shown a report: a member
        # whose file ends before the others' reports is behind because its log ends,
        # unless its lines went on until the others stopped (a rank's own file, which a
        # stuck rank stops writing at the stall) or its death explains the end.
        at, files = report_extent(ctx)
        unseen = [c for c in cands if not log_continues(ctx, c, at, files)]
        cause = _first_cause(ctx, reported)
        died = {int(cause["rank"])} if cause is not None else set()
        early = [c for c in unseen if c not in died and not ended_at_stall(ctx, c)]
        weak = [c for c in unseen if c not in died]
        if not early and weak and (len(weak) > 1 or ctx.ranks_without_logs):
            # Several ranks whose logs end at the stall: a stuck rank's own file, or one
            # cut there, look alike; with ranks missing, the stuck one may be among them.
            evidence["log_ends_at_stall"] = weak
            limits = limited_by(ctx, weak, at, files)
            evidence["limited_by"] = limits
            return _withhold(
                f"rank {ranks_text(weak)} did not report, but no log of theirs goes on past "
                "the stall: a stuck rank's file and one cut there look alike"
                + (
                    f", and rank {ranks_text(sorted(ctx.ranks_without_logs))} left no line"
                    if ctx.ranks_without_logs
                    else ""
                )
                + _limits_text(limits),
                evidence,
            )
        if early:
            evidence["log_ends_early"] = early
            limits = limited_by(ctx, early, at, files)
            evidence["limited_by"] = limits
            return _withhold(
                f"rank {ranks_text(early)}, behind on this communicator, has no line as late "
                "as the others' watchdog reports, and its collectives stop well before "
                "theirs: its log ends early (cut, or absent), so its report and its later "
                "collectives may only have been lost" + _limits_text(limits),
                evidence,
            )
        if unseen and not set(unseen) <= died:
            # Its own lines stop at the stall, and then nothing: consistent with a rank
            # stuck there, but its log could not have shown a report either.
            evidence["log_ends_at_stall"] = unseen
            confident = False
        else:
            basis.insert(0, "non_reporting_member")
    hang_class: HangClass = "missing_rank"
    why = "never joined"
    cause = _first_cause(ctx, reported)
    if cause is not None:
        evidence["failure"] = {
            "rank": cause["rank"],
            "exitcode": cause["exitcode"],
            "signal": cause["signal"],
            "first_observed": cause["root_cause"],
        }
        lines.append(LineRef(int(cause["file_id"]), int(cause["line_no"])))
        if int(cause["rank"]) not in cands:
            return _withhold(
                f"rank {cause['rank']} died first ({cause['signal'] or cause['exitcode']}) but "
                f"rank {ranks_text(cands)} is the one behind",
                evidence,
            )
        cands, basis = [int(cause["rank"])], ["died_first", *basis]
        hang_class, why = "dead_process", "died before"
        confident = True  # its death is why its log ends
    named, desync = _desync_named(ctx)
    if named:
        evidence["desync_named"] = named
        lines += quote_lines(desync, 1)
        both = sorted(set(named) & set(cands))
        if not both:
            return _withhold(
                f"the desync report names rank {ranks_text(named)} but rank "
                f"{ranks_text(cands)} is the one behind",
                evidence,
            )
        cands, basis = both, ["desync", *basis]
    if basis == ["last_seen"] and len(cands) > len(stall.waiting):
        return _withhold(
            f"rank {ranks_text(cands)} logged nothing as far as the {len(stall.waiting)} "
            "others: more ranks behind than ahead, whose logs are likelier lost than all stuck",
            evidence,
        )
    errors = a.errors.filter(pl.col("severity") == "error")
    if hang_class == "missing_rank" and len(errors):
        e = errors.row(0, named=True)
        evidence["nccl_error"] = {"kind": e["kind"], "message": e["message"]}
        lines.append(LineRef(int(e["file_id"]), int(e["line_no"])))
        hang_class, why = "nccl_error", "stopped, after an NCCL error, before"
    if a.frameworks.timeouts.height:
        evidence["watchdog"] = watchdog_summary(a.frameworks.timeouts)
        first = a.frameworks.timeouts.sort("file_id", "line_no").row(0, named=True)
        lines.append(LineRef(int(first["file_id"]), int(first["line_no"])))
    return Verdict(
        sorted(cands), basis, hang_class, why, evidence=evidence, lines=lines, confident=confident
    )


def _comm_ranks_only(ctx: Context, stall: Stall) -> list[int]:
    """The culprits of ``stall`` known only by their rank in a communicator smaller than
    the world (their global rank unknown: the init lines were cut): that number names
    nobody in the job.  In a world-sized communicator the two numbers are one."""
    rows = stall.culprit_rows
    if "rank" not in rows.columns or "comm_rank" not in rows.columns:
        return []
    unknown = rows.filter(pl.col("rank").is_null() & pl.col("comm_rank").is_not_null())
    if unknown.is_empty():
        return []
    members = ctx.analysis.identity.members
    size = members.filter(pl.col("comm_key") == stall.comm_key)["nranks"].max()
    world = ctx.analysis.world_size or ctx.analysis.identity.world_size
    if isinstance(size, int) and world is not None and size >= world:
        return []
    return sorted(int(r) for r in unknown["comm_rank"].to_list())


def ended_at_stall(ctx: Context, rank: int) -> bool:
    """Did ``rank``'s collectives go on until the others stopped?  On every communicator
    it belongs to, its last collective is at most one (the stuck one) plus what waiting
    ranks enqueue ahead (``_MAX_WAITER_SPREAD``) behind the others' last.  A log cut
    short ends many collectives behind on some communicator (the world's, at least)."""
    p = ctx.progress.with_columns(WHO.alias("who"))
    mine = p.filter(pl.col("who") == rank)
    if mine.is_empty():
        return False
    tops = p.filter(pl.col("who") != rank).group_by("comm_key").agg(pl.col("last_seq").max())
    joined = mine.join(tops, on="comm_key", how="inner", suffix="_others")
    if joined.is_empty():
        return False
    behind = (joined["last_seq_others"] - joined["last_seq"]).max()
    return isinstance(behind, int) and behind <= 1 + _MAX_WAITER_SPREAD


def judge_group(ctx: Context, g: PgTimeout, reported: set[int]) -> Verdict:
    """Who one process group's timeout waited for, from PyTorch's lines alone: the
    desync report, a first death that is a cause, or the one member that did not report
    (its group's members known, the block of reports whole); else nobody."""
    evidence: dict[str, Any] = {"waiting_ranks": g.reporters}
    lines: list[LineRef] = []
    silent = g.silent
    if silent is not None and g.global_ranks:
        # A member that timed out in another group was waiting there, not stuck.
        silent = [r for r in silent if r not in reported]
    if silent is not None:
        evidence["non_reporting"] = silent
    named, desync = _desync_named(ctx)
    if named:
        evidence["desync_named"] = named
        lines += quote_lines(desync, 1)
        return Verdict(
            named,
            ["desync"],
            "missing_rank",
            f"the desync report names rank {ranks_text(named)} as the one that never joined",
            evidence=evidence,
            lines=lines,
        )
    cause = _first_cause(ctx, reported)
    if cause is not None:
        d = int(cause["rank"])
        evidence["failure"] = {
            "rank": d,
            "exitcode": cause["exitcode"],
            "signal": cause["signal"],
            "first_observed": cause["root_cause"],
        }
        lines.append(LineRef(int(cause["file_id"]), int(cause["line_no"])))
        if silent is not None and g.intact and g.global_ranks and d not in silent:
            return _withhold(
                f"rank {d} died first but rank {ranks_text(silent)} did not report", evidence
            )
        return Verdict(
            [d],
            ["died_first"],
            "dead_process",
            f"rank {d} died first ({cause['signal'] or cause['exitcode']})",
            evidence=evidence,
            lines=lines,
        )
    if silent is None:
        # No kept line gives the group's size: the reports' files lost their NCCL and
        # init lines (cut at the head), or never had them.
        _at, files = report_extent(ctx, g.rows)
        limits = [
            {"path": ctx.analysis.paths[f], "why": "no kept line gives the group's size"}
            for f in sorted(files)
            if 0 <= f < len(ctx.analysis.paths)
        ]
        evidence["limited_by"] = limits
        return _nccl_error_or(
            ctx, evidence, "the group's members are not in the logs" + _limits_text(limits)
        )
    if not silent:
        entered = [r for r in g.reporters if g.enqueued.get(r, -1) >= g.seq]
        if g.members is not None and set(entered) >= set(g.members):
            evidence["inside_collective"] = True
            v = _withhold("every member had enqueued it", evidence)
            v.why = (
                f"every member of the group had enqueued SeqNum {g.seq} (last enqueued >= "
                f"{g.seq}) and none completed it: the hang is inside the collective (the "
                "network or NCCL), not a missing rank"
            )
            v.decided = True
            return v
        return _nccl_error_or(ctx, evidence, "every member reported a timeout")
    if not g.intact:
        at, files = report_extent(ctx, g.rows)
        limits = limited_by(ctx, [], at, files, int(g.rows["file_id"][0]))
        evidence["limited_by"] = limits
        return _nccl_error_or(
            ctx,
            evidence,
            "the kept lines begin or end inside the watchdog reports, so the ranks without "
            "one may only have lost it" + _limits_text(limits),
        )
    if len(silent) > 1:
        at, files = report_extent(ctx, g.rows)
        shown = silent[:_LIMITS_SHOWN]
        limits = limited_by(ctx, to_global(g, shown) if not g.global_ranks else shown, at, files)
        reason = f"rank {ranks_text(silent)} did not report; the logs do not say which stopped"
        if limits:
            evidence["limited_by"] = limits
        return _nccl_error_or(ctx, evidence, reason + _limits_text(limits))
    culprits = silent if g.global_ranks else to_global(g, silent)
    if not culprits:
        evidence["culprit_pg_ranks"] = silent
        return _withhold(
            f"group rank {silent[0]} of process group {g.label} did not report; its global "
            "rank is not in the logs",
            evidence,
        )
    # Not reporting says something only where the member's log could have shown it.
    at, files = report_extent(ctx, g.rows)
    size = len(g.members) if g.members is not None else None
    unseen = [c for c in culprits if not log_continues(ctx, c, at, files, size)]
    if len(unseen) == 1 and not ctx.ranks_without_logs - set(unseen):
        stream = _own_stream(ctx, unseen[0], files, at)
        if stream is not None and _calls_at_stall(ctx, stream, size):
            # Its own file (by its lines, or the one file no reporter wrote in) stops
            # with its collectives at the stall: a stuck rank's picture, but its log
            # could not have shown a report: named, with less confidence.
            evidence["log_ends_at_stall"] = unseen
            return Verdict(
                culprits,
                ["last_seen"],
                "missing_rank",
                f"rank {ranks_text(culprits)}, the one member of the group that reported no "
                "timeout, stopped logging at the stall and never joined",
                evidence=evidence,
                lines=lines,
                confident=False,
            )
    if unseen:
        evidence["log_ends_early"] = unseen
        limits = limited_by(ctx, unseen, at, files)
        evidence["limited_by"] = limits
        return _nccl_error_or(
            ctx,
            evidence,
            f"rank {ranks_text(unseen)} did not report, but its log ends before the reports "
            "(or is absent): its report may only have been lost" + _limits_text(limits),
        )
    return Verdict(
        culprits,
        ["non_reporting_member"],
        "missing_rank",
        f"rank {ranks_text(culprits)}, the one member of the group that reported no timeout, "
        "never joined",
        evidence=evidence,
        lines=lines,
    )


def _own_stream(
    ctx: Context, rank: int, reporter_files: set[int], at: datetime | None
) -> tuple[int, str, int] | None:
    """The one NCCL process whose lines are ``rank``'s, as (file_id, host, pid): its
    file's only process, where its lines name it; else, by elimination, the only
    process of the only file that holds NCCL lines and no report and ends before them
    (or carries no time)."""
    stats = ctx.analysis.stats
    if stats.is_empty():
        return None
    procs = stats.select("file_id", "host", "pid").unique()
    own = ctx.files_of(rank)
    if not own:
        ends = ctx.file_ends
        own = {
            int(f)
            for f in procs["file_id"].unique().to_list()
            if int(f) not in reporter_files
            # a file without a time (NCCL < 2.26 stamps nothing) may end anywhere:
            # its collectives (``_calls_at_stall``) say whether it reached the stall
            and (at is None or int(f) not in ends or ends[int(f)] < at)
        }
    if len(own) != 1:
        return None
    mine = procs.filter(pl.col("file_id") == next(iter(own)))
    if len(mine) != 1:
        return None
    f, host, pid = mine.row(0)
    return int(f), str(host), int(pid)


def _calls_at_stall(ctx: Context, proc: tuple[int, str, int], size: int | None) -> bool:
    """Did the process's collectives on the group's communicator (its size) go on as far
    as the others' typically did, less the stuck one and what waiting ranks enqueue
    ahead?  Where opCount counts (it changes from call to call), its last opCount says
    how far each went whatever a cut at the head took away; where it does not (2.27+
    single node), the number of calls logged does, and a log cut short logged fewer."""
    stats = ctx.analysis.stats
    if size is None or "nranks" not in stats.columns:
        return False
    comm = stats.filter((pl.col("nranks") == size) & (pl.col("coll_calls") > 0))
    is_mine = (
        (pl.col("file_id") == proc[0]) & (pl.col("host") == proc[1]) & (pl.col("pid") == proc[2])
    )
    several = comm.filter(pl.col("calls") > 1)
    counts = len(several) > 1 and bool(
        several.select((pl.col("opcount_min") != pl.col("opcount_max")).all())[0, 0]
    )
    column = "coll_opcount_max" if counts else "coll_calls"
    mine = comm.filter(is_mine)[column].max()
    # The others' typical count: a cut at one time splits hosts whose clocks differ at
    # different collectives, so the highest is one off.
    others = comm.filter(~is_mine)[column].median()
    if not isinstance(mine, int) or not isinstance(others, int | float):
        return False
    return others - mine <= 1 + _MAX_WAITER_SPREAD


def limited_by(
    ctx: Context,
    ranks: list[int],
    at: datetime | None,
    reporter_files: set[int],
    cut_inside: int | None = None,
) -> list[dict[str, Any]]:
    """The inputs that kept a culprit from being named, each with why: a file holding
    the lines of a rank that did not report and that ends before the reports (or holds
    no time after them), a rank with no file at all, or the file whose kept lines begin
    or end inside the block of reports (``cut_inside``)."""
    paths = ctx.analysis.paths
    ends = ctx.file_ends

    def path(f: int) -> str:
        return paths[f] if 0 <= f < len(paths) else f"#{f}"

    out: list[dict[str, Any]] = []
    if cut_inside is not None:
        out.append(
            {"path": path(cut_inside), "why": "its kept lines begin or end inside the reports"}
        )
    # Named one by one up to a few: a damaged size can leave a million silent members.
    for rank in ranks[:_LIMITS_SHOWN]:
        files = sorted(f for f in ctx.files_of(rank) if f not in reporter_files)
        if not files and not ctx.files_of(rank):
            out.append(
                {
                    "rank": rank,
                    "path": None,
                    "why": "no input is known to hold its lines (its init lines were cut, "
                    "or its files are absent)",
                }
            )
        for f in files:
            end = ends.get(f)
            why = (
                f"ends at {end:%H:%M:%S}, before the reports"
                if end is not None and at is not None and end < at
                else "holds no time as late as the reports"
            )
            out.append({"rank": rank, "path": path(f), "why": why})
    if len(ranks) > _LIMITS_SHOWN:
        more = len(ranks) - _LIMITS_SHOWN
        out.append({"path": None, "why": f"and {more} more rank(s) without a report"})
    return out


def _limits_text(limits: list[dict[str, Any]]) -> str:
    """``; limited by job.log (its kept lines begin ...), rank 3's node-1.log (...)``."""
    if not limits:
        return ""
    parts = []
    for item in limits[:4]:
        who = f"rank {item['rank']}: " if "rank" in item else ""
        if item["path"] is None:
            parts.append(f"{who}{item['why']}")
            continue
        name = str(item["path"]).rsplit("/", 1)[-1]
        parts.append(f"{who}{name} ({item['why']})")
    more = f" and {len(limits) - 4} more" if len(limits) > 4 else ""
    return "; limited by " + ", ".join(parts) + more


def _nccl_error_or(ctx: Context, evidence: dict[str, Any], reason: str) -> Verdict:
    """No culprit from the watchdog's lines: an NCCL error, if one came, is the story."""
    errors = ctx.analysis.errors.filter(pl.col("severity") == "error")
    if len(errors):
        e = errors.sort("file_id", "line_no").row(0, named=True)
        evidence["nccl_error"] = {"kind": e["kind"], "message": e["message"]}
        v = _withhold(reason, evidence, "nccl_error")
        v.why = f"an NCCL error on {e['host']} came first: {e['message']}"
        v.lines.append(LineRef(int(e["file_id"]), int(e["line_no"])))
        v.decided = True
        return v
    return _withhold(reason, evidence)


@dataclass(frozen=True)
class Culprit:
    """Who a hang waited for on the NCCL side, as the hang detector sees it."""

    ranks: list[int]
    hosts: list[str]
    op: str | None
    seq: int | None
    #: the first arrival at the collective the culprit never joined, where timed
    since: datetime | None
    basis: list[str] = field(default_factory=list)
    withheld: str | None = None


def culprit(ctx: Context) -> Culprit | None:
    """The culprit of the job's hang on the largest communicator that stopped (judged
    on the evidence), else at a mismatch where the job hung; None when the NCCL lines
    show neither."""
    for stall in stalls(ctx):
        times = stall.waiter_rows["ts"].drop_nulls() if len(stall.waiter_rows) else None
        found = times.min() if times is not None and len(times) else None
        v = judge_stall(ctx, stall)
        return Culprit(
            v.culprits,
            hosts_of(stall.culprit_rows.filter(pl.col("who").is_in(v.culprits))),
            stall.op,
            stall.seq,
            found if isinstance(found, datetime) else None,
            v.basis,
            v.withheld,
        )
    for m in mismatches(ctx):
        last = ctx.progress.filter(pl.col("comm_key") == m.comm_key)["last_seq"]
        if len(last) and last.max() == m.seq:  # the job hung at the mismatch
            rows = m.rows.filter(pl.col("who").is_in(m.culprits))
            return Culprit(m.culprits, hosts_of(rows), m.majority[0], m.seq, None, ["mismatch"])
    for u in unranked_mismatches(ctx):
        if not u.hung:
            continue
        minority = [rows for _s, rows in u.sides[1:]]
        ranks = sorted({int(r) for rows in minority for r in rows["rank"].drop_nulls()})
        known = u.clear and len(ranks) == sum(len(rows) for rows in minority)
        return Culprit(
            ranks if known else [],
            sorted({h for rows in minority for h in hosts_of(rows)}) if u.clear else [],
            u.sides[0][0][0],
            u.seq,
            None,
            ["mismatch"],
            None
            if known
            else "a collective mismatch on a communicator whose init lines were cut: "
            "the calling process's job rank is not in the logs",
        )
    return None


def watchdog_summary(timeouts: pl.DataFrame) -> dict[str, Any]:
    """What the first watchdog timeout line says, and every rank that printed one."""
    first = timeouts.sort("file_id", "line_no").row(0, named=True)
    reporting = timeouts.select(pl.coalesce("global_rank", "rank"))[:, 0].drop_nulls()
    return {
        "op": first["op"],
        "seq_num": first["seq"],
        "pg": first["pg"],
        "timeout_s": first["timeout_s"],
        "waiting_ranks": sorted({int(r) for r in reporting}),
    }


def to_global(g: PgTimeout, group_ranks: list[int]) -> list[int]:
    """Group ranks of a non-default group to global ranks, where the lines pair them."""
    pairs = {
        int(r): int(gr)
        for r, gr in g.rows.select("rank", "global_rank").iter_rows()
        if r is not None and gr is not None
    }
    if not all(r in pairs for r in group_ranks):
        return []
    return sorted(pairs[r] for r in group_ranks)
