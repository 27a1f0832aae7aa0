"""Hangs and mismatches: whether the job stopped, which rank the others waited for,
and on what evidence.

Metric: per communicator member, the last collective it logged (``Context.progress``)
and the instances whose members logged different ops, counts or datatypes
(``Context.instances``).  Policy: a hang is a claim that the job stopped, made only on
evidence (``watchdog.stop_evidence``: the watchdog's lines, an NCCL error, the
launcher's failure summary, or timestamps showing no progress for far longer than the
job's gaps).  A log that simply ends with its ranks a collective apart is ``info``, and
blames nobody.  The culprit is named from evidence, never from how many ranks sit on
each side: the members behind the others (``last_seen``), checked against the members
of the process group that reported no timeout (``non_reporting_member``), a first death
that is a cause and not the watchdog's abort or the launcher's SIGTERM
(``died_first``), PyTorch's desync report, or a different op/count/datatype at the
same sequence (``mismatch``).  Evidence that conflicts or is missing names nobody
(``withheld``) and lowers the severity: a wrong culprit is worse than none.

Sample of what the culprit looks like in a combined log (rank 5's last line is seq 14;
every other rank logged seq 15 and waited)::

    [default5]:node-3:4105:4105 [5] NCCL INFO AllGather: opCount e sendbuff ... [nranks=8]
    [default0]:node-3:4100:4100 [0] NCCL INFO AllGather: opCount f sendbuff ... [nranks=8]
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import polars as pl

from ncclscope.detect.base import Finding, HangClass, LineRef, Severity, ranks_text, register
from ncclscope.detect.context import Context
from ncclscope.detect.watchdog import (
    PgTimeout,
    StopEvidence,
    consequence_deaths,
    log_continues,
    pg_timeouts,
    report_extent,
    stop_evidence,
)
from ncclscope.units import DTYPE_NAMES

__all__ = [
    "Culprit",
    "HangDetector",
    "Stall",
    "Verdict",
    "culprit",
    "judge_group",
    "judge_stall",
    "reported_ranks",
    "stalls",
]

#: At most this many mismatched instances are reported one by one.
_MAX_MISMATCHES = 5
#: The members waiting for a stuck rank stop at the same point: the last collective they
#: enqueue before the program syncs with the GPU (PyTorch enqueues ahead, then blocks).
#: Their last sequences a few apart is timing; more is logs cut or lost at different
#: points (files rotated or copied one by one), which says nothing about who stopped.
_MAX_WAITER_SPREAD = 2
#: Evidence lines quoted per side (culprits, waiters).
_QUOTE = 3


@dataclass(frozen=True)
class Stall:
    """A communicator whose members did not all reach the same collective.

    ``seq`` is the first collective some member never logged, and ``culprits`` the
    members that never logged it (global ranks where known): candidates, which the
    policy names only on evidence that the job stopped.  Or, when members ran ahead
    (``ahead``: one collective further, and a different op, count or datatype from
    everyone's at the others' last sequence), the collective at which they made a call
    nobody else made.  ``waiting`` are the other members.
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
    #: the other members' last sequences: lowest and highest
    others_last: tuple[int, int] | None = None

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
        # The members behind are the ones the others waited for (PyTorch enqueues
        # ahead, so the others' last calls may be several collectives on), unless the
        # members ahead made an extra call: at the others' last sequence they logged a
        # different op, count or datatype.  How many ranks sit on each side says
        # nothing: a log copied mid-run shows any split.
        at_low = group.filter(pl.col("last_seq") == low)
        at_high = group.filter(pl.col("last_seq") == high)
        ahead = high == low + 1 and _called_else(ctx, comm_key, low, at_low, at_high)
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
        rest = group.filter(~pl.col("who").is_in(culprits))["last_seq"]
        lo, hi = rest.min(), rest.max()
        others = (int(lo), int(hi)) if isinstance(lo, int) and isinstance(hi, int) else None
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
                others_last=others,
            )
        )
    return out


