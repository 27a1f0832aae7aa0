#!/usr/bin/env python3
"""Hangs in logs cut at the head: is the culprit named wherever the kept lines hold
every waiting member's report, and withheld (never wrong) where a cut crosses one?

Jobs from ``tests/jobgen.py`` (PyTorch watchdog hangs, hangs in a sub-group, a hang
then a restart; 8 to 32 ranks; per-host, per-rank and srun-combined files; NCCL 2.7,
2.21 and 2.27), each cut at the head one of three ways: every file at its own point,
the whole job at one time, or one file.  "Kept" is ``tests/test_cut_head.reports_kept``
(every watchdog report, the culprit's last collective and, with several groups, the
init lines); for a restart, ``jobgen.evidence_kept`` as well.

Usage:
    .venv/bin/python benchmarks/bench_cut_head.py --jobs 400 --seed 3
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import jobgen  # noqa: E402
from test_cut_head import CUTS, analyse, cut_head, reports_kept  # noqa: E402

KINDS = ("hang_watchdog", "multi_pg", "restart_hang")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    began = time.monotonic()
    counts: Counter[tuple[str, str, str]] = Counter()
    for k in range(args.jobs):
        rng = random.Random(f"bench-cut-head:{args.seed}:{k}")
        kind = rng.choice(KINDS)
        job = jobgen.generate(jobgen.random_spec(rng, kind, max_ranks=32))
        how = rng.choice(CUTS)
        cut = cut_head(rng, job, how)
        verdict = jobgen.judge(analyse(cut), set(job.truth["culprit_ranks"]))
        kept = reports_kept(job, cut)
        if kind == "restart_hang":
            kept = kept and jobgen.evidence_kept(job, cut)
        outcome = "wrong" if verdict.wrong else "named" if verdict.named else "withheld"
        counts[(kind, "kept" if kept else "cut", outcome)] += 1
    print(f"{args.jobs} jobs, seed {args.seed}, {time.monotonic() - began:.0f} s")
    print(
        "| kind | reports kept: named / withheld / wrong | cut across: named / withheld / wrong |"
    )
    print("|---|---|---|")
    for kind in KINDS:
        cells = [
            " / ".join(str(counts[(kind, side, o)]) for o in ("named", "withheld", "wrong"))
            for side in ("kept", "cut")
        ]
        print(f"| {kind} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
