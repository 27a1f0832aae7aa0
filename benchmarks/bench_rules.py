#!/usr/bin/env python3
"""What do the job-wide rules cost Prometheus from 1,024 to 10,000 ranks, and do the
alerts fire when they should at every size?

A simulated fleet (one endpoint per node, all served by one asyncio HTTP server on one
port at ``/node/<i>``; each target gets its own ``instance`` and ``__metrics_path__``)
is scraped every second by a real Prometheus with ``grafana/ncclscope-rules.yml``
loaded.  Each node serves what its agent exports (``ncclscope.agent.rollup.exported``
over the job's rows, so the per-node series are the agent's own code's): per rank and
communicator the sequence number, per node and communicator spanning nodes its summary
(highest and lowest sequence with its ranks, the wait and op, marks; the node's own
communicator gets none), the node's countdown where it sees both sides of a pending
collective, per rank its host, lateness and straggler score, 8 GPUs behind 4 PCIe
switches, the host, 8 job processes and the agent's health.  The GPU, host and health
part is rendered once per node (constant values) and scraped every ``--rest-every``
seconds (15; the 2 vCPUs cannot ingest 300,000 samples a second besides evaluating
rules); the job's part at every 1 s scrape, from the fleet's clock.

The job runs on a log clock ``--speed`` times real time: every communicator advances
at its rate, ranks enter each collective 0-0.5 ms apart, node 3's ranks 5 ms late.
After a 30 s warm-up and ``--healthy`` seconds (real) a fault is injected: on the world
communicator rank 5 of node 1 never enters the next collective, every rank of node 2
freezes before it, and every other rank enters it and waits (a hang blocks every
communicator of the process); ``--lost-after`` seconds later node 2's endpoint answers
503 (its agent is lost).  With the default 600 s timeout the rules must fire
``NcclscopeCollectiveStalled`` (naming rank 5 of node 1 and node 2's ranks) once the
leaders have waited 150 s of log time, ``NcclscopeNodeLost`` (naming node 2) once its
endpoint is down and the wait is past 150 s, and ``NcclscopeTimeoutImminent`` once
fewer than 300 s are left.  The delay from each threshold crossing (log clock) to the
alert's activation is measured.

With ``--fabric`` (the default) every node also has a node_exporter (8 HCAs of one port,
every InfiniBand counter the rules read, its uname ``<host>.cluster.local``) and a
dcgm-exporter (8 GPUs, the fields the rules read, ``Hostname``), scraped every
``--rest-every`` seconds as their own jobs: the joined rules (``ncclscope-fabric``)
evaluate on them.  The slow node's first port counts symbol errors all along and its
GPU 0 is in thermal slowdown; at the fault the frozen node's GPU 3 reports XID 79, so
``NcclscopeStallGpuFault`` must name it once the stall alerts fire.

Read from Prometheus' own metrics (it scrapes itself every second): each rule group's
``prometheus_rule_group_last_duration_seconds`` (median, p90, max) and missed
iterations over the healthy window and over the stall, Prometheus' CPU, head series,
the series per agent; and from ``/api/v1/rules`` (read every few seconds) the most
expensive rules.

Usage:
    .venv/bin/python benchmarks/bench_rules.py                     # 128, 256, 625, 1250 nodes
    .venv/bin/python benchmarks/bench_rules.py --nodes 128 1250 --healthy 90
    .venv/bin/python benchmarks/bench_rules.py --nodes 12500 --no-fault   # 100,000 ranks
    .venv/bin/python benchmarks/bench_rules.py --nodes 128 --healthy 60   # the joined rules
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import prom  # noqa: E402

from ncclscope.agent.rollup import exported  # noqa: E402
from ncclscope.catalog import by_name  # noqa: E402
from ncclscope.export.grafana.fabric import EXTERNAL_METRICS  # noqa: E402
from ncclscope.export.grafana.rules import (  # noqa: E402
    STALL_TIMEOUT_SHARE,
    TIMEOUT_CRITICAL_LEFT_S,
)

RULES = REPO / "grafana" / "ncclscope-rules.yml"
JOB = "ncclscope-agent"
#: The scrape job of the agents' GPU, host and health series (``--rest-every``): its name
#: does not match ``.*ncclscope.*``, so the stall and node-lost rules see one ``up`` per
#: node, as with one scrape job per agent.
REST_JOB = "agent-node-part"
OPS = ("AllGather", "ReduceScatter", "AllReduce")
MARK_EVERY = (64, 1024)
SLOW_NODE = 3  # its ranks enter every collective SLOW_S late
SLOW_S = 0.005
TIMEOUT_S = 600.0
#: The log clock's origin (Unix time): 2026-11-27 00:00 UTC.
LOG0 = 1_795_737_600.0
CULPRIT_NODE, CULPRIT_LOCAL, FROZEN_NODE = 1, 5, 2
_LABELS = {m.name: m.labels for m in by_name().values()}


@dataclass(frozen=True)
class Comm:
    ident: str
    rate: float  # collectives per second of the log clock
    members: int


@dataclass
class Node:
    index: int
    hostname: str
    ranks: list[int]
    # The communicators its ranks are on, each with those of its ranks that are members.
    comms: list[tuple[Comm, list[int]]] = field(default_factory=list)
    #: pre-rendered: the job's series that do not move, and the rest of the agent's
    fixed: dict[str, list[tuple[tuple[str, ...], float]]] = field(default_factory=dict)
    static_job: bytes = b""
    static_node: bytes = b""


def comm_id(i: int) -> str:
    """A commId-like label: ``0x168e5087af895f5b``."""
    return f"0x{(0x168E5087AF895F5B + i * 0x9E3779B97F4A7C15) & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def fleet(nodes: int, per_node: int, comms_per_rank: int) -> list[Node]:
    """Every rank on the world communicator and its node's; with ``comms_per_rank`` > 2,
    also on data-parallel-like groups (the ranks of the same local index, one per node)."""
    out = [
        Node(n, f"node-{n:05d}", [n * per_node + i for i in range(per_node)]) for n in range(nodes)
    ]
    world = Comm(comm_id(0), 10.0, nodes * per_node)
    for node in out:
        node.comms.append((world, node.ranks))
    count = 1
    for node in out:
        node.comms.append((Comm(comm_id(count), 10.5, per_node), list(node.ranks)))
        count += 1
    for group in range(comms_per_rank - 2):
        for local in range(per_node):
            comm = Comm(comm_id(count), 9.5 - group, nodes)
            count += 1
            for node in out:
                node.comms.append((comm, [node.ranks[local]]))
    return out


def lateness(rank: int, per_node: int) -> float:
    """When a rank enters a collective after the first: 0-0.5 ms, plus the slow node's."""
    jitter = ((rank * 7919) % 500) / 1e6
    return jitter + (SLOW_S if rank // per_node == SLOW_NODE else 0.0)


def _line(name: str, labels: Sequence[str], value: float) -> str:
    names = _LABELS[name]
    if not names:
        return f"{name} {value!r}\n"
    pairs = ",".join(f'{k}="{v}"' for k, v in zip(names, labels, strict=True))
    return f"{name}{{{pairs}}} {value!r}\n"


def fixed_rows(node: Node) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """The job's rows that do not move and that the node's summary reads too: the
    communicators' sizes and the ranks' hosts (a communicator wholly on the node gets no
    summary)."""
    return {
        "ncclscope_communicator_ranks": [((c.ident,), float(c.members)) for c, _m in node.comms],
        "ncclscope_rank_info": [((str(r), node.hostname), 1.0) for r in node.ranks],
    }


def static_job(node: Node, per_node: int) -> bytes:
    """The job's series that do not move: the node, timeout, ranks' scores."""
    out = [
        _line("ncclscope_node_info", (node.hostname,), 1.0),
        _line("ncclscope_collective_timeout_seconds", (), TIMEOUT_S),
        _line("ncclscope_findings", ("straggler", "info"), 1.0),
    ]
    for rank in node.ranks:
        late = lateness(rank, per_node)
        out.append(_line("ncclscope_collective_lateness_seconds", (str(rank),), late + 0.0005))
        score = max(0.0, late - 0.00025) * 10
        out.append(_line("ncclscope_straggler_score", (str(rank),), score))
    return "".join(out).encode()


def static_node(node: Node, per_node: int) -> bytes:
    """The rest of the agent's series (constant values): identity, its health, GPUs
    behind PCIe switches, the host, the job's processes."""
    out = [
        _line("ncclscope_build_info", ("0.1.0", "3.11.7", "1.0.0"), 1.0),
        _line("ncclscope_node_info", (node.hostname,), 1.0),
        _line("ncclscope_log_lines_read_total", (), 1.5e7),
        _line("ncclscope_log_bytes_read_total", (), 3.2e9),
        _line("ncclscope_log_files_followed", (), float(per_node)),
        _line("ncclscope_log_window_lines_unparsed", (), 0.0),
        _line("ncclscope_log_window_lines_damaged", (), 0.0),
    ]
    for collector in ("nvml", "host", "logs", "progress", "detect"):
        out.append(_line("ncclscope_scrape_collector_success", (collector,), 1.0))
        out.append(_line("ncclscope_scrape_collector_duration_seconds", (collector,), 0.002))
        out.append(_line("ncclscope_sample_cpu_seconds_total", (collector,), 12.5))
    for gpu in range(per_node):
        key = (
            str(gpu),
            f"GPU-5eed{node.index:04x}-0000-4000-8000-{gpu:012x}",
            f"00000000:{0x18 + gpu * 0x11:02X}:00.0",
        )
        uplink = f"0000:{0x15 + gpu // 2 * 0x22:02x}:00.0"
        out += [
            _line("ncclscope_gpu_info", (*key, "NVIDIA H100 80GB HBM3"), 1.0),
            _line("ncclscope_gpu_memory_used_bytes", key, 6.4e10 + gpu * 1e7),
            _line("ncclscope_gpu_memory_total_bytes", key, 85520809984.0),
            _line("ncclscope_gpu_utilization_ratio", key, 0.75),
            _line("ncclscope_gpu_pcie_tx_bytes_per_second", key, 2.4e9),
            _line("ncclscope_gpu_pcie_rx_bytes_per_second", key, 2.7e9),
            _line("ncclscope_gpu_pcie_link_max_bytes_per_second", key, 63015384615.38),
            _line("ncclscope_gpu_pcie_link_generation", key, 5.0),
            _line("ncclscope_gpu_pcie_link_width", key, 16.0),
            _line("ncclscope_gpu_clocks_event_reasons", key, 4.0),
            _line("ncclscope_gpu_temperature_celsius", key, 50.0 + gpu),
            _line("ncclscope_gpu_power_watts", key, 450.0),
            _line("ncclscope_gpu_power_limit_watts", key, 700.0),
            _line("ncclscope_gpu_ecc_uncorrected_errors_total", key, 0.0),
            _line("ncclscope_gpu_process_memory_used_bytes", (*key, str(100000 + gpu)), 6.4e10),
            _line("ncclscope_gpu_pcie_uplink_info", (*key, uplink), 1.0),
        ]
        if gpu % 2 == 0:
            out += [
                _line("ncclscope_pcie_uplink_generation", (uplink,), 5.0),
                _line("ncclscope_pcie_uplink_width", (uplink,), 16.0),
                _line("ncclscope_pcie_uplink_max_bytes_per_second", (uplink,), 63015384615.38),
                _line("ncclscope_pcie_uplink_gpus", (uplink,), 2.0),
            ]
        pid = (str(100000 + gpu),)
        out.append(_line("ncclscope_process_resident_memory_bytes", pid, 3.2e10))
        out.append(_line("ncclscope_process_cpu_seconds_total", pid, 5000.0))
    out += [
        _line("ncclscope_host_memory_total_bytes", (), 2199023255552.0),
        _line("ncclscope_host_memory_available_bytes", (), 1.5e12),
        _line("ncclscope_host_swap_used_bytes", (), 0.0),
        _line("ncclscope_host_swap_in_bytes_total", (), 0.0),
        _line("ncclscope_host_swap_out_bytes_total", (), 0.0),
        _line("ncclscope_host_cpu_utilization_ratio", (), 0.3),
    ]
    return "".join(out).encode()


#: node_exporter's InfiniBand series per port the fabric rules and panels read.
IB_COUNTERS = tuple(
    n for n in EXTERNAL_METRICS if n.startswith("node_infiniband_") and n.endswith("_total")
)
HCAS = 8
#: dcgm-exporter's fields per GPU, at their healthy values (reasons 0x4: the power cap).
DCGM_HEALTHY = {
    "DCGM_FI_DEV_XID_ERRORS": 0.0,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0.0,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 3.0,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0.0,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0.0,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 4.0,
    "DCGM_FI_DEV_SM_CLOCK": 1980.0,
    "DCGM_FI_DEV_GPU_TEMP": 55.0,
    "DCGM_FI_DEV_POWER_USAGE": 450.0,
}
XID_GPU = 3


def _ext(name: str, labels: Mapping[str, str], value: float) -> str:
    pairs = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{pairs}}} {value!r}\n"


