"""Grafana dashboards for the agent's metrics, declared as data: the job view and the
node view, rendered to ``grafana/*.json``, and the checks' view of them (``queries``,
``substitute``: every panel's query as Grafana sends it).

Dashboards query the raw series, so they work before the rules are loaded.  The host's
name comes from ``ncclscope_node_info{hostname}`` joined ``on (job, instance)``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

__all__ = [
    "DASHBOARDS",
    "DATASOURCE",
    "MACROS",
    "THROTTLE_BITS",
    "TOP",
    "Panel",
    "Target",
    "dashboard_json",
    "job_dashboard",
    "node_dashboard",
    "node_view_panels",
    "pcie_ratio",
    "queries",
    "substitute",
]

from ncclscope.export.grafana.panels import Panel, Target

#: The datasource every panel, target and variable uses: the dashboard's variable.
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

_JOB = 'job=~"$job"'
#: How many of the worst ranks or nodes a panel shows: at 10,000 ranks a line per rank
#: is no picture.
TOP = 10
#: Keeps the series of the hosts picked in ``$host`` and adds their ``hostname``.
_ON_HOST = (
    " * on (job, instance) group_left (hostname)"
    ' ncclscope_node_info{job=~"$job", hostname=~"$host"}'
)


# --------------------------------------------------------------------------- dashboards


def _states(off: str, on: str) -> list[dict[str, Any]]:
    """Value mappings for a 0/1 series."""
    return [
        {
            "type": "value",
            "options": {
                "0": {"text": off, "color": "red" if off != "off" else "transparent"},
                "1": {"text": on, "color": "green" if off != "off" else "red"},
            },
        }
    ]


def _steps(*steps: tuple[float | None, str]) -> dict[str, Any]:
    return {
        "mode": "absolute",
        "steps": [{"color": color, "value": value} for value, color in steps],
    }


def _variable(name: str, label: str, query: str, *, all_value: str | None) -> dict[str, Any]:
    """A multi-value query variable, used inside ``=~``.  "All" is ``all_value``, or
    Grafana's ``(a|b|...)`` of the values where None (the job variable: "All" then
    means the ncclscope jobs, not every scrape job's ``up``)."""
    out: dict[str, Any] = {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "sort": 3 if name == "rank" else 1,
        "current": {},
        "hide": 0,
    }
    if all_value is not None:
        out["allValue"] = all_value
    return out


def _variables(*, rank: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "refresh": 1,
            "regex": "",
        },
        _variable("job", "Job", "label_values(ncclscope_build_info, job)", all_value=None),
        _variable(
            "host",
            "Host",
            'label_values(ncclscope_node_info{job=~"$job"}, hostname)',
            all_value=".*",
        ),
    ]
    if rank:
        out.append(
            _variable(
                "rank",
                "Rank",
                'label_values(ncclscope_collective_seq{job=~"$job"}, rank)',
                all_value=".*",
            )
        )
    return out


