#!/usr/bin/env python3
"""Detector accuracy against synthetic jobs with known faults.

Writes ``--jobs`` jobs with ``ncclscope synth`` (which imports no parser: its truth is
what it injected), 8 to 1,024 ranks, every format era, with and without timestamps, one
combined file or one file per rank, each with one kind of fault or none (healthy
controls), analyses each in process, and scores the findings against the truth:

* straggler: per rank; a slow rank whose slowdown (its lateness / the median gap between
  collectives) is at least 10% must be found, where timing exists (sub-second NCCL
  timestamps that can be trusted: 2.27; 2.26 prints wrong sub-second digits); slow
  ranks between 5% and 10% are neither required nor counted as false positives; any
  other rank named is a false positive;
* hang culprit: the hang (or mismatch) finding names exactly the culprit rank(s) and the
  collective's op and sequence. Half of the hang jobs carry PyTorch's watchdog lines (stop
  evidence); the others are NCCL lines that simply end at the fault, which is also what a
  log copied from a running job looks like: there the hang is only a hypothesis, so an
  ``info`` finding whose ``evidence.waited_for`` is the culprit counts as pointed, and a
  warning or worse naming anyone else counts as wrong;
* every other fault kind: a finding of the expected kind that names the culprit;
* healthy controls: no finding of severity warning or above.

Usage:
    .venv/bin/python benchmarks/bench_detect.py                # 240 jobs, 2 workers
    .venv/bin/python benchmarks/bench_detect.py --jobs 40 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ncclscope import synth  # noqa: E402

#: Fault kinds drawn per job, with weights; those the generator does not know are skipped.
KINDS = {
    "healthy": 3,
    "slow": 5,
    "missing_rank": 2,
    "mismatch_op": 1,
    "mismatch_dtype": 1,
    "mismatch_count": 1,
    "ib_error": 1,
    "extra_collective": 1,
    "dead_process": 1,
}
RANKS = [8, 8, 16, 16, 32, 32, 64, 64, 128, 256, 1024]
#: Slowdown from which a straggler must be found, and below which it may be missed.
REQUIRED_SLOWDOWN = 0.10
MIN_SLOWDOWN = 0.05


@dataclass
class Job:
    """One generated job: its spec's knobs and what was injected."""

    index: int
    kind: str
    ranks: int
    hosts: int
    era: str
    timestamps: bool
    layout: str
    launcher: str
    layers: int
    steps: int
    seed: int
    #: rank -> lateness (s) of each slow rank
    slow: dict[int, float] = field(default_factory=dict)
    culprit: int | None = None
    at_instance: int | None = None
    field_: str | None = None
    host: str | None = None
    clock_offsets: bool = False
    jitter: int = 0
    #: the job's framework prints PyTorch's watchdog lines (stop evidence for a hang)
    watchdog: bool = False


