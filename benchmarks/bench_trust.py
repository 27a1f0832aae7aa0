#!/usr/bin/env python3
"""Can a user trust the diagnosis on real shapes?  Scored on jobs from ``tests/jobgen.py``
(a generator written from the format notes, not from ncclscope's parsers or its synth).

Jobs: 8 to 256 ranks, 1 to 8 ranks per host (one-rank hosts included), host clocks
offset by 0 to 50 ms, NCCL 2.7 / 2.21 / 2.27 lines, torchrun, per-rank or srun layouts.

* **Healthy** (>= 300 by default): healthy jobs, restarts after a silent kill, and GPU
  memory flat at 95-99% of the total; each analysed whole or after one random surgery
  (cut at the head, the tail or both anywhere, per job or in one file; one host's files
  dropped; init lines removed).  A false positive is any finding of severity warning or
  worse.
* **Stragglers**: a single slow rank and a slow node (every rank of one host) at
  slowdowns of 2.5, 5, 7.5, 10, 15, 25 and 50% of the gap between collectives (the issue's
  bands, chosen without reading any detector's threshold), timestamps on, whole logs.
  Recall: a straggler finding (any severity) naming exactly the rank, or the node by its
  host.  For slow nodes, ``evidence.cause`` is read: it should say the node is slow (not
  only that its clock may be off).  Wrong: a warning-or-worse finding blaming anyone else.
* **Hangs**: one rank never enters a collective (watchdog lines after the timeout, or the
  log ends while the others wait; several process groups; a restart after the hang),
  whole or after a random surgery.  Counted separately where the kept lines carry the
  evidence (``jobgen.evidence_kept``): culprit right, withheld (nobody blamed) or wrong.
* **Memory**: ``oom_risk`` warnings on the flat 95-99% jobs, and recall on a leaking GPU
  (its host named, no other host blamed).

Usage:
    .venv/bin/python benchmarks/bench_trust.py --quick             # ~240 jobs, <= 64 ranks
    .venv/bin/python benchmarks/bench_trust.py --jobs 300 --workers 2
    .venv/bin/python benchmarks/bench_trust.py --chunk 1/4 --json part1.json   # one slice
    .venv/bin/python benchmarks/bench_trust.py --merge part*.json              # the table
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import jobgen  # noqa: E402

BANDS = (0.025, 0.05, 0.075, 0.10, 0.15, 0.25, 0.50)
HEALTHY_KINDS = ("healthy", "healthy", "healthy", "restart_healthy", "memory_flat")
HANG_KINDS = ("hang_watchdog", "hang_watchdog", "hang_end", "multi_pg", "restart_hang")


def plan(jobs: int, quick: bool, seed: int) -> list[dict[str, Any]]:
    """Every job to run, as small dicts (picklable, cheap to send to a worker)."""
    rng = random.Random(seed)
    per_band = 5 if quick else 12
    out: list[dict[str, Any]] = [
        {"group": "healthy", "kind": HEALTHY_KINDS[k % len(HEALTHY_KINDS)]} for k in range(jobs)
    ]
    for band in BANDS:
        for kind in ("slow_rank", "slow_node"):
            out += [{"group": "straggler", "kind": kind, "slowdown": band} for _ in range(per_band)]
    for kind in ("intermittent_rank", "intermittent_node"):
        out += [
            {"group": "intermittent", "kind": kind, "slowdown": 0.25} for _ in range(per_band * 2)
        ]
    n_hang = 30 if quick else 100
    out += [{"group": "hang", "kind": HANG_KINDS[k % len(HANG_KINDS)]} for k in range(n_hang)]
    out += [{"group": "memory", "kind": "memory_flat"} for _ in range(10 if quick else 30)]
    out += [{"group": "memory", "kind": "memory_leak"} for _ in range(10 if quick else 30)]
    for index, job in enumerate(out):
        job["index"] = index
        job["seed"] = rng.randrange(2**31)
    return out


def surgery(rng: random.Random, job: jobgen.Job) -> tuple[str, jobgen.Files]:
    """One random surgery (a third of the jobs stay whole)."""
    files = job.files
    names = sorted(files)
    pick = rng.random()
    if pick < 0.34:
        return "whole", files
    if pick < 0.52:
        to = rng.uniform(0.05, 0.97)
        return f"tail {to:.0%}", jobgen.cut_time(files, 0.0, to)
    if pick < 0.66:
        frm = rng.uniform(0.03, 0.9)
        return f"head {frm:.0%}", jobgen.cut_time(files, frm, 1.0)
    if pick < 0.76:
        frm = rng.uniform(0.03, 0.5)
        to = rng.uniform(frm + 0.05, 0.98)
        return f"both {frm:.0%}-{to:.0%}", jobgen.cut_time(files, frm, to)
    if pick < 0.84 and len(names) > 1:
        name = rng.choice(names)
        to = rng.uniform(0.05, 0.95)
        return f"one file to {to:.0%}", jobgen.cut_lines(files, 0.0, to, only=name)
    if pick < 0.92 and len(names) > 1:
        return "drop a file", jobgen.drop_file(files, rng.choice(names))
    return "no init", jobgen.drop_tags(files)


def run_one(item: dict[str, Any], max_ranks: int) -> dict[str, Any]:
    """Generate, cut, analyse and judge one job (in a worker process)."""
    from ncclscope.agent.telemetry import read_telemetry
    from ncclscope.analysis import run_analysis
    from ncclscope.export.json_report import to_json_dict

    rng = random.Random(item["seed"])
    spec = jobgen.random_spec(
        rng, item["kind"], max_ranks=max_ranks, slowdown=item.get("slowdown", 0.0)
    )
    job = jobgen.generate(spec)
    cut_name, cut = ("whole", job.files)
    if item["group"] in ("healthy", "hang"):
        cut_name, cut = surgery(rng, job)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-trust-") as tmp:
        logs = jobgen.write_files(cut, Path(tmp) / "logs")
        telemetry = None
        if job.telemetry:
            jobgen.write_telemetry(job.telemetry, Path(tmp) / "telemetry")
            telemetry = read_telemetry([Path(tmp) / "telemetry"])
        doc = to_json_dict(run_analysis([str(logs)], workdir=Path(tmp) / "w", telemetry=telemetry))
    seconds = time.perf_counter() - start
    truth = job.truth
    culprits = set(truth["culprit_ranks"])
    hosts = set(truth["culprit_hosts"])
    result: dict[str, Any] = {
        **item,
        "ranks": spec.ranks,
        "hosts": len(spec.hosts),
        "era": spec.era,
        "layout": spec.layout,
        "surgery": cut_name,
        "seconds": seconds,
    }
    severe = jobgen.severe(doc)
    result["severe"] = [f"{f['kind']}/{f['severity']}" for f in severe]
    kind = truth["kind"]
    if not culprits and not hosts:
        result["alarm"] = bool(severe)
        result["oom_alarm"] = any(f["kind"] == "oom_risk" for f in severe)
        return result
    if kind in ("slow_node", "intermittent_node"):
        v = jobgen.judge(doc, culprits, hosts=hosts, kinds=("straggler",), by_host=True)
        named = [
            f
            for f in doc["findings"]
            if f["kind"] == "straggler"
            and (set(f.get("hosts") or []) == hosts)
            and set(f.get("ranks") or []) <= culprits
        ]
        cause = next((str(f["evidence"].get("cause", "")) for f in named), None)
        result["cause"] = cause
    elif kind in ("slow_rank", "intermittent_rank"):
        v = jobgen.judge(doc, culprits, kinds=("straggler",))
        named = [
            f
            for f in doc["findings"]
            if f["kind"] == "straggler" and set(f.get("ranks") or []) == culprits
        ]
    elif kind == "memory_leak":
        v = jobgen.judge(doc, culprits, hosts=hosts, kinds=("oom_risk",), by_host=True)
        named = [
            f for f in severe if f["kind"] == "oom_risk" and set(f.get("hosts") or []) == hosts
        ]
    else:
        v = jobgen.judge(doc, culprits)
        named = [1] if v.named else []
        result["evidence"] = jobgen.evidence_kept(job, cut)
    result["named"] = bool(named)
    if truth.get("window") and named:
        result["window_ok"] = _window_ok(named[0], truth["window"]["true_time"])
    result["wrong"] = v.wrong
    result["withheld"] = v.withheld
    return result


def _window_ok(finding: Any, true_window: list[float]) -> bool:
    """A straggler's ``window_start``/``window_end`` within 10% of the true window's
    length (plus the 50 ms a host clock may be off) of its true start and end."""
    ev = finding["evidence"] if isinstance(finding, dict) else {}
    start, end = ev.get("window_start"), ev.get("window_end")
    if not start or not end:
        return False
    a, b = true_window
    slack = 0.1 * (b - a) + 0.05
    found_a = datetime.fromisoformat(str(start)).timestamp()
    found_b = datetime.fromisoformat(str(end)).timestamp()
    return abs(found_a - a) <= slack and abs(found_b - b) <= slack


# --------------------------------------------------------------------------- report


def _cause_class(cause: str | None) -> str:
    """What a slow node's ``evidence.cause`` says: ``slow``, ``clock``, ``either`` (a value
    that names both, such as ``clock_or_constant_delay``: the logs cannot tell them apart),
    or ``none`` (no such key).

    >>> [_cause_class(c) for c in ("slow", "clock", "clock_or_constant_delay", None)]
    ['slow', 'clock', 'either', 'none']
    """
    if not cause:
        return "none"
    words = set(re.split(r"[^a-z]+", cause.lower()))
    if "or" in words or ({"slow"} <= words and {"clock", "skew"} & words):
        return "either"
    if "slow" in words:
        return "slow"
    return "clock" if {"clock", "skew"} & words else "none"


def _frac(num: int, den: int) -> str:
    return f"{num}/{den} ({num / den:.0%})" if den else "-"


def report(results: list[dict[str, Any]]) -> str:
    by = defaultdict(list)
    for r in results:
        by[r["group"]].append(r)
    lines: list[str] = []
    healthy = by["healthy"]
    alarms = [r for r in healthy if r["alarm"]]
    kinds = Counter(k.split("/")[0] for r in alarms for k in r["severe"])
    lines += [
        "| measure | result | target |",
        "|---|---|---|",
        f"| healthy jobs (whole or cut, clocks 0-50 ms) with a warning or worse | "
        f"{_frac(len(alarms), len(healthy))} | 0 |",
    ]
    for surgery_name in ("whole", "cut"):
        sub = [r for r in healthy if (r["surgery"] == "whole") == (surgery_name == "whole")]
        lines.append(
            f"| ... of them {surgery_name} | {_frac(sum(r['alarm'] for r in sub), len(sub))} | 0 |"
        )
    if kinds:
        text = ", ".join(f"{k} {n}" for k, n in kinds.most_common())
        lines.append(f"| ... findings raised on healthy jobs | {text} | |")
    mem = by["memory"]
    flat = [r for r in mem if r["kind"] == "memory_flat"]
    leak = [r for r in mem if r["kind"] == "memory_leak"]
    lines.append(
        f"| `oom_risk` warnings on healthy 95-99% GPU memory | "
        f"{_frac(sum(r['oom_alarm'] for r in flat), len(flat))} | 0 |"
    )
    lines.append(
        f"| `oom_risk` recall on a leaking GPU (host named) | "
        f"{_frac(sum(r['named'] for r in leak), len(leak))} | >= 95% |"
    )
    lines.append(
        f"| ... leaks where another host was blamed | "
        f"{_frac(sum(bool(r['wrong']) for r in leak), len(leak))} | 0 |"
    )
    lines += [
        "",
        "| slowdown | single rank named | wrong blame | slow node named (host) | "
        "cause: slow / either / clock / none | wrong blame |",
        "|---|---|---|---|---|---|",
    ]
    strag = by["straggler"]
    for band in BANDS:
        rank = [r for r in strag if r["kind"] == "slow_rank" and r["slowdown"] == band]
        node = [r for r in strag if r["kind"] == "slow_node" and r["slowdown"] == band]
        causes = Counter(_cause_class(r.get("cause")) for r in node if r["named"])
        lines.append(
            f"| {band:.1%} | {_frac(sum(r['named'] for r in rank), len(rank))} | "
            f"{sum(bool(r['wrong']) for r in rank)} | "
            f"{_frac(sum(r['named'] for r in node), len(node))} | "
            f"{causes['slow']} / {causes['either']} / {causes['clock']} / {causes['none']} | "
            f"{sum(bool(r['wrong']) for r in node)} |"
        )
    inter = by["intermittent"]
    for kind in ("intermittent_rank", "intermittent_node"):
        sub = [r for r in inter if r["kind"] == kind]
        named = sum(r["named"] for r in sub)
        window = f"(window within 10%: {sum(bool(r.get('window_ok')) for r in sub)}/{named})"
        lines.append(
            f"| {kind.replace('_', ' ')} 25% | "
            + (
                f"{_frac(named, len(sub))} {window} | {sum(bool(r['wrong']) for r in sub)} | | | |"
                if kind.endswith("rank")
                else f" | | {_frac(named, len(sub))} {window} | | "
                f"{sum(bool(r['wrong']) for r in sub)} |"
            )
        )
    lines += [
        "",
        "| hang jobs | jobs | culprit right | withheld | wrong culprit |",
        "|---|---|---|---|---|",
    ]
    hang = by["hang"]
    for label, keep in (("evidence kept", True), ("evidence cut away", False)):
        sub = [r for r in hang if r["evidence"] == keep]
        right = sum(1 for r in sub if r["named"] and not r["wrong"])
        wrong = sum(1 for r in sub if r["wrong"])
        lines.append(
            f"| {label} | {len(sub)} | {_frac(right, len(sub))} | "
            f"{_frac(len(sub) - right - wrong, len(sub))} | {_frac(wrong, len(sub))} |"
        )
    for kind in HANG_KINDS[1:]:
        sub = [r for r in hang if r["kind"] == kind]
        kept = [r for r in sub if r["evidence"]]
        right = sum(1 for r in kept if r["named"] and not r["wrong"])
        lines.append(
            f"| ... {kind}: right where kept / wrong anywhere | {len(sub)} | "
            f"{_frac(right, len(kept))} | | {sum(bool(r['wrong']) for r in sub)} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=300, help="healthy jobs (default 300)")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--quick", action="store_true", help="fewer jobs, at most 64 ranks")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--chunk", default="1/1", help="run slice K of N (1-based), e.g. 2/4")
    ap.add_argument("--json", type=Path, help="write every job's result here")
    ap.add_argument("--merge", type=Path, nargs="*", help="print the table of saved results")
    args = ap.parse_args()
    if args.merge:
        results = [r for path in args.merge for r in json.loads(path.read_text())]
        print(report(results))
        return
    jobs = args.jobs if not args.quick or args.jobs != 300 else 100
    items = plan(jobs, args.quick, args.seed)
    k, n = (int(x) for x in args.chunk.split("/"))
    items = items[k - 1 :: n]
    max_ranks = 64 if args.quick else 256
    os.environ.setdefault("POLARS_MAX_THREADS", "1")
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(run_one, items, [max_ranks] * len(items), chunksize=4))
    took = time.perf_counter() - start
    if args.json:
        args.json.write_text(json.dumps(results))
    print(report(results))
    print(
        f"\n{len(results)} jobs ({args.chunk}, seed {args.seed}, <= {max_ranks} ranks) "
        f"in {took:.0f} s with {args.workers} workers",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
