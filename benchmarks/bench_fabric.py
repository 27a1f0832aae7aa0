"""Causes named from the cluster's counters (#29): many generated jobs per case.

Cases (jobs from ``ncclscope.synth``, cluster rows from ``ncclscope.synth.cluster``):

* ``port_errors``: a slow node whose IB port shows symbol errors and link recoveries in
  its slow window -> ``fabric`` on that host;
* ``throttle``: a slow node with clean ports and a GPU throttled (thermal / HW slowdown)
  in the window -> ``gpu_throttle`` on that host;
* ``xid``: a rank stops (a hang) and its GPU raises XID 79, 48, 94 or 95 -> ``gpu``
  with that rank;
* ``slow_clean``: a slow node with clean counters -> no cause (never the network);
* ``healthy``: no fault -> no finding from the cluster at all.

Each job draws its size (3-6 hosts, 4 ranks each), seed and background noise
(0.5-4x a typical cluster's).  Prints right / wrong / missed per case and how often
the network was blamed with clean counters.  Target (#29): >= 95% right, the network
never blamed with clean counters, nothing on healthy jobs.

    .venv/bin/python benchmarks/bench_fabric.py --jobs 40
"""

from __future__ import annotations

import argparse
import random
import tempfile
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ncclscope.analysis import build
from ncclscope.diagnose import diagnose
from ncclscope.findings import Finding
from ncclscope.synth import SlowHost, StopRank, SynthSpec, generate
from ncclscope.synth.cluster import (
    ClusterFault,
    GpuThrottle,
    GpuXid,
    PortErrors,
    cluster_tables,
    with_cluster,
)

CASES = ("port_errors", "throttle", "xid", "slow_clean", "healthy")
_NETWORK = ("fabric", "fabric_congestion")


def _ts(text: str) -> datetime:
    ts = datetime.fromisoformat(text)
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


def _job(case: str, k: int) -> tuple[SynthSpec, float, random.Random]:
    rng = random.Random(f"{case}-{k}")
    hosts = rng.choice([3, 4, 5, 6])
    noise = rng.choice([0.5, 1.0, 2.0, 4.0])
    common: dict[str, Any] = {
        "ranks": 4 * hosts,
        "hosts": hosts,
        "timestamps": True,
        "seed": rng.randrange(1 << 20),
    }
    if case == "xid":
        rank = rng.randrange(4 * hosts)
        spec = SynthSpec(steps=6, faults=(StopRank(rank=rank, at_instance=30),), **common)
    elif case == "healthy":
        spec = SynthSpec(steps=20, step_time_s=3.0, **common)
    else:
        slow = f"node-{rng.randrange(hosts)}"
        fault = SlowHost(slow, slowdown=rng.uniform(0.3, 0.8), from_instance=80, to_instance=200)
        spec = SynthSpec(steps=20, step_time_s=3.0, faults=(fault,), **common)
    return spec, noise, rng


def _faults(case: str, truth: dict[str, Any], rng: random.Random) -> list[ClusterFault]:
    if case == "xid":
        stop = next(f for f in truth["faults"] if f["kind"] == "StopRank")["fault"]
        r = next(r for r in truth["ranks"] if r["rank"] == stop["rank"])
        at = _ts(str(truth["last_ts"])) - timedelta(seconds=rng.uniform(0, 2))
        code = rng.choice([79, 48, 94, 95])
        return [GpuXid(str(r["host"]), int(r["nvml_dev"]), at, code=code)]
    if case in ("port_errors", "throttle"):
        d = next(f for f in truth["faults"] if f["kind"] == "SlowHost")["details"]
        host, a, b = str(d["host"]), _ts(str(d["start"])), _ts(str(d["end"]))
        if case == "port_errors":
            return [
                PortErrors(
                    host, a, b, symbol_errors=rng.randint(30, 2000), recoveries=rng.randint(1, 6)
                )
            ]
        bits = rng.choice([0x40, 0x8, 0x20 | 0x8, 0x80])
        return [GpuThrottle(host, rng.randrange(4), a, b, bits=bits)]
    return []


def score(case: str, truth: dict[str, Any], findings: list[Finding]) -> Counter[str]:
    """One job's outcome: ``right``, ``wrong`` or ``missed``, and ``network_blamed_clean``
    where the network was named with clean counters."""
    out: Counter[str] = Counter()
    causes = [f for f in findings if f.kind == "cluster_cause"]
    named = {(f.evidence["cause"], tuple(f.hosts), tuple(f.ranks)) for f in causes}
    if case not in ("port_errors",) and any(c in _NETWORK for c, _h, _r in named):
        out["network_blamed_clean"] += 1
    if case in ("slow_clean", "healthy"):
        out["right" if not causes else "wrong"] += 1
        return out
    if case == "xid":
        stop = next(f for f in truth["faults"] if f["kind"] == "StopRank")["fault"]
        want: set[tuple[str, int | str]] = {("gpu", int(stop["rank"]))}
        got: set[tuple[str, int | str]] = {(c, r) for c, _h, rs in named for r in rs}
    else:
        host = next(f for f in truth["faults"] if f["kind"] == "SlowHost")["details"]["host"]
        want = {("fabric" if case == "port_errors" else "gpu_throttle", str(host))}
        got = {(c, h) for c, hs, _r in named for h in hs}
    if not causes:
        out["missed"] += 1
    elif want <= got and len(causes) == 1:
        out["right"] += 1
    else:
        out["wrong"] += 1
    return out


def run_case(case: str, jobs: int, work: Path) -> Counter[str]:
    out: Counter[str] = Counter()
    for k in range(jobs):
        spec, noise, rng = _job(case, k)
        d = work / f"{case}-{k}"
        truth = generate(spec, d / "job").to_dict()
        faults = _faults(case, truth, rng)
        tables = cluster_tables(truth, faults, seed=spec.seed, noise=noise)
        dx = diagnose(with_cluster(build([str(d / "job")], workdir=d / "w"), tables))
        out += score(case, truth, dx.findings)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=40, help="jobs per case")
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=CASES)
    args = ap.parse_args()
    print(f"{'case':<12} {'jobs':>5} {'right':>6} {'wrong':>6} {'missed':>7} {'net-blamed':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases:
            c = run_case(case, args.jobs, Path(tmp))
            share = c["right"] / args.jobs if args.jobs else 0.0
            print(
                f"{case:<12} {args.jobs:>5} {c['right']:>6} {c['wrong']:>6} {c['missed']:>7} "
                f"{c['network_blamed_clean']:>11}   {share:.0%} right"
            )


if __name__ == "__main__":
    main()