def _called_else(
    ctx: Context, comm_key: str, seq: int, low: pl.DataFrame, high: pl.DataFrame
) -> bool:
    """At ``seq``, did every member of ``high`` log another (op, count, datatype) than
    every member of ``low``?"""
    rows = ctx.rows_at(comm_key, [seq])
    if rows.is_empty():
        return False
    shape = pl.struct("op", "count", "dtype")
    lows = rows.join(low.select("comm_rank"), on="comm_rank", how="semi").select(shape)[:, 0]
    highs = rows.join(high.select("comm_rank"), on="comm_rank", how="semi").select(shape)[:, 0]
    if lows.is_empty() or highs.is_empty():
        return False
    return not set(map(str, highs.to_list())) & set(map(str, lows.to_list()))


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
        findings: list[Finding] = []
        hung_at: set[tuple[str, int]] = set()
        stall_list = stalls(ctx)
        for m in mismatches(ctx):
            findings.append(self._mismatch(m, ctx, stall_list))
            hung_at.add((m.comm_key, m.seq))
        for stall in stall_list:
            if {(stall.comm_key, stall.seq), (stall.comm_key, stall.seq - 1)} & hung_at:
                continue  # the mismatch there, or one collective earlier, is the story
            findings.append(self._stall(stall, ctx))
        if not stall_list and not findings and len(ctx.analysis.frameworks.timeouts):
            findings += self._from_torch(ctx)
        elif not stall_list and not findings:
            findings += _from_monitor(ctx)
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
                "culprit_basis": "mismatch",
                "culprit_bases": ["mismatch"],
            },
            lines=_lines(culprit_rows) + _lines(m.rows.filter(~pl.col("who").is_in(m.culprits)), 1),
            hang_class="mismatch" if hung else None,
        )

    def _stall(self, stall: Stall, ctx: Context) -> Finding:
        waited_at = stall.waiter_rows["ts"].drop_nulls() if len(stall.waiter_rows) else None
        last_active = waited_at.max() if waited_at is not None and len(waited_at) else None
        ev = stop_evidence(ctx, last_active if isinstance(last_active, datetime) else None)
        op = stall.op or "a collective"
        last_calls = stall.culprit_rows.filter(pl.col("last_seq") >= 0)
        evidence: dict[str, object] = {
            "communicator": stall.comm_key,
            "nranks": stall.nranks,
            "waiting_ranks": stall.waiting,
            "culprit_last": [
                {"rank": int(r["who"]), "last_seq": int(r["last_seq"]), "op": r.get("op")}
                for r in stall.culprit_rows.iter_rows(named=True)
            ],
            **ev.json(),
        }
        extra = _lines(stall.extra_rows) if stall.extra_rows is not None else []
        lines = extra + _lines(last_calls) + _lines(stall.waiter_rows, 1)
        if not stall.ahead and not ev.stopped:
            return _mid_run(stall, ev, evidence, lines)
        v = judge_stall(ctx, stall)
        evidence.update(v.evidence)
        evidence.update(v.basis_json())
        if v.withheld:
            evidence["withheld"] = v.withheld
        culprit = ranks_text(v.culprits)
        if stall.ahead:
            msg = (
                f"rank {culprit} called one collective more than the others: at #{stall.seq} "
                f"it called {stall.extra_op or 'a collective'} where they called {op}, and "
                f"it went on while {len(stall.waiting)} rank(s) waited"
            )
        elif v.culprits:
            msg = (
                f"rank {culprit} {v.why} {op} #{stall.seq}; {len(stall.waiting)} rank(s) "
                "entered it and waited"
            )
        else:
            msg = (
                f"the job stopped at {op} #{stall.seq}: {len(stall.waiting)} rank(s) entered "
                f"it; rank {ranks_text(stall.culprits)} had not, but {v.withheld}"
            )
        # Severity follows the evidence: the job's own lines say it stopped, or only
        # its timestamps do; a culprit the evidence cannot settle lowers it too.
        severity: Severity = (
            "critical" if (ev.direct or stall.ahead) and v.culprits and v.confident else "warning"
        )
        return Finding(
            kind="hang",
            severity=severity,
            message=msg,
            ranks=v.culprits,
            hosts=_hosts(stall.culprit_rows.filter(pl.col("who").is_in(v.culprits))),
            op=stall.op,
            seq=stall.seq,
            evidence=evidence,
            lines=lines + v.lines,
            cost_gpu_s=_wait_cost(ctx, stall),
            hang_class=v.hang_class,
        )

    def _from_torch(self, ctx: Context) -> list[Finding]:
        """A hang seen only through PyTorch's lines (no COLL lines, or no init lines to
        name their ranks): per process group that timed out, who reported, who did not,
        and what else the logs say; a mismatch where ranks timed out at the same SeqNum
        in different collectives."""
        groups = pg_timeouts(ctx)
        fw = ctx.analysis.frameworks
        t = fw.timeouts.sort("file_id", "line_no")
        if not groups:
            return []
        reported = reported_ranks(ctx)
        # The job's story is its first group to time out; a mismatch anywhere is told
        # as a mismatch.
        out = [_group_mismatch(g) for g in groups if len(g.shapes) > 1]
        if out:
            return out
        g = groups[0]
        v = judge_group(ctx, g, reported)
        first = g.rows.sort("file_id", "line_no").row(0, named=True)
        evidence: dict[str, object] = {"watchdog": _watchdog(g.rows), **v.evidence}
        evidence["pg"] = g.pg
        evidence.update(v.basis_json())
        if v.withheld:
            evidence["withheld"] = v.withheld
        lines = [LineRef(int(first["file_id"]), int(first["line_no"])), *v.lines]
        ran = t["ran_for_s"].drop_nulls()
        waiting = len(g.reporters) or len(g.rows)
        return [
            Finding(
                kind="hang",
                severity="critical" if (v.culprits and v.confident) or v.decided else "warning",
                message=(
                    f"{waiting} rank(s) of process group {g.label} timed out in "
                    f"{first['op']} SeqNum {g.seq}: {v.why}"
                ),
                ranks=v.culprits,
                hosts=sorted(
                    {h for h in fw.failures.filter(pl.col("rank").is_in(v.culprits))["host"] if h}
                ),
                evidence=evidence,
                lines=lines,
                cost_gpu_s=float(ran.sum()) if len(ran) else None,
                hang_class=v.hang_class,
            )
        ]


