"""Hangs and mismatches: which rank the others wait for, and why.

Metric: per communicator member, the last collective it logged (``Context.progress``)
and the instances whose members logged different ops, counts or datatypes
(``Context.instances``).  Policy: at the end of the logs, the members behind the
others, or on a different op/count/datatype at the same sequence, are the culprit;
PyTorch watchdog lines name the ranks that waited, never the culprit.  The hang is
classified from what else the logs hold: a mismatch, a process that died first, an NCCL
error, or a rank that simply never arrived.

Sample of what the culprit looks like in a combined log (rank 5's last line is seq 14;
every other rank logged seq 15 and waited)::

    [default5]:node-3:4105:4105 [5] NCCL INFO AllGather: opCount e sendbuff ... [nranks=8]
    [default0]:node-3:4100:4100 [0] NCCL INFO AllGather: opCount f sendbuff ... [nranks=8]
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import polars as pl

from ncclscope.detect.base import Finding, HangClass, LineRef, ranks_text, register
from ncclscope.detect.context import Context
from ncclscope.units import DTYPE_NAMES

__all__ = ["Culprit", "HangDetector", "Stall", "culprit", "stalls"]

#: At most this many mismatched instances are reported one by one.
_MAX_MISMATCHES = 5
#: Evidence lines quoted per side (culprits, waiters).
_QUOTE = 3


@dataclass(frozen=True)
class Stall:
    """A communicator whose members did not all reach the same collective.

    ``seq`` is the first collective some member never logged, and ``culprits`` the
    members that never logged it (global ranks where known); or, when the culprit ran
    ahead (``ahead``), the collective at which it made a call nobody else made.
    ``waiting`` are the other members.
    """

    comm_key: str
    nranks: int
    seq: int
    op: str | None
    culprits: list[int]
    waiting: list[int]
    culprit_rows: pl.DataFrame  # progress rows of the culprits
    waiter_rows: pl.DataFrame  # the waiters' calls at ``seq``
    #: the culprit ran one collective ahead of everyone: an extra call at ``seq``
    ahead: bool = False
    extra_rows: pl.DataFrame | None = None  # its calls at ``seq``

    @property
    def extra_op(self) -> str | None:
        """What the culprit called at ``seq`` when it ran ahead."""
        rows = self.extra_rows
        return str(rows["op"][0]) if rows is not None and len(rows) else None


#: Who a row is about: its global rank where known, else its communicator rank.
_WHO = pl.coalesce("rank", "comm_rank")


def stalls(ctx: Context) -> list[Stall]:
    """Every communicator whose members stopped at different collectives, the world
    communicator (the largest) first; a culprit set seen on a larger communicator is not
    repeated for a smaller one."""
    progress = ctx.progress
    if progress.is_empty():
        return []
    members = ctx.members
    # Members known from init lines that never logged a call on a communicator that
    # others used: they are behind everyone (last_seq -1).
    silent = members.join(
        progress.select("comm_key", "comm_rank"), on=["comm_key", "comm_rank"], how="anti"
    ).join(progress.select("comm_key").unique(), on="comm_key", how="semi")
    table = pl.concat(
        [
            progress,
            silent.select(
                "comm_key",
                pl.col("comm_rank").cast(pl.Int32),
                pl.col("rank").cast(pl.Int32),
                "host",
                pl.lit(0, dtype=pl.UInt32).alias("calls"),
                pl.lit(-1, dtype=pl.Int64).alias("last_seq"),
            ),
        ],
        how="diagonal",
    )
    sizes = (
        table.group_by("comm_key")
        .agg(pl.len().alias("size"))
        .sort(["size", "comm_key"], descending=[True, False])
    )
    out: list[Stall] = []
    seen: set[tuple[int, ...]] = set()
    for comm_key, size in sizes.iter_rows():
        if size < 2:
            continue
        group = table.filter(pl.col("comm_key") == comm_key).with_columns(_WHO.alias("who"))
        low, high = group["last_seq"].min(), group["last_seq"].max()
        if not isinstance(low, int) or not isinstance(high, int) or low == high:
            continue
        # The culprit is the smaller of the two extremes: the rank(s) that stopped first
        # (others went on: PyTorch enqueues ahead), or the rank(s) that called one more
        # collective than everyone else (an extra call).
        at_low = group.filter(pl.col("last_seq") == low)
        at_high = group.filter(pl.col("last_seq") == high)
        ahead = len(at_high) < len(at_low)
        behind = at_high if ahead else at_low
        culprits = sorted(int(x) for x in behind["who"].to_list())
        if tuple(culprits) in seen:
            continue
        seen.add(tuple(culprits))
        # Where the sequences part: the collective the culprit never joined, or the one
        # at which it made its extra call.
        stuck = low if ahead else low + 1
        # The culprits' last calls (their op) and the others' calls at the stuck one.
        seqs = sorted({int(x) for x in behind["last_seq"].to_list() if x >= 0} | {stuck})
        at_seqs = ctx.rows_at(comm_key, seqs)
        if len(at_seqs):
            last_ops = at_seqs.join(
                behind.select("comm_rank", pl.col("last_seq").alias("seq")),
                on=["comm_rank", "seq"],
                how="semi",
            ).select("comm_rank", "op")
            behind = behind.join(last_ops, on="comm_rank", how="left")
        else:
            behind = behind.with_columns(pl.lit(None, dtype=pl.String).alias("op"))
        at = at_seqs.filter(pl.col("seq") == stuck) if len(at_seqs) else at_seqs
        at = at.with_columns(_WHO.alias("who")) if len(at) else at
        waiters = at.filter(~pl.col("who").is_in(culprits)) if len(at) else at
        ops = Counter(waiters["op"].to_list()) if len(waiters) else Counter()
        waiting = sorted(int(x) for x in group["who"].to_list() if int(x) not in culprits)
        extra = at.filter(pl.col("who").is_in(culprits)) if ahead and len(at) else None
        out.append(
            Stall(
                comm_key=comm_key,
                nranks=int(size),
                seq=stuck,
                op=ops.most_common(1)[0][0] if ops else None,
                culprits=culprits,
                waiting=waiting,
                culprit_rows=behind,
                waiter_rows=waiters,
                ahead=ahead,
                extra_rows=extra,
            )
        )
    return out


@dataclass(frozen=True)
class Mismatched:
    """An instance whose members logged different (op, count, datatype)."""

    comm_key: str
    seq: int
    culprits: list[int]
    majority: tuple[str, int, int]
    rows: pl.DataFrame


def mismatches(ctx: Context) -> list[Mismatched]:
    """Instances whose members disagree, with the minority members as culprits.

    Members that reached the same point with the same calls have the same signature;
    only a communicator whose signatures disagree is read again to find where.
    """
    p = ctx.progress
    if p.is_empty():
        return []
    suspects = (
        p.group_by("comm_key", "calls", "last_seq")
        .agg(pl.col("signature").n_unique().alias("signatures"), pl.len().alias("members"))
        .filter(pl.col("signatures") > 1)
        .sort("members", "comm_key", descending=[True, False])
    )
    out: list[Mismatched] = []
    for comm_key in dict.fromkeys(suspects["comm_key"].to_list()):
        for seq in ctx.mixed_seqs(comm_key, _MAX_MISMATCHES - len(out)):
            rows = ctx.rows_at(comm_key, [seq])
            rows = rows.with_columns(_WHO.alias("who"))
            shapes = Counter(zip(rows["op"], rows["count"], rows["dtype"], strict=True))
            (majority, _n), *_rest = shapes.most_common()
            minority = rows.filter(
                (pl.col("op") != majority[0])
                | (pl.col("count") != majority[1])
                | (pl.col("dtype") != majority[2])
            )
            out.append(
                Mismatched(
                    comm_key,
                    int(seq),
                    sorted(int(x) for x in minority["who"].to_list()),
                    (str(majority[0]), int(majority[1]), int(majority[2])),
                    rows,
                )
            )
        if len(out) >= _MAX_MISMATCHES:
            break
    return out


def _dtype(code: int | None) -> str:
    return f"{DTYPE_NAMES.get(code, 'datatype')} ({code})" if code is not None else "datatype ?"


def _lines(rows: pl.DataFrame, limit: int = _QUOTE) -> list[LineRef]:
    if rows.is_empty() or "line_no" not in rows.columns:
        return []
    picked = rows.filter(pl.col("line_no").is_not_null()).head(limit)
    return [LineRef(int(f), int(n)) for f, n in picked.select("file_id", "line_no").iter_rows()]


def _hosts(rows: pl.DataFrame) -> list[str]:
    if rows.is_empty() or "host" not in rows.columns:
        return []
    return sorted({h for h in rows["host"].to_list() if h is not None})


@register
class HangDetector:
    """Culprits of hangs (``hang``) and of mismatched collectives (``mismatch``)."""

    name = "hang"

    def metric(self, ctx: Context) -> pl.DataFrame:
        """Per communicator member: calls, last sequence, and that call's op and line."""
        return ctx.progress

    def policy(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        del metric  # read through ``stalls`` and ``mismatches``
        analysis = ctx.analysis
        fw = analysis.frameworks
        findings: list[Finding] = []
        hung_at: set[tuple[str, int]] = set()
        stall_list = stalls(ctx)
        for m in mismatches(ctx):
            findings.append(self._mismatch(m, ctx, stall_list))
            hung_at.add((m.comm_key, m.seq))
        failures = fw.failures
        errors = analysis.errors.filter(pl.col("severity") == "error")
        for stall in stall_list:
            if {(stall.comm_key, stall.seq), (stall.comm_key, stall.seq - 1)} & hung_at:
                continue  # the mismatch there, or one collective earlier, is the story
            findings.append(self._stall(stall, ctx, failures, errors))
        if not stall_list and not findings and len(fw.timeouts):
            findings.append(self._from_torch(ctx, failures, errors))
        return findings

    def _mismatch(self, m: Mismatched, ctx: Context, stall_list: list[Stall]) -> Finding:
        culprit_rows = m.rows.filter(pl.col("who").is_in(m.culprits))
        differs = sorted(
            name
            for name, col, want in (
                ("op", "op", m.majority[0]),
                ("count", "count", m.majority[1]),
                ("dtype", "dtype", m.majority[2]),
            )
            if (culprit_rows[col] != want).any()
        )
        last = ctx.progress.filter(pl.col("comm_key") == m.comm_key)["last_seq"]
        hung = len(last) > 0 and last.max() == m.seq and not stall_list
        theirs = culprit_rows.row(0, named=True)
        msg = (
            f"rank {ranks_text(m.culprits)} called {theirs['op']} (count {theirs['count']:,}, "
            f"{_dtype(theirs['dtype'])}) where the others called {m.majority[0]} (count "
            f"{m.majority[1]:,}, {_dtype(m.majority[2])}) at collective #{m.seq}"
            + ("; the job hung there" if hung else "")
        )
        return Finding(
            kind="mismatch",
            severity="critical",
            message=msg,
            ranks=m.culprits,
            hosts=_hosts(culprit_rows),
            op=m.majority[0],
            seq=m.seq,
            evidence={
                "communicator": m.comm_key,
                "differs_in": differs,
                "expected": {"op": m.majority[0], "count": m.majority[1], "dtype": m.majority[2]},
                "culprit_calls": [
                    {"rank": r["who"], "op": r["op"], "count": r["count"], "dtype": r["dtype"]}
                    for r in culprit_rows.iter_rows(named=True)
                ],
                "hung": hung,
            },
            lines=_lines(culprit_rows) + _lines(m.rows.filter(~pl.col("who").is_in(m.culprits)), 1),
            hang_class="mismatch" if hung else None,
        )

    def _stall(
        self, stall: Stall, ctx: Context, failures: pl.DataFrame, errors: pl.DataFrame
    ) -> Finding:
        fw = ctx.analysis.frameworks
        hang_class: HangClass = "mismatch" if stall.ahead else "missing_rank"
        why = "never joined"
        died = failures.filter(pl.col("rank").is_in(stall.culprits))
        first_failure = _first_failure(failures)
        if stall.ahead:
            pass  # the culprit is alive and ahead: an extra call, not a death or an error
        elif len(died) and first_failure is not None and first_failure in stall.culprits:
            hang_class, why = "dead_process", "died before"
        elif len(errors):
            hang_class, why = "nccl_error", "stopped, after an NCCL error, before"
        culprit = ranks_text(stall.culprits)
        op = stall.op or "a collective"
        last_calls = stall.culprit_rows.filter(pl.col("last_seq") >= 0)
        timeouts = fw.timeouts
        evidence: dict[str, object] = {
            "communicator": stall.comm_key,
            "nranks": stall.nranks,
            "waiting_ranks": stall.waiting,
            "culprit_last": [
                {"rank": int(r["who"]), "last_seq": int(r["last_seq"]), "op": r.get("op")}
                for r in stall.culprit_rows.iter_rows(named=True)
            ],
        }
        extra = _lines(stall.extra_rows) if stall.extra_rows is not None else []
        lines = extra + _lines(last_calls) + _lines(stall.waiter_rows, 1)
        if len(timeouts):
            first = timeouts.sort("file_id", "line_no").row(0, named=True)
            evidence["watchdog"] = _watchdog(timeouts)
            lines.append(LineRef(int(first["file_id"]), int(first["line_no"])))
        if len(died):
            d = died.sort("file_id", "line_no").row(0, named=True)
            evidence["failure"] = {
                "rank": d["rank"],
                "exitcode": d["exitcode"],
                "signal": d["signal"],
                "first_observed": d["root_cause"],
            }
            lines.append(LineRef(int(d["file_id"]), int(d["line_no"])))
        if hang_class == "nccl_error":
            e = errors.row(0, named=True)
            evidence["nccl_error"] = {"kind": e["kind"], "message": e["message"]}
            lines.append(LineRef(int(e["file_id"]), int(e["line_no"])))
        desync = fw.torch_events.filter(pl.col("kind").str.starts_with("desync"))
        if len(desync):
            evidence["desync_named"] = sorted(
                {int(r) for rs in desync["ranks"].to_list() if rs for r in rs}
            )
            lines += _lines(desync, 1)
        return Finding(
            kind="hang",
            severity="critical",
            message=(
                f"rank {culprit} called one collective more than the others: at #{stall.seq} "
                f"it called {stall.extra_op or 'a collective'} where they called {op}, and "
                f"it went on while {len(stall.waiting)} rank(s) waited"
                if stall.ahead
                else f"rank {culprit} {why} {op} #{stall.seq}; {len(stall.waiting)} rank(s) "
                "entered it and waited"
            ),
            ranks=stall.culprits,
            hosts=_hosts(stall.culprit_rows),
            op=stall.op,
            seq=stall.seq,
            evidence=evidence,
            lines=lines,
            cost_gpu_s=_wait_cost(ctx, stall),
            hang_class=hang_class,
        )

    def _from_torch(self, ctx: Context, failures: pl.DataFrame, errors: pl.DataFrame) -> Finding:
        """A hang seen only through PyTorch's lines (no COLL lines): the desync report
        names the culprit, else the first failure or NCCL error explains it, else it is
        unknown."""
        fw = ctx.analysis.frameworks
        t = fw.timeouts.sort("file_id", "line_no")
        first = t.row(0, named=True)
        watchdog = _watchdog(t)
        lines = [LineRef(int(first["file_id"]), int(first["line_no"]))]
        desync = fw.torch_events.filter(
            (pl.col("kind") == "desync_lagging") & pl.col("ranks").list.len().gt(0)
        )
        named = sorted({int(r) for rs in desync["ranks"].to_list() for r in rs})
        first_failure = _first_failure(failures)
        evidence: dict[str, object] = {"watchdog": watchdog}
        hang_class: HangClass = "unknown"
        culprits: list[int] = []
        why = "the logs do not show which rank never arrived (no COLL lines)"
        if named:
            culprits, hang_class = named, "missing_rank"
            why = f"the desync report names rank {ranks_text(named)} as the one that never joined"
            evidence["desync_named"] = named
            lines += _lines(desync, 1)
        if first_failure is not None and (not named or first_failure in named):
            died = failures.filter(pl.col("rank") == first_failure).row(0, named=True)
            if died["signal"] not in ("SIGABRT", "SIGTERM") or not named:
                culprits, hang_class = [first_failure], "dead_process"
                why = f"rank {first_failure} died first ({died['signal'] or died['exitcode']})"
            evidence["failure"] = {
                "rank": first_failure,
                "exitcode": died["exitcode"],
                "signal": died["signal"],
            }
            lines.append(LineRef(int(died["file_id"]), int(died["line_no"])))
        if hang_class in ("unknown", "missing_rank") and len(errors) and not named:
            e = errors.sort("file_id", "line_no").row(0, named=True)
            hang_class = "nccl_error"
            culprits = [int(e["rank"])] if e["rank"] is not None else []
            why = f"an NCCL error on {e['host']} came first: {e['message']}"
            evidence["nccl_error"] = {"kind": e["kind"], "message": e["message"]}
            lines.append(LineRef(int(e["file_id"]), int(e["line_no"])))
        ran = t["ran_for_s"].drop_nulls()
        return Finding(
            kind="hang",
            severity="critical",
            message=(
                f"{len(watchdog['waiting_ranks']) or len(t)} rank(s) timed out in "
                f"{first['op']} SeqNum {first['seq']}: {why}"
            ),
            ranks=culprits,
            hosts=sorted({h for h in failures.filter(pl.col("rank").is_in(culprits))["host"] if h}),
            evidence=evidence,
            lines=lines,
            cost_gpu_s=float(ran.sum()) if len(ran) else None,
            hang_class=hang_class,
        )


@dataclass(frozen=True)
class Culprit:
    """Who a hang waited for, as the hang detector sees it."""

    ranks: list[int]
    hosts: list[str]
    op: str | None
    seq: int | None
    #: the first arrival at the collective the culprit never joined, where timed
    since: datetime | None


def culprit(ctx: Context) -> Culprit | None:
    """The culprit of the job's hang: the members behind on the largest communicator,
    else the ranks a PyTorch desync report names; None when neither is known."""
    for stall in stalls(ctx):
        times = stall.waiter_rows["ts"].drop_nulls() if len(stall.waiter_rows) else None
        found = times.min() if times is not None and len(times) else None
        return Culprit(
            stall.culprits,
            _hosts(stall.culprit_rows),
            stall.op,
            stall.seq,
            found if isinstance(found, datetime) else None,
        )
    for m in mismatches(ctx):
        last = ctx.progress.filter(pl.col("comm_key") == m.comm_key)["last_seq"]
        if len(last) and last.max() == m.seq:  # the job hung at the mismatch
            rows = m.rows.filter(pl.col("who").is_in(m.culprits))
            return Culprit(m.culprits, _hosts(rows), m.majority[0], m.seq, None)
    desync = ctx.analysis.frameworks.torch_events.filter(pl.col("kind") == "desync_lagging")
    named = sorted({int(r) for rs in desync["ranks"].to_list() if rs for r in rs})
    if named:
        return Culprit(named, [], None, None, None)
    return None


def _watchdog(timeouts: pl.DataFrame) -> dict[str, Any]:
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


def _first_failure(failures: pl.DataFrame) -> int | None:
    """The rank torchelastic observed failing first: the earliest of the agents' root
    causes, else the earliest failure."""
    if failures.is_empty():
        return None
    # Each host's torchrun agent names its own root cause: the job's is the earliest.
    root = failures.filter(pl.col("root_cause").fill_null(value=False))
    pick = (root if len(root) else failures).sort("ts", "file_id", "line_no", nulls_last=True)
    rank = pick["rank"][0]
    return int(rank) if rank is not None else None


def _wait_cost(ctx: Context, stall: Stall) -> float | None:
    """GPU-seconds the waiting ranks spent waiting: what the watchdog says they ran for,
    else the time from the stuck collective's first arrival to the last line of the logs."""
    t = ctx.analysis.frameworks.timeouts
    ran = t["ran_for_s"].drop_nulls()
    if len(ran):
        return float(ran.sum())
    start = stall.waiter_rows["ts"].drop_nulls().min() if len(stall.waiter_rows) else None
    end = ctx.last_ts
    if not isinstance(start, datetime) or end is None:
        return None
    return max(0.0, (end - start).total_seconds()) * len(stall.waiting)
