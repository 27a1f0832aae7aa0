"""The cluster's own exporters joined with the agents' alerts (issue #29, "the same
live"): node_exporter's InfiniBand collector and dcgm-exporter's GPU health fields,
whose series every GPU cluster already has in its Prometheus, named by host so that a
slow node, a stall or a lost node is shown with its ports' errors and its GPUs' XIDs.

The three sources name a node each their own way:

- the agent: ``ncclscope_node_info{hostname}`` and ``ncclscope_rank_info{hostname}``,
  the host as NCCL's log lines spell it (``gethostname()``: short or fully qualified);
- node_exporter (``instance`` = ``host:9100``): ``node_uname_info{nodename}``;
- dcgm-exporter (``instance`` = ``host:9400``): its ``Hostname`` label (``hostname``
  since NVIDIA/dcgm-exporter#655, May 2026; the node's name, ``NODE_NAME`` under
  Kubernetes), else nothing but the instance.

The rules give each a ``host`` label, the short name (the part before the first dot),
and join on it; an exporter's instance is never compared with another's (ports differ,
relabelling differs).  A dcgm-exporter series without ``Hostname`` takes the instance's
host part unless that is an IP address's (never matched).  PromQL cannot fold case:
a cluster whose hosts are spelt in different cases by its exporters needs a relabelling
rule.

Every recording rule here reads node_exporter's and dcgm-exporter's series once per
15 s and records only what is wrong (an error counter that rose, a GPU's XID): a
healthy fabric records nothing but the two name maps, and the joins behind the alerts
read a handful of series (``benchmarks/bench_rules.py --fabric``).

Names verified against node_exporter 1.5's InfiniBand collector (Debian's package, on
a sysfs tree) and dcgm-exporter's ``etc/default-counters.csv`` (``XID_ERRORS``,
``PCIE_REPLAY_COUNTER``, ``UNCORRECTABLE_REMAPPED_ROWS``, ``ROW_REMAP_FAILURE`` are in
its default list; the ECC volatile totals and the clocks-event reasons are fields a site
adds; ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` is the reasons' name before DCGM 3.3).
"""

from __future__ import annotations

from ncclscope.cluster.hosts import DCGM_HOST_LABELS
from ncclscope.export.grafana.panels import Panel, Target
from ncclscope.units import CLOCK_EVENT_BITS, SLOWDOWN_BITS

__all__ = [
    "DCGM_FAULT_FIELDS",
    "DCGM_FIELDS",
    "DCGM_LABELS",
    "EXTERNAL_METRICS",
    "FABRIC_WINDOW",
    "GPU_WINDOW",
    "HW_SLOWDOWN_BITS",
    "IB_ERROR_COUNTERS",
    "IB_FLAP_COUNTERS",
    "dcgm_host",
    "fabric_alerts",
    "fabric_panels",
    "fabric_rules",
    "host_causes",
    "reads_other_exporters",
    "slow_node_causes",
]