def fabric_body(node: Node, now: float) -> bytes:
    """What the node's node_exporter serves at ``now`` (real time): its uname and every
    port's counters (data moving; the slow node's first port erring)."""
    out = [
        _ext("node_uname_info", {"nodename": f"{node.hostname}.cluster.local",
                                 "sysname": "Linux", "release": "6.1.0"}, 1.0),
    ]  # fmt: skip
    for k in range(HCAS):
        port = {"device": f"mlx5_{k}", "port": "1"}
        for name in IB_COUNTERS:
            if "data" in name:
                value = float(int(now * 2.5e9))
            elif "transmit_wait" in name:
                value = float(int(now * 1e4))
            elif node.index == SLOW_NODE and k == 0 and "symbol_error" in name:
                value = float(int(now / 10))
            else:
                value = 0.0
            out.append(_ext(name, port, value))
        out += [
            _ext("node_infiniband_state_id", port, 4.0),
            _ext("node_infiniband_physical_state_id", port, 5.0),
            _ext("node_infiniband_rate_bytes_per_second", port, 2.5e10),
        ]
    return "".join(out).encode()


def dcgm_body(node: Node, faulted: bool) -> bytes:
    """What the node's dcgm-exporter serves: its GPUs' fields (the slow node's GPU 0 in
    thermal slowdown; the frozen node's GPU 3 with XID 79 once the fault is in)."""
    out = []
    for gpu in range(HCAS):
        labels = {"gpu": str(gpu), "UUID": f"GPU-5eed{node.index:04x}-{gpu:04x}",
                  "device": f"nvidia{gpu}", "modelName": "NVIDIA H100 80GB HBM3",
                  "Hostname": node.hostname}  # fmt: skip
        for name, value in DCGM_HEALTHY.items():
            if name == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" and node.index == SLOW_NODE and gpu == 0:
                value = 0x44
            if name == "DCGM_FI_DEV_XID_ERRORS" and faulted and node.index == FROZEN_NODE:
                value = 79.0 if gpu == XID_GPU else value
            out.append(_ext(name, labels, value))
    return "".join(out).encode()


