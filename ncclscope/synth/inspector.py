"""Synthetic NCCL Inspector output, from the physics of a collective, with ground truth.

Each collective of the job: every rank computes, then enters the collective; the
collective cannot finish before its last member arrives.  A rank's measured execution
time (``coll_exec_time_us``, the kernel time) is therefore::

    exec(r) = (last arrival - arrival(r)) + transfer time + noise

so the rank that arrives last waits least, and its execution time is the shortest.  A
straggler's compute between collectives is ``1 + slowdown`` times the others'.  Compute
times jitter per rank and collective (``jitter``, a coefficient of variation) with
occasional spikes on random ranks (``spike_rate``), so a healthy job has a different
last rank almost every time.  The dump thread writes only the latest completed
collective per communicator at each tick, so a share ``drop`` of records is missing.

Records are written as the plugin writes them (format ``v4.0``, one compact JSON object
per line, one file per process ``<host>-pid<pid>.log``); no line carries a time that a
detector could use: ``dump_timestamp_us`` is the dump thread's wall clock, written here as
a constant per file.  :func:`coll_log` writes the NCCL INFO lines (Init and COLL) of the
same job, so the Inspector records join the logs.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["InspectorJob", "coll_log", "simulate", "write_job"]

#: (op, per-rank message bytes, bus-bandwidth factor) cycled through the job's calls.
_PROGRAM = (
    ("AllGather", 4 << 20, None),
    ("AllGather", 16 << 20, None),
    ("ReduceScatter", 16 << 20, None),
    ("AllReduce", 1 << 20, None),
)
_DTYPE = {"AllGather": 7, "ReduceScatter": 7, "AllReduce": 7}  # ncclFloat32


@dataclass(frozen=True)
class InspectorJob:
    """One simulated job: ``nranks`` ranks, ``ranks_per_host`` a host, one communicator."""

    nranks: int = 8
    ranks_per_host: int = 4
    collectives: int = 200
    straggler: int | None = None
    slowdown: float = 0.0  # extra compute of the straggler, a share of the compute time
    compute_s: float = 0.02  # compute between collectives
    jitter: float = 0.03  # coefficient of variation of a rank's compute per collective
    spike_rate: float = 0.02  # chance per collective that one random rank is delayed
    spike: float = 0.2  # that delay, a share of the compute time
    bus_bw_bytes_per_s: float = 20e9
    exec_noise: float = 0.02  # relative noise of the transfer time
    drop: float = 0.1  # share of records the dump thread misses
    seed: int = 0
    comm_hash: str = "7a3e5c0f1b2d4968"
    hosts: tuple[str, ...] = field(default=())
    #: The straggler is slow only over this stretch of the run (shares of the
    #: collectives, start and end); ``None``: all along.
    window: tuple[float, float] | None = None
    #: Every rank of this host (its index) computes ``1 + slowdown`` times longer.
    slow_host: int | None = None
    #: One collective at which one random rank is delayed by this many compute times.
    outlier: float = 0.0
    #: Sub-communicators of this many consecutive ranks (0: none): each step is an
    #: AllReduce on every sub-communicator, then the world's call.
    sub_size: int = 0
    #: This rank computes ``1 + slowdown`` times longer before its sub-communicator's
    #: calls only (its group leaves them late, so the world sees the whole group late).
    sub_straggler: int | None = None

    def host(self, rank: int) -> str:
        k = rank // self.ranks_per_host
        return self.hosts[k] if k < len(self.hosts) else f"node-{k:02d}"

    def pid(self, rank: int) -> int:
        return 20000 + 97 * rank

    def sub_hash(self, rank: int) -> str:
        """The hash of ``rank``'s sub-communicator."""
        return f"c0de{rank // max(1, self.sub_size):012x}"

    def slow(self, rank: int, i: int) -> bool:
        """``rank`` computes slowly before collective ``i``."""
        if self.slow_host is not None and rank // self.ranks_per_host == self.slow_host:
            return True
        if rank != self.straggler:
            return False
        if self.window is None:
            return True
        return self.window[0] * self.collectives <= i < self.window[1] * self.collectives


