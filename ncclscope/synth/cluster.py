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
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from ncclscope.cluster.read import PORT_COUNTERS
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
    "exporter_openmetrics",
    "with_cluster",
    "write_exporter_openmetrics",
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


# ------------------------------------------------------------------- as exporters say it

_IB = "node_infiniband_"
#: ``state_id`` 4 (ACTIVE) goes with ``physical_state_id`` 5 (LinkUp); a port in any other
#: state is retraining: 2 (Polling).
_ACTIVE, _LINK_UP, _POLLING = 4.0, 5.0, 2.0
#: Each exporter's port (its ``instance`` is ``address:port``), ``job`` and the network
#: its address is on: node_exporter on the node's own address (host network),
#: dcgm-exporter and the agent on pod addresses, as under Kubernetes.
_NODE = (9100, "node", 0)
_DCGM = (9400, "dcgm-exporter", 244)
_AGENT = (9477, "ncclscope", 245)
_MODEL = "NVIDIA H100 80GB HBM3"
_DRIVER = "550.54.15"
#: A counter starts at a value of its own below this (nodes were up before the job).
_BASE = 100_000


def _address(net: int, index: int, port: int) -> str:
    """``10.<net>.x.y:port`` of host ``index`` (never the host's name: the reader must
    map instances to hosts through the exporters' own labels)."""
    return f"10.{net}.{index // 250}.{index % 250 + 1}:{port}"


def _instance(hosts: dict[str, int], exporter: tuple[int, str, int]) -> pl.Expr:
    port, _job, net = exporter
    where = {h: _address(net, i, port) for h, i in hosts.items()}
    return pl.col("host").replace_strict(where, return_dtype=pl.String).alias("_instance")


def _grid(t: ClusterTables) -> pl.DataFrame:
    """Every time the table has a sample at: the exporters' scrapes."""
    return pl.concat([t.ports.select("ts"), t.gpus.select("ts")]).unique().sort("ts")


def _counters(
    frame: pl.DataFrame, keys: list[str], grid: pl.DataFrame, step_s: float, every: Sequence[str]
) -> pl.DataFrame:
    """``keys``, metric, ts and the counter's increase up to ts (0 where the table has no
    row: its increases are sparse) for every counter series on every time of ``grid``;
    ``every``: counters each of ``keys`` exports whether the table has them or not."""
    counted = (
        frame.filter(pl.col("kind") != "gauge")
        .with_columns(
            # a rate over the step before ts: the counter grew by rate x step
            pl.when(pl.col("kind") == "rate_per_s")
            .then(pl.col("value") * step_s)
            .otherwise(pl.col("value"))
            .alias("inc")
        )
        .group_by(*keys, "metric", "ts")
        .agg(pl.col("inc").sum())
    )
    series = pl.concat(
        [
            counted.select(*keys, "metric"),
            frame.select(keys).join(pl.DataFrame({"metric": list(every)}), how="cross"),
        ]
    ).unique()
    return (
        series.join(grid, how="cross")
        .join(counted, on=[*keys, "metric", "ts"], how="left")
        .with_columns(pl.col("inc").fill_null(0.0))
    )


def _cumulative(frames: list[pl.DataFrame], keys: list[str]) -> pl.DataFrame:
    """The increases of every table as the counter's values: a running sum over time,
    from a nonzero start of each series' own, continued from one table to the next."""
    if not frames:
        return pl.DataFrame()
    every = pl.concat(frames).sort(*keys, "metric", "ts")
    dup = every.select(*keys, "metric", "ts").is_duplicated()
    if dup.any():
        row = every.filter(dup).row(0, named=True)
        raise ValueError(f"two tables sample the same series at the same time: {row}")
    names = every.select(*keys, "metric").unique()
    base = [
        float(1 + zlib.crc32("/".join(str(v) for v in r).encode()) % _BASE)
        for r in names.iter_rows()
    ]
    names = names.with_columns(pl.Series("_base", base, pl.Float64))
    return (
        every.join(names, on=[*keys, "metric"], how="left")
        .with_columns(
            (pl.col("_base") + pl.col("inc").cum_sum().over(*keys, "metric")).alias("value")
        )
        .drop("_base", "inc")
    )


