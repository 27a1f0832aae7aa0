"""How soon the live stack names a stalled collective's culprit, at real speed.

A synth job (8 ranks on 2 nodes, NCCL 2.27 stamps, PyTorch's 600 s timeout) whose
rank 5 never enters world instance ``--stall-at``; one ``ncclscope replay`` per node at
speed 1 on its own node's files; a real Prometheus scraping both every second with
``grafana/ncclscope-rules.yml``.  Prints, per alert, when it first named the culprit,
in seconds after the others entered the stalled collective (the logs' clock), and the
job's own bound (``ncclscope_collective_wait_bound_seconds``) as the agents exported it.

    .venv/bin/python benchmarks/bench_early_stall.py [--stall-at 400] [--wait 150]

Needs Debian's prometheus package.  Target (issue #27): named at warning within 60 s
of the stall's start, or 10 of the job's median gaps, whichever is longer.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from prom import Prometheus, free_port, stop, tools  # noqa: E402

from ncclscope.export.grafana import rules_yaml  # noqa: E402
from ncclscope.synth import StopRank, SynthSpec, generate  # noqa: E402
from ncclscope.synth.faults import Fault, SlowSpell  # noqa: E402

LOG_START = "2025-03-14 09:00:00"
_TS = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\] ")


def _stall_start(files: list[Path]) -> datetime:
    """The latest stamp of the files' COLL lines: when the others had all entered the
    stalled collective (its first arrival is a few ms before)."""
    latest = None
    for f in files:
        for line in f.read_text(encoding="utf-8").splitlines():
            m = _TS.match(line)
            if m and " opCount " in line:
                t = datetime.fromisoformat(m[1]).replace(tzinfo=UTC)
                latest = t if latest is None or t > latest else latest
    assert latest is not None
    return latest


def _pauses(args: argparse.Namespace) -> list[int]:
    """World instances at which rank 0 pauses: four, spread over the job."""
    return [100, 250, 400, 550]


def _gaps(files: list[Path], longer_s: float) -> list[datetime]:
    """Where the files' COLL stamps, in time order, pause longer than ``longer_s``."""
    stamps = sorted(
        datetime.fromisoformat(m[1]).replace(tzinfo=UTC)
        for f in files
        for line in f.read_text(encoding="utf-8").splitlines()
        if " opCount " in line and (m := _TS.match(line))
    )
    return [a for a, b in itertools.pairwise(stamps) if (b - a).total_seconds() > longer_s]


def _watch_hang(
    prom: Prometheus, stall_wall: float, stall: datetime, start: datetime, wait: float
) -> None:
    """When each alert first named rank 5, in seconds after the stall began."""
    print(f"stall {(stall - start).total_seconds():.1f} s into the job")
    first: dict[str, float] = {}
    bound = None
    while time.time() < stall_wall + wait and "NcclscopeCollectiveStalled" not in first:
        for a in prom.alerts():
            if a["state"] == "firing" and a["labels"].get("rank") == "5":
                first.setdefault(a["labels"]["alertname"], time.time() - stall_wall)
        got = prom.query("max(ncclscope_collective_wait_bound_seconds)")
        bound = float(got[0]["value"][1]) if got else bound
        time.sleep(0.5)
    print(f"bound exported: {bound}")
    print(json.dumps({k: round(v, 1) for k, v in first.items()}))


def _watch_pauses(prom: Prometheus, pauses: list[float], until: float) -> None:
    """Per pause (wall start), whether a stall alert fired during it, and the bound."""
    fired: list[float] = []
    bounds: list[tuple[float, float]] = []
    while time.time() < until:
        if any(a["state"] == "firing" and a["labels"]["alertname"] ==
               "NcclscopeCollectiveStalled" for a in prom.alerts()):  # fmt: skip
            fired.append(time.time())
        got = prom.query("max(ncclscope_collective_wait_bound_seconds)")
        if got:
            bounds.append((time.time(), float(got[0]["value"][1])))
        time.sleep(0.5)
    for k, t0 in enumerate(pauses):
        t1 = pauses[k + 1] if k + 1 < len(pauses) else until
        alerted = [t - t0 for t in fired if t0 <= t < t1]
        bound = [b for t, b in bounds if t <= t0]
        print(
            f"pause {k + 1}: bound before it {bound[-1] if bound else None}; "
            + (f"stall alert from {alerted[0]:.1f} s in" if alerted else "no stall alert")
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stall-at", type=int, default=400, help="world instance rank 5 skips")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--wait", type=float, default=150.0, help="seconds watched after the stall")
    ap.add_argument(
        "--scenario",
        choices=["hang", "pauses"],
        default="hang",
        help="hang: rank 5 never enters --stall-at; pauses: a healthy job whose "
        "rank 0 keeps the others waiting --pause-s at 4 places (a checkpoint)",
    )
    ap.add_argument("--pause-s", type=float, default=40.0)
    args = ap.parse_args()
    prometheus, _promtool = tools()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        job = work / "job"
        faults: tuple[Fault, ...] = (
            (StopRank(5, args.stall_at),)
            if args.scenario == "hang"
            else tuple(
                SlowSpell(0, lateness_s=args.pause_s, from_instance=k, to_instance=k + 1)
                for k in _pauses(args)
            )
        )
        generate(
            SynthSpec(ranks=8, hosts=2, steps=args.steps, layers=1, timestamps=True,
                      layout="per-rank", framework="torch", pg_timeout_s=600.0, faults=faults),
            job,
        )  # fmt: skip
        hosts = sorted({p.name.split(".")[0] for p in job.glob("*.log")})
        files = {h: sorted(job.glob(f"{h}.*.log")) for h in hosts}
        # The replays' clocks start together; the stall's start on that clock:
        start = datetime.fromisoformat(LOG_START).replace(tzinfo=UTC)
        waiting = [f for fs in files.values() for f in fs]
        stall = _stall_start(waiting)
        ports = {h: free_port() for h in hosts}
        (work / "rules.yml").write_text(rules_yaml(time_scale=1.0))
        config = work / "prometheus.yml"
        targets = ", ".join(f'"127.0.0.1:{p}"' for p in ports.values())
        config.write_text(
            "scrape_configs:\n  - job_name: ncclscope-bench\n    scrape_interval: 1s\n"
            f"    scrape_timeout: 900ms\n    static_configs:\n      - targets: [{targets}]\n"
            "rule_files: [rules.yml]\n"
        )
        at = time.time() + 5.0
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ncclscope",
                    "replay",
                    *map(str, files[h]),
                    "--hostname",
                    h,
                    "--listen",
                    f"127.0.0.1:{ports[h]}",
                    "--speed",
                    "1",
                    "--start-at",
                    f"{at:.3f}",
                    "--log-start",
                    LOG_START,
                    "--interval",
                    "1",
                    "--linger",
                    str(int(args.wait) + 60),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for h in hosts
        ]
        prom = Prometheus(prometheus, config, work)
        try:
            assert prom.ready(), prom.tail()
            if args.scenario == "hang":
                _watch_hang(prom, at + (stall - start).total_seconds(), stall, start, args.wait)
            else:
                pauses = [at + (t - start).total_seconds() for t in _gaps(waiting, 5.0)]
                _watch_pauses(prom, pauses, at + (stall - start).total_seconds() + 10)
        finally:
            prom.close()
            for p in procs:
                stop(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