def _bus_factor(op: str, n: int) -> float:
    """busbw = algbw x factor (nccl-tests' definitions)."""
    if op == "AllReduce":
        return 2 * (n - 1) / n
    return (n - 1) / n


def simulate(job: InspectorJob) -> list[dict[str, object]]:
    """The records of ``job``, one dict per (rank, collective) written, in file order."""
    if job.sub_size:
        return _simulate_sub(job)
    rng = random.Random(job.seed)
    outlier_at = rng.randrange(job.collectives) if job.outlier else -1
    n = job.nranks
    out: list[dict[str, object]] = []
    sns: dict[str, int] = {}
    for i in range(job.collectives):
        op, size, _ = _PROGRAM[i % len(_PROGRAM)]
        sn = sns.get(op, 0)
        sns[op] = sn + 1
        arrival = []
        for r in range(n):
            c = job.compute_s * max(0.05, 1 + job.jitter * rng.gauss(0, 1))
            if job.slow(r, i):
                c += job.compute_s * job.slowdown
            arrival.append(c)
        if rng.random() < job.spike_rate:
            arrival[rng.randrange(n)] += job.compute_s * job.spike
        if i == outlier_at:
            arrival[rng.randrange(n)] += job.compute_s * job.outlier
        last = max(arrival)
        transfer_s = _transfer_s(job, op, size, n)
        for r in range(n):
            if rng.random() < job.drop:
                continue
            transfer = transfer_s * max(0.5, 1 + job.exec_noise * rng.gauss(0, 1))
            exec_s = (last - arrival[r]) + transfer + abs(rng.gauss(0, 5e-6))
            out.append(_record(job, r, job.comm_hash, r, n, op, sn, size, exec_s))
    return out


def _transfer_s(job: InspectorJob, op: str, size: int, n: int) -> float:
    total = size * n if op in ("AllGather", "ReduceScatter") else size
    return total / job.bus_bw_bytes_per_s / _bus_factor(op, n) * (n - 1) / n