def _label(name: str, value: pl.Expr | str) -> list[pl.Expr]:
    """``name="value",`` (the values here need no escaping: host names, devices, ids)."""
    text = pl.lit(value) if isinstance(value, str) else value
    return [pl.lit(f'{name}="'), text, pl.lit('",')]


def _samples(family: str, kind: str, name: pl.Expr, labels: list[pl.Expr]) -> list[pl.Expr]:
    return [
        pl.lit(family).alias("family"),
        pl.lit(kind).alias("type"),
        name.alias("name"),
        pl.concat_str(labels).str.strip_suffix(",").alias("labels"),
        pl.col("ts").dt.epoch("ms").alias("ms"),
        pl.col("value"),
    ]


def _family(metric: str, counter: bool) -> str:
    return metric.removesuffix("_total") if counter else metric


def _exporter_samples(tables: Sequence[ClusterTables], domain: str) -> pl.DataFrame:
    """One row per sample the exporters would have been scraped for: family, type, name,
    labels (their text), ms, value."""
    hosts = sorted(
        {h for t in tables for h in t.ports["host"].to_list() + t.gpus["host"].to_list()}
    )
    index = {h: i for i, h in enumerate(hosts)}
    port_keys, gpu_keys = ["host", "device", "port"], ["host", "gpu", "uuid"]
    port_counts: list[pl.DataFrame] = []
    gpu_counts: list[pl.DataFrame] = []
    gauges: list[pl.DataFrame] = []
    ident: list[pl.DataFrame] = []
    for t in tables:
        grid = _grid(t)
        step = float(t.step_s or 15.0)
        ports = t.ports
        gpus = t.gpus.with_columns(
            pl.col("uuid").fill_null(pl.format("GPU-{}-{}", pl.col("host"), pl.col("gpu")))
        )
        # node_exporter exports every error counter of every port, counting or not
        port_counts.append(_counters(ports, port_keys, grid, step, PORT_COUNTERS))
        gpu_counts.append(_counters(gpus, gpu_keys, grid, step, ()))
        state = ports.filter((pl.col("kind") == "gauge") & (pl.col("metric") == "state_id"))
        physical = state.with_columns(
            pl.lit("physical_state_id").alias("metric"),
            pl.when(pl.col("value") == _ACTIVE).then(_LINK_UP).otherwise(_POLLING).alias("value"),
        )
        gauges.append(
            pl.concat([ports.filter(pl.col("kind") == "gauge"), physical])
            .drop("kind")
            .with_columns(
                pl.lit("ports").alias("_table"),
                pl.lit(None, pl.String).alias("gpu"),
                pl.lit(None, pl.String).alias("uuid"),
            )
        )
        gauges.append(
            gpus.filter(pl.col("kind") == "gauge")
            .drop("kind")
            .with_columns(
                pl.lit("gpus").alias("_table"),
                pl.lit(None, pl.String).alias("device"),
                pl.lit(None, pl.String).alias("port"),
            )
        )
        names = pl.concat([ports.select("host"), gpus.select("host")]).unique()
        ident.append(names.join(grid, how="cross"))
    out: list[pl.DataFrame] = []
    node, dcgm, agent = (_instance(index, e) for e in (_NODE, _DCGM, _AGENT))

    def node_labels() -> list[pl.Expr]:
        return [*_label("instance", pl.col("_instance")), *_label("job", _NODE[1])]

    def port_labels() -> list[pl.Expr]:
        return [
            *_label("device", pl.col("device")),
            *node_labels(),
            *_label("port", pl.col("port")),
        ]

    def gpu_labels() -> list[pl.Expr]:
        gpu = pl.col("gpu")
        return [
            *_label("DCGM_FI_DRIVER_VERSION", _DRIVER),
            *_label("Hostname", pl.col("host")),
            *_label("UUID", pl.col("uuid")),
            *_label("device", pl.concat_str(pl.lit("nvidia"), gpu)),
            *_label("gpu", gpu),
            *_label("instance", pl.col("_instance")),
            *_label("job", _DCGM[1]),
            *_label("modelName", _MODEL),
        ]

    counts = _cumulative(port_counts, port_keys)
    for metric in counts["metric"].unique().sort().to_list() if counts.height else []:
        family = _IB + _family(metric, True)
        rows = counts.filter(pl.col("metric") == metric).with_columns(node)
        out.append(rows.select(_samples(family, "counter", pl.lit(_IB + metric), port_labels())))
    counts = _cumulative(gpu_counts, gpu_keys)
    for metric in counts["metric"].unique().sort().to_list() if counts.height else []:
        # dcgm-exporter's counters (..._TOTAL, ..._COUNTER) are no OpenMetrics counters
        rows = counts.filter(pl.col("metric") == metric).with_columns(dcgm)
        out.append(rows.select(_samples(metric, "gauge", pl.lit(metric), gpu_labels())))
    every = pl.concat(gauges, how="diagonal_relaxed").sort("ts")
    for (table, metric), rows in sorted(every.group_by("_table", "metric"), key=lambda g: g[0]):
        if table == "ports":
            family = _IB + str(metric)
            rows = rows.with_columns(node)
            out.append(rows.select(_samples(family, "gauge", pl.lit(family), port_labels())))
        else:
            rows = rows.with_columns(dcgm)
            out.append(
                rows.select(_samples(str(metric), "gauge", pl.lit(str(metric)), gpu_labels()))
            )
    seen = pl.concat(ident).unique().with_columns(pl.lit(1.0).alias("value"))
    full = pl.concat_str(pl.col("host"), pl.lit(domain))
    for exporter, instance in ((_NODE, node), (_DCGM, dcgm), (_AGENT, agent)):
        out.append(
            seen.with_columns(instance).select(
                _samples(
                    "up",
                    "gauge",
                    pl.lit("up"),
                    [*_label("instance", pl.col("_instance")), *_label("job", exporter[1])],
                )
            )
        )
    uname = [
        *_label("domainname", "(none)"),
        *_label("machine", "x86_64"),
        *_label("nodename", full),
        *_label("release", "5.15.0-105-generic"),
        *_label("sysname", "Linux"),
    ]
    out.append(
        seen.with_columns(node).select(
            _samples(
                "node_uname_info", "gauge", pl.lit("node_uname_info"), [*uname, *node_labels()]
            )
        )
    )
    out.append(
        seen.with_columns(agent).select(
            _samples(
                "ncclscope_node",
                "info",
                pl.lit("ncclscope_node_info"),
                [
                    *_label("hostname", full),
                    *_label("instance", pl.col("_instance")),
                    *_label("job", _AGENT[1]),
                ],
            )
        )
    )
    return pl.concat(out).sort("family", "labels", "ms", maintain_order=True)


