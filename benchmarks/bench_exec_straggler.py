#!/usr/bin/env python3
"""Straggler from NCCL Inspector's execution times alone (issue #18): recall per slowdown
band and false positives on healthy jobs, with no timestamp on any line.

Jobs come from ``ncclscope.synth.inspector`` (the physics of a collective: each rank's
execution time is the last arrival minus its own arrival, plus the transfer time, plus
noise), written as the plugin writes its files and read back as ``analyze`` reads them;
then the ``exec_straggler`` detector's metric and policy run on the records.  Each job
draws its shape at random: 2 to 32 ranks, 2 to 8 a host, 5 to 50 ms of compute between
collectives, compute jitter 1 to 5% (coefficient of variation) with occasional spikes on
random ranks, 5 to 100 GB/s of bus bandwidth, 0 to 30% of records missing, 100 to 300
collectives.

* Stragglers: one rank computes ``1 + slowdown`` times longer; the slowdown is drawn
  uniformly in each band (2.5-5, 5-10, 10-15, 15-25, 25-50%: the issue's range, cut
  without reading the detector's thresholds).  Recall: a straggler finding naming that
  rank.  Wrong: a finding naming any other.
* Healthy: the same shapes, no straggler.  A false positive is any finding.

Then the classes of issue #28, judged by ``exec_straggler.judge`` (every finding the
detector makes), with the slowdown drawn in 10-50% and the same random shapes:

* ``window``: the straggler is slow over a third of the run only, starting anywhere.
  Right: a ``window`` finding naming it.  Wrong: any finding naming another rank or a
  node.
* ``node``: every rank of one host is slow (8 to 32 ranks, 2 to 8 a host, at least two
  hosts).  Right: a ``node`` finding naming that host.  Wrong: any rank finding, or
  another host.
* ``subcomm``: sub-communicators of one host each under the world communicator (both
  recorded); one rank is slow before its sub-communicator's calls only, so the world
  sees its whole host late.  Right: a rank finding naming it on its sub-communicator.
  Wrong: any node finding, or another rank.
* ``healthy+``: healthy jobs of every shape above (sub-communicators or not), with one
  collective at which one rank is 5 to 50 compute times late.  Wrong: any finding.

Usage:
    .venv/bin/python benchmarks/bench_exec_straggler.py                 # 100 jobs a band
    .venv/bin/python benchmarks/bench_exec_straggler.py --jobs 30 --healthy 100
    .venv/bin/python benchmarks/bench_exec_straggler.py --classes-only --variants 200
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

import polars as pl

from ncclscope.detect.exec_straggler import exec_times_metric, flagged, judge
from ncclscope.parsers.tools.inspector import read_inspector_files
from ncclscope.synth.inspector import InspectorJob, inspector_files

BANDS = ((0.025, 0.05), (0.05, 0.10), (0.10, 0.15), (0.15, 0.25), (0.25, 0.50))


def _job(rng: random.Random, seed: int, straggler: bool, band: tuple[float, float]) -> InspectorJob:
    nranks = rng.choice((2, 4, 8, 16, 32))
    per_host = min(nranks, rng.choice((2, 4, 8)))
    return InspectorJob(
        nranks=nranks,
        ranks_per_host=per_host,
        collectives=rng.randint(100, 300),
        straggler=rng.randrange(nranks) if straggler else None,
        slowdown=rng.uniform(*band) if straggler else 0.0,
        compute_s=rng.uniform(0.005, 0.05),
        jitter=rng.uniform(0.01, 0.05),
        spike_rate=rng.uniform(0.0, 0.05),
        bus_bw_bytes_per_s=rng.uniform(5e9, 100e9),
        drop=rng.uniform(0.0, 0.3),
        seed=seed,
    )


def _read(job: InspectorJob, work: Path) -> pl.DataFrame:
    # Written as files and read as ``analyze`` reads them (by the writer's layout).
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    files = []
    for k, (name, text) in enumerate(sorted(inspector_files(job).items())):
        (work / name).write_text(text)
        files.append((k, work / name, name))
    reads = read_inspector_files(files)
    return pl.concat([reads[k].rows for k, _p, _n in files])


def _named(job: InspectorJob, work: Path) -> list[int]:
    rows = _read(job, work)
    return [int(r) for r in flagged(exec_times_metric(rows))["comm_rank"].to_list()]


CLASSES = ("window", "node", "subcomm", "healthy+")


def class_job(rng: random.Random, cls: str) -> InspectorJob:
    """A random job of class ``cls`` (one of ``CLASSES``)."""
    nranks = rng.choice((8, 16, 32))
    per_host = rng.choice((2, 4, 8))
    if nranks // per_host < 2:
        per_host = nranks // 2
    healthy = cls == "healthy+"
    shape = rng.choice(("plain", "sub")) if healthy else cls
    slowdown = 0.0 if healthy else rng.uniform(0.10, 0.50)
    start = rng.uniform(0.0, 2 / 3)
    return InspectorJob(
        nranks=nranks,
        ranks_per_host=per_host,
        collectives=rng.randint(100, 300),
        straggler=rng.randrange(nranks) if cls == "window" else None,
        window=(start, start + 1 / 3) if cls == "window" else None,
        slow_host=rng.randrange(nranks // per_host) if cls == "node" else None,
        sub_size=per_host if shape in ("sub", "subcomm") else 0,
        sub_straggler=rng.randrange(nranks) if cls == "subcomm" else None,
        slowdown=slowdown,
        compute_s=rng.uniform(0.005, 0.05),
        jitter=rng.uniform(0.01, 0.05),
        spike_rate=rng.uniform(0.0, 0.05),
        outlier=rng.uniform(5, 50) if healthy else 0.0,
        bus_bw_bytes_per_s=rng.uniform(5e9, 100e9),
        drop=rng.uniform(0.0, 0.3),
        seed=rng.randrange(1 << 30),
    )


def verdict(job: InspectorJob, cls: str, found: pl.DataFrame) -> str:
    """``right``, ``wrong`` or ``missed`` for ``judge``'s rows on a job of ``cls``."""
    rows = list(found.iter_rows(named=True))
    if cls == "healthy+":
        return "wrong" if rows else "right"
    if cls == "node":
        assert job.slow_host is not None
        host = job.host(job.slow_host * job.ranks_per_host)
        ok = [r for r in rows if r["scope"] == "node" and r["host"] == host]
        scope, rank = "node", None
    elif cls == "window":
        ok = [r for r in rows if r["scope"] == "window" and r["pid"] == job.pid(job.straggler or 0)]
        scope, rank = "window", job.straggler
    else:
        rank = job.sub_straggler
        assert rank is not None
        ok = [
            r for r in rows
            if r["scope"] != "node" and r["comm_hash"] == job.sub_hash(rank)
            and r["pid"] == job.pid(rank)
        ]  # fmt: skip
        scope = "rank"
    bad = [
        r for r in rows
        if (r["scope"] == "node") != (scope == "node")
        or (scope == "node" and r not in ok)
        or (rank is not None and r["pid"] != job.pid(rank))
    ]  # fmt: skip
    if bad:
        return "wrong"
    return "right" if ok else "missed"


