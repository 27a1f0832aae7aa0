#!/usr/bin/env python3
"""What does ``analyze --prometheus`` cost for a 1,024-rank job over 6 hours?

A TSDB is backfilled with ``promtool tsdb create-blocks-from openmetrics`` for ``--nodes``
nodes (128), each with node_exporter's InfiniBand series for ``--ports`` ports (8: error
counters, transmit wait, data, state, rate), dcgm-exporter's fields for 8 GPUs (XID, ECC,
PCIe replays, clocks-event reasons, SM clock, temperature, PCIe link) and the agent's own
series (GPU memory, PCIe traffic and link, ECC, XIDs, host memory and swap, identity),
one sample every ``--interval`` seconds (30) over ``--hours`` (6), ending an hour ago,
with a few error bursts (symbol errors and link recoveries on one port, a link down on
another, an XID and a throttled GPU).  A real Prometheus serves it; ``read_cluster`` reads
the job's hosts over the window, twice (cold, then warm caches), and the requests,
series, samples and seconds are printed with what the bursts came back as.

Target (issue #29): at most 20 requests and 5 s against a local Prometheus.

Usage:
    .venv/bin/python benchmarks/bench_cluster_queries.py
    .venv/bin/python benchmarks/bench_cluster_queries.py --nodes 16 --hours 1   # quick
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tsdb_server import Server

from ncclscope.cluster.prometheus import PromClient
from ncclscope.cluster.read import read_cluster
from ncclscope.cluster.summary import cluster_doc

IB_COUNTERS = (
    "symbol_error_total", "link_downed_total", "link_error_recovery_total",
    "port_errors_received_total", "port_receive_remote_physical_errors_total",
    "local_link_integrity_errors_total", "excessive_buffer_overrun_errors_total",
    "port_discards_transmitted_total",
)  # fmt: skip
GPUS = 8


class Writer:
    """OpenMetrics families, one at a time (a family's samples must be together)."""

    def __init__(self, out: IO[str], times: list[int]) -> None:
        self.out = out
        self.times = times
        self.samples = 0
        self.series = 0

    def family(self, name: str, rows: list[tuple[str, object]]) -> None:
        """``rows``: (label text, value or callable(k) -> value per time index)."""
        self.out.write(f"# TYPE {name} gauge\n")
        lines: list[str] = []
        for labels, value in rows:
            self.series += 1
            head = f"{name}{{{labels}}} "
            if callable(value):
                lines.extend(f"{head}{value(k)} {t}\n" for k, t in enumerate(self.times))
            else:
                lines.extend(f"{head}{value} {t}\n" for t in self.times)
            if len(lines) > 200_000:
                self.out.write("".join(lines))
                lines.clear()
        self.out.write("".join(lines))
        self.samples += len(rows) * len(self.times)


#: The families written: (table, name, value) with value a constant, or one of the bursts
#: named in ``write_openmetrics``.
IB_RISING = (
    ("port_transmit_wait_total", 5_000),
    ("port_data_transmitted_bytes_total", 10**11),
    ("port_data_received_bytes_total", 10**11),
)
IB_GAUGES = (("state_id", 4), ("physical_state_id", 5), ("rate_bytes_per_second", 5e10))
DCGM = (
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 0),
    ("DCGM_FI_DEV_SM_CLOCK", 1980),
    ("DCGM_FI_DEV_GPU_TEMP", 55),
)
AGENT_GPU = (
    ("memory_used_bytes", 6.1e10),
    ("memory_total_bytes", 8.5e10),
    ("pcie_tx_bytes_per_second", 2e9),
    ("pcie_rx_bytes_per_second", 2e9),
    ("pcie_link_generation", 5),
    ("pcie_link_width", 16),
    ("pcie_link_max_bytes_per_second", 6.3e10),
    ("clocks_event_reasons", 0),
    ("ecc_uncorrected_errors_total", 0),
    ("utilization_ratio", 0.97),
    ("temperature_celsius", 60),
    ("power_watts", 650),
)
AGENT_HOST = (
    ("memory_available_bytes", 1.5e12),
    ("memory_total_bytes", 2e12),
    ("swap_used_bytes", 0),
    ("swap_in_bytes_total", 0),
    ("swap_out_bytes_total", 0),
    ("cpu_utilization_ratio", 0.4),
)


