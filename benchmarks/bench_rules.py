#!/usr/bin/env python3
"""What do the job-wide rules cost Prometheus at 1,024 ranks on 128 nodes?

A fake fleet (one HTTP endpoint per simulated node on 127.0.0.1, each serving what that
node's agent would: node, clock and timeout gauges, per rank and communicator the facts
the job-wide rules join, per rank its lateness and straggler score, 8 GPUs and the host)
is scraped by a real Prometheus with ``grafana/ncclscope-rules.yml`` loaded.  Values move
like a running job: every communicator's sequence grows ~10 per second, timestamps follow
the clock, the ranks of one node enter each collective 5 ms late (5% of the gap: below
the slow-node alert), so the rules compute on changing data, not constants.

Read from Prometheus' own metrics (it scrapes itself) after the run: each rule group's
``prometheus_rule_group_last_duration_seconds`` (median and max over the run, warm-up
left out), its missed iterations, the head series, the series per agent; and from
``/api/v1/rules`` (read every few seconds) each rule's ``evaluationTime``, median over
the reads, for the most expensive rules.  A baseline fleet (8 nodes, 64 ranks) runs
first, in the same invocation.

Usage:
    .venv/bin/python benchmarks/bench_rules.py                    # 8 then 128 nodes, 90 s each
    .venv/bin/python benchmarks/bench_rules.py --seconds 360 --interval 15
    .venv/bin/python benchmarks/bench_rules.py --nodes 128 --no-baseline --comms-per-rank 3
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import prom  # noqa: E402

RULES = REPO / "grafana" / "ncclscope-rules.yml"
JOB = "ncclscope-agent"
OPS = ("AllGather", "ReduceScatter", "AllReduce")
MARK_EVERY = (64, 1024)
SLOW_NODE = 3  # its ranks enter every collective SLOW_S late
SLOW_S = 0.005


@dataclass
class Comm:
    ident: str
    members: list[int]
    rate: float  # collectives per second


@dataclass
class Node:
    index: int
    hostname: str
    ranks: list[int]
    # The communicators its ranks are on, each with those of its ranks that are members.
    comms: list[tuple[Comm, list[int]]] = field(default_factory=list)


def comm_id(i: int) -> str:
    """A commId-like label: ``0x168e5087af895f5b``."""
    return f"0x{(0x168E5087AF895F5B + i * 0x9E3779B97F4A7C15) & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def fleet(nodes: int, per_node: int, comms_per_rank: int) -> list[Node]:
    """Every rank on the world communicator and its node's; with ``comms_per_rank`` > 2,
    also on data-parallel-like groups (the ranks of the same local index, one per node)."""
    out = [
        Node(n, f"node-{n:03d}", [n * per_node + i for i in range(per_node)]) for n in range(nodes)
    ]
    world = Comm(comm_id(0), [r for node in out for r in node.ranks], 10.0)
    count = 1
    for node in out:
        node.comms.append((world, node.ranks))
    for node in out:
        node.comms.append((Comm(comm_id(count), list(node.ranks), 10.5), node.ranks))
        count += 1
    for group in range(comms_per_rank - 2):
        for local in range(per_node):
            comm = Comm(comm_id(count), [n * per_node + local for n in range(nodes)], 9.5 - group)
            count += 1
            for node in out:
                node.comms.append((comm, [node.ranks[local]]))
    return out


def lateness(rank: int, per_node: int) -> float:
    """When a rank enters a collective after the first: 0-0.5 ms, plus the slow node's."""
    jitter = ((rank * 7919) % 500) / 1e6
    return jitter + (SLOW_S if rank // per_node == SLOW_NODE else 0.0)


def exposition(node: Node, per_node: int, t0: float, now: float) -> bytes:
    """The node's agent's metrics at ``now`` (the names and labels of ``ncclscope.agent``)."""
    out = [
        f'ncclscope_node_info{{hostname="{node.hostname}"}} 1',
        f"ncclscope_clock_timestamp_seconds {now:.6f}",
        "ncclscope_collective_timeout_seconds 1800",
        f"ncclscope_log_lines_read_total {int((now - t0) * 400 * per_node)}",
        "ncclscope_log_window_lines_unparsed 0",
        f"ncclscope_log_files_followed {per_node}",
        'ncclscope_findings{kind="straggler",severity="info"} 1',
    ]
    for comm, mine in node.comms:
        for rank in mine:
            late = lateness(rank, per_node)
            seq = max(0, int((now - t0 - late) * comm.rate))
            entered = t0 + seq / comm.rate + late
            labels = f'comm="{comm.ident}",rank="{rank}"'
            out.append(f"ncclscope_collective_seq{{{labels}}} {seq}")
            out.append(f"ncclscope_collective_entered_timestamp_seconds{{{labels}}} {entered:.6f}")
            out.append(f'ncclscope_collective_op_info{{{labels},op="{OPS[seq % 3]}"}} 1')
            for every in MARK_EVERY:
                mark = seq // every * every
                at = t0 + mark / comm.rate + late
                out.append(f'ncclscope_collective_mark_seq{{{labels},every="{every}"}} {mark}')
                mark_ts = f'ncclscope_collective_mark_timestamp_seconds{{{labels},every="{every}"}}'
                out.append(f"{mark_ts} {at:.6f}")
        out.append(f'ncclscope_communicator_ranks{{comm="{comm.ident}"}} {len(comm.members)}')
    for rank in node.ranks:
        late = lateness(rank, per_node)
        out.append(f'ncclscope_rank_info{{hostname="{node.hostname}",rank="{rank}"}} 1')
        out.append(f'ncclscope_collective_lateness_seconds{{rank="{rank}"}} {late + 0.0005:.6f}')
        out.append(
            f'ncclscope_straggler_score{{rank="{rank}"}} {max(0.0, late - 0.00025) * 10:.6f}'
        )
    wave = (now % 10) / 10  # optimizer-step-like swings in PCIe and utilisation
    for gpu in range(per_node):
        bus = f"00000000:{0x18 + gpu * 0x11:02X}:00.0"
        uuid = f"GPU-5eed{node.index:04x}-0000-4000-8000-{gpu:012x}"
        labels = f'UUID="{uuid}",gpu="{gpu}",pci_bus_id="{bus}"'
        out += [
            f'ncclscope_gpu_info{{{labels},name="NVIDIA H100 80GB HBM3"}} 1',
            f"ncclscope_gpu_memory_used_bytes{{{labels}}} {6.4e10 + gpu * 1e7 + wave * 1e8:.0f}",
            f"ncclscope_gpu_memory_total_bytes{{{labels}}} 85520809984",
            f"ncclscope_gpu_utilization_ratio{{{labels}}} {0.6 + 0.3 * wave:.3f}",
            f"ncclscope_gpu_pcie_tx_bytes_per_second{{{labels}}} {4.8e9 * wave:.0f}",
            f"ncclscope_gpu_pcie_rx_bytes_per_second{{{labels}}} {5.5e9 * (1 - wave):.0f}",
            f"ncclscope_gpu_pcie_link_max_bytes_per_second{{{labels}}} 63015384615.38",
            f"ncclscope_gpu_pcie_link_generation{{{labels}}} 5",
            f"ncclscope_gpu_pcie_link_width{{{labels}}} 16",
            f"ncclscope_gpu_clocks_event_reasons{{{labels}}} 4",
            f"ncclscope_gpu_temperature_celsius{{{labels}}} {45 + gpu + 10 * wave:.0f}",
            f"ncclscope_gpu_power_watts{{{labels}}} {300 + 300 * wave:.0f}",
            f"ncclscope_gpu_power_limit_watts{{{labels}}} 700",
            f"ncclscope_gpu_ecc_uncorrected_errors_total{{{labels}}} 0",
            f'ncclscope_gpu_process_memory_used_bytes{{{labels},pid="{100000 + gpu}"}} 64424509440',
        ]
    out += [
        "ncclscope_host_memory_total_bytes 2199023255552",
        f"ncclscope_host_memory_available_bytes {1.5e12 - wave * 1e10:.0f}",
        "ncclscope_host_swap_used_bytes 0",
        "ncclscope_host_swap_in_bytes_total 0",
        "ncclscope_host_swap_out_bytes_total 0",
        f"ncclscope_host_cpu_utilization_ratio {0.25 + 0.1 * wave:.3f}",
    ]
    return ("\n".join(out) + "\n").encode()


def serve(nodes: list[Node], per_node: int, t0: float) -> list[ThreadingHTTPServer]:
    """One endpoint per node, each on its own port and thread, as 128 agents would be."""
    servers = []
    for node in nodes:

        class Handler(BaseHTTPRequestHandler):
            me = node

            def do_GET(self) -> None:
                body = exposition(self.me, per_node, t0, time.time())
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    return servers


def group_intervals(default: int) -> dict[str, float]:
    """Each rule group's own evaluation interval in seconds (the global one if none)."""
    out: dict[str, float] = {}
    for m in re.finditer(r"- name: (\S+)\n(?:    interval: (\d+)s\n)?", RULES.read_text()):
        out[m[1]] = float(m[2]) if m[2] else float(default)
    return out


def config(
    folder: Path, ports: list[int], self_port: int, interval: int, rules: Path = RULES
) -> Path:
    targets = ", ".join(f"'127.0.0.1:{p}'" for p in ports)
    path = folder / "prometheus.yml"
    path.write_text(
        f"global:\n  scrape_interval: {interval}s\n  evaluation_interval: {interval}s\n"
        f"rule_files: ['{rules}']\n"
        "scrape_configs:\n"
        f"  - job_name: {JOB}\n    static_configs: [{{targets: [{targets}]}}]\n"
        # Prometheus' own metrics, every second whatever the interval, so short runs have samples.
        f"  - job_name: prometheus\n    scrape_interval: 1s\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{self_port}']}}]\n"
    )
    return path


def scalar(server: prom.Prometheus, expr: str) -> float:
    result = server.query(expr)
    return float(result[0]["value"][1]) if result else float("nan")


def by_label(server: prom.Prometheus, expr: str, label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in server.query(expr)}


def measure(nodes: int, per_node: int, comms: int, seconds: int, interval: int) -> dict[str, Any]:
    """One fleet, one Prometheus, ``seconds`` of scraping and rules; the numbers."""
    binary = "/usr/bin/prometheus"
    fake = fleet(nodes, per_node, comms)
    t0 = time.time()
    servers = serve(fake, per_node, t0)
    with tempfile.TemporaryDirectory(prefix="bench-rules-") as tmp:
        folder = Path(tmp)
        ports = [s.server_address[1] for s in servers]
        cfg = config(folder, ports, 0, interval, RULES)
        server = prom.Prometheus(binary, cfg, folder)
        try:
            if not server.ready():
                raise SystemExit(f"prometheus did not start:\n{server.tail()}")
            # Its port is known now: scrape itself there (the lifecycle API reloads).
            config(folder, ports, server.port, interval, RULES)
            urllib.request.urlopen(
                urllib.request.Request(f"{server.base}/-/reload", method="POST"), timeout=30
            )
            warmup = max(15, 3 * interval)
            per_rule: dict[tuple[str, str], list[float]] = {}
            start = time.monotonic()
            while (elapsed := time.monotonic() - start) < seconds + warmup:
                time.sleep(max(1.0, interval / 2))
                if elapsed < warmup:
                    continue
                for group in prom.get(server.base, "/api/v1/rules")["data"]["groups"]:
                    for rule in group["rules"]:
                        key = (group["name"], rule.get("name", ""))
                        per_rule.setdefault(key, []).append(float(rule["evaluationTime"]))
            window = f"[{seconds}s]"
            dur = "prometheus_rule_group_last_duration_seconds"
            groups = {
                g: {
                    "median": v,
                    "p90": by_label(
                        server, f"quantile_over_time(0.9, {dur}{window})", "rule_group"
                    )[g],
                    "max": by_label(server, f"max_over_time({dur}{window})", "rule_group")[g],
                }
                for g, v in by_label(
                    server, f"quantile_over_time(0.5, {dur}{window})", "rule_group"
                ).items()
            }
            missed = by_label(
                server,
                f"increase(prometheus_rule_group_iterations_missed_total{window})",
                "rule_group",
            )
            iterations = by_label(
                server, f"increase(prometheus_rule_group_iterations_total{window})", "rule_group"
            )
            # The agents' own series: recorded ones keep ``job`` (and some ``instance``).
            own = f'{{job="{JOB}",__name__!~".+:.+"}}'
            per_agent = by_label(server, f"count by (instance) ({own})", "instance")
            scrape = scalar(
                server,
                "quantile(0.5, quantile_over_time(0.5, "
                f'scrape_duration_seconds{{job="{JOB}"}}{window}))',
            )
            cpu = scalar(server, f'rate(process_cpu_seconds_total{{job="prometheus"}}{window})')
            return {
                "nodes": nodes,
                "ranks": nodes * per_node,
                "comms": len({c.ident for n in fake for c, _ in n.comms}),
                "head_series": scalar(server, "prometheus_tsdb_head_series"),
                "agent_series": scalar(server, f"count({own})"),
                "recorded_series": scalar(server, 'count({__name__=~".+:.+"})'),
                "per_agent_min": min(per_agent.values(), default=float("nan")),
                "per_agent_max": max(per_agent.values(), default=float("nan")),
                "groups": groups,
                "missed": missed,
                "iterations": iterations,
                "rules": {k: statistics.median(v) for k, v in per_rule.items()},
                "scrape_median_s": scrape,
                "prom_cpu": cpu,
                "alerts": sorted({a["labels"]["alertname"] for a in server.alerts()}),
            }
        finally:
            server.close()
            for s in servers:
                s.shutdown()
                s.server_close()


def ms(v: float) -> str:
    return f"{v * 1000:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument(
        "--comms-per-rank", type=int, default=2, help="world, node, then DP-like groups"
    )
    ap.add_argument("--seconds", type=int, default=90, help="measured run, after a warm-up")
    ap.add_argument("--interval", type=int, default=1, help="scrape and evaluation interval, s")
    ap.add_argument("--baseline-nodes", type=int, default=8)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args()

    sizes = ([] if args.no_baseline else [args.baseline_nodes]) + [args.nodes]
    results = []
    for nodes in sizes:
        print(
            f"# {nodes} nodes x {args.ranks_per_node} ranks, {args.seconds} s ...", file=sys.stderr
        )
        results.append(
            measure(
                nodes,
                args.ranks_per_node,
                args.comms_per_rank,
                args.seconds,
                args.interval,
            )
        )

    print(
        f"\nScrape and evaluation every {args.interval} s, {args.seconds} s measured, "
        f"{args.comms_per_rank} communicators per rank" + ".\n"
    )
    print(
        "| nodes | ranks | comms | series per agent | agents' series | recorded series "
        "| head series | group | eval median ms | eval p90 ms | eval max ms "
        "| max, % of its interval | missed | Prometheus CPU | scrape median ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    intervals = group_intervals(args.interval)
    for r in results:
        for group, d in sorted(r["groups"].items()):
            name = group.split(";")[-1]
            every = intervals.get(name, float(args.interval))
            print(
                f"| {r['nodes']} | {r['ranks']} | {r['comms']} | "
                f"{r['per_agent_min']:.0f}-{r['per_agent_max']:.0f} | {r['agent_series']:.0f} | "
                f"{r['recorded_series']:.0f} | {r['head_series']:.0f} | {name} | "
                f"{ms(d['median'])} | {ms(d['p90'])} | {ms(d['max'])} | "
                f"{100 * d['max'] / every:.1f}% of {every} s | {r['missed'].get(group, 0):.0f} "
                f"of {r['iterations'].get(group, 0):.0f} | {r['prom_cpu']:.2f} | "
                f"{ms(r['scrape_median_s'])} |"
            )
    for r in results:
        print(
            f"\nMost expensive rules at {r['ranks']} ranks "
            "(median `evaluationTime` of /api/v1/rules):\n"
        )
        print("| group | rule | median ms |")
        print("|---|---|---:|")
        top = sorted(r["rules"].items(), key=lambda kv: -kv[1])[: args.top]
        for (group, name), v in top:
            print(f"| {group} | `{name}` | {ms(v)} |")
        print(f"\nAlerts firing at the end: {', '.join(r['alerts']) or 'none'}")


if __name__ == "__main__":
    main()
