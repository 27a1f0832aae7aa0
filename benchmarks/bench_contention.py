#!/usr/bin/env python3
"""PCIe offload contention and OOM risk accuracy against synthetic jobs with telemetry.

Writes ``--jobs`` DeepSpeed jobs with ``ncclscope synth --telemetry`` (its truth is what it
injected, never what ncclscope parses), 8 to 32 ranks on 1 to 4 hosts (8 or 4 GPUs a
host), ZeRO stage 2 or 3, NCCL 2.27, 2.26.5 or 2.26.2 with timestamps, hosts' clocks off by
up to 2 ms, some one-off delays; PCIe topology 1, 2 or 4 GPUs per switch (Gen4 x16
uplinks); half the jobs with the telemetry's hosts named ``node-N.cluster.internal``, half
with 135 MB of idle swap on every host:

* ``contention``: optimizer offload, one or two hosts' own GPU links saturated during the
  optimizer step (85-97% of the link) from a random step on, inflated 1.4-3.5x;
* ``uplink_contention``: the GPUs behind one switch of one host share its uplink, which
  delivers ~25 GB/s (Gen4 x16's payload ceiling, +-4%) split among them (their own links
  read 1/k of it: ~40% or ~20%), inflated 1.4-3.5x;
* ``mild``: uplink or own-link contention inflating the optimizer step 1.13-1.20x only;
* ``healthy_offload``: optimizer (or optimizer and parameter) offload, nothing injected;
* ``healthy``: no offload, nothing injected;
* ``memory_growth``: optimizer offload, one rank's GPU memory grows 2-4 GiB a step.

Half the contended hosts also run low on memory and swap (the rest keep 55-70% free).
Bands sit away from the detector's bars (saturation at 0.72 of the raw link, warning from
1.25x, mild from 1.07x): own links at 0.85-0.97, shared uplinks at 0.76-0.83, inflation
1.4-3.5x or 1.13-1.20x.

Scores, per host: a ``pcie_contention`` finding on an injected host that names exactly
its contended ranks (and, for ``uplink_contention``, the injected uplink; for ``mild``,
severity ``info``, else ``warning`` or worse) is right; one on any other host is a false
claim; an injected host without a right one is missed.  Healthy controls (``healthy*``)
must have no finding of severity warning or above.  Idle swap: every contended job with
idle swap is analysed again without it; the severity must not change.  ``oom_risk``
recall: the growing rank named.

Usage:
    .venv/bin/python benchmarks/bench_contention.py                 # 80 jobs, 2 workers
    .venv/bin/python benchmarks/bench_contention.py --jobs 20 --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
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

KINDS = {
    "contention": 3,
    "uplink_contention": 4,
    "mild": 2,
    "healthy_offload": 3,
    "healthy": 1,
    "memory_growth": 1,
}
LAYOUTS = [(8, 1), (16, 2), (8, 2), (32, 4), (24, 3)]
ERAS = {"2.27": 2, "2.26.5": 1, "2.26": 1}
CONTENDED = ("contention", "uplink_contention", "mild")


def make_spec(k: int, seed: int) -> tuple[str, synth.SynthSpec]:
    rnd = random.Random(seed * 1009 + k)
    kind = rnd.choices(list(KINDS), weights=list(KINDS.values()))[0]
    ranks, hosts = rnd.choice(LAYOUTS)
    per_host = ranks // hosts
    stage = rnd.choice((2, 3))
    names = [f"node-{h}" for h in range(hosts)]
    offload = "none" if kind == "healthy" else "optimizer"
    if kind == "healthy_offload" and stage == 3 and rnd.random() < 0.5:
        offload = "both"
    steps = rnd.randint(9, 14)
    per_switch = rnd.choice([k for k in (1, 2, 4) if per_host % k == 0])
    uplink = kind == "uplink_contention" or (kind == "mild" and rnd.random() < 0.5)
    if uplink and per_switch == 1:
        per_switch = rnd.choice((2, 4))
    contended: tuple[str, ...] = ()
    if kind == "contention":
        contended = tuple(sorted(rnd.sample(names, 1 if hosts < 4 else rnd.choice((1, 2)))))
    elif kind in ("uplink_contention", "mild"):
        contended = (rnd.choice(names),)
    inflation = rnd.uniform(1.13, 1.20) if kind == "mild" else rnd.uniform(1.4, 3.5)
    spec = synth.SynthSpec(
        ranks=ranks,
        hosts=hosts,
        steps=steps,
        layers=rnd.choice((2, 4, 6)),
        era=rnd.choices(list(ERAS), weights=list(ERAS.values()))[0],  # type: ignore[arg-type]
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
        contention_from_step=rnd.randint(0, steps // 3),
        contention_inflation=inflation,
        memory_growth=(rnd.randrange(ranks),) if kind == "memory_growth" else (),
        memory_growth_bytes_per_step=rnd.randint(2, 4) << 30,
        gpus_per_switch=per_switch,
        contention_switch=rnd.randrange(per_host // per_switch) if uplink else None,
        contention_memory_pressure=rnd.random() < 0.5,
        idle_swap_bytes=(135 << 20) if rnd.random() < 0.5 else 0,
        telemetry_domain="cluster.internal" if rnd.random() < 0.5 else "",
    )
    return kind, spec


def _analyse(spec: synth.SynthSpec, tmp: Path) -> tuple[Any, list[dict[str, Any]], float]:
    from ncclscope.agent.telemetry import read_telemetry
    from ncclscope.analysis import run_analysis

    truth = synth.generate(spec, tmp / "job")
    t0 = time.perf_counter()
    tel = read_telemetry([tmp / "job" / "telemetry"])
    analysis = run_analysis([str(tmp / "job" / "job.log")], workdir=tmp / "work", telemetry=tel)
    seconds = time.perf_counter() - t0
    findings = [
        {
            "kind": f.kind,
            "severity": f.severity,
            "hosts": f.hosts,
            "ranks": f.ranks,
            "message": f.message,
            "links": [x["link"] for x in (f.evidence or {}).get("shared_links", [])],
            "saturated_link": (f.evidence or {}).get("saturated_link"),
            "inflation": (f.evidence or {}).get("inflation"),
        }
        for f in analysis.findings
    ]
    return truth, findings, seconds


def run_job(args: tuple[int, int]) -> dict[str, Any]:
    k, seed = args
    kind, spec = make_spec(k, seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench-contention-"))
    try:
        truth, findings, seconds = _analyse(spec, tmp)
        paired = None
        if kind in CONTENDED and spec.idle_swap_bytes:
            shutil.rmtree(tmp, ignore_errors=True)
            _t, without, _s = _analyse(dataclasses.replace(spec, idle_swap_bytes=0), tmp)
            paired = [f["severity"] for f in without if f["kind"] == "pcie_contention"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tele = truth.telemetry or {}
    injected = {c["host"]: c for c in tele.get("contention", [])}
    growth = [g["rank"] for g in tele.get("memory_growth", [])]
    return {
        "k": k,
        "kind": kind,
        "era": spec.era,
        "ranks": spec.ranks,
        "hosts": spec.hosts,
        "stage": spec.zero_stage,
        "gpus_per_switch": spec.gpus_per_switch,
        "domain": bool(spec.telemetry_domain),
        "idle_swap": bool(spec.idle_swap_bytes),
        "inflation": spec.contention_inflation,
        "injected": injected,
        "growth": growth,
        "findings": findings,
        "severity_without_idle_swap": paired,
        "seconds": seconds,
    }


def _right(kind: str, want: dict[str, Any], f: dict[str, Any]) -> bool:
    if sorted(f["ranks"]) != sorted(want["ranks"]):
        return False
    if want.get("link") == "uplink" and (
        f["saturated_link"] != "uplink" or want["uplink"] not in f["links"]
    ):
        return False
    if kind == "mild":
        return bool(f["severity"] == "info")
    return bool(f["severity"] in ("warning", "critical"))


def score(results: list[dict[str, Any]]) -> dict[str, Any]:
    per_kind: dict[str, dict[str, int]] = {}
    false_claims = 0
    healthy = healthy_bad = 0
    pairs = pair_changed = 0
    oom_found = oom_total = 0
    misses: list[str] = []
    for r in results:
        row = per_kind.setdefault(r["kind"], {"jobs": 0, "hosts": 0, "right": 0, "false": 0})
        row["jobs"] += 1
        found: dict[str, list[dict[str, Any]]] = {}
        for f in r["findings"]:
            if f["kind"] == "pcie_contention":
                for h in f["hosts"]:
                    found.setdefault(h, []).append(f)
        for host, want in r["injected"].items():
            row["hosts"] += 1
            if any(_right(r["kind"], want, f) for f in found.get(host, [])):
                row["right"] += 1
            else:
                got = [
                    (f["severity"], f["ranks"], f["links"], f["inflation"])
                    for f in found.get(host, [])
                ]
                misses.append(
                    f"job {r['k']} ({r['kind']}, era {r['era']}, k={r['gpus_per_switch']}, "
                    f"x{r['inflation']:.2f}): {host} {want['ranks']} not named right: {got}"
                )
        for host in found:
            if host not in r["injected"]:
                row["false"] += 1
                false_claims += 1
                misses.append(f"job {r['k']} ({r['kind']}): false claim on {host}")
        if r["kind"].startswith("healthy"):
            healthy += 1
            bad = [f for f in r["findings"] if f["severity"] in ("warning", "critical")]
            if bad:
                healthy_bad += 1
                misses.append(f"job {r['k']} ({r['kind']}): {[f['kind'] for f in bad]}")
        if r["severity_without_idle_swap"] is not None:
            pairs += 1
            with_swap = [f["severity"] for f in r["findings"] if f["kind"] == "pcie_contention"]
            if with_swap != r["severity_without_idle_swap"]:
                pair_changed += 1
                misses.append(
                    f"job {r['k']}: idle swap changed severity {r['severity_without_idle_swap']}"
                    f" -> {with_swap}"
                )
        for rank in r["growth"]:
            oom_total += 1
            if any(f["kind"] == "oom_risk" and rank in f["ranks"] for f in r["findings"]):
                oom_found += 1
    hosts = sum(v["hosts"] for k, v in per_kind.items() if k in CONTENDED)
    right = sum(v["right"] for k, v in per_kind.items() if k in CONTENDED)
    return {
        "jobs": len(results),
        "per_kind": per_kind,
        "contended_hosts": hosts,
        "named_right": right,
        "named_right_share": right / hosts if hosts else 1.0,
        "false_claims": false_claims,
        "healthy_controls": healthy,
        "healthy_with_warning": healthy_bad,
        "idle_swap_pairs": pairs,
        "idle_swap_changed_severity": pair_changed,
        "oom_recall": oom_found / oom_total if oom_total else None,
        "oom_injected": oom_total,
        "misses": misses,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=80)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ns = ap.parse_args()
    start = time.perf_counter()
    with ProcessPoolExecutor(ns.workers) as pool:
        results = list(pool.map(run_job, [(k, ns.seed) for k in range(ns.jobs)]))
    s = score(results)
    print(f"jobs: {s['jobs']}  ({time.perf_counter() - start:.0f} s)")
    print("| kind | jobs | contended hosts | named right | false claims |")
    print("|---|---|---|---|---|")
    for kind in KINDS:
        v = s["per_kind"].get(kind)
        if v:
            right = f"{v['right']}/{v['hosts']}" if v["hosts"] else "-"
            print(f"| {kind} | {v['jobs']} | {v['hosts']} | {right} | {v['false']} |")
    by: dict[str, list[int]] = {}
    for r in results:
        for key in (f"era {r['era']}", f"{r['gpus_per_switch']} GPU/switch",
                    "full host names" if r["domain"] else "short host names"):  # fmt: skip
            if r["kind"] in CONTENDED:
                hit = by.setdefault(key, [0, 0])
                hit[1] += len(r["injected"])
                hit[0] += len(r["injected"]) - sum(
                    1 for m in s["misses"] if m.startswith(f"job {r['k']} (") and "not named" in m
                )
    print("contended hosts named right, by slice: " + ", ".join(
        f"{k} {v[0]}/{v[1]}" for k, v in sorted(by.items())))  # fmt: skip
    print(
        f"named right: {s['named_right']}/{s['contended_hosts']} "
        f"({s['named_right_share']:.3f}); false claims: {s['false_claims']}"
    )
    print(
        "healthy controls with a warning or worse: "
        f"{s['healthy_with_warning']} of {s['healthy_controls']}"
    )
    print(
        f"idle swap: severity changed in {s['idle_swap_changed_severity']} of "
        f"{s['idle_swap_pairs']} paired jobs"
    )
    if s["oom_recall"] is not None:
        print(f"oom_risk recall (growing rank named): {s['oom_recall']:.3f} of {s['oom_injected']}")
    analyse = sorted(r["seconds"] for r in results)
    print(f"analysis per job: median {analyse[len(analyse) // 2]:.2f} s, max {analyse[-1]:.2f} s")
    for m in s["misses"][:30]:
        print("  ", m)
    if ns.json:
        ns.json.write_text(json.dumps({"score": s, "results": results}, indent=1, default=str))
    ok = (
        s["named_right_share"] >= 0.95
        and s["false_claims"] == 0
        and s["healthy_with_warning"] == 0
        and s["idle_swap_changed_severity"] == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