@dataclass
class Fault:
    """A hang on the world communicator: who stops where."""

    at: float  # log time it is injected
    n: int  # the world collective the culprits never enter
    culprits: frozenset[int]
    #: rank -> the log time its progress stops (every communicator); world's cap beside
    freeze: dict[int, float]
    cap: dict[int, int]
    leaders_enter: float  # log time the first leader enters collective n
    lost_node: int
    lost_at: float = math.inf  # real time its endpoint stops answering


class Fleet:
    """The simulated job and what every node's agent exports at a given log time."""

    def __init__(self, nodes: int, per_node: int, comms_per_rank: int, speed: float) -> None:
        self.nodes = fleet(nodes, per_node, comms_per_rank)
        self.per_node = per_node
        self.speed = speed
        self.real0 = time.time()
        for node in self.nodes:
            node.fixed = fixed_rows(node)
            node.static_job = static_job(node, per_node)
            node.static_node = static_node(node, per_node)
        self.world = self.nodes[0].comms[0][0]
        self.fault: Fault | None = None

    def log_now(self, real: float | None = None) -> float:
        return LOG0 + ((time.time() if real is None else real) - self.real0) * self.speed

    def real_of(self, log: float) -> float:
        return self.real0 + (log - LOG0) / self.speed

    def inject(self, lost_after_s: float) -> Fault:
        """The hang (see the module's text), from now."""
        at = self.log_now()
        world = self.world
        n = math.floor((at - LOG0) * world.rate) + 1
        culprit = self.nodes[CULPRIT_NODE].ranks[CULPRIT_LOCAL]
        culprits = frozenset({culprit, *self.nodes[FROZEN_NODE].ranks})
        freeze: dict[int, float] = {}
        cap: dict[int, int] = {}
        first = math.inf
        for node in self.nodes:
            for rank in node.ranks:
                if rank in culprits:
                    freeze[rank], cap[rank] = at, n - 1
                else:
                    enter = LOG0 + n / world.rate + lateness(rank, self.per_node)
                    freeze[rank], cap[rank] = enter + 1e-6, n
                    first = min(first, enter)
        self.fault = Fault(at, n, culprits, freeze, cap, first, FROZEN_NODE)
        self.fault.lost_at = time.time() + lost_after_s
        return self.fault

    def _seq(self, rank: int, comm: Comm, log: float) -> tuple[int, float]:
        """A rank's last collective on a communicator at ``log`` and when it entered it."""
        late = lateness(rank, self.per_node)
        f = self.fault
        if f is not None:
            log = min(log, f.freeze[rank])
        seq = max(0, math.floor((log - LOG0 - late) * comm.rate))
        if f is not None and comm is self.world:
            seq = min(seq, f.cap[rank])
        return seq, LOG0 + seq / comm.rate + late

    def rows(self, node: Node, log: float) -> dict[str, list[tuple[tuple[str, ...], float]]]:
        """The job's rows of the node's agent at ``log`` (``Agent._publish``'s shape)."""
        rows: dict[str, list[tuple[tuple[str, ...], float]]] = {
            "ncclscope_clock_timestamp_seconds": [((), log)],
            **node.fixed,
        }

        def put(name: str, labels: tuple[str, ...], value: float) -> None:
            rows.setdefault(name, []).append((labels, value))

        for comm, mine in node.comms:
            at: dict[int, tuple[int, float]] = {}
            for rank in mine:
                seq, entered = self._seq(rank, comm, log)
                at[rank] = (seq, entered)
                labels = (comm.ident, str(rank))
                put("ncclscope_collective_seq", labels, float(seq))
                put("ncclscope_collective_entered_timestamp_seconds", labels, entered)
                put("ncclscope_collective_op_info", (*labels, OPS[seq % 3]), 1.0)
                for every in MARK_EVERY:
                    mark = seq // every * every
                    mark_at = LOG0 + mark / comm.rate + lateness(rank, self.per_node)
                    put("ncclscope_collective_mark_seq", (*labels, str(every)), float(mark))
                    put(
                        "ncclscope_collective_mark_timestamp_seconds",
                        (*labels, str(every)),
                        mark_at,
                    )
            # The node's own countdown where it sees both sides (as detect.timeout does).
            top = max(s for s, _e in at.values())
            behind = [r for r, (s, _e) in at.items() if s < top]
            if behind:
                since = min(e for s, e in at.values() if s == top)
                put("ncclscope_pending_collective_age_seconds", (comm.ident,), log - since)
                put("ncclscope_timeout_remaining_seconds", (comm.ident,), TIMEOUT_S - (log - since))
                for rank in behind:
                    put(
                        "ncclscope_timeout_culprit_info",
                        (comm.ident, str(rank), OPS[top % 3], str(top)),
                        1.0,
                    )
        return rows

    def body(self, index: int, part: str) -> bytes | None:
        """Node ``index``'s series now, the job's part or the rest (None: its agent is
        lost)."""
        if not 0 <= index < len(self.nodes):
            return None
        # The node's own exporters stay up when its agent is lost (the agent died).
        if part == "ib":
            return fabric_body(self.nodes[index], time.time())
        if part == "dcgm":
            return dcgm_body(self.nodes[index], self.fault is not None)
        f = self.fault
        if f is not None and index == f.lost_node and time.time() >= f.lost_at:
            return None
        node = self.nodes[index]
        if part != "job":
            return node.static_node
        now = self.log_now()
        job = exported(self.rows(node, now), now)
        text = "".join(
            _line(name, labels, v) for name, series in job.items() for labels, v in series
        )
        return node.static_job + text.encode()


