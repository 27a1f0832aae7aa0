"""What a synthetic job's cluster exporters would have measured (issue #29): the rows
``analyze --prometheus`` reads (``ClusterTables``: node_exporter's InfiniBand port
counters, dcgm-exporter's GPU health fields), for the hosts and GPUs of a generated job
(``generate``'s truth), with background noise and injected faults.

Written from the exporters' documentation, not from the detector (it imports none of
its thresholds): what a healthy fabric and healthy GPUs show, and what the faults add.

Healthy, per port and step (an ``increase`` over the step, as ``increase(...[step])``
gives it): a symbol error now and then (``noise`` x a Poisson rate of about one per
port and hour: a BER of 1e-15 or so on an HDR link), nothing on the other error
counters; ``port_transmit_wait`` ticking under the job's load (a few percent of the
time in 8 ns ticks, more at higher ``noise``), a data rate; per GPU and step:
``DCGM_FI_DEV_XID_ERRORS`` 0, ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` flat,
``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` the power cap now and then (``0x4``: busy GPUs
hit it) or nothing, the PCIe link at Gen4 x16.

Faults (``faults``):

* ``PortErrors``: a host's port (``mlx5_<device>``) with symbol errors, link error
  recoveries (and optionally link downs) spread over a window;
* ``PortCongestion``: ports that wait for credits a large share of the time;
* ``GpuThrottle``: a GPU whose clock event reasons carry slowdown bits over a window
  (``0x40`` HW thermal, ``0x8`` HW slowdown, ``0x20`` SW thermal ...);
* ``GpuXid``: an XID (79: fallen off the bus, 48: DBE, 94/95: ECC) at a time, with a
  double-bit ECC count for 48/94/95;
* ``PcieDowntrain``: a GPU's PCIe link trained below x16 (or below Gen4).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl

from ncclscope.cluster.tables import ClusterTables
from ncclscope.model import Built
from ncclscope.schema import GPU_SAMPLES_SCHEMA, PORT_SAMPLES_SCHEMA

__all__ = [
    "ClusterFault",
    "GpuThrottle",
    "GpuXid",
    "PcieDowntrain",
    "PortCongestion",
    "PortErrors",
    "cluster_tables",
    "with_cluster",
]


@dataclass(frozen=True)
class PortErrors:
    """``host``'s port ``mlx5_<device>`` port 1: ``symbol_errors`` symbol errors,
    ``recoveries`` link error recoveries and ``downs`` link downs from ``start`` to
    ``end`` (spread over the steps in between)."""

    host: str
    start: datetime
    end: datetime
    symbol_errors: int = 200
    recoveries: int = 3
    downs: int = 0
    device: int = 0


@dataclass(frozen=True)
class PortCongestion:
    """The ports of ``hosts`` (every host where empty) wait for credits ``share`` of the
    time from ``start`` to ``end``."""

    start: datetime
    end: datetime
    share: float = 0.35
    hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuThrottle:
    """GPU ``gpu`` of ``host``: clock event reasons ``bits`` from ``start`` to ``end``."""

    host: str
    gpu: int
    start: datetime
    end: datetime
    bits: int = 0x40 | 0x8


@dataclass(frozen=True)
class GpuXid:
    """GPU ``gpu`` of ``host`` raises XID ``code`` at ``at`` (held from then on)."""

    host: str
    gpu: int
    at: datetime
    code: int = 79


@dataclass(frozen=True)
class PcieDowntrain:
    """GPU ``gpu`` of ``host``'s PCIe link at ``width`` lanes, generation ``gen``."""

    host: str
    gpu: int
    width: int = 8
    gen: int = 4


ClusterFault = PortErrors | PortCongestion | GpuThrottle | GpuXid | PcieDowntrain

_ECC_XIDS = {48: 1, 94: 1, 95: 1}
_TICK_S = 8e-9  # one port_xmit_wait tick (ConnectX-5 and later)


def _ts(text: str) -> datetime:
    ts = datetime.fromisoformat(text)
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