def _from_monitor(ctx: Context) -> list[Finding]:
    """No timeout line, but the heartbeat monitor gave up on the watchdog::

        [PG 0 Rank 3] Heartbeat monitor timed out! Process will be terminated after
        dumping debug info. workMetaList_.size()=57

    The watchdog itself was stuck (in a CUDA or NCCL call): the job stopped, inside
    the library.  Which rank is behind these lines cannot say (the rank with the fewest
    outstanding works enqueued the fewest, but the culprit may have printed nothing):
    the hang is said, its culprit withheld."""
    ev = ctx.analysis.frameworks.torch_events.filter(
        pl.col("kind").is_in(["heartbeat_timeout", "watchdog_stuck"])
    ).sort("file_id", "line_no")
    if ev.is_empty():
        return []
    who = ev.select(pl.coalesce("global_rank", "rank").alias("who"), "value", "kind")
    ranks = sorted({int(r) for r in who["who"].drop_nulls()})
    outstanding = {
        int(r): int(v)
        for r, v, k in who.iter_rows()
        if r is not None and v is not None and k == "heartbeat_timeout"
    }
    first = ev.row(0, named=True)
    return [
        Finding(
            kind="hang",
            severity="warning",
            message=(
                f"the heartbeat monitor found the watchdog stuck on {len(ranks) or len(ev)} "
                "rank(s) and terminated them: the job stopped inside a CUDA or NCCL call; "
                "the lines do not say which rank the others waited for"
            ),
            evidence={
                "stop_evidence": ["watchdog"],
                "monitor_ranks": ranks,
                "outstanding_works": [
                    {"rank": k, "works": v} for k, v in sorted(outstanding.items())
                ],
                "culprit_basis": "withheld",
                "culprit_bases": ["withheld"],
                "withheld": "no watchdog timeout or collective line names the missing rank",
            },
            lines=[LineRef(int(first["file_id"]), int(first["line_no"]))],
            hang_class="unknown",
        )
    ]


