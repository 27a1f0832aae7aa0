"""Synthetic NCCL_DEBUG=INFO job generator with ground truth.

The generator writes the logs that a ZeRO-3-like training job would leave behind
(``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=INIT,ENV,COLL``), in the exact line formats of a
chosen NCCL release (see ``shared/formats/nccl.md``), and a ``truth.json`` that says what was
injected: ranks, processes, communicators, collective counts and what every injected fault
did. The truth is built from what the generator decided to write, never by parsing its own
output, so it can grade parsers and detectors.

Example:
    >>> from pathlib import Path
    >>> spec = SynthSpec(ranks=16, hosts=2, steps=3, faults=(SlowRank(rank=5, lateness_s=0.05),))
    >>> truth = generate(spec, Path("/tmp/job"))  # doctest: +SKIP
    >>> truth.files[0].path  # doctest: +SKIP
    'job.log'

A COLL line looks like (era "2.27", timestamps on, torchrun prefix)::

    [default3]:[2025-03-14 09:00:31.123456] node-0:41237:41237 [3] NCCL INFO AllGather: opCount 1a
    sendbuff 0x7f3a2c004000 recvbuff 0x7f3a2c000000 count 3145728 datatype 9 op 0 root 0
    comm 0x55d4c3a8b2e0 [nranks=64] stream 0x55d4c2f0a3d0

(one physical line). Generation streams to disk in large chunks, so multi-GB benchmark files
need only bounded memory.

Modelling decisions (what a reader of the output can rely on):

* Lines are counted by ``'\\n'`` only. tqdm records contain ``'\\r'`` in the middle of a
  physical line, so read the files in binary (or with ``newline=""``), never with
  universal newlines.
* Banner: NCCL calls ``showVersion()`` only when ``myrank == 0`` in ``ncclCommInitRankDev``.
  Up to 2.22 it is a bare ``printf`` shown once per process (so: world rank 0 and the
  first rank of every host communicator); 2.23+ prints an INFO line at every such init.
  With ``NCCL_DEBUG_FILE`` (per-rank layout) the bare line goes to stdout and the file gets
  NCCL's INFO copy instead.
* Eras "2.26" and "2.27" create the world communicator with ``ncclCommInitRankConfig`` (as
  PyTorch does) and the host communicators with ``ncclCommInitRank``, so both 2.23+
  spellings occur.
* Time: collective slot ``k`` (any comm) has a base time ``base_k``; each rank enqueues it at
  ``base_k + U(0, 2 ms) + lateness(rank)``, and because every collective waits for its
  slowest member, ``base`` advances by ``step_time_s / calls_per_step + max(lateness)``.
  A one-off delay ``d`` of rank ``r`` (``jitter_events``) adds ``d`` to its enqueue and
  ``max(0, lateness(r) + d - max(lateness))`` to every later base. The combined layout is
  ordered by these true times whether or not they are printed; a host's clock offset
  (``clock_offset_max_s``) only shifts the times its processes print.
* Era "2.26" prints the sub-second digits of ``%6f`` as 2.26.x does: the first six digits
  of the nanosecond count (right from 0.1 s into a second on, wrong below).
* The job ends at the earliest instance that has a terminal fault (StopRank, IbError,
  Mismatch with ``hang``, ExtraCollective, DeadProcess); every fault at that instance
  applies (two StopRanks = two missing ranks), later ones are reported with
  ``effective=False``. ``end_reason`` is ``"hang"``, ``"error"`` (IbError) or ``"died"``
  (DeadProcess; NCCL-side that is a hang too). The IB error is raised by the last rank of
  the host (the one whose ring ``[send]`` crosses the network); its receiver on the next
  host logs a consequential flush error; PyTorch-style ``Abort COMPLETE`` lines (2.12+)
  follow.
* Benign WARNs (``benign_warns``): an InfiniBand async event that NCCL's IB async thread
  only logs (``SM change``: the subnet manager moved; established connections are not
  touched), so no return-code chain follows and the job goes on. Each one is printed by
  one process on a random rank, from its NIC's async thread (own TID, ``[0]`` because that
  thread never sets a CUDA device). A real port event reaches every process that opened
  the NIC; one line per event keeps ``N`` = the number of WARN lines.
* Invented but plausible: pids, pointers, commIds, ``file:line`` numbers of WARN and
  return-code chains, IB GIDs, timings. Everything else follows ``formats/nccl.md``.

For detector benchmarks (each option off by default, drawing from its own random generator
so that a spec without it writes the same bytes as before):

* ``clock_offset_max_s``: per-host clock offsets; ``truth.json`` key ``clock_offsets``
  (``[{"host_index": 0, "host": "node-0", "offset_s": -0.00031}, ...]``).
* ``jitter_events``: one-off delays, not faults; key ``noise`` (``[{"kind": "delay",
  "rank": 3, "host": ..., "pid": ..., "instance": 17, "step": 1, "op": "AllGather",
  "count": ..., "delay_s": 0.023}, ...]``).
* ``truth_format=2``: both keys always, and each SlowRank outcome's ``slowdown`` and
  ``median_world_gap_s``, to bin stragglers by how much they slow a collective down.
* ExtraCollective and DeadProcess faults (see their docstrings for what the logs show),
  with ``details`` naming the culprit, its op and sequence, or its signal and exit code.

Framework lines (``framework="deepspeed"`` or ``"torch"``, ``formats/deepspeed-torch.md``):

* ``"none"`` (the default) writes exactly what it wrote before frameworks existed: the
  framework draws from its own random generator and its spec fields are left out of
  ``truth.json``. With a framework, every NCCL line is still the same byte for byte (the
  framework lines only go in between), except that a ``"deepspeed"`` job with ZeRO stage 1
  or 2 runs a stage-1/2 collective program (below), and that non-NCCL noise no longer
  invents DeepSpeed lines (the real ones are written instead).
* DeepSpeed writes on global rank 0 only (``log_dist(ranks=[0])``, ``see_memory_usage``
  and the timers are rank-0 only): the version line before the world communicator is
  created, the ZeRO and optimizer set-up lines, ``see_memory_usage`` reports and the engine
  configuration dump in the 1.5 s before the first step, then per step the wall-clock timer
  lines, and every ``steps_per_print`` steps the progress and throughput lines.
* Collective programs: ZeRO-3 and plain torch (FSDP) all-gather parameters in forward and
  backward and reduce-scatter gradients (``3 x layers + 1`` world collectives per step);
  ZeRO-1/2 keep whole parameters, so a step is a reduce-scatter per layer in backward, the
  grad-norm AllReduce, then an all-gather per layer of the updated partitions (the
  optimizer all-gather): ``2 x layers + 1``.
* Timers come from the same time model as the NCCL lines: a step lasts
  ``step_time_s + n_slots x max(lateness)`` (plus what one-off delays held it up); its
  compute part is split over fwd/bwd/step, and each collective slot adds
  ``max(lateness)`` to the timer it runs under (the wait for the straggler, or rank 0's
  own slowness). ``truth.json`` says how many milliseconds per step that adds to each
  timer.
* A hang (StopRank, a Mismatch with ``hang``, ExtraCollective) ends as PyTorch ends it:
  after the process-group timeout every rank that entered the collective prints the
  watchdog lines of the chosen torch era, aborts (SIGABRT), and each host's torchrun agent
  SIGTERMs what is still running and prints the ChildFailedError summary. The agent polls:
  failures are the ranks that had exited by its first poll after the first exit; the rest
  get SIGTERM. The stopped rank prints nothing (it is stuck outside the collective).
  A DeadProcess is an exit too, just before the collective: its host's agent sees it at
  its next poll (long before the timeout), SIGTERMs the host's other workers and reports
  the rank as root cause with the signal's exit code; other hosts' ranks time out as in a
  hang. IbError keeps its NCCL aftermath only.
* Agent lines carry the pdsh ``host: `` prefix, never a worker prefix; in the per-rank
  layout they go to ``<host>.<agent pid>.log``, and each rank's framework lines go to its own
  file (as when NCCL_DEBUG_FILE and the process's output share a file). A host whose ranks
  all stopped has no failure to report and prints nothing. A SIGTERMed rank prints nothing
  after the signal (so a late watchdog line can be cut: the truth lists what was written).
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Literal, TypeAlias, TypeGuard, get_args

if TYPE_CHECKING:
    from ncclscope.synth_telemetry import TelemetryJob

__all__ = [
    "DEAD_SIGNALS",
    "DS_ERAS",
    "ERAS",
    "FRAMEWORKS",
    "LAUNCHERS",
    "LAYOUTS",
    "MISMATCH_FIELDS",
    "OFFLOADS",
    "TORCH_ERAS",
    "ZERO_STAGES",
    "BenignWarnRecord",
    "CommRecord",
    "DeadProcess",
    "DeadSignal",
    "DsEra",
    "Era",
    "ExtraCollective",
    "Fault",
    "FaultOutcome",
    "FileRecord",
    "Framework",
    "IbError",
    "Json",
    "Launcher",
    "Layout",
    "Mismatch",
    "MismatchField",
    "Offload",
    "RankRecord",
    "SlowHost",
    "SlowRank",
    "SlowSpell",
    "StopRank",
    "SynthSpec",
    "TorchEra",
    "Truth",
    "generate",
]

Json: TypeAlias = str | int | float | bool | list["Json"] | dict[str, "Json"] | None

Era = Literal["2.7", "2.18", "2.21", "2.26", "2.27"]
Layout = Literal["combined", "per-rank"]
Launcher = Literal["none", "torchrun", "rank", "srun", "pdsh"]
MismatchField = Literal["op", "count", "dtype"]
Framework = Literal["none", "deepspeed", "torch"]
Offload = Literal["none", "optimizer", "param", "both"]
DsEra = Literal["old", "new"]  # DeepSpeed <= 0.10.0 / >= 0.10.1 timer names
TorchEra = Literal["2.1", "2.4", "2.7"]

ERAS: tuple[str, ...] = get_args(Era)
LAYOUTS: tuple[str, ...] = get_args(Layout)
LAUNCHERS: tuple[str, ...] = get_args(Launcher)
MISMATCH_FIELDS: tuple[str, ...] = get_args(MismatchField)
FRAMEWORKS: tuple[str, ...] = get_args(Framework)
OFFLOADS: tuple[str, ...] = get_args(Offload)
DS_ERAS: tuple[str, ...] = get_args(DsEra)
TORCH_ERAS: tuple[str, ...] = get_args(TorchEra)
ZERO_STAGES: tuple[int, ...] = (1, 2, 3)

TRUTH_FILE = "truth.json"
COMBINED_FILE = "job.log"
_TRUTH_FORMAT_VERSION = 1

# NCCL datatype / redop enum values (src/nccl.h.in).
_BF16 = 9
_FP32 = 7
_OP_SUM = 0

# Chunk sizes: big enough that write() syscalls and str.join are amortised, small enough that
# memory stays bounded even for per-rank layouts with hundreds of open files.
_FLUSH_CHARS = 8 << 20
_JITTER_S = 0.002


# --------------------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlowRank:
    """A straggler: ``rank`` enqueues every collective ``lateness_s`` after the others.

    Only visible through timestamps (``SynthSpec.timestamps``) and, in the combined layout,
    through the order in which ranks' COLL lines appear.
    """

    rank: int
    lateness_s: float


@dataclass(frozen=True)
class StopRank:
    """A hang: ``rank`` never enters world-communicator instance ``at_instance``.

    The other ranks log that instance's COLL line and then nothing more (they wait forever).
    ``at_instance`` is the 0-based index into the world communicator's collective sequence.
    """

    rank: int
    at_instance: int


@dataclass(frozen=True)
class Mismatch:
    """A desync: at world instance ``at_instance`` ``rank`` logs a different op/count/dtype.

    ``field`` is ``"op"`` (a different collective), ``"count"`` (twice the element count)
    or ``"dtype"`` (bf16 <-> fp32). With ``hang=True`` (what a real mismatch usually causes)
    every rank logs that instance and then nothing more.
    """

    rank: int
    at_instance: int
    field: MismatchField
    hang: bool = True


@dataclass(frozen=True)
class IbError:
    """An InfiniBand completion error on ``host`` during world instance ``at_instance``.

    All ranks log the instance; then the rank on ``host`` whose ring sends over the network
    prints the era's ``NET/IB`` completion-error WARN (preceded by an empty line) and its
    ``file:line -> N`` return-code chain, its ring peer on the next host prints a consequential
    error, and the job stops.
    """

    host: str
    at_instance: int


@dataclass(frozen=True)
class ExtraCollective:
    """A rank calls one collective too many: just before world instance ``at_instance``,
    ``rank`` issues an extra AllReduce (count 1, fp32: a stray ``all_reduce`` of a scalar,
    a metric reduced on one code path only) on the world communicator.

    From there on its sequence numbers are one ahead of everyone's. NCCL numbers calls per
    communicator, so the extra call gets opCount ``at_instance``, the opCount of the others'
    real call: at that sequence the culprit shows a different op/count/dtype, which is what
    a detector sees as a mismatch (at the step's grad-norm AllReduce only the buffers
    differ: truth's ``differs`` is then empty). The rank's real call follows with opCount
    ``at_instance + 1`` (on a 2.27 single-host job every opCount prints 0, so only the
    extra line tells). Nothing can match: the job hangs there. Every rank logs that
    instance, the culprit both its lines, then nothing more; with a framework every rank
    times out, the culprit on its extra ``ALLREDUCE`` (NumelIn=1), one more enqueued.
    """

    rank: int
    at_instance: int


DeadSignal = Literal["SIGKILL", "SIGSEGV", "SIGBUS", "SIGABRT"]
DEAD_SIGNALS: tuple[str, ...] = get_args(DeadSignal)
_SIGNUM = {"SIGKILL": 9, "SIGSEGV": 11, "SIGBUS": 7, "SIGABRT": 6}
_SIGNAME = {num: name for name, num in _SIGNUM.items()}


@dataclass(frozen=True)
class DeadProcess:
    """``rank``'s process dies just before world instance ``at_instance``, by ``signal``
    (SIGKILL, exit code -9: the OOM killer; SIGSEGV -11; SIGBUS -7, e.g. /dev/shm full).

    NCCL-side it looks like StopRank: the rank logs nothing from then on, the others log
    that instance and wait (NCCL itself prints nothing about it here). With a framework,
    the torchrun agent of its host sees the exit at its next poll, long before any
    timeout: it SIGTERMs the host's other workers (they print nothing more) and its
    ChildFailedError names the rank as root cause with that exit code and signal. Ranks on
    other hosts keep waiting and time out as in a hang.
    """

    rank: int
    at_instance: int
    signal: DeadSignal = "SIGKILL"

    @property
    def exit_code(self) -> int:
        """What torchelastic reports: minus the signal number."""
        return -_SIGNUM[self.signal]


@dataclass(frozen=True)
class SlowHost:
    """A slow node: every rank of ``host`` enqueues each collective late by ``lateness_s``
    plus ``slowdown`` x the slot's compute time (the time between collectives without
    stragglers; in the phased model the optimizer step counts for the slot after it),
    from world instance ``from_instance`` up to (not including) ``to_instance`` (``None``:
    to the end).  Unlike SlowRank's constant lateness, the delay holds the collective up
    for everyone as a one-off delay does: every later collective starts that much later,
    so a window of slowness is paid for in the job's time, and a lateness proportional to
    the compute time changes with the phase.
    """

    host: str
    lateness_s: float = 0.0
    slowdown: float = 0.0
    from_instance: int = 0
    to_instance: int | None = None


@dataclass(frozen=True)
class SlowSpell:
    """An intermittent straggler: ``rank`` is late as a SlowHost's ranks are (``lateness_s``
    plus ``slowdown`` x the slot's compute time), only from world instance
    ``from_instance`` up to ``to_instance`` (thermal throttling, a noisy neighbour, a
    checkpoint write)."""

    rank: int
    lateness_s: float = 0.0
    slowdown: float = 0.0
    from_instance: int = 0
    to_instance: int | None = None


Fault: TypeAlias = (
    SlowRank | StopRank | Mismatch | IbError | ExtraCollective | DeadProcess | SlowHost | SlowSpell
)


def _is_terminal(
    fault: Fault,
) -> TypeGuard[StopRank | Mismatch | IbError | ExtraCollective | DeadProcess]:
    """Does the fault end the job at its instance (a hang, an error or a death)?"""
    if isinstance(fault, Mismatch):
        return fault.hang
    return isinstance(fault, StopRank | IbError | ExtraCollective | DeadProcess)


# --------------------------------------------------------------------------------------
# Spec
# --------------------------------------------------------------------------------------


def _parse_start(text: str) -> float:
    """Parse an ISO-8601 wall-clock time into POSIX seconds, treating naive times as UTC."""
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


_BAD_HOST_CHARS = frozenset(": \t\r\n/%.")


@dataclass(frozen=True)
class SynthSpec:
    """What job to synthesise.

    Attributes:
        ranks: Number of ranks (one GPU and one process per rank).
        hosts: Number of hosts; ``ranks`` must split evenly across them.
        steps: Training steps to emit (ignored when ``target_size_bytes`` is set).
        layers: Layers per step. Each step is, on the world communicator: one AllGather per
            layer (forward), one AllGather + ReduceScatter per layer (backward, reverse
            order), then one AllReduce of the grad norm (count 1, fp32).
        era: NCCL release whose line formats are written: "2.7" (2.7.8), "2.18" (2.18.3),
            "2.21" (2.21.5), "2.26" (2.26.2) or "2.27" (2.27.3). "2.26" prints its
            sub-second timestamp digits wrong, as 2.26.x does (see ``_subsec_226``).
        timestamps: Prefix INFO and WARN lines with ``[%F %T.%6f] `` as NCCL does with
            ``NCCL_DEBUG_TIMESTAMP_LEVELS=INFO,WARN`` and
            ``NCCL_DEBUG_TIMESTAMP_FORMAT="[%F %T.%6f] "``. Needs an era >= 2.26 (raises
            ``ValueError`` otherwise). Without it, eras "2.26" and "2.27" still stamp WARN
            lines with the default ``[%F %T] ``, as real 2.26+ does.
        layout: ``"combined"``: one ``job.log`` with all processes' stdout interleaved (what
            a launcher or ``kubectl logs`` captures); ``"per-rank"``: one ``<host>.<pid>.log``
            per process, as ``NCCL_DEBUG_FILE=%h.%p.log`` writes (NCCL output only: no
            launcher prefix, no non-NCCL lines, and the <=2.22 bare banner becomes its INFO
            copy, as NCCL writes it to the debug file). With a framework, each process's
            framework lines go to its file too, and each host's torchrun agent writes
            ``<host>.<agent pid>.log``.
        launcher: Prefix added by the launcher to every line of a process's stdout:
            ``"torchrun"`` ``[default{local_rank}]:``, ``"rank"`` ``[rank{r}]:``, ``"srun"``
            ``{r}: `` (right-aligned like ``srun --label``), ``"pdsh"`` ``{host}: ``.
            Only valid with the combined layout.
        seed: Seed for every random choice; the same spec gives byte-identical output.
        non_nccl_frac: Fraction of lines that are not NCCL (python prints and warnings,
            DeepSpeed log lines, tqdm progress lines with ``\\r``, blank lines). Combined
            layout only.
        target_size_bytes: If set, emit steps until the output reaches this many bytes
            (stopping at a collective boundary), instead of ``steps`` steps.
        faults: Injected faults. Terminal faults (StopRank, IbError, Mismatch with hang)
            end the job; only the earliest one takes effect.
        host_names: Host names (one per host, may repeat like real k8s names); default
            ``node-0``, ``node-1``, ...
        step_time_s: Wall-clock time of one step without stragglers.
        start_time: Wall-clock start of the job (ISO 8601; naive = printed as is).
        tp_traffic: Also run one AllReduce per layer in forward and in backward on each
            intra-host (tensor-parallel-like) communicator.
        benign_warns: Harmless NCCL WARN lines (an IB async ``SM change`` event, in the
            era's WARN format) spread evenly over the training steps, each on a random rank;
            the job goes on. With ``target_size_bytes`` (and no terminal fault) they are
            spread by bytes written, one every ``size / N`` bytes; otherwise by collective
            slots. Needs >= 2 hosts (a one-host job has no IB device) and at least one step.
            0 (the default) leaves the output byte-identical to a spec without it.
        framework: Also write the lines of the training framework (see the module
            docstring): ``"deepspeed"`` (a DeepSpeed ZeRO job on PyTorch), ``"torch"``
            (plain PyTorch DDP/FSDP, no DeepSpeed lines) or ``"none"`` (NCCL only, the
            default; every option below then has to keep its default).
        zero_stage: DeepSpeed ZeRO stage (1, 2 or 3); stages 1 and 2 change the collective
            program (``world_per_step``).
        offload: DeepSpeed ZeRO offload to CPU: ``"optimizer"`` (optimizer states, CPU
            Adam), ``"param"`` (parameters; stage 3 only) or ``"both"``.
        ds_era: ``"new"``: DeepSpeed >= 0.10.1 (``time (ms) | fwd_microstep: ...``);
            ``"old"``: <= 0.10.0 (``rank=0 time (ms) | forward_microstep: ...``).
        torch_era: PyTorch generation of the watchdog and torchrun lines: ``"2.1"`` (no
            ``[rankG]:`` prefix, no time in the glog header), ``"2.4"`` (``[PG 0
            (default_pg) Rank r]``, "Exception ... detected by watchdog", "Timeout at NCCL
            work") or ``"2.7"`` (``[PG ID 0 PG GUID 0(default_pg) Rank r]``, "failure
            detected by watchdog", dump lines).
        pg_timeout_s: Process-group timeout; ``None``: what the framework passes by default
            (DeepSpeed 1800 s; PyTorch 1800 s up to 2.1, 600 s from 2.2).
        steps_per_print: DeepSpeed progress and throughput lines every this many steps.
        comms_summary: DeepSpeed comms-logger summary table (rank 0) when the job ends
            normally.
        desync_report: ``TORCH_NCCL_DESYNC_DEBUG=1``: on a hang, each waiting rank also
            prints the desync report naming the lagging ranks.
        clock_offset_max_s: Hosts' clocks disagree: every time a process prints (NCCL
            timestamps, framework and agent lines) is shifted by its host's offset, drawn
            uniformly in ``[-max, +max]`` (a millisecond is typical of NTP-synchronised
            nodes). Only printed times change: the order of the combined layout stays the
            true order, and truth.json's times are true times; it records each host's
            offset (``clock_offsets``). 0 (the default) = one true clock.
        clock_offsets_s: Each host's clock offset, given (one per host, any size up to a
            minute: a host whose NTP is broken is seconds off); replaces the draw of
            ``clock_offset_max_s``. Empty (the default): drawn, or none.
        jitter_events: One-off delays, which are not faults: this many distinct random
            (world instance, rank) pairs where that rank enqueues that collective late by a
            random 5-50 ms. Like a straggler's lateness, the delay holds the collective up for
            everyone, so every later collective starts that much later (and the framework's
            timer for that step grows by it). Drawn over the world instances before the
            terminal fault, if any; needs ``steps`` (not ``target_size_bytes``).
            truth.json lists them under ``noise``.
        truth_format: ``truth.json``'s ``format_version``. 1 (the default) writes what it
            always wrote, plus the keys of the options above when they are set. 2 always
            writes ``clock_offsets`` and ``noise`` (empty when off) and adds to each SlowRank
            outcome its ``slowdown`` (lateness / median gap between consecutive world
            collectives as generated) and that ``median_world_gap_s``.
        telemetry: Also write what ``ncclscope agent --out`` would have sampled on every
            host (``telemetry/part-*.parquet``, see ``synth_telemetry``), and run the
            phased time model: a step's collectives share ``(1 - optimizer share)`` of
            ``step_time_s``, and the optimizer step (no collective) fills the rest, between
            the step's last collective and the next step's first. Needs ``steps``.
        telemetry_interval_s: The agent's sampling interval.
        pcie_contention: Hosts whose GPUs' PCIe links saturate during the optimizer step
            (ZeRO offload copying to and from the host): from step ``contention_from_step``
            (0-based) on, the optimizer step of those hosts' ranks lasts
            ``contention_inflation`` times as long (everyone waits for them at the next
            step's first collective), their GPUs' PCIe TX/RX run at 85-97% of the link
            during it, and the host's available memory runs low and swap grows. Needs
            ``telemetry`` and DeepSpeed optimizer offload. truth.json: ``telemetry``.
        memory_growth: Ranks whose GPU memory peak grows by
            ``memory_growth_bytes_per_step`` every step (a leak, a growing cache), in the
            telemetry. Needs ``telemetry``.
        gpu_cache_ratio: ``(lo, hi)``: every GPU's NVML "used" climbs through the first
            step and then sits flat between ``lo`` and ``hi`` of the total, as PyTorch's
            caching allocator keeps it on a healthy job (e.g. ``(0.95, 0.99)``). Needs
            ``telemetry``.
    """

    ranks: int = 16
    hosts: int = 2
    steps: int = 10
    layers: int = 4
    era: Era = "2.27"
    timestamps: bool = False
    layout: Layout = "combined"
    launcher: Launcher = "none"
    seed: int = 0
    non_nccl_frac: float = 0.05
    target_size_bytes: int | None = None
    faults: tuple[Fault, ...] = ()
    host_names: tuple[str, ...] = ()
    step_time_s: float = 0.5
    start_time: str = "2025-03-14T09:00:00"
    tp_traffic: bool = False
    benign_warns: int = 0
    framework: Framework = "none"
    zero_stage: int = 3
    offload: Offload = "none"
    ds_era: DsEra = "new"
    torch_era: TorchEra = "2.4"
    pg_timeout_s: float | None = None
    steps_per_print: int = 10
    comms_summary: bool = False
    desync_report: bool = False
    clock_offset_max_s: float = 0.0
    clock_offsets_s: tuple[float, ...] = ()
    jitter_events: int = 0
    truth_format: int = 1
    telemetry: bool = False
    telemetry_interval_s: float = 0.1
    pcie_contention: tuple[str, ...] = ()
    contention_from_step: int = 0
    contention_inflation: float = 2.5
    memory_growth: tuple[int, ...] = ()
    memory_growth_bytes_per_step: int = 1 << 30
    gpu_cache_ratio: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        """Validate the spec; raise ``ValueError`` with a user-facing message."""
        if self.ranks < 1:
            raise ValueError(f"ranks must be >= 1, got {self.ranks}")
        if self.hosts < 1:
            raise ValueError(f"hosts must be >= 1, got {self.hosts}")
        if self.ranks % self.hosts:
            raise ValueError(f"ranks ({self.ranks}) must be a multiple of hosts ({self.hosts})")
        if self.ranks // self.hosts > 64:
            raise ValueError("at most 64 ranks per host are supported")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.layers < 1:
            raise ValueError(f"layers must be >= 1, got {self.layers}")
        if self.era not in ERAS:
            raise ValueError(f"era must be one of {', '.join(ERAS)}; got {self.era!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {self.layout!r}")
        if self.launcher not in LAUNCHERS:
            raise ValueError(
                f"launcher must be one of {', '.join(LAUNCHERS)}; got {self.launcher!r}"
            )
        if self.timestamps and not _ERA_FORMATS[self.era].timestamps_supported:
            raise ValueError(
                f"timestamps need an era >= 2.26 (NCCL_DEBUG_TIMESTAMP_LEVELS appeared in "
                f"2.26); era {self.era} never prints them"
            )
        if self.layout == "per-rank" and self.launcher != "none":
            raise ValueError(
                "a launcher prefix needs the combined layout: per-rank files are written by "
                "NCCL itself (NCCL_DEBUG_FILE) and never pass through the launcher"
            )
        if not 0.0 <= self.non_nccl_frac <= 0.9:
            raise ValueError(f"non_nccl_frac must be in [0, 0.9], got {self.non_nccl_frac}")
        if self.target_size_bytes is not None and self.target_size_bytes <= 0:
            raise ValueError(f"target_size_bytes must be > 0, got {self.target_size_bytes}")
        if not (self.step_time_s > 0 and math.isfinite(self.step_time_s)):
            raise ValueError(f"step_time_s must be > 0, got {self.step_time_s}")
        try:
            _parse_start(self.start_time)
        except ValueError as exc:
            raise ValueError(f"start_time is not ISO 8601: {self.start_time!r}") from exc
        if self.host_names:
            if len(self.host_names) != self.hosts:
                raise ValueError(
                    f"host_names has {len(self.host_names)} names for {self.hosts} hosts"
                )
            for name in self.host_names:
                if not name or _BAD_HOST_CHARS.intersection(name):
                    raise ValueError(
                        f"bad host name {name!r}: it must be non-empty, without ':', '.', "
                        "'/', '%' or whitespace (NCCL prints the name cut at the first '.')"
                    )
        if self.benign_warns < 0:
            raise ValueError(f"benign_warns must be >= 0, got {self.benign_warns}")
        if self.benign_warns and self.hosts < 2:
            raise ValueError(
                "benign_warns are IB async events and need >= 2 hosts (a one-host job uses "
                "sockets and opens no IB device)"
            )
        if self.benign_warns and self.target_size_bytes is None and self.steps == 0:
            raise ValueError("benign_warns need at least one step to be spread over")
        if self.truth_format not in (1, 2):
            raise ValueError(f"truth_format must be 1 or 2, got {self.truth_format}")
        if self.jitter_events < 0:
            raise ValueError(f"jitter_events must be >= 0, got {self.jitter_events}")
        if self.jitter_events and self.target_size_bytes is not None:
            raise ValueError(
                "jitter_events are drawn over the steps' world instances: they need steps, "
                "not target_size_bytes"
            )
        if self.clock_offsets_s and (
            len(self.clock_offsets_s) != self.hosts
            or not all(math.isfinite(x) and abs(x) <= 60.0 for x in self.clock_offsets_s)
        ):
            raise ValueError(
                f"clock_offsets_s must give one offset in [-60, 60] s per host ({self.hosts}), "
                f"got {self.clock_offsets_s}"
            )
        if not (0.0 <= self.clock_offset_max_s <= 1.0):
            raise ValueError(
                f"clock_offset_max_s must be in [0, 1] seconds, got {self.clock_offset_max_s}"
            )
        self._validate_framework()
        self._validate_faults()
        self._validate_telemetry()
        if self.jitter_events > self.ranks * self.jitter_instances:
            raise ValueError(
                f"jitter_events ({self.jitter_events}) exceeds the {self.jitter_instances} "
                f"world instances x {self.ranks} ranks they are drawn from"
            )

    def _validate_framework(self) -> None:
        if self.framework not in FRAMEWORKS:
            raise ValueError(
                f"framework must be one of {', '.join(FRAMEWORKS)}; got {self.framework!r}"
            )
        if self.zero_stage not in ZERO_STAGES:
            raise ValueError(f"zero_stage must be 1, 2 or 3; got {self.zero_stage!r}")
        if self.offload not in OFFLOADS:
            raise ValueError(f"offload must be one of {', '.join(OFFLOADS)}; got {self.offload!r}")
        if self.ds_era not in DS_ERAS:
            raise ValueError(f"ds_era must be one of {', '.join(DS_ERAS)}; got {self.ds_era!r}")
        if self.torch_era not in TORCH_ERAS:
            raise ValueError(
                f"torch_era must be one of {', '.join(TORCH_ERAS)}; got {self.torch_era!r}"
            )
        if self.pg_timeout_s is not None and not (
            self.pg_timeout_s > 0 and math.isfinite(self.pg_timeout_s)
        ):
            raise ValueError(f"pg_timeout_s must be > 0, got {self.pg_timeout_s}")
        if self.steps_per_print < 1:
            raise ValueError(f"steps_per_print must be >= 1, got {self.steps_per_print}")
        if self.offload in ("param", "both") and self.zero_stage != 3:
            raise ValueError("parameter offload needs ZeRO stage 3 (offload=param|both)")
        # Options of a framework the job does not run would be silently ignored: refuse them.
        deepspeed_only = {
            "zero_stage": self.zero_stage != 3,
            "offload": self.offload != "none",
            "ds_era": self.ds_era != "new",
            "steps_per_print": self.steps_per_print != 10,
            "comms_summary": self.comms_summary,
        }
        torch_any = {
            "torch_era": self.torch_era != "2.4",
            "pg_timeout_s": self.pg_timeout_s is not None,
            "desync_report": self.desync_report,
        }
        if self.framework != "deepspeed":
            bad = [k for k, v in deepspeed_only.items() if v]
            if bad:
                verb = "needs" if len(bad) == 1 else "need"
                raise ValueError(f"{', '.join(bad)} {verb} framework='deepspeed'")
        if self.framework == "none":
            bad = [k for k, v in torch_any.items() if v]
            if bad:
                verb = "needs" if len(bad) == 1 else "need"
                raise ValueError(f"{', '.join(bad)} {verb} a framework (deepspeed or torch)")

    def _validate_telemetry(self) -> None:
        if not self.telemetry:
            if self.pcie_contention or self.memory_growth:
                raise ValueError("pcie_contention and memory_growth need telemetry")
            return
        if self.target_size_bytes is not None or self.steps < 1:
            raise ValueError("telemetry follows the steps' timeline: it needs steps >= 1")
        if not (0.01 <= self.telemetry_interval_s <= 10):
            raise ValueError("telemetry_interval_s must be in [0.01, 10] seconds")
        names = [self.host_name(h) for h in range(self.hosts)]
        for host in self.pcie_contention:
            if host not in names:
                raise ValueError(f"pcie_contention: unknown host {host!r}")
        if self.pcie_contention and not (
            self.framework == "deepspeed" and self.offload in ("optimizer", "both")
        ):
            raise ValueError(
                "pcie_contention models ZeRO offload: it needs framework='deepspeed' and "
                "offload='optimizer' or 'both'"
            )
        if not (1.0 <= self.contention_inflation <= 20.0):
            raise ValueError("contention_inflation must be in [1, 20]")
        if self.contention_from_step < 0:
            raise ValueError("contention_from_step must be >= 0")
        for rank in self.memory_growth:
            if not 0 <= rank < self.ranks:
                raise ValueError(f"memory_growth: rank must be in [0, {self.ranks - 1}]")
        if self.gpu_cache_ratio is not None:
            if not self.telemetry:
                raise ValueError("gpu_cache_ratio needs telemetry")
            lo, hi = self.gpu_cache_ratio
            if not 0.0 < lo <= hi < 1.0:
                raise ValueError(f"gpu_cache_ratio must be 0 < lo <= hi < 1, got {lo}, {hi}")
        if self.memory_growth_bytes_per_step < 0:
            raise ValueError("memory_growth_bytes_per_step must be >= 0")

    @property
    def pg_timeout(self) -> float:
        """Process-group timeout in seconds that the framework runs with."""
        if self.pg_timeout_s is not None:
            return self.pg_timeout_s
        # DeepSpeed passes its own 30 min default to init_process_group; PyTorch's NCCL
        # default went from 30 to 10 min in 2.2 (formats/deepspeed-torch.md T5).
        if self.framework == "deepspeed" or self.torch_era == "2.1":
            return 1800.0
        return 600.0

    @property
    def zero12(self) -> bool:
        """A DeepSpeed ZeRO-1/2 job: whole parameters, the stage-1/2 collective program."""
        return self.framework == "deepspeed" and self.zero_stage < 3

    @property
    def ranks_per_host(self) -> int:
        """Ranks (GPUs, processes) on each host."""
        return self.ranks // self.hosts

    @property
    def world_per_step(self) -> int:
        """World-communicator collectives per step: 3 x layers + 1 (2 x layers + 1 ZeRO-1/2)."""
        return (2 if self.zero12 else 3) * self.layers + 1

    @property
    def halt_instance(self) -> int:
        """World instance of the earliest terminal fault (-1: none; the job runs to the end)."""
        return min((f.at_instance for f in self.faults if _is_terminal(f)), default=-1)

    @property
    def jitter_instances(self) -> int:
        """World instances one-off delays are drawn from: all that complete normally."""
        if self.halt_instance >= 0:
            return self.halt_instance
        return self.steps * self.world_per_step

    def host_name(self, index: int) -> str:
        """Name of host ``index``."""
        return self.host_names[index] if self.host_names else f"node-{index}"

    def _validate_spell(self, fault: SlowHost | SlowSpell, names: list[str]) -> None:
        if isinstance(fault, SlowHost) and fault.host not in names:
            raise ValueError(f"{fault}: unknown host {fault.host!r}")
        if isinstance(fault, SlowSpell) and not (0 <= fault.rank < self.ranks):
            raise ValueError(f"{fault}: rank must be in [0, {self.ranks - 1}]")
        for what in (fault.lateness_s, fault.slowdown):
            if not (what >= 0 and math.isfinite(what)):
                raise ValueError(f"{fault}: lateness_s and slowdown must be finite and >= 0")
        if fault.from_instance < 0 or (
            fault.to_instance is not None and fault.to_instance <= fault.from_instance
        ):
            raise ValueError(f"{fault}: need 0 <= from_instance < to_instance")

    def _validate_faults(self) -> None:
        limit = self.steps * self.world_per_step if self.target_size_bytes is None else None
        slow_seen: set[int] = set()
        names = [self.host_name(h) for h in range(self.hosts)]
        # (rank, instance) of the faults that say what one rank does at one instance.
        placed: dict[tuple[int, int], Fault] = {}
        for fault in self.faults:
            if isinstance(
                fault, SlowRank | StopRank | Mismatch | ExtraCollective | DeadProcess
            ) and not (0 <= fault.rank < self.ranks):
                raise ValueError(f"{fault}: rank must be in [0, {self.ranks - 1}]")
            if isinstance(fault, DeadProcess) and fault.signal not in _SIGNUM:
                raise ValueError(f"{fault}: signal must be one of {', '.join(DEAD_SIGNALS)}")
            if isinstance(fault, StopRank | Mismatch | ExtraCollective | DeadProcess):
                other = placed.get((fault.rank, fault.at_instance))
                # StopRank + Mismatch on one rank was always accepted; the newer faults
                # each describe the whole of what the rank does there.
                new_kinds = ExtraCollective | DeadProcess
                if other is not None and (
                    isinstance(fault, new_kinds) or isinstance(other, new_kinds)
                ):
                    raise ValueError(
                        f"{fault}: rank {fault.rank} already has {other} at that instance"
                    )
                placed.setdefault((fault.rank, fault.at_instance), fault)
            if isinstance(fault, SlowHost | SlowSpell):
                self._validate_spell(fault, names)
                continue
            if isinstance(fault, SlowRank):
                if not (fault.lateness_s >= 0 and math.isfinite(fault.lateness_s)):
                    raise ValueError(f"{fault}: lateness_s must be a finite number >= 0")
                if fault.rank in slow_seen:
                    raise ValueError(f"{fault}: rank {fault.rank} is already a SlowRank")
                slow_seen.add(fault.rank)
                continue
            if isinstance(fault, Mismatch) and fault.field not in MISMATCH_FIELDS:
                raise ValueError(f"{fault}: field must be one of {', '.join(MISMATCH_FIELDS)}")
            if isinstance(fault, IbError):
                if self.hosts < 2:
                    raise ValueError(f"{fault}: an IB error needs >= 2 hosts (1 host uses no NIC)")
                if fault.host not in names:
                    raise ValueError(f"{fault}: unknown host {fault.host!r}")
            if isinstance(fault, StopRank | Mismatch | IbError | ExtraCollective | DeadProcess):
                if fault.at_instance < 0:
                    raise ValueError(f"{fault}: at_instance must be >= 0")
                if limit is not None and fault.at_instance >= limit:
                    raise ValueError(
                        f"{fault}: at_instance must be < {limit} "
                        f"({self.steps} steps x {self.world_per_step} world collectives)"
                    )
            elif not isinstance(fault, SlowRank):
                raise TypeError(f"unknown fault {fault!r}")
        # An IB error's aftermath is printed by live processes; a death at the same instance
        # would have one of them print after it died.
        ib_at = {f.at_instance for f in self.faults if isinstance(f, IbError)}
        for fault in self.faults:
            if isinstance(fault, DeadProcess) and fault.at_instance in ib_at:
                raise ValueError(f"{fault}: an IbError is at the same instance; pick one")


def _fault_json(fault: Fault) -> dict[str, Json]:
    out: dict[str, Json] = {"kind": type(fault).__name__}
    out.update(asdict(fault))
    return out


# Spec fields that only mean something with a framework: left out of truth.json without
# one, so that framework="none" writes the truth.json it always wrote.
_FRAMEWORK_FIELDS = frozenset(
    (
        "framework",
        "zero_stage",
        "offload",
        "ds_era",
        "torch_era",
        "pg_timeout_s",
        "steps_per_print",
        "comms_summary",
        "desync_report",
    )
)


# Spec fields added for the detector benchmark, with their defaults: left out of truth.json
# while at the default, so that a spec without them writes the truth.json it always wrote.
_BENCH_DEFAULTS: dict[str, Json] = {
    "clock_offset_max_s": 0.0,
    "clock_offsets_s": [],
    "jitter_events": 0,
    "truth_format": 1,
    "telemetry": False,
    "telemetry_interval_s": 0.1,
    "pcie_contention": [],
    "contention_from_step": 0,
    "contention_inflation": 2.5,
    "memory_growth": [],
    "memory_growth_bytes_per_step": 1 << 30,
    "gpu_cache_ratio": None,
}


def _spec_json(spec: SynthSpec) -> dict[str, Json]:
    out: dict[str, Json] = {}
    for key, value in asdict(spec).items():
        if key in _FRAMEWORK_FIELDS and spec.framework == "none":
            continue
        if isinstance(value, tuple) and key != "faults":
            value = list(value)
        if key in _BENCH_DEFAULTS and value == _BENCH_DEFAULTS[key]:
            continue
        if (
            key in _BENCH_DEFAULTS
            and not spec.telemetry
            and key.startswith(("telemetry_", "contention_", "memory_growth_"))
        ):
            continue
        if key == "faults":
            out[key] = [_fault_json(f) for f in spec.faults]
        elif key == "host_names":
            out[key] = list(value)
        else:
            out[key] = value
    return out


# --------------------------------------------------------------------------------------
# Truth
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileRecord:
    """One written log file: path relative to the output directory, '\\n' count, bytes."""

    path: str
    lines: int
    bytes: int


@dataclass(frozen=True)
class RankRecord:
    """Identity of one rank, as injected."""

    rank: int
    host: str
    host_index: int
    local_rank: int
    pid: int
    tid: int
    proxy_tid: int
    cuda_dev: int
    nvml_dev: int
    bus_id: str
    file: str
    launcher_prefix: str


@dataclass(frozen=True)
class CommRecord:
    """One communicator.

    ``comm_id`` is the ``commId`` hex printed in Init lines (``None`` for eras without it);
    ``comm_ptrs`` maps str(rank) to the per-process ``comm %p``; ``calls`` counts COLL lines;
    ``instances`` counts distinct sequence numbers entered by at least one rank;
    ``init_func`` is the API name printed before ``comm`` in Init lines (None: not printed);
    ``last_seq`` maps str(rank) to the last sequence it logged (``None``: none);
    ``opcount_printed`` is ``"seq"`` (opCount = sequence, hex) or ``"zero"`` (NCCL 2.27
    prints 0 on single-node communicators).
    """

    name: str
    comm_id: str | None
    nranks: int
    ranks: list[int]
    n_nodes: int
    n_channels: int
    init_func: str | None
    comm_ptrs: dict[str, str]
    calls: int
    instances: int
    last_seq: dict[str, int | None]
    opcount_printed: str


@dataclass(frozen=True)
class FaultOutcome:
    """What an injected fault did. ``effective`` = it changed the output."""

    kind: str
    fault: dict[str, Json]
    effective: bool
    details: dict[str, Json]


@dataclass(frozen=True)
class BenignWarnRecord:
    """One injected benign WARN.

    ``path`` is the file it went to (relative to the output directory) and ``line_no`` the
    1-based number of the WARN line itself in that file (the empty line NCCL writes before
    it is ``line_no - 1``). ``tid`` is the IB async thread that printed it.
    """

    rank: int
    host: str
    pid: int
    tid: int
    path: str
    line_no: int
    warn_src: str
    message: str


@dataclass(frozen=True)
class Truth:
    """Ground truth of a synthetic job (written to ``truth.json``)."""

    spec: dict[str, Json]
    nccl_version: str
    files: list[FileRecord]
    ranks: list[RankRecord]
    communicators: list[CommRecord]
    coll_calls: int
    coll_instances: int
    calls_by_op: dict[str, int]
    world_instances: int
    steps_completed: int
    end_reason: str
    non_nccl_lines: int
    first_ts: str
    last_ts: str
    faults: list[FaultOutcome]
    format_version: int = _TRUTH_FORMAT_VERSION
    benign_warns: list[BenignWarnRecord] = field(default_factory=list)
    # What the framework wrote (see ``_Framework.truth``); None (and absent from the
    # JSON) without a framework.
    framework: dict[str, Json] | None = None
    # Each host's clock offset: {host_index, host, offset_s}, offset_s = printed - true
    # time. None (absent from the JSON) without clock offsets, unless truth_format is 2.
    clock_offsets: list[dict[str, Json]] | None = None
    # One-off delays (not faults): {kind: "delay", rank, host, pid, instance, step, op,
    # count, delay_s}, by instance. None (absent) without jitter_events, unless
    # truth_format is 2.
    noise: list[dict[str, Json]] | None = None
    # The telemetry written beside the logs (``synth_telemetry.TelemetryTruth``): its
    # folder, hosts, GPUs, the injected contention and memory growth. None (absent)
    # without ``telemetry``.
    telemetry: dict[str, Json] | None = None

    def to_dict(self) -> dict[str, Json]:
        """Plain JSON-compatible dict; optional parts that are None are left out."""
        out: dict[str, Json] = asdict(self)
        for key in ("framework", "clock_offsets", "noise", "telemetry"):
            if out[key] is None:
                del out[key]
        return out

    def to_json(self, *, indent: int | None = 1) -> str:
        """Serialise to a JSON string (stable key order, so output is deterministic)."""
        return json.dumps(self.to_dict(), indent=indent)


# --------------------------------------------------------------------------------------
# Era formats: one dispatch table, no version checks scattered below.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _EraFormat:
    nccl_version: str
    cuda_version: str
    driver_version: int | None  # "cudaDriverVersion %d" (2.13.4+)
    bootstrap: str  # {ifc} {ip}
    net_plugin: tuple[str, ...]  # once per process, before NET/IB
    net_initialized: bool  # "Initialized NET plugin %s" (2.27+)
    net_assigned: bool  # "Assigned NET plugin %s to comm" (2.27+)
    net_in_ncclinit: bool  # <=2.11: network set up by ncclInit, before the banner
    ib_ro: str  # relaxed-ordering tag (2.12+) in the NET/IB line
    banner_bare: bool  # <=2.22: printf once per process; 2.23+: INFO at each rank-0 init
    init_start: str | None  # format with {func} {comm} {rank} {nranks} {dev} {nvml} {bus} {cid}
    init_complete: str
    has_commid: bool
    world_func: str
    host_func: str
    nnodes_line: bool
    nvls_line: bool
    ring_list_wide: bool  # 2.23+: width = digits(nranks-1), capped at 127 chars
    trees_double: bool  # 2.5-2.7 "d/d/d->r->up|up->r->d/d/d"
    conn_busid: bool  # <=2.18.1 peers shown as busId; 2.18.3+ as nvmlDev, with /connIndex
    p2p: str
    gdr: str
    chunksize: bool
    connected_rings: str | None
    thread_thresholds: str
    channels: str  # {c} {p} {pp}
    launch_mode: bool
    bootstrap_timings: bool
    init_timings: bool
    ras_line: bool
    end_line: str | None  # "comm %p rank ... busId %lx - %s COMPLETE" (2.12+)
    ib_error: str  # {peer} {status} {opcode} {vendor} {req} {gids} {hca}
    ib_file: str
    ib_line: int
    ib_code: int
    chain: tuple[str, ...]
    chain_last_suffix: str
    # Benign IB async event (ncclIbAsyncThreadMain): {hca} {port} {event}
    async_warn: str
    async_src: str
    timestamps_supported: bool
    warn_default_ts: bool
    opcount_zero_single_node: bool
    # 2.26.x: the %Nf sub-second digits come from tv_nsec / (1000000 / 10^N) (2.27 divides
    # 1000000000): with N = 6 that is the nanosecond count, printed into N characters.
    subsec_bug: bool = False


_INIT_218 = (
    "comm {comm} rank {rank} nranks {nranks} cudaDev {dev} nvmlDev {nvml} busId {bus} "
    "commId {cid} - Init {what}"
)
_INIT_221 = "ncclCommInitRank " + _INIT_218
_INIT_223 = "{func} " + _INIT_218
_END = "comm {comm} rank {rank} nranks {nranks} cudaDev {dev} busId {bus} - {what} COMPLETE"
_TT_OLD = "8/8/64 | 128/8/64 | 8/8/512"
_TT_NEW = "8/8/64 | 128/8/64 | 512 | 512"
_NOT_FOUND = "libnccl-net.so: cannot open shared object file: No such file or directory"
# ncclIbAsyncThreadMain prints every async event but COMM_EST and carries on:
#   <= 2.18  WARN("NET/IB : Got async event : %s", ibv_event_type_str(type))
#   by 2.20  WARN("NET/IB : %s:%d Got async event : %s", devName, portNum, str)  (2.20.5)
#   2.2x+    a switch: fatal QP/CQ/device events bump a counter that later fails the comm;
#            the non-fatal ones (PORT_ERR/ACTIVE, LID/PKEY/SM change, CLIENT_REREGISTER ...)
#            only print "NET/IB : %s:%d Got async error event: %s" (2.2x-era sources;
#            "Got non-fatal async event: %s(%d)" at HEAD).
# IBV_EVENT_SM_CHANGE ("SM change" in libibverbs) is benign in every era: the subnet manager
# moved (opensm failover/restart); existing RC queue pairs keep their LIDs and paths, so
# nothing fails and no "-> N" return-code chain follows. (GID_CHANGE, the other common one,
# got its own "GID table changed" case in 2.2x, at a release we could not pin down.)
_ASYNC_OLD = "NET/IB : Got async event : {event}"
_ASYNC_EVENT = "SM change"

_ERA_227 = _EraFormat(
    nccl_version="2.27.3",
    cuda_version="12.9",
    driver_version=12080,
    bootstrap="Bootstrap: Using {ifc}:{ip}<0>",
    net_plugin=(),
    net_initialized=True,
    net_assigned=True,
    net_in_ncclinit=False,
    ib_ro=" [RO]",
    banner_bare=False,
    init_start=_INIT_223,
    init_complete=_INIT_223,
    has_commid=True,
    # PyTorch creates its process groups with ncclCommInitRankConfig; the host-local
    # groups use plain ncclCommInitRank so that both 2.23+ spellings get exercised.
    world_func="ncclCommInitRankConfig",
    host_func="ncclCommInitRank",
    nnodes_line=True,
    nvls_line=True,
    ring_list_wide=True,
    trees_double=False,
    conn_busid=False,
    p2p="P2P/CUMEM/read",
    gdr="/GDRDMA(PCI)",
    chunksize=True,
    connected_rings="Connected all rings, use ring PXN 0 GDR 1",
    thread_thresholds=_TT_NEW,
    channels=(
        "{c} coll channels, 0 collnet channels, 0 nvls channels, {p} p2p channels, "
        "{pp} p2p channels per peer"
    ),
    launch_mode=False,
    bootstrap_timings=True,
    init_timings=True,
    ras_line=True,
    end_line=_END,
    ib_error=(
        "NET/IB: Got completion from peer {peer} with status={status} opcode={opcode} "
        "len=0 vendor err {vendor} ({req}){gids} hca {hca}"
    ),
    ib_file="transport/net_ib.cc",
    ib_line=2259,
    ib_code=6,
    chain=("transport/net_ib.cc:2262", "transport/net.cc:1373", "proxy.cc:746", "proxy.cc:958"),
    chain_last_suffix=" [Progress Thread]",
    async_warn="NET/IB : {hca}:{port} Got async error event: {event}",
    async_src="transport/net_ib.cc:198",
    timestamps_supported=True,
    warn_default_ts=True,
    opcount_zero_single_node=True,
)


_ERA_FORMATS: dict[str, _EraFormat] = {
    "2.7": _EraFormat(
        nccl_version="2.7.8",
        cuda_version="11.0",
        driver_version=None,
        bootstrap="Bootstrap : Using [0]{ifc}:{ip}<0>",
        net_plugin=(
            "NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
        ),
        net_initialized=False,
        net_assigned=False,
        net_in_ncclinit=True,
        ib_ro=" ",
        banner_bare=True,
        init_start=None,
        init_complete=(
            "comm {comm} rank {rank} nranks {nranks} cudaDev {dev} busId {bus} - Init {what}"
        ),
        has_commid=False,
        world_func="",
        host_func="",
        nnodes_line=False,
        nvls_line=False,
        ring_list_wide=False,
        trees_double=True,
        conn_busid=True,
        p2p="P2P/IPC",
        gdr="/GDRDMA",
        chunksize=False,
        connected_rings=None,
        thread_thresholds=_TT_OLD,
        channels="{c} coll channels, {p} p2p channels, {pp} p2p channels per peer",
        launch_mode=True,
        bootstrap_timings=False,
        init_timings=False,
        ras_line=False,
        end_line=None,
        ib_error=(
            "NET/IB : Got completion with error {status}, opcode {opcode}, len 0, "
            "vendor err {vendor}"
        ),
        ib_file="transport/net_ib.cc",
        ib_line=787,
        ib_code=2,
        chain=("transport/net_ib.cc:790", "transport/net.cc:405", "proxy.cc:196"),
        chain_last_suffix="",
        async_warn=_ASYNC_OLD,
        async_src="transport/net_ib.cc:83",
        timestamps_supported=False,
        warn_default_ts=False,
        opcount_zero_single_node=False,
    ),
    "2.18": _EraFormat(
        nccl_version="2.18.3",
        cuda_version="12.2",
        driver_version=12020,
        bootstrap="Bootstrap : Using {ifc}:{ip}<0>",
        net_plugin=(
            f"NET/Plugin : Plugin load (libnccl-net.so) returned 2 : {_NOT_FOUND}",
            "NET/Plugin : No plugin found, using internal implementation",
        ),
        net_initialized=False,
        net_assigned=False,
        net_in_ncclinit=False,
        ib_ro=" [RO]",
        banner_bare=True,
        init_start=_INIT_218,
        init_complete=_INIT_218,
        has_commid=True,
        world_func="",
        host_func="",
        nnodes_line=False,
        nvls_line=True,
        ring_list_wide=False,
        trees_double=False,
        conn_busid=False,
        p2p="P2P/IPC/read",
        gdr="/GDRDMA",
        chunksize=True,
        connected_rings="Connected all rings",
        thread_thresholds=_TT_NEW,
        channels="{c} coll channels, 0 nvls channels, {p} p2p channels, {pp} p2p channels per peer",
        launch_mode=False,
        bootstrap_timings=False,
        init_timings=False,
        ras_line=False,
        end_line=_END,
        ib_error=(
            "NET/IB : Got completion from peer {peer} with error {status}, opcode {opcode}, "
            "len 0, vendor err {vendor} ({req}){gids}"
        ),
        ib_file="transport/net_ib.cc",
        ib_line=1421,
        ib_code=6,
        chain=("transport/net_ib.cc:1424", "transport/net.cc:1225", "proxy.cc:715", "proxy.cc:864"),
        chain_last_suffix="",
        async_warn=_ASYNC_OLD,
        async_src="transport/net_ib.cc:93",
        timestamps_supported=False,
        warn_default_ts=False,
        opcount_zero_single_node=False,
    ),
    "2.21": _EraFormat(
        nccl_version="2.21.5",
        cuda_version="12.4",
        driver_version=12040,
        bootstrap="Bootstrap : Using {ifc}:{ip}<0>",
        net_plugin=(
            "NET/Plugin: No plugin found (libnccl-net.so)",
            f"NET/Plugin: Plugin load returned 2 : {_NOT_FOUND} : when loading libnccl-net.so",
            "NET/Plugin: Using internal network plugin.",
        ),
        net_initialized=False,
        net_assigned=False,
        net_in_ncclinit=False,
        ib_ro=" [RO]",
        banner_bare=True,
        init_start=_INIT_221,
        init_complete=_INIT_221,
        has_commid=True,
        world_func="ncclCommInitRank",
        host_func="ncclCommInitRank",
        nnodes_line=True,
        nvls_line=True,
        ring_list_wide=False,
        trees_double=False,
        conn_busid=False,
        p2p="P2P/CUMEM/read",
        gdr="/GDRDMA",
        chunksize=True,
        connected_rings="Connected all rings",
        thread_thresholds=_TT_NEW,
        channels=(
            "{c} coll channels, 0 collnet channels, 0 nvls channels, {p} p2p channels, "
            "{pp} p2p channels per peer"
        ),
        launch_mode=False,
        bootstrap_timings=False,
        init_timings=False,
        ras_line=False,
        end_line=_END,
        ib_error=(
            "NET/IB : Got completion from peer {peer} with status={status} opcode={opcode} "
            "len=0 vendor err {vendor} ({req}){gids}"
        ),
        ib_file="transport/net_ib.cc",
        ib_line=1696,
        ib_code=6,
        chain=("transport/net_ib.cc:1699", "transport/net.cc:1304", "proxy.cc:731", "proxy.cc:935"),
        chain_last_suffix=" [Progress Thread]",
        async_warn="NET/IB : {hca}:{port} Got async event : {event}",
        async_src="transport/net_ib.cc:101",
        timestamps_supported=False,
        warn_default_ts=False,
        opcount_zero_single_node=False,
    ),
    # 2.26.2 (what PyTorch 2.7 wheels ship). Against 2.27: no "Initialized/Assigned NET
    # plugin" lines (2.27+), the plugin fallback line that 2.26.2 prints instead (2.25.1
    # still said "internal network plugin", nccl.md's 2.22-2.25 wording), opCount = sequence
    # on single-node comms too (0 from 2.27), and the sub-second timestamp bug. The same
    # 2.23+ Init/timings lines, 2.24+ RAS and "use ring PXN", 2.26+ "/GDRDMA(PCI)" and
    # WARN timestamps. Bootstrap: formats/nccl.md puts "Bootstrap : Using" up to 2.26, but
    # real 2.25.1 and 2.26.2 logs print "Bootstrap: Using" (no space): we follow the logs.
    # 2.26 writes 2.27's formats but for the net plugin lines, where NET/IB is set up,
    # opCount on single-node communicators (2.27 prints 0) and the sub-second digits
    # of timestamps (nccl.md: 2.26.x prints the leading digits of the nanoseconds).
    "2.26": replace(
        _ERA_227,
        nccl_version="2.26.2",
        cuda_version="12.8",
        net_plugin=("NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin.",),
        net_initialized=False,
        net_assigned=False,
        ib_line=2203,
        chain=("transport/net_ib.cc:2206", "transport/net.cc:1367", "proxy.cc:742", "proxy.cc:951"),
        async_src="transport/net_ib.cc:194",
        opcount_zero_single_node=False,
        subsec_bug=True,
    ),
    "2.27": _ERA_227,
}

_BUS_IDS = ("18000", "2a000", "3a000", "5d000", "9a000", "ab000", "ba000", "db000")
_N_NICS = 4


def _bus_id(local: int) -> str:
    return _BUS_IDS[local] if local < len(_BUS_IDS) else f"{0x100 + local:x}000"


# --------------------------------------------------------------------------------------
# Time formatting
# --------------------------------------------------------------------------------------


class _SecondCache:
    """strftime is slow; the seconds part of a timestamp changes rarely, so cache it."""

    __slots__ = ("_cache", "_fmt")

    def __init__(self, fmt: str) -> None:
        self._fmt = fmt
        self._cache: dict[int, str] = {}

    def get(self, sec: int) -> str:
        text = self._cache.get(sec)
        if text is None:
            if len(self._cache) > 4096:
                self._cache.clear()
            text = time.strftime(self._fmt, time.gmtime(sec))
            self._cache[sec] = text
        return text


def _subsec_226(frac: float) -> str:
    """The six sub-second digits NCCL 2.26.x prints for ``%6f`` (``frac`` in [0, 1)).

    2.26 divides ``tv_nsec`` by ``1000000 / 10^6`` instead of ``1000000000 / 10^6`` and
    prints the result into six characters: the first six digits of the zero-padded
    nanosecond count. That is the microsecond value when the fraction is >= 0.1 s, and wrong
    below (0.012345678 s prints ``123456``, not ``012345``).

    >>> _subsec_226(0.5), _subsec_226(0.012345678), _subsec_226(0.0000543)
    ('500000', '123456', '054300')
    """
    us = int(frac * 1e6)
    # The nanoseconds below the microsecond, kept consistent with ``us`` so that the bug is
    # the only difference from the microseconds 2.27 prints at the same instant.
    sub = min(max(int(frac * 1e9) - us * 1000, 0), 999)
    return f"{us * 1000 + sub:06d}"[:6]


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")


# --------------------------------------------------------------------------------------
# Internal model
# --------------------------------------------------------------------------------------


@dataclass
class _Rank:
    rank: int
    host: str
    host_index: int
    local: int
    pid: int
    proxy_tid: int
    bus: str
    ip: str
    head: str  # launcher prefix
    info: str  # "host:pid:tid [dev] NCCL INFO "
    proxy_info: str
    stream: str
    heap: int  # base address of this process's (fake) CUDA allocations
    file: str


@dataclass
class _Comm:
    name: str
    members: list[int]  # global ranks, in comm-rank order (always a contiguous range)
    host_index: int | None
    comm_id: int | None
    ptr: dict[int, str]
    n_nodes: int
    nch: int
    func: str
    zero_opcount: bool
    calls: int = 0
    seq: int = 0  # number of sequence numbers entered so far

    def index(self, rank: int) -> int:
        """Comm rank of global ``rank``."""
        return rank - self.members[0]


@dataclass(frozen=True)
class _Call:
    """One position of a step's program: comm, op, count (from comm size), dtype."""

    world: bool
    op: str
    count_of: Callable[[int], int]
    dtype: int
    buffer: int  # index of the (persistent) buffer this call uses
    # Where in the step it runs, for framework timers: fwd | bwd | reduce | norm | optim_ag
    phase: str = ""


@dataclass(frozen=True)
class _IbInfo:
    culprit: _Rank
    peer: _Rank
    culprit_pos: tuple[str, int]
    peer_pos: tuple[str, int]
    message: str
    peer_message: str


class _WarnPlan:
    """When the benign WARNs fall due: ascending thresholds on a progress measure.

    The measure is bytes written (``by_bytes``) or the number of collective slots entered.
    """

    __slots__ = ("at", "by_bytes", "next")

    def __init__(self, at: list[float], *, by_bytes: bool) -> None:
        self.at = at
        self.by_bytes = by_bytes
        self.next = 0

    def due(self, progress: float, *, everything: bool = False) -> int:
        """How many WARNs fall due at ``progress`` (all that are left if ``everything``)."""
        at = self.at
        k = self.next
        while k < len(at) and (everything or progress >= at[k]):
            k += 1
        count = k - self.next
        self.next = k
        return count


class _Sink:
    """A binary output file that buffers text and counts what it wrote."""

    __slots__ = ("_counted", "_counted_lines", "bytes", "fh", "lines", "pending", "rel")

    def __init__(self, path: Path, rel: str) -> None:
        self.rel = rel
        self.fh: BinaryIO = path.open("wb")
        self.pending: list[str] = []
        self.bytes = 0
        self.lines = 0
        # '\n's in pending[:_counted], so that pending_lines() scans each text only once.
        self._counted = 0
        self._counted_lines = 0

    def add(self, text: str) -> None:
        self.pending.append(text)

    def pending_lines(self) -> int:
        """'\n's buffered but not yet written (incremental: texts are counted once)."""
        pending = self.pending
        if self._counted < len(pending):
            self._counted_lines += sum(
                pending[i].count("\n") for i in range(self._counted, len(pending))
            )
            self._counted = len(pending)
        return self._counted_lines

    def flush(self) -> None:
        if not self.pending:
            return
        data = "".join(self.pending).encode("utf-8")
        self.pending.clear()
        self._counted = self._counted_lines = 0
        self.fh.write(data)
        self.bytes += len(data)
        self.lines += data.count(b"\n")

    def close(self) -> None:
        self.flush()
        self.fh.close()


# --------------------------------------------------------------------------------------
# Non-NCCL noise
# --------------------------------------------------------------------------------------

_PY_WARNINGS = (
    "/usr/local/lib/python3.10/dist-packages/torch/utils/checkpoint.py:91: UserWarning: "
    "None of the inputs have requires_grad=True. Gradients will be None",
    "/usr/local/lib/python3.10/dist-packages/torch/distributed/distributed_c10d.py:4631: "
    "UserWarning: No device id is provided via `init_process_group` or `barrier `.",
    "/usr/local/lib/python3.10/dist-packages/deepspeed/runtime/zero/stage3.py:1330: "
    "UserWarning: The torch.cuda.*DtypeTensor constructors are no longer recommended.",
)
_BAR_PARTIAL = " ▏▎▍▌▋▊▉"


class _Noise:
    """Builds non-NCCL lines: python prints and warnings, DeepSpeed lines, tqdm, blanks."""

    def __init__(
        self, rnd: random.Random, heads: list[str], total_steps: int, framework: str = "none"
    ) -> None:
        self._rnd = rnd
        self._heads = heads
        self._ds_sec = _SecondCache("%Y-%m-%d %H:%M:%S")
        self._total = max(total_steps, 1)
        self.count = 0
        # Rank 0's host clock offset: the DeepSpeed lines below are rank 0's.
        self.offset0 = 0.0
        # Ranks whose process is dead: nothing is printed in their name.
        self.silent: frozenset[int] = frozenset()
        kinds: list[tuple[float, Callable[[int, float, int], str]]] = [
            (0.15, self._blank),
            (0.20, self._print),
            (0.10, self._warning),
            (0.15, self._ds_progress),
            (0.15, self._ds_timers),
            (0.10, self._ds_throughput),
            (0.15, self._tqdm),
        ]
        self._warnings: tuple[str, ...] = _PY_WARNINGS
        if framework != "none":
            # The framework writes the real DeepSpeed lines and counts them in the truth;
            # invented ones would contradict it (and a plain torch job has none at all).
            ds_kinds = (self._ds_progress, self._ds_timers, self._ds_throughput)
            kinds = [k for k in kinds if k[1] not in ds_kinds]
            if framework == "torch":
                self._warnings = tuple(w for w in _PY_WARNINGS if "deepspeed" not in w)
        self._cum: list[float] = []
        acc = 0.0
        for weight, _ in kinds:
            acc += weight
            self._cum.append(acc)
        self._kinds = [kind for _, kind in kinds]

    def line(self, rank: int, t: float, step: int) -> str:
        """Return one non-NCCL record (one or more physical lines, each ending in '\\n')."""
        x = self._rnd.random() * self._cum[-1]
        for cum, kind in zip(self._cum, self._kinds, strict=True):
            if x < cum:
                return kind(rank, t, step)
        return self._kinds[-1](rank, t, step)

    def emit(self, rank: int, *lines: str) -> str:
        """Format physical lines of ``rank``'s stdout (launcher prefix added) and count them."""
        if rank in self.silent:
            return ""
        self.count += len(lines)
        head = self._heads[rank]
        return "".join(f"{head}{text}\n" for text in lines)

    def ds_ts(self, t: float) -> str:
        """DeepSpeed logger time: ``[%Y-%m-%d %H:%M:%S,mmm]``."""
        sec = int(t)
        return f"[{self._ds_sec.get(sec)},{int((t - sec) * 1000):03d}]"

    def _blank(self, rank: int, t: float, step: int) -> str:
        return self.emit(rank, "")

    def _print(self, rank: int, t: float, step: int) -> str:
        r = self._rnd
        loss = r.uniform(1.5, 3.5)
        return self.emit(
            rank, f"[rank {rank}] step {step} loss {loss:.4f} tokens {r.randrange(8192, 65536)}"
        )

    def _warning(self, rank: int, t: float, step: int) -> str:
        # The warnings module prints the source line of the call under the message.
        return self.emit(rank, self._rnd.choice(self._warnings), "  warnings.warn(")

    def _ds_progress(self, rank: int, t: float, step: int) -> str:
        lr = 3e-4 * min(1.0, (step + 1) / 100)
        return self.emit(
            0,
            f"{self.ds_ts(t + self.offset0)} [INFO] [logging.py:128:log_dist] [Rank 0] "
            f"step={step}, skipped=0, lr=[{lr!r}], mom=[(0.9, 0.95)]",
        )

    def _ds_timers(self, rank: int, t: float, step: int) -> str:
        r = self._rnd
        fwd, bwd = r.uniform(80, 160), r.uniform(160, 330)
        return self.emit(
            0,
            f"{self.ds_ts(t + self.offset0)} [INFO] [logging.py:128:log_dist] [Rank 0] time (ms) | "
            f"fwd_microstep: {fwd:.2f} | bwd_microstep: {bwd:.2f} | "
            f"bwd_inner_microstep: {bwd * 0.93:.2f} | bwd_allreduce_microstep: "
            f"{r.uniform(0.01, 0.2):.2f} | step_microstep: {r.uniform(10, 40):.2f}",
        )

    def _ds_throughput(self, rank: int, t: float, step: int) -> str:
        r = self._rnd
        cur = r.uniform(90, 140)
        return self.emit(
            0,
            f"{self.ds_ts(t + self.offset0)} [INFO] [timer.py:264:stop] epoch=0/micro_step={step}/"
            f"global_step={step}, RunningAvgSamplesPerSec={cur * 0.99!r}, "
            f"CurrSamplesPerSec={cur!r}, MemAllocated={r.uniform(18, 22):.2f}GB, "
            f"MaxMemAllocated={r.uniform(30, 38):.2f}GB",
        )

    def _tqdm(self, rank: int, t: float, step: int) -> str:
        # tqdm redraws with '\r' and no '\n'; the launcher only passes a line on once a
        # newline arrives, so several redraws end up in one physical line.
        total = max(self._total, step + 2)
        parts = []
        for done in (step, step + 1):
            frac = done / total
            filled = frac * 10
            full = int(filled)
            bar = "█" * full
            if full < 10:
                bar += _BAR_PARTIAL[int((filled - full) * 8)] + " " * (9 - full)
            left = total - done
            parts.append(
                f"\rTraining: {int(frac * 100):3d}%|{bar}| {done}/{total} "
                f"[{done // 120:02d}:{done // 2 % 60:02d}<{left // 120:02d}:{left // 2 % 60:02d}, "
                f"{self._rnd.uniform(1.8, 2.2):.2f}it/s]"
            )
        return self.emit(0, "".join(parts))


# --------------------------------------------------------------------------------------
# Framework lines: DeepSpeed and PyTorch (shared/formats/deepspeed-torch.md)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _DsEraFormat:
    """What differs between DeepSpeed <= 0.10.0 and >= 0.10.1 (timer names, ``rank=N``)."""

    version: str
    timer_head: str  # "time (ms)" (>= 0.10.1) or "rank=0 time (ms)" (<= 0.10.0)
    micro: tuple[str, ...]  # engine micro-step timers, in log order
    glob: tuple[str, ...]  # engine global timers, in log order
    # Header "file:line:func" of each call site (line numbers of that release, D9).
    log_dist: str
    timer_stop: str
    mem: tuple[str, str, str]  # see_memory_usage: message, MA line, CPU line
    cfg_title: str
    cfg_line: str
    cfg_json: str
    stage12: int  # first line of the four stage_1_and_2 __init__ messages
    stage3: int  # first line of the two stage3 __init__ messages
    stage3_opt: str
    zero_utils: str
    newer_keys: bool  # config attributes that appeared after 0.10


_MICRO_NEW = (
    "fwd_microstep",
    "bwd_microstep",
    "bwd_inner_microstep",
    "bwd_allreduce_microstep",
    "step_microstep",
)
_GLOBAL_NEW = ("fwd", "bwd", "bwd_inner", "bwd_allreduce", "step")
# DeepSpeed <= 0.10.0 timer names -> >= 0.10.1 names (b354c28b7, #3996); the truth uses these.
_DS_RENAMES = {
    "forward_microstep": "fwd_microstep",
    "backward_microstep": "bwd_microstep",
    "backward_inner_microstep": "bwd_inner_microstep",
    "backward_allreduce_microstep": "bwd_allreduce_microstep",
    "forward": "fwd",
    "backward": "bwd",
    "backward_inner": "bwd_inner",
    "backward_allreduce": "bwd_allreduce",
}
_DS_OLD_NAMES = {new: old for old, new in _DS_RENAMES.items()}

_DS_ERA_FORMATS: dict[str, _DsEraFormat] = {
    "old": _DsEraFormat(
        version="0.9.5",
        timer_head="rank=0 time (ms)",
        micro=tuple(_DS_OLD_NAMES.get(x, x) for x in _MICRO_NEW),
        glob=tuple(_DS_OLD_NAMES.get(x, x) for x in _GLOBAL_NEW),
        log_dist="logging.py:96:log_dist",
        timer_stop="timer.py:199:stop",
        mem=(
            "utils.py:785:see_memory_usage",
            "utils.py:786:see_memory_usage",
            "utils.py:793:see_memory_usage",
        ),
        cfg_title="config.py:960:print",
        cfg_line="config.py:964:print",
        cfg_json="config.py:950:print_user_config",
        stage12=133,
        stage3=113,
        stage3_opt="stage3.py:436:_setup_for_real_optimizer",
        zero_utils="utils.py:54:is_zero_supported_optimizer",
        newer_keys=False,
    ),
    "new": _DsEraFormat(
        version="0.14.4",
        timer_head="time (ms)",
        micro=_MICRO_NEW,
        glob=_GLOBAL_NEW,
        log_dist="logging.py:96:log_dist",
        timer_stop="timer.py:258:stop",
        mem=(
            "utils.py:781:see_memory_usage",
            "utils.py:782:see_memory_usage",
            "utils.py:789:see_memory_usage",
        ),
        cfg_title="config.py:997:print",
        cfg_line="config.py:1001:print",
        cfg_json="config.py:987:print_user_config",
        stage12=148,
        stage3=130,
        stage3_opt="stage3.py:486:_setup_for_real_optimizer",
        zero_utils="utils.py:56:is_zero_supported_optimizer",
        newer_keys=True,
    ),
}


@dataclass(frozen=True)
class _TorchEraFormat:
    """One PyTorch generation of the NCCL watchdog and torchrun agent output (PART T)."""

    version: str
    rank_prefix: bool  # "[rankG]:" before C++ log lines (2.2+, #110623)
    glog_time: bool  # "[E314 09:41:52.117183842 file:N]" (2.4+) vs "[E file:N]"
    pg_prefix: str  # logPrefix() of the default PG, {r} = rank in it
    wd: int  # ProcessGroupNCCL.cpp line of each message
    exc_det: int | None  # "Exception (either an error or timeout) detected ..." (2.4)
    to_at: int | None  # "Timeout at NCCL work: ..." (2.3 - 2.6)
    fail_det: int | None  # "failure detected by watchdog at work sequence id" (2.7+)
    dump: tuple[int, int, int, int] | None  # 2.7: stack not found, first PG, received, preparing
    desync: int
    desync_prefixed: bool  # LOG(ERROR) << logPrefix() << report (2.3+) vs << report
    some: int
    avoid: int
    some_prefixed: bool  # "[Rank r] Some NCCL operations ..." (2.3+)
    term: int
    term_msg: str  # what the watchdog says when it throws
    term_pg_prefixed: bool
    check_timeout: int  # "Exception raised from checkTimeout at ...:N"
    comm_watchdog: int  # "Exception raised from ncclCommWatchdog at ...:N"
    optional: str  # c10::optional / std::optional in checkTimeout's signature
    loop: str  # the watchdog's loop function in the stack
    term_delay: tuple[float, float]  # from the timeout to the throw (2.4+ wait for dumps)
    # torchrun agent
    agent_glog: bool  # "E0314 09:41:52.117000 PID .../api.py:N] " (2.4+) vs "[... ,mmm] ..."
    agent_sigterm: int
    agent_failed: int
    monitor_interval_s: float  # torchrun --monitor-interval default
    tb_lines: tuple[int, int, int, int, int]  # errors/__init__ wrapper, run main/run, api


_TORCH_ERA_FORMATS: dict[str, _TorchEraFormat] = {
    "2.1": _TorchEraFormat(
        version="2.1.2",
        rank_prefix=False,
        glog_time=False,
        pg_prefix="[Rank {r}]",
        wd=475,
        exc_det=None,
        to_at=None,
        fail_det=None,
        dump=None,
        desync=486,
        desync_prefixed=False,
        some=489,
        avoid=495,
        some_prefixed=False,
        term=916,
        term_msg="NCCL watchdog thread terminated with exception: ",
        term_pg_prefixed=False,
        check_timeout=477,
        comm_watchdog=930,
        optional="c10::optional",
        loop="workCleanupLoop",
        term_delay=(0.001, 0.005),
        agent_glog=False,
        agent_sigterm=836,
        agent_failed=821,
        monitor_interval_s=5.0,
        tb_lines=(346, 806, 797, 134, 264),
    ),
    "2.4": _TorchEraFormat(
        version="2.4.1",
        rank_prefix=True,
        glog_time=True,
        pg_prefix="[PG 0 (default_pg) Rank {r}]",
        wd=607,
        exc_det=1664,
        to_at=1709,
        fail_det=None,
        dump=None,
        desync=1722,
        desync_prefixed=True,
        some=621,
        avoid=627,
        some_prefixed=True,
        term=1515,
        term_msg="Process group watchdog thread terminated with exception: ",
        term_pg_prefixed=True,
        check_timeout=609,
        comm_watchdog=1521,
        optional="std::optional",
        loop="watchdogHandler",
        term_delay=(0.5, 2.5),
        agent_glog=True,
        agent_sigterm=897,
        agent_failed=869,
        monitor_interval_s=0.1,
        tb_lines=(348, 901, 892, 133, 264),
    ),
    "2.7": _TorchEraFormat(
        version="2.7.1",
        rank_prefix=True,
        glog_time=True,
        pg_prefix="[PG ID 0 PG GUID 0(default_pg) Rank {r}]",
        wd=632,
        exc_det=None,
        to_at=None,
        fail_det=2268,
        dump=(670, 2305, 1743, 1533),
        desync=2280,
        desync_prefixed=True,
        some=684,
        avoid=698,
        some_prefixed=True,
        term=1902,
        term_msg="Process group watchdog thread terminated with exception: ",
        term_pg_prefixed=True,
        check_timeout=635,
        comm_watchdog=1908,
        optional="std::optional",
        loop="watchdogHandler",
        term_delay=(1.0, 3.0),
        agent_glog=True,
        agent_sigterm=900,
        agent_failed=874,
        monitor_interval_s=0.1,
        tb_lines=(355, 892, 883, 139, 270),
    ),
}

# NCCL collective -> c10d OpType (opTypeToString) of what DeepSpeed/FSDP call:
# all_gather_into_tensor, reduce_scatter_tensor, all_reduce.
_OP_TYPE = {
    "AllGather": "_ALLGATHER_BASE",
    "ReduceScatter": "_REDUCE_SCATTER_BASE",
    "AllReduce": "ALLREDUCE",
}
_DS_COMM_OP = {
    "AllGather": "all_gather_into_tensor",
    "ReduceScatter": "reduce_scatter_tensor",
    "AllReduce": "all_reduce",
}
_TORCH_LIB = "/usr/local/lib/python3.10/dist-packages/torch/lib"
_PY_SITE = "/usr/local/lib/python3.10/dist-packages"
_PY_BINARY = "/usr/bin/python3"
_ENTRYPOINT = "train.py"
_GIB = 1 << 30
_HOST_RAM_GB = 2015.56  # psutil total of the (invented) hosts, for "percent ="
_DESYNC_WHY = (
    "This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used "
    "across ranks, the order of collectives is not same for all ranks or the scheduled "
    "collective, for some reason, didn't run. Additionally, this can be caused by GIL "
    "deadlock or other reasons such as network errors or bugs in the communications library "
    "(e.g. NCCL), etc. "
)


def _numel(op: str, count: int, nranks: int) -> tuple[int, int]:
    """NumelIn/NumelOut of a c10d work from the NCCL COLL count (send count for AllGather,
    receive count for ReduceScatter)."""
    if op == "AllGather":
        return count, count * nranks
    if op == "ReduceScatter":
        return count * nranks, count
    return count, count


def _convert_size(size_bytes: int) -> str:
    """DeepSpeed's ``convert_size`` (utils/comms_logging.py)."""
    if size_bytes == 0:
        return "0B"
    names = ("B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB")
    i = math.floor(math.log(size_bytes, 1024))
    return f"{round(size_bytes / math.pow(1024, i), 2)} {names[i]}"


def _ranks_str(ranks: list[int]) -> str:
    """c10d's ``ranksToString``: ``1, 2, 3``."""
    return ", ".join(str(r) for r in ranks)


def _rank_of(entry: dict[str, Json]) -> int:
    rank = entry["rank"]
    assert isinstance(rank, int)
    return rank


def _gb(value: float) -> float:
    """``round(bytes / 2**30, 2)``, as DeepSpeed prints memory."""
    return round(value / _GIB, 2)


@dataclass
class _Rec:
    """One write of hang-aftermath output: physical lines (prefix included, no '\\n').

    ``marks`` are (line offset in ``lines``, truth list, entry): once written, the entry
    gets the file and 1-based line number of that line and goes into the list.
    """

    t: float
    order: int
    sink: _Sink
    lines: list[str]
    marks: list[tuple[int, list[dict[str, Json]], dict[str, Json]]] = field(default_factory=list)
    owner: int = -1  # the rank whose process writes it (-1: a torchrun agent)
    desync: bool = False  # a desync report


class _Framework:
    """The PyTorch/DeepSpeed side of one job: its lines and, from them, its truth.

    It draws from its own random generator, so that the NCCL side of a job is the same
    whatever the framework writes.
    """

    def __init__(self, job: _Job) -> None:
        spec = job.spec
        self.job = job
        self.spec = spec
        self.ds = spec.framework == "deepspeed"
        self.rnd = random.Random(spec.seed * 7919 + 3)
        self.tf = _TORCH_ERA_FORMATS[spec.torch_era]
        self.df = _DS_ERA_FORMATS[spec.ds_era]
        self.timeout_s = spec.pg_timeout
        self.ds_sec = _SecondCache("%Y-%m-%d %H:%M:%S")
        self.lines = 0
        # --- truth, filled in as lines are written
        self.timer_lines: dict[str, int] = {}
        self.throughput_steps: list[int] = []
        self.memory_reports: list[dict[str, Json]] = []
        self.comms_rows: list[dict[str, Json]] = []
        self.timeouts: list[dict[str, Json]] = []
        self.failures: list[dict[str, Json]] = []
        self.terminated: list[int] = []
        self.desync_lagging: list[int] = []
        # --- the user's ds_config: HF-style "auto" sizes from the model's hidden size
        hidden = job.hidden
        self.stage = spec.zero_stage
        self.off_opt = spec.offload in ("optimizer", "both")
        self.off_param = spec.offload in ("param", "both")
        self.overlap = spec.zero_stage >= 2  # DeepSpeed's default is off for stage 1
        if self.stage == 3:
            self.reduce_bucket = hidden * hidden
            self.allgather_bucket = 500_000_000  # DeepSpeed's default (unused by stage 3)
            self.prefetch_bucket = hidden * hidden * 9 // 10
            self.persistence = 10 * hidden
        else:
            self.reduce_bucket = self.allgather_bucket = 200_000_000
            self.prefetch_bucket = 50_000_000
            self.persistence = 100_000
        self.micro_batch = self.rnd.choice((1, 2, 4, 8))
        self.batch = self.micro_batch * job.n
        # --- time model of a step as rank 0 sees it (module docstring)
        self.lateness = max(job.late)
        self.wait_slots: dict[str, int] = dict.fromkeys(
            (
                "fwd",
                "bwd_inner",
                "bwd_allreduce",
                "step",
                "optimizer_gradients",
                "optimizer_allgather",
            ),
            0,
        )
        for call in job.prog:
            for name in self._timers_of(call.phase):
                self.wait_slots[name] += 1
        step_share = 0.35 if self.off_opt else 0.08  # CPU Adam makes the optimizer step long
        # Stage 1 without overlap reduces after backward, inside allreduce_gradients().
        ar_share = 0.03 if (spec.zero12 and not self.overlap) else 0.0002
        rest = 1.0 - step_share - ar_share
        self.share = {
            "fwd": rest / 3,
            "bwd_inner": rest * 2 / 3,
            "bwd_allreduce": ar_share,
            "step": step_share,
        }
        self.step_wall_s = spec.step_time_s + len(job.prog) * self.lateness
        # One-off delays in the current step: seconds added to each timer, and in all.
        self.step_extra: dict[str, float] = {}
        self.step_push = 0.0
        self._tput_sum = 0.0
        self._tput_n = 0
        self.mem_final = 0.0  # bytes allocated when the engine is ready
        self.act_bytes = self.rnd.uniform(1.0, 4.0) * _GIB  # activations during a step
        self.cpu_used_gb = self.rnd.uniform(40.0, 120.0)
        self.config = self._user_config()

    # ---- DeepSpeed ----------------------------------------------------------------------

    def _timers_of(self, phase: str) -> tuple[str, ...]:
        """Timers a collective slot of this phase runs under (each gets its wait)."""
        if phase == "fwd":
            return ("fwd",)
        if phase == "bwd":
            return ("bwd_inner",)
        if phase == "reduce":
            # ZeRO reduces from backward hooks (inside bwd_inner) when it overlaps; ZeRO-1
            # without overlap reduces in allreduce_gradients() (bwd_allreduce), PART S 3.
            return ("bwd_inner",) if self.stage == 3 or self.overlap else ("bwd_allreduce",)
        if phase == "norm":
            return ("step", "optimizer_gradients") if self.spec.zero12 else ("step",)
        if phase == "optim_ag":
            return ("step", "optimizer_allgather")
        return ()

    def _user_config(self) -> dict[str, Json]:
        zero: dict[str, Json] = {
            "stage": self.stage,
            "overlap_comm": self.overlap,
            "contiguous_gradients": True,
            "reduce_bucket_size": self.reduce_bucket,
        }
        if self.stage == 3:
            zero["stage3_prefetch_bucket_size"] = self.prefetch_bucket
            zero["stage3_param_persistence_threshold"] = self.persistence
            zero["sub_group_size"] = 1_000_000_000
        else:
            zero["allgather_bucket_size"] = self.allgather_bucket
        if self.off_opt:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if self.off_param:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        cfg: dict[str, Json] = {
            "bf16": {"enabled": True},
            "gradient_accumulation_steps": 1,
            "gradient_clipping": 1.0,
            "optimizer": {
                "type": "AdamW",
                "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
            },
            "steps_per_print": self.spec.steps_per_print,
            "train_batch_size": self.batch,
            "train_micro_batch_size_per_gpu": self.micro_batch,
            "wall_clock_breakdown": True,
            "zero_optimization": zero,
        }
        if self.spec.comms_summary:
            cfg["comms_logger"] = {
                "enabled": True,
                "verbose": False,
                "prof_all": True,
                "debug": False,
            }
        return cfg

    def _ds_ts(self, t: float) -> str:
        sec = int(t)
        return f"[{self.ds_sec.get(sec)},{int((t - sec) * 1000):03d}]"

    def _ds_text(self, rk: _Rank, t: float, src: str, msg: str) -> str:
        """One DeepSpeed logger record: header on its first line only, prefix on each."""
        lines = f"{self._ds_ts(t + self.job.rank_off[rk.rank])} [INFO] [{src}] {msg}".split("\n")
        self.lines += len(lines)
        return "".join(f"{rk.head}{line}\n" for line in lines)

    def _zero_repr(self) -> str:
        """``zero_config`` as the pydantic model prints it: user values plain, DeepSpeed's
        own integer defaults (``pp_int``) comma-grouped."""
        cfg = self.config["zero_optimization"]
        assert isinstance(cfg, dict)

        def val(key: str, default: int) -> str:
            v = cfg.get(key)
            return str(v) if v is not None else f"{default:,}"

        off_param = (
            "DeepSpeedZeroOffloadParamConfig(device='cpu', nvme_path=None, buffer_count=5, "
            "buffer_size=100,000,000, max_in_cpu=1,000,000,000, pin_memory=True)"
            if self.off_param
            else "None"
        )
        off_opt = (
            "DeepSpeedZeroOffloadOptimizerConfig(device='cpu', nvme_path=None, buffer_count=4, "
            "pin_memory=True, pipeline_read=False, pipeline_write=False, fast_init=False, "
            "ratio=1.0)"
            if self.off_opt
            else "None"
        )
        new = self.df.newer_keys
        parts = [
            f"stage={self.stage}",
            "contiguous_gradients=True",
            "reduce_scatter=True",
            f"reduce_bucket_size={val('reduce_bucket_size', 500_000_000)}",
            *(["use_multi_rank_bucket_allreduce=True"] if new else []),
            "allgather_partitions=True",
            f"allgather_bucket_size={val('allgather_bucket_size', 500_000_000)}",
            f"overlap_comm={self.overlap}",
            "load_from_fp32_weights=True",
            "elastic_checkpoint=False",
            f"offload_param={off_param}",
            f"offload_optimizer={off_opt}",
            f"sub_group_size={val('sub_group_size', 1_000_000_000)}",
            "cpu_offload_param=None",
            "cpu_offload_use_pin_memory=None",
            "cpu_offload=None",
            f"prefetch_bucket_size={val('stage3_prefetch_bucket_size', 50_000_000)}",
            f"param_persistence_threshold={val('stage3_param_persistence_threshold', 100_000)}",
            "model_persistence_threshold=sys.maxsize",
            "max_live_parameters=1,000,000,000",
            "max_reuse_distance=1,000,000,000",
            "gather_16bit_weights_on_model_save=False",
            *(["use_all_reduce_for_fetch_params=False"] if new else []),
            "stage3_gather_fp16_weights_on_model_save=False",
            "ignore_unused_parameters=True",
            "legacy_stage1=False",
            "round_robin_gradients=False",
            "zero_hpz_partition_size=1",
            "zero_quantized_weights=False",
            "zero_quantized_nontrainable_weights=False",
            "zero_quantized_gradients=False",
            "mics_shard_size=-1",
            "mics_hierarchical_params_gather=False",
            "memory_efficient_linear=True",
            *(["pipeline_loading_checkpoint=False", "override_module_apply=True"] if new else []),
        ]
        return " ".join(parts)

    def _config_dump(self) -> list[tuple[str, str]]:
        """``DeepSpeedConfig.print``: the title, one line per attribute, then the json."""
        n = self.job.n
        # DeepSpeedConfigObject.__repr__ (ScientificNotationEncoder): ", " ends each line.
        act = (
            '{\n    "partition_activations": false, \n    "contiguous_memory_optimization": '
            'false, \n    "cpu_checkpointing": false, \n    "number_checkpoints": null, \n    '
            '"synchronize_checkpoint_boundary": false, \n    "profile": false\n}'
        )
        flops = (
            '{\n    "enabled": false, \n    "recompute_fwd_factor": 0.0, \n    "profile_step": 1, '
            '\n    "module_depth": -1, \n    "top_modules": 1, \n    "detailed": true, \n    '
            '"output_file": null\n}'
        )
        attrs: dict[str, str] = {
            "activation_checkpointing_config": act,
            "aio_config": (
                "{'block_size': 1048576, 'queue_depth': 8, 'thread_count': 1, "
                "'single_submit': False, 'overlap_events': True}"
            ),
            "amp_enabled": "False",
            "amp_params": "False",
            "bfloat16_enabled": "True",
            "checkpoint_parallel_write_pipeline": "False",
            "checkpoint_tag_validation_enabled": "True",
            "checkpoint_tag_validation_fail": "False",
            "comms_config": (
                "<deepspeed.comm.config.DeepSpeedCommsConfig object at "
                f"0x7f{self.rnd.getrandbits(40):010x}>"
            ),
            "communication_data_type": "None",
            "curriculum_enabled_legacy": "False",
            "curriculum_params_legacy": "False",
            "data_efficiency_enabled": "False",
            "dataloader_drop_last": "False",
            "disable_allgather": "False",
            "dump_state": "False",
            "dynamic_loss_scale_args": "None",
            "eigenvalue_enabled": "False",
            "eigenvalue_gas_boundary_resolution": "1",
            "eigenvalue_layer_name": "bert.encoder.layer",
            "eigenvalue_layer_num": "0",
            "eigenvalue_max_iter": "100",
            "eigenvalue_stability": "1e-06",
            "eigenvalue_tol": "0.01",
            "eigenvalue_verbose": "False",
            "elasticity_enabled": "False",
            "flops_profiler_config": flops,
            "fp16_auto_cast": "None",
            "fp16_enabled": "False",
            "fp16_master_weights_and_gradients": "False",
            "global_rank": "0",
            "grad_accum_dtype": "None",
            "gradient_accumulation_steps": "1",
            "gradient_clipping": "1.0",
            "gradient_predivide_factor": "1.0",
            "initial_dynamic_scale": "1",
            "load_universal_checkpoint": "False",
            "loss_scale": "1.0",
            "memory_breakdown": "False",
            "mics_hierarchial_params_gather": "False",
            "mics_shard_size": "-1",
            "monitor_config": (
                "tensorboard=TensorBoardConfig(enabled=False, output_path='', "
                "job_name='DeepSpeedJobName') wandb=WandbConfig(enabled=False, group=None, "
                "team=None, project='deepspeed') csv_monitor=CSVConfig(enabled=False, "
                "output_path='', job_name='DeepSpeedJobName') enabled=False"
            ),
            "optimizer_legacy_fusion": "False",
            "optimizer_name": "adamw",
            "optimizer_params": (
                "{'lr': 0.0003, 'betas': [0.9, 0.95], 'eps': 1e-08, 'weight_decay': 0.1}"
            ),
            "pld_enabled": "False",
            "pld_params": "False",
            "prescale_gradients": "False",
            "scheduler_name": "None",
            "scheduler_params": "None",
            "sparse_attention": "None",
            "sparse_gradients_enabled": "False",
            "steps_per_print": str(self.spec.steps_per_print),
            "train_batch_size": str(self.batch),
            "train_micro_batch_size_per_gpu": str(self.micro_batch),
            "use_node_local_storage": "False",
            "wall_clock_breakdown": "True",
            "weight_quantization_config": "None",
            "world_size": str(n),
            "zero_allow_untested_optimizer": "False",
            "zero_config": self._zero_repr(),
            "zero_enabled": "True",
            "zero_force_ds_cpu_optimizer": "True",
            "zero_optimization_stage": str(self.stage),
        }
        if self.df.newer_keys:
            attrs.update(
                {
                    "bfloat16_immediate_grad_update": "False",
                    "compile_config": "enabled=False backend='inductor' kwargs={}",
                    "graph_harvesting": "False",
                    "seq_parallel_communication_data_type": "torch.float32",
                    "timers_config": "enabled=True synchronized=True",
                    "use_data_before_expert_parallel_": "False",
                }
            )
        out = [(self.df.cfg_title, "DeepSpeedEngine configuration:")]
        # "  {} {} {}".format(arg, "." * (29 - len(arg)), value): no dots from 29 chars on.
        out += [
            (self.df.cfg_line, f"  {k} {'.' * (29 - len(k))} {attrs[k]}") for k in sorted(attrs)
        ]
        dumped = json.dumps(self.config, sort_keys=True, indent=4, separators=(",", ":"))
        out.append((self.df.cfg_json, f"  json = {dumped}"))
        return out

    def _memory_plan(self) -> list[tuple[str, float, float]]:
        """see_memory_usage reports at init: (label, GPU bytes allocated, host GB used)."""
        job = self.job
        n = job.n
        total = float(sum(job.params))  # elements
        shard = total / n
        rph = job.rph
        opt_gpu = 0.0 if self.off_opt else 12.0 * shard  # fp32 master + Adam moments
        opt_cpu = 12.0 * shard * rph / 1e9 if self.off_opt else 0.0  # every local rank's
        cpu = self.cpu_used_gb
        if self.stage == 3:
            w = 2.0 * shard  # zero.Init partitioned the bf16 weights at construction
            w_end = 0.05 * w if self.off_param else w
            cpu_param = 2.0 * shard * rph / 1e9 if self.off_param else 0.0
            plan = [
                ("Stage 3 initialize beginning", w, cpu),
                ("DeepSpeedZeRoOffload initialize [begin]", w, cpu),
                ("DeepSpeedZeRoOffload initialize [end]", w_end, cpu + cpu_param),
                ("Before creating fp16 partitions", w_end, cpu + cpu_param),
                ("After creating fp16 partitions: 1", w_end, cpu + cpu_param),
                ("Before creating fp32 partitions", w_end, cpu + cpu_param),
                (
                    "After creating fp32 partitions",
                    w_end + opt_gpu / 3,
                    cpu + cpu_param + opt_cpu / 3,
                ),
                (
                    "Before initializing optimizer states",
                    w_end + opt_gpu / 3,
                    cpu + cpu_param + opt_cpu / 3,
                ),
                ("After initializing optimizer states", w_end + opt_gpu, cpu + cpu_param + opt_cpu),
                (
                    "After initializing ZeRO optimizer",
                    w_end + opt_gpu + 2.0 * shard,
                    cpu + cpu_param + opt_cpu,
                ),
            ]
        else:
            w = 4.0 * total  # bf16 weights + their flat bf16 copy
            grads = 2.0 * shard if self.stage == 2 else 2.0 * total
            plan = [
                ("Before initializing optimizer states", w + opt_gpu / 3, cpu + opt_cpu / 3),
                ("After initializing optimizer states", w + opt_gpu, cpu + opt_cpu),
                ("After initializing ZeRO optimizer", w + opt_gpu + grads, cpu + opt_cpu),
            ]
        self.mem_final = plan[-1][1]
        return plan

    def _memory_report(self, label: str, ma: float, cpu_gb: float) -> list[tuple[str, str]]:
        r = self.rnd
        max_ma = ma * r.uniform(1.0, 1.15)
        ca = max_ma * r.uniform(1.02, 1.2) + 0.1 * _GIB
        max_ca = round(ca * r.uniform(1.0, 1.1) / _GIB)
        used = round(cpu_gb, 2)
        pct = round(100.0 * used / _HOST_RAM_GB, 1)
        rec: dict[str, Json] = {
            "label": label,
            "ma_gb": _gb(ma),
            "max_ma_gb": _gb(max_ma),
            "ca_gb": _gb(ca),
            "max_ca_gb": max_ca,
            "cpu_used_gb": used,
            "cpu_percent": pct,
        }
        self.memory_reports.append(rec)
        # A backslash-continued f-string: 9 spaces between fields, one at the end (D6).
        gap = " " * 9
        ma_line = (
            f"MA {_gb(ma)} GB{gap}Max_MA {_gb(max_ma)} GB{gap}CA {_gb(ca)} GB{gap}"
            f"Max_CA {max_ca} GB "
        )
        a, b, c = self.df.mem
        return [
            (a, label),
            (b, ma_line),
            (c, f"CPU Virtual Memory:  used = {used} GB, percent = {pct}%"),
        ]

    def _setup_msgs(self) -> list[tuple[str, str]]:
        """Engine set-up on rank 0, after the communicators, in DeepSpeed's order."""
        df = self.df
        dist = df.log_dist
        opt_cls = "DeepSpeedCPUAdam" if self.off_opt else "FusedAdam"
        opt_path = (
            "deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam"
            if self.off_opt
            else "deepspeed.ops.adam.fused_adam.FusedAdam"
        )
        out: list[tuple[str, str]] = [
            (dist, "[Rank 0] DeepSpeed Flops Profiler Enabled: False"),
            (dist, "[Rank 0] Using DeepSpeed Optimizer param name adamw as basic optimizer"),
            (dist, f"[Rank 0] DeepSpeed Basic Optimizer = {opt_cls}"),
            (
                df.zero_utils,
                f"Checking ZeRO support for optimizer={opt_cls} type=<class '{opt_path}'>",
            ),
            (dist, f"[Rank 0] Creating torch.bfloat16 ZeRO stage {self.stage} optimizer"),
        ]
        plan = self._memory_plan()
        if self.stage == 3:
            head, rest = plan[:1], plan[1:]
            for label, ma, cpu in head:
                out += self._memory_report(label, ma, cpu)
            out += [
                (f"stage3.py:{df.stage3}:__init__", f"Reduce bucket size {self.reduce_bucket}"),
                (
                    f"stage3.py:{df.stage3 + 1}:__init__",
                    f"Prefetch bucket size {self.prefetch_bucket}",
                ),
            ]
            for label, ma, cpu in rest:
                if label == "After initializing ZeRO optimizer":
                    out.append((df.stage3_opt, "optimizer state initialized"))
                out += self._memory_report(label, ma, cpu)
        else:
            src = "stage_1_and_2.py:{}:__init__"
            out += [
                (src.format(df.stage12), f"Reduce bucket size {self.reduce_bucket}"),
                (src.format(df.stage12 + 1), f"Allgather bucket size {self.allgather_bucket}"),
                (src.format(df.stage12 + 2), f"CPU Offload: {self.off_opt}"),
                (src.format(df.stage12 + 3), "Round robin gradient partitioning: False"),
            ]
            for label, ma, cpu in plan:
                out += self._memory_report(label, ma, cpu)
        out += [
            (dist, "[Rank 0] DeepSpeed Final Optimizer = adamw"),
            (dist, "[Rank 0] DeepSpeed using configured LR scheduler = None"),
            (dist, "[Rank 0] DeepSpeed LR Scheduler = None"),
            (dist, f"[Rank 0] step=0, skipped=0, lr=[{self._lr(0)!r}], mom=[(0.9, 0.95)]"),
        ]
        out += self._config_dump()
        return out

    def _lr(self, step: int) -> float:
        return 3e-4 * min(1.0, (step + 1) / 100)  # linear warm-up, as the noise prints it

    def init_events(self, events: list[list[tuple[float, str]]], steps_t0: float) -> None:
        """Add rank 0's DeepSpeed start-up lines to the init events (kept in time order)."""
        if not self.ds:
            return
        job = self.job
        rk = job.ranks[0]
        evs = events[0]
        # deepspeed.initialize() logs the version before anything creates a communicator.
        t = job.t_world_init - self.rnd.uniform(0.3, 0.6)
        msg = (
            f"[Rank 0] DeepSpeed info: version={self.df.version}, git-hash=unknown, "
            "git-branch=unknown"
        )
        evs.append((t, self._ds_text(rk, t, self.df.log_dist, msg)))
        # The rest fits in the 1.5 s between the last communicator and the first step.
        msgs = self._setup_msgs()
        t = steps_t0 - 1.45
        dt = 1.3 / len(msgs)
        for src, msg in msgs:
            evs.append((t, self._ds_text(rk, t, src, msg)))
            if src != self.df.cfg_line:  # the config dump is logged in one go
                t += dt
        evs.sort(key=lambda e: e[0])  # stable: NCCL lines keep their order

    def delayed(self, phase: str, push: float) -> None:
        """A one-off delay held the current step's slot of this phase up by ``push`` s."""
        for name in self._timers_of(phase):
            self.step_extra[name] = self.step_extra.get(name, 0.0) + push
        self.step_push += push

    def _timer_values(self) -> dict[str, float]:
        """Milliseconds of one step's timers (>= 0.10.1 names; micro and global)."""
        r = self.rnd
        st = self.spec.step_time_s
        late = self.lateness
        extra = self.step_extra

        def ms(name: str) -> float:
            wall = st * self.share[name] + self.wait_slots[name] * late + extra.get(name, 0.0)
            return wall * 1000.0 * r.uniform(0.97, 1.03)

        fwd, bi, ba, stp = ms("fwd"), ms("bwd_inner"), ms("bwd_allreduce"), ms("step")
        micro = {
            "fwd_microstep": fwd,
            "bwd_microstep": bi + ba + r.uniform(0.05, 0.5),  # bwd = inner + allreduce + hooks
            "bwd_inner_microstep": bi,
            "bwd_allreduce_microstep": ba,
            "step_microstep": stp,
        }
        out = dict(micro)
        for name, v in micro.items():  # one accumulation step: global ~ micro + overhead
            out[name.removesuffix("_microstep")] = v + r.uniform(0.01, 0.08)
        step_c = st * self.share["step"] * 1000.0
        if self.spec.zero12:
            out["optimizer_allgather"] = (
                step_c * 0.2
                + self.wait_slots["optimizer_allgather"] * late * 1000.0
                + extra.get("optimizer_allgather", 0.0) * 1000.0
            ) * r.uniform(0.97, 1.03)
            out["optimizer_gradients"] = (
                step_c * 0.15
                + self.wait_slots["optimizer_gradients"] * late * 1000.0
                + extra.get("optimizer_gradients", 0.0) * 1000.0
            ) * r.uniform(0.97, 1.03)
            out["optimizer_step"] = step_c * 0.6 * r.uniform(0.97, 1.03)
        else:
            out["optimizer_step"] = step_c * 0.7 * r.uniform(0.97, 1.03)
        if "optimizer_step" in extra:
            out["optimizer_step"] += extra["optimizer_step"] * 1000.0
        return out

    def _timer_msg(self, names: tuple[str, ...], values: dict[str, float]) -> str:
        """``SynchronizedWallClockTimer.log``: ``time (ms) | name: 1.23 | ...``."""
        text = self.df.timer_head
        for name in names:
            text += f" | {name}: {values[_DS_RENAMES.get(name, name)]:.2f}"
            key = _DS_RENAMES.get(name, name)
            self.timer_lines[key] = self.timer_lines.get(key, 0) + 1
        return f"[Rank 0] {text}"

    def step_done(self, gstep: int, t: float) -> int:
        """Rank 0's lines at the end of global step ``gstep``; return the characters added."""
        try:
            return self._step_lines(gstep, t)
        finally:
            self.step_extra = {}
            self.step_push = 0.0

    def _step_lines(self, gstep: int, t: float) -> int:
        if not self.ds:
            return 0
        job = self.job
        rk = job.ranks[0]
        df = self.df
        r = self.rnd
        values = self._timer_values()
        msgs: list[tuple[str, str]] = []
        # The optimizer logs its timers inside engine.step(), before the engine's own.
        opt: tuple[str, ...] = ("optimizer_step",)
        if self.spec.zero12:
            opt = ("optimizer_allgather", "optimizer_gradients", "optimizer_step")
        msgs.append((df.log_dist, self._timer_msg(opt, values)))
        cur = self.batch / ((self.step_wall_s + self.step_push) * r.uniform(0.98, 1.02))
        if gstep >= 2:  # ThroughputTimer starts counting at start_step=2
            self._tput_sum += cur
            self._tput_n += 1
        if gstep % self.spec.steps_per_print == 0:
            lr = self._lr(gstep)
            msgs.append(
                (df.log_dist, f"[Rank 0] step={gstep}, skipped=0, lr=[{lr!r}], mom=[(0.9, 0.95)]")
            )
            avg = self._tput_sum / self._tput_n if self._tput_n else float("-inf")
            ma = self.mem_final + self.act_bytes * r.uniform(0.1, 0.3)
            peak = self.mem_final + self.act_bytes * r.uniform(1.0, 1.2)
            msgs.append(
                (
                    df.timer_stop,
                    f"epoch=0/micro_step={gstep}/global_step={gstep}, "
                    f"RunningAvgSamplesPerSec={avg!r}, CurrSamplesPerSec={cur!r}, "
                    f"MemAllocated={_gb(ma)}GB, MaxMemAllocated={_gb(peak)}GB",
                )
            )
            self.throughput_steps.append(gstep)
        msgs.append((df.log_dist, self._timer_msg(df.micro, values)))
        msgs.append((df.log_dist, self._timer_msg(df.glob, values)))
        text = "".join(
            self._ds_text(rk, t + 0.0002 * k, src, msg) for k, (src, msg) in enumerate(msgs)
        )
        job.rank_sink[0].add(text)
        job._touch(t + 0.0002 * len(msgs))
        return len(text)

    def end_events(self, events: list[list[tuple[float, str]]]) -> None:
        """The comms-logger summary (rank 0, plain print) before the communicators go."""
        if not (self.ds and self.spec.comms_summary):
            return
        job = self.job
        n = job.n
        world_calls = [c for c in job.prog if c.world]
        full, part = divmod(job.world.seq, len(world_calls))
        counts: dict[str, dict[int, int]] = {}  # op -> size -> calls, in first-call order
        for k, call in enumerate(world_calls):
            calls = full + (1 if k < part else 0)
            if not calls:
                continue
            size = call.count_of(n) * (2 if call.dtype == _BF16 else 4)
            per = counts.setdefault(_DS_COMM_OP[call.op], {})
            per[size] = per.get(size, 0) + calls
        r = self.rnd
        wait = self.lateness - job.late[0]  # the logger's latency includes waiting for peers
        lines = [
            f"{'Comm. Op': <20}{'Message Size': <20}{'Count': <20}{'Total Latency(ms)': <20}"
            f"{'Avg Latency(ms)': <20}{'tput_avg (Gbps)': <20}{'busbw_avg (Gbps)': <20}"
        ]
        for op, sizes in counts.items():
            lines.append(op)
            for size, count in sorted(sizes.items()):
                moved = size * n if op != "all_reduce" else 2 * size  # calc_bw_log
                lat_s = (2e-5 + moved / 20e9 + wait) * r.uniform(0.97, 1.03)
                algbw = moved * 8 / 1e9 / lat_s
                busbw = algbw * (n - 1) / n
                total = lat_s * 1000.0 * count * r.uniform(0.99, 1.01)
                lines.append(
                    f"{' ': <20}{_convert_size(size): <20}{count: <20}{total: <20.2f}"
                    f"{lat_s * 1000.0: <20.2f}{algbw: <20.2f}{busbw: <20.2f}"
                )
                self.comms_rows.append(
                    {
                        "op": op,
                        "msg_size_bytes": size,
                        "msg_size": _convert_size(size),
                        "count": count,
                    }
                )
        head = job.ranks[0].head
        self.lines += len(lines)
        t = job.last_t + 0.2  # _end_events starts 0.5 s after the last line
        events[0].append((t, "".join(f"{head}{line}\n" for line in lines)))
        events[0].sort(key=lambda e: e[0])

    # ---- PyTorch: what a hang turns into ------------------------------------------------

    def _glog(self, sev: str, t: float, line: int) -> str:
        src = f"ProcessGroupNCCL.cpp:{line}"
        if not self.tf.glog_time:
            return f"[{sev} {src}]"
        sec = int(t)
        tm = time.gmtime(sec)
        ns = int((t - sec) * 1e6) * 1000 + self.rnd.randrange(1000)
        # c10's glog header: month not zero-padded ("E314" = March 14), nanoseconds.
        return (
            f"[{sev}{tm.tm_mon}{tm.tm_mday:02d} {tm.tm_hour:02d}:{tm.tm_min:02d}:"
            f"{tm.tm_sec:02d}.{ns:09d} {src}]"
        )

    def _c10(self, rk: _Rank, t: float, line: int, msg: str) -> str:
        """A C++ LOG(ERROR) line of ``rk``: launcher prefix, [rankG]:, glog header, message."""
        pre = f"[rank{rk.rank}]:" if self.tf.rank_prefix else ""
        return f"{rk.head}{pre}{self._glog('E', t + self.job.rank_off[rk.rank], line)} {msg}"

    def _frames(self, rk: _Rank, bases: dict[str, int], where: str, line: int) -> list[str]:
        """``Exception raised from <where> at ...:<line>`` and its stack (c10::Error)."""
        tf = self.tf
        libc10 = f"{_TORCH_LIB}/libc10.so"
        cuda = f"{_TORCH_LIB}/libtorch_cuda.so"
        cxx = "/lib/x86_64-linux-gnu/libstdc++.so.6"
        libc = "/lib/x86_64-linux-gnu/libc.so.6"
        if where == "checkTimeout":
            stack = [
                ("c10::Error::Error(c10::SourceLocation, std::string)", 0x96, libc10, "c10"),
                (
                    "c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout("
                    f"{tf.optional}<std::chrono::duration<long, std::ratio<1l, 1000l> > >)",
                    0x1D2,
                    cuda,
                    "cuda",
                ),
                (f"c10d::ProcessGroupNCCL::{tf.loop}()", 0x233, cuda, "cuda"),
                ("c10d::ProcessGroupNCCL::ncclCommWatchdog()", 0x10C, cuda, "cuda"),
            ]
        else:
            stack = [
                ("c10::Error::Error(c10::SourceLocation, std::string)", 0x96, libc10, "c10"),
                ("<unknown function>", 0xE5AA84, cuda, "cuda"),
            ]
        stack += [
            ("<unknown function>", 0xDC253, cxx, "cxx"),
            ("<unknown function>", 0x94AC3, libc, "libc"),
            ("clone", 0x44, libc, "libc"),
        ]
        out = [
            f"{rk.head}Exception raised from {where} at "
            f"../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:{line} (most recent call first):"
        ]
        for k, (func, off, lib, key) in enumerate(stack):
            # "<unknown function> + off" is an offset into the library; a named one is an
            # offset into the function, placed at an invented (fixed) spot in the library.
            start = 0 if func == "<unknown function>" else zlib.crc32(func.encode()) & 0xFFF000
            out.append(
                f"{rk.head}frame #{k}: {func} + 0x{off:x} (0x{bases[key] + start + off:x} in {lib})"
            )
        out.append(f"{rk.head}")
        return out

    def _work(self, seq: int, op: str, nin: int, nout: int) -> str:
        t_ms = round(self.timeout_s * 1000)
        return (
            f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={nin}, NumelOut={nout}, "
            f"Timeout(ms)={t_ms})"
        )

    def _desync(
        self,
        me: int,
        seq: int,
        ops: dict[int, str],
        prev_ops: dict[int, str],
        ahead: dict[int, str],
    ) -> tuple[list[str], list[int]]:
        """TraceUtils.h ``retrieveDesyncReport`` as ``me`` sees it: its lines after the
        header line, and the ranks it names as lagging.

        ``ahead``: ranks whose last started collective is one further (an extra call), with
        its op. The report then names the others, who are behind them, as lagging.
        """
        job = self.job
        skipped = sorted(job.skipped)
        lines = [f"\t - [{me}] Timeout at collective: {ops[me]}, #{seq}"]
        if skipped and seq == 1:  # the stopped ranks never wrote a trace key
            lines.append(
                f"\t - To our best knowledge, ranks [{_ranks_str(skipped)}] are the lagging "
                "ranks that caused this timeout. They never joined any collectives"
            )
            return lines, skipped
        # seq -> rank -> (op, finished): the last collective each rank started (count from 1)
        trace: dict[int, dict[int, tuple[str, bool]]] = {}
        for r in range(job.n):
            if r in job.skipped:
                trace.setdefault(seq - 1, {})[r] = (prev_ops[r], True)
            elif r in ahead:
                trace.setdefault(seq + 1, {})[r] = (ahead[r], False)
            else:
                trace.setdefault(seq, {})[r] = (ops[r], False)
        lag = min(trace)
        started = sorted(r for r, (_, done) in trace[lag].items() if not done)
        ended = sorted(r for r, (_, done) in trace[lag].items() if done)
        lines.append(
            "\t - To our best knowledge, the lagging/dead/mismatched ranks that caused the "
            "desync are:"
        )
        if started:
            lines.append(
                f"\t   - [{_ranks_str(started)}] joined but didn't finish collective #{lag} "
                "(count from 1)"
            )
        if ended:
            lines.append(
                f"\t     [{_ranks_str(ended)}] finished collective #{lag}, but didn't join "
                f"collective #{lag + 1} (count from 1)"
            )
        lines.append("\t - Snapshot of ranks' latest states:")
        for s in sorted(trace):
            for done, verb in ((False, "started"), (True, "finished")):
                by_op: dict[str, list[int]] = {}
                for r, (op, d) in sorted(trace[s].items()):
                    if d == done:
                        by_op.setdefault(op, []).append(r)
                if by_op:
                    lines.append(f"\t   #{s} {verb} ranks:")
                    lines += [f"\t     [{_ranks_str(by_op[o])}] {verb} {o}" for o in sorted(by_op)]
        return lines, ended or started

    def _rank_op(self, instance: int, rank: int) -> tuple[str, int]:
        """(NCCL op, count) that ``rank`` issued at world instance ``instance``."""
        job = self.job
        call = job._world_call(instance)
        op, count = call.op, call.count_of(job.n)
        for f in self.spec.faults:
            if isinstance(f, Mismatch) and f.rank == rank and f.at_instance == instance:
                if f.field == "op":
                    op = _OTHER_OP[op]
                elif f.field == "count":
                    count *= 2
            if isinstance(f, ExtraCollective) and f.rank == rank and f.at_instance == instance:
                return "AllReduce", 1  # its work at this sequence is the extra call
        return op, count

    def hang(self) -> None:
        """The job hung at world instance ``halt_at``: watchdogs fire, ranks abort, agents
        report. Written in time order through the sinks, line numbers kept for the truth."""
        job = self.job
        n = job.n
        halt = job.halt_at
        seq = halt + 1  # SeqNum: collectives this rank issued on the world PG, from 1
        waiting = [r for r in range(n) if r not in job.skipped]
        if not waiting and not job.dead_at_halt:
            return
        tf = self.tf
        r_ = self.rnd
        ops = {r: _OP_TYPE[self._rank_op(halt, r)[0]] for r in waiting}
        prev_ops = {r: _OP_TYPE[self._rank_op(halt - 1, r)[0]] for r in job.skipped if halt >= 1}
        # An extra-calling rank has enqueued its real call too: one work further.
        ahead = {r: _OP_TYPE[job._world_call(halt).op] for r in job.extra_at_halt}
        comp = seq - 1 if seq > 1 else -1
        recs: list[_Rec] = []
        exits: dict[int, float] = {}
        codes: dict[int, int] = {}  # exit code of each exit other than the watchdog's -6
        lagging: list[int] = []  # the ranks every desync report names
        for r in waiting:
            rk = job.ranks[r]
            sink = job.rank_sink[r]
            enq = seq + 1 if r in ahead else seq
            op, count = self._rank_op(halt, r)
            nin, nout = _numel(op, count, n)
            ran = round(self.timeout_s * 1000) + r_.randint(3, 99)
            t = job.halt_times[r] + ran / 1000.0
            pg = tf.pg_prefix.format(r=r)
            wd = (
                f"[Rank {r}] Watchdog caught collective operation timeout: "
                f"{self._work(seq, ops[r], nin, nout)} ran for {ran} milliseconds before "
                "timing out."
            )
            entry: dict[str, Json] = {
                "rank": r,
                "global_rank": r,
                "host": rk.host,
                "pid": rk.pid,
                "seq": seq,
                "op": ops[r],
                "numel_in": nin,
                "numel_out": nout,
                "timeout_s": self.timeout_s,
                "ran_for_ms": ran,
                "last_enqueued": enq,
                "last_completed": comp,
            }
            watchdog = [self._c10(rk, t, tf.wd, wd)]
            if tf.exc_det is not None:
                watchdog.append(
                    self._c10(
                        rk,
                        t + 0.0002,
                        tf.exc_det,
                        f"{pg} Exception (either an error or timeout) detected by watchdog at "
                        f"work: {seq}, last enqueued NCCL work: {enq}, last completed NCCL "
                        f"work: {comp}.",
                    )
                )
            if tf.to_at is not None:
                watchdog.append(
                    self._c10(
                        rk,
                        t + 0.0003,
                        tf.to_at,
                        f"{pg} Timeout at NCCL work: {seq}, last enqueued NCCL work: {enq}, "
                        f"last completed NCCL work: {comp}.",
                    )
                )
            if tf.fail_det is not None and tf.dump is not None:
                watchdog += [
                    self._c10(
                        rk,
                        t + 0.0002,
                        tf.fail_det,
                        f"{pg}  failure detected by watchdog at work sequence id: {seq} PG "
                        f"status: last enqueued work: {enq}, last completed work: {comp}",
                    ),
                    self._c10(
                        rk,
                        t + 0.0003,
                        tf.dump[0],
                        "Stack trace of the failed collective not found, potentially because "
                        "FlightRecorder is disabled. You can enable it by setting "
                        "TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.",
                    ),
                ]
            recs.append(_Rec(t, len(recs), sink, watchdog, [(0, self.timeouts, entry)], r))
            t_next = t + 0.0005
            if self.spec.desync_report:
                report, lagging = self._desync(r, seq, ops, prev_ops, ahead)
                # LOG(ERROR) << [logPrefix() <<] report: the report starts with "\n", so
                # the header line ends in a space.
                head = f"{pg} " if tf.desync_prefixed else ""
                lines = [self._c10(rk, t_next, tf.desync, head), *(rk.head + x for x in report)]
                recs.append(_Rec(t_next, len(recs), sink, lines, owner=r, desync=True))
                t_next += 0.05  # the report reads every rank's key from the store
            if tf.dump is not None:
                recs.append(
                    _Rec(
                        t_next,
                        len(recs),
                        sink,
                        [
                            self._c10(
                                rk,
                                t_next,
                                tf.dump[1],
                                f"{pg} First PG on this rank to signal dumping.",
                            )
                        ],
                        owner=r,
                    )
                )
                t_mon = t_next + r_.uniform(0.005, 0.5)  # the heartbeat monitor thread
                recs.append(
                    _Rec(
                        t_mon,
                        len(recs),
                        sink,
                        [
                            self._c10(
                                rk,
                                t_mon,
                                tf.dump[2],
                                f"{pg} Received a dump signal due to a collective timeout from "
                                "this local rank and we will try our best to dump the debug "
                                f"info. Last enqueued NCCL work: {enq}, last completed NCCL "
                                f"work: {comp}.{_DESYNC_WHY}",
                            ),
                            self._c10(
                                rk,
                                t_mon + 0.0001,
                                tf.dump[3],
                                f"{pg} ProcessGroupNCCL preparing to dump debug info. Include "
                                "stack trace: 1",
                            ),
                        ],
                        owner=r,
                    )
                )
            rank_pre = f"[Rank {r}] " if tf.some_prefixed else ""
            t_some = t_next + r_.uniform(*tf.term_delay)
            recs.append(
                _Rec(
                    t_some,
                    len(recs),
                    sink,
                    [
                        self._c10(
                            rk,
                            t_some,
                            tf.some,
                            f"{rank_pre}Some NCCL operations have failed or timed out. Due to "
                            "the asynchronous nature of CUDA kernels, subsequent GPU operations "
                            "might run on corrupted/incomplete data.",
                        ),
                        self._c10(
                            rk,
                            t_some + 0.0001,
                            tf.avoid,
                            f"{rank_pre}To avoid data inconsistency, we are taking the entire "
                            "process down.",
                        ),
                    ],
                    owner=r,
                )
            )
            bases = {
                "c10": 0x7F0000000000 + r_.getrandbits(28) * 0x1000,
                "cuda": 0x7F0000000000 + r_.getrandbits(28) * 0x1000,
                "cxx": 0x7F0000000000 + r_.getrandbits(28) * 0x1000,
                "libc": 0x7F0000000000 + r_.getrandbits(28) * 0x1000,
            }
            term = (f"{pg} " if tf.term_pg_prefixed else f"[Rank {r}] ") + tf.term_msg + wd
            t_term = t_some + 0.001
            ct = self._frames(rk, bases, "checkTimeout", tf.check_timeout)
            nw = self._frames(rk, bases, "ncclCommWatchdog", tf.comm_watchdog)
            lines = [self._c10(rk, t_term, tf.term, term), *ct]
            lines += [
                f"{rk.head}terminate called after throwing an instance of 'c10::DistBackendError'",
                f"{rk.head}  what():  {term}",
                *ct,
                *nw,
            ]
            recs.append(_Rec(t_term, len(recs), sink, lines, owner=r))
            exits[r] = t_term + r_.uniform(0.05, 0.3)  # SIGABRT
        for r, dead in job.dead_at_halt.items():  # died before the collective: no line
            exits[r] = job.death_times[r]
            codes[r] = dead.exit_code
        kills = self._agents(exits, recs, codes)
        # SIGTERM ends a process at once (no handler in the workers): nothing after it.
        recs = [rec for rec in recs if rec.t <= kills.get(rec.owner, math.inf)]
        if any(rec.desync for rec in recs):
            self.desync_lagging = lagging
        job._flush_all()
        recs.sort(key=lambda rec: (rec.t, rec.order))
        for rec in recs:
            sink = rec.sink
            base = sink.lines + sink.pending_lines()
            for off, dest, entry in rec.marks:
                entry["path"] = sink.rel
                entry["line_no"] = base + off + 1
                dest.append(entry)
            sink.add("".join(f"{line}\n" for line in rec.lines))
            self.lines += len(rec.lines)
            job._touch(rec.t)
        self.timeouts.sort(key=_rank_of)
        self.failures.sort(key=_rank_of)

    def _agent_head(self, sev: str, t: float, pid: int, line: int) -> str:
        sec = int(t)
        ms = int((t - sec) * 1000)
        tm = time.gmtime(sec)
        if self.tf.agent_glog:  # torch's Python glog format (>= 2.4): month zero-padded
            return (
                f"{sev}{tm.tm_mon:02d}{tm.tm_mday:02d} {tm.tm_hour:02d}:{tm.tm_min:02d}:"
                f"{tm.tm_sec:02d}.{ms:03d}000 {pid} "
                f"torch/distributed/elastic/multiprocessing/api.py:{line}] "
            )
        level = {"W": "WARNING", "E": "ERROR"}[sev]
        return (
            f"[{self.ds_sec.get(sec)},{ms:03d}] torch.distributed.elastic.multiprocessing.api: "
            f"[{level}] "
        )

    def _agents(
        self, exits: dict[int, float], recs: list[_Rec], codes: dict[int, int]
    ) -> dict[int, float]:
        """Each host's torchrun agent: SIGTERM to what still runs, then ChildFailedError.

        ``exits``: when each exiting rank's process ended; ``codes``: its exit code where it
        is not the watchdog's SIGABRT (-6). Returns when each SIGTERMed rank was killed.
        """
        kills: dict[int, float] = {}
        job = self.job
        tf = self.tf
        r_ = self.rnd
        used = {rk.pid for rk in job.ranks}
        for h in range(self.spec.hosts):
            members = job.ranks[h * job.rph : (h + 1) * job.rph]
            dead = [rk for rk in members if rk.rank in exits]
            if not dead:  # nothing on this host exited: its agent has nothing to report
                continue
            # The agent polls every monitor interval; what has exited by then has failed.
            t_poll = min(exits[rk.rank] for rk in dead) + r_.uniform(0.0, tf.monitor_interval_s)
            failed = [rk for rk in dead if exits[rk.rank] <= t_poll]
            alive = [rk for rk in members if rk not in failed]
            # One poll stamps every failure alike, so min(timestamp) is the first one
            # inserted: the lowest local rank.
            root = failed[0]
            pid = r_.randrange(10000, 999999)
            while pid in used:
                pid = r_.randrange(10000, 999999)
            used.add(pid)
            host = members[0].host
            if job.combined:
                sink = job.sinks[0]
                head = f"{host}: " if self.spec.launcher == "pdsh" else ""
            else:
                rel = f"{host}.{pid}.log"
                sink = _Sink(job.out_dir / rel, rel)
                job.sinks.append(sink)
                head = ""
            off = job.host_off[h]  # the agent prints with its host's clock
            lines = [
                f"{head}{self._agent_head('W', t_poll + off, pid, tf.agent_sigterm)}"
                f"Sending process {rk.pid} closing signal SIGTERM"
                for rk in alive
            ]
            if lines:
                recs.append(_Rec(t_poll, len(recs), sink, lines))
            self.terminated += [rk.rank for rk in alive]
            kills.update((rk.rank, t_poll) for rk in alive)
            t_fail = t_poll + r_.uniform(0.2, 1.5)  # after the SIGTERMed ones are gone
            recs.append(
                _Rec(
                    t_fail,
                    len(recs),
                    sink,
                    [
                        f"{head}{self._agent_head('E', t_fail + off, pid, tf.agent_failed)}failed "
                        f"(exitcode: {codes.get(root.rank, -6)}) local_rank: {root.local} "
                        f"(pid: {root.pid}) of binary: {_PY_BINARY}"
                    ],
                )
            )
            block, marks = self._child_failed(failed, root, t_poll + off, codes)
            t_block = t_fail + 0.002
            recs.append(
                _Rec(
                    t_block,
                    len(recs),
                    sink,
                    [f"{head}{x}" for x in block],
                    [(off, self.failures, entry) for off, entry in marks],
                )
            )
        self.terminated.sort()
        return kills

    def _child_failed(
        self, failed: list[_Rank], root: _Rank, t_printed: float, codes: dict[int, int]
    ) -> tuple[list[str], list[tuple[int, dict[str, Json]]]]:
        """torchrun's traceback and ChildFailedError block (errors/__init__.py templates);
        ``t_printed`` is the agent's poll time on its host's clock."""
        a, b, c, d, e = self.tf.tb_lines
        dist = f"{_PY_SITE}/torch/distributed"
        lines = [
            "Traceback (most recent call last):",
            '  File "/usr/local/bin/torchrun", line 8, in <module>',
            "    sys.exit(main())",
            f'  File "{dist}/elastic/multiprocessing/errors/__init__.py", line {a}, in wrapper',
            "    return f(*args, **kwargs)",
            f'  File "{dist}/run.py", line {b}, in main',
            "    run(args)",
            f'  File "{dist}/run.py", line {c}, in run',
            "    elastic_launch(",
            f'  File "{dist}/launcher/api.py", line {d}, in __call__',
            "    return launch_agent(self._config, self._entrypoint, list(args))",
            f'  File "{dist}/launcher/api.py", line {e}, in launch_agent',
            "    raise ChildFailedError(",
            # The message starts with "\n": the class name line ends in ": ".
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        ]
        stamp = time.strftime("%Y-%m-%d_%H:%M:%S", time.gmtime(int(t_printed)))
        fmts: dict[int, list[str]] = {}
        for idx, rk in enumerate(failed):  # [idx] is the failure's index, not its rank
            code = codes.get(rk.rank, -6)
            fmts[rk.rank] = [
                f"[{idx}]:",
                f"  time      : {stamp}",
                f"  host      : {rk.host}",
                f"  rank      : {rk.rank} (local_rank: {rk.local})",
                f"  exitcode  : {code} (pid: {rk.pid})",
                "  error_file: <N/A>",
                f"  traceback : Signal {-code} ({_SIGNAME[-code]}) received by PID {rk.pid}",
            ]
        title = f"{_ENTRYPOINT} FAILED"
        width = min(max(len(title), *(len(x) for f in fmts.values() for x in f)), 60)
        lines += ["=" * width, title, "-" * width, "Failures:"]
        marks: list[tuple[int, dict[str, Json]]] = []

        def entry(rk: _Rank) -> dict[str, Json]:
            code = codes.get(rk.rank, -6)
            return {
                "rank": rk.rank,
                "local_rank": rk.local,
                "host": rk.host,
                "pid": rk.pid,
                "exitcode": code,
                "signal": _SIGNAME[-code],
                "root_cause": rk is root,
            }

        others = [rk for rk in failed if rk is not root]
        for rk in others:
            marks.append((len(lines), entry(rk)))
            lines += fmts[rk.rank]
        if not others:
            lines.append("  <NO_OTHER_FAILURES>")
        lines += ["-" * width, "Root Cause (first observed failure):"]
        marks.append((len(lines), entry(root)))
        lines += fmts[root.rank]
        lines.append("=" * width)
        return lines, marks

    # ---- truth ------------------------------------------------------------------------

    def truth(self) -> dict[str, Json]:
        """What the framework wrote (``truth.json`` key ``framework``).

        ``name``, ``torch_era``, ``torch_version``; DeepSpeed only: ``deepspeed_version``,
        ``zero`` (stage, offload_optimizer/offload_param "cpu"|"none", overlap_comm,
        reduce_bucket_size, allgather_bucket_size), ``steps_per_print``,
        ``train_batch_size``. Then ``timeout_s``; ``lines`` (framework lines written);
        ``timer_lines`` (values written per timer, >= 0.10.1 names); ``straggler_ms_per_step``
        (what the slowest rank's lateness adds to each timer per step);
        ``throughput_steps``; ``memory_reports`` (as printed); ``comms_summary`` rows;
        ``timeouts`` (one per watchdog line written, with its file and line); ``failures``
        (one per ChildFailedError entry, line of its ``[idx]:``); ``terminated`` (ranks
        SIGTERMed by their agent); ``desync_lagging`` (ranks the desync reports name).
        """
        spec = self.spec
        out: dict[str, Json] = {
            "name": spec.framework,
            "torch_era": spec.torch_era,
            "torch_version": self.tf.version,
        }
        if self.ds:
            out["deepspeed_version"] = self.df.version
            out["zero"] = {
                "stage": self.stage,
                "offload_optimizer": "cpu" if self.off_opt else "none",
                "offload_param": "cpu" if self.off_param else "none",
                "overlap_comm": self.overlap,
                "reduce_bucket_size": self.reduce_bucket,
                "allgather_bucket_size": self.allgather_bucket,
            }
            out["steps_per_print"] = spec.steps_per_print
            out["train_batch_size"] = self.batch
        out["timeout_s"] = self.timeout_s
        out["lines"] = self.lines
        out["timer_lines"] = dict(sorted(self.timer_lines.items()))
        straggler: dict[str, Json] = {}
        if self.ds:
            late_ms = self.lateness * 1000.0
            for name in sorted(self.timer_lines):
                base = name.removesuffix("_microstep")
                slots = (
                    self.wait_slots["bwd_inner"] + self.wait_slots["bwd_allreduce"]
                    if base == "bwd"
                    else self.wait_slots.get(base, 0)
                )
                straggler[name] = round(slots * late_ms, 6)
        out["straggler_ms_per_step"] = straggler
        out["throughput_steps"] = list(self.throughput_steps)
        out["memory_reports"] = list(self.memory_reports)
        out["comms_summary"] = list(self.comms_rows)
        out["timeouts"] = list(self.timeouts)
        out["failures"] = list(self.failures)
        out["terminated"] = list(self.terminated)
        out["desync_lagging"] = list(self.desync_lagging)
        return out


# --------------------------------------------------------------------------------------
# The generator
# --------------------------------------------------------------------------------------

_OTHER_OP = {"AllGather": "ReduceScatter", "ReduceScatter": "AllGather", "AllReduce": "AllGather"}


def _other_dtype(dtype: int) -> int:
    return _FP32 if dtype == _BF16 else _BF16


class _Job:
    """All state of one generation run."""

    def __init__(self, spec: SynthSpec, out_dir: Path) -> None:
        self.spec = spec
        self.out_dir = out_dir
        self.era = _ERA_FORMATS[spec.era]
        self.rnd = random.Random(spec.seed)
        self.n = spec.ranks
        self.rph = spec.ranks_per_host
        self.multi = spec.hosts > 1
        self.combined = spec.layout == "combined"
        self.t0 = _parse_start(spec.start_time)
        self.info_sec = _SecondCache("[%Y-%m-%d %H:%M:%S")
        self.first_t = math.inf
        self.last_t = self.t0
        self.ranks = self._make_ranks()
        # Host clock offsets draw from their own generator (every other draw stays as it
        # was); printed time = true time + offset of the printing process's host.
        clock_rnd = random.Random(spec.seed * 7919 + 4)
        m = spec.clock_offset_max_s
        self.host_off = [clock_rnd.uniform(-m, m) if m > 0 else 0.0 for _ in range(spec.hosts)]
        if spec.clock_offsets_s:
            self.host_off = list(spec.clock_offsets_s)
        self.rank_off = [self.host_off[rk.host_index] for rk in self.ranks]
        self.world, self.host_comms = self._make_comms()
        self.comms = [self.world, *self.host_comms]
        self.prog = self._program()
        self.late = [0.0] * self.n
        for f in spec.faults:
            if isinstance(f, SlowRank):
                self.late[f.rank] = f.lateness_s
        # Slow spells (SlowHost, SlowSpell): the ranks each slows down, and per spell the
        # true times of the first and last slot it delayed and the largest delay.
        self.spells: list[tuple[SlowHost | SlowSpell, list[int]]] = [
            (
                f,
                [rk.rank for rk in self.ranks if rk.host == f.host]
                if isinstance(f, SlowHost)
                else [f.rank],
            )
            for f in spec.faults
            if isinstance(f, SlowHost | SlowSpell)
        ]
        self.spell_seen: list[list[float]] = [[] for _ in self.spells]
        # Per spell: how many slots it delayed by each amount (few distinct amounts).
        self.spell_delays: list[Counter[float]] = [Counter() for _ in self.spells]
        # World instance at which the job ends (-1: it does not end early).
        self.halt_at = spec.halt_instance
        # Ranks that never enter halt_at: stopped (stuck elsewhere) or dead.
        self.stops_at_halt = frozenset(
            f.rank
            for f in spec.faults
            if isinstance(f, StopRank | DeadProcess) and f.at_instance == self.halt_at
        )
        self.dead_at_halt = {
            f.rank: f
            for f in spec.faults
            if isinstance(f, DeadProcess) and f.at_instance == self.halt_at
        }
        self.extra_at_halt = frozenset(
            f.rank
            for f in spec.faults
            if isinstance(f, ExtraCollective) and f.at_instance == self.halt_at
        )
        self.death_times: dict[int, float] = {}  # dead rank -> when its process died
        self.extra_logged = False  # the extra calls at halt_at were written
        self.ib_at_halt = next(
            (f for f in spec.faults if isinstance(f, IbError) and f.at_instance == self.halt_at),
            None,
        )
        self.calls_by_op: dict[str, int] = {}
        self.steps_completed = 0
        self.end_reason = "completed"
        self.skipped: frozenset[int] = frozenset()  # ranks that never entered halt_at
        self.ib_info: _IbInfo | None = None
        self.sinks: list[_Sink] = []
        self.rank_sink: list[_Sink] = []
        noise_on = self.combined and spec.non_nccl_frac > 0
        # p per NCCL line so that non-NCCL lines are ~non_nccl_frac of all lines.
        self.p_noise = spec.non_nccl_frac / (1.0 - spec.non_nccl_frac) if noise_on else 0.0
        total_steps = spec.steps if spec.target_size_bytes is None else 100000
        self.noise = _Noise(
            random.Random(spec.seed * 7919 + 1),
            [rk.head for rk in self.ranks],
            total_steps,
            spec.framework,
        )
        self.noise_on = noise_on
        self.noise.offset0 = self.rank_off[0]
        # Benign WARNs draw from their own generator, so that benign_warns=0 leaves every
        # other random choice (and so every byte) as it was.
        self.warn_rnd = random.Random(spec.seed * 7919 + 2)
        self.benign: list[BenignWarnRecord] = []
        # One-off delays (jitter_events) draw from their own generator as well.
        self.delays: dict[int, list[tuple[int, float]]] = {}  # world seq -> [(rank, s)]
        self.noise_events: list[dict[str, Json]] = []
        self._draw_delays()
        # Where each world collective started, for the median gap (truth_format 2 only: a
        # multi-GB job has millions): (slot index, delays' push so far). Kept as slots, not
        # absolute times, whose differences would lose digits.
        self.world_slots: list[tuple[int, float]] | None = [] if spec.truth_format >= 2 else None
        self.pushed = 0.0
        # The new faults' own random choices (death instants, extra-call gaps).
        self.fault_rnd = random.Random(spec.seed * 7919 + 6)
        self.slot_gap = 0.0  # the time model's gap between slots (set by _run_steps)
        self.t_world_init = self.t0  # when the world communicator's init starts
        self.halt_times: list[float] = []  # per rank: when it entered halt_at (if it did)
        # Framework lines draw from their own generator too (see _Framework).
        self.fw = _Framework(self) if spec.framework != "none" else None
        # Phased time model (telemetry): the optimizer step's share of a step, and per step
        # every rank's (true) enqueue time of the step's first and last collective.
        self.opt_share = self.fw.share["step"] if self.fw is not None and self.fw.ds else 0.08
        self.step_first: list[list[float]] = []
        self.opt_start: list[list[float]] = []
        self.opt_end: list[list[float]] = []
        self.contended_steps: list[int] = []

    # ---- identities ------------------------------------------------------------------

    def _launcher_prefix(self, rank: int, local: int, host: str) -> str:
        kind = self.spec.launcher
        if kind == "torchrun":
            return f"[default{local}]:"
        if kind == "rank":
            return f"[rank{rank}]:"
        if kind == "srun":
            # srun --label right-aligns task ids to the width of the largest one.
            return f"{rank:>{len(str(self.n - 1))}d}: "
        if kind == "pdsh":
            return f"{host}: "
        return ""

    def _ptr(self) -> str:
        return f"0x{0x550000000000 + self.rnd.getrandbits(36) * 16:x}"

    def _make_ranks(self) -> list[_Rank]:
        rnd = self.rnd
        pids: set[int] = set()
        out: list[_Rank] = []
        for r in range(self.n):
            h, local = divmod(r, self.rph)
            host = self.spec.host_name(h)
            pid = rnd.randrange(10000, 999999)
            while pid in pids:
                pid = rnd.randrange(10000, 999999)
            pids.add(pid)
            proxy_tid = pid + rnd.randrange(40, 400)
            out.append(
                _Rank(
                    rank=r,
                    host=host,
                    host_index=h,
                    local=local,
                    pid=pid,
                    proxy_tid=proxy_tid,
                    bus=_bus_id(local),
                    ip=f"10.{10 + h // 250}.{h % 250}.11",
                    head=self._launcher_prefix(r, local, host) if self.combined else "",
                    info=f"{host}:{pid}:{pid} [{local}] NCCL INFO ",
                    proxy_info=f"{host}:{pid}:{proxy_tid} [{local}] NCCL INFO ",
                    stream=self._ptr(),
                    heap=0x7F0000000000 + rnd.randrange(1, 0xFF) * 0x100000000,
                    file=COMBINED_FILE if self.combined else f"{host}.{pid}.log",
                )
            )
        return out

    def _make_comms(self) -> tuple[_Comm, list[_Comm]]:
        era = self.era

        def make(name: str, members: list[int], host: int | None) -> _Comm:
            nodes = 1 if host is not None else self.spec.hosts
            return _Comm(
                name=name,
                members=members,
                host_index=host,
                comm_id=self.rnd.getrandbits(64) if era.has_commid else None,
                ptr={g: self._ptr() for g in members},
                n_nodes=nodes,
                nch=16 if nodes > 1 else 24,
                func=era.world_func if host is None else era.host_func,
                zero_opcount=era.opcount_zero_single_node and nodes == 1,
            )

        world = make("world", list(range(self.n)), None)
        hosts = [
            make(f"host{h}", list(range(h * self.rph, (h + 1) * self.rph)), h)
            for h in range(self.spec.hosts)
        ]
        return world, hosts

    def _program(self) -> list[_Call]:
        """One step's calls in program order (identical on every rank)."""
        spec = self.spec
        hidden = self.rnd.choice((2048, 4096, 5120, 8192))
        params = [
            50304 * hidden if layer == 0 else 12 * hidden * hidden + 13 * hidden
            for layer in range(spec.layers)
        ]

        def shard(p: int) -> Callable[[int], int]:
            return lambda size: -(-p // size)  # ceil: ZeRO-3 pads partitions

        def activations(size: int) -> int:
            return 4096 * hidden // size

        self.hidden = hidden
        self.params = params
        # ZeRO-1/2 keep whole parameters: no parameter all-gathers in forward/backward, the
        # updated partitions are all-gathered after the optimizer step instead.
        gather_params = not spec.zero12
        prog: list[_Call] = []
        for layer in range(spec.layers):
            if gather_params:
                prog.append(_Call(True, "AllGather", shard(params[layer]), _BF16, layer, "fwd"))
            if spec.tp_traffic:
                prog.append(_Call(False, "AllReduce", activations, _BF16, 1000 + layer, "fwd"))
        for layer in reversed(range(spec.layers)):
            if gather_params:
                prog.append(_Call(True, "AllGather", shard(params[layer]), _BF16, layer, "bwd"))
            if spec.tp_traffic:
                prog.append(_Call(False, "AllReduce", activations, _BF16, 2000 + layer, "bwd"))
            prog.append(
                _Call(True, "ReduceScatter", shard(params[layer]), _BF16, 3000 + layer, "reduce")
            )
        prog.append(_Call(True, "AllReduce", lambda size: 1, _FP32, 4000, "norm"))
        if not gather_params:
            prog += [
                _Call(True, "AllGather", shard(params[layer]), _BF16, layer, "optim_ag")
                for layer in range(spec.layers)
            ]
        return prog

    # ---- line helpers ----------------------------------------------------------------

    def _ts(self, t: float) -> str:
        if not self.spec.timestamps:
            return ""
        sec = int(t)
        if self.era.subsec_bug:
            return f"{self.info_sec.get(sec)}.{_subsec_226(t - sec)}] "
        return f"{self.info_sec.get(sec)}.{int((t - sec) * 1e6):06d}] "

    def _warn_ts(self, t: float) -> str:
        if self.spec.timestamps:
            return self._ts(t)
        if self.era.warn_default_ts:  # 2.26+ default NCCL_DEBUG_TIMESTAMP_LEVELS=WARN
            return f"{self.info_sec.get(int(t))}] "
        return ""

    def _info(self, rk: _Rank, t: float, msg: str, *, proxy: bool = False) -> str:
        ts = self._ts(t + self.rank_off[rk.rank])
        return f"{rk.head}{ts}{rk.proxy_info if proxy else rk.info}{msg}\n"

    def _warn(
        self,
        rk: _Rank,
        t: float,
        src: str,
        msg: str,
        *,
        tid: int | None = None,
        dev: int | None = None,
    ) -> str:
        # NCCL writes "\n" + line in one write: an empty line always precedes a WARN, and
        # the launcher prefixes both. Default thread: the proxy thread, on the rank's GPU.
        return (
            f"{rk.head}\n{rk.head}{self._warn_ts(t + self.rank_off[rk.rank])}{rk.host}:{rk.pid}:"
            f"{rk.proxy_tid if tid is None else tid} "
            f"[{rk.local if dev is None else dev}] {src} NCCL WARN {msg}\n"
        )

    def _touch(self, t: float) -> None:
        self.first_t = min(self.first_t, t)
        self.last_t = max(self.last_t, t)

    # ---- init phase ------------------------------------------------------------------

    def _banner(self) -> str:
        return f"NCCL version {self.era.nccl_version}+cuda{self.era.cuda_version}"

    def _init_line(self, fmt: str, c: _Comm, rk: _Rank, what: str) -> str:
        return fmt.format(
            func=c.func,
            comm=c.ptr[rk.rank],
            rank=c.index(rk.rank),
            nranks=len(c.members),
            dev=rk.local,
            nvml=rk.local,
            bus=rk.bus,
            cid=f"0x{c.comm_id:x}" if c.comm_id is not None else "",
            what=what,
        )

    def _ring_list(self, c: _Comm) -> list[str]:
        n = len(c.members)
        out = []
        for ch in range(c.nch):
            if self.era.ring_list_wide:
                width = len(str(n - 1))
                line = f"Channel {ch:02d}/{c.nch:02d} :"
                for x in range(n):
                    item = f" {x:>{width}d}"
                    if len(line) + len(item) > 123 and x < n - 1:
                        line += " ..."
                        break
                    line += item
            else:
                shown = "".join(f" {x:3d}" for x in range(min(n, 20)))
                line = f"Channel {ch:02d}/{c.nch:02d} : {shown}"
            out.append(line)
        return out

    def _tree_line(self, c: _Comm, li: int) -> str:
        # A chain inside each node; node heads form a binary tree (NCCL's shape, with one
        # tree for every channel to keep it simple).
        nodes: list[list[int]] = []
        prev_host = -1
        where: tuple[int, int] = (0, 0)
        for i, g in enumerate(c.members):
            host = self.ranks[g].host_index
            if host != prev_host:
                nodes.append([])
                prev_host = host
            if i == li:
                where = (len(nodes) - 1, len(nodes[-1]))
            nodes[-1].append(i)
        node, k = where
        mine = nodes[node]
        downs = [mine[k + 1]] if k + 1 < len(mine) else []
        if k == 0:
            up = nodes[(node - 1) // 2][0] if node > 0 else -1
            downs += [nodes[x][0] for x in (2 * node + 1, 2 * node + 2) if x < len(nodes)]
        else:
            up = mine[k - 1]
        d = "/".join(str(x) for x in (*downs, -1, -1, -1)[:3])
        entry = f"{d}->{li}->{up}|{up}->{li}->{d}" if self.era.trees_double else f"{d}->{li}->{up}"
        return "Trees" + "".join(f" [{ch}] {entry}" for ch in range(c.nch))

    def _conn_lines(self, c: _Comm, li: int) -> list[str]:
        n = len(c.members)
        if n < 2:
            return []
        era = self.era
        me = self.ranks[c.members[li]]
        nj, pj = (li + 1) % n, (li - 1) % n
        nxt, prv = self.ranks[c.members[nj]], self.ranks[c.members[pj]]
        nic = me.local * _N_NICS // self.rph

        def ends(a: int, ra: _Rank, b: int, rb: _Rank, ch: int) -> str:
            if era.conn_busid:
                return f"Channel {ch:02d} : {a}[{ra.bus}] -> {b}[{rb.bus}]"
            return f"Channel {ch:02d}/0 : {a}[{ra.local}] -> {b}[{rb.local}]"

        out = []
        for ch in range(c.nch):
            if nxt.host_index == me.host_index:
                out.append(f"{ends(li, me, nj, nxt, ch)} via {era.p2p}")
            else:
                out.append(f"{ends(li, me, nj, nxt, ch)} [send] via NET/IB/{nic}{era.gdr}")
            if prv.host_index != me.host_index:
                out.append(f"{ends(pj, prv, li, me, ch)} [receive] via NET/IB/{nic}{era.gdr}")
        return out

    def _comm_body(self, c: _Comm, rk: _Rank) -> list[str]:
        """Messages between Init START and COMPLETE for one rank of one comm."""
        era = self.era
        rnd = self.rnd
        li = c.index(rk.rank)
        out: list[str] = []
        if era.bootstrap_timings:
            create, send, recv = (rnd.uniform(0.00002, 0.0002) for _ in range(3))
            ring = rnd.uniform(0.0005, 0.004)
            total = create + send + recv + ring + 0.00001
            out.append(
                f"Bootstrap timings total {total:f} (create {create:f}, send {send:f}, "
                f"recv {recv:f}, ring {ring:f}, delay 0.000000)"
            )
        mask = (
            "0000ffff,ffffffff"
            if rk.local < max(1, self.rph // 2)
            else "ffffffff,ffff0000,00000000"
        )
        out.append(f"Setting affinity for GPU {rk.local} to {mask}")
        if era.nvls_line:
            out.append(f"NVLS multicast support is not available on dev {rk.local}")
        if era.nnodes_line:
            same = [g for g in c.members if self.ranks[g].host_index == rk.host_index]
            out.append(
                f"comm {c.ptr[rk.rank]} rank {li} nRanks {len(c.members)} nNodes {c.n_nodes} "
                f"localRanks {len(same)} localRank {same.index(rk.rank)} MNNVL 0"
            )
        if li == 0:
            out.extend(self._ring_list(c))
        out.append(self._tree_line(c, li))
        if era.chunksize:
            out.append(f"P2P Chunksize set to {131072 if c.n_nodes > 1 else 524288}")
        out.extend(self._conn_lines(c, li))
        if era.connected_rings is not None:
            out.append(era.connected_rings)
            out.append("Connected all trees")
        out.append(f"threadThresholds {era.thread_thresholds}")
        multi = c.n_nodes > 1
        out.append(era.channels.format(c=c.nch, p=32 if multi else 24, pp=2 if multi else 4))
        if era.launch_mode:
            out.append("Launch mode Parallel")
        return out

    def _net_lines(self, rk: _Rank, net: str) -> list[str]:
        if net == "IB":
            devs = "".join(f" [{i}]mlx5_{i}:1/IB" for i in range(_N_NICS))
            return [f"NET/IB : Using{devs}{self.era.ib_ro}; OOB eth0:{rk.ip}<0>"]
        return ["NET/IB : No device found.", f"NET/Socket : Using [0]eth0:{rk.ip}<0>"]

    def _init_timings(self, c: _Comm, li: int, total: float) -> str:
        r = self.rnd
        kernels, alloc, boot, allg = (r.uniform(0.01, 0.05) for _ in range(4))
        topo, conn = total * 0.3, total * 0.4
        rest = max(total - kernels - alloc - boot - allg - topo - conn, 0.0)
        return (
            f"Init timings - {c.func}: rank {li} nranks {len(c.members)} total {total:.2f} "
            f"(kernels {kernels:.2f}, alloc {alloc:.2f}, bootstrap {boot:.2f}, "
            f"allgathers {allg:.2f}, topo {topo:.2f}, graphs 0.00, "
            f"connections {conn:.2f}, rest {rest:.2f})"
        )

    def _init_events(self) -> list[list[tuple[float, str]]]:
        """Per rank, the (time, text) records of process start-up and comm inits."""
        era = self.era
        rnd = self.rnd
        events: list[list[tuple[float, str]]] = [[] for _ in range(self.n)]
        cursor = [self.t0 + rnd.uniform(0.0, 2.0) for _ in range(self.n)]

        def raw(r: int, make: Callable[[float], str], step: float = 0.0004) -> None:
            # Advance this process's clock first, then format the text at that time, so
            # printed timestamps and merge order agree.
            cursor[r] += step * (0.5 + rnd.random())
            events[r].append((cursor[r], make(cursor[r])))

        def info(r: int, msg: str, step: float = 0.0004) -> None:
            rk = self.ranks[r]
            raw(r, lambda t: self._info(rk, t, msg), step)

        for rk in self.ranks:
            r = rk.rank
            if self.noise_on:  # DeepSpeed says hello before anything touches NCCL
                raw(r, partial(self._ds_hello, r), 0.0)
                cursor[r] += 2.0
            info(r, "NCCL_SOCKET_IFNAME set by environment to eth0")
            if self.multi:
                info(r, "NCCL_IB_TIMEOUT set by environment to 22.")
            info(r, era.bootstrap.format(ifc="eth0", ip=rk.ip))

        net = "IB" if self.multi else "Socket"
        shown_banner = [False] * self.n
        net_ready = [False] * self.n
        t_comm = max(cursor) + 1.0
        self.t_world_init = t_comm
        # The world comm first, then all host comms at once (like PyTorch subgroups).
        for group in ([self.world], self.host_comms):
            ends: list[float] = []
            for c in group:
                span = 0.4 + 0.05 * len(c.members) ** 0.5 + (0.8 if c.n_nodes > 1 else 0.2)
                t_done = t_comm + span + rnd.uniform(0.0, 0.05)
                for g in c.members:
                    rk = self.ranks[g]
                    li = c.index(g)
                    cursor[g] = max(cursor[g], t_comm + rnd.uniform(0.0, 0.3))
                    if not net_ready[g] and era.net_in_ncclinit:
                        for msg in (*era.net_plugin, *self._net_lines(rk, net)):
                            info(g, msg)
                        info(g, f"Using network {net}")
                    if li == 0 and not (era.banner_bare and shown_banner[g]):
                        if era.banner_bare and self.combined:
                            raw(g, partial(self._bare_banner, rk))
                        else:
                            # 2.23+ INFO banner, or the INFO copy that <= 2.22 writes to
                            # NCCL_DEBUG_FILE (its bare printf goes to stdout instead).
                            info(g, self._banner())
                        shown_banner[g] = True
                    msgs: list[str] = []
                    if not net_ready[g]:
                        if era.driver_version is not None:
                            msgs.append(f"cudaDriverVersion {era.driver_version}")
                        if not era.net_in_ncclinit:
                            msgs += era.net_plugin
                            if era.net_initialized:
                                msgs.append(f"Initialized NET plugin {net}")
                            msgs += self._net_lines(rk, net)
                        if era.ras_line and rk.local == 0:
                            msgs.append("RAS client listening socket at 127.0.0.1<28028>")
                        net_ready[g] = True
                    if era.net_assigned:
                        msgs.append(f"Assigned NET plugin {net} to comm")
                    if not era.net_in_ncclinit:
                        msgs.append(f"Using network {net}")
                    if era.init_start is not None:
                        msgs.append(self._init_line(era.init_start, c, rk, "START"))
                    for msg in msgs:
                        info(g, msg)
                    body = self._comm_body(c, rk)
                    gap = max(t_done - cursor[g] - 0.01, 0.01) / (len(body) + 1)
                    for msg in body:
                        info(g, msg, gap)
                    # COMPLETE is collective: every member finishes at about the same time.
                    cursor[g] = max(cursor[g], t_done)
                    info(g, self._init_line(era.init_complete, c, rk, "COMPLETE"), 0.004)
                    if era.init_timings:
                        info(g, self._init_timings(c, li, t_done - t_comm))
                ends.append(max(cursor[g] for g in c.members))
            t_comm = max(ends) + 0.3
        return events

    def _ds_hello(self, rank: int, t: float) -> str:
        if self.spec.framework == "torch":  # no DeepSpeed in a plain torch job
            return self.noise.emit(
                rank, f"[rank {rank}] init_process_group(backend='nccl', world_size={self.n})"
            )
        return self.noise.emit(
            rank,
            f"{self.noise.ds_ts(t + self.rank_off[rank])} [INFO] "
            "[real_accelerator.py:203:get_accelerator] "
            "Setting ds_accelerator to cuda (auto detect)",
        )

    def _bare_banner(self, rk: _Rank, _t: float) -> str:
        return f"{rk.head}{self._banner()}\n"

    def _end_events(self) -> list[list[tuple[float, str]]]:
        events: list[list[tuple[float, str]]] = [[] for _ in range(self.n)]
        fmt = self.era.end_line
        if fmt is None:
            return events
        for rk in self.ranks:
            t = self.last_t + 0.5 + self.rnd.uniform(0.0, 0.2)
            for c in (self.host_comms[rk.host_index], self.world):
                t += 0.003 + self.rnd.uniform(0.0, 0.002)
                line = fmt.format(
                    comm=c.ptr[rk.rank],
                    rank=c.index(rk.rank),
                    nranks=len(c.members),
                    dev=rk.local,
                    bus=rk.bus,
                    what="Destroy",
                )
                events[rk.rank].append((t, self._info(rk, t, line)))
        return events

    # ---- output plumbing -------------------------------------------------------------

    def _open_sinks(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.combined:
            sink = _Sink(self.out_dir / COMBINED_FILE, COMBINED_FILE)
            self.sinks = [sink]
            self.rank_sink = [sink] * self.n
        else:
            self.sinks = [_Sink(self.out_dir / rk.file, rk.file) for rk in self.ranks]
            self.rank_sink = list(self.sinks)

    def _emit_events(self, events: list[list[tuple[float, str]]]) -> None:
        """Write per-rank event lists; the combined layout merges them by time."""
        if self.combined:
            merged = sorted(
                (t, r, i, text) for r, evs in enumerate(events) for i, (t, text) in enumerate(evs)
            )
            sink = self.sinks[0]
            for t, _, _, text in merged:
                sink.add(text)
                self._touch(t)
        else:
            for r, evs in enumerate(events):
                for t, text in evs:
                    self.rank_sink[r].add(text)
                    self._touch(t)
        self._flush_all()

    def _flush_all(self) -> int:
        for s in self.sinks:
            s.flush()
        return sum(s.bytes for s in self.sinks)

    # ---- benign WARNs -----------------------------------------------------------------

    def _slots_to_run(self) -> int:
        """Collective slots (positions of the step program) the steps phase will enter."""
        n_prog = len(self.prog)
        if self.halt_at >= 0:  # the job stops in the slot of world instance halt_at
            world_pos = [j for j, call in enumerate(self.prog) if call.world]
            step, k = divmod(self.halt_at, len(world_pos))
            return step * n_prog + world_pos[k] + 1
        return self.spec.steps * n_prog

    def _warn_plan(self, written: int) -> _WarnPlan:
        """Spread ``benign_warns`` evenly: the i-th falls due at (i + 1/2) / N of the run."""
        n = self.spec.benign_warns
        target = self.spec.target_size_bytes
        if n == 0:
            return _WarnPlan([], by_bytes=False)
        if target is not None and self.halt_at < 0:
            # Unknown number of steps: spread over the bytes the steps phase will write.
            span = max(target - written, 0)
            return _WarnPlan([written + (i + 0.5) * span / n for i in range(n)], by_bytes=True)
        slots = self._slots_to_run()
        # floor((i + 1/2) * slots / n) <= slots - 1: all fall due before the last slot runs.
        return _WarnPlan([math.floor((i + 0.5) * slots / n) for i in range(n)], by_bytes=False)

    def _benign_warns(self, count: int, t: float) -> int:
        """Write ``count`` benign WARNs from time ``t`` on; return the characters added."""
        era = self.era
        added = 0
        for _ in range(count):
            rk = self.ranks[self.warn_rnd.randrange(self.n)]
            nic = rk.local * _N_NICS // self.rph
            # The NIC's "NCCL IbAsync" thread: started by ncclIbInit at network set-up, so
            # before the proxy thread. It never sets a CUDA device, hence "[0]".
            tid = rk.pid + 9 + rk.pid % 7 + nic
            msg = era.async_warn.format(hca=f"mlx5_{nic}", port=1, event=_ASYNC_EVENT)
            text = self._warn(rk, t, era.async_src, msg, tid=tid, dev=0)
            sink = self.rank_sink[rk.rank]
            line_no = sink.lines + sink.pending_lines() + 2  # after the empty line
            sink.add(text)
            self._touch(t)
            self.benign.append(
                BenignWarnRecord(
                    rank=rk.rank,
                    host=rk.host,
                    pid=rk.pid,
                    tid=tid,
                    path=sink.rel,
                    line_no=line_no,
                    warn_src=era.async_src,
                    message=msg,
                )
            )
            added += len(text)
            t += 0.0001
        return added

    # ---- one-off delays ---------------------------------------------------------------

    def _draw_delays(self) -> None:
        """Pick ``jitter_events`` distinct (world instance, rank) pairs and their delays."""
        count = self.spec.jitter_events
        if not count:
            return
        rnd = random.Random(self.spec.seed * 7919 + 5)
        span = self.spec.jitter_instances
        picked: dict[tuple[int, int], float] = {}
        while len(picked) < count:
            key = (rnd.randrange(span), rnd.randrange(self.n))
            if key not in picked:
                picked[key] = rnd.uniform(0.005, 0.05)
        wps = self.spec.world_per_step
        for (instance, r), delay in sorted(picked.items()):
            self.delays.setdefault(instance, []).append((r, delay))
            rk = self.ranks[r]
            call = self._world_call(instance)
            self.noise_events.append(
                {
                    "kind": "delay",
                    "rank": r,
                    "host": rk.host,
                    "pid": rk.pid,
                    "instance": instance,
                    "step": instance // wps,
                    "op": call.op,
                    "count": call.count_of(self.n),
                    "delay_s": delay,
                }
            )

    def _delay_slot(
        self, times: list[float], delayed: list[tuple[int, float]], call: _Call
    ) -> float:
        """Delay these ranks' enqueue times; return how much later everything after starts.

        The collective completes when its last member arrives: a delayed rank that arrives
        after where the slowest straggler would have been holds everyone up by the excess.
        """
        late = self.late
        max_late = max(late)
        push = 0.0
        for r, delay in delayed:
            times[r] += delay
            push = max(push, late[r] + delay - max_late)
        self.pushed += push
        if self.fw is not None:
            self.fw.delayed(call.phase, push)
        return push

    def _spell_slot(
        self, times: list[float], wseq: int, compute: float, call: _Call, base: float
    ) -> float:
        """Delay the ranks of the spells active at world instance ``wseq``; return how
        much later everything after starts (the collective waits for its last member)."""
        extra: dict[int, float] = {}
        for i, (f, ranks) in enumerate(self.spells):
            if wseq < f.from_instance or (f.to_instance is not None and wseq >= f.to_instance):
                continue
            d = f.lateness_s + f.slowdown * compute
            seen = self.spell_seen[i]
            if not seen:
                seen += [base, base, d]
            seen[1] = base
            seen[2] = max(seen[2], d)
            self.spell_delays[i][d] += 1
            for r in ranks:
                extra[r] = extra.get(r, 0.0) + d
        if not extra:
            return 0.0
        late = self.late
        max_late = max(late)
        push = 0.0
        for r, d in extra.items():
            times[r] += d
            push = max(push, late[r] + d - max_late)
        self.pushed += push
        if self.fw is not None:
            self.fw.delayed(call.phase, push)
        return push

    # ---- steps (the hot loop) --------------------------------------------------------

    def _coll_parts(
        self,
        call: _Call,
        rk: _Rank,
        *,
        op: str | None = None,
        count: int | None = None,
        dtype: int | None = None,
    ) -> tuple[str, str]:
        """Pre-format a COLL line around its opCount: (text before, text after incl. '\\n')."""
        c = self.world if call.world else self.host_comms[rk.host_index]
        size = len(c.members)
        cnt = call.count_of(size) if count is None else count
        dt = call.dtype if dtype is None else dtype
        name = call.op if op is None else op
        elem = 2 if dt in (_BF16, 6) else 4
        # Persistent per-(rank, buffer) addresses, as ZeRO-3's flat buffers are.
        base = rk.heap + (call.buffer * 2654435761 % 0xFFF) * 0x200000
        li = c.index(rk.rank)
        if name == "AllGather":  # in place: sendbuff = recvbuff + rank * sendcount
            send, recv = base + li * cnt * elem, base
        elif name == "ReduceScatter":  # in place: recvbuff = sendbuff + rank * recvcount
            send, recv = base, base + li * cnt * elem
        else:
            send = recv = base
        before = f"{rk.info}{name}: opCount "
        after = (
            f" sendbuff 0x{send:x} recvbuff 0x{recv:x} count {cnt} datatype {dt} op {_OP_SUM} "
            f"root 0 comm {c.ptr[rk.rank]} [nranks={size}] stream {rk.stream}\n"
        )
        return before, after

    def _mismatch_parts(self, call: _Call, mm: Mismatch) -> tuple[str, str]:
        rk = self.ranks[mm.rank]
        if mm.field == "op":
            return self._coll_parts(call, rk, op=_OTHER_OP[call.op])
        if mm.field == "count":
            return self._coll_parts(call, rk, count=call.count_of(self.n) * 2)
        return self._coll_parts(call, rk, dtype=_other_dtype(call.dtype))

    def _run_steps(self, base: float) -> None:
        """Emit the training steps until done, a terminal fault or the target size."""
        spec = self.spec
        prog = self.prog
        n = self.n
        rr = range(n)
        heads = [rk.head for rk in self.ranks]
        parts = [[self._coll_parts(call, rk) for rk in self.ranks] for call in prog]
        befores = [[p[0] for p in row] for row in parts]
        afters = [[p[1] for p in row] for row in parts]
        ts_on = spec.timestamps
        subsec_bug = self.era.subsec_bug
        offs = self.rank_off
        clocked = any(offs)
        late = self.late
        any_late = any(late)
        gap = spec.step_time_s / len(prog) + max(late)  # everyone waits for the straggler
        # Phased model (telemetry): the optimizer step is a pause after the step's last
        # collective; a contended host's ranks make everyone wait at the next first one.
        opt_gap = 0.0
        contended: list[int] = []
        extra_opt = 0.0
        if spec.telemetry:
            opt_gap = spec.step_time_s * self.opt_share
            gap = spec.step_time_s * (1.0 - self.opt_share) / len(prog) + max(late)
            names = set(spec.pcie_contention)
            contended = [rk.rank for rk in self.ranks if rk.host in names]
            extra_opt = opt_gap * (spec.contention_inflation - 1.0)
        pending_extra = 0.0
        # Where the optimizer step ends: before the AllGather of the updated partitions
        # (ZeRO-1/2), else before the next step's first collective (slot 0).
        opt_at = next((i for i, c in enumerate(prog) if c.phase == "optim_ag"), 0)
        opt_before = (opt_at - 1) % len(prog)  # the slot the optimizer step follows
        self.slot_gap = gap
        slot_compute = gap - max(late)
        spells = self.spells
        rnd = self.rnd.random
        p_noise = self.p_noise
        noise = self.noise.line
        sec_cache = self.info_sec
        combined = self.combined
        rank_sink = self.rank_sink
        target = spec.target_size_bytes
        halt_at = self.halt_at
        mismatches: dict[int, list[Mismatch]] = {}
        for f in spec.faults:
            if isinstance(f, Mismatch) and (not f.hang or f.at_instance == halt_at):
                mismatches.setdefault(f.at_instance, []).append(f)
        no_skip: frozenset[int] = frozenset()
        world = self.world
        host0 = self.host_comms[0]
        max_steps = spec.steps if target is None else None
        written = self._flush_all()
        pending = 0
        last_sec = -1
        sec_str = ""
        times: list[float] = []
        n_prog = len(prog)
        n_warn = spec.benign_warns
        plan = self._warn_plan(written)
        # A WARN due at a slot goes between the previous slot's lines and this slot's.
        warn_offset = _JITTER_S + max(late)
        warn_room = max(gap - warn_offset, 0.0)
        fw = self.fw
        delays = self.delays
        world_slots = self.world_slots
        step = 0
        while max_steps is None or step < max_steps:
            for j, call in enumerate(prog):
                comm = world if call.world else host0
                seq = comm.seq
                if plan.next < n_warn:
                    full = target is not None and written + pending >= target
                    k = plan.due(
                        written + pending if plan.by_bytes else step * n_prog + j,
                        everything=full,
                    )
                    if k:
                        t_warn = base + warn_offset + self.warn_rnd.random() * warn_room
                        pending += self._benign_warns(k, t_warn)
                if target is not None and written + pending >= target:
                    self.end_reason = "target_size"
                    self._touch(max(times, default=self.t0))
                    return
                base += gap
                if opt_gap and opt_at and j == opt_at:  # ZeRO-1/2: the step is inside
                    base += opt_gap
                    pending_extra = self._contend(step, contended, extra_opt)
                oc = "0" if comm.zero_opcount else f"{seq:x}"
                bj = befores[j]
                aj = afters[j]
                halting = call.world and seq == halt_at
                mms = mismatches.get(seq) if call.world else None
                if mms:
                    bj = list(bj)
                    aj = list(aj)
                    for mm in mms:
                        bj[mm.rank], aj[mm.rank] = self._mismatch_parts(call, mm)
                skip = self.stops_at_halt if halting else no_skip
                prev_times = times  # the slot before (any comm: every rank is in one)
                if any_late:
                    times = [base + rnd() * _JITTER_S + late[r] for r in rr]
                else:
                    times = [base + rnd() * _JITTER_S for _ in rr]
                if call.world and world_slots is not None:
                    world_slots.append((step * n_prog + j, self.pushed))
                if spells:
                    # The compute before this slot: the optimizer step counts for the
                    # slot after it.
                    compute = slot_compute + (opt_gap if j == opt_at else 0.0)
                    base += self._spell_slot(times, world.seq, compute, call, base)
                if delays and call.world and seq in delays:
                    base += self._delay_slot(times, delays[seq], call)
                if j == opt_at and pending_extra:
                    for r in contended:
                        times[r] += pending_extra
                    base += pending_extra
                    self.pushed += pending_extra
                    if fw is not None and 0 not in contended:  # rank 0 waits for them
                        fw.delayed(call.phase, pending_extra)
                    pending_extra = 0.0
                if spec.telemetry:
                    if j == 0:
                        self.step_first.append(list(times))
                    if j == opt_at and len(self.opt_end) < len(self.opt_start):
                        self.opt_end.append(list(times))
                    if j == opt_before:
                        self.opt_start.append(list(times))
                if halting and (self.extra_at_halt or self.dead_at_halt):
                    self._halt_slot(call, seq, oc, bj, aj, times, prev_times, skip, step)
                    self._count_slot(call, skip, mms)
                    self._halt(times)
                    return
                out: list[str] = []
                for r in sorted(rr, key=times.__getitem__) if combined else rr:
                    if skip and r in skip:
                        continue
                    t = times[r]
                    if ts_on:
                        pt = t + offs[r] if clocked else t  # printed by the host's clock
                        sec = int(pt)
                        if sec != last_sec:
                            last_sec = sec
                            sec_str = sec_cache.get(sec)
                        if subsec_bug:
                            line = (
                                f"{heads[r]}{sec_str}.{_subsec_226(pt - sec)}] {bj[r]}{oc}{aj[r]}"
                            )
                        else:
                            line = (
                                f"{heads[r]}{sec_str}.{int((pt - sec) * 1e6):06d}] "
                                f"{bj[r]}{oc}{aj[r]}"
                            )
                    else:
                        line = f"{heads[r]}{bj[r]}{oc}{aj[r]}"
                    if combined:
                        out.append(line)
                        if p_noise and rnd() < p_noise:
                            out.append(noise(r, t, step))
                    else:
                        rank_sink[r].pending.append(line)
                        pending += len(line)
                if combined:
                    text = "".join(out)
                    rank_sink[0].pending.append(text)
                    pending += len(text)
                self._count_slot(call, skip, mms)
                if halting:
                    self._halt(times)
                    return
                if pending >= _FLUSH_CHARS:
                    written = self._flush_all()
                    pending = 0
            if opt_gap and not opt_at:  # ZeRO-3: the optimizer step ends the step
                base += opt_gap
                pending_extra = self._contend(step, contended, extra_opt)
            if fw is not None:  # rank 0 logs its timers once the step's last slot is done
                t_print = base + warn_offset + 0.5 * warn_room
                if 0 in contended and pending_extra and not opt_at:
                    t_print += pending_extra
                pending += fw.step_done(step + 1, t_print)
            step += 1
            self.steps_completed = step
        if times:
            self._touch(max(times))
        if len(self.opt_end) < len(self.opt_start):  # the last step's optimizer step
            self.opt_end.append(
                [base + gap + (pending_extra if r in contended else 0.0) for r in rr]
            )

    def _contend(self, step: int, contended: list[int], extra: float) -> float:
        """The contended ranks' extra optimizer time in this step (0: not contended)."""
        if not contended or step < self.spec.contention_from_step:
            return 0.0
        self.contended_steps.append(step)
        fw = self.fw
        if fw is not None and 0 in contended:  # rank 0's own optimizer step grew
            fw.step_extra["step"] = fw.step_extra.get("step", 0.0) + extra
            fw.step_extra["optimizer_step"] = extra
            fw.step_push += extra
        return extra

    def _count_slot(self, call: _Call, skip: frozenset[int], mms: list[Mismatch] | None) -> None:
        by = self.calls_by_op
        if not call.world:
            for c in self.host_comms:
                c.calls += len(c.members)
                c.seq += 1
            by[call.op] = by.get(call.op, 0) + self.n
            return
        entered = self.n - len(skip)
        self.world.calls += entered
        if skip:
            self.skipped = skip
        self.world.seq += 1
        by[call.op] = by.get(call.op, 0) + entered
        if self.extra_logged:  # the extra AllReduces, and the culprits' real calls one later
            extra = len(self.extra_at_halt)
            self.world.calls += extra
            self.world.seq += 1
            by["AllReduce"] = by.get("AllReduce", 0) + extra
        for mm in mms or ():
            if mm.field == "op" and mm.rank not in skip:
                other = _OTHER_OP[call.op]
                by[call.op] -= 1
                by[other] = by.get(other, 0) + 1

    def _halt_slot(
        self,
        call: _Call,
        seq: int,
        oc: str,
        befores: list[str],
        afters: list[str],
        times: list[float],
        prev_times: list[float],
        skip: frozenset[int],
        step: int,
    ) -> None:
        """Write the halting slot when an ExtraCollective or a DeadProcess is in it.

        The extra-calling ranks log two lines: the extra AllReduce at this opCount, then
        their real call one later. Dead ranks log nothing, and nothing is printed for them
        (noise that would carry a dead rank's prefix is dropped). Same layout rules and
        noise draws as the hot loop.
        """
        extra_call = _Call(True, "AllReduce", lambda size: 1, _FP32, 5000, "norm")
        oc_next = "0" if self.world.zero_opcount else f"{seq + 1:x}"
        rows = [(times[r], r, 0) for r in range(self.n) if r not in skip]
        for r in sorted(self.extra_at_halt):
            # The real call is enqueued right after the extra one (host-side enqueue only).
            rows.append((times[r] + self.fault_rnd.uniform(0.00005, 0.0003), r, 1))
            self.extra_logged = True
        if self.combined:
            rows.sort()
        else:
            rows.sort(key=lambda row: (row[1], row[0]))
        self.noise.silent = frozenset(self.dead_at_halt)
        for r in sorted(self.dead_at_halt):
            # Dead "just before" it would have enqueued, in the later half of the time since
            # its previous enqueue (before the first slot: of one slot's time).
            since = times[r] - prev_times[r] if prev_times else self.slot_gap
            self.death_times[r] = times[r] - self.fault_rnd.random() * 0.5 * since
        out: list[str] = []
        for t, r, second in rows:
            rk = self.ranks[r]
            before, opc, after = befores[r], oc, afters[r]
            if second:
                opc = oc_next
            elif r in self.extra_at_halt:
                before, after = self._coll_parts(extra_call, rk)
            line = f"{rk.head}{self._ts(t + self.rank_off[r])}{before}{opc}{after}"
            if self.combined:
                out.append(line)
                if self.p_noise and self.rnd.random() < self.p_noise:
                    out.append(self.noise.line(r, t, step))
            else:
                self.rank_sink[r].add(line)
            self._touch(t)
        if self.combined:
            self.rank_sink[0].add("".join(out))

    # ---- fault aftermath -------------------------------------------------------------

    def _halt(self, times: list[float]) -> None:
        """The job stops in this slot: what follows a terminal fault."""
        self._touch(max(times))
        self.halt_times = times
        self._aftermath(max(times))

    def _aftermath(self, t_last: float) -> None:
        if self.ib_at_halt is not None:
            self.end_reason = "error"
            self._ib_error(self.ib_at_halt, t_last)
            return
        # A death is what ends the job (torchrun sees it); NCCL-side it is still a hang.
        self.end_reason = "died" if self.dead_at_halt else "hang"
        if self.fw is not None:
            self.fw.hang()

    def _ib_error(self, fault: IbError, t_last: float) -> None:
        era = self.era
        h = next(i for i in range(self.spec.hosts) if self.spec.host_name(i) == fault.host)
        culprit = self.ranks[h * self.rph + self.rph - 1]  # the host's cross-node ring sender
        peer = self.ranks[(culprit.rank + 1) % self.n]  # its receiver on the next host
        # ~ one IB retry timeout later (4.096 us * 2^22 at NCCL_IB_TIMEOUT=22).
        t = t_last + 17.18 + self.rnd.uniform(0.0, 0.3)
        src = f"{era.ib_file}:{era.ib_line}"
        records: list[tuple[float, int, str, bool]] = []
        messages: list[str] = []
        for rk, other, tt, status, opcode, vendor, req in (
            (culprit, peer, t, 12, 0, 129, "Send"),  # RETRY_EXC_ERR on the sender
            (peer, culprit, t + 0.0021, 5, 129, 244, "Recv"),  # WR_FLUSH_ERR on the receiver
        ):
            msg = era.ib_error.format(
                peer=f"{other.ip}<{40000 + other.rank}>",
                status=status,
                opcode=opcode,
                vendor=vendor,
                req=req,
                gids=f" localGid ::ffff:{rk.ip} remoteGids::ffff:{other.ip}",
                hca=f"mlx5_{rk.local * _N_NICS // self.rph}",
            )
            messages.append(msg)
            records.append((tt, rk.rank, self._warn(rk, tt, src, msg), True))
            for k, loc in enumerate(era.chain):
                suffix = era.chain_last_suffix if k == len(era.chain) - 1 else ""
                tk = tt + 0.00001 * (k + 1)
                chain = f"{loc} -> {era.ib_code}{suffix}"
                records.append((tk, rk.rank, self._info(rk, tk, chain, proxy=True), False))
            if era.end_line is not None:  # PyTorch's watchdog aborts the failed comms
                for ci, c in enumerate((self.host_comms[rk.host_index], self.world)):
                    tk = tt + 0.8 + 0.01 * ci
                    line = era.end_line.format(
                        comm=c.ptr[rk.rank],
                        rank=c.index(rk.rank),
                        nranks=len(c.members),
                        dev=rk.local,
                        bus=rk.bus,
                        what="Abort",
                    )
                    records.append((tk, rk.rank, self._info(rk, tk, line), False))
        records.sort(key=lambda rec: (rec[0], rec[1]))
        self._flush_all()
        pos: dict[int, tuple[str, int]] = {}
        for tt, r, text, is_warn in records:
            sink = self.rank_sink[r]
            if is_warn:  # +1 for the empty line, +1 for the WARN itself
                pos[r] = (sink.rel, sink.lines + sink.pending_lines() + 2)
            sink.add(text)
            self._touch(tt)
        self.ib_info = _IbInfo(
            culprit=culprit,
            peer=peer,
            culprit_pos=pos[culprit.rank],
            peer_pos=pos[peer.rank],
            message=messages[0],
            peer_message=messages[1],
        )

    # ---- driver and truth ------------------------------------------------------------

    def run(self) -> Truth:
        init = self._init_events()
        steps_t0 = max(evs[-1][0] for evs in init) + 1.5
        if self.fw is not None:  # engine set-up fills the gap before the first step
            self.fw.init_events(init, steps_t0)
        self._open_sinks()
        try:
            self._emit_events(init)
            self._run_steps(steps_t0)
            if self.end_reason in ("completed", "target_size"):
                ends = self._end_events()
                if self.fw is not None:
                    self.fw.end_events(ends)
                self._emit_events(ends)
        finally:
            for s in self.sinks:
                s.close()
        truth = self._truth()
        if self.spec.telemetry:
            from ncclscope.synth_telemetry import write_telemetry

            truth = replace(truth, telemetry=write_telemetry(self._telemetry_job(), self.out_dir))
        (self.out_dir / TRUTH_FILE).write_text(truth.to_json() + "\n", encoding="utf-8")
        return truth

    def _telemetry_job(self) -> TelemetryJob:
        from ncclscope.synth_telemetry import TelemetryJob

        spec = self.spec
        fw = self.fw
        return TelemetryJob(
            hosts=[spec.host_name(h) for h in range(spec.hosts)],
            host_offsets=list(self.host_off),
            rank_host=[rk.host_index for rk in self.ranks],
            rank_local=[rk.local for rk in self.ranks],
            rank_bus=[rk.bus for rk in self.ranks],
            step_first=self.step_first,
            opt_start=self.opt_start,
            opt_end=self.opt_end,
            t_start=self.t0,
            t_end=self.last_t,
            interval_s=spec.telemetry_interval_s,
            offload_optimizer=fw is not None and fw.off_opt,
            offload_param=fw is not None and fw.off_param,
            contention_hosts=list(spec.pcie_contention),
            contended_steps=list(self.contended_steps),
            inflation=spec.contention_inflation,
            growth_ranks=list(spec.memory_growth),
            growth_bytes_per_step=spec.memory_growth_bytes_per_step,
            cache_ratio=spec.gpu_cache_ratio,
            seed=spec.seed,
        )

    def _last_seq(self) -> dict[str, dict[str, int | None]]:
        out: dict[str, dict[str, int | None]] = {}
        for c in self.comms:
            last = c.seq - 1 if c.seq > 0 else None
            out[c.name] = {str(g): last for g in c.members}
        for r in self.skipped:
            out["world"][str(r)] = self.halt_at - 1 if self.halt_at > 0 else None
        if self.extra_logged:  # the culprits are one ahead: everyone else stopped at halt_at
            for r in range(self.n):
                if r not in self.skipped and r not in self.extra_at_halt:
                    out["world"][str(r)] = self.halt_at
        return out

    def _truth(self) -> Truth:
        last = self._last_seq()
        comms = [
            CommRecord(
                name=c.name,
                comm_id=f"0x{c.comm_id:x}" if c.comm_id is not None else None,
                nranks=len(c.members),
                ranks=list(c.members),
                n_nodes=c.n_nodes,
                n_channels=c.nch,
                init_func=c.func or None,
                comm_ptrs={str(g): c.ptr[g] for g in c.members},
                calls=c.calls,
                instances=c.seq,
                last_seq=last[c.name],
                opcount_printed="zero" if c.zero_opcount else "seq",
            )
            for c in self.comms
        ]
        ranks = [
            RankRecord(
                rank=rk.rank,
                host=rk.host,
                host_index=rk.host_index,
                local_rank=rk.local,
                pid=rk.pid,
                tid=rk.pid,
                proxy_tid=rk.proxy_tid,
                cuda_dev=rk.local,
                nvml_dev=rk.local,
                bus_id=rk.bus,
                file=rk.file,
                launcher_prefix=rk.head,
            )
            for rk in self.ranks
        ]
        return Truth(
            spec=_spec_json(self.spec),
            nccl_version=self.era.nccl_version,
            files=[FileRecord(path=s.rel, lines=s.lines, bytes=s.bytes) for s in self.sinks],
            ranks=ranks,
            communicators=comms,
            coll_calls=sum(c.calls for c in self.comms),
            coll_instances=sum(c.seq for c in self.comms),
            calls_by_op=dict(sorted(self.calls_by_op.items())),
            world_instances=self.world.seq,
            steps_completed=self.steps_completed,
            end_reason=self.end_reason,
            non_nccl_lines=self.noise.count + (self.fw.lines if self.fw is not None else 0),
            first_ts=_iso(self.first_t if math.isfinite(self.first_t) else self.t0),
            last_ts=_iso(self.last_t),
            faults=[self._outcome(f, last) for f in self.spec.faults],
            benign_warns=list(self.benign),
            framework=self.fw.truth() if self.fw is not None else None,
            clock_offsets=self._clock_truth(),
            noise=(
                list(self.noise_events)
                if self.spec.jitter_events or self.spec.truth_format >= 2
                else None
            ),
            format_version=self.spec.truth_format,
        )

    def _clock_truth(self) -> list[dict[str, Json]] | None:
        spec = self.spec
        if spec.clock_offset_max_s <= 0 and not spec.clock_offsets_s and spec.truth_format < 2:
            return None
        return [
            {"host_index": h, "host": self.spec.host_name(h), "offset_s": off}
            for h, off in enumerate(self.host_off)
        ]

    def _median_world_gap(self) -> float:
        """Median time between consecutive world collectives, as the time model made them."""
        slot = self.spec.step_time_s / len(self.prog) + max(self.late)
        marks = self.world_slots or []
        if len(marks) < 2:  # no two world collectives: one slot of the time model
            return slot
        return statistics.median(
            (k2 - k1) * slot + (p2 - p1) for (k1, p1), (k2, p2) in itertools.pairwise(marks)
        )

    def _world_call(self, instance: int) -> _Call:
        j = instance % self.spec.world_per_step
        return [call for call in self.prog if call.world][j]

    def _spell_outcome(self, f: SlowHost | SlowSpell) -> FaultOutcome:
        i = next(k for k, (g, _) in enumerate(self.spells) if g is f)
        ranks = self.spells[i][1]
        seen = self.spell_seen[i]
        counts = self.spell_delays[i]
        typical = 0.0
        if counts:  # the median slot's delay
            half, run = sum(counts.values()) / 2, 0
            for d in sorted(counts):
                run += counts[d]
                if run >= half:
                    typical = d
                    break
        # The gap between world collectives the delay makes (it holds everyone up).
        gap = self._median_world_gap() if self.world_slots is not None else self.slot_gap + typical
        details: dict[str, Json] = {
            "ranks": list(ranks),
            "host": self.ranks[ranks[0]].host,
            "from_instance": f.from_instance,
            "to_instance": f.to_instance,
            # true times (not shifted by any clock offset) of the first and last slot
            # the spell delayed, and its largest delay of one slot
            "start": _iso(seen[0]) if seen else None,
            "end": _iso(seen[1]) if seen else None,
            "max_delay_s": seen[2] if seen else 0.0,
            "median_delay_s": typical,
            # the median slot's delay over the median gap between world collectives
            "slowdown": typical / gap if gap > 0 else 0.0,
            "visible_in_timestamps": self.spec.timestamps,
        }
        return FaultOutcome(type(f).__name__, _fault_json(f), bool(seen) and seen[2] > 0, details)

    def _outcome(self, f: Fault, last: dict[str, dict[str, int | None]]) -> FaultOutcome:
        kind = type(f).__name__
        details: dict[str, Json] = {}
        if isinstance(f, SlowHost | SlowSpell):
            return self._spell_outcome(f)
        if isinstance(f, SlowRank):
            rk = self.ranks[f.rank]
            details = {
                "rank": f.rank,
                "host": rk.host,
                "pid": rk.pid,
                "lateness_s": f.lateness_s,
                "visible_in_timestamps": self.spec.timestamps,
            }
            if self.world_slots is not None:
                gap = self._median_world_gap()
                details["slowdown"] = f.lateness_s / gap
                details["median_world_gap_s"] = gap
            return FaultOutcome(kind, _fault_json(f), f.lateness_s > 0, details)
        # Instances every rank got to (the culprits of an ExtraCollective went one further).
        reached = f.at_instance < self.world.seq - (1 if self.extra_logged else 0)
        if isinstance(f, Mismatch) and not f.hang:
            effective = reached and not (f.at_instance == self.halt_at and f.rank in self.skipped)
        elif isinstance(f, Mismatch):
            effective = reached and f.at_instance == self.halt_at and f.rank not in self.skipped
        else:
            effective = reached and f.at_instance == self.halt_at
        details = {"at_instance": f.at_instance, "reached": reached}
        last_json: dict[str, Json] = {name: dict(per) for name, per in last.items()}
        if isinstance(f, StopRank):
            rk = self.ranks[f.rank]
            details.update({"rank": f.rank, "host": rk.host, "pid": rk.pid})
            details["last_seq"] = last_json
        elif isinstance(f, ExtraCollective):
            rk = self.ranks[f.rank]
            call = self._world_call(f.at_instance)
            others: dict[str, Json] = {
                "op": call.op,
                "count": call.count_of(self.n),
                "datatype": call.dtype,
            }
            extra: dict[str, Json] = {"op": "AllReduce", "count": 1, "datatype": _FP32}
            details.update(
                {
                    "rank": f.rank,
                    "host": rk.host,
                    "pid": rk.pid,
                    "seq": f.at_instance,
                    "opcount": "0" if self.world.zero_opcount else f"{f.at_instance:x}",
                    "op": "AllReduce",
                    "extra": extra,
                    "expected": others,
                    "differs": [k for k in ("op", "count", "datatype") if extra[k] != others[k]],
                    "real_call_seq": f.at_instance + 1,
                    "last_seq": last_json,
                }
            )
        elif isinstance(f, DeadProcess):
            rk = self.ranks[f.rank]
            died = self.death_times.get(f.rank)
            details.update(
                {
                    "rank": f.rank,
                    "host": rk.host,
                    "pid": rk.pid,
                    "signal": f.signal,
                    "exit_code": f.exit_code,
                    "died_at": _iso(died) if died is not None and effective else None,
                    "last_seq": last_json,
                }
            )
        elif isinstance(f, Mismatch):
            rk = self.ranks[f.rank]
            call = self._world_call(f.at_instance)
            cnt = call.count_of(self.n)
            expected: dict[str, Json] = {"op": call.op, "count": cnt, "datatype": call.dtype}
            logged = dict(expected)
            if f.field == "op":
                logged["op"] = _OTHER_OP[call.op]
            elif f.field == "count":
                logged["count"] = cnt * 2
            else:
                logged["datatype"] = _other_dtype(call.dtype)
            details.update(
                {
                    "rank": f.rank,
                    "host": rk.host,
                    "pid": rk.pid,
                    "expected": expected,
                    "logged": logged,
                    "hang": f.hang,
                }
            )
        elif effective and self.ib_info is not None:
            info = self.ib_info
            details.update(
                {
                    "host": info.culprit.host,
                    "rank": info.culprit.rank,
                    "pid": info.culprit.pid,
                    "tid": info.culprit.proxy_tid,
                    "file": info.culprit_pos[0],
                    "line_no": info.culprit_pos[1],
                    "warn_src": f"{self.era.ib_file}:{self.era.ib_line}",
                    "message": info.message,
                    "return_code": self.era.ib_code,
                    "consequential": [
                        {
                            "host": info.peer.host,
                            "rank": info.peer.rank,
                            "pid": info.peer.pid,
                            "tid": info.peer.proxy_tid,
                            "file": info.peer_pos[0],
                            "line_no": info.peer_pos[1],
                            "message": info.peer_message,
                        }
                    ],
                }
            )
        return FaultOutcome(kind, _fault_json(f), effective, details)


def generate(spec: SynthSpec, out_dir: Path) -> Truth:
    """Write a synthetic job's logs and ``truth.json`` into ``out_dir``.

    Args:
        spec: What to generate (validated when it was constructed).
        out_dir: Directory to write into (created if missing). Files with the same names
            are overwritten; other files are left alone.

    Returns:
        The ground truth, also written to ``out_dir / "truth.json"``.

    Raises:
        OSError: The files could not be written.
    """
    return _Job(spec, out_dir).run()
