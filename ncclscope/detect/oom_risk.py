"""OOM risk: GPU memory peaks closing in on the total, and host memory running out with
offload on.

Metric (``OOM_SCHEMA``), per GPU with telemetry: its memory peak per training step (the
highest sample inside the step's phases, ``ncclscope.timeline``; per tenth of the run
where no timeline could be built), the total, the trend of the peaks (least-squares
bytes per step) and where it leads (steps and seconds until the peak reaches the total),
and the headroom left against the all-gather bucket of the ZeRO config (stage 3: the
prefetch bucket; stage 1/2: the all-gather bucket; 2 bytes an element), the size of
the next gather that has to fit.

Policy, per GPU: ``critical`` when the last peak is at or above ``CRITICAL_RATIO`` of the
total, or a steady rise reaches the total within ``CRITICAL_HORIZON_S``; ``warning`` at
``WARNING_RATIO``, when the headroom is smaller than one all-gather bucket, or when a steady
rise (correlation >= ``_MIN_TREND_R``, of the peaks and of each step's lowest sample
alike, at least ``_MIN_GROWTH`` of the total over the run)
reaches the total within ``HORIZON_S``.  One finding per host, its GPUs at risk listed.
With offload on, a host whose available memory stays under ``HOST_LOW`` of its total
through the last tenth of the telemetry, or falls steadily towards zero within
``HORIZON_S``, gets a finding of its own.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import polars as pl

from ncclscope.detect.base import Finding, Severity, duration_text, ranks_text, register
from ncclscope.detect.context import Context
from ncclscope.detect.pcie_contention import offload_on

__all__ = ["OOM_SCHEMA", "OomRiskDetector", "gather_bucket_bytes", "gpu_peaks", "oom_metric"]

WARNING_RATIO = 0.90
CRITICAL_RATIO = 0.97
HORIZON_S = 3600.0
CRITICAL_HORIZON_S = 600.0
HOST_LOW = 0.05
_MIN_TREND_R = 0.9
_MIN_GROWTH = 0.02
_MIN_POINTS = 4
_BYTES_PER_ELEMENT = 2  # bf16/fp16 parameters are what gets gathered

OOM_SCHEMA = pl.Schema(
    {
        "rank": pl.Int32,
        "host": pl.String,
        "gpu": pl.String,
        "pci_bus_id": pl.String,
        "points": pl.UInt32,  # steps (or time bins) with a peak
        "first_peak_bytes": pl.Float64,
        "last_peak_bytes": pl.Float64,
        "total_bytes": pl.Float64,
        "peak_ratio": pl.Float64,  # last peak / total
        "slope_bytes_per_step": pl.Float64,
        "trend_r": pl.Float64,  # correlation of peak with step
        # correlation of each step's lowest sample with step: a leak lifts the floor too,
        # while sampling that drifts against the step's activation peak lifts only peaks
        "floor_trend_r": pl.Float64,
        "step_s": pl.Float64,  # median seconds per step (or bin)
        "steps_to_full": pl.Float64,  # null when not rising
        "seconds_to_full": pl.Float64,
        "by": pl.String,  # step | time
    }
)


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
    """Per GPU and point (step, or tenth of the run): peak memory used and the total."""
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
    span_us = (hi - lo).total_seconds() * 1e6 / 10
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


def oom_metric(ctx: Context) -> pl.DataFrame:
    """Per GPU: last peak against the total, the trend of the peaks, time to full."""
    peaks = gpu_peaks(ctx)
    if peaks.is_empty():
        return pl.DataFrame(schema=OOM_SCHEMA)
    key = ["host", "gpu", "pci_bus_id"]
    per = (
        peaks.drop_nulls("peak")
        .sort("x")
        .group_by(key)
        .agg(
            pl.col("rank").drop_nulls().first(),
            pl.len().alias("points"),
            pl.col("peak").first().alias("first_peak_bytes"),
            pl.col("peak").last().alias("last_peak_bytes"),
            pl.col("total").max().alias("total_bytes"),
            (pl.cov("x", "peak") / pl.col("x").var()).alias("slope_bytes_per_step"),
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
    rising = pl.col("slope_bytes_per_step") > 0
    left = (pl.col("total_bytes") - pl.col("last_peak_bytes")) / pl.col("slope_bytes_per_step")
    return (
        per.with_columns(
            (pl.col("last_peak_bytes") / pl.col("total_bytes")).alias("peak_ratio"),
            pl.when(rising).then(left).alias("steps_to_full"),
        )
        .with_columns((pl.col("steps_to_full") * pl.col("step_s")).alias("seconds_to_full"))
        .select(list(OOM_SCHEMA))
        .cast(OOM_SCHEMA)
        .sort("host", "gpu")
    )


def _host_metric(ctx: Context) -> list[dict[str, Any]]:
    """Per host: available memory at the end and its trend (with offload on only)."""
    tel = ctx.analysis.telemetry
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


@register
class OomRiskDetector:
    """GPUs whose memory peaks approach the total; hosts running out with offload."""

    name = "oom_risk"

    def metric(self, ctx: Context) -> pl.DataFrame:
        if ctx.analysis.telemetry.is_empty():
            return pl.DataFrame(schema=OOM_SCHEMA)
        return oom_metric(ctx)

    def policy(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        out: list[Finding] = []
        bucket = gather_bucket_bytes(ctx)
        if not metric.is_empty():
            risky = []
            for r in metric.iter_rows(named=True):
                level = self._level(r, bucket)
                if level is not None:
                    risky.append({**r, "severity": level})
            by_host: dict[str, list[dict[str, Any]]] = {}
            for r in risky:
                by_host.setdefault(r["host"], []).append(r)
            for host, rows in by_host.items():
                out.append(self._gpu_finding(host, rows, bucket))
        for h in _host_metric(ctx):
            finding = self._host_finding(h, offload_on(ctx) or {})
            if finding is not None:
                out.append(finding)
        return out

    @staticmethod
    def _level(r: dict[str, Any], bucket: int | None) -> str | None:
        ratio = r["peak_ratio"]
        if ratio is None:
            return None
        secs = r["seconds_to_full"]
        growth = (r["last_peak_bytes"] - r["first_peak_bytes"]) / (r["total_bytes"] or 1)
        steady = (
            r["points"] >= _MIN_POINTS
            and (r["trend_r"] or 0) >= _MIN_TREND_R
            and growth >= _MIN_GROWTH
            and (r["floor_trend_r"] or 0) >= _MIN_TREND_R
            and secs is not None
        )
        headroom = r["total_bytes"] - r["last_peak_bytes"]
        if ratio >= CRITICAL_RATIO or (steady and secs <= CRITICAL_HORIZON_S):
            return "critical"
        if (
            ratio >= WARNING_RATIO
            or (steady and secs <= HORIZON_S)
            or (bucket is not None and headroom < bucket)
        ):
            return "warning"
        return None

    @staticmethod
    def _gpu_finding(host: str, rows: list[dict[str, Any]], bucket: int | None) -> Finding:
        rows.sort(key=lambda r: (r["seconds_to_full"] or float("inf"), -r["peak_ratio"]))
        worst = rows[0]
        ranks = sorted(int(r["rank"]) for r in rows if r["rank"] is not None)
        who = f"rank{'s' if len(ranks) > 1 else ''} {ranks_text(ranks)}" if ranks else "GPUs"
        gib = 1 << 30
        msg = (
            f"GPU memory at risk on {host} ({who}): peak {worst['last_peak_bytes'] / gib:.1f} of "
            f"{worst['total_bytes'] / gib:.1f} GiB ({worst['peak_ratio']:.0%})"
        )
        if worst["seconds_to_full"] is not None and (worst["trend_r"] or 0) >= _MIN_TREND_R:
            left = (
                f"full within the next {worst['by']}"
                if worst["steps_to_full"] < 1
                else f"full in ~{worst['steps_to_full']:.0f} {worst['by']}s"
            )
            msg += (
                f", rising {worst['slope_bytes_per_step'] / gib:.2f} GiB per {worst['by']}: "
                f"{left} ({duration_text(worst['seconds_to_full'])})"
            )
        if bucket is not None:
            msg += f"; one all-gather bucket needs {bucket / gib:.2f} GiB"
        severity: Severity = (
            "critical" if any(r["severity"] == "critical" for r in rows) else "warning"
        )

        def num(v: float | None, nd: int = 3) -> float | None:
            return round(v, nd) if v is not None else None

        return Finding(
            kind="oom_risk",
            severity=severity,
            message=msg,
            ranks=ranks,
            hosts=[host],
            evidence={
                "resource": "gpu",
                "gather_bucket_bytes": bucket,
                "gpus": [
                    {
                        "rank": r["rank"],
                        "gpu": r["gpu"],
                        "pci_bus_id": r["pci_bus_id"],
                        "peak_bytes": int(r["last_peak_bytes"]),
                        "total_bytes": int(r["total_bytes"]),
                        "peak_ratio": num(r["peak_ratio"], 4),
                        "slope_bytes_per_step": num(r["slope_bytes_per_step"], 0),
                        "trend_r": num(r["trend_r"]),
                        "steps_to_full": num(r["steps_to_full"], 1),
                        "seconds_to_full": num(r["seconds_to_full"], 1),
                        "points": r["points"],
                        "by": r["by"],
                    }
                    for r in rows
                ],
            },
        )

    @staticmethod
    def _host_finding(h: dict[str, Any], offload: dict[str, str]) -> Finding | None:
        total = h["total"] or 0
        if not total or h["tail_avail"] is None:
            return None
        low = h["tail_avail"] < HOST_LOW * total
        secs = None
        if (h["slope"] or 0) < 0 and (h["r"] or 0) <= -_MIN_TREND_R:
            secs = h["last_avail"] / -h["slope"]
        falling = secs is not None and secs <= HORIZON_S
        if not (low or falling):
            return None
        gib = 1 << 30
        msg = (
            f"host memory of {h['host']} running out with ZeRO offload on: "
            f"{h['tail_avail'] / gib:.1f} of {total / gib:.0f} GiB available"
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