def _render_panel(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    targets = []
    for k, t in enumerate(panel.targets):
        target: dict[str, Any] = {
            "datasource": DATASOURCE,
            "refId": chr(ord("A") + k),
            "expr": t.expr,
            "legendFormat": t.legend or "__auto",
            "range": not t.instant,
            "instant": t.instant,
        }
        if t.instant:
            target["format"] = "table"
        elif panel.kind == "heatmap":
            # One row per series, ordered by the legend's number (the rank), not its text.
            target["format"] = "heatmap"
        targets.append(target)
    defaults: dict[str, Any] = {"unit": panel.unit} if panel.unit else {}
    defaults.update(panel.defaults)
    out: dict[str, Any] = {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": panel.w, "h": panel.h},
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": panel.options,
    }
    if panel.description:
        out["description"] = panel.description
    return out


def _dashboard(
    uid: str, title: str, description: str, rows: Sequence[Sequence[Panel]], *, rank: bool
) -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    for row in rows:
        x = 0
        for panel in row:
            panels.append(_render_panel(panel, len(panels) + 1, x, y))
            x += panel.w
        y += max(p.h for p in row)
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["ncclscope", "nccl"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "annotations": {"list": []},
        "links": [
            {
                "title": "ncclscope dashboards",
                "type": "dashboards",
                "tags": ["ncclscope"],
                "asDropdown": False,
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "templating": {"list": _variables(rank=rank)},
        "panels": panels,
        "version": 1,
    }


_TABLE = {"showHeader": True, "cellHeight": "sm"}
_LEGEND_TABLE = {
    "legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "max"]}
}


def job_dashboard() -> dict[str, Any]:
    """The job view: what the detectors say, the countdown to the collective timeout
    and whom it waits for, stragglers, lateness per rank, collective progress."""
    left = f"min by (comm) (ncclscope_timeout_remaining_seconds{{{_JOB}}})"
    rows = [
        [
            Panel(
                "stat",
                "Seconds left before the collective timeout",
                (Target(left, "{{comm}}"),),
                w=6,
                h=6,
                unit="s",
                description=(
                    "Per communicator with a collective some ranks entered and others did "
                    "not: the timeout in force minus how long the first rank has waited "
                    "(job-wide minimum over the nodes' agents)."
                ),
                options={"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "background"},
                defaults={"thresholds": _steps((None, "red"), (300, "orange"), (900, "green"))},
            ),
            Panel(
                "table",
                "Waiting for (the culprit)",
                (
                    Target(
                        f"max by (comm, rank, op) (ncclscope_timeout_culprit_info{{{_JOB}}})",
                        instant=True,
                    ),
                    Target(
                        f"max by (comm) (ncclscope_pending_collective_seq{{{_JOB}}})",
                        instant=True,
                    ),
                ),
                w=9,
                h=6,
                description=(
                    "The rank(s) a pending collective waits for, where a node's agent sees"
                    " both sides, its op, and its sequence number as the logs number it."
                ),
                options=_TABLE,
            ),
            Panel(
                "table",
                "Findings",
                (Target(f"max by (kind, severity) (ncclscope_findings{{{_JOB}}})", instant=True),),
                w=9,
                h=6,
                description="The detectors' current findings by kind and severity (count).",
                options=_TABLE,
            ),
        ],
        [
            Panel(
                "timeseries",
                "Timeout countdown and pending age",
                (
                    Target(left, "left {{comm}}"),
                    Target(
                        f"max by (comm) (ncclscope_pending_collective_age_seconds{{{_JOB}}})",
                        "pending {{comm}}",
                    ),
                ),
                w=12,
                h=8,
                unit="s",
            ),
            Panel(
                "timeseries",
                "Straggler score per rank",
                (
                    Target(
                        f"topk({TOP}, max by (rank) "
                        f'(ncclscope_straggler_score{{{_JOB}, rank=~"$rank"}}))',
                        "rank {{rank}}",
                    ),
                ),
                w=12,
                h=8,
                unit="percentunit",
                description=(
                    f"The {TOP} worst ranks at each time: a rank's excess median lateness over"
                    " the typical rank's, as a share of the gap between collectives: 0.05 is"
                    " the detectors' floor, 0.25 critical."
                ),
                options=_LEGEND_TABLE,
                defaults={"thresholds": _steps((None, "green"), (0.05, "orange"), (0.25, "red"))},
            ),
        ],
        [
            Panel(
                "timeseries",
                "Collectives behind the leaders, the nodes and ranks furthest behind",
                (
                    Target(
                        f"topk({TOP},\n"
                        f"  max by (comm) (ncclscope_node_collective_seq_max{{{_JOB}}})\n"
                        "    - on (comm) group_right ()\n"
                        "  max by (comm, hostname) (\n"
                        f"    ncclscope_node_collective_seq_min{{{_JOB}}}{_ON_HOST}\n"
                        "  )\n"
                        ")",
                        "{{hostname}} {{comm}}",
                    ),
                    Target(
                        f"topk({TOP},\n"
                        f"  max by (comm) (ncclscope_collective_seq{{{_JOB}}})\n"
                        "    - on (comm) group_right ()\n"
                        "  max by (comm, rank) "
                        f'(ncclscope_collective_seq{{{_JOB}, rank=~"$rank"}})\n'
                        ")",
                        "rank {{rank}} {{comm}}",
                    ),
                ),
                w=12,
                h=8,
                description=(
                    "Per communicator, how many collectives the last rank of each node is "
                    "behind the ranks furthest ahead, joined over every node's agent (from "
                    f"each node's summary), and the same for single ranks: the {TOP} furthest "
                    "behind of each. A running job shows 0-2; a stall shows its culprits "
                    "above 0 while the others wait."
                ),
                options=_LEGEND_TABLE,
            ),
            Panel(
                "timeseries",
                "Time since each node entered its highest collective",
                (
                    Target(
                        f"topk({TOP}, max by (comm, hostname) (\n"
                        f"  ncclscope_node_collective_wait_seconds{{{_JOB}}}{_ON_HOST}\n"
                        "))",
                        "{{hostname}} {{comm}}",
                    ),
                ),
                w=12,
                h=8,
                unit="s",
                description=(
                    "Since the first of a node's ranks entered the node's highest collective, "
                    f"on that node's agent's clock: the {TOP} longest. Every node near 0 on a "
                    "running job; in a stall the nodes' lines climb together (the collective "
                    "timeout fires when the leaders' reaches it), those behind highest."
                ),
                options=_LEGEND_TABLE,
            ),
        ],
        [
            Panel(
                "heatmap",
                "Arrival lateness per rank",
                (
                    Target(
                        f"topk({2 * TOP}, max by (rank) "
                        f'(ncclscope_collective_lateness_seconds{{{_JOB}, rank=~"$rank"}}))',
                        "{{rank}}",
                    ),
                ),
                w=12,
                h=9,
                unit="s",
                description=(
                    f"The {2 * TOP} latest ranks' median arrival after the first rank at "
                    "collectives, over time: a straggler is the row that stays hot."
                ),
                options={
                    "calculate": False,
                    "yAxis": {"axisLabel": "rank"},
                    "cellValues": {"unit": "s"},
                    "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
                    "rowsFrame": {"layout": "auto"},
                },
            ),
            Panel(
                "timeseries",
                "Collectives per second",
                (
                    Target(
                        "max by (comm) (rate(ncclscope_node_collective_seq_max"
                        f"{{{_JOB}}}[$__rate_interval]))",
                        "{{comm}} leaders",
                    ),
                    Target(
                        f"bottomk({TOP}, max by (comm, hostname) (\n"
                        "  rate(ncclscope_node_collective_seq_min"
                        f"{{{_JOB}}}[$__rate_interval]){_ON_HOST}\n"
                        "))",
                        "{{comm}} {{hostname}}",
                    ),
                ),
                w=12,
                h=9,
                unit="ops",
                description=(
                    "How fast each communicator's leaders advance, and the last rank of the "
                    f"{TOP} slowest nodes; a hung communicator drops to zero, the culprit's "
                    "node first."
                ),
            ),
        ],
        [
            Panel(
                "stat",
                "NCCL errors (WARN root causes)",
                (Target(f"sum(ncclscope_nccl_errors{{{_JOB}}}) or vector(0)", "errors"),),
                w=6,
                h=6,
                description=(
                    "NCCL WARN root causes in the followed logs, over the nodes (0: none); "
                    "the Findings table names them."
                ),
                options={"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "background"},
                defaults={"thresholds": _steps((None, "green"), (1, "red"))},
            ),
            Panel(
                "timeseries",
                "Last collective sequence number: the leaders and the nodes furthest behind",
                (
                    Target(
                        f"max by (comm) (ncclscope_node_collective_seq_max{{{_JOB}}})",
                        "{{comm}} leaders",
                    ),
                    Target(
                        f"bottomk({TOP}, min by (comm, hostname) (\n"
                        f"  ncclscope_node_collective_seq_min{{{_JOB}}}{_ON_HOST}\n"
                        "))",
                        "{{comm}} {{hostname}}",
                    ),
                ),
                w=18,
                h=6,
                description=(
                    "Each communicator's highest sequence number, and the lowest of the "
                    f"{TOP} nodes furthest behind (the number of collectives the agent counted "
                    "since it started)."
                ),
            ),
        ],
        [
            Panel(
                "timeseries",
                "Bus bandwidth per op and message size (NCCL Inspector)",
                (
                    Target(
                        "max by (op, size_bucket) "
                        f"(ncclscope_collective_bus_bandwidth_bytes_per_second{{{_JOB}}})",
                        "{{op}} {{size_bucket}} B",
                    ),
                ),
                w=24,
                h=8,
                unit="Bps",
                description=(
                    "NCCL Inspector's median bus bandwidth over the agent's window, per op "
                    "and power-of-two message size (the best of the nodes' agents). Empty "
                    "unless the agents follow Inspector output. A fall at one size while "
                    "the others hold points at a rank or a link, not the fabric; compare "
                    "with nccl-tests' bus bandwidth at the same size."
                ),
                options=_LEGEND_TABLE,
            ),
        ],
    ]
    # The job's nodes' ports and GPUs (other exporters' series), below the collectives
    # (imported here: ``fabric`` builds its panels on this module's Panel and Target).
    from ncclscope.export.grafana.fabric import fabric_panels

    rows += fabric_panels()
    return _dashboard(
        "ncclscope-job",
        "ncclscope / job",
        "A training job over NCCL, from the logs its ranks write: findings, the countdown "
        "to the collective timeout and its culprit, stragglers.",
        rows,
        rank=True,
    )


def pcie_ratio(matchers: str = "") -> str:
    """Each GPU's busier PCIe direction as a share of its link's one-direction capacity:
    ``max(tx, rx) / link max`` (``>`` keeps TX where it is the larger, ``or`` adds RX
    for the others)."""
    sel = f"{{{matchers}}}" if matchers else ""
    tx = f"ncclscope_gpu_pcie_tx_bytes_per_second{sel}"
    rx = f"ncclscope_gpu_pcie_rx_bytes_per_second{sel}"
    return f"({tx} > {rx} or {rx}) / ncclscope_gpu_pcie_link_max_bytes_per_second{sel}"


#: NVML clocks-event reasons worth a line each: (bit, name).
THROTTLE_BITS = (
    (0x4, "SW power cap"),
    (0x8, "HW slowdown"),
    (0x20, "SW thermal"),
    (0x40, "HW thermal"),
    (0x80, "HW power brake"),
)


def node_view_panels() -> list[list[Panel]]:
    """The node view's rows."""
    gpu = "{{hostname}} GPU {{gpu}}"
    reasons = tuple(
        Target(
            f"floor(ncclscope_gpu_clocks_event_reasons{{{_JOB}}} / {bit}) % 2{_ON_HOST}",
            f"{gpu} {name}",
        )
        for bit, name in THROTTLE_BITS
    )
    return [
        [
            Panel(
                "timeseries",
                "GPU memory used",
                (
                    Target(f"ncclscope_gpu_memory_used_bytes{{{_JOB}}}{_ON_HOST}", f"{gpu} used"),
                    Target(f"ncclscope_gpu_memory_total_bytes{{{_JOB}}}{_ON_HOST}", f"{gpu} total"),
                ),
                w=12,
                h=8,
                unit="bytes",
            ),
            Panel(
                "timeseries",
                "PCIe use of the link (busier direction)",
                (Target(f"({pcie_ratio(_JOB)}){_ON_HOST}", gpu),),
                w=12,
                h=8,
                unit="percentunit",
                description=(
                    "max(TX, RX) / the link's one-direction capacity at its maximum "
                    "generation and width. ZeRO offload at or above ~80% during the "
                    "optimizer step is contention."
                ),
                defaults={
                    "max": 1,
                    "min": 0,
                    "thresholds": _steps((None, "green"), (0.8, "red")),
                    "custom": {"thresholdsStyle": {"mode": "line"}},
                },
            ),
        ],
        [
            Panel(
                "timeseries",
                "PCIe throughput against capacity",
                (
                    Target(
                        f"ncclscope_gpu_pcie_tx_bytes_per_second{{{_JOB}}}{_ON_HOST}", f"{gpu} TX"
                    ),
                    Target(
                        f"ncclscope_gpu_pcie_rx_bytes_per_second{{{_JOB}}}{_ON_HOST}", f"{gpu} RX"
                    ),
                    Target(
                        f"ncclscope_gpu_pcie_link_max_bytes_per_second{{{_JOB}}}{_ON_HOST}",
                        f"{gpu} link max",
                    ),
                ),
                w=12,
                h=8,
                unit="Bps",
            ),
            Panel(
                "state-timeline",
                "Throttle (clocks-event) reasons",
                reasons,
                w=12,
                h=8,
                description="NVML's clocks-event reasons, one line per reason (1: active).",
                defaults={"mappings": _states("off", "on")},
            ),
        ],
        [
            Panel(
                "timeseries",
                "Host memory available",
                (
                    Target(
                        f"(ncclscope_host_memory_available_bytes{{{_JOB}}}"
                        f" / ncclscope_host_memory_total_bytes{{{_JOB}}}){_ON_HOST}",
                        "{{hostname}}",
                    ),
                ),
                w=8,
                h=8,
                unit="percentunit",
                defaults={"min": 0, "max": 1},
            ),
            Panel(
                "timeseries",
                "Swap used",
                (Target(f"ncclscope_host_swap_used_bytes{{{_JOB}}}{_ON_HOST}", "{{hostname}}"),),
                w=8,
                h=8,
                unit="bytes",
            ),
            Panel(
                "timeseries",
                "Swapping in and out",
                (
                    Target(
                        f"rate(ncclscope_host_swap_in_bytes_total{{{_JOB}}}[$__rate_interval])"
                        f"{_ON_HOST}",
                        "{{hostname}} in",
                    ),
                    Target(
                        f"rate(ncclscope_host_swap_out_bytes_total{{{_JOB}}}[$__rate_interval])"
                        f"{_ON_HOST}",
                        "{{hostname}} out",
                    ),
                ),
                w=8,
                h=8,
                unit="Bps",
            ),
        ],
        [
            Panel(
                "timeseries",
                "GPU temperature",
                (Target(f"ncclscope_gpu_temperature_celsius{{{_JOB}}}{_ON_HOST}", gpu),),
                w=12,
                h=7,
                unit="celsius",
            ),
            Panel(
                "timeseries",
                "GPU power against its limit",
                (
                    Target(
                        f"(ncclscope_gpu_power_watts{{{_JOB}}}"
                        f" / ncclscope_gpu_power_limit_watts{{{_JOB}}}){_ON_HOST}",
                        gpu,
                    ),
                ),
                w=12,
                h=7,
                unit="percentunit",
            ),
        ],
        [
            Panel(
                "state-timeline",
                "Agent up (scraped)",
                (Target(f"up{{{_JOB}}}", "{{instance}}"),),
                w=6,
                h=7,
                description="Whether Prometheus reached each agent (see NcclscopeAgentDown).",
                defaults={"mappings": _states("down", "up")},
            ),
            Panel(
                "state-timeline",
                "Collectors succeeding",
                (
                    Target(
                        f"ncclscope_scrape_collector_success{{{_JOB}}}{_ON_HOST}",
                        "{{hostname}} {{collector}}",
                    ),
                ),
                w=6,
                h=7,
                description="0: the collector's last run failed (nvml: no driver or GPU).",
                defaults={"mappings": _states("failing", "ok")},
            ),
            Panel(
                "timeseries",
                "Agent CPU per collector",
                (
                    Target(
                        f"rate(ncclscope_sample_cpu_seconds_total{{{_JOB}}}[$__rate_interval])"
                        f"{_ON_HOST}",
                        "{{hostname}} {{collector}}",
                    ),
                ),
                w=6,
                h=7,
                unit="percentunit",
                description="CPU seconds per second the agent spent in each collector.",
            ),
            Panel(
                "timeseries",
                "Collector run time",
                (
                    Target(
                        f"ncclscope_scrape_collector_duration_seconds{{{_JOB}}}{_ON_HOST}",
                        "{{hostname}} {{collector}}",
                    ),
                ),
                w=6,
                h=7,
                unit="s",
            ),
        ],
    ]


def node_dashboard() -> dict[str, Any]:
    """The node view: GPU memory, PCIe against capacity, throttling, host memory and
    swap, and the agent's own health."""
    return _dashboard(
        "ncclscope-node",
        "ncclscope / node",
        "The nodes of a training job, from ncclscope agent: GPU memory, PCIe against the "
        "link's capacity, throttle reasons, host memory and swap, the agent's health.",
        node_view_panels(),
        rank=False,
    )


#: File name in ``grafana/`` -> the dashboard.
DASHBOARDS = {
    "ncclscope-job.json": job_dashboard,
    "ncclscope-node.json": node_dashboard,
}


def dashboard_json(name: str) -> str:
    """A dashboard as the file ``grafana/<name>`` holds it."""
    return json.dumps(DASHBOARDS[name](), indent=2) + "\n"


# --------------------------------------------------------------------------- checks

#: Grafana's interval macros, as a 1 s scrape makes them (``$__rate_interval`` is at
#: least four scrape intervals).
MACROS = {"$__rate_interval": "1m", "${__rate_interval}": "1m", "$__interval": "15s"}


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(panel title, expr, legend)`` of every target of every panel (rows included)."""
    out = []
    for panel in dashboard["panels"]:
        for sub in [panel, *panel.get("panels", [])]:
            out += [
                (sub["title"], t["expr"], t.get("legendFormat", ""))
                for t in sub.get("targets", [])
                if t.get("expr")
            ]
    return out


def substitute(expr: str, values: dict[str, str] | None = None) -> str:
    """``expr`` as Grafana sends it: macros replaced (``MACROS``), and each ``$var`` or
    ``${var}`` by ``values[var]``, else ``.*`` (every template variable is used inside
    ``=~``); ``$1`` and the like are label_replace's groups, not variables.

    >>> substitute('rate(x{job=~"$job"}[$__rate_interval])')
    'rate(x{job=~".*"}[1m])'
    """
    for macro, value in MACROS.items():
        expr = expr.replace(macro, value)
    given = values or {}
    # ``$1`` (label_replace's group) is no variable: Grafana leaves it as it is.
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: given.get(m.group(1), ".*"), expr)
