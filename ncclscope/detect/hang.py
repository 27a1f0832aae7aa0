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

The evidence is in ``detect/stalls.py`` (stalls and mismatches) and
``detect/watchdog.py`` (whether the job stopped), the judging in ``detect/culprits.py``;
this module is the detector, which turns them into findings.
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from ncclscope.detect.base import Finding, LineRef, Severity, ranks_text, register
from ncclscope.detect.context import Context
from ncclscope.detect.culprits import (
    Culprit,
    Verdict,
    culprit,
    judge_group,
    judge_stall,
    reported_ranks,
    to_global,
    watchdog_summary,
)
from ncclscope.detect.evidence_findings import with_evidence
from ncclscope.detect.flight_findings import with_flight
from ncclscope.detect.ras_findings import with_ras
from ncclscope.detect.stalls import (
    WHO,
    Mismatched,
    Stall,
    UnrankedMismatch,
    hosts_of,
    mismatches,
    quote_lines,
    stalls,
    unranked_mismatches,
)
from ncclscope.detect.watchdog import PgTimeout, StopEvidence, pg_timeouts, stop_evidence
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


def _dtype(code: int | None) -> str:
    return f"{DTYPE_NAMES.get(code, 'datatype')} ({code})" if code is not None else "datatype ?"


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
        findings += [_unranked_mismatch(u, ctx) for u in unranked_mismatches(ctx)]
        for stall in stall_list:
            if {(stall.comm_key, stall.seq), (stall.comm_key, stall.seq - 1)} & hung_at:
                continue  # the mismatch there, or one collective earlier, is the story
            findings.append(self._stall(stall, ctx))
        if not stall_list and not findings and len(ctx.analysis.frameworks.timeouts):
            findings += self._from_torch(ctx)
        elif not stall_list and not findings:
            findings += _from_monitor(ctx)
        return with_evidence(ctx, with_ras(ctx, with_flight(ctx, findings)))

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
            hosts=hosts_of(culprit_rows),
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
            lines=quote_lines(culprit_rows)
            + quote_lines(m.rows.filter(~pl.col("who").is_in(m.culprits)), 1),
            hang_class="mismatch" if hung else None,
        )

    def _stall(self, stall: Stall, ctx: Context) -> Finding:
        waited_at = stall.waiter_rows["ts"].drop_nulls() if len(stall.waiter_rows) else None
        last_active = waited_at.max() if waited_at is not None and len(waited_at) else None
        ev = stop_evidence(
            ctx, last_active if isinstance(last_active, datetime) else None, stall.comm_key
        )
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
        left = _torn_down(ctx, stall.comm_key)
        if left:
            evidence["torn_down"] = [{"rank": r, "ended": e} for r, e in sorted(left.items())]
        extra = quote_lines(stall.extra_rows) if stall.extra_rows is not None else []
        lines = extra + quote_lines(last_calls) + quote_lines(stall.waiter_rows, 1)
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
            gone = [r for r in v.culprits if left.get(r) == "Destroy"]
            if gone:
                msg += (
                    f"; rank {ranks_text(gone)} had destroyed the communicator (Destroy "
                    "COMPLETE): it left before that collective"
                )
        else:
            unmapped = v.evidence.get("culprit_comm_ranks")
            who = (
                f"communicator rank {ranks_text(unmapped)}"
                if isinstance(unmapped, list)
                else f"rank {ranks_text(stall.culprits)}"
            )
            msg = (
                f"the job stopped at {op} #{stall.seq}: {len(stall.waiting)} rank(s) entered "
                f"it; {who} had not, but {v.withheld}"
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
            hosts=hosts_of(stall.culprit_rows.filter(pl.col("who").is_in(v.culprits))),
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
        evidence: dict[str, object] = {"watchdog": watchdog_summary(g.rows), **v.evidence}
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


def _who(rows: pl.DataFrame) -> str:
    """``rank 3`` where the job rank is known, else the process: ``the process 690499 on
    node-0``."""
    ranks = sorted({int(r) for r in rows["rank"].drop_nulls().to_list()})
    if len(ranks) == len(rows):
        return f"rank {ranks_text(ranks)}"
    procs = [f"{p} on {h}" for h, p in rows.select("host", "pid").unique().sort("pid").rows()]
    return ("the process " if len(procs) == 1 else "the processes ") + ", ".join(procs[:4])


def _unranked_mismatch(u: UnrankedMismatch, ctx: Context) -> Finding:
    """A mismatch on a communicator whose init lines were cut: both sides' calls (op,
    count, datatype) from the COLL lines that remain; the minority side named where a
    strict majority of two or more called the same, by job rank where another of its
    communicators names it, else by process::

        [default3]:node-0:690499:690499 [3] NCCL INFO ReduceScatter: opCount 14 ...
        count 100676608 datatype 7 op 0 root 0 comm 0x55df8eb18b90 [nranks=8] ...
    """
    (want, want_rows), *others = u.sides
    minority = pl.concat([rows for _s, rows in others])
    top = minority["nranks"].max()
    nranks = f"{top} ranks" if isinstance(top, int) else "unknown size"
    calls = "; ".join(
        f"{_who(rows)} called {op} (count {count:,}, {_dtype(dtype)})"
        for (op, count, dtype), rows in others
    )
    majority = f"{len(want_rows)} called {want[0]} (count {want[1]:,}, {_dtype(want[2])})"
    where = (
        f"at collective #{u.seq} (opCount {u.seq:x}) of a communicator of {nranks} "
        "whose init lines were cut"
    )
    ranks = sorted({int(r) for r in minority["rank"].drop_nulls().to_list()})
    named = u.clear and len(ranks) == len(minority)
    if u.clear:
        msg = f"{calls} where the other {majority} {where}"
    else:
        first = f"{_who(want_rows)} called {want[0]} (count {want[1]:,}, {_dtype(want[2])})"
        msg = f"the members disagree {where}: {first}; {calls}"
    msg += "; the job hung there" if u.hung else ""
    differs = sorted(
        name
        for name, k in (("op", 0), ("count", 1), ("dtype", 2))
        if any(shape[k] != want[k] for shape, _r in others)
    )
    return Finding(
        kind="mismatch",
        severity="critical" if u.clear else "warning",
        message=msg,
        ranks=ranks if named else [],
        hosts=hosts_of(minority) if u.clear else [],
        op=want[0],
        seq=u.seq,
        evidence={
            "communicator": u.comm_key,
            "differs_in": differs,
            "expected": {"op": want[0], "count": want[1], "dtype": want[2]} if u.clear else None,
            "culprit_calls": [
                {
                    "rank": r["rank"],
                    "host": r["host"],
                    "pid": r["pid"],
                    "op": r["op"],
                    "count": r["count"],
                    "dtype": r["dtype"],
                }
                for r in (minority if u.clear else pl.concat([want_rows, minority])).iter_rows(
                    named=True
                )
            ],
            "hung": u.hung,
            "init_cut": True,
            "culprit_basis": "mismatch" if named else "withheld",
            "culprit_bases": ["mismatch"] if named else ["withheld"],
            **(
                {}
                if named
                else {
                    "withheld": "no strict majority of two or more called the same"
                    if not u.clear
                    else "the calling process's job rank is not in the logs (init lines cut)"
                }
            ),
        },
        lines=quote_lines(minority) + quote_lines(want_rows, 1),
        hang_class="mismatch" if u.hung else None,
    )


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
    ranks = blamed if global_ else to_global(g, blamed)
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


def _torn_down(ctx: Context, comm_key: str) -> dict[int, str]:
    """Members of a communicator that logged ``- Destroy COMPLETE`` (left it cleanly:
    every call they made completed) or ``- Abort COMPLETE`` (gave up on it: an error, a
    timeout, or PyTorch's shutdown), by global rank where known."""
    m = ctx.members.filter((pl.col("comm_key") == comm_key) & pl.col("ended").is_not_null())
    return {int(w): str(e) for w, e in m.select(WHO, "ended").iter_rows() if w is not None}


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
