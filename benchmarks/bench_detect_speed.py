#!/usr/bin/env python3
"""What the detectors add to ``analyze``, measured inside the same runs.

For each log, ``run_analysis`` runs ``--runs`` times in this process; its progress
callback marks when the detectors start and end, so each run gives the whole analysis
and the detectors' share of it, on the same files in the same minute.

Usage:
    .venv/bin/python benchmarks/bench_detect_speed.py bench-data/c64-1g/job.log
    .venv/bin/python benchmarks/bench_detect_speed.py bench-data/r1024-10k/job.log --runs 3

``bench-data/r1024-10k`` (1,024 ranks x 10,000 collectives, 2.2 GiB) is written by
``ncclscope synth --out bench-data/r1024-10k --ranks 1024 --hosts 128 --steps 770
--layers 4 --era 2.27 --timestamps --seed 9 --non-nccl-frac 0``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ncclscope.analysis import run_analysis  # noqa: E402


def measure(path: str, runs: int) -> dict[str, float]:
    totals, detects = [], []
    for _ in range(runs):
        subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)  # page cache
        marks: dict[str, float] = {}

        def progress(stage: str, done: int, total: int, marks: dict[str, float] = marks) -> None:
            if stage == "detect":
                marks["end" if done else "start"] = time.perf_counter()

        with tempfile.TemporaryDirectory() as work:
            start = time.perf_counter()
            analysis = run_analysis([path], workdir=Path(work), progress=progress)
            totals.append(time.perf_counter() - start)
        detects.append(marks["end"] - marks["start"])
        del analysis
    total, detect = statistics.median(totals), statistics.median(detects)
    return {"total_s": total, "detect_s": detect, "without_s": total - detect}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    print("| log | analyze s (median) | of it detectors s | detectors / the rest |")
    print("|---|---:|---:|---:|")
    for path in args.paths:
        r = measure(path, args.runs)
        print(
            f"| {path} | {r['total_s']:.2f} | {r['detect_s']:.2f} | "
            f"{r['detect_s'] / r['without_s']:.1%} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