def run_classes(rng: random.Random, variants: int, work: Path) -> None:
    print(f"{'class':>9} {'variants':>8} {'right':>6} {'wrong':>6} {'missed':>7}")
    for cls in CLASSES:
        counts = {"right": 0, "wrong": 0, "missed": 0}
        for _k in range(variants):
            job = class_job(rng, cls)
            counts[verdict(job, cls, judge(_read(job, work)))] += 1
        print(f"{cls:>9} {variants:>8} {counts['right']:>6} {counts['wrong']:>6} "
              f"{counts['missed']:>7}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--jobs", type=int, default=100, help="straggler jobs per band")
    ap.add_argument("--healthy", type=int, default=300, help="healthy jobs")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--variants", type=int, default=200, help="jobs per class of #28")
    ap.add_argument("--classes-only", action="store_true", help="only the classes of #28")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="bench-exec-")) / "job"
    started = time.perf_counter()
    if args.classes_only:
        run_classes(random.Random(args.seed + 28), args.variants, work)
        print(f"({time.perf_counter() - started:.0f} s)")
        shutil.rmtree(work.parent, ignore_errors=True)
        return
    print(f"{'slowdown band':>15} {'jobs':>5} {'found':>6} {'recall':>7} {'wrong':>6}")
    at_least_10 = [0, 0]
    for lo, hi in BANDS:
        found = wrong = 0
        for k in range(args.jobs):
            job = _job(rng, rng.randrange(1 << 30) + k, True, (lo, hi))
            named = _named(job, work)
            found += job.straggler in named
            wrong += any(r != job.straggler for r in named)
        if lo >= 0.10:
            at_least_10[0] += found
            at_least_10[1] += args.jobs
        print(f"{f'{lo:.1%}-{hi:.1%}':>15} {args.jobs:>5} {found:>6} "
              f"{found / args.jobs:>7.3f} {wrong:>6}")  # fmt: skip
    fp = 0
    for _k in range(args.healthy):
        job = _job(rng, rng.randrange(1 << 30), False, (0.0, 0.0))
        fp += bool(_named(job, work))
    print(f"recall at >= 10% slowdown: {at_least_10[0]}/{at_least_10[1]} "
          f"= {at_least_10[0] / max(1, at_least_10[1]):.3f}")  # fmt: skip
    print(f"healthy jobs: {args.healthy}, with a finding (false positives): {fp}")
    run_classes(random.Random(args.seed + 28), args.variants, work)
    print(f"({time.perf_counter() - started:.0f} s)")
    shutil.rmtree(work.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
