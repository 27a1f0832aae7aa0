#!/usr/bin/env python3
"""PCIe offload contention and OOM risk accuracy against synthetic jobs with telemetry.

Writes ``--jobs`` DeepSpeed jobs with ``ncclscope synth --telemetry`` (its truth is what it
injected, never what ncclscope parses), 8 to 32 ranks on 2 to 4 hosts, ZeRO stage 2 or 3,
NCCL 2.27 with timestamps, hosts' clocks off by up to 2 ms, some one-off delays:

* ``contention``: optimizer offload, one or two hosts' PCIe saturated during the optimizer
  step from a random step on, inflated 1.8-3.5x;
* ``healthy_offload``: optimizer (or optimizer and parameter) offload, nothing injected;
* ``healthy``: no offload, nothing injected;
* ``memory_growth``: optimizer offload, one rank's GPU memory grows 2-4 GiB a step.

Scores, per host: a ``pcie_contention`` finding on an injected host that names exactly its
ranks is a true positive, one on any other host a false positive, an injected host
without one a false negative.  Healthy controls (``healthy*``) must have no finding of
severity warning or above.  ``oom_risk`` recall: the growing rank named.

Usage:
    .venv/bin/python benchmarks/bench_contention.py                 # 60 jobs, 4 workers
    .venv/bin/python benchmarks/bench_contention.py --jobs 20 --json out.json
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ncclscope import synth  # noqa: E402

KINDS = {"contention": 4, "healthy_offload": 2, "healthy": 1, "memory_growth": 1}
LAYOUTS = [(8, 2), (16, 2), (16, 4), (32, 4), (24, 3)]


def make_spec(k: int, seed: int) -> tuple[str, synth.SynthSpec]:
    rnd = random.Random(seed * 1009 + k)
    kind = rnd.choices(list(KINDS), weights=list(KINDS.values()))[0]
    ranks, hosts = rnd.choice(LAYOUTS)
    stage = rnd.choice((2, 3))
    names = [f"node-{h}" for h in range(hosts)]
    offload = "none" if kind == "healthy" else "optimizer"
    if kind == "healthy_offload" and stage == 3 and rnd.random() < 0.5:
        offload = "both"
    steps = rnd.randint(8, 14)
    contended: tuple[str, ...] = ()
    if kind == "contention":
        contended = tuple(sorted(rnd.sample(names, 1 if hosts < 4 else rnd.choice((1, 2)))))
    spec = synth.SynthSpec(
        ranks=ranks,
        hosts=hosts,
        steps=steps,
        layers=rnd.choice((2, 4, 6)),
        era="2.27",
        timestamps=True,
        seed=seed * 1009 + k,
        framework="deepspeed",
        zero_stage=stage,
        offload=offload,  # type: ignore[arg-type]
        step_time_s=rnd.uniform(1.0, 3.0),
        clock_offset_max_s=0.002,
        jitter_events=rnd.randint(0, 6),
        telemetry=True,
        telemetry_interval_s=rnd.choice((0.05, 0.1, 0.2)),
        pcie_contention=contended,
        contention_from_step=rnd.randint(0, steps // 2),
        contention_inflation=rnd.uniform(1.8, 3.5),
        memory_growth=(rnd.randrange(ranks),) if kind == "memory_growth" else (),
        memory_growth_bytes_per_step=rnd.randint(2, 4) << 30,
    )
    return kind, spec


def run_job(args: tuple[int, int]) -> dict[str, Any]:
    from ncclscope.agent.telemetry import read_telemetry
    from ncclscope.analysis import run_analysis

    k, seed = args
    kind, spec = make_spec(k, seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench-contention-"))
    try:
        truth = synth.generate(spec, tmp / "job")
        t0 = time.perf_counter()
        tel = read_telemetry([tmp / "job" / "telemetry"])
        analysis = run_analysis([str(tmp / "job" / "job.log")], workdir=tmp / "work", telemetry=tel)
        seconds = time.perf_counter() - t0
        findings = [
            {"kind": f.kind, "severity": f.severity, "hosts": f.hosts, "ranks": f.ranks}
            for f in analysis.findings
        ]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tele = truth.telemetry or {}
    injected = {c["host"]: sorted(c["ranks"]) for c in tele.get("contention", [])}
    growth = [g["rank"] for g in tele.get("memory_growth", [])]
    return {
        "k": k,
        "kind": kind,
        "ranks": spec.ranks,
        "hosts": spec.hosts,
        "stage": spec.zero_stage,
        "injected": injected,
        "growth": growth,
        "findings": findings,
        "seconds": seconds,
    }


def score(results: list[dict[str, Any]]) -> dict[str, Any]:
    tp = fp = fn = 0
    healthy = healthy_bad = 0
    oom_found = oom_total = 0
    misses: list[str] = []
    for r in results:
        found = {
            h: sorted(f["ranks"])
            for f in r["findings"]
            if f["kind"] == "pcie_contention"
            for h in f["hosts"]
        }
        for host, ranks in r["injected"].items():
            if found.get(host) == ranks:
                tp += 1
            else:
                fn += 1
                misses.append(f"job {r['k']}: {host} not found ({found})")
        for host, ranks in found.items():
            if r["injected"].get(host) != ranks:
                fp += 1
                misses.append(f"job {r['k']} ({r['kind']}): false positive on {host}")
        if r["kind"].startswith("healthy"):
            healthy += 1
            bad = [f for f in r["findings"] if f["severity"] in ("warning", "critical")]
            if bad:
                healthy_bad += 1
                misses.append(f"job {r['k']} ({r['kind']}): {[f['kind'] for f in bad]}")
        for rank in r["growth"]:
            oom_total += 1
            if any(f["kind"] == "oom_risk" and rank in f["ranks"] for f in r["findings"]):
                oom_found += 1
    return {
        "jobs": len(results),
        "contention_tp": tp,
        "contention_fp": fp,
        "contention_fn": fn,
        "precision": tp / (tp + fp) if tp + fp else 1.0,
        "recall": tp / (tp + fn) if tp + fn else 1.0,
        "healthy_controls": healthy,
        "healthy_with_warning": healthy_bad,
        "oom_recall": oom_found / oom_total if oom_total else None,
        "oom_injected": oom_total,
        "misses": misses,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--json", type=Path)
    ns = ap.parse_args()
    start = time.perf_counter()
    with ProcessPoolExecutor(ns.workers) as pool:
        results = list(pool.map(run_job, [(k, ns.seed) for k in range(ns.jobs)]))
    s = score(results)
    per_kind: dict[str, int] = {}
    for r in results:
        per_kind[r["kind"]] = per_kind.get(r["kind"], 0) + 1
    print(f"jobs: {s['jobs']} {per_kind}  ({time.perf_counter() - start:.0f} s)")
    print(
        f"pcie_contention: precision {s['precision']:.3f}  recall {s['recall']:.3f}  "
        f"(tp {s['contention_tp']}, fp {s['contention_fp']}, fn {s['contention_fn']}, per host)"
    )
    print(
        "healthy controls with a warning or worse: "
        f"{s['healthy_with_warning']} of {s['healthy_controls']}"
    )
    if s["oom_recall"] is not None:
        print(f"oom_risk recall (growing rank named): {s['oom_recall']:.3f} of {s['oom_injected']}")
    analyse = sorted(r["seconds"] for r in results)
    print(f"analysis per job: median {analyse[len(analyse) // 2]:.2f} s, max {analyse[-1]:.2f} s")
    for m in s["misses"][:20]:
        print("  ", m)
    if ns.json:
        ns.json.write_text(json.dumps({"score": s, "results": results}, indent=1))
    ok = s["precision"] >= 0.9 and s["recall"] >= 0.9 and s["healthy_with_warning"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