def cluster_tables(
    truth: dict[str, Any],
    faults: Sequence[ClusterFault] = (),
    *,
    seed: int = 0,
    noise: float = 1.0,
    step_s: float = 15.0,
    ports_per_host: int = 1,
    pad_s: float = 300.0,
    url: str = "synth://cluster",
) -> ClusterTables:
    """The cluster's tables for the job of ``truth`` (``Truth.to_dict()``): its hosts, its
    GPUs (the ranks' NVML indices) and its time span padded by ``pad_s``, sampled every
    ``step_s``; ``noise`` scales the background (1: a typical healthy cluster)."""
    rng = random.Random(seed)
    first, last = _ts(str(truth["first_ts"])), _ts(str(truth["last_ts"]))
    start = first - timedelta(seconds=pad_s)
    end = last + timedelta(seconds=pad_s)
    n = max(2, math.ceil((end - start).total_seconds() / step_s) + 1)
    times = [start + timedelta(seconds=k * step_s) for k in range(n)]
    ranks = truth["ranks"]
    hosts = sorted({str(r["host"]) for r in ranks})
    gpus = sorted({(str(r["host"]), int(r["nvml_dev"])) for r in ranks})
    busy_from, busy_to = first, last
    ports: list[tuple[datetime, str, str, str, str, str, float]] = []
    for host in hosts:
        for dev in range(ports_per_host):
            ports += _port_series(
                rng, host, dev, times, step_s, noise, (busy_from, busy_to), faults
            )
    gpu_rows: list[tuple[datetime, str, str, str | None, str, str, float]] = []
    for host, gpu in gpus:
        gpu_rows += _gpu_series(rng, host, gpu, times, noise, (busy_from, busy_to), faults)
    return ClusterTables(
        url=url,
        start=start,
        end=end,
        step_s=step_s,
        ports=pl.DataFrame(ports, schema=PORT_SAMPLES_SCHEMA, orient="row"),
        gpus=pl.DataFrame(gpu_rows, schema=GPU_SAMPLES_SCHEMA, orient="row"),
    )


def _poisson(rng: random.Random, lam: float) -> int:
    """Knuth's method (small ``lam`` only)."""
    if lam <= 0:
        return 0
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def _spread(total: int, steps: list[int], rng: random.Random) -> dict[int, int]:
    """``total`` events over the sample indices ``steps`` (at least one where any)."""
    out: dict[int, int] = {}
    if not steps or total <= 0:
        return out
    for _ in range(total):
        k = rng.choice(steps)
        out[k] = out.get(k, 0) + 1
    return out


def _inside(times: list[datetime], step_s: float, a: datetime, b: datetime) -> list[int]:
    """Indices of the samples whose step (t - step, t] overlaps [a, b]."""
    d = timedelta(seconds=step_s)
    return [k for k, t in enumerate(times) if t - d < b and t >= a]


