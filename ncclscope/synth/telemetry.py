"""What ``ncclscope agent --out`` would have sampled beside a synthetic job.

``ncclscope synth --telemetry`` writes, next to the logs, a ``telemetry/`` folder of
Parquet parts in the agent's format (``TELEMETRY_SCHEMA``, long format, one part per
host and ``PART_S`` seconds, named as the agent names them), for the job's timeline:

* per GPU (labels ``gpu,UUID,pci_bus_id``; ``pci_bus_id`` is the NCCL init lines'
  ``busId`` in NVML's spelling, ``18000`` -> ``00000000:18:00.0``): memory used and
  total, utilisation, PCIe TX/RX and the link's capacity (gen 4 x16);
* per host: memory total and available, swap used, swap in/out counters.

Time model, per rank, from the generator's true enqueue times of each step's first and
last collective: compute (forward and backward) from the first to the last, the optimizer
step from the last to the next step's first.  Samples carry the host's clock (true time
plus the host's offset), as the agent on that host would stamp them.

* PCIe: little traffic without offload; with optimizer offload, gradients go to the host
  in backward (TX ~25%) and updated parameters come back during the optimizer step
  (RX 30-55%, TX 10-20%; behind a switch of k GPUs, 1/k of that each, so that a healthy
  job's demand fits the uplink they share); on a contended host, during the contended
  steps' optimizer phase, TX/RX run at 85-97% of the link.  Contention behind a switch
  (``contention_switch``): the uplink is the bottleneck, so the GPUs behind it together
  carry what a Gen4 x16 link delivers, ``UPLINK_DELIVERS_BYTES_PER_S`` (about 25 GB/s,
  +-4% per sample), split among them (+-8% each): each own link reads about 1/k of that.
  Parameter offload adds RX in forward/backward.
* Topology, every sample as the agent sends it: ``ncclscope_gpu_pcie_uplink_info`` per
  GPU (its switch's upstream port, ``0000:80:00.0`` for switch 0; a direct-attached GPU
  names itself) and per uplink its generation (4), width (16), capacity and GPUs.
* GPU memory: a base plus activations that rise through forward and fall through
  backward; a growing rank adds ``growth_bytes_per_step`` per step.  With
  ``cache_ratio``, as PyTorch's caching allocator shows it to NVML: each GPU climbs
  through its first step to a level drawn within the bounds (95-99% of the total, say)
  and stays there, freed activations kept in the cache; a growing rank's memory rises
  above that level only once what it holds outgrows the cache.
* Host memory: 55-70% available; a contended host (with ``memory_pressure``) drops to
  2-4% and swaps during its contended steps.  ``idle_swap_bytes``: swap in use on every
  host from the start, its counters flat.  Host names carry ``domain`` when set.

The ground truth (returned, and written by the generator into ``truth.json`` under
``telemetry``) names the folder, the hosts, each GPU and the injected conditions.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from ncclscope.schema import TELEMETRY_SCHEMA

__all__ = [
    "GPU_TOTAL_BYTES",
    "HOST_TOTAL_BYTES",
    "LINK_BYTES_PER_S",
    "TELEMETRY_DIR",
    "UPLINK_DELIVERS_BYTES_PER_S",
    "TelemetryJob",
    "nvml_bus_id",
    "write_telemetry",
]

TELEMETRY_DIR = "telemetry"
#: An 80 GB H100's memory as NVML reports it (81,559 MiB).
GPU_TOTAL_BYTES = 81_559 << 20
#: One direction of a PCIe gen 4 x16 link (what the agent computes from NVML).
LINK_BYTES_PER_S = 16.0e9 * 16 * 128 / 130 / 8
#: The invented hosts' memory (``synth._HOST_RAM_GB``).
HOST_TOTAL_BYTES = int(2015.56 * (1 << 30))
#: What a Gen4 x16 link delivers per direction as payload when saturated (of 31.5 GB/s raw).
UPLINK_DELIVERS_BYTES_PER_S = 25.0e9
#: Seconds of samples per part, as the agent's default.
PART_S = 10.0


def nvml_bus_id(nccl_bus: str) -> str:
    """NCCL's ``busId`` (hex digits of ``domain:bus:device.function``) in NVML's spelling.

    >>> nvml_bus_id("18000"), nvml_bus_id("2a000"), nvml_bus_id("108000")
    ('00000000:18:00.0', '00000000:2A:00.0', '00000001:08:00.0')
    """
    v = int(nccl_bus, 16)
    return f"{v >> 20:08X}:{(v >> 12) & 0xFF:02X}:{(v >> 4) & 0xFF:02X}.{v & 0xF:X}"


@dataclass(frozen=True)
class TelemetryJob:
    """The generator's facts the telemetry follows (times are true POSIX seconds)."""

    hosts: list[str]
    host_offsets: list[float]
    rank_host: list[int]
    rank_local: list[int]
    rank_bus: list[str]
    #: per step, every rank's enqueue time of the step's first collective, and when its
    #: optimizer step starts (the collective before it) and ends (the one after it)
    step_first: list[list[float]]
    opt_start: list[list[float]]
    opt_end: list[list[float]]
    t_start: float
    t_end: float
    interval_s: float
    offload_optimizer: bool
    offload_param: bool
    contention_hosts: list[str]
    #: 0-based steps whose optimizer phase was contended
    contended_steps: list[int]
    inflation: float
    growth_ranks: list[int]
    growth_bytes_per_step: int
    seed: int
    #: PyTorch's caching allocator: the bounds (shares of the total) of the level NVML's
    #: "used" sits at once the cache warmed up; ``None``: memory follows the activations
    cache_ratio: tuple[float, float] | None = None
    #: GPUs behind each PCIe switch (1: each on a root port of its own)
    gpus_per_switch: int = 1
    #: contention on this switch's uplink only (None: every GPU's own link)
    contention_switch: int | None = None
    #: a contended host's memory runs low and it swaps
    memory_pressure: bool = True
    #: swap in use from the start, counters flat
    idle_swap_bytes: int = 0
    #: the telemetry's host names are ``<host>.<domain>``
    domain: str = ""


