# ruff: noqa: E501  (a table: one metric a line reads better than wrapped help texts)
"""The metric catalog: every metric ncclscope exports, declared once.

The exporter builds its metric families from this table, ``docs/metrics.md`` is
rendered from it (a test keeps the two in step), and dashboards take their names from
it.  Names follow Prometheus' naming guide and DESIGN §6: one ``ncclscope_`` prefix,
base units in the name, ``_total`` on counters, ``_info`` metrics for identity; GPU
series carry dcgm-exporter's label names (``gpu``, ``UUID``, ``pci_bus_id``) so joins
need no relabeling; host identity lives in ``ncclscope_node_info{hostname}``.
Cardinality is bounded: series grow with GPUs, ranks, communicators and processes,
never with the number of collectives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "BOUNDED_LABELS",
    "CATALOG",
    "GPU_LABELS",
    "GROWING_LABELS",
    "Metric",
    "by_name",
    "render_markdown",
    "series_budget",
]

Kind = Literal["gauge", "counter", "info"]

#: dcgm-exporter's label names for a GPU.
GPU_LABELS = ("gpu", "UUID", "pci_bus_id")


@dataclass(frozen=True)
class Metric:
    """One metric family: its full name, type, unit (in the name), help and labels."""

    name: str
    kind: Kind
    unit: str
    help: str
    labels: tuple[str, ...] = ()
    group: str = ""

    @property
    def exposed(self) -> str:
        """The sample name as exposed (``_info`` metrics are gauges of value 1)."""
        return self.name


def _m(group: str, name: str, kind: Kind, unit: str, help_: str, *labels: str) -> Metric:
    return Metric(f"ncclscope_{name}", kind, unit, help_, tuple(labels), group)


_GPU = GPU_LABELS
CATALOG: tuple[Metric, ...] = (
    # --- identity and health
    _m("self", "build_info", "info", "", "ncclscope's version and runtime.", "version", "python", "polars"),
    _m("self", "node_info", "info", "", "The host the agent runs on (join with group_left).", "hostname"),
    _m("self", "scrape_collector_success", "gauge", "", "1 if the collector's last run succeeded, else 0.", "collector"),
    _m("self", "scrape_collector_duration_seconds", "gauge", "seconds", "How long the collector's last run took.", "collector"),
    _m("self", "sample_cpu_seconds_total", "counter", "seconds", "CPU time the agent spent sampling.", "collector"),
    _m("self", "log_utc_offset_seconds", "gauge", "seconds", "The followed job's clock less UTC: NCCL prints the node's local time without a zone; named with --log-tz, else learned from the lines' arrival times (absent until known). Every exported time is UTC."),
    _m("self", "analysis_max_rss_bytes", "gauge", "bytes", "Peak resident memory of the short-lived process that ran the last reference analysis of the live window (not the agent's own)."),
    _m("self", "http_requests_rejected_total", "counter", "", "Scrapes of /metrics answered 503 Service Unavailable, unrendered, because every handler was busy and the queue of waiting connections was full."),
    _m("self", "log_lines_read_total", "counter", "", "Lines read from followed logs."),
    _m("self", "log_bytes_read_total", "counter", "bytes", "Bytes read from followed logs."),
    _m("self", "log_window_lines_unparsed", "gauge", "", "Lines of the live window that matched no grammar (blank, other, damaged)."),
    _m("self", "log_window_lines_damaged", "gauge", "", "Lines of the live window that began like a record but could not be read (malformed, binary, too long): damage, not noise."),
    _m("self", "log_files_followed", "gauge", "", "Log files being followed."),
    # --- GPU (NVML)
    _m("gpu", "gpu_info", "info", "", "Static facts of a GPU.", *_GPU, "name"),
    _m("gpu", "gpu_memory_used_bytes", "gauge", "bytes", "GPU memory in use.", *_GPU),
    _m("gpu", "gpu_memory_total_bytes", "gauge", "bytes", "GPU memory in all.", *_GPU),
    _m("gpu", "gpu_utilization_ratio", "gauge", "ratio", "Share of the last sample period a kernel ran (0-1).", *_GPU),
    _m("gpu", "gpu_pcie_tx_bytes_per_second", "gauge", "bytes_per_second", "PCIe bytes sent by the GPU per second (NVML's 20 ms window).", *_GPU),
    _m("gpu", "gpu_pcie_rx_bytes_per_second", "gauge", "bytes_per_second", "PCIe bytes received by the GPU per second (NVML's 20 ms window).", *_GPU),
    _m("gpu", "gpu_pcie_link_max_bytes_per_second", "gauge", "bytes_per_second", "One direction's capacity of the GPU's PCIe link at its maximum generation and width.", *_GPU),
    _m("gpu", "gpu_pcie_link_generation", "gauge", "", "Current PCIe link generation.", *_GPU),
    _m("gpu", "gpu_pcie_link_width", "gauge", "", "Current PCIe link width (lanes).", *_GPU),
    _m("gpu", "gpu_clocks_event_reasons", "gauge", "", "NVML clocks-event (throttle) reasons, as its bitmask.", *_GPU),
    _m("gpu", "gpu_temperature_celsius", "gauge", "celsius", "GPU temperature.", *_GPU),
    _m("gpu", "gpu_power_watts", "gauge", "watts", "GPU power draw.", *_GPU),
    _m("gpu", "gpu_power_limit_watts", "gauge", "watts", "GPU enforced power limit.", *_GPU),
    _m("gpu", "gpu_ecc_uncorrected_errors_total", "counter", "", "Uncorrected ECC errors since the driver loaded (volatile).", *_GPU),
    _m("gpu", "gpu_xid_errors_total", "counter", "", "XID critical errors the driver reported (NVML events), by XID.", *_GPU, "xid"),
    _m("gpu", "gpu_pcie_uplink_info", "info", "", "A PCIe link above the GPU other than its own (a PCIe switch's uplink, named by the switch's upstream port's bus id), read once at start; a direct-attached GPU names its own link.", *_GPU, "uplink"),
    _m("gpu", "pcie_uplink_generation", "gauge", "", "PCIe generation an uplink runs at (sysfs current_link_speed; assumed from its GPUs where NVML alone grouped them).", "uplink"),
    _m("gpu", "pcie_uplink_width", "gauge", "", "Lanes of an uplink (sysfs current_link_width).", "uplink"),
    _m("gpu", "pcie_uplink_max_bytes_per_second", "gauge", "bytes_per_second", "One direction's capacity of an uplink at its generation and width: the GPUs behind it share it.", "uplink"),
    _m("gpu", "pcie_uplink_gpus", "gauge", "", "GPUs behind an uplink (those NVML follows).", "uplink"),
    _m("gpu", "gpu_process_memory_used_bytes", "gauge", "bytes", "GPU memory used by a process.", *_GPU, "pid"),
    # --- host (psutil)
    _m("host", "host_memory_total_bytes", "gauge", "bytes", "Host memory in all."),
    _m("host", "host_memory_available_bytes", "gauge", "bytes", "Host memory available without swapping."),
    _m("host", "host_swap_used_bytes", "gauge", "bytes", "Swap in use."),
    _m("host", "host_swap_in_bytes_total", "counter", "bytes", "Bytes swapped in since boot."),
    _m("host", "host_swap_out_bytes_total", "counter", "bytes", "Bytes swapped out since boot."),
    _m("host", "host_cpu_utilization_ratio", "gauge", "ratio", "Host CPU busy share since the last sample (0-1, all cores)."),
    _m("host", "process_resident_memory_bytes", "gauge", "bytes", "Resident memory of a job process.", "pid"),
    _m("host", "process_cpu_seconds_total", "counter", "seconds", "CPU time of a job process.", "pid"),
    # --- the job, from its logs (the same detectors as analyze)
    _m("job", "collective_seq", "gauge", "", "Sequence number (from 0) of the last collective a rank logged on a communicator, counted by the agent since it started: it grows whatever opCount does.", "comm", "rank"),
    _m("job", "node_collective_seq_max", "gauge", "", "The highest collective_seq of the node's ranks on a communicator (the rules' leaders are the nodes at the job's highest).", "comm"),
    _m("job", "node_collective_seq_min", "gauge", "", "The lowest collective_seq of the node's ranks on a communicator (below the job's highest, the node holds the collective up); `ranks` lists the node's ranks on it (comma-separated, fixed while the communicator lives), from which the rules name them.", "comm", "ranks"),
    _m("job", "node_collective_wait_seconds", "gauge", "seconds", "How long ago (the agent's clock: the logs' time) the first of the node's ranks entered the node's highest collective on a communicator.", "comm"),
    _m("job", "node_collective_op_info", "info", "", "The op of the node's highest collective on a communicator.", "comm", "op"),
    _m("job", "node_collective_mark_seq", "gauge", "", "The newest multiple of `every` (counted as collective_seq) one of the node's ranks reached on a communicator: nodes are compared at the same mark.", "comm", "every"),
    _m("job", "node_collective_mark_timestamp_seconds", "gauge", "seconds", "When (Unix time, the log's clock) the first of the node's ranks entered the collective of node_collective_mark_seq.", "comm", "every"),
    _m("job", "communicator_ranks", "gauge", "", "A communicator's size (its COLL lines' nranks).", "comm"),
    _m("job", "rank_info", "info", "", "The host a rank runs on, as its log lines name it.", "rank", "hostname"),
    _m("job", "clock_timestamp_seconds", "gauge", "seconds", "The agent's clock (Unix time; a replay's runs at its speed): the rules measure waits against it."),
    _m("job", "collective_timeout_seconds", "gauge", "seconds", "The collective timeout in force: from the logs, else PyTorch's default (600 s)."),
    _m("job", "collective_wait_bound_seconds", "gauge", "seconds", "How long a collective some members entered may wait for the others before it is a stall (named at warning): the largest of 45 s, 5 median gaps between the communicator's collectives and 1.5 times the longest wait its logged history shows (a checkpoint or evaluation that recurs). Absent with fewer than 10 timed collectives: the rules then wait a quarter of the timeout.", "comm"),
    _m("job", "collective_lateness_seconds", "gauge", "seconds", "A rank's median arrival lateness at collectives (arrival - the first rank's).", "rank"),
    _m("job", "straggler_score", "gauge", "", "A rank's excess median lateness over the typical rank's, as a share of the gap between collectives.", "rank"),
    _m("job", "pending_collective_age_seconds", "gauge", "seconds", "Age of the oldest collective some members entered and others did not.", "comm"),
    _m("job", "timeout_remaining_seconds", "gauge", "seconds", "Seconds before the collective timeout fires on that collective.", "comm"),
    _m("job", "timeout_culprit_info", "info", "", "The rank the pending collective waits for, and the collective's op.", "comm", "rank", "op"),
    _m("job", "pending_collective_seq", "gauge", "", "The pending collective's sequence number as the logs number it (opCount, else calls counted in the window): where to look in the logs.", "comm"),
    _m("job", "nccl_errors", "gauge", "", "NCCL WARN root causes in the followed logs, by kind and severity.", "kind", "severity"),
    _m("job", "findings", "gauge", "", "Current findings by kind and severity.", "kind", "severity"),
    _m("job", "collective_bus_bandwidth_bytes_per_second", "gauge", "bytes_per_second", "Median bus bandwidth NCCL Inspector measured over the window, per op and message size (size_bucket: the power of two, in bytes, at or below each rank's buffer; at most 40 buckets). Only while the agent follows Inspector output.", "op", "size_bucket"),
    _m("job", "node_fault_info", "info", "", "A node the window's analysis finds evidence of a fault on (`analyze --exclude-list`'s verdict): a dead or frozen rank, a slow node, an IB/NCCL network or GPU error, an XID, ECC or a degraded PCIe link; one series per reason. Never a node that only waited.", "host", "reason"),
    # --- evidence taken at a stall (--collect-at), from the last collection
    _m("evidence", "evidence_collections_total", "counter", "", "Evidence folders this agent wrote: one per stall that passed --collect-at (a collective some members entered and others not, or the node's members all quiet)."),
    _m("evidence", "evidence_asks", "gauge", "", "What the last collection asked (what: flight_dump, stack, ras, log_tail, telemetry) and how it ended (outcome: answered, no_answer, late, truncated, garbage, refused, unavailable, skipped, error); the manifest says why.", "what", "outcome"),
    _m("evidence", "evidence_rank_info", "info", "", "Each local rank's process at the last collection: its state (running, sleeping, stopped, disk-sleep, zombie, gone), the kind of place its main thread's Python stack was in (in_collective, data_loader, checkpoint, lock, sleep, io, compute, unknown, none) and the frame that says so.", "rank", "pid", "state", "stack", "frame"),
    _m("evidence", "ras_rank_problem_info", "info", "", "A rank NCCL's RAS reported at the last collection as dead, missing, unresponsive, mismatched or in error, on a communicator (RAS's hash), with its host as RAS names it (an address or a name).", "comm", "rank", "ras_host", "problem"),
    _m("evidence", "flight_last_collective_seq", "gauge", "", "The collective_seq_id a local rank's Flight Recorder dump says it last enqueued, started or completed on a process group, at the last collection.", "rank", "pg", "state"),
)  # fmt: skip


#: Every label the catalog uses, and why its values stay few: none grows with the run.
BOUNDED_LABELS: dict[str, str] = {
    "version": "the agent's build (one series)",
    "python": "the agent's build (one series)",
    "polars": "the agent's build (one series)",
    "hostname": "the node's host (`node_info`), each rank's (`rank_info`)",
    "collector": "the agent's collectors (5)",
    "gpu": "one per GPU",
    "UUID": "one per GPU",
    "pci_bus_id": "one per GPU",
    "name": "the GPU's model (one per GPU)",
    "xid": "the XID codes a GPU reported: a few, from the driver's fixed list",
    "uplink": "the PCIe links above the GPUs (at most one per GPU)",
    "pid": (
        "the job's processes while they live (one per local rank; NVML's GPU processes"
        " likewise): a restarted process's series replaces the old one, which goes stale"
    ),
    "comm": "the communicators (commId) the node's ranks are on, fixed for the job",
    "rank": "the node's ranks",
    "ranks": "the list of the node's ranks on a communicator, fixed while it lives",
    "op": "NCCL's collective names (a handful)",
    "every": "the two mark intervals (64 and 1,024 collectives)",
    "kind": "the detectors' and NCCL errors' kinds (a fixed set)",
    "severity": "three severities",
    "size_bucket": "power-of-two message sizes (at most 40)",
    "what": "what a collection asks for (5)",
    "outcome": "how an ask ended (9)",
    "state": "a process's state (a few), a dump's three states",
    "stack": "the kinds of place a stack can be in (9)",
    "frame": "one frame per local rank, the last collection's",
    "problem": "RAS's rank problems (5)",
    "host": "the hosts whose logs the agent reads",
    "reason": "the exclude list's reasons (a fixed set)",
    "ras_host": "the host (address or name) RAS names a problem rank on: the job's nodes",
    "pg": "the process groups of the node's ranks, fixed for the job",
}

#: Labels whose values would grow with the run (one series per collective, step, call or
#: line): none of them may label a metric.  The sequence number of the collective a
#: pending one waits in is the value of ``ncclscope_pending_collective_seq``.
GROWING_LABELS = frozenset(
    {"seq", "opcount", "op_count", "step", "iteration", "iter", "epoch", "call", "calls",
     "line", "line_no", "timestamp", "ts", "time", "tid", "stream", "ptr", "addr",
     "sendbuff", "recvbuff", "count", "instance_id"}
)  # fmt: skip

#: The agent's collectors, each reporting its success, run time and CPU.
_COLLECTORS = 5


def series_budget(
    *,
    gpus: int,
    uplinks: int,
    processes: int,
    ranks: int,
    memberships: int,
    comms: int,
    spanning: int,
    timed: int = 0,
) -> int:
    """Series one agent exports on a healthy job: ``gpus`` behind ``uplinks`` PCIe
    uplinks, ``processes`` job processes (each on one GPU), ``ranks`` ranks whose logs it
    reads, on ``comms`` communicators with ``memberships`` rank-communicator pairs, of
    which ``spanning`` have members on other nodes too, and ``timed`` hold history enough
    (10 collectives with times) for a stall bound.

    What depends on the job's state comes on top (docs/metrics.md): the findings and
    NCCL errors by kind, 3 per communicator with a pending collective (+1 per culprit),
    XIDs, Inspector's bandwidth buckets.

    >>> series_budget(gpus=8, uplinks=4, processes=8, ranks=8, memberships=32, comms=4,
    ...               spanning=3, timed=4)
    278
    """
    agent = 2 + 3 * _COLLECTORS + 5  # build and node info, collectors' health, log reading
    host = 6
    clock = 2  # the agent's clock, the collective timeout
    per_gpu = 14 + 1  # NVML's gauges and counters, the GPU's uplink
    per_process = 2 + 1  # resident memory, CPU, its memory on its GPU
    per_rank = 3  # its host, lateness, straggler score
    per_spanning = 8  # the node's highest and lowest sequence, wait, op, 2 x 2 marks
    return (
        agent + host + clock + per_gpu * gpus + 4 * uplinks + per_process * processes
        + per_rank * ranks + memberships + comms + per_spanning * spanning + timed
    )  # fmt: skip


def by_name() -> dict[str, Metric]:
    """The catalog by metric name."""
    return {m.name: m for m in CATALOG}


_GROUPS = {
    "self": "The agent itself",
    "gpu": "GPUs (NVML)",
    "host": "Host and job processes (psutil)",
    "job": "The job, from its logs",
    "evidence": "Evidence taken at a stall (absent until one passes --collect-at)",
}


_BUDGET = """\
### Series budget

