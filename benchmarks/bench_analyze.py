#!/usr/bin/env python3
"""Benchmark `ncclscope analyze` against `grep -c 'NCCL INFO'` on the same synthetic logs.

Each case is generated once by `ncclscope synth` (cached under --work), then timed:
the baseline `grep -c 'NCCL INFO' FILES...` and `ncclscope analyze FILES --format json`,
each --runs times, in this same process run, on the same (page-cached) files.  Wall time
is the median; peak RSS is the child's maximum resident set (os.wait4), the largest of
the runs.  Prints a Markdown table; `--json` also writes the raw numbers.

Usage:
    .venv/bin/python benchmarks/bench_analyze.py                  # all cases (~10 min)
    .venv/bin/python benchmarks/bench_analyze.py --cases c64-1g   # one case
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Case:
    """A synthetic job to generate and analyse."""

    name: str
    synth_args: tuple[str, ...]
    what: str


GB = "1GB"
COMMON = ("--era", "2.27", "--timestamps", "--warns", "8", "--seed", "7")
CASES = (
    Case(
        "c64-1g",
        ("--ranks", "64", "--hosts", "8", "--launcher", "torchrun", "--size", GB, *COMMON),
        "64 ranks / 8 hosts, one 1 GiB file, torchrun prefix, NCCL timestamps",
    ),
    Case(
        "c64-4g",
        ("--ranks", "64", "--hosts", "8", "--launcher", "torchrun", "--size", "4GB", *COMMON),
        "the same job, 4 GiB",
    ),
    Case(
        "r1024-1g-one-file",
        ("--ranks", "1024", "--hosts", "128", "--launcher", "torchrun", "--size", GB, *COMMON),
        "1,024 ranks / 128 hosts, one 1 GiB file",
    ),
    Case(
        "r1024-1g-1024-files",
        ("--ranks", "1024", "--hosts", "128", "--layout", "per-rank", "--size", GB, *COMMON),
        "1,024 ranks / 128 hosts, 1,024 files (NCCL_DEBUG_FILE=%h.%p), 1 GiB in all",
    ),
)


def _run(cmd: list[str]) -> tuple[float, int, int]:
    """Wall seconds, peak RSS in bytes and exit code of one command.

    Output goes to a real file: GNU grep stops at the first match when its output is
    /dev/null, which would make the baseline meaningless.
    """
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL)
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    return wall, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status)


def _files(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.glob("*.log"))


def _generate(case: Case, work: Path) -> Path:
    folder = work / case.name
    stamp = folder / ".args"
    args = " ".join(case.synth_args)
    if stamp.exists() and stamp.read_text() == args:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    print(f"generating {case.name} ...", file=sys.stderr)
    cmd = [sys.executable, "-m", "ncclscope", "synth", "--out", str(folder), *case.synth_args]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    stamp.write_text(args)
    return folder


def measure(case: Case, work: Path, runs: int) -> dict[str, object]:
    """Time grep and ncclscope on one case; return the numbers."""
    files = _files(_generate(case, work))
    size = sum(os.path.getsize(f) for f in files)
    grep = ["grep", "-c", "NCCL INFO", *files]
    analyze = [
        sys.executable,
        "-m",
        "ncclscope",
        "analyze",
        *files,
        "--format",
        "json",
        "--no-progress",
        "-o",
        os.devnull,
    ]
    g_times, a_times, a_rss = [], [], []
    for _ in range(runs):
        # The kernel here reclaims idle page cache within minutes (DAMON), so read the
        # files right before each pair: both commands then find them in memory.
        _run(["cat", *files])
        wall, _rss, _code = _run(grep)
        g_times.append(wall)
        wall, rss, code = _run(analyze)
        if code != 0:
            raise SystemExit(f"{case.name}: ncclscope exited {code}")
        a_times.append(wall)
        a_rss.append(rss)
    g, a = statistics.median(g_times), statistics.median(a_times)
    return {
        "case": case.name,
        "what": case.what,
        "files": len(files),
        "size_bytes": size,
        "grep_s": round(g, 3),
        "ncclscope_s": round(a, 3),
        "ratio": round(a / g, 1),
        "ncclscope_mb_per_s": round(size / a / 1e6),
        "peak_rss_mb": round(max(a_rss) / 1e6),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the cases and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=REPO / "bench-data")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cases", default=",".join(c.name for c in CASES))
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    wanted = args.cases.split(",")
    results = [measure(c, args.work, args.runs) for c in CASES if c.name in wanted]
    print(f"`nproc` = {os.cpu_count()}; median of {args.runs} runs; same files, page cache warm;")
    print(
        "grep = `grep -c 'NCCL INFO' FILES...`, ncclscope = `ncclscope analyze FILES... "
        "--format json`."
    )
    print()
    print("| case | files | size | grep -c s | ncclscope s | ratio | ncclscope MB/s | peak RSS |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['case']} | {r['files']} | {int(r['size_bytes']) / 2**30:.2f} GiB "  # type: ignore[call-overload]
            f"| {r['grep_s']} | {r['ncclscope_s']} | {r['ratio']}x | {r['ncclscope_mb_per_s']} "
            f"| {r['peak_rss_mb']} MB |"
        )
    by_name = {r["case"]: r for r in results}
    if "c64-1g" in by_name and "c64-4g" in by_name:
        small, big = by_name["c64-1g"]["peak_rss_mb"], by_name["c64-4g"]["peak_rss_mb"]
        print(f"\npeak RSS 4 GiB / 1 GiB: {big / small:.2f}")  # type: ignore[operator]
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