def write_openmetrics(path: Path, nodes: int, ports: int, times: list[int]) -> Writer:
    n = len(times)
    burst = range(n // 3, n // 3 + max(n // 60, 3))  # a few minutes, a third in
    flap, down = (nodes // 7, 3 % ports), (nodes // 3, 0)  # (node, port)
    xid_at, hot = (nodes * 3 // 4, 5), (nodes // 2, 2)  # (node, GPU)
    hosts = [f"dgx{k:03d}" for k in range(nodes)]

    def sym(i: int) -> int:
        return 40 * max(0, min(i, burst.stop) - burst.start)

    def recovered(i: int) -> int:
        return 1 if i >= burst.start + 2 else 0

    def downed(i: int) -> int:
        return 1 if i >= burst.start else 0

    def xid(i: int) -> int:
        return 79 if i >= burst.start else 0

    def slowdown(i: int) -> int:
        return 0x48 if i in burst else 0  # HW slowdown, HW thermal

    bursts: dict[tuple[str, tuple[int, int]], object] = {
        ("symbol_error_total", flap): sym,
        ("link_error_recovery_total", flap): recovered,
        ("link_downed_total", down): downed,
        ("DCGM_FI_DEV_XID_ERRORS", xid_at): xid,
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", hot): slowdown,
    }

    def lab(k: int, port: int, job: str, extra: str = "") -> str:
        return f'instance="{hosts[k]}:{port}",job="{job}"{extra}'

    def port_lab(k: int, d: int) -> str:
        return lab(k, 9100, "node", f',device="mlx5_{d}",port="1"')

    def gpu_lab(k: int, g: int) -> str:
        ids = f'gpu="{g}",UUID="GPU-{k:03d}-{g}",device="nvidia{g}"'
        return lab(k, 9400, "dcgm", f',{ids},modelName="NVIDIA H100",Hostname="{hosts[k]}"')

    def agent_lab(k: int, g: int) -> str:
        ids = f'gpu="{g}",UUID="GPU-{k:03d}-{g}",pci_bus_id="00000000:{0x18 + 16 * g:02X}:00.0"'
        return lab(k, 9477, "ncclscope", f",{ids}")

    every_port = [(k, d) for k in range(nodes) for d in range(ports)]
    every_gpu = [(k, g) for k in range(nodes) for g in range(GPUS)]
    with path.open("w") as f:
        w = Writer(f, times)
        targets = ((9100, "node"), (9400, "dcgm"), (9477, "ncclscope"))
        w.family("up", [(lab(k, p, j), 1) for k in range(nodes) for p, j in targets])
        uname = [(lab(k, 9100, "node", f',nodename="{h}.cluster"'), 1) for k, h in enumerate(hosts)]
        w.family("node_uname_info", uname)
        info = [(lab(k, 9477, "ncclscope", f',hostname="{h}"'), 1) for k, h in enumerate(hosts)]
        w.family("ncclscope_node_info", info)
        for c in IB_COUNTERS:
            w.family(f"node_infiniband_{c}",
                     [(port_lab(*kd), bursts.get((c, kd), 0)) for kd in every_port])  # fmt: skip
        for c, per in IB_RISING:
            w.family(f"node_infiniband_{c}",
                     [(port_lab(*kd), lambda i, p=per: p * i) for kd in every_port])  # fmt: skip
        for c, v in IB_GAUGES:
            w.family(f"node_infiniband_{c}", [(port_lab(*kd), v) for kd in every_port])
        for name in ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"):
            w.family(name, [(gpu_lab(*kg), bursts.get((name, kg), 0)) for kg in every_gpu])
        for name, v in DCGM:
            w.family(name, [(gpu_lab(*kg), v) for kg in every_gpu])
        for name, v in AGENT_GPU:
            w.family(f"ncclscope_gpu_{name}", [(agent_lab(*kg), v) for kg in every_gpu])
        for name, v in AGENT_HOST:
            w.family(
                f"ncclscope_host_{name}", [(lab(k, 9477, "ncclscope"), v) for k in range(nodes)]
            )
        f.write("# EOF\n")
    return w


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--ports", type=int, default=8)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--interval", type=int, default=30, help="seconds between samples")
    ap.add_argument(
        "--keep", type=Path, help="keep the TSDB here (and reuse it when it is there already)"
    )
    args = ap.parse_args()
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None or promtool is None:
        print("needs prometheus and promtool (apt-get install prometheus)", file=sys.stderr)
        return 2
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    folder.mkdir(parents=True, exist_ok=True)
    window = folder / "window.txt"
    tsdb = folder / "tsdb"
    if args.keep is not None and window.exists() and tsdb.exists():  # a kept TSDB: reused
        start, end = (datetime.fromisoformat(x) for x in window.read_text().split())
        print(f"reusing {tsdb}")
    else:
        end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
        start = end - timedelta(hours=args.hours)
        t0 = int(start.timestamp())
        times = list(range(t0, int(end.timestamp()) + 1, args.interval))
        om = folder / "data.om"
        w0 = time.monotonic()
        w = write_openmetrics(om, args.nodes, args.ports, times)
        print(f"openmetrics: {w.series:,} series, {w.samples:,} samples, "
              f"{om.stat().st_size / 2**20:,.0f} MiB in {time.monotonic() - w0:.1f} s")  # fmt: skip
        w0 = time.monotonic()
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb)],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        print(f"promtool backfill: {time.monotonic() - w0:.1f} s")
        om.unlink()
        window.write_text(f"{start.isoformat()} {end.isoformat()}\n")
    server = Server(tsdb, folder)
    url = server.url
    try:
        if not server.ready():
            print(f"Prometheus did not start: see {server.log_path}", file=sys.stderr)
            return 1
        hosts = [f"dgx{k:03d}" for k in range(args.nodes)]
        for run in ("cold", "warm"):
            client = PromClient(url, timeout_s=30)
            w0 = time.monotonic()
            t = read_cluster(client, hosts, start, end)
            total = time.monotonic() - w0
            doc = cluster_doc(t)
            assert doc is not None
            print(f"\nread_cluster ({run}): {len(client.asks)} requests, "
                  f"{doc['series']:,} series, "
                  f"{doc['samples']:,} samples, {total:.2f} s in all "
                  f"({doc['seconds']:.2f} s in requests), step {t.step_s:g} s")  # fmt: skip
            for a in client.asks:
                print(f"  {a.what:<13} {a.status:<9} {a.series:>7,} series {a.samples:>9,} samples "
                      f"{a.seconds:6.2f} s")  # fmt: skip
            print(f"  tables: ports {len(t.ports):,} rows, gpus {len(t.gpus):,}, "
                  f"telemetry {len(t.telemetry):,}, instances {len(t.instances):,}")  # fmt: skip
        bad = [p for p in doc["ports"] if p["errors"]]
        print("ports with errors:", [(p["host"], p["device"], p["errors"]) for p in bad])
        print("GPUs with events:", [(g["host"], g["gpu"], g["xids"], g["clocks_event_reasons"])
                                    for g in doc["gpus"]])  # fmt: skip
        print("problems:", doc["problems"])
    finally:
        server.close()
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