class Server:
    """Every node's endpoint on one port (``/node/<i>``), HTTP/1.1 with keep-alive, in an
    asyncio loop of its own thread."""

    def __init__(self, sim: Fleet) -> None:
        self.sim = sim
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.cpu_s = 0.0
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait()

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=4096)
        )
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                m = re.fullmatch(r"/node/(\d+)/(job|node|ib|dcgm)", path)
                body = self.sim.body(int(m[1]), m[2]) if m else None
                if body is None:
                    writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
                else:
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(body) + body
                    )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


def config(
    folder: Path,
    nodes: int,
    port: int,
    self_port: int,
    rules: Path,
    rest_every: int,
    fabric: bool = False,
) -> Path:
    lines = [
        "global: {scrape_interval: 1s, evaluation_interval: 1s, scrape_timeout: 1s}",
        f"rule_files: ['{rules}']",
        "scrape_configs:",
    ]
    jobs = [(JOB, "job", 1, 9477), (REST_JOB, "node", rest_every, 9477)]
    if fabric:
        jobs += [("node", "ib", rest_every, 9100), ("dcgm", "dcgm", rest_every, 9400)]
    for job, part, every, listen in jobs:
        lines += [
            f"  - job_name: {job}",
            f"    scrape_interval: {every}s",
            f"    scrape_timeout: {every}s",
            "    static_configs:",
        ]
        lines += [
            f"      - {{targets: ['127.0.0.1:{port}'], labels: "
            f"{{__metrics_path__: /node/{i}/{part}, instance: 'node-{i:05d}:{listen}'}}}}"
            for i in range(nodes)
        ]
    # Prometheus' own metrics, every second.
    lines += [
        "  - job_name: prometheus",
        f"    static_configs: [{{targets: ['127.0.0.1:{self_port}']}}]",
    ]
    path = folder / "prometheus.yml"
    path.write_text("\n".join(lines) + "\n")
    return path