def _uuid(host: int, local: int, seed: int) -> str:
    rnd = random.Random(seed * 1_000_003 + host * 101 + local)
    h = f"{rnd.getrandbits(128):032x}"
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def uplink_id(local: int, bus: str, per_switch: int) -> str:
    """The uplink above a GPU as the agent names it (sysfs spelling): its switch's
    upstream port, or the GPU itself when direct-attached.

    >>> uplink_id(5, "00000000:9A:00.0", 4), uplink_id(5, "00000000:9A:00.0", 1)
    ('0000:82:00.0', '0000:9a:00.0')
    """
    if per_switch > 1:
        return f"0000:{0x80 + 2 * (local // per_switch):02x}:00.0"
    domain, _, rest = bus.lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}"


def _phase_at(
    t: float, first: float, starts: list[float], ends: list[float]
) -> tuple[int, str, float]:
    """(step, phase, progress 0-1 through the phase) of one rank at true time ``t``;
    step -1 outside the steps.  Compute runs from the step's first collective (or the
    previous optimizer step's end) to its optimizer step."""
    k = bisect.bisect_right(starts, t) - 1
    if k >= 0 and t < ends[k]:
        return k, "optimizer", (t - starts[k]) / max(ends[k] - starts[k], 1e-9)
    lo = ends[k] if k >= 0 else first
    if k + 1 >= len(starts) or t < lo:
        return -1, "idle", 0.0
    return k + 1, "compute", (t - lo) / max(starts[k + 1] - lo, 1e-9)


