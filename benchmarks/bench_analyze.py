#!/usr/bin/env python3
"""Benchmark `ncclscope analyze` against `grep -c 'NCCL INFO'` on the same synthetic logs.

Each case is generated once by `ncclscope synth` (cached under --work), then timed:
the baseline `grep -c 'NCCL INFO' FILES...` and `ncclscope analyze FILES --format json`,
--runs rounds with the cases interleaved, on the same (page-cached) files.  Wall time is
the median; "vs first" is each case's MB/s over the first case's, round by round, then
the median; peak RSS is the child's maximum resident set (os.wait4), the largest of the
rounds.  Prints a Markdown table; `--json` also writes the raw numbers.

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
        "c64-1g-mixed",
        (
            "--ranks",
            "64",
            "--hosts",
            "8",
            "--launcher",
            "torchrun",
            "--size",
            GB,
            "--framework",
            "deepspeed",
            "--zero-stage",
            "3",
            "--offload",
            "optimizer",
            "--steps-per-print",
            "1",
            *COMMON,
        ),
        "the 64-rank job as DeepSpeed ZeRO-3 writes it: config dump, rank 0's timers and "
        "throughput every step, beside the NCCL lines",
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


def _commands(files: list[str]) -> tuple[list[str], list[str]]:
    grep = ["grep", "-c", "NCCL INFO", *files]
    analyze = [sys.executable, "-m", "ncclscope", "analyze", *files]
    return grep, [*analyze, "--format", "json", "--no-progress", "-o", os.devnull]


def measure(cases: list[Case], work: Path, runs: int) -> list[dict[str, object]]:
    """Time grep and ncclscope on each case, ``runs`` rounds, cases interleaved.

    Interleaving matters on a shared machine whose speed drifts by 20% over minutes:
    every round measures every case, so a slow minute slows all cases alike, and the
    per-round throughput against the first case cancels the drift.
    """
    files = {c.name: _files(_generate(c, work)) for c in cases}
    g_times: dict[str, list[float]] = {c.name: [] for c in cases}
    a_times: dict[str, list[float]] = {c.name: [] for c in cases}
    a_rss: dict[str, list[int]] = {c.name: [] for c in cases}
    for _ in range(runs):
        for case in cases:
            grep, analyze = _commands(files[case.name])
            # The kernel here reclaims idle page cache within minutes (DAMON), so read
            # the files right before each pair: both commands then find them in memory.
            _run(["cat", *files[case.name]])
            wall, _rss, _code = _run(grep)
            g_times[case.name].append(wall)
            wall, rss, code = _run(analyze)
            if code != 0:
                raise SystemExit(f"{case.name}: ncclscope exited {code}")
            a_times[case.name].append(wall)
            a_rss[case.name].append(rss)
    first = cases[0].name
    sizes = {name: sum(os.path.getsize(f) for f in fs) for name, fs in files.items()}
    results: list[dict[str, object]] = []
    for case in cases:
        name = case.name
        g, a = statistics.median(g_times[name]), statistics.median(a_times[name])
        # throughput against the first case, round by round
        relative = [
            (sizes[name] / mine) / (sizes[first] / base)
            for mine, base in zip(a_times[name], a_times[first], strict=True)
        ]
        results.append(
            {
                "case": name,
                "what": case.what,
                "files": len(files[name]),
                "size_bytes": sizes[name],
                "grep_s": round(g, 3),
                "ncclscope_s": round(a, 3),
                "ncclscope_s_all": [round(t, 3) for t in a_times[name]],
                "ratio": round(a / g, 1),
                "ncclscope_mb_per_s": round(sizes[name] / a / 1e6),
                "throughput_vs_first": round(statistics.median(relative), 2),
                "peak_rss_mb": round(max(a_rss[name]) / 1e6),
                "runs": runs,
            }
        )
    return results


def main(argv: list[str] | None = None) -> int:
    """Run the cases and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=REPO / "bench-data")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cases", default=",".join(c.name for c in CASES))
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    wanted = args.cases.split(",")
    results = measure([c for c in CASES if c.name in wanted], args.work, args.runs)
    print(
        f"`nproc` = {os.cpu_count()}; median of {args.runs} rounds, cases interleaved; "
        "same files, page cache warm;"
    )
    print(
        "grep = `grep -c 'NCCL INFO' FILES...`, ncclscope = `ncclscope analyze FILES... "
        "--format json`; vs first = MB/s against the first case, median of the rounds."
    )
    print()
    print(
        "| case | files | size | grep -c s | ncclscope s | ratio | ncclscope MB/s "
        "| vs first | peak RSS |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['case']} | {r['files']} | {int(r['size_bytes']) / 2**30:.2f} GiB "  # type: ignore[call-overload]
            f"| {r['grep_s']} | {r['ncclscope_s']} | {r['ratio']}x | {r['ncclscope_mb_per_s']} "
            f"| {r['throughput_vs_first']} | {r['peak_rss_mb']} MB |"
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
