#!/usr/bin/env python3
"""Evidence from real hung PyTorch jobs: collected per node, judged from the folders.

Each job is ``torch_hang_job.py`` (real PyTorch on CPU, gloo, one process per rank,
each with its control-plane worker server) with 4 ranks played as two nodes (ranks 0-1
on node-a, 2-3 on node-b) and one fault at a random rank and step:

- ``python``: the rank waits on a lock in Python, never entering the collective;
- ``collective``: the rank enters an all_reduce on a group the others never call;
- ``dead``: the rank's process exits;
- ``frozen``: every process of one node is stopped (SIGSTOP), its agent still running.

Once the others have stopped stepping, each node's :class:`EvidenceCollector` asks its
processes (dumps and stacks through the control plane, py-spy where they give none) and
writes its folder; ``analyze`` over the folders alone must then name the faulty rank(s)
and the kind (dead_process, frozen_node, stuck_outside_nccl, stuck_in_nccl), never
another rank.  Printed per fault: named right / wrong / not named, the collection's wall
time and CPU (this process's threads and py-spy's) per node, and whether every rank has
its stack and dump or a reason.

Usage (PyTorch in another venv: NCCLSCOPE_TORCH_PYTHON, default /work/torchvenv)::

    .venv/bin/python benchmarks/bench_evidence.py --jobs 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ncclscope.analysis import run_analysis
from ncclscope.evidence.collect import CollectConfig, EvidenceCollector

HERE = Path(__file__).resolve().parent
JOB = HERE / "torch_hang_job.py"
TORCH_PY = os.environ.get("NCCLSCOPE_TORCH_PYTHON", "/work/torchvenv/bin/python")
NODES = {"node-a": (0, 1), "node-b": (2, 3)}
KINDS = {
    "python": "stuck_outside_nccl",
    "collective": "stuck_in_nccl",
    "dead": "dead_process",
    "frozen": "frozen_node",
}


class Job:
    """One launched job and the lines its ranks print."""

    def __init__(self, fault: str, rank: int, step: int, work: Path) -> None:
        sock = work / "socks"
        sock.mkdir(parents=True)
        job_fault = "none" if fault == "frozen" else fault
        self.proc = subprocess.Popen(
            [TORCH_PY, str(JOB), "--world-size", "4", "--fault", job_fault,
             "--fault-rank", str(rank), "--fault-step", str(step), "--step-s", "0.05",
             "--socket-dir", str(sock), "--timeout-s", "300"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.pids: dict[int, int] = {}
        self.last_step = time.monotonic()
        self.steps: dict[int, int] = {}
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                if ev.get("event") == "ready":
                    self.pids[int(ev["rank"])] = int(ev["pid"])
                elif ev.get("event") == "step":
                    self.steps[int(ev["rank"])] = int(ev["step"])
                    self.last_step = time.monotonic()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self.lock:
                if len(self.pids) == 4 and len(self.steps) == 4:
                    return
            time.sleep(0.05)
        raise RuntimeError("the job did not start")

    def wait_stalled(self, quiet_s: float = 1.5, timeout_s: float = 60.0) -> None:
        """Until no rank has stepped for ``quiet_s``: the hang has set in."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self.lock:
                if time.monotonic() - self.last_step >= quiet_s:
                    return
            time.sleep(0.05)
        raise RuntimeError("the job never stalled")

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGCONT)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def one(fault: str, rng: random.Random, work: Path) -> dict[str, Any]:
    node = rng.choice(sorted(NODES))
    rank = rng.choice(NODES[node]) if fault != "frozen" else NODES[node][0]
    step = rng.randrange(2, 6)
    job = Job(fault, rank, step, work)
    try:
        job.wait_ready()
        if fault == "frozen":
            while job.steps.get(rank, 0) < step:
                time.sleep(0.02)
            for r in NODES[node]:
                os.kill(job.pids[r], signal.SIGSTOP)
        job.wait_stalled()
        per_node = {}
        for host, ranks in NODES.items():
            c = EvidenceCollector(
                CollectConfig(
                    out=work / host, host=host, pids=[job.pids[r] for r in ranks],
                    ask_timeout_s=5.0,
                )
            )  # fmt: skip
            t0 = time.monotonic()
            c.maybe_collect(
                ("bench", 0),
                {"comm": "bench", "seq": step},
                expected=[(r, job.pids[r]) for r in ranks],
                wait=True,
            )
            per_node[host] = {"wall_s": time.monotonic() - t0, "cpu_s": c.cpu_s}
    finally:
        job.stop()
    folders = [str(work / h / "evidence") for h in NODES]
    with tempfile.TemporaryDirectory() as tmp:
        d = run_analysis(folders, workdir=Path(tmp))
    hangs = [f for f in d.findings if f.kind == "hang" and f.ranks]
    want = sorted(NODES[node]) if fault == "frozen" else [rank]
    named = [(sorted(f.ranks), f.hang_class) for f in hangs]
    right = named == [(want, KINDS[fault])]
    wrong = any(set(f.ranks) - set(want) for f in hangs)
    asked_all = _every_rank_accounted(work)
    return {
        "fault": fault,
        "rank": rank,
        "node": node,
        "named": named,
        "right": right,
        "wrong": wrong,
        "accounted": asked_all,
        "nodes": per_node,
    }


