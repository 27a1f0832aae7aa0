"""OOM risk the way PyTorch's caching allocator works.

PyTorch keeps the memory it freed (the cache) and hands it out again; NVML counts the
cache as used.  A healthy job therefore sits flat at 95-99% of the GPU's memory in
NVML's eyes, step after step: a level, however high, says nothing.  What does:

* **a rising floor** (NVML): per GPU and step (per twentieth of the run without a
  timeline), the lowest sample is what stays held between activations; a leak lifts it
  step after step, a cache that warmed up stops.  The floors are fitted with a robust
  line (Theil-Sen: the median of the slopes between every two points), over the whole
  run and over its later half; a trend is steady when Kendall's tau of the floors is at
  least ``_MIN_TAU``, the fitted rise over the run is at least ``_MIN_GROWTH`` of the
  total, and the later half still rises at ``_MIN_RECENT`` of the whole slope (or the
  rise reached the ceiling: peaks at ``_CEILING_RATIO`` of the total, less than one more
  step of the rise left).  Where it
  leads: steps (and seconds, the median step) until the recent peaks reach the total at
  that slope;
* **an out-of-memory that happened**: ``CUDA out of memory. Tried to allocate ...`` in
  either era's wording (tried, total, free, allocated and reserved read), and ``CUDA
  error: out of memory``;
* **what PyTorch itself allocated** (DeepSpeed): ``see_memory_usage``'s ``MA``/``Max_MA``
  and the throughput line's ``MemAllocated``/``MaxMemAllocated`` are tensors, not cache:
  their floor rising is a leak, and a peak near the total (from the telemetry or an OOM
  message) leaves no room for the allocator's fragmentation.

Metric (``OOM_SCHEMA``), per GPU with telemetry: peaks and floors, their robust trends,
steps and seconds to full.  Policy, one finding per host (and one per host for OOMs):
``critical`` when an OOM happened or a steady rise reaches the total within
``CRITICAL_HORIZON_S``; ``warning`` when a steady rise reaches it within ``HORIZON_S``,
or PyTorch's own peak allocation (``Max_MA``) reached ``ALLOCATED_WARNING_RATIO`` of the
total; ``info`` for a steady rise further out.  With offload on, a host whose available
memory stays under ``HOST_LOW`` of its total through the last tenth of the telemetry,
or falls steadily towards zero within ``HORIZON_S``, gets a finding of its own.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
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
from ncclscope.detect.pcie_contention import offload_on
from ncclscope.parsers.torch.lines import CudaOom, parse_cuda_oom

__all__ = [
    "OOM_SCHEMA",
    "FloorTrend",
    "OomRiskDetector",
    "floor_trend",
    "gather_bucket_bytes",
    "gpu_peaks",
    "kendall_tau",
    "oom_metric",
    "theil_sen",
]

HORIZON_S = 3600.0
CRITICAL_HORIZON_S = 600.0
#: PyTorch's own peak allocation (``Max_MA``, tensors only) against the total: above
#: this the allocator has no room left for its rounding and fragmentation.
ALLOCATED_WARNING_RATIO = 0.95
HOST_LOW = 0.05
#: Kendall's tau of the floors against the step: the share of pairs of steps that rise
#: minus those that fall.  A flat cache with noise stays near 0; a warm-up of a few steps
#: in a long run adds little; a leak is near 1.
_MIN_TAU = 0.6
#: The later half's robust slope against the whole run's: a cache that warmed up and
#: stopped has a flat later half.
_MIN_RECENT = 0.5
#: Peaks at or above this share of the total, after a steady rise, are the rise at the
#: ceiling (NVML cannot show more; the job is about to fail).
_CEILING_RATIO = 0.995
_MIN_GROWTH = 0.01  # of the total, fitted over the run: below this, no trend is claimed
_MIN_POINTS = 4
_TIME_BINS = 20  # windows over the run when no timeline gives steps
_MAX_FIT_POINTS = 64  # consecutive windows merged beyond this (Theil-Sen is quadratic)
_PEAK_TAIL = 3  # recent peak: the median of the last windows' peaks
_MIN_HOST_R = 0.9  # host memory: correlation of available memory with time
_BYTES_PER_ELEMENT = 2  # bf16/fp16 parameters are what gets gathered
_GIB = 1 << 30

OOM_SCHEMA = pl.Schema(
    {
        "rank": pl.Int32,
        "host": pl.String,
        "gpu": pl.String,
        "pci_bus_id": pl.String,
        "points": pl.UInt32,  # steps (or time bins) with a sample
        "first_peak_bytes": pl.Float64,
        "last_peak_bytes": pl.Float64,
        "peak_level_bytes": pl.Float64,  # median peak of the last few windows
        "first_floor_bytes": pl.Float64,
        "last_floor_bytes": pl.Float64,
        "total_bytes": pl.Float64,
        "peak_ratio": pl.Float64,  # last peak / total
        "floor_ratio": pl.Float64,  # last floor / total
        "slope_bytes_per_step": pl.Float64,  # Theil-Sen slope of the floors, whole run
        "recent_slope_bytes_per_step": pl.Float64,  # the same over the later half
        "floor_tau": pl.Float64,  # Kendall's tau of the floors with the step
        "trend_r": pl.Float64,  # correlation of the peaks with the step (kept for reading)
        "floor_trend_r": pl.Float64,  # correlation of the floors with the step
        "step_s": pl.Float64,  # median seconds per step (or bin)
        "steady": pl.Boolean,  # a rise the policy believes (see the module docstring)
        "steps_to_full": pl.Float64,  # null when not rising steadily
        "seconds_to_full": pl.Float64,
        "by": pl.String,  # step | time
    }
)


def theil_sen(x: Sequence[float], y: Sequence[float]) -> float | None:
    """The median of the slopes between every two points (robust to a third of outliers).

    >>> theil_sen([0, 1, 2, 3, 4], [10, 12, 14, 99, 18])
    2.0
    """
    slopes = [
        (y[j] - y[i]) / (x[j] - x[i])
        for i in range(len(x))
        for j in range(i + 1, len(x))
        if x[j] != x[i]
    ]
    return statistics.median(slopes) if slopes else None


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's tau-a: (concordant - discordant) pairs over all pairs.

    >>> kendall_tau([0, 1, 2, 3], [1, 2, 3, 4]), kendall_tau([0, 1, 2, 3], [5, 5, 5, 5])
    (1.0, 0.0)
    """
    n = len(x)
    if n < 2:
        return None
    s = 0
    for i in range(n):
        for j in range(i + 1, n):
            d = (x[j] - x[i]) * (y[j] - y[i])
            s += (d > 0) - (d < 0)
    return s / (n * (n - 1) / 2)