def _draw(index: int, rnd: random.Random) -> Job:
    kinds = [k for k in KINDS if _supported(k)]
    kind = rnd.choices(kinds, weights=[KINDS[k] for k in kinds])[0]
    ranks = rnd.choice(RANKS)
    hosts = 1 if ranks == 8 else ranks // 8
    era = rnd.choice(list(synth.ERAS))
    timing_eras = [e for e in synth.ERAS if _version(e) >= (2, 26)]
    if kind == "slow" and rnd.random() < 0.8:
        era = rnd.choice(timing_eras)  # most straggler jobs carry timing
    timestamps = era in timing_eras and rnd.random() < (0.9 if kind == "slow" else 0.5)
    layout = rnd.choice(["combined", "per-rank"])
    launcher = "none" if layout == "per-rank" else rnd.choice(["none", "torchrun", "srun"])
    layers = rnd.choice([2, 3, 4])
    steps = 3 if ranks >= 256 else rnd.choice([4, 6, 8])
    job = Job(index, kind, ranks, hosts, era, timestamps, layout, launcher, layers, steps, index)
    calls = steps * (3 * layers + 1)
    if kind == "slow":
        gap = 0.5 / (3 * layers + 1)
        for r in rnd.sample(range(ranks), rnd.choice([1, 1, 2, 3])):
            job.slow[r] = round(gap * rnd.uniform(MIN_SLOWDOWN, 0.5), 6)
    elif kind != "healthy":
        job.culprit = rnd.randrange(ranks)
        job.at_instance = rnd.randrange(calls // 3, calls - 1)
        job.field_ = kind.removeprefix("mismatch_") if kind.startswith("mismatch") else None
        job.host = f"node-{rnd.randrange(hosts)}" if hosts > 1 else None
        if kind == "ib_error" and hosts == 1:
            job.kind = kind = "missing_rank"  # an IB error needs two hosts
    if _has_field("clock_offset_max_s"):
        job.clock_offsets = rnd.random() < 0.7
    if _has_field("jitter_events"):
        job.jitter = rnd.choice([0, 0, 3, 10])
    job.watchdog = kind in _WATCHDOG_KINDS and rnd.random() < 0.5
    return job


#: Hang kinds drawn with and without the watchdog's lines.
_WATCHDOG_KINDS = {
    "missing_rank",
    "extra_collective",
    "mismatch_op",
    "mismatch_dtype",
    "mismatch_count",
}


def _version(era: str) -> tuple[int, ...]:
    return tuple(int(x) for x in era.split("."))


def _has_field(name: str) -> bool:
    return name in {f.name for f in fields(synth.SynthSpec)}


def _supported(kind: str) -> bool:
    needs = {"extra_collective": "ExtraCollective", "dead_process": "DeadProcess"}
    return kind not in needs or hasattr(synth, needs[kind])


def _spec(job: Job) -> synth.SynthSpec:
    faults: list[Any] = [synth.SlowRank(rank=r, lateness_s=s) for r, s in job.slow.items()]
    c, at = job.culprit, job.at_instance
    if job.kind == "missing_rank":
        faults.append(synth.StopRank(rank=c, at_instance=at))
    elif job.kind.startswith("mismatch"):
        faults.append(synth.Mismatch(rank=c, at_instance=at, field=job.field_))
    elif job.kind == "ib_error":
        faults.append(synth.IbError(host=job.host, at_instance=at))
    elif job.kind == "extra_collective":
        faults.append(synth.ExtraCollective(rank=c, at_instance=at))  # type: ignore[attr-defined]
    elif job.kind == "dead_process":
        faults.append(synth.DeadProcess(rank=c, at_instance=at))  # type: ignore[attr-defined]
    extra: dict[str, Any] = {"truth_format": 2}
    if job.clock_offsets:
        extra["clock_offset_max_s"] = 0.001
    if job.jitter:
        extra["jitter_events"] = job.jitter
    if job.kind == "dead_process" or job.watchdog:
        extra["framework"] = "torch"
    return synth.SynthSpec(
        ranks=job.ranks,
        hosts=job.hosts,
        steps=job.steps,
        layers=job.layers,
        era=job.era,
        timestamps=job.timestamps,
        layout=job.layout,
        launcher=job.launcher,
        seed=job.seed,
        faults=tuple(faults),
        **extra,
    )


def _op_at(job: Job, seq: int) -> str:
    """The world collective at ``seq`` in synth's ZeRO-3 step program: an AllGather per
    layer forward, an AllGather and a ReduceScatter per layer backward, the AllReduce."""
    program = ["AllGather"] * job.layers + ["AllGather", "ReduceScatter"] * job.layers
    program.append("AllReduce")
    return program[seq % len(program)]


def _run(job: Job) -> dict[str, Any]:
    from ncclscope.analysis import run_analysis

    work = Path(tempfile.mkdtemp(prefix=f"bench-detect-{job.index}-"))
    try:
        start = time.perf_counter()
        truth = synth.generate(_spec(job), work / "job")
        generated = time.perf_counter() - start
        start = time.perf_counter()
        a = run_analysis([str(work / "job")], workdir=work / "analysis")
        analysed = time.perf_counter() - start
        truth_doc = json.loads((work / "job" / "truth.json").read_text())
        del truth
        return {
            "job": asdict(job),
            "seconds": {"generate": generated, "analyze": analysed},
            "bytes": sum(p.stat().st_size for p in (work / "job").glob("*.log")),
            "timing": a.analysis.timestamps == "full" and not job.era.startswith("2.26"),
            "slowdowns": {
                str(f["details"]["rank"]): f["details"]["slowdown"]
                for f in truth_doc["faults"]
                if f["kind"] == "SlowRank" and "slowdown" in f.get("details", {})
            },
            "clock_offset_max_s": max(
                (abs(o["offset_s"]) for o in truth_doc.get("clock_offsets", [])), default=0.0
            ),
            "noise": len(truth_doc.get("noise", [])),
            "findings": [
                {
                    "kind": f.kind,
                    "severity": f.severity,
                    "ranks": f.ranks,
                    "op": f.op,
                    "seq": f.seq,
                    "hang_class": f.hang_class,
                    "slowdown": f.evidence.get("slowdown"),
                    "waited_for": f.evidence.get("waited_for"),
                }
                for f in a.findings
            ],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _slowdown(result: dict[str, Any], rank: int, lateness: float) -> float:
    """The truth's slowdown of a slow rank where recorded, else lateness over the gap
    the generator's time model gives (step time / calls per step + the largest
    lateness)."""
    recorded = result["slowdowns"].get(str(rank))
    if recorded is not None:
        return float(recorded)
    job = result["job"]
    gap = 0.5 / (3 * job["layers"] + 1) + max(job["slow"].values())
    return lateness / gap


_EXPECTED_KIND = {
    "missing_rank": "hang",
    "dead_process": "hang",
    "extra_collective": "mismatch",
    "mismatch_op": "mismatch",
    "mismatch_dtype": "mismatch",
    "mismatch_count": "mismatch",
    "ib_error": "nccl_error",
}


def score(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Precision and recall per fault kind, straggler ranks, and healthy controls."""
    per_kind: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    strag = defaultdict(int)
    strag_by_bin: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    hang_jobs = hang_right = 0
    for r in results:
        job = r["job"]
        kind = job["kind"]
        serious = [f for f in r["findings"] if f["severity"] in ("warning", "critical")]
        # Straggler ranks.
        named = {x for f in serious if f["kind"] == "straggler" for x in f["ranks"]}
        required, tolerated = set(), set()
        if kind == "slow" and r["timing"]:
            for rank_s, late in job["slow"].items():
                rank = int(rank_s)
                s = _slowdown(r, rank, late)
                (required if s >= REQUIRED_SLOWDOWN else tolerated).add(rank)
                b = "10-20%" if s < 0.2 else "20-35%" if s < 0.35 else "35%+"
                if s >= REQUIRED_SLOWDOWN:
                    strag_by_bin[b][0] += 1
                    strag_by_bin[b][1] += rank in named
        elif kind == "slow":
            tolerated = {int(x) for x in job["slow"]}  # no timing: nothing is required
        strag["tp"] += len(named & required)
        strag["fn"] += len(required - named)
        strag["fp"] += len(named - required - tolerated)
        # Fault kinds.
        expected = truth_kind = _EXPECTED_KIND.get(kind)
        if expected is not None and kind in _WATCHDOG_KINDS and not job.get("watchdog"):
            # The log simply ends at the fault: no stop evidence, a hypothesis at most.
            bucket = per_kind[f"{kind} (log ends, no watchdog)"]
            bucket["jobs"] += 1
            bucket["pointed"] += any(
                f["ranks"] == [job["culprit"]] or (f.get("waited_for") or []) == [job["culprit"]]
                for f in r["findings"]
                if f["kind"] in ("hang", "mismatch")
            )
            bucket["wrong"] += any(
                f["kind"] in ("hang", "mismatch") and f["ranks"] and f["ranks"] != [job["culprit"]]
                for f in serious
            )
            expected = None
        if expected is not None:
            per_kind[kind]["jobs"] += 1
            hit = [
                f
                for f in serious
                if f["kind"] in (expected, "hang", "mismatch") and f["ranks"] == [job["culprit"]]
            ]
            if kind == "ib_error":
                hit = [
                    f for f in serious if f["kind"] == "nccl_error" and f["severity"] == "critical"
                ]
            if kind == "dead_process":
                hit = [f for f in hit if f["hang_class"] == "dead_process"]
            per_kind[kind]["found"] += bool(hit)
            if kind != "ib_error":
                hang_jobs += 1
                right = [
                    f
                    for f in hit
                    if f["seq"] == job["at_instance"]
                    and (
                        f["op"] == _op_at(_job(job), job["at_instance"]) or f["kind"] == "mismatch"
                    )
                ]
                hang_right += bool(right)
        for f in serious:
            if f["kind"] in ("hang", "mismatch", "nccl_error") and f["severity"] == "critical":
                per_kind[f"finding:{f['kind']}"]["made"] += 1
                ok = truth_kind in (f["kind"], "hang", "mismatch") and (
                    f["ranks"] == [job["culprit"]] or kind == "ib_error"
                )
                per_kind[f"finding:{f['kind']}"]["right"] += ok
        if kind == "healthy":
            per_kind["healthy"]["jobs"] += 1
            per_kind["healthy"]["clean"] += not serious
    precision = strag["tp"] / max(1, strag["tp"] + strag["fp"])
    recall = strag["tp"] / max(1, strag["tp"] + strag["fn"])
    return {
        "straggler": {**strag, "precision": round(precision, 4), "recall": round(recall, 4)},
        "straggler_recall_by_slowdown": {
            k: f"{v[1]}/{v[0]}" for k, v in sorted(strag_by_bin.items())
        },
        "hang_culprit_and_op_right": f"{hang_right}/{hang_jobs}",
        "per_kind": {k: dict(v) for k, v in sorted(per_kind.items())},
    }


def _job(d: dict[str, Any]) -> Job:
    return Job(**d)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=240)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--json", type=Path, help="also write every job's result here")
    args = parser.parse_args(argv)
    rnd = random.Random(args.seed)
    jobs = [_draw(k, rnd) for k in range(args.jobs)]
    start = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        results = []
        for k, result in enumerate(pool.map(_run, jobs)):
            results.append(result)
            if (k + 1) % 20 == 0:
                print(
                    f"{k + 1}/{len(jobs)} jobs ({time.perf_counter() - start:.0f} s)",
                    file=sys.stderr,
                )
    summary = score(results)
    kinds = defaultdict(int)
    for j in jobs:
        kinds[j.kind] += 1
    ranks = sorted({j.ranks for j in jobs})
    print(
        f"{len(jobs)} jobs ({dict(sorted(kinds.items()))}), ranks {ranks[0]}-{ranks[-1]}, "
        f"eras {sorted({j.era for j in jobs})}, {sum(j.timestamps for j in jobs)} with timestamps, "
        f"{sum(j.layout == 'per-rank' for j in jobs)} per-rank; "
        f"median analyze {statistics.median(r['seconds']['analyze'] for r in results):.2f} s"
    )
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
