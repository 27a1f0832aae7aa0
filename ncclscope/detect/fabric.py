"""The cause behind other detectors' findings, from what the cluster's exporters measured
(issue #29): node_exporter's InfiniBand port counters and dcgm-exporter's GPU health
fields, read from the cluster's Prometheus (``Analysis.cluster``, ``ncclscope.cluster``).

It runs last (``RUN_ORDER``) and reads the findings made before it (``Context.found``):

* a slow node or straggler (``straggler``, cause ``slow``) during its slow window: its
  ports' error counters, link downs, link error recoveries and transmit wait; its GPUs'
  XIDs, double-bit ECC errors, clock event reasons and PCIe link;
* a hang or an NCCL error: the XIDs and ECC errors of the GPUs of the hosts it names
  (the GPU, with the rank on it, from the logs' init lines: NVML index or cudaDev); a
  network error (IB completion, socket, remote exit) also reads the ports of both ends
  (the host that logged it and the hosts of the errors that followed it);
* collective bandwidth below nccl-tests' baseline (``collective_cost``, ``net_ratio``
  below ``collective_cost.MIN_NET_RATIO``): the job's ports' transmit wait;
* PCIe contention under offload (``pcie_contention``): the GPUs' PCIe link generation
  and width against the best the job's GPUs run at, and PCIe replays.

Metric (``FABRIC_SCHEMA``): per explained finding (``target``, its index in
``Context.found``) and per port or GPU of the job's hosts, each counter summed over the
finding's window (padded by one sampling step, as an increase at time t covers the step
before it), or for gauges the share of samples flagged, the first time flagged and the
bits or codes seen; ``on_target`` marks the components of the hosts the finding names.

Policy, with thresholds from public sources, not from the generator:

* a port is faulty in the window with ``SYMBOL_ERRORS`` symbol errors or more, or
  ``LINK_RECOVERIES`` link error recoveries, or ``LINK_DOWNS`` link downs, or the
  receive / integrity error counts of ``OTHER_ERRORS``: infiniband-diags' default
  ``error_thresholds`` (``ibqueryerrors(8)``: ``SymbolErrorCounter=10``,
  ``LinkErrorRecoveryCounter=10``) for counts that healthy links make now and then,
  and one link down or retrain (a port that went down, or retrained, under a job: a
  flap, never background noise; nebius/soperator#481 reads any increase of
  ``link_downed`` as a flap);
* a port is congested when it waited (``port_transmit_wait``: ticks with data to send
  and no credits; one tick is 8 ns on current HCAs, NVIDIA/ib-traffic-monitor#3) for
  ``WAIT_SHARE`` of the window or more and, for one host's port, ``WAIT_OVER_PEERS``
  times the median of the job's other ports (waiting under a collective's load is
  normal; a port that waits far more than its peers sits behind a congested link);
* a GPU's XID is hardware unless NVIDIA names it an application's
  (``APPLICATION_XIDS``: 13, 31, 43, 45, 68, as NVIDIA's k8s-device-plugin skips them);
  any double-bit ECC error is hardware;
* a GPU is throttled when ``THROTTLE_SHARE`` of its samples in the window carry a
  slowdown reason (HW slowdown, SW/HW thermal, HW power brake: DCGM's
  ``DCGM_CLOCKS_EVENT_REASON_*`` bits); the power cap alone is not one (DCGM: "the
  clocks have been optimized to ensure not to exceed currently set power limits": busy
  GPUs touch it in normal work), nor idle or the application clocks setting;
* a PCIe link is below its capacity when its generation or width is below the best
  the job's GPUs run at.

Where a cause is seen: a ``cluster_cause`` finding naming the host, port or GPU (and
rank), the window, the counters and which finding it explains; the explained finding's
evidence gets a ``cluster`` object either way, saying what was read and whether the
ports and GPUs were clean in the window.  The network is never blamed without its
counters, and jobs without other findings get none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl

from ncclscope.detect.base import Finding, Severity, register
from ncclscope.detect.collective_cost import MIN_NET_RATIO
from ncclscope.detect.context import Context
from ncclscope.findings import severity_at_least
from ncclscope.schema import TS
from ncclscope.units import APPLICATION_XIDS, CLOCK_EVENT_BITS, SLOWDOWN_BITS, XID_NAMES

__all__ = [
    "APPLICATION_XIDS",
    "CLOCK_EVENT_BITS",
    "FABRIC_SCHEMA",
    "LINK_DOWNS",
    "LINK_RECOVERIES",
    "SLOWDOWN_BITS",
    "SYMBOL_ERRORS",
    "THROTTLE_SHARE",
    "WAIT_OVER_PEERS",
    "WAIT_SHARE",
    "XID_NAMES",
    "FabricDetector",
    "fabric_metric",
    "peer_of",
]

#: Symbol errors in the window from which a port is faulty (``ibqueryerrors``' default).
SYMBOL_ERRORS = 10.0
#: Link error recoveries (retrains) and link downs: one is a flap under the job.
LINK_RECOVERIES = 1.0
LINK_DOWNS = 1.0
#: Other error counters, with infiniband-diags' default thresholds.
OTHER_ERRORS: dict[str, float] = {
    "port_errors_received_total": 10.0,
    "local_link_integrity_errors_total": 10.0,
    "port_receive_remote_physical_errors_total": 100.0,
    "excessive_buffer_overrun_errors_total": 10.0,
    "port_discards_transmitted_total": 100.0,
}
#: Error counters and their thresholds, by node_exporter's name.
PORT_ERRORS: dict[str, float] = {
    "symbol_error_total": SYMBOL_ERRORS,
    "link_error_recovery_total": LINK_RECOVERIES,
    "link_downed_total": LINK_DOWNS,
    **OTHER_ERRORS,
}
_WAIT = "port_transmit_wait_total"
#: One ``port_xmit_wait`` tick, in seconds (ConnectX-5 and later: (7 + 1) ns).
WAIT_TICK_S = 8e-9
#: Share of the time a port waited for credits from which it is congested ...
WAIT_SHARE = 0.10
#: ... and, for one host's port, this many times the median of the job's other ports.
WAIT_OVER_PEERS = 4.0

_POWER_CAP = 0x4
#: Share of the window's samples a slowdown reason must cover.
THROTTLE_SHARE = 0.5

_XID = "DCGM_FI_DEV_XID_ERRORS"
_DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
_REASONS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
_PCIE_GEN = "DCGM_FI_DEV_PCIE_LINK_GEN"
_PCIE_WIDTH = "DCGM_FI_DEV_PCIE_LINK_WIDTH"
_PCIE_REPLAY = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
_GPU_COUNTERS = (_DBE, _PCIE_REPLAY)
#: NCCL error kinds that involve the network (both ends' ports are read).
_NETWORK_ERRORS = frozenset({"ib_completion", "net_completion", "remote_exit", "socket"})
_PEER = re.compile(r"peer ([0-9A-Fa-f.:]+)")
#: Without a sampling step: pad windows by this much.
_PAD = timedelta(seconds=60)

FABRIC_SCHEMA = pl.Schema(
    {
        "target": pl.UInt32(),  # index of the explained finding in Context.found
        "host": pl.String(),
        "on_target": pl.Boolean(),  # a host the finding names
        "component": pl.String(),  # port | gpu
        "device": pl.String(),  # mlx5_0 | the GPU's index
        "port": pl.String(),  # "1"; null for a GPU
        "metric": pl.String(),
        "total": pl.Float64(),  # counters: the increase in the window; gauges: the maximum
        "share": pl.Float64(),  # share of samples flagged (wait: the share of time waited)
        "bits": pl.Int64(),  # reasons: OR of the flagged bits; XID: the latest code; else 0
        "first_ts": pl.Datetime("us", "UTC"),  # first sample flagged (null: none)
        "samples": pl.UInt32(),
        "window_start": pl.Datetime("us", "UTC"),
        "window_end": pl.Datetime("us", "UTC"),
    }
)


@dataclass(frozen=True)
class _Target:
    index: int
    finding: Finding
    hosts: list[str]  # the hosts whose components the finding is about
    start: datetime
    end: datetime
    #: what to read: ports, gpus (XID/ECC), throttle, pcie, congestion
    reads: frozenset[str]


def _parse(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        ts = datetime.fromisoformat(text)
    except ValueError:
        return None
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


def _job_span(ctx: Context) -> tuple[datetime, datetime] | None:
    """The job's first and last time by its logs, else what the cluster was read for."""
    stats = ctx.analysis.stats
    lo = stats["ts_min"].min() if "ts_min" in stats.columns and stats.height else None
    ends = list(ctx.file_ends.values())
    hi = max(ends) if ends else None
    cluster = ctx.analysis.cluster
    if not isinstance(lo, datetime) and cluster is not None:
        lo = cluster.start
    if hi is None and cluster is not None:
        hi = cluster.end
    if isinstance(lo, datetime) and isinstance(hi, datetime):
        return lo, hi
    return None


