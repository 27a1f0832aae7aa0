#!/usr/bin/env python3
"""Reading NCCL Inspector output against reading NCCL's log, per record and per line.

One synthetic job (``ncclscope.synth.inspector``: 32 ranks, N collectives) is written
twice: as Inspector's files (one compact JSON record per rank and collective) and as the
NCCL INFO log of the same job (Init lines and one COLL line per rank and collective).
Per round, interleaved: ``build`` on the log alone (the NCCL scanner, records, identity,
collectives table: what ``analyze`` does before the detectors), ``build`` on the Inspector
files alone (sniffing, reading, the tables) and the Inspector reader alone
(``read_inspector_files`` over the files).  Reported: microseconds per NCCL line and per
Inspector record, median over rounds, and their ratio (above 1: Inspector is faster per
record).

Usage:
    .venv/bin/python benchmarks/bench_inspector.py --collectives 3000 --runs 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ncclscope.analysis import build
from ncclscope.parsers.tools.inspector import read_inspector_files
from ncclscope.synth.inspector import InspectorJob, coll_log, inspector_files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--collectives", type=int, default=3000)
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    job = InspectorJob(nranks=args.ranks, ranks_per_host=8, collectives=args.collectives,
                       drop=0.0, seed=1)  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="bench-inspector-"))
    try:
        (root / "log").mkdir()
        (root / "ins").mkdir()
        log = root / "log" / "train.log"
        log.write_text(coll_log(job))
        for name, text in inspector_files(job).items():
            (root / "ins" / name).write_text(text)
        files = sorted((root / "ins").iterdir())
        n_lines = sum(1 for _ in log.open("rb"))
        n_records = sum(sum(1 for _ in f.open("rb")) for f in files)
        mb_log = log.stat().st_size / 1e6
        mb_ins = sum(f.stat().st_size for f in files) / 1e6
        print(f"log: {n_lines:,} lines, {mb_log:.1f} MB; inspector: {n_records:,} records in "
              f"{len(files)} files, {mb_ins:.1f} MB")  # fmt: skip
        # Wall and CPU time (all threads of this process): CPU time is steadier on a
        # machine shared with other work, wall time is what a user waits.
        wall: dict[str, list[float]] = {"log": [], "ins": [], "read": []}
        cpu: dict[str, list[float]] = {"log": [], "ins": [], "read": []}

        def timed(key: str, work: Callable[[], Any]) -> Any:
            w, c = time.perf_counter(), time.process_time()
            out = work()
            wall[key].append(time.perf_counter() - w)
            cpu[key].append(time.process_time() - c)
            return out

        for k in range(args.runs):
            timed("log", lambda k=k: build([str(root / "log")], workdir=root / f"w-log-{k}"))
            built = timed(
                "ins", lambda k=k: build([str(root / "ins")], workdir=root / f"w-ins-{k}")
            )
            assert built.analysis.tools.inspector.height == n_records
            timed(
                "read", lambda: read_inspector_files([(k, f, str(f)) for k, f in enumerate(files)])
            )
        for label, times in (("wall", wall), ("CPU", cpu)):
            med = {key: statistics.median(v) for key, v in times.items()}
            per_line = med["log"] / n_lines * 1e6
            per_rec = med["ins"] / n_records * 1e6
            per_read = med["read"] / n_records * 1e6
            print(f"[{label}] NCCL log, build:         {med['log']:.3f} s, {per_line:.3f} us/line")
            print(f"[{label}] Inspector, build:        {med['ins']:.3f} s, {per_rec:.3f} us/record")
            print(
                f"[{label}] Inspector, reader alone: {med['read']:.3f} s, {per_read:.3f} us/record"
            )
            print(f"[{label}] per record vs per line: build {per_line / per_rec:.2f}x, reader "
                  f"{per_line / per_read:.2f}x (above 1: Inspector faster)")  # fmt: skip
        print(f"per byte (wall): log {mb_log / statistics.median(wall['log']):.0f} MB/s, "
              f"Inspector {mb_ins / statistics.median(wall['ins']):.0f} MB/s (build)")  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