def _record(work: Path, dest: Path, result: dict[str, Any]) -> None:
    """The job's folders, as the agents wrote them, and what the job was."""
    if dest.exists():
        shutil.rmtree(dest)
    for host in NODES:
        for folder in (work / host / "evidence").iterdir():
            shutil.copytree(folder, dest / host / folder.name)
    truth = {k: result[k] for k in ("fault", "rank", "node")}
    truth["kind"] = KINDS[result["fault"]]
    truth["ranks"] = (
        sorted(NODES[result["node"]]) if result["fault"] == "frozen" else [result["rank"]]
    )
    (dest / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")


def _every_rank_accounted(work: Path) -> bool:
    """Every rank has a stack and a dump in its node's folder, or an ask that says why not."""
    for host, ranks in NODES.items():
        manifest = next((work / host / "evidence").rglob("manifest.json"))
        doc = json.loads(manifest.read_text())
        for r in ranks:
            mine = [a for a in doc["asks"] if a.get("rank") == r]
            for what in ("stack", "flight_dump"):
                got = [a for a in mine if a["what"] == what]
                if not got and not any(a.get("state") in ("gone", "zombie") for a in mine):
                    return False
                if not any(a["outcome"] == "answered" or a.get("why") for a in got) and got:
                    return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--jobs", type=int, default=5, help="jobs per fault")
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--faults", default=",".join(KINDS))
    ap.add_argument(
        "--record",
        type=Path,
        help="copy the first job's folders of each fault here (fixtures/evidence-torch: "
        "the recorded run CI reads)",
    )
    args = ap.parse_args()
    if not Path(TORCH_PY).exists():
        print(f"no PyTorch interpreter at {TORCH_PY} (set NCCLSCOPE_TORCH_PYTHON)")
        return 2
    rng = random.Random(args.seed)
    results = []
    for fault in args.faults.split(","):
        for k in range(args.jobs):
            with tempfile.TemporaryDirectory(prefix="ncclscope-bench-ev-") as tmp:
                r = one(fault, rng, Path(tmp))
                if args.record is not None and k == 0:
                    _record(Path(tmp), args.record / fault, r)
            results.append(r)
            cpu = max(n["cpu_s"] for n in r["nodes"].values())
            wall = max(n["wall_s"] for n in r["nodes"].values())
            print(
                f"{fault:10s} job {k}: rank {r['rank']} on {r['node']}: named {r['named']} "
                f"{'RIGHT' if r['right'] else 'WRONG' if r['wrong'] else 'missed'}; "
                f"collect {wall:.2f} s wall, {cpu:.2f} s CPU (worst node); "
                f"every rank accounted: {r['accounted']}",
                flush=True,
            )
    print()
    print("fault       jobs  right  wrong  accounted  worst collect wall / CPU per node")
    for fault in args.faults.split(","):
        rs = [r for r in results if r["fault"] == fault]
        cpu = max(n["cpu_s"] for r in rs for n in r["nodes"].values())
        wall = max(n["wall_s"] for r in rs for n in r["nodes"].values())
        print(
            f"{fault:10s} {len(rs):5d} {sum(r['right'] for r in rs):6d} "
            f"{sum(r['wrong'] for r in rs):6d} {sum(r['accounted'] for r in rs):10d}  "
            f"{wall:.2f} s / {cpu:.2f} s"
        )
    total = len(results)
    right = sum(r["right"] for r in results)
    print(f"\nnamed right in {right}/{total} ({100 * right / total:.0f}%), "
          f"wrong in {sum(r['wrong'] for r in results)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