#: node_exporter's InfiniBand error counters (its names without ``node_infiniband_``):
#: each rise is a port problem on a healthy fabric.
IB_ERROR_COUNTERS = (
    "symbol_error_total",
    "port_errors_received_total",
    "port_receive_remote_physical_errors_total",
    "local_link_integrity_errors_total",
    "excessive_buffer_overrun_errors_total",
    "port_discards_transmitted_total",
)
#: ... and those that count a link that went down or retrained: a flapping port.
IB_FLAP_COUNTERS = ("link_downed_total", "link_error_recovery_total")
#: How far back a port's errors count: the slow-node alert's own window (5 minutes'
#: average, 5 more of ``for``).
FABRIC_WINDOW = "10m"
#: How far back a GPU's XID or uncorrectable error counts (an XID 79 stays relevant to a
#: stall that began minutes later).
GPU_WINDOW = "15m"
#: How far back the joined alerts look for the agents' alert: four of the fabric group's
#: 15 s evaluations, so that a stall alert firing between two of them (the stall group
#: runs every second) is joined all the same; the join outlives it by as much.
ALERT_SEEN = "1m"
#: NVML clocks-event reasons that slow a GPU down for its hardware's sake: HW slowdown,
#: SW thermal, HW thermal, HW power brake (the SW power cap, 0x4, is a loaded GPU's
#: normal state).
HW_SLOWDOWN_BITS = tuple(b for b in CLOCK_EVENT_BITS if b & SLOWDOWN_BITS)
#: dcgm-exporter's labels on every field.
DCGM_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id", "hostname")
#: dcgm-exporter fields that say a GPU is failing: recorded where they rose.
DCGM_FAULT_FIELDS = (
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
)
#: Every dcgm-exporter field the rules and panels read.
DCGM_FIELDS = (
    "DCGM_FI_DEV_XID_ERRORS",
    *DCGM_FAULT_FIELDS,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
)
_IB_PORT = ("device", "port")
#: Series of other exporters the rules and dashboards read, with their labels (besides
#: ``job`` and ``instance``): the checks in tests/test_grafana.py hold them to these.
EXTERNAL_METRICS: dict[str, tuple[str, ...]] = {
    **{f"node_infiniband_{c}": _IB_PORT for c in (*IB_ERROR_COUNTERS, *IB_FLAP_COUNTERS)},
    "node_infiniband_port_transmit_wait_total": _IB_PORT,
    "node_infiniband_port_data_transmitted_bytes_total": _IB_PORT,
    "node_infiniband_port_data_received_bytes_total": _IB_PORT,
    "node_infiniband_rate_bytes_per_second": _IB_PORT,
    "node_infiniband_state_id": _IB_PORT,
    "node_infiniband_physical_state_id": _IB_PORT,
    "node_uname_info": ("nodename", "sysname", "release", "version", "machine", "domainname"),
    **{f: DCGM_LABELS for f in DCGM_FIELDS},
    # Prometheus' own: the alerts' state, with the labels of ncclscope's alerts.
    "ALERTS": ("alertname", "alertstate", "severity", "hostname", "comm", "rank", "op"),
}


def reads_other_exporters(expr: str) -> bool:
    """Whether ``expr`` reads node_exporter's or dcgm-exporter's series (a Prometheus
    scraping only ncclscope's agents has none)."""
    return "node_infiniband_" in expr or "node_uname_info" in expr or "DCGM_FI_" in expr


#: A host's short name from a label: the part before the first dot.
_SHORT = "([^.]+).*"
#: ... from an instance ``host:port``, unless the host is an IP address (its first part
#: all digits): then no ``host`` at all.
_SHORT_INSTANCE = "([^.:]*[^0-9.:][^.:]*)[.:].*"

_UNAME = "instance_host:ncclscope_node_exporter_uname:short"
_JOB_HOST = "job_host:ncclscope_rank_info:short"
_PORT_ERRORS = f"host_device_port_counter:ncclscope_ib_port_errors:increase{FABRIC_WINDOW}"
_HOST_PORT_ERRORS = f"host:ncclscope_ib_port_errors:increase{FABRIC_WINDOW}"
_XID = f"host_gpu:ncclscope_dcgm_xid:max{GPU_WINDOW}"
_GPU_ERRORS = f"host_gpu_field:ncclscope_dcgm_gpu_errors:increase{GPU_WINDOW}"
_HW_SLOWDOWN = "host_gpu:ncclscope_dcgm_clocks_event_reasons:hw_slowdown"
_HOST_GPU_FAULTS = f"host:ncclscope_dcgm_gpu_faults:count{GPU_WINDOW}"
_HOST_HW_SLOWDOWN = f"host:ncclscope_dcgm_gpu_hw_slowdown:count{FABRIC_WINDOW}"


def _host_of(expr: str, label: str) -> str:
    return f'label_replace({expr}, "host", "$1", "{label}", "{_SHORT}")'


def dcgm_host(expr: str) -> str:
    """``expr`` (dcgm-exporter's labels) with ``host``: from ``Hostname`` or ``hostname``
    (its spelling since May 2026), else from the instance's host part (a label_replace
    that does not match leaves the label as is)."""
    inner = f'label_replace({expr}, "host", "$1", "instance", "{_SHORT_INSTANCE}")'
    for label in DCGM_HOST_LABELS:
        inner = _host_of(inner, label)
    return inner


