"""Stragglers: the rank every collective waits for.

NCCL logs a COLL line when the call is enqueued, so with sub-second timestamps on those
lines a rank's arrival at each collective instance is known.  Metric, per communicator
member: its lateness at every instance (its arrival minus the earliest member's), as
median and p95, how often it arrived last, and the mean.  Policy: a member is a
straggler when its median lateness exceeds its host's (or, on hosts with too few ranks,
the communicator's) typical median by at least ``MIN_SLOWDOWN`` of the median gap
between consecutive collectives.  Comparing with the same host's ranks cancels the
host's clock offset; medians ignore one-off delays.

Sample: rank 5's lines come ~4 ms after the others' at every instance::

    [default0]:[2025-03-14 09:00:31.120001] node-0:41230:41230 [0] NCCL INFO AllGather: ...
    [default5]:[2025-03-14 09:00:31.124310] node-0:41235:41235 [5] NCCL INFO AllGather: ...
"""

from __future__ import annotations

import polars as pl

from ncclscope.detect.base import Finding, LineRef, duration_text, register
from ncclscope.detect.config import subsecond_digits_unreliable
from ncclscope.detect.context import Context
from ncclscope.schema import LATENESS_SCHEMA

__all__ = ["MIN_SLOWDOWN", "StragglerDetector", "lateness"]

#: Excess median lateness, as a share of the median gap between collectives, from which
#: a member is a straggler.
MIN_SLOWDOWN = 0.05
#: ...and at least this much in absolute terms (timestamps are microseconds, but hosts'
#: clocks and the logging path add jitter of that order).
MIN_EXCESS_S = 0.0005
#: A host's own typical lateness is used when it holds at least this many members.
_HOST_BASELINE_MEMBERS = 3
#: Instances a member must have been timed at.
_MIN_INSTANCES = 20
#: Excess lateness must also stand this many robust standard deviations (1.4826 x the
#: median absolute deviation of the members' medians) above the typical member.
_MIN_Z = 4.0
#: Excess, as a share of the gap, from which a straggler is critical.
_CRITICAL_SLOWDOWN = 0.25


def timing_usable(ctx: Context) -> bool:
    """COLL lines carry sub-second times that can be trusted."""
    a = ctx.analysis
    if a.summary is None or a.summary.with_ts == 0:
        return False
    if subsecond_digits_unreliable(a.nccl_versions):
        return False
    inst = ctx.instances.filter(pl.col("with_ts") > 0).head(2000)
    return bool((inst["ts_min"].dt.microsecond() != 0).any())


def _with_lateness(ctx: Context) -> pl.DataFrame:
    """The sampled calls of fully timed instances, with ``late`` (seconds after the
    instance's first arrival) and ``last`` (it arrived last) and the instance's size."""
    inst = ctx.instances.filter((pl.col("n") >= 2) & (pl.col("with_ts") == pl.col("n")))
    return ctx.sample.join(
        inst.select("comm_key", "seq", "ts_min", "ts_max", "n"), on=["comm_key", "seq"]
    ).with_columns(
        ((pl.col("ts") - pl.col("ts_min")).dt.total_microseconds() / 1e6).alias("late"),
        (pl.col("ts") == pl.col("ts_max")).alias("last"),
    )


def lateness(ctx: Context) -> pl.DataFrame:
    """Per communicator member: lateness statistics over the sampled instances every
    member of which was timed (``LATENESS_SCHEMA``), and the communicator's median gap
    between collectives."""
    if ctx.analysis.collectives is None or not timing_usable(ctx):
        return pl.DataFrame(schema=LATENESS_SCHEMA)
    rows = _with_lateness(ctx)
    if rows.is_empty():
        return pl.DataFrame(schema=LATENESS_SCHEMA)
    # The median gap between consecutive instances: from consecutive sampled ones, over
    # the stride between them.
    gaps = (
        ctx.instances.sort("comm_key", "seq")
        .select(
            "comm_key",
            (
                pl.col("ts_min").diff().over("comm_key").dt.total_microseconds()
                / pl.col("seq").diff().over("comm_key")
            ).alias("gap"),
        )
        .group_by("comm_key")
        .agg((pl.col("gap").median() / 1e6).alias("gap_s"))
    )
    per_member = rows.group_by("comm_key", "comm_rank").agg(
        pl.col("rank").first(),
        pl.col("host").first(),
        pl.len().alias("instances"),
        pl.col("last").sum(),
        pl.col("late").median().alias("median_s"),
        pl.col("late").quantile(0.95).alias("p95_s"),
        pl.col("late").mean().alias("mean_s"),
        pl.col("n").max().alias("members"),
        pl.col("file_id").first(),
        pl.col("line_no").min(),
    )
    return (
        per_member.join(gaps, on="comm_key", how="left")
        .select(list(LATENESS_SCHEMA))
        .cast(LATENESS_SCHEMA)
        .sort("comm_key", "comm_rank")
    )


