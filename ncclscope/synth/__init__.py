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

The package, by concern (``generate`` and the names in ``__all__`` are its interface):

* ``options``: the option types and their values; ``faults``: the fault dataclasses;
  ``spec``: ``SynthSpec`` and its validation; ``truth``: the ``truth.json`` records.
* ``eras``: the line formats of each NCCL, DeepSpeed and PyTorch era.
* ``parts``: ranks, communicators, output sinks and non-NCCL noise.
* ``nccl_lines`` -> ``steps`` -> ``job``: one job's state and NCCL lines, the step loop,
  then the driver and its truth (``_Job`` grows one module at a time).
* ``framework`` -> ``framework_hang``: DeepSpeed/PyTorch lines, then a failure's lines.
* ``telemetry`` (``--telemetry``, imports polars) and ``cli`` (``ncclscope synth``) are
  imported only when used. No runtime module (``analyze``, the agent) imports this package.
"""

from __future__ import annotations

from ncclscope.synth.faults import (
    DEAD_SIGNALS,
    DeadProcess,
    DeadSignal,
    ExtraCollective,
    Fault,
    IbError,
    Mismatch,
    SlowHost,
    SlowRank,
    SlowSpell,
    StopRank,
)
from ncclscope.synth.job import generate
from ncclscope.synth.options import (
    DS_ERAS,
    ERAS,
    FRAMEWORKS,
    LAUNCHERS,
    LAYOUTS,
    MISMATCH_FIELDS,
    OFFLOADS,
    TORCH_ERAS,
    ZERO_STAGES,
    DsEra,
    Era,
    Framework,
    Json,
    Launcher,
    Layout,
    MismatchField,
    Offload,
    TorchEra,
)
from ncclscope.synth.spec import SynthSpec
from ncclscope.synth.truth import (
    BenignWarnRecord,
    CommRecord,
    FaultOutcome,
    FileRecord,
    RankRecord,
    Truth,
)

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