def _targets(ctx: Context) -> list[_Target]:
    span = _job_span(ctx)
    if span is None:
        return []
    everyone = list(ctx.analysis.hosts)
    errors = [f for f in ctx.found if f.kind == "nccl_error"]
    out = []
    for i, f in enumerate(ctx.found):
        # a hang the logs only suspect (they end mid-run) is read for GPU faults too: a
        # GPU off the bus is exactly what leaves a log ending that way
        if not severity_at_least(f.severity, "warning") and f.kind not in (
            "collective_cost",
            "hang",
        ):
            continue
        start, end = span
        ev = f.evidence
        if f.kind == "straggler" and ev.get("cause") == "slow" and f.hosts:
            ws, we = _parse(ev.get("window_start")), _parse(ev.get("window_end"))
            if ws and we:
                start, end = ws, we
            out.append(
                _Target(i, f, list(f.hosts), start, end, frozenset({"ports", "gpus", "throttle"}))
            )
        elif f.kind == "hang":
            out.append(_Target(i, f, list(f.hosts) or everyone, start, end, frozenset({"gpus"})))
        elif f.kind == "nccl_error" and ev.get("root_cause"):
            first = _parse(ev.get("first_seen"))
            if first is not None:  # from a while before the error to its end of the job
                start = max(start, first - timedelta(minutes=10))
            if ev.get("error_kind") in _NETWORK_ERRORS:
                hosts = sorted({h for g in errors for h in g.hosts})
                reads = frozenset({"ports", "gpus"})
            else:
                hosts, reads = list(f.hosts), frozenset({"gpus"})
            out.append(_Target(i, f, hosts or everyone, start, end, reads))
        elif f.kind == "collective_cost":
            ratio = ev.get("net_ratio")
            if isinstance(ratio, int | float) and ratio < MIN_NET_RATIO:
                out.append(_Target(i, f, everyone, start, end, frozenset({"congestion", "ports"})))
        elif f.kind == "pcie_contention" and f.hosts:
            ws, we = _parse(ev.get("window_start")), _parse(ev.get("window_end"))
            if ws and we:
                start, end = ws, we
            out.append(_Target(i, f, list(f.hosts), start, end, frozenset({"pcie"})))
    return out


