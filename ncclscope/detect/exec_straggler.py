"""A straggler from NCCL Inspector's execution times alone, with no clock at all.

A collective cannot finish before its last member arrives, and each rank's kernel runs
from its own arrival to the end, so::

    exec(r) = (last arrival - arrival(r)) + transfer time + noise

The rank that arrives last waits least: its execution time is the shortest.  A rank
that computes longer than the others between collectives is therefore the one whose
execution time stays below its communicator's median, collective after collective.
No timestamp is needed, so this works where the logs carry none.

Metric, per (communicator, rank): over the collectives where at least half the members
wrote a record, ``short_s`` = the collective's median execution time minus the rank's
(positive: it waited less), its median and robust spread, how often the rank was the
shortest, and the time the others spent waiting beyond it (their execution time minus
its, summed: GPU-seconds lost to it).

Policy, per communicator, for the rank with the largest median ``short_s``: a minimum
effect (``MIN_EFFECT_S`` and ``MIN_SHARE`` of the collective's median time), a noise
bound (``MIN_Z`` robust standard errors of the median, as ``lateness.MIN_Z``), enough
collectives (``MIN_INSTANCES``), and consistency (the shortest in at least
``MIN_SHORTEST`` of them).
"""

from __future__ import annotations

import math

import polars as pl

from ncclscope.detect.base import Finding, duration_text, register
from ncclscope.detect.context import Context
from ncclscope.detect.lateness import MIN_INSTANCES, MIN_Z
from ncclscope.parsers.tools.inspector import normalise_hash

__all__ = [
    "CRITICAL_SHARE",
    "MIN_EFFECT_S",
    "MIN_SHARE",
    "MIN_SHORTEST",
    "ExecStragglerDetector",
    "exec_times_metric",
]

#: Inspector's times are whole microseconds and its kernel timing jitters by a few: a
#: rank must wait at least this much less than the median to be named.
MIN_EFFECT_S = 100e-6
#: ... and the others' wait for it must be at least this share of the collective's time.
MIN_SHARE = 0.05
#: The straggler is the shortest in at least this share of its collectives.
MIN_SHORTEST = 0.5
#: The others lose this share of the collective's time or more: critical.
CRITICAL_SHARE = 0.5


def exec_times_metric(inspector: pl.DataFrame) -> pl.DataFrame:
    """Per (comm_hash, comm_rank): instances, median and spread of ``short_s``, the
    share of collectives where it was the shortest, the collectives' median time and
    the others' wait beyond it (``lost_s``)."""
    key = ["comm_hash", "op", "sn"]
    recs = inspector.select(
        "comm_hash", "comm_rank", "nranks", "host", "pid", "op", "sn", "exec_time_s"
    ).unique(["comm_hash", "comm_rank", "op", "sn"])
    inst = recs.group_by(key).agg(
        pl.len().alias("n"),
        pl.col("nranks").max().alias("nranks"),
        pl.col("exec_time_s").median().alias("inst_median_s"),
        pl.col("exec_time_s").min().alias("inst_min_s"),
        pl.col("exec_time_s").sum().alias("inst_sum_s"),
    )
    inst = inst.filter(
        (pl.col("n") >= 2) & (pl.col("n") * 2 >= pl.col("nranks").fill_null(pl.col("n")))
    )
    rows = recs.join(inst, on=key, how="inner").with_columns(
        (pl.col("inst_median_s") - pl.col("exec_time_s")).alias("short_s"),
        (pl.col("exec_time_s") <= pl.col("inst_min_s")).alias("shortest"),
        (pl.col("inst_sum_s") - pl.col("n") * pl.col("exec_time_s")).clip(0).alias("lost_s"),
    )
    return (
        rows.group_by("comm_hash", "comm_rank")
        .agg(
            pl.col("host").drop_nulls().first(),
            pl.col("pid").drop_nulls().first(),
            pl.col("nranks").max(),
            pl.len().alias("instances"),
            pl.col("short_s").median().alias("median_short_s"),
            (pl.col("short_s") - pl.col("short_s").median()).abs().median().alias("mad_s"),
            pl.col("shortest").mean().alias("shortest_share"),
            pl.col("inst_median_s").median().alias("median_exec_s"),
            pl.col("lost_s").sum().alias("lost_s"),
        )
        .with_columns(
            # standard error of a median: 1.2533 x sigma / sqrt(n), sigma = 1.4826 x MAD
            (1.2533 * 1.4826 * pl.col("mad_s") / pl.col("instances").sqrt()).alias("se_s")
        )
        .with_columns(
            pl.when(pl.col("se_s") > 0)
            .then(pl.col("median_short_s") / pl.col("se_s"))
            .otherwise(pl.when(pl.col("median_short_s") > 0).then(math.inf).otherwise(0.0))
            .alias("z"),
            (pl.col("median_short_s") / pl.col("median_exec_s")).alias("share"),
        )
        .sort("comm_hash", "comm_rank")
    )


