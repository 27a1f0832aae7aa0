"""What the all-gathers (and reduce-scatters, all-reduces) cost, against what the fabric
can do: NCCL Inspector's bus bandwidth per message size, against nccl-tests' baseline.

The seeds ask whether ZeRO-3's all-gathers are slow because of the network.  Inspector
times every collective per rank; its execution time includes the wait for the last
member (see ``exec_straggler``), so two bandwidths are read per (op, message size):

* ``bus_bw``: the median over records: what the ranks experienced, waits included;
* ``net_bus_bw``: per collective, the bandwidth of its shortest execution (the last
  arriver, which waited for nobody), median over collectives: what the network did.

The baseline per (op, size) is nccl-tests' out-of-place bus bandwidth of the same test
at the nearest size (within a factor of two) when its output is among the inputs, else
the nominal figure of the slowest transport the job used (``zero_stage.NOMINAL_BUS_BW``,
from the INIT/connection lines).  nccl-tests' ``size`` of all_gather and reduce_scatter
is the whole buffer, Inspector's the per-rank chunk: sizes are compared as the whole
buffer (chunk x ranks).

Policy, one finding per job for the op with the most time (``collective_cost``):
``warning`` when, over the messages of ``MIN_SIZE_BYTES`` and more, the network ran below
``MIN_NET_RATIO`` of a measured (nccl-tests) baseline; otherwise ``info``.  It says the
op's share of the collectives' time (and of the step, where DeepSpeed's timers give one)
and what explains the time: the network (``net_bus_bw`` below ``MIN_NET_RATIO`` of the
baseline), ranks arriving late (``wait_share`` of the op's time at least
``MIN_WAIT_SHARE``), or neither.
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from ncclscope.detect.base import Finding, duration_text, register
from ncclscope.detect.context import Context
from ncclscope.detect.zero_stage import NOMINAL_BUS_BW, _slowest_transport

__all__ = [
    "MIN_NET_RATIO",
    "MIN_SIZE_BYTES",
    "MIN_WAIT_SHARE",
    "CollectiveCostDetector",
    "cost_by_size",
]

#: Messages below this (whole buffer) are latency bound: bandwidth is not judged there.
MIN_SIZE_BYTES = 1 << 20
#: The network is the explanation when it delivers less than this share of the baseline.
MIN_NET_RATIO = 0.5
#: Late ranks are the explanation when waiting is at least this share of the op's time.
MIN_WAIT_SHARE = 0.25
_OPS = {"AllGather": "all_gather", "ReduceScatter": "reduce_scatter", "AllReduce": "all_reduce"}


def cost_by_size(inspector: pl.DataFrame) -> pl.DataFrame:
    """Per (op, power-of-two size bucket of the whole buffer): records, collectives,
    median bus bandwidth (waits included), the network's (the shortest execution per
    collective), the share of time spent waiting, and the time per rank."""
    recs = inspector.filter(pl.col("op").is_in(list(_OPS)) & pl.col("exec_time_s").gt(0))
    if recs.is_empty():
        return pl.DataFrame()
    whole = (
        pl.when(pl.col("op") == "AllReduce")
        .then(pl.col("msg_size_bytes"))
        .otherwise(pl.col("msg_size_bytes") * pl.col("nranks").fill_null(1))
    )
    recs = recs.with_columns(
        whole.alias("size_bytes"),
        (2 ** whole.cast(pl.Float64).log(2).floor()).cast(pl.Int64).alias("bucket_bytes"),
    )
    per_coll = recs.group_by("comm_hash", "op", "sn", "bucket_bytes").agg(
        pl.col("bus_bw_bytes_per_s").max().alias("net_bw"),
        pl.col("exec_time_s").min().alias("min_s"),
        pl.col("exec_time_s").mean().alias("mean_s"),
    )
    coll = per_coll.group_by("op", "bucket_bytes").agg(
        pl.len().alias("collectives"),
        pl.col("net_bw").median().alias("net_bus_bw_bytes_per_s"),
        ((pl.col("mean_s") - pl.col("min_s")).sum() / pl.col("mean_s").sum()).alias("wait_share"),
    )
    ranks = max(1, recs.select(pl.struct("host", "pid").n_unique()).item())
    return (
        recs.group_by("op", "bucket_bytes")
        .agg(
            pl.len().alias("records"),
            pl.col("bus_bw_bytes_per_s").median().alias("bus_bw_bytes_per_s"),
            (pl.col("exec_time_s").sum() / ranks).alias("time_per_rank_s"),
        )
        .join(coll, on=["op", "bucket_bytes"], how="left")
        .sort("op", "bucket_bytes")
    )


def _baseline(ctx: Context, op: str, size: int) -> tuple[float | None, str | None]:
    """nccl-tests' bus bandwidth for ``op`` at the size nearest ``size`` (within 2x)."""
    t = ctx.analysis.tools
    rows = t.nccl_tests.filter(
        (pl.col("test") == _OPS[op]) & pl.col("oop_bus_bw_bytes_per_s").is_not_null()
    )
    if not rows.is_empty():
        dist = (pl.col("size_bytes").cast(pl.Float64).log(2) - math.log2(size)).abs()
        near = rows.with_columns(dist.alias("d")).filter(pl.col("d") <= 1).sort("d")
        if not near.is_empty():
            fid = int(near["file_id"][0])
            path = next((p for k, p, _kind, _n in t.files if k == fid), "nccl-tests output")
            return float(near["oop_bus_bw_bytes_per_s"][0]), f"nccl-tests {_OPS[op]} ({path})"
    a = ctx.analysis
    transport = _slowest_transport(a.transports, multi_node=len(a.hosts) > 1)
    if transport is None:
        return None, None
    return NOMINAL_BUS_BW[transport], f"nominal for {transport} (assumed)"