def _pad(ctx: Context) -> timedelta:
    cluster = ctx.analysis.cluster
    step = cluster.step_s if cluster is not None else None
    return timedelta(seconds=step) if step else _PAD


#: The reads whose rows each stand for the range before them (``read_cluster``: a
#: counter's rise since the step before, every ``max(step, 60 s)``; the XID gauge is
#: read with them, at that step).
_RISES = ("ports_errors", "gpus_events")


def _late(ctx: Context) -> timedelta:
    """How far past a window's end a rise (or an XID) read by Prometheus may be stamped
    for what happened in it: the rises' own step, the pad at least."""
    cluster = ctx.analysis.cluster
    steps = [a.step_s for a in cluster.asks if a.what in _RISES and a.step_s] if cluster else []
    return max(_pad(ctx), timedelta(seconds=max(steps, default=0.0)))


def fabric_metric(ctx: Context) -> pl.DataFrame:
    """Per explained finding and per port or GPU of the job's hosts, the counters over the
    finding's window (module doc)."""
    cluster = ctx.analysis.cluster
    if cluster is None or (cluster.ports.is_empty() and cluster.gpus.is_empty()):
        return pl.DataFrame(schema=FABRIC_SCHEMA)
    pad, late = _pad(ctx), _late(ctx)
    # A rise at t counts what happened since the step before: one stamped up to a rise's
    # step after the window's end happened (partly) in it.  Gauges are read every step.
    rises = (pl.col("kind") == "increase") | (pl.col("metric") == _XID)
    frames = []
    for t in _targets(ctx):
        lo, hi = t.start - pad, t.end + pad
        within = (pl.col("ts") >= lo) & (
            pl.col("ts")
            <= pl.when(rises).then(pl.lit(t.end + late, dtype=TS)).otherwise(pl.lit(hi, dtype=TS))
        )
        on = pl.col("host").is_in(t.hosts)
        ports = cluster.ports.filter(within)
        gpus = cluster.gpus.filter(within)
        parts = [
            _port_rows(ports, on),
            _gpu_rows(gpus, on, cluster.gpus.filter(pl.col("ts") < lo)),
        ]
        for part in parts:
            if part.is_empty():
                continue
            frames.append(
                part.with_columns(
                    pl.lit(t.index, dtype=pl.UInt32).alias("target"),
                    pl.lit(t.start, dtype=TS).alias("window_start"),
                    pl.lit(t.end, dtype=TS).alias("window_end"),
                )
                .select(list(FABRIC_SCHEMA))
                .cast(FABRIC_SCHEMA)
            )
    if not frames:
        return pl.DataFrame(schema=FABRIC_SCHEMA)
    return pl.concat(frames).sort("target", "host", "component", "device", "port", "metric")


