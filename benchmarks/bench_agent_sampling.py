#!/usr/bin/env python3
"""What one agent sampling tick costs: 8 fake GPUs and 16 real processes.

Starts 16 ``sleep`` processes, then runs ``--ticks`` ticks (default 500) of
``NvmlCollector.sample()`` (over ``FakeNvml.with_devices(8)``) and ``HostCollector.sample()``
(following the 16 pids), back to back, and prints the CPU time per tick
(``time.process_time``, this process only) for each collector and for both, the wall time,
and the process's RSS. Target: both together <= 2 ms of CPU per tick.

The host collector runs on a clock that advances 1 s per tick, so its rescan work (the
pid-reuse check every 5 s, and with ``match`` the scan for new processes, re-reading every
command line each 12th scan) happens as often per tick as in an agent sampling every
second. The "match" row finds the same 16 processes by their command line
(``sleep 3599.25``) instead of by pid.

The GPU side measures ncclscope's wrapper plus the fake, not a driver: a real NVML call is
an ioctl (a few microseconds each), and ``nvmlDeviceGetPcieThroughput`` waits 20 ms.

Usage:
    .venv/bin/python benchmarks/bench_agent_sampling.py
    .venv/bin/python benchmarks/bench_agent_sampling.py --ticks 2000 --gpus 8 --procs 16
"""

from __future__ import annotations

import argparse
import itertools
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from ncclscope.agent.fake_nvml import FakeNvml  # noqa: E402
from ncclscope.agent.host import HostCollector  # noqa: E402
from ncclscope.agent.nvml import NvmlCollector  # noqa: E402

SLEEP_SECONDS = "3599.25"  # also the command-line marker for the "match" row
TARGET_MS = 2.0


def per_tick(fn: Callable[[], object], ticks: int) -> tuple[float, float]:
    """CPU and wall milliseconds per call of ``fn``, over ``ticks`` calls."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(ticks):
        fn()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return cpu / ticks * 1e3, wall / ticks * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=500)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--procs", type=int, default=16)
    args = parser.parse_args(argv)

    children = [
        subprocess.Popen(["sleep", SLEEP_SECONDS], stdin=subprocess.DEVNULL)
        for _ in range(args.procs)
    ]
    try:
        pids = [c.pid for c in children]
        deadline = time.monotonic() + 10
        while any(psutil.Process(p).cmdline()[:1] != ["sleep"] for p in pids):
            if time.monotonic() > deadline:
                raise SystemExit("the sleep processes did not start")
            time.sleep(0.01)

        gpus = NvmlCollector(FakeNvml.with_devices(args.gpus))
        if (message := gpus.start()) is not None:
            raise SystemExit(message)
        seconds = itertools.count()
        by_pid = HostCollector(pids, clock=lambda: float(next(seconds)))
        seconds_m = itertools.count()
        by_match = HostCollector(
            match=f"sleep {SLEEP_SECONDS}", clock=lambda: float(next(seconds_m))
        )
        for _ in range(20):  # warm up: first scans, caches, cpu_times baselines
            gpus.sample()
            by_pid.sample()
            by_match.sample()
        if len(gpus.sample()) != args.gpus:
            raise SystemExit("not every fake GPU sampled")
        for host in (by_pid, by_match):
            if sorted(p.pid for p in host.sample().processes) != sorted(pids):
                raise SystemExit("not every process sampled")

        def both() -> None:
            gpus.sample()
            by_pid.sample()

        def both_match() -> None:
            gpus.sample()
            by_match.sample()

        rows = [
            (f"NvmlCollector, {args.gpus} fake GPUs", gpus.sample),
            (f"HostCollector, {args.procs} pids", by_pid.sample),
            (f"HostCollector, {args.procs} by match", by_match.sample),
            ("one tick: GPUs + pids", both),
            ("one tick: GPUs + match", both_match),
        ]
        print(
            f"{args.ticks} ticks each; {len(psutil.pids())} processes on this host;"
            f" python {sys.version.split()[0]}, psutil {psutil.__version__}"
        )
        print("| what | CPU ms / tick | wall ms / tick |")
        print("|---|---:|---:|")
        results = {}
        for name, fn in rows:
            cpu_ms, wall_ms = per_tick(fn, args.ticks)
            results[name] = cpu_ms
            print(f"| {name} | {cpu_ms:.3f} | {wall_ms:.3f} |")
        gpus.close()
    finally:
        for child in children:
            child.kill()
            child.wait()

    rss = psutil.Process().memory_info().rss
    peak = max(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    print(f"RSS now {rss / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB")
    worst = max(results["one tick: GPUs + pids"], results["one tick: GPUs + match"])
    verdict = "met" if worst <= TARGET_MS else "MISSED"
    print(f"target <= {TARGET_MS} ms CPU per tick: {verdict} (worst {worst:.3f} ms)")
    return 0 if worst <= TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