def _named(kind: str, value: str, expr: str) -> str:
    return f'label_replace({expr}, "{kind}", "{value}", "", "")'


def _ib_errors() -> str:
    terms = [
        _named("counter", c, f"increase(node_infiniband_{c}[{FABRIC_WINDOW}]) > 0")
        for c in (*IB_ERROR_COUNTERS, *IB_FLAP_COUNTERS)
    ]
    return (
        "max by (host, device, port, counter) (\n  (\n      "
        + "\n    or\n      ".join(terms)
        + f"\n  )\n  * on (instance) group_left (host) {_UNAME}\n)"
    )


def _gpu_errors() -> str:
    terms = [
        _named("field", f, f"max_over_time({f}[{GPU_WINDOW}]) > 0")
        if f == "DCGM_FI_DEV_ROW_REMAP_FAILURE"
        else _named("field", f, f"increase({f}[{GPU_WINDOW}]) > 0")
        for f in (*DCGM_FAULT_FIELDS, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")
    ]
    inner = "(\n    " + "\n    or\n    ".join(terms) + "\n  )"
    return f"max by (host, gpu, field) (\n  {dcgm_host(inner)}\n)"


def _reasons() -> str:
    reasons = (
        "max without (__name__) ("
        '{__name__=~"DCGM_FI_DEV_CLOCKS_EVENT_REASONS|DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"})'
    )
    # Bits 0x8-0x80 of the mask, read once: any of them but 0x10 (sync boost) alone;
    # valued those bits (64: HW thermal).
    bits = f"(floor({reasons} / 8) % 32 > 0 != 2) * 8"
    return "max by (host, gpu) (\n  " + dcgm_host(bits) + "\n)"


def host_causes(host: str) -> str:
    """An alert template's text naming the ports that erred and the GPUs that threw an
    XID or failed on host ``host`` (a template expression giving its short name);
    nothing where they are clean."""

    def listed(series: str, key: str, head: str, item: str, tail: str = "") -> str:
        return (
            f'{{{{ with printf "{series}{{host=%q}}{tail}" {host}'
            f' | query | sortByLabel "{key}" }}}}'
            f" {head}{{{{ range . }}}} {item};{{{{ end }}}}{{{{ end }}}}"
        )

    return (
        listed(
            _PORT_ERRORS,
            "counter",
            f"Its InfiniBand ports in the last {FABRIC_WINDOW}:",
            "{{ .Labels.device }} port {{ .Labels.port }} {{ .Labels.counter }}"
            ' +{{ .Value | printf "%.0f" }}',
        )
        + listed(_XID, "gpu", "Its GPUs' XIDs:", "GPU {{ .Labels.gpu }} XID {{ .Value }}")
        + listed(
            f"max_over_time({_HW_SLOWDOWN}",
            "gpu",
            f"Its GPUs slowed down by their hardware in the last {FABRIC_WINDOW}:",
            "GPU {{ .Labels.gpu }} (clocks-event reasons {{ .Value }})",
            f"[{FABRIC_WINDOW}])",
        )
        + listed(
            _GPU_ERRORS,
            "field",
            "Its GPUs' errors:",
            'GPU {{ .Labels.gpu }} {{ .Labels.field }} +{{ .Value | printf "%.0f" }}',
        )
    )


#: The short name of an alert's ``hostname`` (the agent's), in a template.
_SHORT_OF_HOSTNAME = '($labels.hostname | reReplaceAll "[.].*" "")'


def _alerts_on_host(names: str) -> str:
    """The ncclscope alerts ``names`` (a regex) that fired in the last
    :data:`ALERT_SEEN`, per job and host."""
    alerts = f'ALERTS{{alertname=~"{names}", alertstate="firing", hostname!=""}}'
    return (
        "max by (job, hostname, host) (\n  "
        + _host_of(f"max_over_time({alerts}[{ALERT_SEEN}])", "hostname")
        + "\n)"
    )


def fabric_rules() -> tuple[tuple[str, str, str], ...]:
    """The recording rules: ``(name, expr, comment)``."""
    faults = "|".join(DCGM_FAULT_FIELDS)
    return (
        (
            _UNAME,
            f"max by (instance, host) ({_host_of('node_uname_info', 'nodename')})",
            "Each node_exporter's host (its short name), from its uname.",
        ),
        (
            _JOB_HOST,
            f"max by (job, host) ({_host_of('ncclscope_rank_info', 'hostname')})",
            "The hosts a job's ranks run on, as the agents read them from the logs.",
        ),
        (
            _PORT_ERRORS,
            _ib_errors(),
            "Each InfiniBand error and link-down counter that rose on a port, per host:"
            " nothing on a clean fabric.",
        ),
        (
            _HOST_PORT_ERRORS,
            f"sum by (host) ({_PORT_ERRORS})",
            "Port errors and link downs per host.",
        ),
        (
            _XID,
            "max by (host, gpu) (\n  "
            + dcgm_host(f"max_over_time(DCGM_FI_DEV_XID_ERRORS[{GPU_WINDOW}]) > 0")
            + "\n)",
            "The GPUs that reported an XID (dcgm-exporter's last XID, non-zero), per host.",
        ),
        (
            _GPU_ERRORS,
            _gpu_errors(),
            "The GPUs whose uncorrectable memory errors, row-remap failures or PCIe"
            " replays rose, per host and field.",
        ),
        (
            _HW_SLOWDOWN,
            _reasons(),
            "The GPUs slowed down for their hardware's sake now (HW slowdown, thermal,"
            " power brake; a power cap is a loaded GPU's normal state), valued their"
            " clocks-event reasons' bits 0x8-0x80 (64: HW thermal).",
        ),
        (
            _HOST_GPU_FAULTS,
            "count by (host) (\n"
            f"  max by (host, gpu) ({_XID})\n"
            f'  or max by (host, gpu) ({_GPU_ERRORS}{{field=~"{faults}"}})\n'
            ")",
            "How many GPUs of a host threw an XID or failed (PCIe replays aside).",
        ),
        (
            _HOST_HW_SLOWDOWN,
            f"count by (host) (max_over_time({_HW_SLOWDOWN}[{FABRIC_WINDOW}]))",
            "How many GPUs of a host were slowed down for their hardware at some point.",
        ),
    )


#: Alerts: (name, severity, expr, summary, description, comment).
def fabric_alerts() -> tuple[tuple[str, str, str, str, str, str], ...]:
    stall = "NcclscopeCollectiveStalled|NcclscopeNodeLost|NcclscopeTimeoutImminent"
    causes = host_causes("$labels.host")

    def joined(names: str, cause: str) -> str:
        return f"{_alerts_on_host(names)}\n  * 0 + on (host) group_left ()\n({cause})"

    flaps = "|".join(IB_FLAP_COUNTERS)
    return (
        (
            "NcclscopeSlowNodeFabric",
            "warning",
            joined("NcclscopeSlowNode", _HOST_PORT_ERRORS),
            "Slow node {{ $labels.hostname }} of job {{ $labels.job }}: its InfiniBand ports erred",
            "NcclscopeSlowNode fires for {{ $labels.hostname }} and its ports' error counters"
            f' rose by {{{{ $value | printf "%.0f" }}}} in the last {FABRIC_WINDOW}: the fabric,'
            " not its GPUs or its clock, is the likely cause. Look at the port and its cable"
            " (ibstat, the switch's side) and drain the node." + causes,
            "NcclscopeSlowNode with the cause: its node's ports erred or went down (value:"
            " how many errors). Routed to whoever owns the fabric.",
        ),
        (
            "NcclscopeSlowNodeGpu",
            "warning",
            joined("NcclscopeSlowNode", f"\n  {_HOST_GPU_FAULTS}\n  or\n  {_HOST_HW_SLOWDOWN}\n"),
            "Slow node {{ $labels.hostname }} of job {{ $labels.job }}: its GPUs are"
            " throttled or failing",
            "NcclscopeSlowNode fires for {{ $labels.hostname }} and {{ $value }} of its GPUs"
            " threw an XID, an uncorrectable error, or slowed down for their hardware"
            f" (thermal, HW slowdown, power brake) in the last {FABRIC_WINDOW}: the GPU,"
            " not the network. Check its cooling and power, `nvidia-smi -q -d PERFORMANCE`"
            " on it." + causes,
            "NcclscopeSlowNode with the cause on the GPU side (value: the GPUs).",
        ),
        (
            "NcclscopeStallFabric",
            "critical",
            joined(stall, _HOST_PORT_ERRORS),
            "Job {{ $labels.job }} waits for {{ $labels.hostname }}, whose InfiniBand ports erred",
            "A collective of job {{ $labels.job }} waits for {{ $labels.hostname }} (stalled,"
            " lost or about to time out) and that node's ports' error or link-down counters"
            f' rose by {{{{ $value | printf "%.0f" }}}} in the last {FABRIC_WINDOW}: a link that'
            " went down is the likely cause." + causes,
            "A stall (or lost node, or imminent timeout) on a node whose ports erred.",
        ),
        (
            "NcclscopeStallGpuFault",
            "critical",
            joined(stall, _HOST_GPU_FAULTS),
            "Job {{ $labels.job }} waits for {{ $labels.hostname }}, whose GPU failed",
            "A collective of job {{ $labels.job }} waits for {{ $labels.hostname }} (stalled,"
            " lost or about to time out) and {{ $value }} of that node's GPUs threw an XID"
            f" or an uncorrectable memory error in the last {GPU_WINDOW}: the GPU, not"
            " NCCL. Drain the node (nvidia-smi, the kernel log's NVRM lines)." + causes,
            "A stall (or lost node, or imminent timeout) on a node whose GPU failed.",
        ),
        (
            "NcclscopeIbPortFlapping",
            "warning",
            f'sum by (host, device, port) ({_PORT_ERRORS}{{counter=~"{flaps}"}})\n'
            f"  and on (host) {_JOB_HOST}",
            "InfiniBand port {{ $labels.device }}/{{ $labels.port }} of {{ $labels.host }}"
            " flaps during a job",
            'The port went down or retrained {{ $value | printf "%.0f" }} times in the last'
            f" {FABRIC_WINDOW} while ranks of"
            f' {{{{ range printf "{_JOB_HOST}{{host=%q}}" $labels.host | query }}}}'
            "job {{ .Labels.job }} {{ end }}run on the node: every collective through"
            " it stalls while it is down. Check the cable and the switch port; drain the"
            " node if it goes on." + host_causes("$labels.host"),
            "A port whose link went down or retrained while the agent says a job's ranks"
            " run on its host (a flap on an idle node pages nobody).",
        ),
    )


def slow_node_causes() -> str:
    """For the existing alerts on a ``hostname``: what its ports and GPUs say."""
    return host_causes(_SHORT_OF_HOSTNAME)


# --------------------------------------------------------------------------- dashboards

_UNAME_INLINE = (
    "max by (instance, host) ("
    f'label_replace(node_uname_info, "host", "$1", "nodename", "{_SHORT}"))'
)
#: The job's hosts (the ``$job`` and ``$host`` variables), by their short name.
_JOB_HOSTS = _host_of('ncclscope_node_info{job=~"$job", hostname=~"$host"}', "hostname")


def _ports(expr: str) -> str:
    """``expr`` over node_exporter's series, with ``host``, for the job's hosts only."""
    return (
        f"({expr}) * on (instance) group_left (host) {_UNAME_INLINE}\n  and on (host) {_JOB_HOSTS}"
    )


def _gpus(expr: str) -> str:
    return f"{dcgm_host(expr)}\n  and on (host) {_JOB_HOSTS}"


_PORT = "{{host}} {{device}}/{{port}}"
_GPU = "{{host}} GPU {{gpu}}"


def fabric_panels() -> list[list[Panel]]:
    """The job view's rows for its nodes' ports and GPUs, beside the collectives."""
    errors = tuple(
        Target(
            _ports(f"increase(node_infiniband_{c}[$__rate_interval])"),
            f"{_PORT} {c.removesuffix('_total')}",
        )
        for c in (*IB_ERROR_COUNTERS, *IB_FLAP_COUNTERS)
    )
    reasons = (
        "max without (__name__) ("
        '{__name__=~"DCGM_FI_DEV_CLOCKS_EVENT_REASONS|DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"})'
    )
    return [
        [
            Panel(
                "timeseries",
                "InfiniBand port errors and link downs (the job's nodes)",
                errors,
                w=12,
                h=8,
                description=(
                    "node_exporter's InfiniBand error and link-down counters' rise per"
                    " interval, on the ports of the job's hosts (joined by node_uname_info's"
                    " nodename). A clean fabric stays at zero; see NcclscopeIbPortFlapping,"
                    " NcclscopeSlowNodeFabric."
                ),
                options=_LEGEND_TABLE,
            ),
            Panel(
                "timeseries",
                "InfiniBand transmit wait (the job's nodes)",
                (
                    Target(
                        _ports("rate(node_infiniband_port_transmit_wait_total[$__rate_interval])"),
                        _PORT,
                    ),
                ),
                w=12,
                h=8,
                description=(
                    "Ticks per second each port had data to send but no credit from its"
                    " peer: congestion downstream. One port far above the others points at"
                    " its link or its switch."
                ),
                options=_LEGEND_TABLE,
            ),
        ],
        [
            Panel(
                "timeseries",
                "InfiniBand port throughput against its rate",
                (
                    Target(
                        _ports(
                            "rate(node_infiniband_port_data_transmitted_bytes_total"
                            "[$__rate_interval])"
                        ),
                        f"{_PORT} TX",
                    ),
                    Target(
                        _ports(
                            "rate(node_infiniband_port_data_received_bytes_total[$__rate_interval])"
                        ),
                        f"{_PORT} RX",
                    ),
                    Target(_ports("node_infiniband_rate_bytes_per_second"), f"{_PORT} rate"),
                ),
                w=12,
                h=8,
                unit="Bps",
            ),
            Panel(
                "state-timeline",
                "InfiniBand port state",
                (
                    Target(_ports("node_infiniband_state_id"), f"{_PORT} state"),
                    Target(_ports("node_infiniband_physical_state_id"), f"{_PORT} physical"),
                ),
                w=12,
                h=8,
                description="4: ACTIVE (state), 5: LinkUp (physical); anything else is down.",
                defaults={
                    "mappings": [
                        {
                            "type": "value",
                            "options": {
                                "4": {"text": "ACTIVE", "color": "green"},
                                "5": {"text": "LinkUp", "color": "green"},
                            },
                        }
                    ]
                },
            ),
        ],
        [
            Panel(
                "timeseries",
                "GPU XID (dcgm-exporter, last XID)",
                (Target(_gpus("DCGM_FI_DEV_XID_ERRORS"), _GPU),),
                w=8,
                h=8,
                description=(
                    "The last XID each GPU reported (0: none). 79: fell off the bus; 48, 63,"
                    " 64, 94, 95: memory errors; 13, 31, 43: an application's fault. See"
                    " NcclscopeStallGpuFault."
                ),
            ),
            Panel(
                "timeseries",
                "GPU uncorrectable errors and PCIe replays",
                (
                    *(
                        Target(
                            _gpus(f"increase({f}[$__rate_interval])"),
                            f"{_GPU} {f.removeprefix('DCGM_FI_DEV_')}",
                        )
                        for f in (
                            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                        )
                    ),
                    Target(_gpus("DCGM_FI_DEV_ROW_REMAP_FAILURE"), f"{_GPU} ROW_REMAP_FAILURE"),
                ),
                w=8,
                h=8,
                description=(
                    "Rises per interval (the ECC totals only where the site's dcgm-exporter"
                    " field list has them)."
                ),
            ),
            Panel(
                "state-timeline",
                "GPU hardware slowdown (dcgm-exporter clocks-event reasons)",
                tuple(
                    Target(
                        _gpus(f"floor({reasons} / {bit}) % 2"), f"{_GPU} {CLOCK_EVENT_BITS[bit]}"
                    )
                    for bit in HW_SLOWDOWN_BITS
                ),
                w=8,
                h=8,
                description=(
                    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
                    " before DCGM 3.3), one line per reason (1: active)."
                ),
                defaults={
                    "mappings": [
                        {
                            "type": "value",
                            "options": {
                                "0": {"text": "off", "color": "transparent"},
                                "1": {"text": "on", "color": "red"},
                            },
                        }
                    ]
                },
            ),
        ],
    ]


_LEGEND_TABLE = {
    "legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "max"]}
}
