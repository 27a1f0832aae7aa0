#!/usr/bin/env python3
"""What does ``ncclscope run`` cost a job, and does it lose any line?

A job prints N lines (90% on stdout, 10% on stderr) and reports its own wall and CPU
time from its first line to its last.  Each case runs the job directly (stdout and
stderr into a file, as ``CMD > log 2>&1``) and through ``ncclscope run`` (its terminal
copy into a file too), one right after the other, ``--runs`` times, with the same
environment (``ncclscope run``'s settings, so ``PYTHONUNBUFFERED=1`` in both).

Cases:

* ``fast-plain``: 200,000 training-progress lines, as fast as the job can print them;
* ``fast-nccl``: 200,000 NCCL COLL lines (the worst case: every line is stamped);
* ``paced``: 100 lines a second for ``--paced-seconds`` (a chatty real job).

Reported per case (medians over runs): the job's wall time direct, through
``ncclscope run --no-agent`` (the tee only) and through ``ncclscope run`` (the tee and
the agent), and their ratios to direct; ``ncclscope run``'s CPU seconds while the job
ran, as a share of one core over the job's wall time (``run.json``): the tee's thread
(``--no-agent``), and the whole process with the agent's threads; lines missing from
``DIR/output.log`` (the most over runs and variants).

Usage:
    .venv/bin/python benchmarks/bench_run.py --runs 3
    .venv/bin/python benchmarks/bench_run.py --cases paced --paced-seconds 30
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ncclscope.agent.launch import job_environment  # noqa: E402

JOB = r"""
import json, sys, time
n, pace, kind, result = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
if kind == "nccl":
    fmt = ("node-6:5381:5381 [3] NCCL INFO AllGather: opCount {k:x} sendbuff 0x7f3a2c000000 "
           "recvbuff 0x7f3a2e000000 count 4096 datatype 9 op 0 root 0 comm 0x55aa10c0ffee "
           "[nranks=16] stream 0x55aa10d00d00\n")
else:
    fmt = "[rank0]:2026-11-26 02:40:00,123 - INFO - step {k} loss 2.{k:04d} tokens/s 181234.5\n"
out, err = sys.stdout.write, sys.stderr.write
wall, cpu = time.perf_counter(), time.process_time()
for k in range(n):
    (err if k % 10 == 9 else out)(fmt.format(k=k))
    if pace:
        time.sleep(pace)
sys.stdout.flush()
sys.stderr.flush()
with open(result, "w") as fh:
    json.dump({"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}, fh)
"""

CASES = {
    "fast-plain": (200_000, 0.0, "plain"),
    "fast-nccl": (200_000, 0.0, "nccl"),
    "paced": (None, 0.01, "plain"),
}


def one(case: str, n: int, pace: float, kind: str, work: Path, k: int) -> dict[str, float]:
    """One direct run, one through ``ncclscope run --no-agent``, one through ``run``."""
    job = work / "job.py"
    job.write_text(JOB)
    env = job_environment(os.environ, work / "unused").env
    env.pop("NCCL_DEBUG_FILE", None)
    direct_res = work / f"{case}-{k}-direct.json"
    with (work / "direct.log").open("wb") as log:
        subprocess.run(
            [sys.executable, str(job), str(n), str(pace), kind, str(direct_res)],
            stdout=log, stderr=log, env=env, check=True,
        )  # fmt: skip
    row = {"direct_wall_s": json.loads(direct_res.read_text())["wall_s"], "lost": 0}
    for variant, extra in (("tee", ["--no-agent"]), ("run", [])):
        out = work / f"{case}-{k}-{variant}"
        res = work / f"{case}-{k}-{variant}.json"
        with (work / "terminal.log").open("wb") as term:
            subprocess.run(
                [sys.executable, "-m", "ncclscope", "run", "--out", str(out), "--listen",
                 "none", "--no-summary", *extra, "--", sys.executable, str(job), str(n),
                 str(pace), kind, str(res)],
                stdout=term, stderr=term, env=dict(os.environ), cwd=REPO, check=True,
            )  # fmt: skip
        record = json.loads((out / "run.json").read_text())
        with (out / "output.log").open("rb") as fh:
            row["lost"] = max(row["lost"], n - sum(1 for _ in fh))
        row[f"{variant}_wall_s"] = json.loads(res.read_text())["wall_s"]
        row[f"{variant}_tee_share"] = record["cpu_s"]["tee"] / record["job_wall_s"]
        row[f"{variant}_share"] = record["cpu_s"]["ncclscope"] / record["job_wall_s"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    ap.add_argument("--paced-seconds", type=float, default=10.0)
    args = ap.parse_args()
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}")  # fmt: skip
    print("| case | lines | job wall s: direct | run --no-agent | run | ratios | tee CPU "
          "| run CPU | lines lost |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
        for case in args.cases:
            n, pace, kind = CASES[case]
            if n is None:
                n = int(args.paced_seconds / pace)
            rows = [one(case, n, pace, kind, Path(tmp), k) for k in range(args.runs)]

            def med(key: str, rows: list[dict[str, float]] = rows) -> float:
                return statistics.median(r[key] for r in rows)

            direct = med("direct_wall_s")
            ratios = f"{med('tee_wall_s') / direct:.3f} / {med('run_wall_s') / direct:.3f}"
            print(
                f"| {case} | {n:,} | {direct:.3f} | {med('tee_wall_s'):.3f} "
                f"| {med('run_wall_s'):.3f} | {ratios} | {med('tee_tee_share'):.2%} "
                f"| {med('run_share'):.2%} | {max(r['lost'] for r in rows)} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
