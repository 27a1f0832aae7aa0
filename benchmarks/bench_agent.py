#!/usr/bin/env python3
"""The agent's costs: /metrics rendering, CPU and memory while it runs.

Modes:

* ``render``: ``/metrics`` with 1,024 ranks' series (each rank on the world and a
  host communicator), 8 GPUs and 16 processes; prints the median render time over
  200 renders (target <= 20 ms) and the number of series.
* ``idle --seconds 60``: ``ncclscope agent --fake-gpus 8`` at 1 s with 16 job processes
  (``sleep``), as a subprocess; prints its CPU share of one core over the run, measured
  on its own pid (target <= 1%), and its peak RSS (target <= 150 MB).
* ``soak --minutes 30``: the agent at 0.1 s following a log that grows by 1 MB/s of
  NCCL COLL lines; prints its RSS every minute and the change from minute 5 to the end
  (target within 10%).

Usage:
    .venv/bin/python benchmarks/bench_agent.py render
    .venv/bin/python benchmarks/bench_agent.py idle --seconds 60
    .venv/bin/python benchmarks/bench_agent.py soak --minutes 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402
from prometheus_client import generate_latest  # noqa: E402

from ncclscope.agent.exporter import Board, identity_rows, new_registry, render, serve  # noqa: E402


def bench_render() -> None:
    board = Board()
    board.set("identity", identity_rows("node-0"))
    ranks = range(1024)
    board.set(
        "job",
        {
            "ncclscope_collective_seq": [
                ((comm, str(r)), 123456.0) for r in ranks for comm in ("0xworld", f"0xhost{r // 8}")
            ],
            "ncclscope_collective_lateness_seconds": [((str(r),), 0.001) for r in ranks],
            "ncclscope_straggler_score": [((str(r),), 0.01) for r in ranks],
            "ncclscope_pending_collective_age_seconds": [(("0xworld",), 12.0)],
            "ncclscope_timeout_remaining_seconds": [(("0xworld",), 588.0)],
            "ncclscope_timeout_culprit_info": [(("0xworld", "5", "AllGather"), 1.0)],
        },
    )
    gpus = [(str(g), f"GPU-{g}", f"00000000:{g:02X}:00.0") for g in range(8)]
    board.set(
        "nvml",
        {
            "ncclscope_gpu_memory_used_bytes": [(k, 1e9) for k in gpus],
            "ncclscope_gpu_pcie_tx_bytes_per_second": [(k, 1e9) for k in gpus],
            "ncclscope_gpu_pcie_rx_bytes_per_second": [(k, 1e9) for k in gpus],
        },
    )
    board.set(
        "host",
        {"ncclscope_process_resident_memory_bytes": [((str(p),), 1e9) for p in range(16)]},
    )
    registry = new_registry(board)

    def timed(fn: Callable[[], bytes], n: int = 200) -> tuple[list[float], bytes]:
        times = []
        body = b""
        for _ in range(n):
            start = time.perf_counter()
            body = fn()
            times.append(time.perf_counter() - start)
        return sorted(times), body

    base, expected = timed(lambda: generate_latest(registry))
    fast, body = timed(lambda: render(board))
    assert body == expected, "render() differs from generate_latest()"
    _host, port = serve(board, "127.0.0.1:0")
    url = f"http://127.0.0.1:{port}/metrics"

    def get() -> bytes:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bytes(response.read())

    http, got = timed(get)
    assert got == expected
    series = sum(1 for line in body.decode().splitlines() if line and line[0] != "#")

    def stats(times: list[float]) -> str:
        return f"median {statistics.median(times) * 1000:.2f} ms, p95 {times[189] * 1000:.2f} ms"

    print(f"render: {series} series, 200 renders each")
    print(f"  client_python generate_latest (baseline): {stats(base)}")
    print(f"  ncclscope render:                         {stats(fast)} "
          f"({statistics.median(base) / statistics.median(fast):.1f}x faster)")  # fmt: skip
    print(f"  HTTP GET /metrics over loopback:          {stats(http)}")


def _agent(args: list[str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "ncclscope", "agent", "--listen", "127.0.0.1:0", *args]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _idle_once(seconds: float, extra: list[str], pids: list[str]) -> tuple[float, int]:
    """One agent, idle for ``seconds`` after start-up: its CPU share of one core and peak RSS."""
    agent = _agent(["--fake-gpus", "8", "--interval", "1", *extra, *pids])
    proc = psutil.Process(agent.pid)
    try:
        time.sleep(5)  # start-up (imports) is not the steady state
        cpu0, t0 = proc.cpu_times(), time.monotonic()
        peak = 0
        while time.monotonic() - t0 < seconds:
            time.sleep(1)
            peak = max(peak, proc.memory_info().rss)
        cpu1, t1 = proc.cpu_times(), time.monotonic()
    finally:
        agent.terminate()
        agent.wait(10)
    used = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return used / (t1 - t0), peak


def idle(seconds: float, *, topology: bool = False, rounds: int = 1) -> None:
    """The agent idle; with ``topology``, also before (no topology: direct-attached fake
    GPUs, sysfs not read) against after (8 fake GPUs, 4 per switch, a sysfs tree of that
    shape read at start, the uplinks exported and recorded with --out), alternating in
    the same run."""
    sleepers = [subprocess.Popen(["sleep", str((seconds + 30) * 2 * rounds)]) for _ in range(16)]
    try:
        pids = [a for p in sleepers for a in ("--pid", str(p.pid))]
        if not topology:
            share, peak = _idle_once(seconds, [], pids)
            print(f"idle: {share:.2%} of one core over {seconds:.0f} s, "
                  f"peak RSS {peak / 1e6:.0f} MB (8 fake GPUs, 16 processes, 1 s)")  # fmt: skip
            return
        from ncclscope.agent.fake_nvml import FakeNvml
        from ncclscope.agent.fake_sysfs import write_pci_tree

        with tempfile.TemporaryDirectory() as tmp:
            buses = [g.pci_bus_id for g in FakeNvml.with_devices(8).gpus]
            write_pci_tree(Path(tmp) / "sys", [str(b) for b in buses], gpus_per_switch=4)
            runs = {
                "before (no topology)": ["--sysfs-root", "none", "--out", f"{tmp}/before"],
                "after (4 GPUs/switch, sysfs + NVML topology, recorded)": [
                    "--sysfs-root", f"{tmp}/sys", "--fake-gpus-per-switch", "4",
                    "--out", f"{tmp}/after",
                ],
            }  # fmt: skip
            got: dict[str, list[float]] = {k: [] for k in runs}
            for _ in range(rounds):
                for name, extra in runs.items():
                    share, peak = _idle_once(seconds, extra, pids)
                    got[name].append(share)
                    print(f"  {name}: {share:.2%} of one core, peak RSS {peak / 1e6:.0f} MB")
            for name, shares in got.items():
                print(f"idle {name}: median {statistics.median(shares):.2%} of one core "
                      f"over {rounds} x {seconds:.0f} s")  # fmt: skip
            rows = _recorded_uplinks(Path(tmp) / "after")
            print(f"uplink rows recorded in the after run's telemetry: {rows}")
    finally:
        for p in sleepers:
            p.kill()


def _recorded_uplinks(folder: Path) -> int:
    from ncclscope.agent.telemetry import read_telemetry

    tel = read_telemetry([folder])
    return int((tel["metric"] == "ncclscope_gpu_pcie_uplink_info").sum()) if len(tel) else 0


def soak(minutes_total: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "job.log"
        log.write_text("")
        agent = _agent(["--follow", str(log), "--interval", "0.1", "--analyse-every", "5"])
        proc = psutil.Process(agent.pid)
        line = (
            "node-0:{pid}:{pid} [0] NCCL INFO AllGather: opCount {op:x} sendbuff 0x7f00 "
            "recvbuff 0x7f00 count 4096 datatype 9 op 0 root 0 comm 0x55aa [nranks=8] "
            "stream 0x55bb\n"
        )
        op = 0
        # RSS every second; per minute its low, median and peak (the detector runs every
        # 5 s make short peaks that a 1 s sample catches or misses), and the kernel's
        # high-water mark (VmHWM: the largest RSS ever, caught or not).
        minutes: list[tuple[int, int, int, int]] = []
        current: list[int] = []
        start = time.monotonic()
        last_sample = start
        with log.open("a") as fh:
            while time.monotonic() - start < minutes_total * 60:
                chunk = []
                size = 0
                while size < 100_000:  # 1 MB/s in 0.1 s steps
                    text = line.format(pid=1000 + op % 8, op=op // 8)
                    chunk.append(text)
                    size += len(text)
                    op += 1
                fh.write("".join(chunk))
                fh.flush()
                time.sleep(0.1)
                now = time.monotonic()
                if now - last_sample >= 1:
                    last_sample = now
                    current.append(proc.memory_info().rss)
                if len(current) >= 60:
                    mid = int(statistics.median(current))
                    m = (min(current), mid, max(current), _hwm(agent.pid))
                    minutes.append(m)
                    low, med, top, hwm = (f"{v / 1e6:.0f} MB" for v in m)
                    print(f"  minute {len(minutes):2d}: RSS low {low}, median {med}, "
                          f"peak {top}; VmHWM {hwm}", flush=True)  # fmt: skip
                    current = []
        agent.terminate()
        agent.wait(10)
        grown = os.path.getsize(log)
    after5 = minutes[4:] or minutes
    for k, name in ((0, "low"), (1, "median"), (2, "peak")):
        vals = [m[k] for m in after5]
        lo, hi = min(vals), max(vals)
        print(f"soak: per-minute RSS {name} from minute 5 to {len(minutes)}: "
              f"{lo / 1e6:.0f}-{hi / 1e6:.0f} MB ({hi / lo - 1:+.1%})")  # fmt: skip
    print(f"soak: VmHWM at minute 5 {after5[0][3] / 1e6:.0f} MB, at minute {len(minutes)} "
          f"{after5[-1][3] / 1e6:.0f} MB ({after5[-1][3] / after5[0][3] - 1:+.1%}); "
          f"log {grown / 1e6:.0f} MB")  # fmt: skip


def _hwm(pid: int) -> int:
    """The process's peak RSS so far (bytes), from /proc."""
    for text in Path(f"/proc/{pid}/status").read_text().splitlines():
        if text.startswith("VmHWM:"):
            return int(text.split()[1]) * 1024
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["render", "idle", "soak"])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument(
        "--topology",
        action="store_true",
        help="idle: the agent without and with PCIe topology recorded, alternating",
    )
    parser.add_argument("--rounds", type=int, default=1, help="idle --topology: runs of each")
    args = parser.parse_args(argv)
    if args.mode == "render":
        bench_render()
    elif args.mode == "idle":
        idle(args.seconds, topology=args.topology, rounds=args.rounds)
    else:
        soak(args.minutes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
