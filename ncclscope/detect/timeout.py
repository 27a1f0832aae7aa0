"""Timeouts: the ones the watchdog reported, and the one coming.

``countdown`` is the function the agent calls live: given the tables so far and a time
"now", per communicator the oldest collective that some members entered and others did
not, how long ago, the timeout in force, the seconds left and the culprit.  ``analyze``
applies it at the last line of the logs.

Post-mortem, each group of PyTorch watchdog lines (one per waiting rank, same process
group, SeqNum and op) becomes one ``timeout`` finding that names the culprit the hang
detector found, and the time from the first stall to the timeout::

    [rank0]:[E ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation
    timeout: WorkNCCL(SeqNum=15, OpType=_ALLGATHER_BASE, NumelIn=..., Timeout(ms)=1800000)
    ran for 1800095 milliseconds before timing out.
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from ncclscope.detect.base import (
    Finding,
    LineRef,
    Severity,
    duration_text,
    ranks_text,
    register,
)
from ncclscope.detect.context import Context
from ncclscope.detect.culprits import culprit, judge_group, judge_stall, reported_ranks
from ncclscope.detect.stalls import stalls
from ncclscope.detect.watchdog import pg_timeouts, stop_evidence
from ncclscope.schema import COUNTDOWN_SCHEMA

__all__ = ["COUNTDOWN_SCHEMA", "TimeoutDetector", "TimeoutImminentDetector", "countdown"]


#: Below this many seconds left, an imminent timeout is critical, not a warning.
_CRITICAL_LEFT_S = 300.0


def countdown(ctx: Context, now: datetime, timeout_s: float | None) -> pl.DataFrame:
    """Per communicator with a collective some members entered and others did not: that
    collective, when the first member entered it, its age at ``now``, and the seconds
    left before ``timeout_s`` (``COUNTDOWN_SCHEMA``).  Without a time for the first
    arrival (no timestamps), ``since``, ``age_s`` and ``left_s`` are null.
    """
    rows = []
    for stall in stalls(ctx):
        if stall.ahead:
            continue  # an extra call: nobody is missing from a collective the others began
        times = stall.waiter_rows["ts"].drop_nulls() if len(stall.waiter_rows) else None
        since = times.min() if times is not None and len(times) else None
        age = (now - since).total_seconds() if isinstance(since, datetime) else None
        left = timeout_s - age if age is not None and timeout_s is not None else None
        rows.append(
            {
                "comm_key": stall.comm_key,
                "seq": stall.seq,
                "op": stall.op,
                "entered_ranks": stall.waiting,
                "culprit_ranks": stall.culprits,
                "culprit_hosts": sorted({h for h in stall.culprit_rows["host"] if h}),
                "since": since,
                "age_s": age,
                "timeout_s": timeout_s,
                "left_s": left,
            }
        )
    return pl.DataFrame(rows, schema=COUNTDOWN_SCHEMA)


@register
class TimeoutImminentDetector:
    """At the last line of the logs: how long the culprit had kept the others waiting,
    against the timeout in force (``timeout_imminent``)."""

    name = "timeout_countdown"

    def metric(self, ctx: Context) -> pl.DataFrame:
        if not stalls(ctx):
            return pl.DataFrame(schema=COUNTDOWN_SCHEMA)
        end = ctx.last_ts
        if end is None:
            return pl.DataFrame(schema=COUNTDOWN_SCHEMA)
        timeout_s, _source = ctx.analysis.frameworks.timeout
        return countdown(ctx, end, timeout_s)

    def policy(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        timeout_s, source = ctx.analysis.frameworks.timeout
        # Post-mortem the countdown blames whom the evidence blames (the live countdown
        # names the ranks behind: the clock is running, and the alarm is its own).
        judged = {st.comm_key: judge_stall(ctx, st) for st in stalls(ctx) if not st.ahead}
        out = []
        for r in metric.filter(pl.col("age_s").is_not_null()).iter_rows(named=True):
            left = r["left_s"]
            if left is not None and left <= 0:
                continue  # already timed out: the timeout finding says so
            v = judged.get(r["comm_key"])
            blamed = [x for x in r["culprit_ranks"] if v is not None and x in v.culprits]
            culprits = ranks_text(r["culprit_ranks"])
            of = f" of {duration_text(timeout_s)}" if timeout_s else ""
            msg = (
                f"at the end of the logs rank {culprits} had been missing from {r['op']} "
                f"#{r['seq']} for {duration_text(r['age_s'])}{of}"
            )
            if left is not None:
                msg += f": the watchdog fires in {duration_text(left)}"
            # Post-mortem, a countdown is an alarm only when the logs say the job stopped
            # (live, the agent's countdown needs no such proof: the clock is running).
            ev = stop_evidence(ctx, r["since"], r["comm_key"])
            severity: Severity = (
                "info"
                if not ev.stopped
                else "critical"
                if left is not None and left < _CRITICAL_LEFT_S
                else "warning"
            )
            if not ev.stopped:
                msg = f"if the job was stuck at the end of the logs: {msg}"
            out.append(
                Finding(
                    kind="timeout_imminent",
                    severity=severity,
                    message=msg,
                    # Nobody is blamed for a log that merely ends.
                    ranks=blamed if ev.stopped else [],
                    hosts=list(r["culprit_hosts"]) if ev.stopped and blamed else [],
                    op=r["op"],
                    seq=r["seq"],
                    evidence={
                        "communicator": r["comm_key"],
                        "entered_ranks": list(r["entered_ranks"]),
                        "since": r["since"].isoformat(),
                        "age_s": round(r["age_s"], 3),
                        "timeout_s": timeout_s,
                        "timeout_source": source,
                        "left_s": None if left is None else round(left, 3),
                        **ev.json(),
                        **(
                            {}
                            if ev.stopped and blamed
                            else {"waited_for": list(r["culprit_ranks"])}
                        ),
                    },
                )
            )
        return out


@register
class TimeoutDetector:
    """Each watchdog timeout, per process group and SeqNum: what timed out, how long it
    ran, who reported it, and who that group waited for, on that group's evidence."""

    name = "timeout"

    def metric(self, ctx: Context) -> pl.DataFrame:
        """One row per (process group, SeqNum, op) that timed out."""
        t = ctx.analysis.frameworks.timeouts
        return (
            t.group_by("pg", "seq", "op")
            .agg(
                pl.coalesce("global_rank", "rank").drop_nulls().unique().sort().alias("waiting"),
                pl.col("timeout_s").max(),
                pl.col("ran_for_s").max(),
                pl.col("ts").min().alias("first_ts"),
                pl.col("ts").max().alias("last_ts"),
                pl.struct("file_id", "line_no").sort_by("file_id", "line_no").first().alias("at"),
                pl.len().alias("lines"),
            )
            .sort("first_ts", "seq", nulls_last=True)
        )

    def policy(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        del metric  # read per process group through ``pg_timeouts``
        groups = pg_timeouts(ctx)
        if not groups:
            return []
        nccl = culprit(ctx)
        reported = reported_ranks(ctx)
        world = ctx.analysis.identity.world_size
        out = []
        for g in groups:
            rows = g.rows.sort("file_id", "line_no")
            at = rows.row(0, named=True)
            ran = rows["ran_for_s"].max()
            ran_s = float(ran) if isinstance(ran, int | float) else None
            timeout = rows["timeout_s"].max()
            first_ts = rows["ts"].min()
            ops = sorted({str(o) for o in rows["op"].drop_nulls()})
            # The NCCL lines judge the default group when its communicator is the world's;
            # every other group is judged on its own reports.
            on_world = (
                g.global_ranks
                and nccl is not None
                and (g.members is None or world is None or len(g.members) == world)
            )
            basis: list[str]
            extra: dict[str, object] = {}
            if on_world and nccl is not None:
                culprits, hosts, basis = nccl.ranks, nccl.hosts, nccl.basis
                op, seq, stall_at, withheld = nccl.op, nccl.seq, nccl.since, nccl.withheld
            else:
                v = judge_group(ctx, g, reported)
                culprits, basis, withheld = v.culprits, v.basis, v.withheld
                hosts = sorted(
                    {
                        h
                        for h in ctx.analysis.frameworks.failures.filter(
                            pl.col("rank").is_in(culprits)
                        )["host"]
                        if h
                    }
                )
                op = seq = stall_at = None
                extra = {
                    k: v.evidence[k]
                    for k in (
                        "non_reporting",
                        "culprit_pg_ranks",
                        "inside_collective",
                        "log_ends_early",
                        "log_ends_at_stall",
                        "limited_by",
                    )
                    if k in v.evidence
                }
                if len(g.shapes) > 1:
                    culprits, basis, withheld = [], ["mismatch"], None
            who = (
                f"; waiting for rank {ranks_text(culprits)}"
                if culprits
                else (f"; culprit withheld: {withheld}" if withheld else "")
            )
            pg = f" on process group {g.label}" if g.pg is not None else ""
            msg = (
                f"{' / '.join(ops) or 'a collective'} SeqNum {g.seq}{pg} timed out on "
                f"{len(g.reporters) or len(rows)} rank(s)"
                + (f" after {duration_text(ran_s)}" if ran_s else "")
                + who
            )
            timeline: dict[str, object] = {}
            if stall_at is not None:
                timeline["first_stall"] = stall_at.isoformat()
            if isinstance(first_ts, datetime):
                timeline["timeout"] = first_ts.isoformat()
                if stall_at is not None:
                    timeline["stall_to_timeout_s"] = (first_ts - stall_at).total_seconds()
            evidence: dict[str, object] = {
                "torch_op": at["op"],
                "seq_num": g.seq,
                "pg": g.pg,
                "pg_desc": g.pg_desc,
                "waiting_ranks": g.reporters,
                "timeout_s": timeout,
                "ran_for_s": ran_s,
                "timeline": timeline,
                "culprit_basis": basis[0] if basis else "withheld",
                "culprit_bases": basis,
                **extra,
            }
            if len(ops) > 1:
                evidence["torch_ops"] = ops
            if withheld:
                evidence["withheld"] = withheld
            out.append(
                Finding(
                    kind="timeout",
                    # The watchdog fired: that the job stopped is certain.
                    severity="critical",
                    message=msg,
                    ranks=list(culprits),
                    hosts=list(hosts),
                    op=op,
                    seq=seq,
                    evidence=evidence,
                    lines=[LineRef(int(at["file_id"]), int(at["line_no"]))],
                    # The wait is the hang's cost; the hang finding carries it.
                    cost_gpu_s=None,
                )
            )
        return out