def group_intervals(rules: Path, default: float = 1.0) -> dict[str, float]:
    """Each rule group's own evaluation interval in seconds (the global one if none)."""
    out: dict[str, float] = {}
    for m in re.finditer(r"- name: (\S+)\n(?:    interval: (\d+)s\n)?", rules.read_text()):
        out[m[1]] = float(m[2]) if m[2] else default
    return out


def api(server: prom.Prometheus, path: str, **params: str) -> Any:
    """Prometheus' JSON answer, waiting as long as a loaded server takes."""
    url = f"{server.base}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=120) as response:
        return json.load(response)


def query_at(server: prom.Prometheus, expr: str, at: float) -> list[dict[str, Any]]:
    answer = api(server, "/api/v1/query", query=expr, time=f"{at:.3f}")
    return list(answer.get("data", {}).get("result", []))


def by_label(server: prom.Prometheus, expr: str, label: str, at: float) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in query_at(server, expr, at)}


def alerts(server: prom.Prometheus) -> list[dict[str, Any]]:
    try:
        return list(api(server, "/api/v1/alerts")["data"]["alerts"])
    except (OSError, KeyError):
        return []


def scalar(server: prom.Prometheus, expr: str, at: float) -> float:
    got = query_at(server, expr, at)
    return float(got[0]["value"][1]) if got else float("nan")