def _chunks(samples: pl.DataFrame) -> Iterator[str]:
    """The OpenMetrics text, a family at a time (its samples together, each series in
    time order, as ``promtool tsdb create-blocks-from openmetrics`` wants them)."""
    ms = pl.col("ms")
    lines = samples.select(
        "family",
        "type",
        pl.concat_str(
            pl.col("name"),
            pl.lit("{"),
            pl.col("labels"),
            pl.lit("} "),
            # whole numbers as integers (counters, codes, bits), as exporters print them
            pl.when((pl.col("value") == pl.col("value").round(0)) & (pl.col("value").abs() < 1e15))
            .then(pl.col("value").cast(pl.Int64).cast(pl.String))
            .otherwise(pl.col("value").cast(pl.String)),
            pl.lit(" "),
            (ms // 1000).cast(pl.String),
            pl.lit("."),
            (ms % 1000).cast(pl.String).str.zfill(3),
            pl.lit("\n"),
        ).alias("line"),
    )
    for (family, kind), part in lines.group_by("family", "type", maintain_order=True):
        yield f"# TYPE {family} {kind}\n"
        yield "".join(part["line"].to_list())
    yield "# EOF\n"


def exporter_openmetrics(
    tables: ClusterTables | Sequence[ClusterTables], *, domain: str = ".cluster.internal"
) -> str:
    """The series the cluster's exporters would have been scraped for, as OpenMetrics
    text for ``promtool tsdb create-blocks-from openmetrics``: what ``cluster_tables``
    measured (one or more jobs' tables, each series continued across them in time order;
    two tables must not sample the same host at the same time) turned back into raw
    series, one sample per table time (the scrapes):

    - node_exporter (``job="node"``, ``instance`` the node's address ``10.0.x.y:9100``):
      ``node_infiniband_*`` with ``device``/``port``: the error counters (all eight, flat
      where nothing counts) and the rates' counters as running sums of the table's
      increases (rate x step) from a nonzero start; ``state_id``, ``physical_state_id``
      (LinkUp where ACTIVE, else Polling) and ``rate_bytes_per_second`` as gauges;
      ``node_uname_info{nodename="<host><domain>"}``;
    - dcgm-exporter (``job="dcgm-exporter"``, a pod address ``10.244.x.y:9400``): every
      ``DCGM_FI_DEV_*`` field of the table with ``gpu``, ``UUID``, ``device``,
      ``modelName`` and ``Hostname`` (the host as the logs spell it);
    - the agent (``job="ncclscope"``, ``10.245.x.y:9477``):
      ``ncclscope_node_info{hostname="<host><domain>"}``;
    - ``up`` for each of those targets.

    No instance carries a host's name: the reader must tie them to hosts by the labels.

    >>> truth = {"first_ts": "2025-03-14T09:00:00", "last_ts": "2025-03-14T09:00:15",
    ...          "ranks": [{"host": "node-0", "nvml_dev": 0}]}
    >>> text = exporter_openmetrics(cluster_tables(truth, pad_s=0.0))
    >>> lines = text.splitlines()
    >>> symbol = [line for line in lines if line.startswith("node_infiniband_symbol")]
    >>> print("\\n".join(line.replace("{", "\\n  {") for line in symbol))
    node_infiniband_symbol_error_total
      {device="mlx5_0",instance="10.0.0.1:9100",job="node",port="1"} 29984 1741942800.000
    node_infiniband_symbol_error_total
      {device="mlx5_0",instance="10.0.0.1:9100",job="node",port="1"} 29984 1741942815.000
    >>> uname = next(line for line in lines if line.startswith("node_uname_info"))
    >>> [label for label in uname.split(",") if label.startswith(("nodename", "instance"))]
    ['nodename="node-0.cluster.internal"', 'instance="10.0.0.1:9100"']
    """
    many = [tables] if isinstance(tables, ClusterTables) else list(tables)
    return "".join(_chunks(_exporter_samples(many, domain)))


def write_exporter_openmetrics(
    tables: ClusterTables | Sequence[ClusterTables],
    path: Path,
    *,
    domain: str = ".cluster.internal",
) -> int:
    """:func:`exporter_openmetrics` written to ``path`` a family at a time (a long run of
    jobs makes hundreds of MB); returns the number of samples.

    >>> import tempfile
    >>> truth = {"first_ts": "2025-03-14T09:00:00", "last_ts": "2025-03-14T09:00:15",
    ...          "ranks": [{"host": "node-0", "nvml_dev": 0}]}
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_exporter_openmetrics(cluster_tables(truth, pad_s=0.0), Path(d) / "x.om")
    48
    """
    many = [tables] if isinstance(tables, ClusterTables) else list(tables)
    samples = _exporter_samples(many, domain)
    with path.open("w", encoding="utf-8") as out:
        out.writelines(_chunks(samples))
    return samples.height