@register
class CollectiveCostDetector:
    """All-gather/reduce-scatter/all-reduce cost against the fabric's baseline."""

    name = "collective_cost"

    def metric(self, ctx: Context) -> pl.DataFrame:
        if ctx.analysis.followed_by is not None:
            return pl.DataFrame()
        return cost_by_size(ctx.analysis.tools.inspector)

    def policy(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        if metric.is_empty():
            return []
        by_op = (
            metric.group_by("op")
            .agg(pl.col("time_per_rank_s").sum())
            .sort("time_per_rank_s", descending=True)
        )
        total = float(by_op["time_per_rank_s"].sum())
        op = str(by_op["op"][0])
        op_time = float(by_op["time_per_rank_s"][0])
        rows = metric.filter(pl.col("op") == op).to_dicts()
        sizes: list[dict[str, Any]] = []
        for r in rows:
            base, source = _baseline(ctx, op, int(r["bucket_bytes"]))
            sizes.append(
                {
                    "size_bytes_min": r["bucket_bytes"],
                    "records": r["records"],
                    "bus_bw_bytes_per_s": _round(r["bus_bw_bytes_per_s"]),
                    "net_bus_bw_bytes_per_s": _round(r["net_bus_bw_bytes_per_s"]),
                    "baseline_bus_bw_bytes_per_s": _round(base),
                    "baseline_source": source,
                    "wait_share": _round(r["wait_share"], 3),
                    "time_per_rank_s": _round(r["time_per_rank_s"], 6),
                }
            )
        judged = [
            s
            for s in sizes
            if s["size_bytes_min"] >= MIN_SIZE_BYTES and s["baseline_bus_bw_bytes_per_s"]
        ]
        weight = sum(s["time_per_rank_s"] or 0 for s in judged) or 1.0
        net_ratio = (
            sum(
                (s["time_per_rank_s"] or 0)
                * (s["net_bus_bw_bytes_per_s"] or 0)
                / s["baseline_bus_bw_bytes_per_s"]
                for s in judged
            )
            / weight
            if judged
            else None
        )
        big = [s for s in sizes if s["size_bytes_min"] >= MIN_SIZE_BYTES] or sizes
        wait = sum((s["wait_share"] or 0) * (s["time_per_rank_s"] or 0) for s in big) / max(
            1e-12, sum(s["time_per_rank_s"] or 0 for s in big)
        )
        measured = any(
            s["baseline_source"] and s["baseline_source"].startswith("nccl-tests") for s in judged
        )
        if net_ratio is not None and net_ratio < MIN_NET_RATIO:
            explained = "network"
            why = (
                f"the network delivered {net_ratio:.0%} of the baseline bus bandwidth even "
                "for the rank that waited for nobody: the fabric explains it"
            )
        elif wait >= MIN_WAIT_SHARE:
            explained = "ranks"
            why = (
                f"{wait:.0%} of that time is waiting for the last rank to arrive: a late rank "
                "explains it, not the network"
                + (f" (the network ran at {net_ratio:.0%} of the baseline)" if net_ratio else "")
            )
        else:
            explained = "neither"
            why = (
                f"the network ran at {net_ratio:.0%} of the baseline and waiting is "
                f"{wait:.0%} of the time: neither explains a slowdown"
                if net_ratio is not None
                else f"no baseline to compare with; waiting is {wait:.0%} of the time"
            )
        share = op_time / total if total else None
        step = _step_share(ctx, op_time)
        steps = f", {step:.0%} of the step" if step is not None else ""
        msg = (
            f"{op} took {share:.0%} of the collectives' GPU time ({duration_text(op_time)} per "
            f"rank{steps}); {why}"
        )
        return [
            Finding(
                kind="collective_cost",
                severity="warning" if explained == "network" and measured else "info",
                message=msg,
                op=op,
                evidence={
                    "source": "inspector",
                    "share_of_collectives": _round(share, 3),
                    "share_of_step": _round(step, 3),
                    "time_per_rank_s": round(op_time, 6),
                    "net_ratio": _round(net_ratio, 3),
                    "wait_share": round(wait, 3),
                    "explained_by": explained,
                    "by_size": sizes,
                },
            )
        ]


def _step_share(ctx: Context, op_time: float) -> float | None:
    """The op's time per rank over the run's step time (DeepSpeed's timers), if known."""
    timers = ctx.analysis.frameworks.timers
    parts = timers.filter(pl.col("name").is_in(["fwd", "bwd", "step"]))
    if parts.is_empty():
        return None
    total = float(parts["duration_s"].sum())
    return min(1.0, op_time / total) if total > 0 else None


def _round(value: Any, digits: int = 1) -> Any:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return round(float(value), digits)