def window_stats(server: prom.Prometheus, start: float, end: float) -> dict[str, Any]:
    """Rule groups' evaluation times, misses and Prometheus' CPU over [start, end]."""
    w = f"[{max(1, round(end - start))}s]"
    dur = "prometheus_rule_group_last_duration_seconds"
    groups: dict[str, dict[str, float]] = {}
    for q, key in ((0.5, "median"), (0.9, "p90")):
        for g, v in by_label(
            server, f"quantile_over_time({q}, {dur}{w})", "rule_group", end
        ).items():
            groups.setdefault(g.split(";")[-1], {})[key] = v
    for g, v in by_label(server, f"max_over_time({dur}{w})", "rule_group", end).items():
        groups.setdefault(g.split(";")[-1], {})["max"] = v
    for name, metric in (("missed", "iterations_missed_total"), ("iterations", "iterations_total")):
        expr = f"increase(prometheus_rule_group_{metric}{w})"
        for g, v in by_label(server, expr, "rule_group", end).items():
            groups.setdefault(g.split(";")[-1], {})[name] = v
    cpu = scalar(server, f'rate(process_cpu_seconds_total{{job="prometheus"}}{w})', end)
    return {"groups": groups, "prom_cpu": cpu, "seconds": end - start}


@dataclass
class Fired:
    name: str
    active_at: float  # real time
    labels: list[dict[str, str]]


def _active_at(alert: Mapping[str, Any]) -> float:
    text = str(alert["activeAt"])
    m = re.match(r"(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", text)
    if m is None:
        return math.nan
    frac = (m[2] or ".0")[:7]
    zone = "+00:00" if m[3] == "Z" else m[3]
    return datetime.fromisoformat(f"{m[1]}{frac}{zone}").timestamp()


def watch_alerts(server: prom.Prometheus, until: float, fired: dict[str, Fired]) -> None:
    """Poll the alerts until ``until`` (real time); the first activation of each alert,
    and every label set it fired with."""
    while time.time() < until:
        for alert in alerts(server):
            if alert.get("state") != "firing":
                continue
            labels = dict(alert["labels"])
            name = labels["alertname"]
            at = _active_at(alert)
            got = fired.setdefault(name, Fired(name, at, []))
            got.active_at = min(got.active_at, at)
            if labels not in got.labels:
                got.labels.append(labels)
        time.sleep(0.5)