def _port_series(
    rng: random.Random,
    host: str,
    dev: int,
    times: list[datetime],
    step_s: float,
    noise: float,
    busy: tuple[datetime, datetime],
    faults: Sequence[ClusterFault],
) -> list[tuple[datetime, str, str, str, str, str, float]]:
    device, port = f"mlx5_{dev}", "1"
    symbol: dict[int, int] = {}
    recov: dict[int, int] = {}
    downs: dict[int, int] = {}
    wait_share: dict[int, float] = {}
    for f in faults:
        if isinstance(f, PortErrors) and f.host == host and f.device == dev:
            idx = _inside(times, step_s, f.start, f.end)
            for src, into in ((f.symbol_errors, symbol), (f.recoveries, recov), (f.downs, downs)):
                for k, c in _spread(src, idx, rng).items():
                    into[k] = into.get(k, 0) + c
        elif isinstance(f, PortCongestion) and (not f.hosts or host in f.hosts) and dev == 0:
            for k in _inside(times, step_s, f.start, f.end):
                wait_share[k] = max(wait_share.get(k, 0.0), f.share * rng.uniform(0.85, 1.15))
    out: list[tuple[datetime, str, str, str, str, str, float]] = []
    # one symbol error per port-hour (noise 1), the odd tick; nothing else when healthy
    lam = noise * step_s / 3600.0
    for k, t in enumerate(times):
        is_busy = busy[0] - timedelta(seconds=step_s) < t <= busy[1] + timedelta(seconds=step_s)
        base_wait = rng.uniform(0.005, 0.03) * noise if is_busy else rng.uniform(0, 0.002) * noise
        share = wait_share.get(k, base_wait)
        counters = {
            "symbol_error_total": float(symbol.get(k, 0) + _poisson(rng, lam)),
            "link_error_recovery_total": float(recov.get(k, 0)),
            "link_downed_total": float(downs.get(k, 0)),
            "port_errors_received_total": float(symbol.get(k, 0) // 4),
        }
        for metric, value in counters.items():
            if value > 0:  # sparse, as ``increase(...) > 0`` returns them
                out.append((t, host, device, port, metric, "increase", value))
        out.append(
            (t, host, device, port, "port_transmit_wait_total", "rate_per_s", share / _TICK_S)
        )
        rate = rng.uniform(8e9, 20e9) if is_busy else rng.uniform(0, 1e6)
        out.append((t, host, device, port, "port_data_transmitted_bytes_total", "rate_per_s", rate))
        state = 1.0 if downs.get(k) else 4.0  # DOWN during a step that saw a link down
        out.append((t, host, device, port, "state_id", "gauge", state))
        out.append((t, host, device, port, "rate_bytes_per_second", "gauge", 25e9))
    return out


def _gpu_series(
    rng: random.Random,
    host: str,
    gpu: int,
    times: list[datetime],
    noise: float,
    busy: tuple[datetime, datetime],
    faults: Sequence[ClusterFault],
) -> list[tuple[datetime, str, str, str | None, str, str, float]]:
    uuid = f"GPU-{rng.getrandbits(32):08x}-{host}-{gpu}"
    label = str(gpu)
    out: list[tuple[datetime, str, str, str | None, str, str, float]] = []
    xid, dbe = 0.0, 0.0
    width, gen = 16.0, 4.0
    for f in faults:
        if isinstance(f, PcieDowntrain) and (f.host, f.gpu) == (host, gpu):
            width, gen = float(f.width), float(f.gen)
    for t in times:
        is_busy = busy[0] <= t <= busy[1]
        bits = 0
        if is_busy:
            # busy GPUs touch the power cap now and then (more with noise)
            if rng.random() < min(0.2, 0.05 * noise):
                bits |= 0x4
        else:
            bits |= 0x1  # idle
        for f in faults:
            if isinstance(f, GpuThrottle) and (f.host, f.gpu) == (host, gpu):
                if f.start <= t <= f.end:
                    bits |= f.bits
            elif isinstance(f, GpuXid) and (f.host, f.gpu) == (host, gpu) and f.at <= t:
                if xid != f.code:
                    dbe += _ECC_XIDS.get(f.code, 0)
                xid = float(f.code)
        rows = {
            "DCGM_FI_DEV_XID_ERRORS": xid,
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": dbe,
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": float(bits),
            "DCGM_FI_DEV_SM_CLOCK": 1980.0 if not bits & 0x68 else 1100.0,
            "DCGM_FI_DEV_PCIE_LINK_WIDTH": width,
            "DCGM_FI_DEV_PCIE_LINK_GEN": gen,
        }
        for metric, value in rows.items():
            out.append((t, host, label, uuid, metric, "gauge", value))
    return out


def with_cluster(built: Built, tables: ClusterTables) -> Built:
    """``built`` with ``tables`` as every attempt's ``Analysis.cluster``, as ``analyze
    --prometheus`` would have read them (for tests and benchmarks)."""
    return replace(
        built,
        analysis=replace(built.analysis, cluster=tables),
        views=[(replace(v, cluster=tables), a) for v, a in built.views],
    )