def _mid_run(
    stall: Stall, ev: StopEvidence, evidence: dict[str, object], lines: list[LineRef]
) -> Finding:
    """A log that ends while its ranks are a collective apart, with nothing that says the
    job stopped: the normal picture of a job copied mid-run, an excerpt, a scheduler's
    kill.  Said as ``info``, with what would confirm a hang, and nobody blamed."""
    who = ranks_text(stall.culprits)
    bound = f"{ev.idle_bound_s:.0f} s" if ev.idle_bound_s is not None else "minutes"
    evidence.update(
        {
            "waited_for": stall.culprits,
            "culprit_basis": "withheld",
            "culprit_bases": ["withheld"],
            "withheld": "nothing in the logs says the job was stuck there",
            "confirm_if": [
                "watchdog timeouts (Watchdog caught collective operation timeout) from the "
                "waiting ranks",
                "a heartbeat-monitor, abort or NCCL error line, or the launcher's failure summary",
                f"timestamps: no new line for more than {bound} after the waiting ranks' "
                "last collective",
            ],
        }
    )
    # A run that a restart followed ended there for sure, but a killed or preempted
    # healthy run ends so too: that it was stuck, nothing says.
    ended = (
        "this run ended (a new run followed)" if "restarted" in ev.kinds else "the log ends mid-run"
    )
    return Finding(
        kind="hang",
        severity="info",
        message=(
            f"{ended} at {stall.op or 'a collective'} #{stall.seq}, which "
            f"{len(stall.waiting)} rank(s) had entered; if the job was stuck at that "
            f"point, it waited for rank {who}"
        ),
        seq=stall.seq,
        op=stall.op,
        evidence=evidence,
        lines=lines,
        hang_class="unknown",
    )


def _group_mismatch(g: PgTimeout) -> Finding:
    """Ranks of one process group timed out at the same SeqNum in different collectives
    (op or sizes): a rank took another code path.  The ranks of a strict majority (two
    or more) are taken as right; with none, every side is named."""
    shapes = sorted(g.shapes.items(), key=lambda kv: (-len(kv[1]), str(kv[0])))
    top = shapes[0][1]
    clear = len(top) >= 2 and len(top) > sum(len(r) for _s, r in shapes[1:])
    blamed = sorted({r for _s, rs in (shapes[1:] if clear else shapes) for r in rs})
    calls = [
        {"rank": r, "op": op, "numel_in": nin, "numel_out": nout}
        for (op, nin, nout), ranks in shapes
        for r in ranks
    ]
    differs = sorted(
        {
            name
            for (op, nin, nout), _r in shapes[1:]
            for name, a, b in (("op", op, shapes[0][0][0]), ("size", (nin, nout), shapes[0][0][1:]))
            if a != b
        }
    )
    text = "; ".join(
        f"rank {ranks_text(rs)}: {op} (NumelIn={nin}, NumelOut={nout})"
        for (op, nin, nout), rs in shapes
    )
    global_ = g.global_ranks
    ranks = blamed if global_ else _to_global(g, blamed)
    lines = [
        LineRef(int(f), int(n))
        for f, n in g.rows.sort("file_id", "line_no")
        .select("file_id", "line_no")
        .head(4)
        .iter_rows()
    ]
    return Finding(
        kind="mismatch",
        severity="critical",
        message=(
            f"collective mismatch at SeqNum {g.seq} of process group {g.label}: the ranks "
            f"timed out in different collectives ({text}); a rank took another code path, "
            "and the job hung there"
        ),
        ranks=ranks or [],
        seq=g.seq,
        op=shapes[0][0][0],
        evidence={
            "pg": g.pg,
            "pg_desc": g.pg_desc,
            "seq_num": g.seq,
            "differs_in": differs,
            "calls": calls,
            "culprit_basis": "mismatch",
            "majority": list(top) if clear else None,
            "hung": True,
        },
        lines=lines,
        hang_class="mismatch",
    )