def measure(
    nodes: int,
    per_node: int,
    comms: int,
    *,
    healthy_s: float,
    speed: float,
    lost_after_s: float,
    fault: bool,
    rules: Path,
    rest_every: int,
    fabric: bool = True,
) -> dict[str, Any]:
    """One fleet, one Prometheus: a healthy window, then the hang until the countdown
    alert has fired (or its deadline passed); the numbers."""
    sim = Fleet(nodes, per_node, comms, speed)
    server_http = Server(sim)
    cpu0 = time.process_time()
    with tempfile.TemporaryDirectory(prefix="bench-rules-") as tmp:
        folder = Path(tmp)
        cfg = config(folder, nodes, server_http.port, 0, rules, rest_every, fabric)
        server = prom.Prometheus("/usr/bin/prometheus", cfg, folder)
        try:
            if not server.ready(120):
                raise SystemExit(f"prometheus did not start:\n{server.tail()}")
            config(folder, nodes, server_http.port, server.port, rules, rest_every, fabric)
            urllib.request.urlopen(
                urllib.request.Request(f"{server.base}/-/reload", method="POST"), timeout=60
            )
            started = time.time()
            warmup = 30.0
            per_rule: dict[tuple[str, str], list[float]] = {}

            def sample_rules() -> None:
                for group in api(server, "/api/v1/rules")["data"]["groups"]:
                    for rule in group["rules"]:
                        key = (group["name"], rule.get("name", ""))
                        per_rule.setdefault(key, []).append(float(rule["evaluationTime"]))

            while time.time() < started + warmup + healthy_s:
                time.sleep(3.0)
                if time.time() > started + warmup:
                    sample_rules()
            healthy_end = time.time()
            healthy = window_stats(server, started + warmup, healthy_end)
            # Samples per scrape: the series each agent exports.
            per_agent = by_label(
                server,
                f'sum by (instance) (scrape_samples_scraped{{job=~"{JOB}|{REST_JOB}"}})',
                "instance",
                healthy_end,
            )
            out: dict[str, Any] = {
                "nodes": nodes,
                "ranks": nodes * per_node,
                "comms": len({c.ident for n in sim.nodes for c, _ in n.comms}),
                "healthy": healthy,
                "per_agent": (min(per_agent.values()), max(per_agent.values())),
                "agent_series": sum(per_agent.values()),
                "recorded_series": scalar(server, 'count({__name__=~".+:.+"})', healthy_end),
                "head_series": scalar(server, "prometheus_tsdb_head_series", healthy_end),
                "scrape_s": scalar(
                    server,
                    "quantile(0.5, quantile_over_time(0.5, "
                    f'scrape_duration_seconds{{job=~"{JOB}|{REST_JOB}"}}[{round(healthy_s)}s]))',
                    healthy_end,
                ),
                "healthy_alerts": sorted(
                    {a["labels"]["alertname"] for a in alerts(server) if a["state"] == "firing"}
                ),
            }
            if fault:
                f = sim.inject(lost_after_s)
                quarter = STALL_TIMEOUT_SHARE * TIMEOUT_S
                expect_log = {
                    "NcclscopeCollectiveStalled": f.leaders_enter + quarter,
                    "NcclscopeTimeoutImminent": f.leaders_enter
                    + TIMEOUT_S
                    - TIMEOUT_CRITICAL_LEFT_S,
                }
                expect = {k: sim.real_of(v) for k, v in expect_log.items()}
                # Every scrape of the last minute failed (active from then: pending for
                # NODE_LOST_FOR before it fires).
                lost = f.lost_at + 60.0
                expect["NcclscopeNodeLost"] = max(lost, expect["NcclscopeCollectiveStalled"])
                if fabric:
                    # XID 79 on the frozen node from the fault on: named once a stall
                    # alert names that node.
                    expect["NcclscopeStallGpuFault"] = expect["NcclscopeCollectiveStalled"]
                fired: dict[str, Fired] = {}
                deadline = max(expect.values()) + 20.0
                stall_from = expect["NcclscopeCollectiveStalled"] + 2.0
                watch_alerts(server, stall_from, fired)
                sample_rules_until = time.time()
                while time.time() < deadline:
                    watch_alerts(server, min(deadline, time.time() + 3.0), fired)
                    sample_rules()
                    if set(expect) <= set(fired) and time.time() > sample_rules_until + 15:
                        break
                out["stall"] = window_stats(server, stall_from, time.time())
                out["fault"] = {"fault": f, "expect": expect, "fired": fired, "sim": sim}
            out["rules"] = {k: statistics.median(v) for k, v in per_rule.items()}
            out["sim_cpu"] = (time.process_time() - cpu0) / max(1.0, time.time() - started)
            return out
        finally:
            server.close()
            server_http.close()


def ms(v: float) -> str:
    return f"{v * 1000:.1f}"