def _port_rows(ports: pl.DataFrame, on: pl.Expr) -> pl.DataFrame:
    counters = ports.filter(pl.col("metric").is_in(list(PORT_ERRORS)) & (pl.col("kind") != "gauge"))
    errs = counters.group_by("host", "device", "port", "metric").agg(
        pl.col("value").sum().alias("total"),
        (pl.col("value") > 0).mean().alias("share"),
        pl.col("ts").filter(pl.col("value") > 0).min().alias("first_ts"),
        pl.len().alias("samples"),
    )
    wait = ports.filter(pl.col("metric") == _WAIT)
    # increase per step or rate per second: as a share of the time waited
    step = wait.sort("ts").group_by("host", "device", "port").agg(pl.col("ts").diff().median())
    wait = wait.join(step.rename({"ts": "_step"}), on=["host", "device", "port"], how="left")
    seconds = pl.col("_step").dt.total_microseconds().cast(pl.Float64) / 1e6
    per_s = (
        pl.when(pl.col("kind") == "rate_per_s")
        .then(pl.col("value"))
        .otherwise(pl.col("value") / seconds)
    )
    waits = (
        wait.with_columns((per_s * WAIT_TICK_S).clip(0.0, 1.0).alias("_share"))
        .group_by("host", "device", "port", "metric")
        .agg(
            pl.col("_share").sum().alias("total"),
            pl.col("_share").mean().alias("share"),
            pl.col("ts").filter(pl.col("_share") >= WAIT_SHARE).min().alias("first_ts"),
            pl.len().alias("samples"),
        )
    )
    out = pl.concat([errs, waits.filter(pl.col("share").is_not_null())], how="vertical_relaxed")
    return out.with_columns(
        on.alias("on_target"),
        pl.lit("port").alias("component"),
        pl.lit(0, dtype=pl.Int64).alias("bits"),
    )


