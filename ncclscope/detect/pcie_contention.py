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

Links shared behind a PCIe switch (the agent's ``ncclscope_gpu_pcie_uplink_info``: each
GPU's uplinks, with ``ncclscope_pcie_uplink_max_bytes_per_second``): per host, uplink and
sample time, the TX and RX of every GPU behind the uplink are summed, and the larger sum
over the uplink's capacity is its load.  Two or four GPUs behind one x16 uplink each read
25-50% of their own link while the uplink they share is full; a rank's step carries the
load of its most loaded uplink (``uplink``, ``uplink_ratio``).

Saturation, from the physics: a PCIe link delivers at most about ``PAYLOAD_SHARE`` of its
raw rate as payload (TLP headers and link-layer packets take the rest: host-device copies
reach about 25 GB/s of a Gen4 x16 link's 31.5 GB/s, per direction), so a link counts as
saturated from 90% of that, ``SATURATED`` of its raw capacity (the capacity the agent
computes from NVML or sysfs), whichever link it is.

Policy: with offload on (DeepSpeed config dump or ZeRO init lines), a step is contended
when its GPU's own link or an uplink above it ran at >= ``SATURATED`` and the phase took
>= ``MIN_INFLATION`` x the healthy one; a rank is contended when ``MIN_SHARE`` of its
measured steps (and at least ``MIN_STEPS``) were, and its host's saturated phases took
>= ``MIN_INFLATION`` x the healthy one by the median over the steps (noise that lifts a
third of a mild host's steps over the bar does not make it a warning).  Mild contention,
below that bar, is judged on the steady shift rather than step by step: links saturated
on ``MILD_SHARE`` of a rank's steps (and ``MIN_STEPS``), and the host's saturated phases
(per step, the median over its ranks; then the median over the steps) >=
``MILD_INFLATION`` x the healthy ones and ``MILD_Z`` robust standard errors beyond the
steps' noise (so a small shift over many steps counts, one that noise could make does
not); with a baseline measured on unsaturated phases: an ``info`` finding with its
GPU-seconds.  One finding per host, with its GPUs, the link that saturated (the GPU's
own, or the shared uplink and the GPUs behind it), the inflation, the GPU-seconds lost
(per contended step, the longest excess among the host's ranks, times the world size:
everyone waits) and the host's memory pressure: available memory under ``_LOW_MEMORY``
of the total, or swapping in or out (the swap counters' rates), not swap merely in use.
"""

from __future__ import annotations

import math
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
from ncclscope.detect.lateness import MIN_SLOWDOWN
from ncclscope.model.timeline import normalise_bus_id

__all__ = [
    "CONTENTION_SCHEMA",
    "MILD_INFLATION",
    "MIN_INFLATION",
    "PAYLOAD_SHARE",
    "SATURATED",
    "PcieContentionDetector",
    "contention_metric",
    "offload_on",
]

#: Share of a link's raw rate a saturated link delivers as payload (25 GB/s of a Gen4
#: x16 link's 31.5 GB/s per direction: 256-byte TLPs with their headers, DLLPs).
PAYLOAD_SHARE = 0.8
#: Share of a link's raw capacity (the larger direction) from which it is saturated: 90%
#: of what it can deliver.  The GPU's own link and a shared uplink alike.
SATURATED = round(0.9 * PAYLOAD_SHARE, 3)
#: Optimizer phase / healthy optimizer phase from which a step is inflated.
MIN_INFLATION = 1.25
#: A rank is contended when this share of its measured steps (and this many) were.
MIN_SHARE = 0.3
MIN_STEPS = 2
#: Mild contention: links saturated on this share of a rank's measured steps (most of
#: them: steady, not a burst) ...
MILD_SHARE = 0.5
#: ... and those phases, by the median over the steps, this much longer than healthy
#: ones: the project's minimum effect (``lateness.MIN_SLOWDOWN``, as for stragglers),
#: and ``MILD_Z`` robust standard errors beyond the noise.  A steady shift is judged on
#: the median of many steps, so it needs no bar that each noisy step must clear.
MILD_INFLATION = 1.0 + MIN_SLOWDOWN
#: One one-sided test per host, on phases already marked by an independent signal (the
#: link saturated on most steps): three standard errors, where ``lateness.MIN_Z`` (4)
#: guards a search over every member of every communicator.
MILD_Z = 3.0
#: Standard error of a median, in standard deviations times 1/sqrt(n) (normal noise).
_SE_MEDIAN = 1.253
#: Raw signalling rate per lane (GT/s) by PCIe generation (``agent.nvml.PCIE_LANE_GT_PER_S``).
_LANE_GT_PER_S = {1.0: 2.5, 2.0: 5.0, 3.0: 8.0, 4.0: 16.0, 5.0: 32.0, 6.0: 64.0}
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
        "uplink": pl.String,  # the most loaded uplink above the GPU (null: none known)
        "uplink_ratio": pl.Float64,  # its median load: max(sum TX, sum RX) / its capacity
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
    shared = _uplink_steps(ctx)
    if shared.is_empty():
        load = load.with_columns(
            pl.lit(None, dtype=pl.String).alias("uplink"),
            pl.lit(None, dtype=pl.Float64).alias("uplink_ratio"),
        )
    else:
        load = load.join(shared, on=["rank", "step"], how="left")
    phases = timeline.filter(
        (pl.col("source") == "collectives") & (pl.col("phase") == "optimizer")
    ).select("rank", "host", "step", "duration_s", "file_id", "line_no")
    rows = phases.join(load, on=["rank", "step"], how="inner")
    if rows.is_empty():
        return pl.DataFrame(schema=CONTENTION_SCHEMA)
    healthy = rows.filter(~_saturated())["duration_s"]
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


def _saturated() -> pl.Expr:
    """The GPU's own link or an uplink above it ran at >= ``SATURATED``."""
    return (pl.col("pcie_ratio") >= SATURATED) | (
        pl.col("uplink_ratio").fill_null(0.0) >= SATURATED
    )


def uplinks(ctx: Context) -> pl.DataFrame:
    """The agent's topology: per host and GPU (``_bus``: its bus id as an integer) each
    uplink above it other than its own link, with the uplink's capacity, generation,
    width and the GPUs behind it; empty without ``ncclscope_gpu_pcie_uplink_info``."""
    tel = ctx.telemetry
    info = tel.filter(pl.col("metric") == "ncclscope_gpu_pcie_uplink_info")
    if info.is_empty():
        return pl.DataFrame()
    parts = pl.col("labels").str.split(",")
    per_gpu = (
        info.select(
            "host",
            parts.list.get(0, null_on_oob=True).alias("gpu"),
            parts.list.get(2, null_on_oob=True).alias("pci_bus_id"),
            parts.list.get(3, null_on_oob=True).alias("uplink"),
        )
        .drop_nulls()
        .unique()
        .with_columns(
            normalise_bus_id(pl.col("pci_bus_id")).alias("_bus"),
            normalise_bus_id(pl.col("uplink")).alias("_up"),
        )
        # a direct-attached GPU names its own link: the per-GPU test covers it
        .filter(pl.col("_up").is_null() | (pl.col("_up") != pl.col("_bus")))
        .drop("_up")
    )
    if per_gpu.is_empty():
        return pl.DataFrame()

    def per_link(metric: str, name: str) -> pl.DataFrame:
        return (
            tel.filter(pl.col("metric") == metric)
            .group_by("host", pl.col("labels").alias("uplink"))
            .agg(pl.col("value").max().alias(name))
        )

    out = per_gpu
    for metric, name in (
        ("ncclscope_pcie_uplink_max_bytes_per_second", "capacity"),
        ("ncclscope_pcie_uplink_generation", "generation"),
        ("ncclscope_pcie_uplink_width", "width"),
    ):
        out = out.join(per_link(metric, name), on=["host", "uplink"], how="left")
    # without the capacity row: from the generation and width, as the agent computes it
    gt = pl.col("generation").replace_strict(_LANE_GT_PER_S, default=None, return_dtype=pl.Float64)
    encoding = pl.when(pl.col("generation") <= 2).then(0.8).otherwise(128 / 130)
    out = out.with_columns(
        pl.coalesce("capacity", gt * 1e9 * pl.col("width") * encoding / 8).alias("capacity")
    ).filter(pl.col("capacity").is_not_null())
    gpus = per_gpu.group_by("host", "uplink").agg(pl.col("gpu").sort().alias("gpus"))
    return out.filter(pl.col("capacity") > 0).join(gpus, on=["host", "uplink"], how="left")


def _uplink_steps(ctx: Context) -> pl.DataFrame:
    """Per rank and step: its most loaded uplink and that uplink's median load over the
    rank's optimizer phase (``uplink``, ``uplink_ratio``)."""
    links = uplinks(ctx)
    samples = ctx.gpu_samples
    phase = ctx.phase_samples
    cols = {"pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"}
    if (
        links.is_empty()
        or samples.is_empty()
        or phase.is_empty()
        or not cols <= set(samples.columns)
    ):
        return pl.DataFrame()
    bus = normalise_bus_id(pl.col("pci_bus_id")).alias("_bus")
    traffic = samples.select(
        "host", "ts", bus, "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"
    ).join(links.select("host", "_bus", "uplink", "capacity"), on=["host", "_bus"])
    if traffic.is_empty():
        return pl.DataFrame()
    # The GPUs behind an uplink are sampled in one pass (the agent stamps them alike);
    # where their times differ, samples are put in bins of the host's sampling interval.
    key = "ts"
    per_ts = traffic.group_by("host", "uplink", "ts").agg(pl.len().alias("n"))
    behind = links.group_by("host", "uplink").agg(pl.len().alias("behind"))
    aligned = per_ts.join(behind, on=["host", "uplink"])
    share = (aligned["n"] >= aligned["behind"]).mean()
    if not isinstance(share, float) or share < 0.5:
        step = traffic.sort("ts").group_by("host", "_bus").agg(pl.col("ts").diff().median())
        every = step["ts"].drop_nulls().median()
        if isinstance(every, timedelta) and every.total_seconds() > 0:
            key = "_bin"
            us = max(1, int(every.total_seconds() * 1e6))
            traffic = traffic.with_columns(pl.col("ts").dt.truncate(f"{us}us").alias("_bin"))
    load = (
        traffic.group_by("host", "uplink", key, "_bus")
        .agg(pl.col("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second", "capacity").mean())
        .group_by("host", "uplink", key)
        .agg(
            (
                pl.max_horizontal(
                    pl.col("pcie_tx_bytes_per_second").sum(),
                    pl.col("pcie_rx_bytes_per_second").sum(),
                )
                / pl.col("capacity").first()
            ).alias("ratio")
        )
    )
    rows = phase.filter(pl.col("phase") == "optimizer").select("rank", "step", "host", "ts", bus)
    if key == "_bin":
        rows = rows.with_columns(pl.col("ts").dt.truncate(f"{us}us").alias("_bin"))
    return (
        rows.join(links.select("host", "_bus", "uplink"), on=["host", "_bus"])
        .join(load, on=["host", "uplink", key])
        .group_by("rank", "step", "uplink")
        .agg(pl.col("ratio").median())
        .sort("ratio", descending=True)
        .group_by("rank", "step", maintain_order=True)
        .agg(pl.col("uplink").first(), pl.col("ratio").first().alias("uplink_ratio"))
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
        saturated = _saturated()
        marked = metric.with_columns(
            (saturated & (pl.col("inflation") >= MIN_INFLATION)).alias("hit"),
            saturated.alias("mild"),
        )
        per_rank = marked.group_by("rank").agg(
            pl.col("host").first(),
            pl.col("hit").sum().alias("hits"),
            pl.col("mild").sum().alias("saturated"),
            pl.len().alias("measured"),
        )
        hit = (pl.col("hits") >= MIN_STEPS) & (pl.col("hits") >= MIN_SHARE * pl.col("measured"))
        # steady: the link saturated on most of the rank's steps, however long they took
        steady = (pl.col("saturated") >= MIN_STEPS) & (
            pl.col("saturated") >= MILD_SHARE * pl.col("measured")
        )
        candidates = per_rank.filter(hit | steady)
        effects = _host_effects(marked, candidates["rank"])
        strong = effects.filter(pl.col("effect") >= MIN_INFLATION)["host"]
        contended = candidates.filter(hit & pl.col("host").is_in(strong.implode()))["rank"]
        # mild: the host's steady ranks, their saturated phases longer than the healthy
        # ones by the minimum effect and beyond the noise (``_host_effects``)
        mild_hosts = effects.filter((pl.col("effect") >= MILD_INFLATION) & (pl.col("z") >= MILD_Z))[
            "host"
        ]
        warned = candidates.filter(pl.col("rank").is_in(contended.implode()))["host"]
        mild = candidates.filter(
            ~pl.col("host").is_in(warned.implode()) & pl.col("host").is_in(mild_hosts.implode())
        )["rank"]
        if marked.filter(~saturated).height < MIN_STEPS:  # no healthy baseline measured
            mild = mild.clear()
        world = ctx.analysis.identity.world_size or metric["rank"].n_unique()
        step_s = self._step_s(ctx)
        links = uplinks(ctx)
        out: list[Finding] = []
        levels: tuple[tuple[pl.Series, str, Severity], ...] = (
            (contended, "hit", "warning"),
            (mild, "mild", "info"),
        )
        for ranks, flag, level in levels:
            hits = marked.filter(pl.col(flag) & pl.col("rank").is_in(ranks.implode()))
            for (host,), part in hits.group_by("host", maintain_order=True):
                if level == "info" and any(host in f.hosts for f in out):
                    continue
                out.append(
                    self._finding(
                        ctx, str(host), part, marked, world, step_s, offload, links, level
                    )
                )
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
        links: pl.DataFrame,
        level: Severity,
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
        shared = _shared_links(part, links, host, ranks=gpus)
        own_share = (part["pcie_ratio"] >= SATURATED).mean()
        own_saturated = isinstance(own_share, float) and own_share >= 0.5
        saturated_link = "uplink" if shared and not own_saturated else "own"
        who = f"rank{'s' if len(ranks) > 1 else ''} {ranks_text(ranks)}"
        if saturated_link == "uplink":
            desc = "; ".join(
                f"the PCIe switch uplink {x['link']} ({_gen_text(x)}) shared by GPUs "
                f"{', '.join(x['gpus'])} ran at {x['load_ratio']:.0%} of its capacity"
                for x in shared
            )
            where = (
                f"{who}: {desc} while each GPU's own link read {ratio:.0%}, during the "
                "optimizer step"
            )
        else:
            where = (
                f"{who} ran their GPUs' PCIe links at {ratio:.0%} of capacity during the "
                "optimizer step"
            )
        mild = level == "info"
        msg = (
            f"{'mild ' if mild else ''}PCIe contention on {host} (ZeRO offload of the "
            f"{' and '.join(sorted(offload))} to {'/'.join(sorted(set(offload.values())))}): "
            f"{where}, which took "
            f"{inflation:.2f}x the run's healthy {duration_text(baseline)} in {len(steps)} "
            f"of {measured} steps{share}; everyone waits for them at the next step"
            + ("; host memory ran low or swapped actively" if pressure else "")
        )
        severity: Severity = (
            "info"
            if mild
            else ("critical" if inflation >= _CRITICAL_INFLATION and pressure else "warning")
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
                "saturated_link": saturated_link,
                "shared_links": shared,
                **memory,
                "suggestions": list(_SUGGESTIONS),
            },
            lines=lines,
            cost_gpu_s=round(cost, 3),
        )


def _host_effects(marked: pl.DataFrame, ranks: pl.Series) -> pl.DataFrame:
    """Per host, how much longer its candidate ranks' saturated optimizer phases took
    than the healthy ones, and how far beyond the noise.

    Per step, the median inflation of the host's candidate ranks whose link saturated
    (the step's own noise, shared by a host's ranks, stays in it); ``effect`` is the
    median of those over the steps.  The healthy side is the same per host and step over
    the unsaturated phases.  ``z``: the effect's excess over 1 in robust standard errors
    of the difference of the two medians (1.253 x sigma x sqrt(1/n + 1/m), sigma from
    both sides' deviations, 1.4826 x their MAD), so that a small steady shift over many
    steps stands out of noise that single steps would not.
    """
    schema = {"host": pl.String, "effect": pl.Float64, "z": pl.Float64}
    per_step = ["host", "step"]
    hot = (
        marked.filter(pl.col("mild") & pl.col("rank").is_in(ranks.implode()))
        .group_by(per_step)
        .agg(pl.col("inflation").median())
    )
    cold = marked.filter(~pl.col("mild")).group_by(per_step).agg(pl.col("inflation").median())
    if hot.is_empty():
        return pl.DataFrame(schema=schema)
    healthy = cold["inflation"]
    rows = []
    for (host,), part in hot.group_by("host", maintain_order=True):
        x = part["inflation"]
        effect = _median(x)
        # one spread for both sides (each centred on its own median): more steps to
        # measure the noise by than either side has alone
        residuals = pl.concat([x - effect, healthy - _median(healthy)])
        n_h = max(len(healthy), 1)
        se = _SE_MEDIAN * _spread(residuals) * math.sqrt(1.0 / len(x) + 1.0 / n_h)
        excess = effect - 1.0
        z = excess / se if se > 0 else (math.inf if excess > 0 else 0.0)
        rows.append((str(host), effect, z))
    return pl.DataFrame(rows, schema=schema, orient="row")


def _spread(values: pl.Series) -> float:
    """Robust standard deviation: 1.4826 x the median absolute deviation."""
    if values.is_empty():
        return 0.0
    return 1.4826 * _median((values - _median(values)).abs())


def _gen_text(link: dict[str, Any]) -> str:
    gen, width = link.get("generation"), link.get("width")
    if gen is None or width is None:
        return f"{link['capacity_bytes_per_second'] / 1e9:.1f} GB/s"
    return f"Gen{gen} x{width}"


def _shared_links(
    part: pl.DataFrame, links: pl.DataFrame, host: str, *, ranks: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The uplinks that saturated in the contended steps, each with its GPUs, the ranks
    behind it and its median load; most loaded first."""
    hot = part.filter(pl.col("uplink").is_not_null() & (pl.col("uplink_ratio") >= SATURATED))
    if hot.is_empty() or links.is_empty():
        return []
    rank_of = {str(g["gpu"]): g["rank"] for g in ranks}
    out = []
    per = hot.group_by("uplink").agg(pl.col("uplink_ratio").median(), pl.len().alias("n"))
    for link, load, _n in per.sort("uplink_ratio", descending=True).iter_rows():
        row = links.filter((pl.col("host") == host) & (pl.col("uplink") == link))
        if row.is_empty():
            continue
        first = row.row(0, named=True)
        gpus = [str(g) for g in first["gpus"] or []]
        out.append(
            {
                "link": str(link),
                "gpus": gpus,
                "ranks": sorted(rank_of[g] for g in gpus if g in rank_of),
                "load_ratio": round(float(load), 3),
                "capacity_bytes_per_second": float(first["capacity"]),
                "generation": int(first["generation"]) if first["generation"] else None,
                "width": int(first["width"]) if first["width"] else None,
            }
        )
    return out
