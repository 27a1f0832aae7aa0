"""Telemetry on disk: complete Parquet part files that ``analyze --telemetry`` reads.

The agent buffers its samples and writes a part every ``part_s`` seconds and at exit.
A part is written under a temporary name and renamed into place, so after any crash
(SIGKILL included) every ``part-*.parquet`` in the folder is complete and readable;
the oldest parts are deleted once the folder holds more than ``max_bytes``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta, timezone, tzinfo
from pathlib import Path

import polars as pl

from ncclscope.errors import InputError
from ncclscope.schema import TELEMETRY_SCHEMA
from ncclscope.sources import Problem

__all__ = ["TelemetryWriter", "learned_zone", "read_telemetry", "summary_lines"]

#: The GPU series ``summary_lines`` reads (labelled ``gpu,UUID,pci_bus_id``).
_SUMMARY_METRICS = (
    "ncclscope_gpu_memory_used_bytes",
    "ncclscope_gpu_memory_total_bytes",
    "ncclscope_gpu_pcie_tx_bytes_per_second",
    "ncclscope_gpu_pcie_rx_bytes_per_second",
    "ncclscope_gpu_pcie_link_max_bytes_per_second",
)


@dataclass
class TelemetryWriter:
    """Buffers samples; writes complete parts to ``folder``."""

    folder: Path
    host: str
    part_s: float = 10.0
    max_bytes: int = 256 << 20
    _rows: list[tuple[object, ...]] = field(default_factory=list)
    _last: float = field(default_factory=time.monotonic)
    parts_written: int = 0

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)

    def add(self, ts: object, rows: dict[str, Sequence[tuple[tuple[str, ...], float]]]) -> None:
        """Buffer one tick's rows (metric -> label values and value)."""
        for metric, series in rows.items():
            for labels, value in series:
                self._rows.append((ts, self.host, metric, ",".join(labels), float(value)))

    def maybe_flush(self) -> Path | None:
        """Write a part if ``part_s`` has passed since the last one."""
        if time.monotonic() - self._last < self.part_s:
            return None
        return self.flush()

    def flush(self) -> Path | None:
        """Write what is buffered as one complete part; prune old parts."""
        self._last = time.monotonic()
        if not self._rows:
            return None
        frame = pl.DataFrame(self._rows, schema=TELEMETRY_SCHEMA, orient="row")
        self._rows = []
        name = f"part-{time.time_ns():020d}-{os.getpid()}.parquet"
        tmp = self.folder / f".{name}.tmp"
        frame.write_parquet(tmp, compression="zstd")
        tmp.rename(self.folder / name)  # atomic: a reader never sees half a part
        self.parts_written += 1
        self._prune()
        return self.folder / name

    def _prune(self) -> None:
        parts = sorted(self.folder.glob("part-*.parquet"))
        sizes = [p.stat().st_size for p in parts]
        total = sum(sizes)
        for part, size in zip(parts, sizes, strict=True):
            if total <= self.max_bytes:
                break
            part.unlink(missing_ok=True)
            total -= size


def read_telemetry(paths: Iterable[Path], *, problems: list[Problem] | None = None) -> pl.DataFrame:
    """Every part under ``paths`` (files, or folders searched recursively), in time order.

    A part that cannot be read (truncated, not Parquet, other columns) is left out: with
    ``problems`` it is reported there, one line for people; without, it raises
    :class:`~ncclscope.errors.InputError`.
    """
    files: list[Path] = []
    for path in paths:
        files += sorted(path.rglob("part-*.parquet")) if path.is_dir() else [path]
    frames = []
    for f in files:
        try:
            frames.append(pl.read_parquet(f).select(list(TELEMETRY_SCHEMA)).cast(TELEMETRY_SCHEMA))
        except (pl.exceptions.PolarsError, OSError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            reason = f"telemetry part cannot be read, left out: {first[:200]}"
            if problems is None:
                raise InputError(str(f), reason) from None
            problems.append(Problem(str(f), reason))
    if not frames:
        return pl.DataFrame(schema=TELEMETRY_SCHEMA)
    return pl.concat(frames).sort("ts")


def summary_lines(frame: pl.DataFrame) -> list[str]:
    """A few lines for people: per GPU the peak memory and PCIe traffic against the
    link, and the host's lowest available memory, over the telemetry's span."""
    if frame.is_empty():
        return ["TELEMETRY", "  no samples in the given telemetry", ""]
    first, last = frame["ts"].min(), frame["ts"].max()
    out = ["TELEMETRY", f"  {first!s} .. {last!s}"]
    # Only the per-GPU series shown below: ``gpu_info`` (its ``name``), the per-process
    # and per-XID series carry more labels than the GPU's own and would each make a row
    # of their own with nothing to show.
    per = (
        frame.filter(pl.col("metric").is_in(_SUMMARY_METRICS))
        .with_columns(pl.col("labels").str.split(",").list.first().alias("gpu"))
        .group_by("host", "gpu", "metric")
        .agg(pl.col("value").max())
    )
    if per.is_empty():
        wide = pl.DataFrame(schema={"host": pl.String, "gpu": pl.String})
    else:
        wide = per.pivot(on="metric", index=["host", "gpu"], values="value")
    for r in wide.sort("host", "gpu").iter_rows(named=True):
        gpu = r["gpu"]
        used: float | None = r.get("ncclscope_gpu_memory_used_bytes")
        total: float | None = r.get("ncclscope_gpu_memory_total_bytes")
        tx: float | None = r.get("ncclscope_gpu_pcie_tx_bytes_per_second")
        rx: float | None = r.get("ncclscope_gpu_pcie_rx_bytes_per_second")
        link: float | None = r.get("ncclscope_gpu_pcie_link_max_bytes_per_second")
        parts = [f"  {r['host']} gpu {gpu}:"]
        if used is not None and total:
            parts.append(f"memory peak {used / 2**30:.1f} of {total / 2**30:.1f} GiB")
        if link and (tx is not None or rx is not None):
            peak = max(tx or 0.0, rx or 0.0)
            parts.append(f"PCIe peak {peak / 1e9:.1f} GB/s ({peak / link:.0%} of the link)")
        if len(parts) > 1:
            out.append(" ".join(parts))
    avail = frame.filter(pl.col("metric") == "ncclscope_host_memory_available_bytes")
    lows = avail.group_by("host").agg(pl.col("value").min()).sort("host")
    for host, low in lows.iter_rows():
        out.append(f"  {host}: host memory available at least {low / 2**30:.1f} GiB")
    out.append("")
    return out


def learned_zone(samples: pl.DataFrame) -> tzinfo | None:
    """The job's clock as the agent learned it (``ncclscope_log_utc_offset_seconds``,
    the latest sample): a fixed offset from UTC; None where no agent learned one."""
    offsets = samples.filter(pl.col("metric") == "ncclscope_log_utc_offset_seconds").sort("ts")
    if offsets.is_empty():
        return None
    return timezone(timedelta(seconds=float(offsets["value"][-1])))