def _gpu_rows(gpus: pl.DataFrame, on: pl.Expr, before: pl.DataFrame) -> pl.DataFrame:
    if gpus.is_empty():
        return pl.DataFrame()
    keys = ["host", "gpu", "metric"]
    value = pl.col("value").fill_nan(0.0)
    # counters: the increase (summed) or, read as a gauge, its growth over the window
    counters = (
        gpus.filter(pl.col("metric").is_in(_GPU_COUNTERS))
        .sort("ts")
        .group_by(keys)
        .agg(
            pl.when(pl.col("kind").first() == "gauge")
            .then(value.max() - value.first())
            .otherwise(value.sum())
            .alias("total"),
            (pl.col("kind").first() != "gauge").alias("_inc"),
            pl.col("ts").first().alias("_t0"),
            pl.len().alias("samples"),
            value.alias("_v"),
            pl.col("ts").alias("_ts"),
        )
        .with_columns(
            pl.lit(None, dtype=pl.Float64).alias("share"),
            pl.lit(0, dtype=pl.Int64).alias("bits"),
        )
    )
    firsts = []
    for r in counters.iter_rows(named=True):
        vs, ts = r["_v"], r["_ts"]
        first = next(
            (
                t
                for k, (v, t) in enumerate(zip(vs, ts, strict=True))
                if (v > 0 if r["_inc"] else k > 0 and v > vs[k - 1])
            ),
            None,
        )
        firsts.append(first)
    counters = counters.with_columns(pl.Series("first_ts", firsts, dtype=TS)).drop(
        "_inc", "_t0", "_v", "_ts"
    )
    # XID: a gauge of the latest code; an event is a nonzero code that differs from the
    # one held before it (before the window too: a code held from an old event is not one)
    prior = (
        before.filter(pl.col("metric") == _XID)
        .sort("ts")
        .group_by("host", "gpu")
        .agg(pl.col("value").last().alias("_prior"))
    )
    xid = gpus.filter(pl.col("metric") == _XID).sort("ts")
    xid = xid.join(prior, on=["host", "gpu"], how="left").with_columns(
        pl.col("value")
        .shift(1)
        .over("host", "gpu")
        .fill_null(pl.col("_prior"))
        .fill_null(0.0)
        .alias("_prev")
    )
    new = (pl.col("value") > 0) & (pl.col("value") != pl.col("_prev"))
    xids = (
        xid.with_columns(new.alias("_new"))
        .filter(pl.col("_new"))
        .group_by("host", "gpu", pl.col("value").cast(pl.Int64).alias("bits"))
        .agg(
            pl.len().cast(pl.Float64).alias("total"),
            pl.col("ts").min().alias("first_ts"),
            pl.len().alias("samples"),
        )
        .with_columns(pl.lit(_XID).alias("metric"), pl.lit(None, dtype=pl.Float64).alias("share"))
    )
    # clock event reasons: share of samples with a slowdown bit, the power cap's share
    reasons = gpus.filter(pl.col("metric").is_in(_REASONS)).with_columns(
        value.cast(pl.Int64).alias("_bits")
    )
    slow = (pl.col("_bits") & SLOWDOWN_BITS) > 0
    cap = (pl.col("_bits") & _POWER_CAP) > 0
    throttle = pl.concat(
        [
            reasons.group_by("host", "gpu")
            .agg(
                pl.lit(name).alias("metric"),
                flag.mean().alias("share"),
                flag.sum().cast(pl.Float64).alias("total"),
                pl.col("_bits").filter(flag).fill_null(0).bitwise_or().alias("bits"),
                pl.col("ts").filter(flag).min().alias("first_ts"),
                pl.len().alias("samples"),
            )
            .with_columns(pl.col("bits").fill_null(0))
            for name, flag in (("throttle_slowdown", slow), ("throttle_power_cap", cap))
        ]
    )
    # PCIe link: the lowest generation and width in the window
    pcie = (
        gpus.filter(pl.col("metric").is_in([_PCIE_GEN, _PCIE_WIDTH]))
        .group_by(keys)
        .agg(
            value.min().alias("total"),
            pl.lit(None, dtype=pl.Float64).alias("share"),
            pl.lit(0, dtype=pl.Int64).alias("bits"),
            pl.col("ts").filter(value == value.min()).min().alias("first_ts"),
            pl.len().alias("samples"),
        )
    )
    cols = ["host", "gpu", "metric", "total", "share", "bits", "first_ts", "samples"]
    parts = [p.select(cols) for p in (counters, xids, throttle, pcie) if not p.is_empty()]
    if not parts:
        return pl.DataFrame()
    out = pl.concat([p.cast({"samples": pl.UInt32, "bits": pl.Int64}) for p in parts])
    return out.with_columns(
        on.alias("on_target"),
        pl.lit("gpu").alias("component"),
        pl.col("gpu").alias("device"),
        pl.lit(None, dtype=pl.String).alias("port"),
    ).drop("gpu")


# --- policy


def _iso(ts: object) -> str | None:
    return ts.isoformat() if isinstance(ts, datetime) else None


def _named_bits(bits: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENT_BITS.items() if bits & bit]


def _rank_of(ctx: Context) -> dict[tuple[str, str], int]:
    """(host, GPU index as dcgm-exporter labels it) -> global rank, from the init lines
    (NVML index where printed, else cudaDev: the same without CUDA_VISIBLE_DEVICES)."""
    ranks = ctx.analysis.identity.ranks
    out: dict[tuple[str, str], int] = {}
    if ranks.is_empty():
        return out
    for r in ranks.select("rank", "host", "cuda_dev", "nvml_dev").iter_rows(named=True):
        dev = r["nvml_dev"] if r["nvml_dev"] is not None else r["cuda_dev"]
        if r["host"] is not None and dev is not None and r["rank"] is not None:
            out.setdefault((str(r["host"]), str(dev)), int(r["rank"]))
    return out