Per node, on a healthy job, with G GPUs behind U PCIe uplinks (switches; U = G where
each GPU has a root port of its own), P job processes (each on one GPU), R ranks whose
logs the agent reads, on C communicators with M rank-communicator memberships (M = R x C
where every rank is on every communicator), X of which have members on other nodes too,
T of which hold history enough for a stall bound (10 collectives with times: T = C on a
job with NCCL timestamps, 0 without):

    series = 30 + 15 G + 4 U + 3 P + 3 R + M + C + 8 X + T

- 30: the agent (build and node info, 5 collectors' success, run time and CPU, 5 log
  counters), the host (6), the agent's clock and the collective timeout;
- 15 per GPU (14 NVML values and the GPU's uplink), 4 per uplink, 3 per process
  (resident memory, CPU, its memory on its GPU);
- 3 per rank (its host, lateness, straggler score), 1 per rank and communicator (its
  sequence number), 1 per communicator (its size) and 8 more per communicator spanning
  nodes (the node's summary: its highest and lowest sequence number, wait and op; two
  marks' sequence and time). A communicator wholly on the node (tensor parallelism within
  it) has no summary: nothing to compare across nodes, its stalls are the node's own
  countdown's. 1 per communicator with history (T: how long its collectives may wait
  before a stall is named, ``ncclscope_collective_wait_bound_seconds``).