def _alert_report(r: Mapping[str, Any], speed: float) -> list[str]:
    f = r["fault"]
    fault: Fault = f["fault"]
    sim: Fleet = f["sim"]
    frozen = {str(x) for x in sim.nodes[FROZEN_NODE].ranks}
    culprit = str(sim.nodes[CULPRIT_NODE].ranks[CULPRIT_LOCAL])
    lines = []
    for name in ("NcclscopeCollectiveStalled", "NcclscopeNodeLost", "NcclscopeTimeoutImminent",
                 "NcclscopeStallGpuFault"):  # fmt: skip
        if name not in f["expect"]:
            continue
        expect = f["expect"][name]
        got: Fired | None = f["fired"].get(name)
        if got is None:
            lines.append(f"| {r['ranks']:,} | {name} | never fired | | |")
            continue
        delay = got.active_at - expect
        named: set[str] = set()
        for labels in got.labels:
            if name in ("NcclscopeNodeLost", "NcclscopeStallGpuFault"):
                named.add(labels.get("hostname", "?"))
            elif "rank" in labels:
                # the node's own countdown names the rank without its host
                host = labels.get("hostname")
                named.add(f"{labels['rank']}@{host}" if host else labels["rank"])
        hosts = {sim.nodes[FROZEN_NODE].hostname}
        want = (
            hosts
            if name in ("NcclscopeNodeLost", "NcclscopeStallGpuFault")
            else {f"{x}@{sim.nodes[FROZEN_NODE].hostname}" for x in sorted(frozen)}
            | {f"{culprit}@{sim.nodes[CULPRIT_NODE].hostname}", culprit}
        )
        wrong = sorted(named - want)
        right = f"no: {wrong}" if wrong or not named else "yes"
        lines.append(
            f"| {r['ranks']:,} | {name} | {delay:+.1f} s ({delay * speed:+.1f} s of log) | "
            f"{len(named)} | {right} |"
        )
    del fault
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, nargs="+", default=[128, 256, 625, 1250])
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument(
        "--comms-per-rank", type=int, default=2, help="world, node, then DP-like groups"
    )
    ap.add_argument("--healthy", type=float, default=60, help="healthy window, s (after 30 s)")
    ap.add_argument("--speed", type=float, default=5.0, help="log clock over real time")
    ap.add_argument("--lost-after", type=float, default=40.0, help="s after the fault")
    ap.add_argument("--no-fault", action="store_true")
    ap.add_argument("--rules", type=Path, default=RULES)
    ap.add_argument(
        "--rest-every",
        type=int,
        default=15,
        help="scrape interval of the agents' GPU, host and health series, s (the job's: 1 s)",
    )
    ap.add_argument(
        "--fabric",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="each node's node_exporter (InfiniBand) and dcgm-exporter, and the joined rules",
    )
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()

    results = []
    for nodes in args.nodes:
        print(f"# {nodes} nodes x {args.ranks_per_node} ranks ...", file=sys.stderr, flush=True)
        results.append(
            measure(
                nodes,
                args.ranks_per_node,
                args.comms_per_rank,
                healthy_s=args.healthy,
                speed=args.speed,
                lost_after_s=args.lost_after,
                fault=not args.no_fault,
                rules=args.rules,
                rest_every=args.rest_every,
                fabric=args.fabric,
            )
        )
    intervals = group_intervals(args.rules)
    print(
        f"\nScrape and evaluation every 1 s, {args.comms_per_rank} communicators per rank, "
        f"healthy window {args.healthy:.0f} s; log clock at {args.speed:g}x.\n"
    )
    print(
        "| nodes | ranks | series per agent | agents' series | recorded | head series "
        "| group | every | phase | eval median ms | p90 ms | max ms | median, % of interval "
        "| missed | Prometheus CPU | simulator CPU |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        lo, hi = r["per_agent"]
        for phase in ("healthy", "stall"):
            if phase not in r:
                continue
            w = r[phase]
            for group, d in sorted(w["groups"].items()):
                every = intervals.get(group, 1.0)
                print(
                    f"| {r['nodes']:,} | {r['ranks']:,} | {lo:.0f}-{hi:.0f} | "
                    f"{r['agent_series']:,.0f} | {r['recorded_series']:,.0f} | "
                    f"{r['head_series']:,.0f} | {group} | {every:g} s | {phase} | "
                    f"{ms(d.get('median', math.nan))} | {ms(d.get('p90', math.nan))} | "
                    f"{ms(d.get('max', math.nan))} | "
                    f"{100 * d.get('median', math.nan) / every:.1f}% | "
                    f"{d.get('missed', 0):.0f} of {d.get('iterations', 0):.0f} | "
                    f"{w['prom_cpu']:.2f} | {r['sim_cpu']:.2f} |"
                )
    if not args.no_fault:
        print("\nAlerts after the hang (delay: activation minus the threshold's crossing):\n")
        print("| ranks | alert | delay | named | right ones |")
        print("|---:|---|---:|---:|---|")
        for r in results:
            for line in _alert_report(r, args.speed):
                print(line)
    for r in results:
        print(f"\nMost expensive rules at {r['ranks']:,} ranks (median `evaluationTime`):\n")
        print("| group | rule | median ms |")
        print("|---|---|---:|")
        ranked = sorted(r["rules"].items(), key=lambda kv: -kv[1])
        for (group, name), v in ranked[: args.top]:
            print(f"| {group} | `{name}` | {ms(v)} |")
        print("\nThe 1 s group's rules:\n")
        print("| rule | median ms |")
        print("|---|---:|")
        for (group, name), v in ranked:
            if group == "ncclscope-job":
                print(f"| `{name}` | {ms(v)} |")
        fabric = [(name, v) for (group, name), v in ranked if group == "ncclscope-fabric"]
        if fabric:
            print("\nThe joined (fabric) group's rules:\n")
            print("| rule | median ms |")
            print("|---|---:|")
            for name, v in fabric:
                print(f"| `{name}` | {ms(v)} |")
        print(f"\nAlerts firing while healthy: {', '.join(r['healthy_alerts']) or 'none'}")


if __name__ == "__main__":
    main()
