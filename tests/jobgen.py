"""A second job generator, written from ``shared/formats/nccl.md`` and
``shared/formats/deepspeed-torch.md`` (not from ncclscope's parsers or ``ncclscope.synth``).

It imports nothing from ``ncclscope``: what it writes is what the format notes say NCCL,
PyTorch and torchrun print, and its truth is what it injected.  Tests
(``tests/test_surgery.py``) and ``benchmarks/bench_trust.py`` cut, join and drop parts of
its jobs and check that ncclscope's findings stay right or fall silent.

Shapes it covers that ``ncclscope synth`` does not: 1 to 8 ranks per host (hosts with one
rank included), host clocks offset by 0 to 50 ms, slow nodes (every rank of a host late),
stragglers slow only inside a window, hangs after which the other ranks go on enqueueing
and logging, restarts (two runs in one file, NCCL 2.7 without ``commId``), several process
groups with the fault in one, and GPU memory (the agent's telemetry parts) sitting at
95-99% of the total while healthy, or leaking.

Time model.  The world communicator runs ``COLLS_PER_STEP`` collectives a step; before
each, every rank computes for that phase's gap (forward gaps are short, the optimizer's
long; each step's gaps vary by +-10%, the same on every rank: same work).  A rank's
arrival at collective k is the end of collective k-1 plus the gap, plus a small jitter
(exponential, 0.4 ms mean), plus its lateness for a slow rank (every rank of a slow node;
inside the window for an intermittent one).  A collective ends 2-6 ms after its last
arrival.  A slowdown ``s`` is lateness over the gap between consecutive collectives as
they are then seen (lateness + compute gap + the collective's ~4 ms), the meaning of
``evidence.slowdown`` in the JSON contract: lateness = ``s / (1 - s) * (gap + 4 ms)``.
Lines carry the *host's* clock: true time plus the host's offset, so a skewed clock looks
like a constant lateness while a slow node's lateness follows the gap (and makes the
others wait).

A COLL line as written (NCCL 2.27, INFO timestamps, torchrun ``--tee``)::

    [default3]:[2025-03-14 09:00:02.019352] gpu-node-01:41233:41233 [3] NCCL INFO AllGather: \
    opCount 1f sendbuff 0x7f1c2a000000 recvbuff 0x7f1c4a000000 count 3145728 datatype 9 \
    op 0 root 0 comm 0x55d0c1a2b3c0 [nranks=16] stream 0x55d0c1f00000

(one line in the file; cut here at the backslashes).

Every line is kept with its metadata (:class:`Line`: true time, rank, attempt, tag), so
surgery can say which evidence a cut kept.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

__all__ = [
    "KINDS",
    "Files",
    "Job",
    "JobSpec",
    "Line",
    "Verdict",
    "classify",
    "cut_lines",
    "cut_time",
    "drop_file",
    "drop_tags",
    "evidence_kept",
    "generate",
    "join_runs",
    "judge",
    "kept_uids",
    "load_files",
    "random_hosts",
    "random_spec",
    "write_files",
]

#: Fault kinds.  ``hang_*``: one rank never enters a collective; ``_end``: the log ends
#: while the others wait (no watchdog yet); ``_watchdog``: after the timeout the waiting
#: ranks print PyTorch's watchdog lines and torchrun reports the aborted ones.
KINDS = (
    "healthy",
    "slow_rank",
    "slow_node",
    "intermittent_rank",
    "intermittent_node",
    "hang_end",
    "hang_watchdog",
    "multi_pg",
    "restart_hang",
    "restart_healthy",
    "memory_flat",
    "memory_leak",
)

#: Collectives of one step on the world communicator, with the compute gap before each
#: (seconds): two forward all-gathers, two backward all-gathers, the gradient
#: reduce-scatter, then the norm all-reduce after the optimizer's share.
PHASES: tuple[tuple[str, str, int, int, float], ...] = (
    # (name, NCCL op, count, datatype, gap_s)
    ("forward", "AllGather", 3_145_728, 9, 0.030),
    ("forward", "AllGather", 3_145_728, 9, 0.025),
    ("backward", "AllGather", 3_145_728, 9, 0.055),
    ("backward", "AllGather", 3_145_728, 9, 0.050),
    ("backward", "ReduceScatter", 25_165_824, 9, 0.045),
    ("optimizer", "AllReduce", 1, 7, 0.120),
)
COLLS_PER_STEP = len(PHASES)
TORCH_OP = {
    "AllGather": "_ALLGATHER_BASE",
    "ReduceScatter": "_REDUCE_SCATTER_BASE",
    "AllReduce": "ALLREDUCE",
}
#: H100 SXM busIds by local rank (NCCL's ``%lx`` spelling).
BUS_IDS = ("18000", "2a000", "3a000", "5d000", "9a000", "ab000", "ba000", "db000")
GPU_TOTAL_BYTES = 81_559 << 20
START = datetime(2025, 3, 14, 9, 0, 0, tzinfo=UTC).timestamp()
TIMEOUT_MS = 600_000
#: a collective's typical time once its last member arrived (2-6 ms)
_COLL_S = 0.004
_ELASTIC = "torch/distributed/elastic/multiprocessing/api.py"


@dataclass
class Line:
    """One line of a generated file.

    ``t`` is the true time (what the file is ordered by); ``tag`` says what it is:
    ``banner``, ``init``, ``coll``, ``watchdog`` (PyTorch's timeout line), ``wd_extra``
    (its companions), ``elastic`` (torchrun's agent), ``other`` (a print).
    """

    text: str
    t: float
    rank: int | None
    tag: str
    attempt: int = 0
    uid: int = -1


@dataclass(frozen=True)
class JobSpec:
    """What to generate.  ``hosts`` is the number of ranks on each host, in rank order."""

    kind: str = "healthy"
    hosts: tuple[int, ...] = (4, 4)
    offsets_ms: tuple[float, ...] = (0.0, 0.0)
    steps: int = 12
    era: str = "2.27"  # 2.7 (no commId, no timestamps), 2.21 (commId), 2.27 (timestamps)
    layout: str = "host"  # host (torchrun --tee per host), rank (%h.%p files), combined (srun -l)
    slowdown: float = 0.0
    culprit_rank: int | None = None
    culprit_host: int | None = None
    #: intermittent stragglers: the slow window in collectives [first, last)
    window: tuple[int, int] | None = None
    #: hangs: the collective the culprit never enters
    stop_at: int | None = None
    #: hangs: collectives the others enqueue past the stuck one, and minutes of prints after
    enqueue_past: int = 0
    continue_min: float = 0.0
    seed: int = 0

    @property
    def ranks(self) -> int:
        return sum(self.hosts)


@dataclass
class Job:
    """Files (name -> lines in file order), the truth, and GPU telemetry rows, if any."""

    spec: JobSpec
    files: dict[str, list[Line]]
    truth: dict[str, Any]
    telemetry: list[dict[str, Any]] = field(default_factory=list)

    def texts(self) -> dict[str, str]:
        return {name: "".join(ln.text + "\n" for ln in lines) for name, lines in self.files.items()}

    def write(self, out: Path, files: dict[str, list[Line]] | None = None) -> Path:
        """Write ``files`` (default: the job's own) under ``out/logs``, the truth to
        ``out/truth.json`` and telemetry parts under ``out/telemetry``; returns the logs
        folder."""
        logs = out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for name, lines in (self.files if files is None else files).items():
            (logs / name).write_text("".join(ln.text + "\n" for ln in lines))
        (out / "truth.json").write_text(json.dumps(self.truth, indent=1))
        if self.telemetry:
            write_telemetry(self.telemetry, out / "telemetry")
        return logs


# --------------------------------------------------------------------------- formats


def _nccl_ts(t: float) -> str:
    """NCCL 2.26.3+ ``NCCL_DEBUG_TIMESTAMP_FORMAT='[%F %T.%6f] '``."""
    d = datetime.fromtimestamp(t, UTC)
    return d.strftime("[%Y-%m-%d %H:%M:%S.") + f"{d.microsecond:06d}] "


def _glog_ts(level: str, t: float) -> str:
    """PyTorch >= 2.4 glog header time, ``E1119 07:52:31.604417923`` (no year)."""
    d = datetime.fromtimestamp(t, UTC)
    return f"{level}{d:%m%d %H:%M:%S}.{d.microsecond:06d}{d.microsecond % 997:03d}"


def _py_ts(t: float) -> str:
    """Python logging's ``2025-03-14 09:00:02,519``."""
    d = datetime.fromtimestamp(t, UTC)
    return f"{d:%Y-%m-%d %H:%M:%S},{d.microsecond // 1000:03d}"


def _elapsed(t: float) -> str:
    return (datetime.fromtimestamp(t, UTC)).strftime("%Y-%m-%d_%H:%M:%S")


@dataclass
class _Proc:
    rank: int
    host: int
    local: int
    pid: int
    comm: dict[str, str]  # communicator name -> comm pointer in this process
    stream: str


@dataclass
class _Comm:
    name: str
    members: list[int]  # global ranks, in communicator-rank order
    comm_id: str
    pg: int  # PyTorch process group id


class _Writer:
    """Formats lines for one attempt of a job: era, launcher prefix, host clocks."""

    def __init__(self, spec: JobSpec, rng: random.Random, hosts: list[str], attempt: int) -> None:
        self.spec, self.rng, self.hosts, self.attempt = spec, rng, hosts, attempt
        self.era = spec.era
        self.host_of: list[int] = []
        self.local_of: list[int] = []
        for h, n in enumerate(spec.hosts):
            self.host_of += [h] * n
            self.local_of += list(range(n))
        self.procs = [
            _Proc(
                rank=r,
                host=self.host_of[r],
                local=self.local_of[r],
                pid=rng.randrange(2_000, 4_000_000),
                comm={},
                stream=f"0x55{rng.randrange(16**10):010x}",
            )
            for r in range(spec.ranks)
        ]
        self.lines: list[tuple[int, Line]] = []  # (host, line)
        self.agent_pid = [rng.randrange(1_000, 90_000) for _ in hosts]

    # -- clocks and prefixes
    def local_t(self, rank: int, t: float) -> float:
        return t + self.spec.offsets_ms[self.host_of[rank]] / 1000.0

    def prefix(self, rank: int) -> str:
        if self.spec.layout == "host":
            return f"[default{self.local_of[rank]}]:"
        if self.spec.layout == "combined":
            return f"{rank}: "
        return ""

    def header(self, rank: int, t: float) -> str:
        p = self.procs[rank]
        ts = _nccl_ts(self.local_t(rank, t)) if self.era == "2.27" else ""
        return f"{self.prefix(rank)}{ts}{self.hosts[p.host]}:{p.pid}:{p.pid} [{p.local}] NCCL INFO "

    def add(self, rank: int | None, host: int, t: float, text: str, tag: str) -> None:
        self.lines.append((host, Line(text, t, rank, tag, self.attempt)))

    def info(self, rank: int, t: float, msg: str, tag: str) -> None:
        self.add(rank, self.host_of[rank], t, self.header(rank, t) + msg, tag)

    # -- init
    def init(self, comms: list[_Comm], t0: float) -> float:
        """Banner, bootstrap and Init lines for every process; returns when init ended."""
        version = {"2.7": "2.7.8+cuda11.0", "2.21": "2.21.5+cuda12.4", "2.27": "2.27.5+cuda12.9"}
        end = t0
        for p in self.procs:
            t = t0 + self.rng.uniform(0.0, 0.8)
            ip = f"10.{20 + self.attempt}.{p.host // 200}.{p.host % 200 + 10}"
            if self.era == "2.27":
                self.info(p.rank, t, f"NCCL version {version[self.era]}", "banner")
            else:
                self.add(
                    p.rank,
                    p.host,
                    t,
                    f"{self.prefix(p.rank)}NCCL version {version[self.era]}",
                    "banner",
                )
            t += 0.002
            using = {
                "2.7": f"Bootstrap : Using [0]eth0:{ip}<0>",
                "2.21": f"Bootstrap : Using eth0:{ip}<0>",
            }
            self.info(p.rank, t, using.get(self.era, f"Bootstrap: Using eth0:{ip}<0>"), "init")
            t += 0.003
            oob = " ; OOB" if self.era == "2.7" else "; OOB"
            self.info(
                p.rank, t, f"NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB{oob} eth0:{ip}<0>", "init"
            )
            self.info(p.rank, t + 0.0005, "Using network IB", "init")
            for c in comms:
                if p.rank not in c.members:
                    continue
                ptr = f"0x55{self.rng.randrange(16**10):010x}"
                p.comm[c.name] = ptr
                cr, n = c.members.index(p.rank), len(c.members)
                nodes = len({self.host_of[m] for m in c.members})
                local_members = [m for m in c.members if self.host_of[m] == p.host]
                t += self.rng.uniform(0.05, 0.3)
                bus = BUS_IDS[p.local]
                if self.era == "2.7":
                    self.info(
                        p.rank,
                        t,
                        f"comm {ptr} rank {cr} nranks {n} cudaDev {p.local} busId {bus}"
                        " - Init COMPLETE",
                        "init",
                    )
                    continue
                fn = "ncclCommInitRankConfig" if self.era == "2.27" else "ncclCommInitRank"
                ident = (
                    f"{fn} comm {ptr} rank {cr} nranks {n} cudaDev {p.local} nvmlDev {p.local} "
                    f"busId {bus} commId {c.comm_id}"
                )
                self.info(p.rank, t, f"{ident} - Init START", "init")
                self.info(
                    p.rank,
                    t + 0.01,
                    f"comm {ptr} rank {cr} nRanks {n} nNodes {nodes} "
                    f"localRanks {len(local_members)} "
                    f"localRank {local_members.index(p.rank)} MNNVL 0",
                    "init",
                )
                self.info(
                    p.rank, t + self.rng.uniform(0.2, 0.6), f"{ident} - Init COMPLETE", "init"
                )
                end = max(end, t + 0.6)
        return end + 0.5

    # -- collectives
    def coll(
        self, rank: int, t: float, comm: _Comm, opcount: int, op: str, count: int, dtype: int
    ) -> None:
        p = self.procs[rank]
        buf = 0x7F0000000000 + (rank << 32)
        self.info(
            rank,
            t,
            f"{op}: opCount {opcount:x} sendbuff 0x{buf + 0x2A000000:x} "
            f"recvbuff 0x{buf + 0x4A000000:x} "
            f"count {count} datatype {dtype} op 0 root 0 comm {p.comm[comm.name]} "
            f"[nranks={len(comm.members)}] stream {p.stream}",
            "coll",
        )

    def other(self, rank: int, t: float, msg: str) -> None:
        """A print of the training script, stamped by Python logging."""
        self.add(
            rank,
            self.host_of[rank],
            t,
            f"{self.prefix(rank)}{_py_ts(self.local_t(rank, t))} - INFO - {msg}",
            "other",
        )

    # -- PyTorch watchdog and torchrun
    def watchdog(
        self,
        rank: int,
        t: float,
        comm: _Comm,
        seq: int,
        op: str,
        numel: int,
        completed: int,
        enqueued: int,
    ) -> None:
        """PyTorch 2.4's timeout line and companions (``[rankG]:`` is the global rank, the
        ``[Rank r]`` / ``[PG n Rank r]`` of the message the rank in that process group)."""
        g = comm.members.index(rank)
        pg = f"PG {comm.pg} (default_pg)" if comm.pg == 0 else f"PG {comm.pg}"
        pre = f"{self.prefix(rank)}[rank{rank}]:"
        ran = TIMEOUT_MS + self.rng.randrange(20, 400)
        lt = self.local_t(rank, t)
        host = self.host_of[rank]
        self.add(
            rank,
            host,
            t,
            f"{pre}[{_glog_ts('E', lt)} ProcessGroupNCCL.cpp:607] [Rank {g}] Watchdog caught "
            f"collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, "
            f"NumelIn={numel}, NumelOut={numel}, "
            f"Timeout(ms)={TIMEOUT_MS}) ran for {ran} milliseconds before timing out.",
            "watchdog",
        )
        self.add(
            rank,
            host,
            t + 0.0004,
            f"{pre}[{_glog_ts('E', lt + 0.0004)} ProcessGroupNCCL.cpp:1664] [{pg} Rank {g}] "
            f"Exception (either an error or timeout) detected by watchdog at work: {seq}, "
            f"last enqueued NCCL work: {enqueued}, "
            f"last completed NCCL work: {completed}.",
            "wd_extra",
        )
        self.add(
            rank,
            host,
            t + 0.0006,
            f"{pre}[{_glog_ts('E', lt + 0.0006)} ProcessGroupNCCL.cpp:630] [{pg} Rank {g}] "
            "To avoid data inconsistency, we are taking the entire process down.",
            "wd_extra",
        )

    def elastic(self, t: float, dead: list[int], alive: list[int]) -> None:
        """torchrun's agent on each host: SIGTERM to the live workers, the first dead one
        reported, the ChildFailedError summary (its "root cause" is the first exit seen).
        Not under srun (``combined``): no torchrun there."""
        if self.spec.layout == "combined":
            return
        for h in range(len(self.hosts)):
            d = [r for r in dead if self.host_of[r] == h]
            if not d:
                continue
            lt = t + self.spec.offsets_ms[h] / 1000.0
            apid = self.agent_pid[h]
            for r in (r for r in alive if self.host_of[r] == h):
                self.add(
                    None,
                    h,
                    t,
                    f"{_glog_ts('W', lt)[:-3]} {apid} {_ELASTIC}:897] "
                    f"Sending process {self.procs[r].pid} closing signal SIGTERM",
                    "elastic",
                )
            first = d[0]
            self.add(
                None,
                h,
                t + 0.2,
                f"{_glog_ts('E', lt + 0.2)[:-3]} {apid} {_ELASTIC}:869] "
                f"failed (exitcode: -6) local_rank: {self.local_of[first]} "
                f"(pid: {self.procs[first].pid}) "
                "of binary: /usr/bin/python3",
                "elastic",
            )
            body = [
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
                "============================================================",
                "train.py FAILED",
                "------------------------------------------------------------",
                "Failures:",
            ]

            def entry(r: int, h: int = h, lt: float = lt) -> list[str]:
                return [
                    f"[{r}]:",
                    f"  time      : {_elapsed(lt)}",
                    f"  host      : {self.hosts[h]}",
                    f"  rank      : {r} (local_rank: {self.local_of[r]})",
                    f"  exitcode  : -6 (pid: {self.procs[r].pid})",
                    "  error_file: <N/A>",
                    f"  traceback : Signal 6 (SIGABRT) received by PID {self.procs[r].pid}",
                ]

            for r in d[1:]:
                body += entry(r)
            if len(d) == 1:
                body.append("  <NO_OTHER_FAILURES>")
            body += [
                "------------------------------------------------------------",
                "Root Cause (first observed failure):",
            ]
            body += entry(first)
            body.append("============================================================")
            for k, text in enumerate(body):
                self.add(None, h, t + 0.3 + k * 1e-5, text, "elastic")


# --------------------------------------------------------------------------- the job


def _comms(spec: JobSpec, rng: random.Random) -> list[_Comm]:
    world = _Comm("world", list(range(spec.ranks)), f"0x{rng.randrange(16**16):016x}", 0)
    if spec.kind != "multi_pg":
        return [world]
    # new_subgroups-like: even and odd ranks (two data-parallel groups across hosts)
    even = _Comm("even", list(range(0, spec.ranks, 2)), f"0x{rng.randrange(16**16):016x}", 1)
    odd = _Comm("odd", list(range(1, spec.ranks, 2)), f"0x{rng.randrange(16**16):016x}", 1)
    return [world, even, odd]


def _late(spec: JobSpec, rank: int, host: int, k: int, gap: float) -> float:
    """How late ``rank`` arrives at collective ``k`` beyond the others (seconds)."""
    slow = False
    if spec.kind in ("slow_rank", "intermittent_rank"):
        slow = rank == spec.culprit_rank
    elif spec.kind in ("slow_node", "intermittent_node"):
        slow = host == spec.culprit_host
    if slow and spec.window is not None:
        slow = spec.window[0] <= k < spec.window[1]
    if not slow or spec.slowdown <= 0:
        return 0.0
    return spec.slowdown / (1.0 - spec.slowdown) * (gap + _COLL_S)


def _run(
    spec: JobSpec, rng: random.Random, hosts: list[str], attempt: int, t0: float
) -> tuple[_Writer, float, dict[str, Any]]:
    """One attempt of the job; returns its writer, its end time and its truth."""
    w = _Writer(spec, rng, hosts, attempt)
    comms = _comms(spec, rng)
    world = comms[0]
    t = w.init(comms, t0)
    n_world = spec.steps * COLLS_PER_STEP
    hang = (
        spec.kind in ("hang_end", "hang_watchdog", "multi_pg", "restart_hang")
        and spec.stop_at is not None
    )
    stop = spec.stop_at if hang else None
    culprit = spec.culprit_rank
    opcount = {c.name: 0 for c in comms}
    end_prev = t  # when the previous collective ended
    truth: dict[str, Any] = {"attempt": attempt}
    slow_times: list[float] = []
    stuck: dict[str, Any] | None = None
    step_bounds: list[tuple[float, float]] = []
    for k in range(n_world):
        step, phase_i = divmod(k, COLLS_PER_STEP)
        _phase, op, count, dtype, base_gap = PHASES[phase_i]
        if phase_i == 0:
            step_jitter = [rng.uniform(0.9, 1.1) for _ in PHASES]
            step_bounds.append((end_prev, end_prev))
        gap = base_gap * step_jitter[phase_i]
        arrivals: dict[int, float] = {}
        for r in range(spec.ranks):
            late = _late(spec, r, w.host_of[r], k, gap)
            arrivals[r] = end_prev + gap + min(rng.expovariate(1 / 0.0004), 0.003) + late
            if late > 0:
                slow_times.append(arrivals[r])
        if stop is not None and k == stop and spec.kind != "multi_pg":
            assert culprit is not None
            stuck = {
                "comm": world,
                "seq": opcount["world"],
                "k": k,
                "op": op,
                "count": count,
                "dtype": dtype,
            }
            waiting = [r for r in range(spec.ranks) if r != culprit]
            w.other(
                culprit,
                end_prev + gap * 0.5,
                f"rank {culprit}: loading shard index /data/shards/idx-{rng.randrange(999):03d}",
            )
            for r in waiting:
                w.coll(r, arrivals[r], world, opcount["world"], op, count, dtype)
            return _finish_hang(spec, w, rng, world, stuck, arrivals, waiting, truth, k, end_prev)
        for r in range(spec.ranks):
            w.coll(r, arrivals[r], world, opcount["world"], op, count, dtype)
        opcount["world"] += 1
        end_prev = max(arrivals.values()) + rng.uniform(0.002, 0.006)
        if spec.kind == "multi_pg" and phase_i == COLLS_PER_STEP - 1:
            # each parity group all-reduces on its own communicator after the step
            for c in comms[1:]:
                sub_gap = 0.015 * rng.uniform(0.9, 1.1)
                arr = {
                    r: end_prev + sub_gap + min(rng.expovariate(1 / 0.0004), 0.003)
                    for r in c.members
                }
                if stop is not None and step == stop // COLLS_PER_STEP and culprit in c.members:
                    return _finish_multi_pg(spec, w, rng, comms, c, opcount, arr, truth, end_prev)
                for r in c.members:
                    w.coll(r, arr[r], c, opcount[c.name], "AllReduce", 1_048_576, 7)
                opcount[c.name] += 1
            end_prev += 0.02
        if phase_i == COLLS_PER_STEP - 1:
            step_bounds[-1] = (step_bounds[-1][0], end_prev)
            if rng.random() < 0.5:
                w.other(
                    0, end_prev + 0.001, f"step {step + 1} loss {2.5 / math.sqrt(step + 1):.4f}"
                )
    truth["kind"] = "healthy" if spec.kind.startswith(("restart", "memory")) else spec.kind
    truth["steps"] = [[a, b] for a, b in step_bounds]
    if (
        spec.kind in ("slow_rank", "slow_node", "intermittent_rank", "intermittent_node")
        and slow_times
    ):
        truth["window_true"] = [min(slow_times), max(slow_times)]
    return w, end_prev, truth


def _finish_hang(
    spec: JobSpec,
    w: _Writer,
    rng: random.Random,
    world: _Comm,
    stuck: dict[str, Any],
    arrivals: dict[int, float],
    waiting: list[int],
    truth: dict[str, Any],
    k: int,
    end_prev: float,
) -> tuple[_Writer, float, dict[str, Any]]:
    """After the culprit stopped: the others may enqueue a few more collectives (COLL
    lines are written at enqueue) and go on printing; with a watchdog, they time out."""
    seq0 = stuck["seq"]
    last_t = max(arrivals.values())
    for extra in range(1, spec.enqueue_past + 1):
        _ph, op, count, dtype, gap = PHASES[(k + extra) % COLLS_PER_STEP]
        for r in waiting:
            w.coll(
                r,
                arrivals[r] + extra * gap * rng.uniform(0.9, 1.1),
                world,
                seq0 + extra,
                op,
                count,
                dtype,
            )
        last_t = max(last_t, max(arrivals.values()) + extra * gap * 1.1)
    minutes = spec.continue_min
    if minutes > 0:
        t = last_t
        while t < last_t + minutes * 60:
            t += rng.uniform(20, 40)
            r = rng.choice(waiting)
            w.other(r, t, f"rank {r}: dataloader prefetch queue {rng.randrange(1, 9)}/8")
    first_arrival = min(arrivals.values())
    truth.update(
        kind="hang",
        culprit_ranks=[spec.culprit_rank],
        stuck_seq=seq0,
        stuck_op=stuck["op"],
        stall_true=first_arrival,
        evidence=["watchdog"] if spec.kind in ("hang_watchdog", "restart_hang") else [],
    )
    if spec.kind == "hang_end" and minutes > 0 and spec.era == "2.27":
        # the others' timed prints go on for minutes after the stall: no progress, timed
        truth["evidence"] = ["stall_time"]
    end = last_t
    if spec.kind in ("hang_watchdog", "restart_hang"):
        # SeqNum counts from 1; the stuck collective is opCount seq0 on the world comm
        numel = stuck["count"]
        tw = first_arrival + TIMEOUT_MS / 1000
        for r in waiting:
            tr = arrivals[r] + TIMEOUT_MS / 1000 + rng.uniform(0.0, 0.05)
            w.watchdog(
                r,
                tr,
                world,
                seq0 + 1,
                TORCH_OP[stuck["op"]],
                numel,
                seq0,
                seq0 + 1 + spec.enqueue_past,
            )
            tw = max(tw, tr)
        # torchrun sees some aborted workers (victims), SIGTERMs the rest (the culprit among them)
        dead = sorted(rng.sample(waiting, k=min(len(waiting), rng.randint(1, 3))))
        alive = [r for r in range(spec.ranks) if r not in dead]
        w.elastic(tw + 1.0, dead, alive)
        truth["torchrun_root_cause"] = dead[0]
        end = tw + 2.0
    return w, end, truth


def _finish_multi_pg(
    spec: JobSpec,
    w: _Writer,
    rng: random.Random,
    comms: list[_Comm],
    group: _Comm,
    opcount: dict[str, int],
    arr: dict[int, float],
    truth: dict[str, Any],
    end_prev: float,
) -> tuple[_Writer, float, dict[str, Any]]:
    """The culprit never enters its group's all-reduce: that group waits there; the other
    group finishes its own, enters the next world collective and waits there (for the
    whole stuck group); after the timeout each waiting rank's watchdog fires in the
    process group it waits in; the culprit has nothing pending and prints nothing."""
    culprit = spec.culprit_rank
    assert culprit is not None
    world = comms[0]
    other = next(c for c in comms[1:] if c is not group)
    stuck_waiters = [r for r in group.members if r != culprit]
    w.other(
        culprit,
        end_prev + 0.005,
        f"rank {culprit}: writing checkpoint shard to /ckpt/step-{opcount['world']}",
    )
    for r in stuck_waiters:
        w.coll(r, arr[r], group, opcount[group.name], "AllReduce", 1_048_576, 7)
    arr_o = {r: end_prev + 0.015 + rng.uniform(0.0, 0.001) for r in other.members}
    for r in other.members:
        w.coll(r, arr_o[r], other, opcount[other.name], "AllReduce", 1_048_576, 7)
    end_o = max(arr_o.values()) + 0.003
    _ph, op, count, dtype, gap = PHASES[0]
    arr_w = {r: end_o + gap + rng.uniform(0.0, 0.001) for r in other.members}
    for r in other.members:
        w.coll(r, arr_w[r], world, opcount["world"], op, count, dtype)
    tw = 0.0
    for r in stuck_waiters:
        tr = arr[r] + TIMEOUT_MS / 1000 + rng.uniform(0.0, 0.05)
        s = opcount[group.name]
        w.watchdog(r, tr, group, s + 1, "ALLREDUCE", 1_048_576, s, s + 1)
        tw = max(tw, tr)
    for r in other.members:
        tr = arr_w[r] + TIMEOUT_MS / 1000 + rng.uniform(0.0, 0.05)
        s = opcount["world"]
        w.watchdog(r, tr, world, s + 1, TORCH_OP[op], count, s, s + 1)
        tw = max(tw, tr)
    dead = sorted(rng.sample(stuck_waiters, k=min(2, len(stuck_waiters))))
    w.elastic(tw + 1.0, dead, [r for r in range(spec.ranks) if r not in dead])
    truth.update(
        kind="hang",
        culprit_ranks=[culprit],
        stuck_pg=group.pg,
        stuck_group=group.members,
        stuck_seq=opcount[group.name],
        stuck_op="AllReduce",
        stall_true=min(arr.values()),
        evidence=["watchdog", "init"],
        torchrun_root_cause=dead[0],
    )
    return w, tw + 2.0, truth


def random_hosts(rng: random.Random, ranks: int, single: bool = True) -> tuple[int, ...]:
    """Split ``ranks`` over hosts of 1 to 8 ranks (at least two hosts; with ``single``, a
    host with one rank now and then)."""
    sizes: list[int] = []
    left = ranks
    per = rng.choice((2, 4, 8, 8, 8, 3, 6))
    while left > 0:
        n = min(left, per)
        if single and rng.random() < 0.15 and left > 1:
            n = 1
        sizes.append(n)
        left -= n
    if len(sizes) == 1:
        sizes = [sizes[0] - 1, 1]
    return tuple(sizes)


def _host_names(spec: JobSpec, rng: random.Random) -> list[str]:
    style = rng.choice(("gpu-node-{:02d}", "trainer-{}", "dgx{:03d}"))
    base = rng.randrange(0, 50)
    return [style.format(base + h) for h in range(len(spec.hosts))]


def _files(spec: JobSpec, w: _Writer, hosts: list[str], files: dict[str, list[Line]]) -> None:
    """Lay the writer's lines out in files, each in the order they would be written."""
    for h, line in sorted(w.lines, key=lambda hl: hl[1].t):
        if spec.layout == "combined":
            name = "job.log"
        elif spec.layout == "host":
            name = f"{hosts[h]}.log"
        elif line.rank is None:
            name = f"{hosts[h]}.agent.log"
        else:
            name = f"{hosts[h]}.{w.procs[line.rank].pid}.log"
            if spec.kind.startswith("restart"):
                # NCCL_DEBUG_FILE=%h.%p gives a new file per run; keep one per rank so
                # both runs sit in one file (a log appended by the job script)
                name = f"{hosts[h]}.rank{line.rank}.log"
        files.setdefault(name, []).append(line)


def _memory(
    spec: JobSpec,
    rng: random.Random,
    hosts: list[str],
    w: _Writer,
    steps: list[list[float]],
    leak_rank: int | None,
) -> list[dict[str, Any]]:
    """NVML-like samples every 0.1 s per GPU: the caching allocator keeps ``used`` flat
    at 95-99% of the total once the first step has grown it (healthy); a leaking GPU's
    floor rises steadily from 55-70% towards the total, with each step's activations on
    top."""
    rows: list[dict[str, Any]] = []
    t0, t1 = steps[0][0], steps[-1][1]
    for r in range(spec.ranks):
        h, loc = w.host_of[r], w.local_of[r]
        bus = int(BUS_IDS[loc], 16)
        pci = f"{bus >> 20:08X}:{(bus >> 12) & 0xFF:02X}:{(bus >> 4) & 0xFF:02X}.{bus & 0xF:X}"
        labels = f"{loc},GPU-{rng.randrange(16**8):08x}-{h:04x}-{loc:04x},{pci}"
        plateau = rng.uniform(0.95, 0.99)
        floor0 = rng.uniform(0.55, 0.70)
        floor1 = floor0 + rng.uniform(0.12, 0.18)
        t = t0 - 1.0
        while t < t1 + 1.0:
            if r == leak_rank:
                frac = min(max((t - t0) / (t1 - t0), 0.0), 1.0)
                pos = next(((t - a) / max(b - a, 1e-6) for a, b in steps if a <= t < b), 0.0)
                act = 0.05 * math.sin(math.pi * pos)
                used = (floor0 + (floor1 - floor0) * frac + act) * GPU_TOTAL_BYTES
            else:
                warm = min(max((t - t0) / max(steps[0][1] - steps[0][0], 0.1), 0.0), 1.0)
                used = (
                    0.70 + (plateau - 0.70) * warm + rng.uniform(-0.0008, 0.0008)
                ) * GPU_TOTAL_BYTES
            lt = t + spec.offsets_ms[h] / 1000.0
            ts = datetime.fromtimestamp(lt, UTC)
            rows.append(
                {
                    "ts": ts,
                    "host": hosts[h],
                    "metric": "ncclscope_gpu_memory_used_bytes",
                    "labels": labels,
                    "value": float(int(used)),
                }
            )
            rows.append(
                {
                    "ts": ts,
                    "host": hosts[h],
                    "metric": "ncclscope_gpu_memory_total_bytes",
                    "labels": labels,
                    "value": float(GPU_TOTAL_BYTES),
                }
            )
            t += 0.1
    return rows


def write_telemetry(rows: list[dict[str, Any]], folder: Path) -> None:
    """The agent's part files (``part-*.parquet``, long format: ts, host, metric,
    labels, value), one per host."""
    import polars as pl

    folder.mkdir(parents=True, exist_ok=True)
    frame = pl.DataFrame(
        rows,
        schema={
            "ts": pl.Datetime("us", "UTC"),
            "host": pl.String,
            "metric": pl.String,
            "labels": pl.String,
            "value": pl.Float64,
        },
    )
    for k, host in enumerate(sorted(frame["host"].unique().to_list())):
        frame.filter(pl.col("host") == host).write_parquet(folder / f"part-{k:05d}-{host}.parquet")


def generate(spec: JobSpec) -> Job:
    """Write the job ``spec`` describes, in memory."""
    rng = random.Random(spec.seed)
    hosts = _host_names(spec, rng)
    files: dict[str, list[Line]] = {}
    truth: dict[str, Any] = {
        "kind": spec.kind,
        "spec": asdict(spec),
        "hosts": {hosts[h]: [] for h in range(len(spec.hosts))},
        "culprit_ranks": [],
        "culprit_hosts": [],
        "window": None,
    }
    r = 0
    for h, n in enumerate(spec.hosts):
        truth["hosts"][hosts[h]] = list(range(r, r + n))
        r += n
    telemetry: list[dict[str, Any]] = []
    if spec.kind in ("restart_hang", "restart_healthy"):
        # run 1 (a hang with its watchdog, or killed mid-run without a word), run 2 healthy
        first = replace(spec, kind="restart_hang" if spec.kind == "restart_hang" else "healthy")
        if spec.kind == "restart_healthy":
            first = replace(first, steps=max(2, spec.steps // 2))
        w1, end1, t1 = _run(first, rng, hosts, 0, START)
        if spec.kind == "restart_healthy":
            # the scheduler killed run 1 at an arbitrary moment, mid-collective
            kill = end1 - rng.uniform(0.0, 0.3)
            w1.lines = [(h, ln) for h, ln in w1.lines if ln.t <= kill]
            end1 = kill
        _files(spec, w1, hosts, files)
        second = replace(spec, kind="healthy", stop_at=None)
        w2, _end2, t2 = _run(second, rng, hosts, 1, end1 + rng.uniform(60, 300))
        _files(spec, w2, hosts, files)
        truth["attempts"] = [t1, t2]
        if spec.kind == "restart_hang":
            truth["culprit_ranks"] = t1["culprit_ranks"]
            truth["kind"] = "restart_hang"
        else:
            truth["kind"] = "healthy"
    else:
        w, _end, t = _run(spec, rng, hosts, 0, START)
        _files(spec, w, hosts, files)
        truth.update({k: v for k, v in t.items() if k not in ("kind", "attempt")})
        truth["kind"] = t["kind"] if not spec.kind.startswith("memory") else spec.kind
        if spec.kind in ("slow_rank", "intermittent_rank"):
            truth["culprit_ranks"] = [spec.culprit_rank]
            truth["culprit_hosts"] = [hosts[w.host_of[spec.culprit_rank or 0]]]
        if spec.kind in ("slow_node", "intermittent_node"):
            assert spec.culprit_host is not None
            truth["culprit_hosts"] = [hosts[spec.culprit_host]]
            truth["culprit_ranks"] = truth["hosts"][hosts[spec.culprit_host]]
        if spec.window is not None and "window_true" in truth:
            truth["window"] = {"collectives": list(spec.window), "true_time": truth["window_true"]}
        if spec.kind.startswith("memory"):
            leak = spec.culprit_rank if spec.kind == "memory_leak" else None
            telemetry = _memory(spec, rng, hosts, w, t["steps"], leak)
            if leak is not None:
                truth["culprit_ranks"] = [leak]
                truth["culprit_hosts"] = [hosts[w.host_of[leak]]]
    if truth["kind"] in ("hang", "restart_hang") and not truth["culprit_hosts"]:
        truth["culprit_hosts"] = sorted(
            {
                h
                for h, members in truth["hosts"].items()
                if set(members) & set(truth["culprit_ranks"])
            }
        )
    truth["slowdown"] = spec.slowdown
    uid = 0
    for lines in files.values():
        for ln in lines:
            ln.uid = uid
            uid += 1
    return Job(spec, files, truth, telemetry)


def random_spec(
    rng: random.Random,
    kind: str,
    *,
    max_ranks: int = 256,
    slowdown: float = 0.0,
    seed: int | None = None,
) -> JobSpec:
    """A job of ``kind`` with random shape: 8 to ``max_ranks`` ranks, 1-8 per host, host
    clock offsets 0-50 ms, era and layout as the kind allows."""
    ranks = rng.choice([r for r in (8, 12, 16, 24, 32, 48, 64, 128, 256) if r <= max_ranks])
    hosts = random_hosts(rng, ranks)
    offsets = tuple(round(rng.uniform(0, 50), 3) for _ in hosts)
    timed = (
        kind in ("slow_rank", "slow_node", "intermittent_rank", "intermittent_node", "hang_end")
        or rng.random() < 0.6
    )
    era = "2.27" if timed else rng.choice(("2.21", "2.7"))
    if kind == "restart_hang" or kind == "restart_healthy":
        era = rng.choice(("2.7", "2.21", "2.27"))
    layout = rng.choice(("host", "host", "rank", "combined"))
    steps = rng.randint(10, 16)
    n = steps * COLLS_PER_STEP
    spec = JobSpec(
        kind=kind,
        hosts=hosts,
        offsets_ms=offsets,
        steps=steps,
        era=era,
        layout=layout,
        slowdown=slowdown,
        seed=rng.randrange(2**31) if seed is None else seed,
    )
    if kind in (
        "slow_rank",
        "intermittent_rank",
        "hang_end",
        "hang_watchdog",
        "restart_hang",
        "memory_leak",
    ):
        spec = replace(spec, culprit_rank=rng.randrange(ranks))
    if kind == "multi_pg":
        spec = replace(spec, culprit_rank=rng.randrange(ranks))
    if kind in ("slow_node", "intermittent_node"):
        spec = replace(spec, culprit_host=rng.randrange(len(hosts)))
    if kind.startswith("intermittent"):
        a = rng.randrange(n // 5, n // 2)
        spec = replace(spec, window=(a, a + rng.randrange(n // 4, n // 2)))
    if kind in ("hang_end", "hang_watchdog", "restart_hang", "multi_pg"):
        spec = replace(
            spec,
            stop_at=rng.randrange(n // 2, n - 2),
            enqueue_past=rng.choice((0, 0, 1, 2)),
            continue_min=rng.choice((0.0, 0.0, 3.0, 8.0)),
        )
    if kind.startswith("memory"):
        spec = replace(spec, hosts=random_hosts(rng, min(ranks, 16)), era="2.27")
        spec = replace(spec, offsets_ms=tuple(round(rng.uniform(0, 50), 3) for _ in spec.hosts))
        if kind == "memory_leak":
            spec = replace(spec, culprit_rank=rng.randrange(spec.ranks))
    return spec


def _main() -> None:  # pragma: no cover - a manual look at one job
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--slowdown", type=float, default=0.1)
    ap.add_argument("--max-ranks", type=int, default=32)
    a = ap.parse_args()
    spec = random_spec(random.Random(a.seed), a.kind, max_ranks=a.max_ranks, slowdown=a.slowdown)
    job = generate(spec)
    job.write(a.out)
    print(json.dumps({k: v for k, v in job.truth.items() if k not in ("steps",)}, indent=1)[:3000])


if __name__ == "__main__":
    _main()


# --------------------------------------------------------------------------- surgery
#
# Log surgery works on ``dict[str, list[Line]]`` (file name -> lines), for generated jobs
# and for fixtures alike (``load_files`` tags a fixture's lines by what they say).

Files = dict[str, list[Line]]

#: Tags for lines of logs this module did not write (fixtures).
_TAG_RES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("banner", re.compile(r"NCCL version \d")),
    (
        "init",
        re.compile(r"Init (?:START|COMPLETE)|nNodes \d|Bootstrap ?:|NET/IB : Using|Using network"),
    ),
    ("coll", re.compile(r"NCCL INFO \w+: opCount [0-9a-f]+ ")),
    ("watchdog", re.compile(r"Watchdog caught collective operation timeout")),
)


def classify(text: str) -> str:
    """The tag of a line found in a fixture.

    >>> classify("n1:4411:4411 [0] NCCL INFO comm 0x55 rank 0 nranks 2 busId 18000 - Init COMPLETE")
    'init'
    """
    for tag, pat in _TAG_RES:
        if pat.search(text):
            return tag
    return "other"


def load_files(folder: Path) -> Files:
    """A fixture's log files (as ``analyze`` would pick them: not README/expected/telemetry)."""
    out: Files = {}
    uid = 0
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.suffix in (".md", ".json", ".parquet"):
            continue
        lines = []
        for k, text in enumerate(path.read_text(errors="replace").splitlines()):
            lines.append(Line(text, float(k), None, classify(text), 0, uid))
            uid += 1
        out[path.name] = lines
    return out


def write_files(files: Files, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, lines in files.items():
        (folder / name).write_text("".join(ln.text + "\n" for ln in lines))
    return folder


def cut_lines(files: Files, keep_from: float, keep_to: float, only: str | None = None) -> Files:
    """Keep each file's lines from ``keep_from`` to ``keep_to`` of its length (fractions;
    ``only``: cut that file alone, the others whole)."""
    out: Files = {}
    for name, lines in files.items():
        if only is not None and name != only:
            out[name] = list(lines)
            continue
        n = len(lines)
        out[name] = lines[math.floor(keep_from * n) : math.ceil(keep_to * n)]
    return out


def cut_time(files: Files, keep_from: float, keep_to: float) -> Files:
    """Keep, in every file, the lines written between two moments of the job: the
    ``keep_from`` and ``keep_to`` quantiles of all its lines' true times (a log copied
    while the job runs; the tail of rotated logs)."""
    times = sorted(ln.t for lines in files.values() for ln in lines)
    if not times:
        return dict(files)
    lo = times[min(len(times) - 1, int(keep_from * len(times)))] if keep_from > 0 else -math.inf
    hi = times[min(len(times) - 1, int(keep_to * len(times)))] if keep_to < 1 else math.inf
    return {name: [ln for ln in lines if lo <= ln.t <= hi] for name, lines in files.items()}


def drop_tags(files: Files, tags: tuple[str, ...] = ("init", "banner")) -> Files:
    """Remove lines by tag (default: the init lines and version banners)."""
    return {name: [ln for ln in lines if ln.tag not in tags] for name, lines in files.items()}


def drop_file(files: Files, name: str) -> Files:
    return {k: v for k, v in files.items() if k != name}


_PID_RE = re.compile(r"(?<=:)(\d+):(\d+)(?= (?:\[-?\d+\] |NCCL ))")
_PTR_RE = re.compile(r"(comm|commId|parent) 0x([0-9a-f]+)")
_NCCL_TS_RE = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})")
_GLOG_RE = re.compile(r"(?<=[IWEF])(\d{2})(\d{2}) (\d{2}:\d{2}:\d{2})(?=\.\d{6})")
_ELAPSED_RE = re.compile(r"(\d{4}-\d{2}-\d{2})_(\d{2}:\d{2}:\d{2})")
_AGENT_PID_RE = re.compile(r"(\(pid: |Sending process |received by PID )(\d+)")


def _shift_text(text: str, seconds: float, pid_shift: int) -> str:
    """The same line as a restarted job would write it: other pids, comm pointers and
    commIds, times ``seconds`` later."""

    def iso(m: re.Match[str]) -> str:
        d = datetime.fromisoformat(f"{m.group(1)}T{m.group(2)}") + timedelta(seconds=seconds)
        return f"{d:%Y-%m-%d}{m.group(0)[10]}{d:%H:%M:%S}"

    def glog(m: re.Match[str]) -> str:
        hh, mm, ss = (int(x) for x in m.group(3).split(":"))
        d = datetime(2025, int(m.group(1)), int(m.group(2)), hh, mm, ss)
        d += timedelta(seconds=seconds)
        return f"{d:%m%d %H:%M:%S}"

    def elapsed(m: re.Match[str]) -> str:
        d = datetime.fromisoformat(f"{m.group(1)}T{m.group(2)}") + timedelta(seconds=seconds)
        return f"{d:%Y-%m-%d_%H:%M:%S}"

    text = _PID_RE.sub(
        lambda m: f"{int(m.group(1)) + pid_shift}:{int(m.group(2)) + pid_shift}", text
    )
    text = _AGENT_PID_RE.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + pid_shift}", text)
    text = _PTR_RE.sub(lambda m: f"{m.group(1)} 0x{int(m.group(2), 16) ^ 0x5A5A50:x}", text)
    text = _ELAPSED_RE.sub(elapsed, text)
    text = _NCCL_TS_RE.sub(iso, text)
    return _GLOG_RE.sub(glog, text)


def join_runs(files: Files, first_part: float = 0.5, gap_s: float = 7200.0) -> Files:
    """Two runs in each file: the job killed at ``first_part`` of its lines, then the
    whole job again as a restart would write it (new pids, communicators, later times)."""
    out: Files = {}
    for name, lines in files.items():
        head = lines[: int(len(lines) * first_part)]
        again = [
            Line(
                _shift_text(ln.text, gap_s, 7919),
                ln.t + gap_s,
                ln.rank,
                ln.tag,
                ln.attempt + 1,
                ln.uid,
            )
            for ln in lines
        ]
        out[name] = head + again
    return out


def kept_uids(files: Files) -> set[int]:
    return {ln.uid for lines in files.values() for ln in lines}


#: How long a log must go on past a stall, with no collective progressing, before its
#: timestamps alone say the job stopped rather than that the log was copied mid-run
#: ("minutes": five of them; a training step is seconds).
NO_PROGRESS_S = 300.0


def _stall_kept(job: Job, lines: list[Line], kept: set[int]) -> bool:
    """A hang that ends the log (no watchdog): the culprit is nameable when the cut kept
    the init lines (they map each process to its rank), every rank's last collective (the
    waiters' is the stuck one: they entered it; the culprit's is the one before: it never
    did) and a line at least ``NO_PROGRESS_S`` after the waiters entered it."""
    culprits = set(job.truth["culprit_ranks"])
    init = {ln.uid for ln in lines if ln.tag in ("init", "banner")}
    last: dict[int, Line] = {}
    for ln in lines:
        if ln.tag == "coll" and ln.rank is not None:
            if ln.rank not in last or ln.t >= last[ln.rank].t:
                last[ln.rank] = ln
    waiters = [ln for r, ln in last.items() if r not in culprits]
    if not waiters or not culprits <= set(last):
        return False
    entered = max(ln.t for ln in waiters)
    later = [ln.t for ln in lines if ln.uid in kept and ln.t >= entered + NO_PROGRESS_S]
    return init <= kept and {ln.uid for ln in last.values()} <= kept and bool(later)


def evidence_kept(job: Job, cut: Files) -> bool:
    """Whether ``cut`` (surgery on ``job.files``) kept what names the culprit: every
    waiting rank's watchdog line (of the ranks any of whose lines were kept, the culprit
    among them) and a line that gives the group's size (and, with
    several process groups, the init lines that say who is in which); for a hang that
    ends the log (``stall_time``), the stall and minutes of log after it
    (``_stall_kept``); half of a slow rank's (node's) timed collectives and the init
    lines; everything, for intermittent stragglers and leaks (their window or trend may
    be what was cut).  A hang with no such evidence (``evidence`` empty: the log ends
    with the others waiting, untimed or soon after) never owes its culprit."""
    kept = kept_uids(cut)
    lines = [ln for lines in job.files.values() for ln in lines]
    truth = job.truth
    evidence = truth.get("evidence", [])
    culprits = set(truth["culprit_ranks"])
    if not culprits:
        return False  # nothing to name
    init = {ln.uid for ln in lines if ln.tag in ("init", "banner")}
    # A rank of which the cut kept no line at all (its file lost) contradicts nothing; a
    # rank whose lines were partly cut may have lost what would: the init lines and
    # watchdog lines required are those of the ranks still present, the culprit among them.
    present = {ln.rank for ln in lines if ln.uid in kept and ln.rank is not None}
    init_present = {ln.uid for ln in lines if ln.uid in init and ln.rank in present}
    if "watchdog" in evidence or truth["kind"] == "restart_hang":
        wd = {ln.uid for ln in lines if ln.tag == "watchdog" and ln.rank in present}
        size = {ln.uid for ln in lines if ln.tag in ("coll", "init")}
        need_init = "init" in evidence
        return (
            culprits <= present
            and bool(wd)
            and wd <= kept
            and bool(size & kept)
            and (not need_init or init_present <= kept)
        )
    if "stall_time" in evidence:
        return _stall_kept(job, lines, kept)
    if truth["kind"] in ("slow_rank", "slow_node"):
        mine = {ln.uid for ln in lines if ln.tag == "coll" and ln.rank in culprits}
        return len(mine & kept) >= 0.5 * len(mine) and init_present <= kept
    if truth["kind"] in ("intermittent_rank", "intermittent_node", "memory_leak"):
        return kept == {ln.uid for ln in lines}
    if truth["kind"] == "hang":
        return False  # no evidence that it stopped: allowed, not owed
    raise ValueError(f"evidence_kept: no rule for {truth['kind']} ({evidence})")


# --------------------------------------------------------------------------- judging

#: Kinds whose ranks are a blame (a culprit, a straggler); ``nccl_error`` names where an
#: error happened, which is a fact rather than a guess, and is judged on its own.
BLAME_KINDS = (
    "hang",
    "timeout",
    "timeout_imminent",
    "mismatch",
    "straggler",
    "oom_risk",
    "pcie_contention",
)
SEVERE = ("warning", "critical")


@dataclass
class Verdict:
    """What a job's findings say against its truth."""

    alarms: list[str]  # warning+ findings on a healthy job (kind: ranks)
    wrong: list[str]  # warning+ findings blaming a rank or host outside the truth
    named: bool  # a warning+ finding of an expected kind names exactly the culprit
    withheld: bool  # no warning+ finding of an expected kind blames anyone

    def describe(self) -> str:
        return (
            f"alarms={self.alarms} wrong={self.wrong} named={self.named} withheld={self.withheld}"
        )


def severe(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc.get("findings", []) if f.get("severity") in SEVERE]


def _fmt(f: dict[str, Any]) -> str:
    return f"{f['kind']}/{f['severity']}: ranks={f.get('ranks')} hosts={f.get('hosts')}"


def judge(
    doc: dict[str, Any],
    culprits: set[int],
    *,
    hosts: set[str] | frozenset[str] = frozenset(),
    kinds: tuple[str, ...] = ("hang", "timeout", "mismatch"),
    allowed: set[int] | None = None,
    by_host: bool = False,
) -> Verdict:
    """Judge ``analyze``'s JSON ``doc``.  Healthy (no culprits): every warning+ finding is
    an alarm.  Faulty: a warning+ finding of a blaming kind that names a rank outside
    ``allowed`` (default: the culprits) or a host outside ``hosts`` is wrong; ``named``
    when one of ``kinds`` names the culprits (``by_host``: names the hosts)."""
    found = severe(doc)
    if not culprits and not hosts:
        return Verdict([_fmt(f) for f in found], [], False, True)
    ok = culprits if allowed is None else allowed
    wrong, named, blamed = [], False, False
    for f in found:
        ranks, fhosts = set(f.get("ranks") or []), set(f.get("hosts") or [])
        if f["kind"] not in BLAME_KINDS or not (ranks or fhosts):
            continue
        if f["kind"] in kinds:
            blamed = True
        bad_rank = bool(ranks - ok)
        bad_host = bool(hosts) and bool(fhosts - set(hosts))
        if bad_rank or bad_host:
            wrong.append(_fmt(f))
            continue
        if f["kind"] in kinds:
            if by_host and fhosts == set(hosts):
                named = True
            elif not by_host and ranks == culprits:
                named = True
    return Verdict([], wrong, named, not blamed)
