#!/usr/bin/env python3
"""Hangs in logs cut at the head: is the culprit named wherever the kept lines hold
every waiting member's report, and withheld (never wrong) where a cut crosses one?

Jobs from ``tests/jobgen.py`` (PyTorch watchdog hangs, hangs in a sub-group, a hang
then a restart; 8 to 32 ranks; per-host, per-rank and srun-combined files; NCCL 2.7,
2.21 and 2.27), each cut at the head one of three ways: every file at its own point,
the whole job at one time, or one file.  "Kept" is ``tests/test_cut_head.reports_kept``
(every watchdog report, the culprit's last collective and, with several groups, the
init lines); for a restart, ``jobgen.evidence_kept`` as well.

Mismatches (``--mismatches N``): ``ncclscope synth`` jobs of 4 to 16 ranks with one
rank calling another op, count or datatype, NCCL 2.18 / 2.21 (combined, torchrun) and
2.27 (per-rank files), every file cut between its last init line and the mismatched
call: found with both sides' op and count in the message; the culprit named right, by
process only, or wrong.

Usage:
    .venv/bin/python benchmarks/bench_cut_head.py --jobs 400 --seed 3 --mismatches 300
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import jobgen  # noqa: E402
from test_cut_head import CUTS, analyse, cut_head, cut_past_init, reports_kept  # noqa: E402

from ncclscope.analysis import run_analysis  # noqa: E402
from ncclscope.export.json_report import to_json_dict  # noqa: E402
from ncclscope.synth import Mismatch, SynthSpec, generate  # noqa: E402

KINDS = ("hang_watchdog", "multi_pg", "restart_hang")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--mismatches", type=int, default=0)
    args = parser.parse_args()
    if args.mismatches:
        mismatches(args.mismatches, args.seed)
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


def mismatches(n: int, seed: int) -> None:
    began = time.monotonic()
    counts: Counter[str] = Counter()
    for k in range(n):
        rng = random.Random(f"bench-cut-mismatch:{seed}:{k}")
        field = rng.choice(("op", "count", "dtype"))
        era, layout = rng.choice((("2.21", "combined"), ("2.18", "combined"), ("2.27", "per-rank")))
        ranks = rng.choice((4, 8, 16))
        culprit, at = rng.randrange(ranks), rng.randrange(14, 22)
        spec = SynthSpec(
            ranks=ranks, hosts=rng.choice((1, 2)) if ranks > 4 else 1, steps=3, era=era,
            layout=layout, launcher="torchrun" if layout == "combined" else "none",
            seed=rng.randrange(2**31),
            faults=(Mismatch(rank=culprit, at_instance=at, field=field),),  # type: ignore[arg-type]
        )  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="bench-cut-mismatch-") as tmp:
            generate(spec, Path(tmp) / "whole")
            cut = cut_past_init(rng, Path(tmp) / "whole", Path(tmp) / "cut", at)
            doc = to_json_dict(run_analysis([str(cut)], workdir=Path(tmp) / "work"))
        found = [f for f in doc["findings"] if f["kind"] == "mismatch"]
        if not found:
            counts["not found"] += 1
            continue
        f = found[0]
        ev = f["evidence"]
        sides = [*ev["culprit_calls"], *([ev["expected"]] if ev.get("expected") else [])]
        both = all(
            s["op"] in f["message"] and f"count {s['count']:,}" in f["message"] for s in sides
        )
        counts["both sides said" if both and ev.get("expected") else "sides incomplete"] += 1
        blamed = set(jobgen.judge(doc, {culprit}).wrong)
        counts["wrong" if blamed else "named" if f["ranks"] == [culprit] else "by process"] += 1
    print(
        f"{n} mismatches cut past their init lines, seed {seed}, {time.monotonic() - began:.0f} s"
    )
    for key in ("both sides said", "sides incomplete", "not found", "named", "by process", "wrong"):
        print(f"  {key}: {counts[key]}")


if __name__ == "__main__":
    main()