8 GPUs behind 4 switches, 8 processes, 8 ranks each on 4 communicators, one of them the
node's own (M = 32, C = 4, X = 3, T = 4): **278**. With data-parallel groups of one rank
per node (each rank on the world, its node's and its own group: M = 24, C = 10, X = 9,
T = 10): 330. Measured so (with the config doctor's one finding on top): 279 and 331;
before issue #25
(7 series per rank and communicator, and each rank's lateness and straggler score once
per communicator of the node's size) the same agent exported 491 and 409. On top, what
the job's state
adds: findings and NCCL errors by kind and severity (each a fixed set), 3 per
communicator with a pending collective (its age, seconds left, sequence number) and 1 per
rank it waits for, XIDs a GPU reported, and, where the agent follows NCCL Inspector, its
bandwidth per op and message size (at most 40 buckets an op). None of it grows with the
collectives a job runs: `tests/test_series_budget.py` renders an agent's board for
several shapes after 100 and after 1,600 collectives and checks the count against this
formula, and checks every label below.

Per rank and communicator only the sequence number is exported (for drill-down and the
dashboards' worst ranks); what the rules compare across nodes is each node's summary
(`ncclscope_node_collective_*`, one series per node and communicator), so Prometheus'
rules cost grows with nodes x communicators, not ranks.

### Labels

Every label, and why its values stay few. Labels whose values would grow with the run
(sequence numbers, opCount, steps, calls, lines, times) are none of them: the sequence
number of a pending collective is the value of `ncclscope_pending_collective_seq`, not a
label of the culprit's series (a new series for every collective that was ever pending).

"""


def render_markdown() -> str:
    """``docs/metrics.md``'s generated part, from the catalog: the tables, the series
    budget and the labels."""
    out: list[str] = []
    for group, title in _GROUPS.items():
        out += [f"### {title}", "", "| metric | type | labels | meaning |", "|---|---|---|---|"]
        for m in CATALOG:
            if m.group == group:
                labels = ", ".join(f"`{x}`" for x in m.labels) or "-"
                out.append(f"| `{m.name}` | {m.kind} | {labels} | {m.help} |")
        out.append("")
    out += [_BUDGET.rstrip("\n"), "", "| label | why its values stay few |", "|---|---|"]
    out += [f"| `{label}` | {why} |" for label, why in BOUNDED_LABELS.items()]
    out.append("")
    return "\n".join(out)
