#!/usr/bin/env python3
"""bench_fabric end to end: the same generated jobs, cases and scoring, but the cluster's
counters go through a real Prometheus, as ``analyze --prometheus`` reads them.

Every job of the run is generated first, each in its own time slot (``SynthSpec``'s
``start_time``, from the synth's default on, a gap after the last job's end: the jobs
share host names, so a slot is what tells them apart), and its ``cluster_tables`` turned
into the exporters' raw series (``write_exporter_openmetrics``: node_exporter's
InfiniBand counters and ``node_uname_info``, dcgm-exporter's fields, the agent's
``ncclscope_node_info``, each on an address:port instance).  One OpenMetrics file is
backfilled into one TSDB (``promtool tsdb create-blocks-from openmetrics``) served by
one Prometheus; then each job runs the CLI's path (``build``, ``read_for_job``,
``with_cluster(..., telemetry=True)``, ``diagnose``) and is scored as bench_fabric
scores it.  Prints right / wrong / missed / net-blamed per case, the requests and
seconds the reads took, and with ``--compare`` the jobs whose outcome differs from
bench_fabric's direct injection of the same tables.

Target (#29): >= 95% right per case, the network never blamed with clean counters,
nothing on healthy jobs.

    .venv/bin/python benchmarks/bench_fabric_e2e.py --jobs 60
    .venv/bin/python benchmarks/bench_fabric_e2e.py --jobs 5 --cases xid --compare --keep /tmp/e2e
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_fabric import CASES, _faults, _job, _ts, score
from tsdb_server import Server

from ncclscope.analysis import build
from ncclscope.cluster.job import read_for_job
from ncclscope.cluster.job import with_cluster as join_cluster
from ncclscope.cluster.prometheus import PromClient
from ncclscope.cluster.tables import ClusterTables
from ncclscope.diagnose import diagnose
from ncclscope.synth import SynthSpec, generate
from ncclscope.synth.cluster import (
    cluster_tables,
    with_cluster,
    write_exporter_openmetrics,
)

#: Between one job's last line and the next one's first: more than the window read (the
#: logs' span +- 5 min), the tables' padding (5 min) and Prometheus' lookback (5 min).
GAP = timedelta(minutes=20)


@dataclass
class Job:
    case: str
    k: int
    spec: SynthSpec
    truth: dict[str, Any]
    folder: Path
    tables: ClusterTables


@dataclass
class Tally:
    """One case's outcomes and what its reads cost."""

    outcomes: Counter[str] = field(default_factory=Counter)
    requests: int = 0
    ask_s: float = 0.0  # inside the requests, as the client timed them
    read_s: list[float] = field(default_factory=list)  # read_for_job's wall time per job
    failed_asks: int = 0
    differs: list[str] = field(default_factory=list)


def _next_start(truth: dict[str, Any]) -> datetime:
    """A whole minute at least ``GAP`` after the job's last line."""
    after = _ts(str(truth["last_ts"])) + GAP
    return after.replace(second=0, microsecond=0) + timedelta(minutes=1)


def generate_jobs(cases: list[str], jobs: int, work: Path) -> list[Job]:
    """bench_fabric's jobs, one after another in time (the first at the synth's default)."""
    start = _ts(SynthSpec().start_time)
    out: list[Job] = []
    for case in cases:
        for k in range(jobs):
            spec, noise, rng = _job(case, k)
            naive = start.astimezone(UTC).replace(tzinfo=None)  # the synth prints it as is
            spec = replace(spec, start_time=naive.isoformat())
            folder = work / f"{case}-{k}"
            truth = generate(spec, folder / "job").to_dict()
            faults = _faults(case, truth, rng)
            tables = cluster_tables(truth, faults, seed=spec.seed, noise=noise)
            out.append(Job(case, k, spec, truth, folder, tables))
            start = _next_start(truth)
    return out


def _outcome(c: Counter[str]) -> str:
    main = next((k for k in ("right", "wrong", "missed") if c[k]), "?")
    return main + ("+net" if c["network_blamed_clean"] else "")


