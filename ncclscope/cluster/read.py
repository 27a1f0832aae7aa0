"""Read what the cluster's exporters measured for a job's hosts and time window
(``analyze --prometheus``): a fixed handful of requests whatever the job's size.

1. ``identity`` (``/api/v1/series``): every target (``up``) and the series that name
   their node (``ncclscope.cluster.hosts``): which instances are the job's hosts.
2. ``changed`` (an instant query at the window's end, each sample read once): the
   instances whose error counters changed or whose event gauges were not 0 in the
   window; none on a clean fabric.
3. Range queries over the window, every ``step_s`` (the window / 240, between 15 s and
   300 s), for those instances only (:data:`QUERIES`):

   - ``ports_errors`` (only of the instances ``changed`` named; not asked where it named
     none): node_exporter's InfiniBand error counters' rise since the step before,
     ``(x - x offset r) > 0`` every ``r`` (the step, 60 s at least): sparse, and the
     steps' rises add up to the counter's, a jump between two scrapes counted once
     wherever it falls (``increase(x[r])`` at steps ``r`` apart reads each window's own
     samples only, and misses a jump between the last scrape of one window and the
     first of the next: half the single bursts at 30 s scrapes and r = 60 s); a series
     that began within the step, its ``increase``.  A counter that went back (its
     exporter restarted) counts nothing for that step.  A row at ``t`` stands for
     ``(t - r, t]``;
   - ``ports_rates``: transmit wait and data, ``rate(...[r])`` per second;
   - ``ports_state``: the link's logical and physical state only where not ACTIVE (4) /
     LinkUp (5); ``ports_static``: its rate (``rate_bytes_per_second``) at a quarter of
     the window;
   - ``gpus_events`` (as ``ports_errors``): dcgm-exporter's error counters' rises (ECC,
     PCIe replays, NVLink CRC/replay/recovery, remapped rows), and its XID (the last
     XID's code) and row-remap failure gauges where not 0, every ``r``;
   - ``gpus_gauges``: clocks-event (throttle) reasons and (where enabled) the PCIe
     link's generation and width, every step;
   - ``agent`` and ``agent_static``: the agent's own series the detectors read (GPU
     memory, PCIe traffic and link, XIDs, ECC, host memory and swap, the learned log
     clock) as ``--telemetry`` gives them (TELEMETRY_SCHEMA); those that hardly change
     (totals, capacities, identity, the PCIe link, ECC) at a quarter of the window.

The dense queries bound the read's time: at 128 nodes (8 ports, 8 GPUs each) over 6
hours about 50 series a node come back 241 samples each (benchmarks/README.md).  The
rises are the costliest to compute (two selections and a join per step and series):
asked of every port they took 3x the time ``increase`` did, hence ``changed`` first.

Every request is an :class:`~ncclscope.cluster.tables.Ask`; nothing raises.  The
requests go :data:`PARALLEL` at a time; a timeout or an unreachable server stops the read
there (what was not yet asked would wait as long): what was read is kept, and
``problems`` says what was not.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

import polars as pl

from ncclscope.catalog import by_name
from ncclscope.cluster.hosts import IDENTITY, IDENTITY_MATCHES, HostMatcher, map_instances
from ncclscope.cluster.prometheus import Answer, PromClient, Series
from ncclscope.cluster.tables import Ask, ClusterTables
from ncclscope.schema import GPU_SAMPLES_SCHEMA, PORT_SAMPLES_SCHEMA, TELEMETRY_SCHEMA, TS

__all__ = [
    "AGENT_DENSE",
    "AGENT_STATIC",
    "GPU_COUNTERS",
    "GPU_EVENTS",
    "GPU_GAUGES",
    "PORT_COUNTERS",
    "PORT_RATES",
    "QUERIES",
    "STOPS",
    "alternation",
    "promql_string",
    "read_cluster",
    "step_for",
]

#: Points per series over the window, and the bounds of the step.
STEPS = 240
STEP_MIN_S = 15.0
STEP_MAX_S = 300.0
#: Counters' increases and rates look back at least this far (two scrapes at 30 s).
RANGE_MIN_S = 60.0
#: Prometheus' lookback: an instant selector reads the latest sample this far back.
_LOOKBACK_S = 300.0
#: Requests in flight at once (after ``identity``).
PARALLEL = 3
#: Unmatched instances kept in ``ClusterTables.instances`` (a cluster's other nodes).
_KEPT_UNMATCHED = 50
#: Instances listed by name in a problem line before "and N more".
_LISTED = 8

_IB = "node_infiniband_"
#: node_exporter's InfiniBand error counters (its names less ``node_infiniband_``).
PORT_COUNTERS = (
    "symbol_error_total",
    "link_downed_total",
    "link_error_recovery_total",
    "port_errors_received_total",
    "port_receive_remote_physical_errors_total",
    "local_link_integrity_errors_total",
    "excessive_buffer_overrun_errors_total",
    "port_discards_transmitted_total",
)
#: Counters read as per-second rates: waiting for credits, data sent (what is received
#: is another port's sent).
PORT_RATES = (
    "port_transmit_wait_total",
    "port_data_transmitted_bytes_total",
)
#: Port gauges read where not healthy: name -> the healthy value.
PORT_STATES = {"state_id": 4, "physical_state_id": 5}
#: Port gauges that hardly change, read at a quarter of the window: the link's rate.
PORT_GAUGES = ("rate_bytes_per_second",)

#: dcgm-exporter's counters read as increases (etc/default-counters.csv and DCGM's
#: field list; ECC, NVLink errors are commented out in its default list, on in many).
GPU_COUNTERS = (
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
)
#: dcgm-exporter's gauges read only where they say something: name -> PromQL condition
#: (XID_ERRORS is the last XID's code: 0 until one).
GPU_EVENTS = {
    "DCGM_FI_DEV_XID_ERRORS": "!= 0",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "!= 0",
}
#: dcgm-exporter's gauges read every step: the clocks-event reasons (a bitmask, NVML's:
#: 0x1 idle, 0x2 application clocks, 0x4 power cap, 0x8 HW slowdown, 0x20/0x40 thermal,
#: ...; CLOCK_THROTTLE_REASONS before DCGM 3.3) and, where enabled, the PCIe link's
#: generation and width.  (The SM clock and temperature are left: what slows a GPU is in
#: the reasons, and every sample costs the read time.)
GPU_GAUGES = (
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_DEV_PCIE_LINK_GEN",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH",
)

#: The agent's series the detectors read (``ncclscope.catalog`` names), every step.
AGENT_DENSE = (
    "ncclscope_gpu_memory_used_bytes",
    "ncclscope_gpu_pcie_tx_bytes_per_second",
    "ncclscope_gpu_pcie_rx_bytes_per_second",
    "ncclscope_gpu_xid_errors_total",
    "ncclscope_host_memory_available_bytes",
    "ncclscope_host_swap_used_bytes",
    "ncclscope_host_swap_in_bytes_total",
    "ncclscope_host_swap_out_bytes_total",
)
#: ... and those that hardly change (identity, totals, capacities, the PCIe link, ECC
#: errors), at a quarter of the window.
AGENT_STATIC = (
    "ncclscope_gpu_info",
    "ncclscope_gpu_pcie_link_generation",
    "ncclscope_gpu_pcie_link_width",
    "ncclscope_gpu_ecc_uncorrected_errors_total",
    "ncclscope_gpu_memory_total_bytes",
    "ncclscope_gpu_pcie_link_max_bytes_per_second",
    "ncclscope_gpu_pcie_uplink_info",
    "ncclscope_pcie_uplink_generation",
    "ncclscope_pcie_uplink_width",
    "ncclscope_pcie_uplink_max_bytes_per_second",
    "ncclscope_pcie_uplink_gpus",
    "ncclscope_host_memory_total_bytes",
    "ncclscope_gpu_power_limit_watts",
    "ncclscope_log_utc_offset_seconds",
)
_STATIC_POINTS = 4

#: The label a query's ``label_replace`` names each branch's metric by (rate and
#: increase drop ``__name__``).
_METRIC = "ncclscope_metric"


def step_for(start: datetime, end: datetime) -> float:
    """The window / 240, between 15 s and 300 s, in whole seconds.

    >>> from datetime import UTC, datetime, timedelta
    >>> t = datetime(2026, 1, 1, tzinfo=UTC)
    >>> step_for(t, t + timedelta(hours=6)), step_for(t, t + timedelta(minutes=10))
    (90.0, 15.0)
    """
    window = max((end - start).total_seconds(), 0.0)
    return float(round(min(max(window / STEPS, STEP_MIN_S), STEP_MAX_S)))


def promql_string(text: str) -> str:
    """A PromQL string literal (Go's escapes, as JSON writes them)."""
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{out}"'


_RE2_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


def alternation(values: Iterable[str]) -> str:
    """``values`` as a regular expression's alternatives, each matched literally.

    >>> alternation(["node-b", "10.0.0.1:9100"])
    '10\\\\.0\\\\.0\\\\.1:9100|node-b'
    """
    return "|".join(_RE2_SPECIAL.sub(r"\\\1", v) for v in sorted(set(values)))


def _named(expr: str, metric: str) -> str:
    return f'label_replace({expr}, "{_METRIC}", {promql_string(metric)}, "", "")'


def _either(parts: list[str]) -> str:
    return " or ".join(f"({p})" for p in parts)


@dataclass(frozen=True)
class Query:
    """One range query of the read: ``expr(selector, step_s, range_s)`` -> PromQL, the
    table its series fill, the kind its values are (None: each branch's own), and whether
    it is read at a coarse step."""

    what: str
    table: str  # ports | gpus | telemetry
    expr: Callable[[str, float, float], str]
    coarse: bool = False
    #: counters' rises: read every ``max(step, 60 s)``, each since the step before, so
    #: that they add up to the counter's
    increases: bool = False


def _rise(series: str, r: float) -> str:
    """How much the counter ``series`` rose since ``r`` seconds before, where it did;
    where it has no sample then (its exporter began scraping since), its ``increase``
    over the samples it has."""
    before = f"{series} offset {r:g}s"
    return f"({series} - {before}) > 0 or (increase({series}[{r:g}s]) > 0 unless {before})"


def _ports_errors(sel: str, _step: float, r: float) -> str:
    return _either([_named(_rise(f"{_IB}{c}{{{sel}}}", r), f"increase:{c}") for c in PORT_COUNTERS])


def _changed(sel: str, reach: str) -> str:
    """The series (of ``sel``'s instances) whose error counters changed or whose event
    gauges were not 0 in the last ``reach``, tagged by their table (``ports``,
    ``gpus``): an instant query, each sample read once."""
    parts = [_named(f"changes({_IB}{c}{{{sel}}}[{reach}]) > 0", "ports") for c in PORT_COUNTERS]
    parts += [_named(f"changes({c}{{{sel}}}[{reach}]) > 0", "gpus") for c in GPU_COUNTERS]
    for g in GPU_EVENTS:
        parts += [
            _named(f"{f}_over_time({g}{{{sel}}}[{reach}]) != 0", "gpus") for f in ("max", "min")
        ]
    return _either(parts)


def _ports_rates(sel: str, _step: float, r: float) -> str:
    return _either(
        [_named(f"rate({_IB}{c}{{{sel}}}[{r:g}s])", f"rate_per_s:{c}") for c in PORT_RATES]
    )


def _ports_state(sel: str, _step: float, _r: float) -> str:
    return _either(
        [_named(f"{_IB}{g}{{{sel}}} != {ok}", f"gauge:{g}") for g, ok in PORT_STATES.items()]
    )


def _ports_static(sel: str, _step: float, _r: float) -> str:
    return f"{{__name__=~{_names(_IB + g for g in PORT_GAUGES)}, {sel}}}"


def _gpus_events(sel: str, _step: float, r: float) -> str:
    parts = [_named(_rise(f"{c}{{{sel}}}", r), f"increase:{c}") for c in GPU_COUNTERS]
    parts += [_named(f"{g}{{{sel}}} {cond}", f"gauge:{g}") for g, cond in GPU_EVENTS.items()]
    return _either(parts)


def _names(names: Iterable[str]) -> str:
    return promql_string("|".join(names))


def _gpus_gauges(sel: str, _step: float, _r: float) -> str:
    return f"{{__name__=~{_names(GPU_GAUGES)}, {sel}}}"


def _agent(sel: str, _step: float, _r: float) -> str:
    return f"{{__name__=~{_names(AGENT_DENSE)}, {sel}}}"


def _agent_static(sel: str, _step: float, _r: float) -> str:
    return f"{{__name__=~{_names(AGENT_STATIC)}, {sel}}}"


#: The read's range queries, in order.
QUERIES = (
    Query("ports_errors", "ports", _ports_errors, increases=True),
    Query("ports_rates", "ports", _ports_rates),
    Query("ports_state", "ports", _ports_state),
    Query("ports_static", "ports", _ports_static, coarse=True),
    Query("gpus_events", "gpus", _gpus_events, increases=True),
    Query("gpus_gauges", "gpus", _gpus_gauges),
    Query("agent", "telemetry", _agent),
    Query("agent_static", "telemetry", _agent_static, coarse=True),
)

#: Answers after which nothing more is asked (what was not yet asked would wait as long).
STOPS = ("timeout", "unreachable")
#: A read that answered but found none of these series for the job's hosts says so.
_NO_DATA = {"ports_rates": "InfiniBand port", "gpus_gauges": "dcgm-exporter GPU",
            "agent": "agent"}  # fmt: skip


@dataclass
class _Rows:
    """Columns of one table, filled series by series."""

    names: tuple[str, ...]

    def __post_init__(self) -> None:
        self.cols: dict[str, list[object]] = {n: [] for n in self.names}  # one per series
        self.sizes: list[int] = []
        self.ts: list[float] = []
        self.value: list[float] = []

    def add(self, s: Series, **labels: object) -> None:
        if not s.values:
            return
        for k, v in labels.items():
            self.cols[k].append(v)
        self.sizes.append(len(s.values))
        self.ts.extend(s.ts)
        self.value.extend(s.values)

    def frame(self, schema: pl.Schema) -> pl.DataFrame:
        if not self.ts:
            return pl.DataFrame(schema=schema)
        each = pl.DataFrame({k: pl.Series(k, v, schema[k]) for k, v in self.cols.items()})
        rows = pl.DataFrame({"i": range(len(self.sizes)), "n": self.sizes}).select(
            pl.col("i").repeat_by("n").explode()
        )["i"]
        us = pl.Series("ts", self.ts, pl.Float64) * 1e6
        return (
            each[rows]
            .with_columns(
                us.round(0).cast(pl.Int64).cast(TS).alias("ts"),
                pl.Series("value", self.value, pl.Float64),
            )
            .select(list(schema))
            .sort("ts")
        )


def _split(labels: dict[str, str], prefix: str) -> tuple[str, str]:
    """(kind, metric) of a series: from the query's ``label_replace`` where it named it,
    else its own name (a plain selector's ``gauge``)."""
    tagged = labels.get(_METRIC)
    if tagged and ":" in tagged:
        kind, metric = tagged.split(":", 1)
        return kind, metric
    name = labels.get("__name__", "")
    return "gauge", name.removeprefix(prefix)


def read_cluster(
    client: PromClient,
    hosts: list[str],
    start: datetime,
    end: datetime,
) -> ClusterTables:
    """What the cluster's Prometheus (``client``) holds for the log hosts ``hosts`` from
    ``start`` to ``end`` (aware datetimes): ports, GPUs, the agent's series, which
    instance is which host, every request and the problems, in words."""
    step = step_for(start, end)
    problems: list[str] = []
    out = ClusterTables(url=client.url, start=start, end=end, step_s=step, asks=client.asks,
                        problems=problems)  # fmt: skip
    if not hosts:
        problems.append("the logs name no host: nothing to read for")
        return out
    ident = client.series(IDENTITY_MATCHES, start, end, what="identity")
    if not ident.answered:
        problems.append(
            _stopped(ident.ask, "no scraped instance could be matched, nothing was read")
        )
        return out
    labels = [s.labels for s in ident.series]
    instances = map_instances(labels, hosts)
    matched = instances.filter(pl.col("host").is_not_null())
    found = set(matched["host"].to_list())
    missing = [h for h in hosts if h not in found]
    if missing:
        problems.append(
            f"{len(missing)} of {len(hosts)} log hosts named by no exporter in Prometheus: "
            + _listed(missing)
        )
    _unmatched(instances, labels, problems)
    if matched.is_empty():
        problems.append("no scraped instance is a host of the logs: nothing more was read")
        return _with(out, instances=_kept(instances))
    where = {(r["instance"]): r["host"] for r in matched.iter_rows(named=True)}
    sel = f"instance=~{promql_string(alternation(where))}"
    r = max(step, RANGE_MIN_S)
    match = HostMatcher(hosts)
    ports = _Rows(("host", "device", "port", "metric", "kind"))
    gpus = _Rows(("host", "gpu", "uuid", "metric", "kind"))
    tel = _Rows(("host", "metric", "labels"))
    catalog = by_name()
    seen: dict[str, int] = {}
    stop = threading.Event()

    def ask(q: Query, on: str = sel) -> Answer | None:
        if stop.is_set():
            return None
        q_step = step
        if q.coarse:
            q_step = max(step, (end - start).total_seconds() / _STATIC_POINTS)
        elif q.increases:
            q_step = r
        q_step = float(round(q_step))
        answer = client.range(q.expr(on, q_step, r), start, end, q_step, what=q.what)
        if answer.ask.status in STOPS:
            stop.set()
        return answer

    def moved() -> dict[str, set[str]] | None:
        """The instances, per table, whose error counters or event gauges moved."""
        # back to the first rise's own baseline: a step before the window, and the
        # lookback (5 min) within which its sample may lie
        reach = f"{round((end - start).total_seconds() + r + _LOOKBACK_S)}s"
        answer = client.instant(_changed(sel, reach), end, what="changed")
        if answer.ask.status in STOPS:
            stop.set()
        if not answer.answered:
            return None
        out: dict[str, set[str]] = {"ports": set(), "gpus": set()}
        for s in answer.series:
            out.setdefault(s.labels.get(_METRIC, ""), set()).add(s.labels.get("instance", ""))
        return out

    # A few at once: Prometheus evaluates one while this process parses another.  The
    # counters' rises are dense to compute (two selections and a join, every step, for
    # every port and GPU), so they are asked only of the instances whose counters moved
    # at all in the window (one instant query): none, on a clean fabric.
    answers: dict[str, Answer | None] = {}
    needless: list[str] = []
    dense_queries = [q for q in QUERIES if not q.increases]
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        # The rises are asked before the rest of the dense queries, as soon as it is
        # known where: an error counter says more than a rate.
        changed = pool.submit(moved)
        dense = {q.what: pool.submit(ask, q) for q in dense_queries[: PARALLEL - 1]}
        where_moved = changed.result()
        sparse = {}
        for q in QUERIES:
            if not q.increases:
                continue
            if where_moved is None:  # not known: every instance
                sparse[q.what] = pool.submit(ask, q)
            elif where_moved.get(q.table):
                on = f"instance=~{promql_string(alternation(where_moved[q.table]))}"
                sparse[q.what] = pool.submit(ask, q, on)
            else:
                needless.append(q.what)
        dense |= {q.what: pool.submit(ask, q) for q in dense_queries[PARALLEL - 1 :]}
        for what, fut in (dense | sparse).items():
            answers[what] = fut.result()
    order = {q.what: k for k, q in enumerate(QUERIES)}
    client.asks.sort(key=lambda a: order.get(a.what, -1))
    problems.extend(
        _stopped(a, "what was not yet asked then was not") for a in client.asks if a.status in STOPS
    )
    skipped = [q.what for q in QUERIES if q.what not in needless and answers.get(q.what) is None]
    if skipped:
        problems.append("not asked: " + ", ".join(skipped))
    for q in QUERIES:
        answer = answers.get(q.what)
        if answer is None:
            continue
        for s in answer.series:
            host = where.get(s.labels.get("instance", ""))
            if q.table == "gpus":
                host = match(IDENTITY["DCGM_FI_"].name(s.labels)) or host
            if host is None:
                continue
            seen[q.what] = seen.get(q.what, 0) + 1
            if q.table == "ports":
                kind, metric = _split(s.labels, _IB)
                ports.add(s, host=host, device=s.labels.get("device", ""),
                          port=s.labels.get("port", ""), metric=metric, kind=kind)  # fmt: skip
            elif q.table == "gpus":
                kind, metric = _split(s.labels, "")
                uuid = s.labels.get("UUID") or s.labels.get("uuid")
                gpus.add(s, host=host, gpu=s.labels.get("gpu", ""), uuid=uuid, metric=metric,
                         kind=kind)  # fmt: skip
            else:
                name = s.labels.get("__name__", "")
                m = catalog.get(name)
                names = m.labels if m is not None else ()
                tel.add(s, host=host, metric=name,
                        labels=",".join(s.labels.get(x, "") for x in names))  # fmt: skip
    if client.nonfinite:
        problems.append(f"{client.nonfinite} NaN or infinite values dropped")
    answered = {a.what for a in client.asks if a.status in ("ok", "partial", "truncated")}
    for what, whose in _NO_DATA.items():
        if what in answered and not seen.get(what):
            problems.append(f"no {whose} series for the job's hosts in this window")
    return _with(
        out,
        instances=_kept(instances),
        ports=ports.frame(PORT_SAMPLES_SCHEMA),
        gpus=gpus.frame(GPU_SAMPLES_SCHEMA),
        telemetry=tel.frame(TELEMETRY_SCHEMA),
    )


def _with(out: ClusterTables, **tables: pl.DataFrame) -> ClusterTables:
    from dataclasses import replace

    return replace(out, **tables)  # type: ignore[arg-type]


def _kept(instances: pl.DataFrame) -> pl.DataFrame:
    """The matched instances, and the first few of those that said a name of their own
    that matched no log host (the cluster's other nodes, or a label spelled otherwise)."""
    matched = instances.filter(pl.col("host").is_not_null())
    said = instances.filter(pl.col("host").is_null() & (pl.col("how") != "instance"))
    return pl.concat([matched, said.head(_KEPT_UNMATCHED)])


def _unmatched(instances: pl.DataFrame, labels: list[dict[str, str]], problems: list[str]) -> None:
    """Instances no log host matched, in one line: the names they said, to compare."""
    named: dict[str, str] = {}
    for lab in labels:
        for key in ("nodename", "Hostname", "hostname"):
            if lab.get(key) and lab.get("instance"):
                named.setdefault(lab["instance"], lab[key])
    off = instances.filter(pl.col("host").is_null())
    if off.is_empty():
        return
    shown = [
        f"{r['instance']} ({r['how']}: {named[r['instance']]})"
        if r["instance"] in named
        else f"{r['instance']}"
        for r in off.iter_rows(named=True)
    ]
    problems.append(
        f"{len(off)} scraped instances matched no log host (other nodes, or names spelled "
        "otherwise; IP addresses are never matched): " + _listed(shown)
    )


def _listed(items: list[str]) -> str:
    more = len(items) - _LISTED
    return ", ".join(items[:_LISTED]) + (f" and {more} more" if more > 0 else "")


def _stopped(a: Ask, rest: str) -> str:
    return f"Prometheus {a.status} at {a.what} ({a.message or 'no message'}): {rest}"
