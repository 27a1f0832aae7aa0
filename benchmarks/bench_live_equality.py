#!/usr/bin/env python3
"""Does the agent's live progress say what ``analyze`` says on the same lines?

Jobs from ``tests/jobgen.py`` (a generator written from the format notes, apart from the
parsers): healthy runs, hangs with and without watchdog lines, several process groups,
restarts, slow ranks; 8 to 64 ranks, NCCL 2.7 / 2.21 / 2.27, per-host, per-rank or
combined files, timestamps or none.  Each is cut at random points (the lines up to a
moment, from one, or both: a log read while the job runs, a rotated log's tail) and fed
to a ``LiveWindow`` and a ``LiveProgress`` in polls of random size, as the agent feeds
them; ``tests/live_equality.compare`` then checks, against ``analyze`` on the window
(and on the files themselves where NCCL printed its times): every member's calls and
last sequence, the countdown (collective waited in, op, who entered, who is behind,
seconds left within 1 s) and the members' job rows.

Usage:
    .venv/bin/python benchmarks/bench_live_equality.py --jobs 200 --seed 25
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
from live_equality import compare  # noqa: E402

KINDS = ("healthy", "hang_watchdog", "hang_end", "multi_pg", "restart_hang", "slow_rank")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--max-ranks", type=int, default=64)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    differ: Counter[str] = Counter()
    jobs: Counter[str] = Counter()
    bad = 0
    start = time.monotonic()
    for k in range(args.jobs):
        kind = KINDS[k % len(KINDS)]
        spec = jobgen.random_spec(rng, kind, max_ranks=args.max_ranks)
        job = jobgen.generate(spec)
        frm = rng.choice((0.0, 0.0, rng.uniform(0.02, 0.6)))
        to = rng.uniform(max(frm + 0.05, 0.1), 1.0)
        cut = jobgen.cut_time(job.files, frm, to)
        files = {name: [ln.text for ln in lines] for name, lines in cut.items()}
        found = compare(files, seed=k)
        jobs[kind] += 1
        if found:
            bad += 1
            differ[kind] += 1
            print(f"job {k} ({kind}, {spec.ranks} ranks, era {spec.era}, {spec.layout}, "
                  f"cut {frm:.0%}-{to:.0%}): {found[0][:300]}")  # fmt: skip
    took = time.monotonic() - start
    print(f"{args.jobs} jobs in {took:.0f} s; live differs from analyze on {bad}")
    for kind in KINDS:
        print(f"  {kind}: {jobs[kind] - differ[kind]}/{jobs[kind]} equal")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
