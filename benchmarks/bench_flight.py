#!/usr/bin/env python3
"""Benchmark reading PyTorch Flight Recorder dumps against reading as many log lines.

Target (issue #15): reading dumps adds at most the time of reading the same number of
log lines.  The script writes, in a temporary directory:

- ``dumps/``: RANKS dumps of ENTRIES entries each, with plain ``pickle`` (protocol 2, as
  PyTorch's C++ pickler writes them), in the 2.x shape: two process groups, 12 stack
  frames per entry (shared, as PyTorch memoises them), the last calls scheduled;
- ``log/``: one NCCL log of the same job, with Init lines per rank and exactly
  RANKS * ENTRIES COLL lines (the calls the dumps hold), and ``log2x/``: twice as many.

Then, in this process, median of ``--runs`` rounds (interleaved), ``analysis.build`` on:
the log (L), the dumps (D), the log and the dumps together (L+D, the join included) and
the doubled log (2L).  It prints what the dumps add to the log (L+D - L) against what as
many more log lines add (2L - L), and against the whole of L; ``grep -c`` on the log is
the usual baseline.

Usage:
    .venv/bin/python benchmarks/bench_flight.py                      # 8 x 2000, 5 runs
    .venv/bin/python benchmarks/bench_flight.py --ranks 8 --entries 2000 --runs 7
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ncclscope.analysis import build

T0 = 1_764_124_400_000_000_000
COMM = "0x55aa10c0ffee"
COMM_ID = "0x4f1a6c2e9b7d3058"
#: (profiling name, NCCL op, count, torch dtype, NCCL datatype)
CALLS = (
    ("nccl:_all_gather_base", "AllGather", 3_145_728, "BFloat16", 9),
    ("nccl:_reduce_scatter_base", "ReduceScatter", 3_145_728, "BFloat16", 9),
    ("nccl:all_reduce", "AllReduce", 1, "Float", 7),
)
FRAMES = [
    {"name": f"f{k}", "filename": f"/venv/lib/python3.11/site-packages/torch/x{k}.py", "line": k}
    for k in range(10)
] + [
    {"name": "train_step", "filename": "/home/u/train.py", "line": 42},
    {"name": "<module>", "filename": "/home/u/train.py", "line": 90},
]


def make_dump(rank: int, ranks: int, entries: int) -> dict[str, Any]:
    all_ranks = str(list(range(ranks)))
    out = []
    for k in range(entries):
        name, _op, count, dtype, _nd = CALLS[k % len(CALLS)]
        size = count // ranks if "reduce_scatter" in name else count
        state = "completed" if k < entries - 2 else "scheduled"
        out.append(
            {
                "frames": FRAMES,
                "record_id": k,
                "pg_id": 0,
                "process_group": ("0", "default_pg"),
                "thread_name": "python",
                "thread_id": "140421802294144",
                "collective_seq_id": k + 1,
                "p2p_seq_id": 0,
                "op_id": k + 1,
                "profiling_name": name,
                "time_created_ns": T0 + k * 5_000_000 + rank * 10_000,
                "input_sizes": [[size]],
                "input_dtypes": [dtype],
                "output_sizes": [[size * ranks if "all_gather" in name else size]],
                "output_dtypes": [dtype],
                "state": state,
                "time_discovered_started_ns": T0 + k * 5_000_000 + 100_000
                if state != "scheduled"
                else None,
                "time_discovered_completed_ns": T0 + k * 5_000_000 + 900_000
                if state == "completed"
                else None,
                "retired": state == "completed",
                "timeout_ms": 600_000,
                "is_p2p": False,
            }
        )
    return {
        "version": "2.10",
        "comm_lib_version": "2.23.4",
        "pg_config": {
            "0": {"name": "0", "desc": "default_pg", "ranks": all_ranks},
            "1": {"name": "1", "desc": "dp", "ranks": all_ranks},
        },
        "pg_status": {
            "0": {
                "last_enqueued_collective": entries,
                "last_started_collective": -1,
                "last_completed_collective": entries - 2,
            }
        },
        "entries": out,
    }


def write_log(path: Path, ranks: int, calls: int) -> int:
    """An NCCL log of ``ranks`` ranks with ``calls`` COLL lines each; returns the lines."""
    lines = []
    for r in range(ranks):
        head = f"node-{r // 8}:{4100 + r}:{4100 + r} [{r % 8}] NCCL INFO "
        lines.append(head + "NCCL version 2.23.4+cuda12.6")
        lines.append(
            head + f"ncclCommInitRank comm {COMM}{r:02x} rank {r} nranks {ranks} cudaDev "
            f"{r % 8} nvmlDev {r % 8} busId {18 + r}000 commId {COMM_ID} - Init COMPLETE"
        )
    for k in range(calls):
        _name, op, count, _dt, nd = CALLS[k % len(CALLS)]
        size = count // ranks if op == "ReduceScatter" else count
        lines.extend(
            f"node-{r // 8}:{4100 + r}:{4100 + r} [{r % 8}] NCCL INFO {op}: opCount "
            f"{k:x} sendbuff 0x7f3a{r:02x}c000000 recvbuff 0x7f3a{r:02x}e000000 count "
            f"{size} datatype {nd} op 0 root 0 comm {COMM}{r:02x} [nranks={ranks}] "
            f"stream 0x55aa10d00d00"
            for r in range(ranks)
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


def timed(names: list[str], work: Path) -> float:
    t = time.perf_counter()
    built = build(names, workdir=work)
    elapsed = time.perf_counter() - t
    assert built.analysis.flight is not None
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-flight-") as tmp:
        root = Path(tmp)
        dumps = root / "dumps"
        dumps.mkdir()
        for r in range(args.ranks):
            data = pickle.dumps(make_dump(r, args.ranks, args.entries), protocol=2)
            (dumps / f"nccl_trace_rank_{r}").write_bytes(data)
        n_entries = args.ranks * args.entries
        n_lines = write_log(root / "log" / "train.log", args.ranks, args.entries)
        write_log(root / "log2x" / "train.log", args.ranks, 2 * args.entries)
        dump_mb = sum(p.stat().st_size for p in dumps.iterdir()) / 1e6
        cases = {
            "L": [str(root / "log")],
            "D": [str(dumps)],
            "L+D": [str(root / "log"), str(dumps)],
            "2L": [str(root / "log2x")],
        }
        times: dict[str, list[float]] = {k: [] for k in (*cases, "grep")}
        timed(cases["L+D"], root / "warm")  # imports and first-use costs out of the rounds
        for run in range(args.runs):
            for name, names in cases.items():
                times[name].append(timed(names, root / f"w-{name}-{run}"))
            t = time.perf_counter()
            with (root / "grep.out").open("w") as out:
                subprocess.run(
                    ["grep", "-c", "NCCL INFO", str(root / "log" / "train.log")],
                    stdout=out,
                    check=True,
                )
            times["grep"].append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in times.items()}
        added = med["L+D"] - med["L"]
        more_lines = med["2L"] - med["L"]
        print(
            f"{args.ranks} dumps x {args.entries} entries = {n_entries:,} entries "
            f"({dump_mb:.1f} MB pickle); log: {n_lines:,} lines; median of {args.runs}"
        )
        print("| build on | s |")
        print("|---|---:|")
        for name in ("L", "D", "L+D", "2L", "grep"):
            print(f"| {name} | {med[name]:.3f} |")
        print(f"dumps add (L+D - L): {added:.3f} s; as many more log lines add (2L - L): "
              f"{more_lines:.3f} s; ratio {added / more_lines:.2f}")  # fmt: skip
        print(f"dumps alone (D) against the log alone (L): ratio {med['D'] / med['L']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