def _record(
    job: InspectorJob,
    r: int,
    comm: str,
    comm_rank: int,
    n: int,
    op: str,
    sn: int,
    size: int,
    exec_s: float,
) -> dict[str, object]:
    exec_us = max(1, round(exec_s * 1e6))
    algbw = size * (n if op != "AllReduce" else 1) / (exec_us / 1e6) / 1e9
    return {
        "rank": r,
        "header": {"id": comm, "rank": comm_rank, "n_ranks": n,
                   "nnodes": -(-n // job.ranks_per_host)},
        "metadata": {
            "inspector_output_format_version": "v4.0",
            "git_rev": "synthetic",
            "rec_mechanism": "nccl_profiler_interface",
            "dump_timestamp_us": 1764000000000000,
            "hostname": job.host(r),
            "pid": job.pid(r),
        },
        "coll_perf": {
            "coll": op,
            "coll_sn": sn,
            "coll_msg_size_bytes": size,
            "coll_exec_time_us": exec_us,
            "coll_timing_source": "kernel_gpu",
            "coll_algobw_gbs": round(algbw, 6),
            "coll_busbw_gbs": round(algbw * _bus_factor(op, n), 6),
        },
    }  # fmt: skip


def _simulate_sub(job: InspectorJob) -> list[dict[str, object]]:
    """With sub-communicators: each rank keeps its own clock.  Per step, each group of
    ``sub_size`` ranks computes and runs an AllReduce among itself (leaving together, at
    its last member's arrival plus the transfer), then every rank computes and runs the
    world's call.  ``sub_straggler`` is slow in the first compute only."""
    rng = random.Random(job.seed)
    n, k = job.nranks, job.sub_size
    clock = [0.0] * n
    out: list[dict[str, object]] = []
    sns: dict[str, int] = {}
    sub_size = 1 << 20

    def jittered() -> float:
        return job.compute_s * max(0.05, 1 + job.jitter * rng.gauss(0, 1))

    def run(
        members: list[int], arrival: dict[int, float], comm: str, op: str, sn: int, size: int
    ) -> None:
        last = max(arrival[r] for r in members)
        transfer_s = _transfer_s(job, op, size, len(members))
        end = last + transfer_s
        for r in members:
            clock[r] = end
            if rng.random() < job.drop:
                continue
            transfer = transfer_s * max(0.5, 1 + job.exec_noise * rng.gauss(0, 1))
            exec_s = (last - arrival[r]) + transfer + abs(rng.gauss(0, 5e-6))
            out.append(_record(job, r, comm, members.index(r), len(members), op, sn, size, exec_s))

    outlier_at = rng.randrange(job.collectives) if job.outlier else -1
    for i in range(job.collectives):
        arrival = {r: clock[r] + jittered() for r in range(n)}
        if i == outlier_at:
            arrival[rng.randrange(n)] += job.compute_s * job.outlier
        if job.sub_straggler is not None:
            arrival[job.sub_straggler] += job.compute_s * job.slowdown
        if rng.random() < job.spike_rate:
            arrival[rng.randrange(n)] += job.compute_s * job.spike
        for g in range(0, n, k):
            run(list(range(g, min(n, g + k))), arrival, job.sub_hash(g), "AllReduce", i, sub_size)
        op, size, _ = _PROGRAM[i % len(_PROGRAM)]
        sn = sns.get(op, 0)
        sns[op] = sn + 1
        arrival = {r: clock[r] + jittered() for r in range(n)}
        if rng.random() < job.spike_rate:
            arrival[rng.randrange(n)] += job.compute_s * job.spike
        run(list(range(n)), arrival, job.comm_hash, op, sn, size)
    return out


def inspector_files(job: InspectorJob) -> dict[str, str]:
    """File name -> content, as the plugin lays them out (one file per process)."""
    files: dict[str, list[str]] = {}
    for rec in simulate(job):
        r = int(str(rec.pop("rank")))
        name = f"{job.host(r)}-pid{job.pid(r)}.log"
        files.setdefault(name, []).append(json.dumps(rec, separators=(",", ":")))
    return {name: "\n".join(lines) + "\n" for name, lines in sorted(files.items())}


def coll_log(job: InspectorJob) -> str:
    """The NCCL INFO lines of the same job: Init COMPLETE and a COLL line per call."""
    lines = []
    comm = {r: f"0x55{r:02x}a0c0ffee" for r in range(job.nranks)}
    for r in range(job.nranks):
        head = f"{job.host(r)}:{job.pid(r)}:{job.pid(r)} [{r % job.ranks_per_host}] NCCL INFO "
        lines.append(head + "NCCL version 2.28.3+cuda12.9")
        lines.append(
            head + f"comm {comm[r]} rank {r} nranks {job.nranks} cudaDev "
            f"{r % job.ranks_per_host} nvmlDev {r % job.ranks_per_host} busId 18000 "
            f"commId 0x{job.comm_hash} - Init COMPLETE"
        )
        if job.sub_size:
            k = job.sub_size
            lines.append(
                head + f"comm 0x66{r:02x}b0c0ffee rank {r % k} nranks {k} cudaDev "
                f"{r % job.ranks_per_host} nvmlDev {r % job.ranks_per_host} busId 18000 "
                f"commId 0x{job.sub_hash(r)} - Init COMPLETE"
            )
    for i in range(job.collectives):
        op, size, _ = _PROGRAM[i % len(_PROGRAM)]
        count = size // 4
        for r in range(job.nranks):
            head = f"{job.host(r)}:{job.pid(r)}:{job.pid(r)} [{r % job.ranks_per_host}] NCCL INFO "
            lines.append(
                head + f"{op}: opCount {i:x} sendbuff 0x7f0000000000 recvbuff 0x7f1000000000 "
                f"count {count} datatype {_DTYPE[op]} op 0 root 0 comm {comm[r]} "
                f"[nranks={job.nranks}] stream 0x55d0000000"
            )
    return "\n".join(lines) + "\n"


def write_job(job: InspectorJob, out_dir: Path, *, with_log: bool = True) -> list[Path]:
    """Write the job's Inspector files (and its NCCL log) under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in inspector_files(job).items():
        (out_dir / name).write_text(text)
        written.append(out_dir / name)
    if with_log:
        (out_dir / "train.log").write_text(coll_log(job))
        written.append(out_dir / "train.log")
    return written