def write_telemetry(job: TelemetryJob, out_dir: Path) -> dict[str, Any]:
    """Write the parts under ``out_dir/telemetry``; return the ground truth.

    Raises:
        ValueError: the job completed no step (nothing to sample).
    """
    folder = out_dir / TELEMETRY_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("part-*.parquet"):
        old.unlink()
    if not job.opt_end or not job.step_first:
        # The phased model samples steps: a job that ended before its first optimizer
        # step has none to sample.
        msg = (
            "--telemetry needs at least one completed step, and this job ends before its "
            "first (a fault at an early instance): move the fault later or drop --telemetry"
        )
        raise ValueError(msg)
    rnd = random.Random(job.seed * 7919 + 11)
    n = len(job.rank_host)
    starts = [[job.opt_start[k][r] for k in range(len(job.opt_start))] for r in range(n)]
    ends = [[job.opt_end[k][r] for k in range(len(job.opt_end))] for r in range(n)]
    end = max(max(row) for row in job.opt_end)
    t0 = min(job.step_first[0]) - 2.0
    t1 = end + 2.0
    contended = set(job.contention_hosts)
    c_steps = set(job.contended_steps)
    growth = set(job.growth_ranks)
    base_mem = [rnd.uniform(0.40, 0.55) * GPU_TOTAL_BYTES for _ in range(n)]
    act = [rnd.uniform(0.06, 0.12) * GPU_TOTAL_BYTES for _ in range(n)]
    lo, hi = job.cache_ratio or (0.0, 0.0)
    cache = [rnd.uniform(lo, hi) * GPU_TOTAL_BYTES for _ in range(n)]
    warm = [False] * n  # the rank's cache reached its level (after its first step)
    gpus: list[dict[str, Any]] = []
    k_sw = job.gpus_per_switch
    names = [f"{h}.{job.domain}" if job.domain else h for h in job.hosts]
    for r in range(n):
        h = job.rank_host[r]
        bus = nvml_bus_id(job.rank_bus[r])
        gpus.append(
            {
                "rank": r,
                "host": names[h],
                "gpu": job.rank_local[r],
                "uuid": _uuid(h, job.rank_local[r], job.seed),
                "pci_bus_id": bus,
                "uplink": uplink_id(job.rank_local[r], bus, k_sw),
                "switch": job.rank_local[r] // k_sw,
            }
        )
    links: dict[tuple[int, str], int] = {}
    for r, g in enumerate(gpus):
        links[(job.rank_host[r], g["uplink"])] = links.get((job.rank_host[r], g["uplink"]), 0) + 1

    def hot_gpu(r: int) -> bool:
        return job.contention_switch is None or gpus[r]["switch"] == job.contention_switch

    rows: list[tuple[datetime, str, str, str, float]] = []
    ticks = int((t1 - t0) / job.interval_s) + 1
    swap: dict[int, float] = dict.fromkeys(range(len(job.hosts)), float(job.idle_swap_bytes))
    swapped_in: dict[int, float] = dict.fromkeys(range(len(job.hosts)), 5e8)
    swapped_out: dict[int, float] = dict.fromkeys(range(len(job.hosts)), 9e8)
    for i in range(ticks):
        t = t0 + i * job.interval_s
        host_phase: dict[int, bool] = {}  # host -> some rank in a contended optimizer phase
        # what each contended uplink delivers at this sample, shared by its GPUs
        delivers: dict[tuple[int, str], float] = {}
        for r in range(n):
            h = job.rank_host[r]
            k, phase, frac = _phase_at(t, job.step_first[0][r], starts[r], ends[r])
            hot = phase == "optimizer" and job.hosts[h] in contended and k in c_steps and hot_gpu(r)
            host_phase[h] = host_phase.get(h, False) or hot
            ts = datetime.fromtimestamp(t + job.host_offsets[h], UTC)
            g = gpus[r]
            labels = f"{g['gpu']},{g['uuid']},{g['pci_bus_id']}"
            # PCIe: a share of the link per direction
            if hot and job.contention_switch is not None:
                key = (h, g["uplink"])
                if key not in delivers:
                    delivers[key] = UPLINK_DELIVERS_BYTES_PER_S * rnd.uniform(0.96, 1.04)
                each = delivers[key] / k_sw / LINK_BYTES_PER_S
                rx = each * rnd.uniform(0.92, 1.08)
                tx = rx * rnd.uniform(0.85, 0.95)
            elif hot:
                rx, tx = rnd.uniform(0.88, 0.97), rnd.uniform(0.85, 0.95)
            elif phase == "optimizer" and job.offload_optimizer:
                rx, tx = rnd.uniform(0.30, 0.55) / k_sw, rnd.uniform(0.10, 0.20) / k_sw
            elif phase == "compute" and job.offload_optimizer:
                rx = rnd.uniform(0.25, 0.40) if job.offload_param else rnd.uniform(0.02, 0.06)
                tx = rnd.uniform(0.15, 0.30) if frac > 0.35 else rnd.uniform(0.01, 0.04)
                rx, tx = rx / k_sw, tx / k_sw
            else:
                rx, tx = rnd.uniform(0.0, 0.04), rnd.uniform(0.0, 0.03)
            # GPU memory: activations rise through forward, fall through backward
            mem = base_mem[r]
            if phase == "compute":
                mem += act[r] * (frac / 0.35 if frac < 0.35 else (1.0 - frac) / 0.65)
            if r in growth and k >= 0:
                mem += job.growth_bytes_per_step * (k + frac if phase == "compute" else k + 1)
            if job.cache_ratio is not None:
                # freed blocks stay reserved: NVML sees the high-water mark, which the
                # first step lifts to the cache's level and a leak lifts further
                warm[r] = warm[r] or k >= 1
                level = cache[r] if warm[r] else min(cache[r], base_mem[r] + act[r] * (k + 1))
                mem = max(mem, level)
            mem = min(mem * rnd.uniform(0.998, 1.002), GPU_TOTAL_BYTES - (64 << 20))
            util = rnd.uniform(0.85, 0.98) if phase == "compute" else rnd.uniform(0.05, 0.3)
            for metric, value in (
                ("ncclscope_gpu_memory_used_bytes", mem),
                ("ncclscope_gpu_memory_total_bytes", float(GPU_TOTAL_BYTES)),
                ("ncclscope_gpu_utilization_ratio", util),
                ("ncclscope_gpu_pcie_tx_bytes_per_second", tx * LINK_BYTES_PER_S),
                ("ncclscope_gpu_pcie_rx_bytes_per_second", rx * LINK_BYTES_PER_S),
                ("ncclscope_gpu_pcie_link_max_bytes_per_second", LINK_BYTES_PER_S),
            ):
                rows.append((ts, g["host"], metric, labels, float(value)))
            rows.append(
                (ts, g["host"], "ncclscope_gpu_pcie_uplink_info", f"{labels},{g['uplink']}", 1.0)
            )
        for (h, link), behind in links.items():
            ts = datetime.fromtimestamp(t + job.host_offsets[h], UTC)
            for metric, value in (
                ("ncclscope_pcie_uplink_generation", 4.0),
                ("ncclscope_pcie_uplink_width", 16.0),
                ("ncclscope_pcie_uplink_max_bytes_per_second", LINK_BYTES_PER_S),
                ("ncclscope_pcie_uplink_gpus", float(behind)),
            ):
                rows.append((ts, names[h], metric, link, value))
        for h, name in enumerate(names):
            ts = datetime.fromtimestamp(t + job.host_offsets[h], UTC)
            if host_phase.get(h) and job.memory_pressure:
                avail = rnd.uniform(0.02, 0.04) * HOST_TOTAL_BYTES
                grow = rnd.uniform(50e6, 200e6)
                swap[h] = min(swap[h] + grow, 64e9)
                swapped_out[h] += grow
                swapped_in[h] += grow * rnd.uniform(0.5, 1.0)
            else:
                avail = rnd.uniform(0.55, 0.70) * HOST_TOTAL_BYTES
            for metric, value in (
                ("ncclscope_host_memory_total_bytes", float(HOST_TOTAL_BYTES)),
                ("ncclscope_host_memory_available_bytes", avail),
                ("ncclscope_host_swap_used_bytes", swap[h]),
                ("ncclscope_host_swap_in_bytes_total", swapped_in[h]),
                ("ncclscope_host_swap_out_bytes_total", swapped_out[h]),
            ):
                rows.append((ts, name, metric, "", float(value)))
    frame = pl.DataFrame(rows, schema=TELEMETRY_SCHEMA, orient="row")
    _write_parts(frame, folder)
    return {
        "folder": TELEMETRY_DIR,
        "interval_s": job.interval_s,
        "hosts": list(names),
        "gpus": gpus,
        "gpus_per_switch": k_sw,
        "idle_swap_bytes": job.idle_swap_bytes,
        "pcie_link_bytes_per_second": LINK_BYTES_PER_S,
        "gpu_total_bytes": GPU_TOTAL_BYTES,
        # the allocator cache's bounds (shares of the total) when NVML shows one, else None
        "gpu_cache_ratio": list(job.cache_ratio) if job.cache_ratio is not None else None,
        "contention": [
            {
                # the host as NCCL names it (the logs' name; the telemetry's may be longer)
                "host": host,
                "ranks": [
                    r for r in range(n) if job.hosts[job.rank_host[r]] == host and hot_gpu(r)
                ],
                # the generator's 0-based steps whose optimizer step was contended
                "steps": sorted(c_steps),
                "inflation": job.inflation,
                # which link saturated: each GPU's own, or the uplink they share
                "link": "own" if job.contention_switch is None else "uplink",
                "uplink": (
                    uplink_id(job.contention_switch * k_sw, "", k_sw)
                    if job.contention_switch is not None
                    else None
                ),
                "memory_pressure": job.memory_pressure,
            }
            for host in job.contention_hosts
        ],
        "memory_growth": [
            {
                "rank": r,
                "host": gpus[r]["host"],
                "pci_bus_id": gpus[r]["pci_bus_id"],
                "bytes_per_step": job.growth_bytes_per_step,
            }
            for r in sorted(growth)
        ],
    }


def _write_parts(frame: pl.DataFrame, folder: Path) -> None:
    """One part per host and ``PART_S`` seconds, named as the agent names its parts."""
    start = frame["ts"].min()
    if start is None:
        return
    span = (pl.col("ts") - pl.lit(start)).dt.total_seconds() // int(PART_S)
    parts = frame.with_columns(span.alias("_part"))
    hosts = sorted(frame["host"].unique().to_list())
    for (host, part), chunk in parts.group_by("host", "_part", maintain_order=True):
        first = chunk["ts"].min()
        if not isinstance(first, datetime):
            continue
        ns = int(first.timestamp() * 1e9)
        name = f"part-{ns:020d}-{hosts.index(host):05d}-{int(str(part)):04d}.parquet"
        chunk.drop("_part").sort("ts").write_parquet(folder / name, compression="zstd")