def analyze(job: Job, url: str, tally: Tally, *, compare: bool) -> None:
    """The CLI's path for one job (``analyze JOB --prometheus URL``), scored."""
    built = build([str(job.folder / "job")], workdir=job.folder / "w")
    client = PromClient(url, timeout_s=30)
    t0 = time.monotonic()
    cluster = read_for_job(built.analysis, client)
    tally.read_s.append(time.monotonic() - t0)
    tally.requests += len(client.asks)
    tally.ask_s += sum(a.seconds for a in client.asks)
    tally.failed_asks += sum(a.status not in ("ok", "partial") for a in client.asks)
    dx = diagnose(join_cluster(built, cluster, telemetry=True))
    got = score(job.case, job.truth, dx.findings)
    tally.outcomes += got
    if compare:
        direct = diagnose(with_cluster(built, job.tables))
        want = score(job.case, job.truth, direct.findings)
        if _outcome(got) != _outcome(want):
            tally.differs.append(f"{job.case}-{job.k}: {_outcome(got)} (direct {_outcome(want)})")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=40, help="jobs per case")
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=CASES)
    ap.add_argument(
        "--compare", action="store_true", help="also diagnose as bench_fabric (tables injected)"
    )
    ap.add_argument("--keep", type=Path, help="work here and keep it (jobs, TSDB, log)")
    args = ap.parse_args()
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        print("needs prometheus and promtool (apt-get install prometheus)", file=sys.stderr)
        return 2
    wall = time.monotonic()
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-fabric-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    server: Server | None = None
    try:
        t0 = time.monotonic()
        jobs = generate_jobs(args.cases, args.jobs, work)
        gen_s = time.monotonic() - t0
        t0 = time.monotonic()
        om = work / "cluster.om"
        samples = write_exporter_openmetrics([j.tables for j in jobs], om)
        size = om.stat().st_size
        om_s = time.monotonic() - t0
        t0 = time.monotonic()
        tsdb = work / "tsdb"
        shutil.rmtree(tsdb, ignore_errors=True)
        subprocess.run([str(shutil.which("promtool")), "tsdb", "create-blocks-from",
                        "openmetrics", "-q", str(om), str(tsdb)], check=True)  # fmt: skip
        om.unlink()
        fill_s = time.monotonic() - t0
        t0 = time.monotonic()
        server = Server(tsdb, work)
        if not server.ready():
            print(server.log_path.read_text(errors="replace")[-3000:], file=sys.stderr)
            return 1
        up_s = time.monotonic() - t0
        print(f"{len(jobs)} jobs generated in {gen_s:.1f} s; OpenMetrics {samples:,} samples, "
              f"{size / 2**20:.0f} MiB in {om_s:.1f} s; backfill {fill_s:.1f} s; "
              f"Prometheus ready in {up_s:.1f} s")  # fmt: skip
        tallies: dict[str, Tally] = {c: Tally() for c in args.cases}
        t0 = time.monotonic()
        for job in jobs:
            analyze(job, server.url, tallies[job.case], compare=args.compare)
        run_s = time.monotonic() - t0
        print(f"\n{'case':<12} {'jobs':>5} {'right':>6} {'wrong':>6} {'missed':>7} "
              f"{'net-blamed':>11} {'%right':>7} {'req/job':>8} {'read s/job':>11} "
              f"{'max s':>6}")  # fmt: skip
        for case, t in tallies.items():
            c, n = t.outcomes, args.jobs
            share = c["right"] / n if n else 0.0
            mean = sum(t.read_s) / len(t.read_s) if t.read_s else 0.0
            print(f"{case:<12} {n:>5} {c['right']:>6} {c['wrong']:>6} {c['missed']:>7} "
                  f"{c['network_blamed_clean']:>11} {share:>7.0%} {t.requests / max(n, 1):>8.1f} "
                  f"{mean:>11.3f} {max(t.read_s, default=0.0):>6.2f}")  # fmt: skip
        requests = sum(t.requests for t in tallies.values())
        ask_s = sum(t.ask_s for t in tallies.values())
        read_s = sum(sum(t.read_s) for t in tallies.values())
        failed = sum(t.failed_asks for t in tallies.values())
        print(f"\nreads: {requests} requests ({failed} not ok), {ask_s:.1f} s in requests, "
              f"{read_s:.1f} s in read_for_job; analysis of all jobs {run_s:.1f} s; "
              f"wall {time.monotonic() - wall:.1f} s")  # fmt: skip
        if args.compare:
            differs = [d for t in tallies.values() for d in t.differs]
            print(f"differs from direct injection: {len(differs)}")
            for d in differs:
                print(f"  {d}")
    finally:
        if server is not None:
            server.close()
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