def _to_global(g: PgTimeout, group_ranks: list[int]) -> list[int]:
    """Group ranks of a non-default group to global ranks, where the lines pair them."""
    pairs = {
        int(r): int(gr)
        for r, gr in g.rows.select("rank", "global_rank").iter_rows()
        if r is not None and gr is not None
    }
    if not all(r in pairs for r in group_ranks):
        return []
    return sorted(pairs[r] for r in group_ranks)


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
    if stall.ahead:
        return Verdict(list(stall.culprits), ["mismatch"], "mismatch", "called one more")
    evidence: dict[str, Any] = {}
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
            return _withhold(
                f"rank {ranks_text(weak)} did not report, but no log of theirs goes on past "
                "the stall: a stuck rank's file and one cut there look alike"
                + (
                    f", and rank {ranks_text(sorted(ctx.ranks_without_logs))} left no line"
                    if ctx.ranks_without_logs
                    else ""
                ),
                evidence,
            )
        if early:
            evidence["log_ends_early"] = early
            return _withhold(
                f"rank {ranks_text(early)}, behind on this communicator, has no line as late "
                "as the others' watchdog reports, and its collectives stop well before "
                "theirs: its log ends early (cut, or absent), so its report and its later "
                "collectives may only have been lost",
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
        lines += _lines(desync, 1)
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
        evidence["watchdog"] = _watchdog(a.frameworks.timeouts)
        first = a.frameworks.timeouts.sort("file_id", "line_no").row(0, named=True)
        lines.append(LineRef(int(first["file_id"]), int(first["line_no"])))
    return Verdict(
        sorted(cands), basis, hang_class, why, evidence=evidence, lines=lines, confident=confident
    )


def ended_at_stall(ctx: Context, rank: int) -> bool:
    """Did ``rank``'s collectives go on until the others stopped?  On every communicator
    it belongs to, its last collective is at most one (the stuck one) plus what waiting
    ranks enqueue ahead (``_MAX_WAITER_SPREAD``) behind the others' last.  A log cut
    short ends many collectives behind on some communicator (the world's, at least)."""
    p = ctx.progress.with_columns(_WHO.alias("who"))
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
        lines += _lines(desync, 1)
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
        return _nccl_error_or(ctx, evidence, "the group's members are not in the logs")
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
        return _nccl_error_or(
            ctx,
            evidence,
            "the kept lines begin or end inside the watchdog reports, so the ranks without "
            "one may only have lost it",
        )
    if len(silent) > 1:
        return _nccl_error_or(
            ctx,
            evidence,
            f"rank {ranks_text(silent)} did not report; the logs do not say which stopped",
        )
    culprits = silent if g.global_ranks else _to_global(g, silent)
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
        return _nccl_error_or(
            ctx,
            evidence,
            f"rank {ranks_text(unseen)} did not report, but its log ends before the reports "
            "(or is absent): its report may only have been lost",
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
    process of the only file that holds NCCL lines and no report and ends before them."""
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
            and (at is None or (int(f) in ends and ends[int(f)] < at))
        }
    if len(own) != 1:
        return None
    mine = procs.filter(pl.col("file_id") == next(iter(own)))
    if len(mine) != 1:
        return None
    f, host, pid = mine.row(0)
    return int(f), str(host), int(pid)


def _calls_at_stall(ctx: Context, proc: tuple[int, str, int], size: int | None) -> bool:
    """Did the process log as many collectives on the group's communicator (its size)
    as the others typically did, less the stuck one and what waiting ranks enqueue
    ahead?  A log cut short has logged far fewer."""
    stats = ctx.analysis.stats
    if size is None or "nranks" not in stats.columns:
        return False
    comm = stats.filter(pl.col("nranks") == size)
    is_mine = (
        (pl.col("file_id") == proc[0]) & (pl.col("host") == proc[1]) & (pl.col("pid") == proc[2])
    )
    mine = comm.filter(is_mine)["coll_calls"].max()
    # The others' typical count: a cut at one time splits hosts whose clocks differ at
    # different collectives, so the highest is one off.
    others = comm.filter(~is_mine)["coll_calls"].median()
    if not isinstance(mine, int) or not isinstance(others, int | float):
        return False
    return others - mine <= 1 + _MAX_WAITER_SPREAD


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
            _hosts(stall.culprit_rows.filter(pl.col("who").is_in(v.culprits))),
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
            return Culprit(m.culprits, _hosts(rows), m.majority[0], m.seq, None, ["mismatch"])
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