@register
class StragglerDetector:
    """Members that arrive late at collective after collective."""

    name = "straggler"

    def metric(self, ctx: Context) -> pl.DataFrame:
        return lateness(ctx)

    def policy(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        if metric.is_empty():
            return []
        ranked = metric.filter(pl.col("instances") >= _MIN_INSTANCES).with_columns(
            pl.col("median_s").median().over("comm_key").alias("comm_typical"),
            pl.col("median_s").median().over("comm_key", "host").alias("host_typical"),
            pl.len().over("comm_key", "host").alias("host_members"),
        )
        typical = (
            pl.when(pl.col("host_members") >= _HOST_BASELINE_MEMBERS)
            .then(pl.col("host_typical"))
            .otherwise(pl.col("comm_typical"))
        )
        # How far members' medians stray from their own typical one: each host's clock
        # offset is taken out with the host's typical member.
        spread = pl.col("excess_s").abs().median().over("comm_key") * 1.4826
        flagged = (
            ranked.with_columns(
                (pl.col("median_s") - typical).alias("excess_s"),
                (pl.col("mean_s") - typical).clip(lower_bound=0).alias("mean_excess_s"),
            )
            .with_columns(spread.alias("spread_s"))
            .filter(
                (pl.col("excess_s") >= MIN_SLOWDOWN * pl.col("gap_s"))
                & (pl.col("excess_s") >= MIN_EXCESS_S)
                & (pl.col("excess_s") >= _MIN_Z * pl.col("spread_s"))
            )
        )
        out: list[Finding] = []
        seen: set[int] = set()
        # The largest communicator first: a straggler is late on every communicator it is
        # in, and the world one says most.
        order = flagged.sort(["members", "excess_s"], descending=[True, True])
        for r in order.iter_rows(named=True):
            who = r["rank"] if r["rank"] is not None else r["comm_rank"]
            if who in seen:
                continue
            seen.add(who)
            slowdown = r["excess_s"] / r["gap_s"] if r["gap_s"] else None
            cost = r["mean_excess_s"] * r["instances"] * max(0, r["members"] - 1)
            share_last = r["last"] / r["instances"]
            ops = self._per_op(ctx, r["comm_key"], r["comm_rank"])
            msg = (
                f"rank {who} on {r['host']} arrives late at collectives: median "
                f"{duration_text(r['median_s'])} after the first rank (p95 "
                f"{duration_text(r['p95_s'])}), last in {share_last:.0%} of "
                f"{r['instances']:,} collectives"
                + (f", {slowdown:.0%} of the gap between collectives" if slowdown else "")
            )
            out.append(
                Finding(
                    kind="straggler",
                    severity="critical"
                    if slowdown is not None and slowdown >= _CRITICAL_SLOWDOWN
                    else "warning",
                    message=msg,
                    ranks=[int(who)],
                    hosts=[r["host"]] if r["host"] else [],
                    op=str(ops[0]["op"]) if ops else None,
                    evidence={
                        "communicator": r["comm_key"],
                        "instances": r["instances"],
                        "sampled_every": ctx.stride,
                        "last": r["last"],
                        "median_lateness_s": round(r["median_s"], 6),
                        "p95_lateness_s": round(r["p95_s"], 6),
                        "typical_lateness_s": round(r["median_s"] - r["excess_s"], 6),
                        "median_gap_s": round(r["gap_s"], 6) if r["gap_s"] else None,
                        "slowdown": round(slowdown, 4) if slowdown is not None else None,
                        "by_op": ops,
                    },
                    lines=[LineRef(int(r["file_id"]), int(r["line_no"]))],
                    cost_gpu_s=round(cost, 3),
                )
            )
        return out

    def _per_op(self, ctx: Context, comm_key: str, comm_rank: int) -> list[dict[str, object]]:
        """The straggler's lateness per collective type, AllGather first."""
        rows = (
            _with_lateness(ctx)
            .filter((pl.col("comm_key") == comm_key) & (pl.col("comm_rank") == comm_rank))
            .group_by("op")
            .agg(pl.len().alias("calls"), pl.col("late").median().alias("median_s"))
            .sort(pl.col("op") != "AllGather", "op")
        )
        return [
            {"op": r["op"], "calls": r["calls"], "median_lateness_s": round(r["median_s"], 6)}
            for r in rows.iter_rows(named=True)
        ]