def gather_bucket_bytes(ctx: Context) -> int | None:
    """Bytes of one all-gather bucket per the ZeRO config (2 bytes an element)."""
    zero = ctx.analysis.frameworks.zero
    if zero is None:
        return None
    elems = zero.prefetch_bucket_size if zero.stage == 3 else zero.allgather_bucket_size
    if elems is None:
        elems = zero.allgather_bucket_size
    return elems * _BYTES_PER_ELEMENT if elems else None


def gpu_peaks(ctx: Context) -> pl.DataFrame:
    """Per GPU and window (step, or twentieth of the run): peak and floor of memory used."""
    samples = ctx.gpu_samples
    if samples.is_empty() or "memory_used_bytes" not in samples.columns:
        return pl.DataFrame()
    inside = ctx.phase_samples
    if not inside.is_empty() and "memory_used_bytes" in inside.columns:
        per_step = inside.group_by("rank", "step").agg(
            pl.col("host").first(),
            pl.col("gpu").first(),
            pl.col("pci_bus_id").first(),
            pl.col("memory_used_bytes").max().alias("peak"),
            pl.col("memory_used_bytes").min().alias("floor"),
            pl.col("memory_total_bytes").max().alias("total")
            if "memory_total_bytes" in inside.columns
            else pl.lit(None, dtype=pl.Float64).alias("total"),
            pl.col("ts").min().alias("t0"),
        )
        return per_step.with_columns(
            pl.col("step").cast(pl.Float64).alias("x"), pl.lit("step").alias("by")
        )
    lo, hi = samples["ts"].min(), samples["ts"].max()
    if not isinstance(lo, datetime) or not isinstance(hi, datetime) or lo == hi:
        return pl.DataFrame()
    span_us = (hi - lo).total_seconds() * 1e6 / _TIME_BINS
    return (
        samples.with_columns(
            ((pl.col("ts") - lo).dt.total_microseconds() // max(span_us, 1)).alias("x")
        )
        .group_by("host", "gpu", "pci_bus_id", "x")
        .agg(
            pl.col("rank").first(),
            pl.col("memory_used_bytes").max().alias("peak"),
            pl.col("memory_used_bytes").min().alias("floor"),
            pl.col("memory_total_bytes").max().alias("total")
            if "memory_total_bytes" in samples.columns
            else pl.lit(None, dtype=pl.Float64).alias("total"),
            pl.col("ts").min().alias("t0"),
        )
        .with_columns(pl.col("x").cast(pl.Float64), pl.lit("time").alias("by"))
    )


def _merge(
    xs: list[float], ys: list[float], zs: list[float]
) -> tuple[list[float], list[float], list[float]]:
    """At most ``_MAX_FIT_POINTS`` points: consecutive windows merged (mean x, min floor,
    max peak), so the quadratic fits stay cheap on runs of thousands of steps."""
    n = len(xs)
    if n <= _MAX_FIT_POINTS:
        return xs, ys, zs
    k = -(-n // _MAX_FIT_POINTS)
    out: tuple[list[float], list[float], list[float]] = ([], [], [])
    for i in range(0, n, k):
        out[0].append(statistics.fmean(xs[i : i + k]))
        out[1].append(min(ys[i : i + k]))
        out[2].append(max(zs[i : i + k]))
    return out


@dataclass(frozen=True, slots=True)
class FloorTrend:
    """The robust trend of a series of floors (what stays held) and where it leads."""

    slope: float | None  # Theil-Sen, per point, whole series
    recent: float | None  # the same over the later half
    tau: float | None  # Kendall's tau of the floors with x
    level: float  # median of the last peaks
    steady: bool
    steps_to_full: float | None  # points until the peaks reach the total; 0: reached


def floor_trend(
    xs: Sequence[float], floors: Sequence[float], peaks: Sequence[float], total: float | None
) -> FloorTrend:
    """Is the floor rising steadily towards ``total`` (see the module docstring)?

    >>> t = floor_trend([0, 1, 2, 3, 4, 5], [40, 42, 44, 46, 48, 50], [60, 62, 64, 66, 68, 70], 80)
    >>> t.steady, t.slope, t.steps_to_full
    (True, 2.0, 6.0)
    >>> floor_trend([0, 1, 2, 3, 4, 5], [10, 77, 78, 77, 78, 77], [79] * 6, 80).steady
    False
    """
    n = len(xs)
    slope = theil_sen(xs, floors) if n >= 2 else None
    half = n // 2
    recent = theil_sen(xs[half:], floors[half:]) if n - half >= 2 else None
    tau = kendall_tau(xs, floors)
    level = statistics.median(peaks[-_PEAK_TAIL:])
    # the rise the fit claims, not the endpoints' difference (a warm-up at the start
    # would count as growth there)
    growth = (slope or 0.0) * (xs[-1] - xs[0]) / total if total else 0.0
    trend = bool(
        n >= _MIN_POINTS
        and total
        and slope is not None
        and slope > 0
        and (tau or 0.0) >= _MIN_TAU
        and growth >= _MIN_GROWTH
    )
    # A rise that hit the ceiling flattens there: less than one more step of it left,
    # at the very top (a healthy cache stops lower: 95-99%), is the trend reaching
    # the total, not a cache that warmed up.
    at_top = bool(
        trend
        and total
        and slope is not None
        and total - level <= slope
        and level >= _CEILING_RATIO * total
    )
    rising = recent is not None and slope is not None and recent >= _MIN_RECENT * slope
    steady = trend and (rising or at_top)
    steps: float | None = None
    if at_top:
        steps = 0.0
    elif steady and total and slope is not None and recent is not None:
        steps = max(total - level, 0.0) / min(slope, recent)
    return FloorTrend(slope, recent, tau, level, steady, steps)


def _gpu_row(key: tuple[Any, ...], g: dict[str, Any]) -> dict[str, Any]:
    """One GPU's metric row from its windows (sorted by x)."""
    host, gpu, bus = key
    total = g["total"]
    t = floor_trend(*_merge(g["x"], g["floor"], g["peak"]), total)
    slope, recent, tau, level, steady, steps = (
        t.slope, t.recent, t.tau, t.level, t.steady, t.steps_to_full
    )  # fmt: skip
    return {
        "rank": g["rank"],
        "host": host,
        "gpu": gpu,
        "pci_bus_id": bus,
        "points": len(g["x"]),
        "first_peak_bytes": g["peak"][0],
        "last_peak_bytes": g["peak"][-1],
        "peak_level_bytes": level,
        "first_floor_bytes": g["floor"][0],
        "last_floor_bytes": g["floor"][-1],
        "total_bytes": total,
        "peak_ratio": g["peak"][-1] / total if total else None,
        "floor_ratio": g["floor"][-1] / total if total else None,
        "slope_bytes_per_step": slope,
        "recent_slope_bytes_per_step": recent,
        "floor_tau": tau,
        "trend_r": g["trend_r"],
        "floor_trend_r": g["floor_trend_r"],
        "step_s": g["step_s"],
        "steady": steady,
        "steps_to_full": steps,
        "seconds_to_full": steps * g["step_s"] if steps is not None and g["step_s"] else None,
        "by": g["by"],
    }


def oom_metric(ctx: Context) -> pl.DataFrame:
    """Per GPU: peaks and floors, the floors' robust trend, where it leads."""
    peaks = gpu_peaks(ctx)
    if peaks.is_empty():
        return pl.DataFrame(schema=OOM_SCHEMA)
    key = ["host", "gpu", "pci_bus_id"]
    per = (
        peaks.drop_nulls(["peak", "floor"])
        .sort("x")
        .group_by(key)
        .agg(
            pl.col("rank").drop_nulls().first(),
            pl.col("x"),
            pl.col("floor"),
            pl.col("peak"),
            pl.col("total").max(),
            pl.corr("x", "peak").alias("trend_r"),
            pl.corr("x", "floor").alias("floor_trend_r"),
            (
                pl.col("t0").diff().dt.total_microseconds().median()
                / pl.col("x").diff().median()
                / 1e6
            ).alias("step_s"),
            pl.col("by").first(),
        )
    )
    rows = [
        _gpu_row((g["host"], g["gpu"], g["pci_bus_id"]), g)
        for g in per.iter_rows(named=True)
        if g["x"]
    ]
    if not rows:
        return pl.DataFrame(schema=OOM_SCHEMA)
    return pl.DataFrame(rows, schema=OOM_SCHEMA).sort("host", "gpu")


def _host_metric(ctx: Context) -> list[dict[str, Any]]:
    """Per host: available memory at the end and its trend (with offload on only)."""
    tel = ctx.telemetry
    if tel.is_empty() or offload_on(ctx) is None:
        return []
    avail = tel.filter(pl.col("metric") == "ncclscope_host_memory_available_bytes")
    total = (
        tel.filter(pl.col("metric") == "ncclscope_host_memory_total_bytes")
        .group_by("host")
        .agg(pl.col("value").max().alias("total"))
    )
    if avail.is_empty() or total.is_empty():
        return []
    secs = (pl.col("ts") - pl.col("ts").min()).dt.total_microseconds() / 1e6
    per = (
        avail.with_columns(secs.over("host").alias("t"))
        .with_columns((pl.col("t") >= pl.col("t").max().over("host") * 0.9).alias("tail"))
        .group_by("host")
        .agg(
            pl.col("value").filter(pl.col("tail")).median().alias("tail_avail"),
            pl.col("value").last().alias("last_avail"),
            (pl.cov("t", "value") / pl.col("t").var()).alias("slope"),
            pl.corr("t", "value").alias("r"),
            pl.len().alias("points"),
        )
        .join(total, on="host")
    )
    return per.sort("host").to_dicts()


def _gpu_total(ctx: Context) -> int | None:
    """The GPUs' memory from the telemetry (the largest, when they differ)."""
    tel = ctx.analysis.telemetry
    if tel.is_empty():
        return None
    total = tel.filter(pl.col("metric") == "ncclscope_gpu_memory_total_bytes")["value"].max()
    return int(total) if isinstance(total, int | float) and total > 0 else None


def _ooms(ctx: Context) -> list[dict[str, Any]]:
    """Every ``CUDA out of memory`` the logs hold, with its figures, in file order."""
    ev = ctx.analysis.frameworks.torch_events
    if ev.is_empty():
        return []
    out = []
    seen: set[tuple[Any, ...]] = set()
    rows = ev.filter(pl.col("kind") == "cuda_oom").sort("file_id", "line_no")
    for r in rows.iter_rows(named=True):
        oom = parse_cuda_oom(r["message"] or "") or CudaOom(None, None, None, None, None, None)
        # the same error is printed again (traceback, torchelastic's error file, the
        # launcher's summary): one entry per process and figures
        key = (r["file_id"], r["host"], r["global_rank"], oom)
        if key not in seen:
            seen.add(key)
            out.append({**r, "oom": oom})
    return out


def _num(v: float | None, nd: int = 3) -> float | None:
    return round(v, nd) if v is not None else None


def _size(v: float | None) -> str:
    return f"{v / _GIB:.2f} GiB" if v is not None else "?"


@register
class OomRiskDetector:
    """GPUs whose memory floor rises towards the total, OOMs that happened, PyTorch's own
    allocation near the total; hosts running out with offload."""

    name = "oom_risk"

    def metric(self, ctx: Context) -> pl.DataFrame:
        if ctx.analysis.telemetry.is_empty():
            return pl.DataFrame(schema=OOM_SCHEMA)
        return oom_metric(ctx)

    def policy(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        out: list[Finding] = []
        bucket = gather_bucket_bytes(ctx)
        ooms = _ooms(ctx)
        out += self._oom_findings(ooms)
        total = _gpu_total(ctx) or next(
            (o["oom"].total_bytes for o in ooms if o["oom"].total_bytes), None
        )
        ds = self._allocated_finding(ctx, total)
        if ds is not None:
            out.append(ds)
        by_host: dict[str, list[dict[str, Any]]] = {}
        for r in metric.iter_rows(named=True):
            level = self._level(r)
            if level is not None:
                by_host.setdefault(r["host"], []).append({**r, "severity": level})
        for host, rows in by_host.items():
            out.append(self._gpu_finding(host, rows, bucket))
        for h in _host_metric(ctx):
            finding = self._host_finding(h, offload_on(ctx) or {})
            if finding is not None:
                out.append(finding)
        return out

    @staticmethod
    def _level(r: dict[str, Any]) -> Severity | None:
        """A steady rise of the floor, by where it leads; a level alone is no risk (the
        allocator's cache keeps NVML's figure near the total on healthy jobs)."""
        if not r["steady"]:
            return None
        secs = r["seconds_to_full"]
        if secs is not None and secs <= CRITICAL_HORIZON_S:
            return "critical"
        if secs is not None and secs <= HORIZON_S:
            return "warning"
        return "info"

    @staticmethod
    def _gpu_finding(host: str, rows: list[dict[str, Any]], bucket: int | None) -> Finding:
        rows.sort(key=lambda r: (r["seconds_to_full"] or float("inf"), -(r["floor_ratio"] or 0)))
        worst = rows[0]
        ranks = sorted(int(r["rank"]) for r in rows if r["rank"] is not None)
        who = f"rank{'s' if len(ranks) > 1 else ''} {ranks_text(ranks)}" if ranks else "GPUs"
        by = worst["by"]
        msg = (
            f"GPU memory rising on {host} ({who}): the floor between activations grew "
            f"{_size(worst['first_floor_bytes'])} -> {_size(worst['last_floor_bytes'])} "
            f"(+{worst['slope_bytes_per_step'] / _GIB:.2f} GiB per {by}, robust fit), "
            f"peaks at {_size(worst['peak_level_bytes'])} of {_size(worst['total_bytes'])}"
        )
        if worst["steps_to_full"] is not None:
            left = (
                f"full within the next {by}"
                if worst["steps_to_full"] < 1
                else f"full in ~{worst['steps_to_full']:.0f} {by}s"
            )
            when = worst["seconds_to_full"]
            msg += f": {left}" + (f" ({duration_text(when)})" if when is not None else "")
        if bucket is not None:
            msg += f"; one all-gather bucket needs {bucket / _GIB:.2f} GiB"
        order: tuple[Severity, ...] = ("info", "warning", "critical")
        severity = max((r["severity"] for r in rows), key=order.index)
        return Finding(
            kind="oom_risk",
            severity=severity,
            message=msg,
            ranks=ranks,
            hosts=[host],
            evidence={
                "resource": "gpu",
                "signal": "nvml",
                "gather_bucket_bytes": bucket,
                "gpus": [
                    {
                        "rank": r["rank"],
                        "gpu": r["gpu"],
                        "pci_bus_id": r["pci_bus_id"],
                        "peak_bytes": int(r["last_peak_bytes"]),
                        "floor_bytes": int(r["last_floor_bytes"]),
                        "total_bytes": int(r["total_bytes"]),
                        "peak_ratio": _num(r["peak_ratio"], 4),
                        "floor_ratio": _num(r["floor_ratio"], 4),
                        "slope_bytes_per_step": _num(r["slope_bytes_per_step"], 0),
                        "recent_slope_bytes_per_step": _num(r["recent_slope_bytes_per_step"], 0),
                        "floor_tau": _num(r["floor_tau"]),
                        "trend_r": _num(r["trend_r"]),
                        "steps_to_full": _num(r["steps_to_full"], 1),
                        "seconds_to_full": _num(r["seconds_to_full"], 1),
                        "points": r["points"],
                        "by": by,
                    }
                    for r in rows
                ],
            },
        )

    @staticmethod
    def _oom_findings(ooms: list[dict[str, Any]]) -> list[Finding]:
        """One critical finding per host whose processes ran out of GPU memory."""
        by_host: dict[str | None, list[dict[str, Any]]] = {}
        for o in ooms:
            by_host.setdefault(o["host"], []).append(o)
        out = []
        for host, rows in by_host.items():
            ranks = sorted({int(o["global_rank"]) for o in rows if o["global_rank"] is not None})
            first: CudaOom = rows[0]["oom"]
            where = f" on {host}" if host else ""
            who = f" (rank{'s' if len(ranks) > 1 else ''} {ranks_text(ranks)})" if ranks else ""
            msg = f"CUDA out of memory{where}{who}"
            if first.tried_bytes is not None:
                msg += f": tried to allocate {_size(first.tried_bytes)}"
                if first.free_bytes is not None and first.total_bytes is not None:
                    msg += f" with {_size(first.free_bytes)} free of {_size(first.total_bytes)}"
                if first.allocated_bytes is not None:
                    msg += f"; PyTorch had {_size(first.allocated_bytes)} allocated"
                    if first.reserved_bytes is not None:
                        msg += f", {_size(first.reserved_bytes)} reserved"
                        cached = first.reserved_bytes - first.allocated_bytes
                        if cached >= first.tried_bytes:
                            # the cache held enough, in pieces too small: fragmentation
                            msg += (
                                f" ({_size(cached)} cached but unallocated, more than the "
                                "request: fragmentation; PYTORCH_CUDA_ALLOC_CONF="
                                "expandable_segments:True may help)"
                            )
            out.append(
                Finding(
                    kind="oom_risk",
                    severity="critical",
                    message=msg,
                    ranks=ranks,
                    hosts=[host] if host else [],
                    evidence={
                        "resource": "gpu",
                        "signal": "cuda_oom",
                        "ooms": [
                            {
                                "rank": o["global_rank"],
                                "gpu": o["oom"].gpu,
                                "tried_bytes": o["oom"].tried_bytes,
                                "total_bytes": o["oom"].total_bytes,
                                "free_bytes": o["oom"].free_bytes,
                                "allocated_bytes": o["oom"].allocated_bytes,
                                "reserved_bytes": o["oom"].reserved_bytes,
                            }
                            for o in rows
                        ],
                    },
                    lines=[LineRef(int(o["file_id"]), int(o["line_no"])) for o in rows[:8]],
                )
            )
        return out

    @staticmethod
    def _allocated_finding(ctx: Context, total: int | None) -> Finding | None:
        """DeepSpeed's own figures (tensors allocated, not cache) against the total."""
        fw = ctx.analysis.frameworks
        # A series is one point of the step reported again and again: the throughput
        # line of each file, or a see_memory_usage label printed every step.  The init
        # reports (one per label, each higher than the last) are no trend.
        mem = fw.memory.select(
            "file_id", "line_no", "ts",
            pl.col("label").fill_null("").alias("series"),
            pl.col("allocated_bytes").alias("floor"), pl.col("max_allocated_bytes").alias("peak"),
        )  # fmt: skip
        tput = fw.throughput.select(
            "file_id", "line_no", "ts",
            pl.lit("\x00throughput").alias("series"),
            pl.col("mem_allocated_bytes").alias("floor"),
            pl.col("max_mem_allocated_bytes").alias("peak"),
        )  # fmt: skip
        both = pl.concat([mem, tput]).drop_nulls(["floor", "peak"]).sort("file_id", "line_no")
        if both.is_empty() or not total:
            return None
        per_file = []
        for (file_id, _), g in both.group_by("file_id", "series"):
            floors = [float(v) for v in g["floor"]]
            peaks = [float(v) for v in g["peak"]]
            xs = [float(i) for i in range(len(floors))]
            ts = [t for t in g["ts"] if t is not None]
            gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(ts)]
            step_s = statistics.median(gaps) if gaps else None
            trend = floor_trend(xs, floors, peaks, total)
            slope, steady = trend.slope, trend.steady
            peak = max(peaks)
            left = None
            if trend.steps_to_full is not None and step_s:
                left = trend.steps_to_full * step_s
            severity: Severity | None = None
            if left is not None and left <= CRITICAL_HORIZON_S:
                severity = "critical"
            elif peak >= ALLOCATED_WARNING_RATIO * total or (
                left is not None and left <= HORIZON_S
            ):
                severity = "warning"
            elif steady:
                severity = "info"
            if severity is not None:
                per_file.append((severity, int(file_id), g, peak, slope, left, steady))
        if not per_file:
            return None
        order: tuple[Severity, ...] = ("info", "warning", "critical")
        per_file.sort(key=lambda t: -order.index(t[0]))
        severity, file_id, g, peak, slope, left, steady = per_file[0]
        msg = (
            f"PyTorch's own allocation (DeepSpeed MA/Max_MA) peaks at {_size(peak)} of "
            f"{_size(total)} ({peak / total:.0%})"
        )
        if steady and slope is not None:
            msg += f"; what stays allocated rises {slope / _GIB:.2f} GiB per report"
            if left is not None:
                msg += f": full in ~{duration_text(left)}"
        return Finding(
            kind="oom_risk",
            severity=severity,
            message=msg,
            evidence={
                "resource": "gpu",
                "signal": "deepspeed",
                "max_allocated_bytes": int(peak),
                "total_bytes": int(total),
                "allocated_ratio": _num(peak / total, 4),
                "allocated_slope_bytes_per_report": _num(slope, 0) if steady else None,
                "seconds_to_full": _num(left, 1),
            },
            lines=[LineRef(file_id, int(g["line_no"][-1]))],
        )

    @staticmethod
    def _host_finding(h: dict[str, Any], offload: dict[str, str]) -> Finding | None:
        total = h["total"] or 0
        if not total or h["tail_avail"] is None:
            return None
        low = h["tail_avail"] < HOST_LOW * total
        secs = None
        if (h["slope"] or 0) < 0 and (h["r"] or 0) <= -_MIN_HOST_R:
            secs = h["last_avail"] / -h["slope"]
        falling = secs is not None and secs <= HORIZON_S
        if not (low or falling):
            return None
        msg = (
            f"host memory of {h['host']} running out with ZeRO offload on: "
            f"{h['tail_avail'] / _GIB:.1f} of {total / _GIB:.0f} GiB available"
            + (f", gone in ~{duration_text(secs)} at this rate" if falling and secs else "")
        )
        return Finding(
            kind="oom_risk",
            severity=("critical" if low and falling else "warning"),
            message=msg,
            hosts=[h["host"]],
            evidence={
                "resource": "host",
                "offload": offload,
                "host_memory_available_bytes": int(h["tail_avail"]),
                "host_memory_total_bytes": int(total),
                "host_memory_slope_bytes_per_second": round(h["slope"] or 0.0, 1),
                "seconds_to_exhaustion": round(secs, 1) if secs is not None else None,
            },
        )