def flagged(metric: pl.DataFrame) -> pl.DataFrame:
    """The rows of ``metric`` the policy names: per communicator, the rank that waits
    least, where it passes every bound."""
    if metric.is_empty():
        return metric
    top = metric.sort("median_short_s", descending=True).group_by("comm_hash").first()
    return top.filter(
        (pl.col("instances") >= MIN_INSTANCES)
        & (pl.col("median_short_s") >= MIN_EFFECT_S)
        & (pl.col("share") >= MIN_SHARE)
        & (pl.col("z") >= MIN_Z)
        & (pl.col("shortest_share") >= MIN_SHORTEST)
    ).sort("comm_hash")


@register
class ExecStragglerDetector:
    """Stragglers named from Inspector's execution times (no clocks needed)."""

    name = "exec_straggler"

    def metric(self, ctx: Context) -> pl.DataFrame:
        # The tools describe the job as it ended: an earlier attempt's view skips them.
        if ctx.analysis.followed_by is not None:
            return pl.DataFrame()
        return exec_times_metric(ctx.analysis.tools.inspector)

    def policy(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        if metric.is_empty():
            return []
        ranks = _global_ranks(ctx)
        out = []
        for r in flagged(metric).iter_rows(named=True):
            rank = ranks.get((r["comm_hash"], r["comm_rank"]))
            who = (
                f"rank {rank}" if rank is not None else f"rank {r['comm_rank']} of the communicator"
            )
            where = f" on {r['host']}" + (f" (pid {r['pid']})" if r["pid"] is not None else "")
            out.append(
                Finding(
                    kind="straggler",
                    severity="critical" if r["share"] >= CRITICAL_SHARE else "warning",
                    message=(
                        f"{who}{where} arrives last at the collectives of communicator "
                        f"{r['comm_hash']}: NCCL Inspector times its kernels "
                        f"{duration_text(r['median_short_s'])} shorter than the median "
                        f"({r['share']:.0%} of a collective's "
                        f"{duration_text(r['median_exec_s'])}), the shortest in "
                        f"{r['shortest_share']:.0%} of {r['instances']:,} collectives; the "
                        f"others waited {duration_text(r['lost_s'])} for it (GPU time)"
                    ),
                    ranks=[rank] if rank is not None else [],
                    hosts=[r["host"]] if r["host"] else [],
                    evidence={
                        "source": "inspector",
                        "communicator": r["comm_hash"],
                        "comm_rank": r["comm_rank"],
                        "instances": r["instances"],
                        "median_short_s": round(r["median_short_s"], 6),
                        "median_exec_s": round(r["median_exec_s"], 6),
                        "shortest_share": round(r["shortest_share"], 3),
                        "z": round(r["z"], 1) if math.isfinite(r["z"]) else None,
                    },
                    cost_gpu_s=round(r["lost_s"], 3),
                )
            )
        return out


def _global_ranks(ctx: Context) -> dict[tuple[str, int], int]:
    """(communicator hash, rank in it) -> global rank, from the logs' members."""
    members = ctx.analysis.identity.members
    if members.is_empty() or "comm_id" not in members.columns:
        return {}
    rows = (
        members.filter(pl.col("comm_id").is_not_null() & pl.col("rank").is_not_null())
        .select(normalise_hash(pl.col("comm_id")).alias("h"), "comm_rank", "rank")
        .unique()
    )
    return {(h, int(cr)): int(r) for h, cr, r in rows.iter_rows() if cr is not None}
