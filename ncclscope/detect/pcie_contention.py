"""PCIe offload contention: ZeRO offload saturating the GPUs' PCIe links.

With ZeRO offload, gradients go to the host during backward and updated parameters come
back during the optimizer step, over each GPU's PCIe link.  Ranks that share a host (or
a PCIe switch, or a NUMA node's root complex) share that bandwidth and the host's
memory; when the links saturate, the optimizer step of those ranks stretches and every
other rank waits for them at the next step's first collective.

Metric, per rank and step (``CONTENTION_SCHEMA``): the optimizer phase's duration from
the timeline (``ncclscope.model.timeline``: from the step's last collective to the next step's
first, by the rank's own clock), its inflation against the run's healthy optimizer
phases (the median of the phases whose link was below ``SATURATED``; the lower quartile
of all when none was), and the median PCIe load of the rank's GPU during it: the larger
of TX and RX over the link's capacity, from the agent's samples inside the phase.

Policy: with offload on (DeepSpeed config dump or ZeRO init lines), a step is contended
when the link ran at >= ``SATURATED`` and the phase took >= ``MIN_INFLATION`` x the
healthy one; a rank is contended when ``MIN_SHARE`` of its measured steps (and at least
``MIN_STEPS``) were.  One finding per host, with its GPUs, the inflation, the GPU-seconds
lost (per contended step, the longest excess among the host's ranks, times the world
size: everyone waits) and the host's memory pressure: available memory under
``_LOW_MEMORY`` of the total, or swapping in or out (the swap counters' rates), not swap
merely in use.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

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

__all__ = [
    "CONTENTION_SCHEMA",
    "MIN_INFLATION",
    "SATURATED",
    "PcieContentionDetector",
    "contention_metric",
    "offload_on",
]

#: Share of the link's capacity (the larger direction) from which it is saturated.
SATURATED = 0.8
#: Optimizer phase / healthy optimizer phase from which a step is inflated.
MIN_INFLATION = 1.25
#: A rank is contended when this share of its measured steps (and this many) were.
MIN_SHARE = 0.3
MIN_STEPS = 2
#: Samples a phase needs to have its link load measured.
_MIN_SAMPLES = 1
#: Host memory available below this share of the total is pressure.
_LOW_MEMORY = 0.10
#: Swapping (in + out) at this rate or more is pressure: 256 pages of 4 KiB a second, far
#: above the odd page a quiet host moves, far below what thrashing moves (tens of MB/s).
_SWAP_ACTIVE = float(1 << 20)
#: Samples this far outside the contended phases count for the swap counters' growth.
_SWAP_PAD = timedelta(seconds=2)
#: Median inflation from which the finding is critical (with host memory pressure).
_CRITICAL_INFLATION = 2.0

CONTENTION_SCHEMA = pl.Schema(
    {
        "rank": pl.Int32,
        "host": pl.String,
        "gpu": pl.String,
        "pci_bus_id": pl.String,
        "step": pl.Int64,
        "duration_s": pl.Float64,  # the optimizer phase
        "baseline_s": pl.Float64,  # the run's healthy optimizer phase
        "inflation": pl.Float64,
        "pcie_ratio": pl.Float64,  # median of max(TX, RX) / link over the phase's samples
        "samples": pl.UInt32,
        "file_id": pl.UInt32,  # the COLL line that ended the phase
        "line_no": pl.UInt32,
    }
)

_SUGGESTIONS = (
    "pin host memory for the offloaded buffers (offload_optimizer.pin_memory: true)",
    "offload from fewer ranks per host or PCIe switch, or spread ranks over hosts",
    "bind each rank's CPU cores and host memory to its GPU's NUMA node "
    "(numactl --cpunodebind/--membind, or the launcher's binding options)",
    "overlap transfers with compute (overlap_comm: true) and size reduce/prefetch "
    "buckets so that fewer transfers run at once",
    "compare NVMe offload (offload to local NVMe with aio) against CPU offload, or turn "
    "offload off if the model fits (see the ZeRO stage advice)",
)


def _iso(value: object) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else None


def _median(values: pl.Series, *, mean: bool = False) -> float:
    """The median (or mean) of a float column, 0.0 when it is empty."""
    out = values.mean() if mean else values.median()
    return float(out) if isinstance(out, int | float) else 0.0


def offload_on(ctx: Context) -> dict[str, str] | None:
    """The ZeRO offload targets in force (``{"optimizer": "cpu", ...}``), or None when the
    logs say offload is off or say nothing."""
    zero = ctx.analysis.frameworks.zero
    if zero is None:
        return None
    on = {
        what: str(target)
        for what, target in (("optimizer", zero.offload_optimizer), ("param", zero.offload_param))
        if target not in (None, "none")
    }
    return on or None


def contention_metric(ctx: Context) -> pl.DataFrame:
    """Per rank and step: the optimizer phase, its inflation and its PCIe load."""
    samples = ctx.phase_samples
    timeline = ctx.timeline
    needed = {
        "pcie_tx_bytes_per_second",
        "pcie_rx_bytes_per_second",
        "pcie_link_max_bytes_per_second",
    }
    if samples.is_empty() or not needed <= set(samples.columns):
        return pl.DataFrame(schema=CONTENTION_SCHEMA)
    load = (
        samples.filter(
            (pl.col("phase") == "optimizer") & (pl.col("pcie_link_max_bytes_per_second") > 0)
        )
        .with_columns(
            (
                pl.max_horizontal("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second")
                / pl.col("pcie_link_max_bytes_per_second")
            ).alias("ratio")
        )
        .group_by("rank", "step")
        .agg(
            pl.col("ratio").median().alias("pcie_ratio"),
            pl.len().alias("samples"),
            pl.col("gpu").first(),
            pl.col("pci_bus_id").first(),
        )
        .filter(pl.col("samples") >= _MIN_SAMPLES)
    )
    phases = timeline.filter(
        (pl.col("source") == "collectives") & (pl.col("phase") == "optimizer")
    ).select("rank", "host", "step", "duration_s", "file_id", "line_no")
    rows = phases.join(load, on=["rank", "step"], how="inner")
    if rows.is_empty():
        return pl.DataFrame(schema=CONTENTION_SCHEMA)
    healthy = rows.filter(pl.col("pcie_ratio") < SATURATED)["duration_s"]
    baseline = healthy.median() if len(healthy) else rows["duration_s"].quantile(0.25)
    return (
        rows.with_columns(
            pl.lit(baseline, dtype=pl.Float64).alias("baseline_s"),
        )
        .with_columns((pl.col("duration_s") / pl.col("baseline_s")).alias("inflation"))
        .select(list(CONTENTION_SCHEMA))
        .cast(CONTENTION_SCHEMA)
        .sort("rank", "step")
    )


def _swap_rate(window: pl.DataFrame, metric: str) -> float | None:
    """Bytes per second a swap counter grew over the window (a counter reset, a reboot,
    counts from zero again); None with fewer than two samples."""
    rows = window.filter(pl.col("metric") == metric).sort("ts")
    if len(rows) < 2:
        return None
    first, last = rows["ts"][0], rows["ts"][-1]
    if not isinstance(first, datetime) or not isinstance(last, datetime) or last <= first:
        return None
    grew = rows["value"].diff().drop_nulls()
    return float(grew.filter(grew > 0).sum()) / (last - first).total_seconds()


def _host_memory(ctx: Context, host: str, steps: pl.DataFrame) -> dict[str, Any]:
    """The host's memory over the contended phases: lowest available, its total, most
    swap in use, and how fast it swapped.  Pressure is memory running out (available
    under ``_LOW_MEMORY`` of the total) or swapping at ``_SWAP_ACTIVE`` or more: swap
    merely in use (old pages, flat counters) is not pressure."""
    tel = ctx.telemetry.filter(pl.col("host") == host)
    if tel.is_empty() or steps.is_empty():
        return {}
    lo, hi = steps["start_ts"].min(), steps["end_ts"].max()
    window = tel.filter(pl.col("ts").is_between(lo, hi))

    def stat(metric: str, how: str) -> float | None:
        vals = window.filter(pl.col("metric") == metric)["value"]
        if vals.is_empty():
            return None
        out = vals.min() if how == "min" else vals.max()
        return float(out) if isinstance(out, int | float) else None

    avail = stat("ncclscope_host_memory_available_bytes", "min")
    total = stat("ncclscope_host_memory_total_bytes", "max")
    swap = stat("ncclscope_host_swap_used_bytes", "max")
    # the counters' growth across the window: one sample either side of it counts
    if isinstance(lo, datetime) and isinstance(hi, datetime):
        pad = _SWAP_PAD
        counters = tel.filter(pl.col("ts").is_between(lo - pad, hi + pad))
    else:
        counters = window
    sin = _swap_rate(counters, "ncclscope_host_swap_in_bytes_total")
    sout = _swap_rate(counters, "ncclscope_host_swap_out_bytes_total")
    low = avail is not None and total is not None and avail < _LOW_MEMORY * total
    swapping = (sin or 0.0) + (sout or 0.0) >= _SWAP_ACTIVE
    return {
        "host_memory_available_min_bytes": int(avail) if avail is not None else None,
        "host_memory_total_bytes": int(total) if total is not None else None,
        "swap_used_max_bytes": int(swap) if swap is not None else None,
        "swap_in_bytes_per_second": round(sin, 1) if sin is not None else None,
        "swap_out_bytes_per_second": round(sout, 1) if sout is not None else None,
        "host_memory_pressure": low or swapping,
    }


@register
class PcieContentionDetector:
    """Ranks whose optimizer step stretches while their PCIe links saturate (offload)."""

    name = "pcie_contention"

    def metric(self, ctx: Context) -> pl.DataFrame:
        if offload_on(ctx) is None or ctx.analysis.telemetry.is_empty():
            return pl.DataFrame(schema=CONTENTION_SCHEMA)
        return contention_metric(ctx)

    def policy(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        offload = offload_on(ctx)
        if metric.is_empty() or offload is None:
            return []
        marked = metric.with_columns(
            ((pl.col("pcie_ratio") >= SATURATED) & (pl.col("inflation") >= MIN_INFLATION)).alias(
                "hit"
            )
        )
        per_rank = marked.group_by("rank").agg(
            pl.col("hit").sum().alias("hits"), pl.len().alias("measured")
        )
        contended = per_rank.filter(
            (pl.col("hits") >= MIN_STEPS) & (pl.col("hits") >= MIN_SHARE * pl.col("measured"))
        )["rank"]
        hits = marked.filter(pl.col("hit") & pl.col("rank").is_in(contended.implode()))
        if hits.is_empty():
            return []
        world = ctx.analysis.identity.world_size or metric["rank"].n_unique()
        step_s = self._step_s(ctx)
        out = []
        for (host,), part in hits.group_by("host", maintain_order=True):
            out.append(self._finding(ctx, str(host), part, marked, world, step_s, offload))
        return out

    @staticmethod
    def _step_s(ctx: Context) -> float | None:
        tl = ctx.timeline.filter(pl.col("source") == "collectives")
        if tl.is_empty():
            return None
        per = tl.group_by("rank", "step").agg(pl.col("duration_s").sum())
        med = per["duration_s"].median()
        return float(med) if isinstance(med, int | float) else None

    def _finding(
        self,
        ctx: Context,
        host: str,
        part: pl.DataFrame,
        marked: pl.DataFrame,
        world: int,
        step_s: float | None,
        offload: dict[str, str],
    ) -> Finding:
        ranks = sorted(part["rank"].unique().to_list())
        gpus = (
            part.group_by("rank")
            .agg(pl.col("gpu").first(), pl.col("pci_bus_id").first())
            .sort("rank")
            .to_dicts()
        )
        per_step = part.group_by("step").agg(
            (pl.col("duration_s") - pl.col("baseline_s")).max().alias("excess")
        )
        cost = float(per_step["excess"].sum()) * world
        inflation = _median(part["inflation"])
        baseline = _median(part["baseline_s"])
        ratio = _median(part["pcie_ratio"])
        steps = sorted(per_step["step"].to_list())
        measured = marked.filter(pl.col("host") == host)["step"].n_unique()
        windows = ctx.timeline.filter(
            (pl.col("source") == "collectives")
            & (pl.col("phase") == "optimizer")
            & pl.col("rank").is_in(ranks)
            & pl.col("step").is_in(steps)
        )
        memory = _host_memory(ctx, host, windows)
        worst = part.sort("inflation", descending=True).row(0, named=True)
        lines = [LineRef(int(worst["file_id"]), int(worst["line_no"]))]
        timer = ctx.timeline.filter(  # the optimizer timer, if a contended rank printed it
            (pl.col("source") == "timers")
            & (pl.col("phase") == "optimizer")
            & (pl.col("step") == worst["step"])
            & pl.col("rank").is_in(ranks)
        )
        if not timer.is_empty():
            lines.append(LineRef(int(timer["file_id"][0]), int(timer["line_no"][0])))
        mean_excess = _median(per_step["excess"], mean=True)
        share = f", {mean_excess / step_s:.0%} of a step" if step_s else ""
        pressure = memory.get("host_memory_pressure")
        msg = (
            f"PCIe contention on {host} (ZeRO offload of the "
            f"{' and '.join(sorted(offload))} to {'/'.join(sorted(set(offload.values())))}): "
            f"rank{'s' if len(ranks) > 1 else ''} {ranks_text(ranks)} ran their GPUs' PCIe "
            f"links at {ratio:.0%} of capacity during the optimizer step, which took "
            f"{inflation:.1f}x the run's healthy {duration_text(baseline)} in {len(steps)} "
            f"of {measured} steps{share}; everyone waits for them at the next step"
            + ("; host memory ran low or swapped actively" if pressure else "")
        )
        severity: Severity = (
            "critical" if inflation >= _CRITICAL_INFLATION and pressure else "warning"
        )
        return Finding(
            kind="pcie_contention",
            severity=severity,
            message=msg,
            ranks=[int(r) for r in ranks],
            hosts=[host],
            evidence={
                "offload": offload,
                "gpus": [
                    {"rank": g["rank"], "gpu": g["gpu"], "pci_bus_id": g["pci_bus_id"]}
                    for g in gpus
                ],
                "steps_contended": len(steps),
                "steps_measured": measured,
                "first_step": steps[0],
                "last_step": steps[-1],
                # the contended optimizer phases' span, for plots (ISO 8601, UTC)
                "window_start": _iso(windows["start_ts"].min()),
                "window_end": _iso(windows["end_ts"].max()),
                "optimizer_phase_median_s": round(_median(part["duration_s"]), 6),
                "healthy_optimizer_phase_s": round(baseline, 6),
                "inflation": round(inflation, 3),
                "pcie_load_ratio": round(ratio, 3),
                "pcie_threshold_ratio": SATURATED,
                **memory,
                "suggestions": list(_SUGGESTIONS),
            },
            lines=lines,
            cost_gpu_s=round(cost, 3),
        )