@register
class FabricDetector:
    """The cluster's port and GPU counters behind the other detectors' findings."""

    name = "fabric"

    def metric(self, ctx: Context) -> pl.DataFrame:
        return fabric_metric(ctx)

    def policy(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        cluster = ctx.analysis.cluster
        if cluster is None:
            return []
        targets = _targets(ctx)
        if not targets:
            return []
        ranks = _rank_of(ctx)
        port_hosts = set(cluster.ports["host"].unique().to_list())
        gpu_hosts = set(cluster.gpus["host"].unique().to_list())
        out = []
        for t in targets:
            rows = metric.filter(pl.col("target") == t.index)
            verdict = _judge(t, rows, ranks)
            measured_ports = [h for h in t.hosts if h in port_hosts]
            measured_gpus = [h for h in t.hosts if h in gpu_hosts]
            summary: dict[str, Any] = {
                "window_start": _iso(t.start),
                "window_end": _iso(t.end),
                "hosts": t.hosts,
                "ports_measured": bool(measured_ports),
                "gpus_measured": bool(measured_gpus),
                # clean: measured, and nothing over the thresholds in the window
                "ports_clean": (not verdict.port_causes) if measured_ports else None,
                "gpus_clean": (not verdict.gpu_causes) if measured_gpus else None,
                "cause": verdict.cause,
            }
            summary["note"] = _note(summary, t)
            t.finding.evidence["cluster"] = summary
            if verdict.cause is not None:
                out.append(self._finding(t, verdict, summary))
        return out

    @staticmethod
    def _finding(t: _Target, v: _Verdict, summary: dict[str, Any]) -> Finding:
        f = t.finding
        what = {
            "straggler": "the slow node",
            "hang": "the hang",
            "nccl_error": "the NCCL error",
            "collective_cost": "the collectives' low bandwidth",
            "pcie_contention": "the PCIe contention",
        }.get(f.kind, f.kind)
        who = f" on {', '.join(f.hosts)}" if f.hosts else ""
        window = f"{summary['window_start']} to {summary['window_end']}"
        clean = ""
        if v.cause not in ("fabric", "fabric_congestion") and summary["ports_clean"]:
            clean = "; ports clean in the window"
        severity: Severity = "critical" if f.severity == "critical" else "warning"
        ranks = sorted({r for g in v.gpus if (r := g.get("rank")) is not None})
        hosts = sorted({p["host"] for p in v.ports} | {g["host"] for g in v.gpus})
        return Finding(
            kind="cluster_cause",
            severity=severity,
            message=f"cause of {what}{who} ({window}): {v.text}{clean}",
            ranks=ranks or list(f.ranks),
            hosts=hosts or list(f.hosts),
            op=f.op,
            evidence={
                "cause": v.cause,
                "causes": v.causes,
                "explains": {
                    "kind": f.kind,
                    "hosts": list(f.hosts),
                    "ranks": list(f.ranks),
                    "message": f.message[:200],
                    # the peer address a network error names, as printed
                    "peer": peer_of(f.message) if f.kind == "nccl_error" else None,
                },
                "window_start": summary["window_start"],
                "window_end": summary["window_end"],
                "ports": v.ports,
                "gpus": v.gpus,
                "ports_clean": summary["ports_clean"],
                "gpus_clean": summary["gpus_clean"],
                "thresholds": {
                    **{k: v_ for k, v_ in PORT_ERRORS.items()},
                    "wait_share": WAIT_SHARE,
                    "wait_over_peers": WAIT_OVER_PEERS,
                    "throttle_share": THROTTLE_SHARE,
                },
            },
            lines=list(f.lines[:1]),
        )


@dataclass
class _Verdict:
    cause: str | None
    causes: list[str]
    port_causes: list[str]
    gpu_causes: list[str]
    ports: list[dict[str, Any]]
    gpus: list[dict[str, Any]]
    text: str


def _judge(t: _Target, rows: pl.DataFrame, ranks: dict[tuple[str, str], int]) -> _Verdict:
    ports: dict[tuple[str, str, str], dict[str, Any]] = {}
    gpus: dict[tuple[str, str], dict[str, Any]] = {}
    port_causes: list[str] = []
    gpu_causes: list[str] = []
    texts: list[str] = []

    def port(r: dict[str, Any]) -> dict[str, Any]:
        key = (r["host"], r["device"], r["port"])
        return ports.setdefault(
            key, {"host": r["host"], "device": r["device"], "port": r["port"], "counters": {}}
        )

    def gpu(r: dict[str, Any]) -> dict[str, Any]:
        key = (r["host"], r["device"])
        return gpus.setdefault(
            key,
            {"host": r["host"], "gpu": r["device"], "rank": ranks.get(key), "events": {}},
        )

    mine = rows.filter(pl.col("on_target"))
    # ports: errors over the thresholds
    if "ports" in t.reads:
        errs = mine.filter(
            (pl.col("component") == "port") & (pl.col("metric") != _WAIT) & (pl.col("total") > 0)
        )
        for r in errs.iter_rows(named=True):
            if r["total"] >= PORT_ERRORS.get(r["metric"], float("inf")):
                p = port(r)
                p["counters"][r["metric"]] = int(r["total"])
                p["first_error"] = _iso(r["first_ts"])
        if ports:
            port_causes.append("fabric")
            texts.append(
                "InfiniBand port errors: "
                + "; ".join(
                    f"{p['host']} {p['device']} port {p['port']}: "
                    + ", ".join(f"{n} {k.removesuffix('_total')}" for k, n in p["counters"].items())
                    for p in ports.values()
                )
            )
    # ports: waiting for credits (a slow node's own port, or the job's ports at once)
    waits = rows.filter((pl.col("component") == "port") & (pl.col("metric") == _WAIT))
    if not waits.is_empty() and ("ports" in t.reads or "congestion" in t.reads):
        others = waits.filter(~pl.col("on_target"))["share"].median()
        peers = float(others) if isinstance(others, int | float) else None
        hot: list[dict[str, Any]] = []
        if "congestion" in t.reads:
            job = waits["share"].median()
            if isinstance(job, int | float) and job >= WAIT_SHARE:
                hot = waits.filter(pl.col("share") >= WAIT_SHARE).to_dicts()
        else:
            bar = max(WAIT_SHARE, WAIT_OVER_PEERS * peers) if peers is not None else None
            if bar is not None:
                hot = waits.filter(pl.col("on_target") & (pl.col("share") >= bar)).to_dicts()
        for r in hot:
            p = port(r)
            p["transmit_wait_share"] = round(float(r["share"]), 4)
            p["peers_transmit_wait_share"] = round(peers, 4) if peers is not None else None
        if hot:
            port_causes.append("fabric_congestion")
            texts.append(
                f"{len(hot)} port(s) waited for credits {max(r['share'] for r in hot):.0%} of "
                "the time (port_transmit_wait)"
                + (f", against {peers:.1%} for the job's other ports" if peers is not None else "")
            )
    # GPUs: XIDs and double-bit ECC errors
    if "gpus" in t.reads:
        g_rows = mine.filter(pl.col("component") == "gpu")
        for r in g_rows.filter(pl.col("metric") == _XID).iter_rows(named=True):
            code = int(r["bits"])
            g = gpu(r)
            g["events"].setdefault("xid", []).append(
                {
                    "code": code,
                    "meaning": XID_NAMES.get(code),
                    "application": code in APPLICATION_XIDS,
                    "first_seen": _iso(r["first_ts"]),
                }
            )
        for r in g_rows.filter((pl.col("metric") == _DBE) & (pl.col("total") >= 1)).iter_rows(
            named=True
        ):
            g = gpu(r)
            g["events"]["ecc_dbe"] = int(r["total"])
            g["events"]["ecc_dbe_first_seen"] = _iso(r["first_ts"])
        hw = [
            g
            for g in gpus.values()
            if "ecc_dbe" in g["events"]
            or any(not x["application"] for x in g["events"].get("xid", []))
        ]
        if hw:
            gpu_causes.append("gpu")
            texts.append("; ".join(_gpu_text(g) for g in hw))
    # GPUs: throttled (a slowdown reason on most samples, or a power cap its peers lack)
    if "throttle" in t.reads:
        hit = rows.filter(
            pl.col("on_target")
            & (pl.col("metric") == "throttle_slowdown")
            & (pl.col("share") >= THROTTLE_SHARE)
        )
        throttled = []
        for r in hit.iter_rows(named=True):
            g = gpu(r)
            g["events"]["clocks_event_reasons"] = sorted(
                set(g["events"].get("clocks_event_reasons", [])) | set(_named_bits(int(r["bits"])))
            )
            g["events"]["throttled_share"] = round(float(r["share"]), 3)
            g["events"]["throttled_from"] = _iso(r["first_ts"])
            throttled.append(g)
        if throttled:
            gpu_causes.append("gpu_throttle")
            texts.append(
                "; ".join(
                    f"GPU {g['gpu']} on {g['host']}{_rank_text(g)} throttled "
                    f"({', '.join(g['events']['clocks_event_reasons'])}) on "
                    f"{g['events']['throttled_share']:.0%} of the samples"
                    for g in {id(g): g for g in throttled}.values()
                )
            )
    # PCIe: a link below what the job's GPUs run at
    if "pcie" in t.reads:
        links = rows.filter(pl.col("metric").is_in([_PCIE_GEN, _PCIE_WIDTH]))
        best = links.group_by("metric").agg(pl.col("total").max().alias("_best"))
        low = links.join(best, on="metric").filter(
            pl.col("on_target") & (pl.col("total") < pl.col("_best"))
        )
        for r in low.iter_rows(named=True):
            g = gpu(r)
            name = "pcie_link_gen" if r["metric"] == _PCIE_GEN else "pcie_link_width"
            g["events"][name] = int(r["total"])
            g["events"][f"{name}_capacity"] = int(r["_best"])
        if not low.is_empty():
            gpu_causes.append("pcie_link")
            texts.append(
                "; ".join(
                    f"GPU {g['gpu']} on {g['host']}{_rank_text(g)} PCIe link at "
                    + " x".join(
                        str(g["events"].get(k, "?")) for k in ("pcie_link_gen", "pcie_link_width")
                    )
                    + " below the job's best"
                    for g in gpus.values()
                    if "pcie_link_gen" in g["events"] or "pcie_link_width" in g["events"]
                )
            )
    order = _ORDER.get(t.finding.kind, _ORDER["straggler"])
    causes = sorted(port_causes + gpu_causes, key=lambda c: order.index(c) if c in order else 99)
    return _Verdict(
        cause=causes[0] if causes else None,
        causes=causes,
        port_causes=port_causes,
        gpu_causes=gpu_causes,
        ports=[p for p in ports.values() if p["counters"] or "transmit_wait_share" in p],
        gpus=[g for g in gpus.values() if g["events"]],
        text="; ".join(texts),
    )


#: Which cause comes first where several are seen, by the explained finding's kind: a
#: port's errors before its congestion (errors make the retransmits that congest), a
#: GPU's own fault first at a hang or an error (a GPU off the bus stops its rank).
_ORDER = {
    "straggler": ["fabric", "gpu", "gpu_throttle", "fabric_congestion", "pcie_link"],
    "hang": ["gpu", "fabric"],
    "nccl_error": ["fabric", "gpu", "fabric_congestion"],
    "collective_cost": ["fabric_congestion", "fabric"],
    "pcie_contention": ["pcie_link"],
}


def _rank_text(g: dict[str, Any]) -> str:
    return f" (rank {g['rank']})" if g.get("rank") is not None else ""


def _gpu_text(g: dict[str, Any]) -> str:
    ev = g["events"]
    parts = [
        f"XID {x['code']}" + (f" ({x['meaning']})" if x["meaning"] else "")
        for x in ev.get("xid", [])
        if not x["application"]
    ]
    if "ecc_dbe" in ev:
        parts.append(f"{ev['ecc_dbe']} double-bit ECC error(s)")
    return f"GPU {g['gpu']} on {g['host']}{_rank_text(g)}: {', '.join(parts)}"


def _note(summary: dict[str, Any], t: _Target) -> str:
    """The cluster's word on the explained finding, in words."""
    parts = []
    if summary["ports_measured"]:
        parts.append("ports clean in the window" if summary["ports_clean"] else "port errors")
    else:
        parts.append("no port counters for these hosts")
    if summary["gpus_measured"]:
        parts.append("GPUs clean in the window" if summary["gpus_clean"] else "GPU events")
    else:
        parts.append("no GPU health fields for these hosts")
    if summary["cause"] is None:
        parts.append("the counters name no cause")
    return "; ".join(parts)


def peer_of(message: str) -> str | None:
    """The peer address an NCCL network error names (``peer 10.0.1.17<54313>``)."""
    m = _PEER.search(message)
    return m.group(1) if m else None
