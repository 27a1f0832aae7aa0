"""The line grammars of the DeepSpeed parser: logger header, timers, throughput, memory,
comms logger, engine configuration dump.  Each pattern's comment shows a real sample line.

Sample::

    [2024-02-19 10:11:12,345] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | fwd: 80.20
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = [
    "TIMER_RENAMES",
    "normalise_timer_name",
]


#: DeepSpeed's logger header, searched anywhere in the line (tqdm bars, pdsh and
#: torchrun prefixes come first).
#:
#: Sample: ``[2024-02-19 10:11:12,345] [INFO] [logging.py:96:log_dist] [Rank 0] ...``
HEADER_RE = re.compile(
    r"\[(?P<date>\d{4}-\d{2}-\d{2}) (?P<time>\d{2}:\d{2}:\d{2}),(?P<ms>\d{3})\] "
    r"\[(?P<level>[A-Z]{1,16})\] "
    r"\[(?P<file>[^\s:\]]{1,200}):(?P<lineno>\d{1,9}):(?P<func>[^\s\]]{1,200})\] ?",
    re.ASCII,
)

#: ``log_dist`` puts the global rank in front of the message (-1 before dist init).
#:
#: Sample: ``[Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]``
RANK_RE = re.compile(r"\[Rank (?P<rank>-?\d{1,9})\] ", re.ASCII)

#: One launcher tag at the start of a line: pdsh or ``srun -l`` (``gpu-node-07: ``,
#: ``3: ``), torchrun ``--tee`` and PyTorch (``[default0]:``, ``[rank3]:``), Open MPI
#: ``--tag-output`` (``[1,5]<stdout>:``).  Block lines are told apart by these.
PREFIX_RE = re.compile(
    r"(?:[A-Za-z0-9][\w.@-]{0,127}: "
    r"|\[[A-Za-z_][\w-]{0,63}\]:"
    r"|\[\d{1,6},\d{1,6}\]<std(?:out|err)>: ?)",
    re.ASCII,
)

# --------------------------------------------------------------------------------------
# Timers (D2, D3)

#: ``%.2f`` milliseconds as ``SynchronizedWallClockTimer.log`` prints them (exactly two
#: decimals, which is what lets a line cut by a terminal wrap fail instead of mis-parse).
_MS = r"-?\d{1,15}\.\d{2}|-?inf|nan"

#: The head of a timer line: ``rank=N`` up to v0.10.0, nothing from v0.10.1.
#:
#: Samples::
#:
#:     rank=0 time (ms) | forward_microstep: 287.41 | backward_microstep: 612.86
#:     time (ms) | fwd_microstep: 287.41 | bwd_microstep: 612.86 | step_microstep: 3.12
#:     time (ms) | optimizer_allgather: 12.40 | optimizer_gradients: 5.67 | optimizer_step: 89.01
TIMER_HEAD_RE = re.compile(r"(?:rank=(?P<rank>-?\d{1,9}) )?time \(ms\)(?= \|)", re.ASCII)

#: From v0.16 the timers go through ``print_dist``: ``[Rank N] `` and no logger header.
#:
#: Sample: ``[Rank 0] time (ms) | fwd_microstep: 287.41 | bwd_microstep: 612.86``
TIMER_PRINT_RANK_RE = re.compile(r"\[Rank (?P<rank>-?\d{1,9})\] $", re.ASCII)

#: One `` | name: value`` of a timer line, with the MoE breakdown in parentheses; groups:
#: name, milliseconds, the text inside the parentheses.
#:
#: Samples: `` | bwd_inner_microstep: 402.57`` and
#: `` | fwd: 120.50 (fwd_moe: 30.10, 1st_a2a: 5.20, 2nd_a2a: 4.90, top_k: 1.10)``
_PAIR = r" \| ([^|:()]{1,100}): (" + _MS + r")(?: \(([^()]{0,2000})\))?"
TIMER_PAIR_RE = re.compile(_PAIR, re.ASCII)

#: All the pairs after the head, up to the end of the line (the pairs cannot overlap: each
#: starts at `` | `` and no name holds ``|``, so this runs in linear time).
TIMER_PAIRS_RE = re.compile(rf"(?:{_PAIR})+\s*", re.ASCII)

#: ``memory_breakdown``: ``SynchronizedWallClockTimer.memory_usage()`` appended to the
#: pairs (GiB, four decimals) by releases whose ``log`` took ``memory_breakdown=True``.
#:
#: Sample: `` | mem_allocated: 3.1416 GB | max_mem_allocated: 7.2500 GB | cache_allocated:
#: 9.0000 GB | max_cache_allocated: 9.5000 GB``
TIMER_MEM_RE = re.compile(
    r"(?: \| (?:max_)?(?:mem|cache)_allocated: \d{1,9}\.\d{4} GB){1,4}\s*$", re.ASCII
)

#: One ``name: value`` inside the MoE parentheses (names with spaces up to v0.10.0).
#:
#: Samples: ``fwd_moe: 30.10`` and ``1st alltoall: 5.20``
TIMER_INNER_RE = re.compile(rf"(?P<name>[^,:()]{{1,100}}): (?P<ms>{_MS})", re.ASCII)

#: A line that continues a timer line cut by a terminal right after a value.
#:
#: Sample: `` | bwd_inner_microstep: 402.57 | step_microstep: 3.12``
TIMER_CONT_RE = re.compile(rf"\s?\| [^|:()]{{1,100}}: (?:{_MS})", re.ASCII)

#: v0.10.1 (#3996) renamed the engine timers; rows carry the new names.  The MoE
#: breakdown line was renamed in the same commit.
TIMER_RENAMES: Mapping[str, str] = {
    "forward_microstep": "fwd_microstep",
    "forward": "fwd",
    "backward_microstep": "bwd_microstep",
    "backward": "bwd",
    "backward_inner_microstep": "bwd_inner_microstep",
    "backward_inner": "bwd_inner",
    "backward_allreduce_microstep": "bwd_allreduce_microstep",
    "backward_allreduce": "bwd_allreduce",
    "forward_moe": "fwd_moe",
    "1st alltoall": "1st_a2a",
    "2nd alltoall": "2nd_a2a",
    "top-k": "top_k",
}


def normalise_timer_name(name: str) -> str:
    """The DeepSpeed >= 0.10.1 name of a timer.

    >>> normalise_timer_name("backward_inner_microstep"), normalise_timer_name("optimizer_step")
    ('bwd_inner_microstep', 'optimizer_step')
    """
    return TIMER_RENAMES.get(name, name)


# --------------------------------------------------------------------------------------
# Throughput and step counters (D4)

#: A ``repr`` float as ThroughputTimer prints it: ``21.873046128374906``, ``-inf``, ``1e-05``.
_REPR = r"[-+]?(?:\d{1,30}(?:\.\d{0,30})?(?:[eE][-+]?\d{1,4})?|inf|nan)"
_GB = r"\d{1,12}(?:\.\d{1,12})?"

#: ThroughputTimer >= v0.7.6.
#:
#: Sample: ``epoch=0/micro_step=40/global_step=10, RunningAvgSamplesPerSec=21.873046128374906,
#: CurrSamplesPerSec=22.41, MemAllocated=3.47GB, MaxMemAllocated=9.12GB``
TPUT_RE = re.compile(
    r"epoch=(?P<epoch>\d{1,12})/micro_step=(?P<micro>\d{1,15})/global_step=(?P<gstep>\d{1,15}), "
    rf"RunningAvgSamplesPerSec=(?P<avg>{_REPR}), CurrSamplesPerSec=(?P<cur>{_REPR}), "
    rf"MemAllocated=(?P<ma>{_GB})GB, MaxMemAllocated=(?P<mma>{_GB})GB",
    re.ASCII,
)

#: ThroughputTimer <= v0.7.5: ``{epoch}/{micro steps in the epoch}``; <= v0.6 printed only
#: the running average as ``SamplesPerSec``.
#:
#: Samples::
#:
#:     0/40, RunningAvgSamplesPerSec=21.87, CurrSamplesPerSec=22.41, MemAllocated=3.47GB,
#:     MaxMemAllocated=9.12GB                                                     (v0.7.0)
#:     1/200, SamplesPerSec=88.31                                                 (v0.4)
TPUT_OLD_RE = re.compile(
    r"(?<![\w/=.])(?P<epoch>\d{1,12})/(?P<step>\d{1,15}), "
    rf"(?:RunningAvgSamplesPerSec=(?P<avg>{_REPR}), CurrSamplesPerSec=(?P<cur>{_REPR})"
    rf"|SamplesPerSec=(?P<sps>{_REPR}))"
    rf"(?:, MemAllocated=(?P<ma>{_GB})GB, MaxMemAllocated=(?P<mma>{_GB})GB)?",
    re.ASCII,
)

#: The engine's progress line (``_report_progress``): the global step.
#:
#: Sample: ``step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]``
PROGRESS_RE = re.compile(r"(?<![\w/])step=(?P<step>\d{1,15}), skipped=\d{1,15}, lr=", re.ASCII)

#: The pipeline engine's rank-0 ``print``: the global step.
#:
#: Sample: ``steps: 100 loss: 2.3456 iter time (s): 0.512 samples/sec: 125.000``
PIPE_STEPS_RE = re.compile(r"(?<!\w)steps: (?P<step>\d{1,15}) loss: ", re.ASCII)

# --------------------------------------------------------------------------------------
# see_memory_usage (D6)

#: Sample: ``MA 1.27 GB         Max_MA 1.84 GB         CA 3.41 GB         Max_CA 3 GB ``
MEM_MA_RE = re.compile(
    rf"MA (?P<ma>{_GB}) GB\s{{1,40}}Max_MA (?P<max_ma>{_GB}) GB\s{{1,40}}"
    rf"CA (?P<ca>{_GB}) GB\s{{1,40}}Max_CA (?P<max_ca>{_GB}) GB\s*$",
    re.ASCII,
)
_MEM_MA_START_RE = re.compile(r"MA \d", re.ASCII)

#: Sample: ``CPU Virtual Memory:  used = 112.38 GB, percent = 44.6%``
MEM_CPU_RE = re.compile(
    rf"CPU Virtual Memory:\s{{1,10}}used = (?P<used>{_GB}) GB, "
    r"percent = (?P<pct>\d{1,3}(?:\.\d{1,6})?)%\s*$",
    re.ASCII,
)

#: A label line is used by the next ``MA`` line at most this many lines later (and a
#: ``CPU`` line joins the ``MA`` line before it within the same distance).
_MEM_JOIN_LINES = 8

# --------------------------------------------------------------------------------------
# Comms logger (D5)

#: ``convert_size``: ``0B`` or ``"%s %s" % (round(x, 2), unit)`` with 1024 steps.
_SIZE = r"\d{1,20}(?:\.\d{1,4})? ?[KMGTPEZY]?B"
_SIZE_UNITS = {"B": 0, "KB": 1, "MB": 2, "GB": 3, "TB": 4, "PB": 5, "EB": 6, "ZB": 7, "YB": 8}

#: A verbose per-call line, both eras (``debug: true`` adds the caller after the name).
#:
#: Samples::
#:
#:     comm op: all_gather_into_tensor | time (ms): 1.23 | msg size: 4.0 MB |
#:     algbw (Gbps): 54.17 | busbw (Gbps): 50.78                              (>= v0.10.1)
#:     rank=0 | comm op: all_reduce | time (ms): 2.05 | msg size: 64.0 MB |
#:     algbw (Gbps): 523.78  | busbw (Gbps): 982.08                           (<= v0.10.0)
COMM_CALL_RE = re.compile(
    r"(?:rank=(?P<rank>-?\d{1,9}) \| )?comm op: (?P<op>[^|]{1,200}?)"
    r"(?: \| \[Caller Func: (?P<caller>[^\]]{0,200})\])? \| "
    rf"time \(ms\): (?P<ms>{_MS}) \| msg size: (?P<size>{_SIZE}) \| "
    rf"algbw \(Gbps\): (?P<algbw>{_MS})\s{{1,4}}\| busbw \(Gbps\): (?P<busbw>{_MS})\s*$",
    re.ASCII,
)

#: The header of the summary table (``log_summary``) or of the straggler breakdown.
#:
#: Samples (every column padded to 20)::
#:
#:     Comm. Op            Message Size        Count               Total Latency(ms)   ...
#:     Comm. Op            Message Size        Count               Total comm lat(ms)  ...
COMM_HDR_RE = re.compile(
    r"Comm\. Op\s{1,40}Message Size\s{1,40}Count\s{1,40}"
    r"(?P<kind>Total Latency\(ms\)|Total comm lat\(ms\))",
    re.ASCII,
)

#: A record name line of a table (``log_name``, with the caller when ``debug: true``).
#:
#: Sample: ``all_gather_into_tensor``
COMM_OP_RE = re.compile(
    r"(?P<op>[^\s|]{1,200})(?: \| \[Caller Func: [^\]]{0,200}\])?\s*$", re.ASCII
)

#: A table row: size, count and four two-decimal columns.  Summary: total latency, avg
#: latency, tput_avg, busbw_avg; straggler: total comm lat, total straggler, avg comm
#: lat, avg straggler (ms).
#:
#: Sample: ``                    4.0 MB              48                  5.62   ...``
COMM_ROW_RE = re.compile(
    rf"\s{{1,40}}(?P<size>{_SIZE})\s{{1,40}}(?P<count>\d{{1,15}})"
    rf"\s{{1,40}}(?P<a>{_MS})\s{{1,40}}(?P<b>{_MS})\s{{1,40}}(?P<c>{_MS})\s{{1,40}}(?P<d>{_MS})\s*$",
    re.ASCII,
)

#: The lines between the summary and the straggler table.
#:
#: Samples: ``_______________________________``, ``Breakdown with straggler effect``
COMM_SEP_RE = re.compile(r"(?:_{5,}|-{5,}|Breakdown with straggler effect)\s*$", re.ASCII)

# --------------------------------------------------------------------------------------
# Engine configuration (D7), version, launcher (D8)

#: Sample: ``DeepSpeedEngine configuration:``
CONFIG_START_RE = re.compile(r"DeepSpeed(?:Engine|Light) configuration:\s*$", re.ASCII)

#: ``"  {} {} {}".format(arg, "." * (29 - len(arg)), value)``: keys of 29 characters or
#: more get no dots, hence two spaces.
#:
#: Samples: ``  zero_optimization_stage ...... 3`` and
#: ``  train_micro_batch_size_per_gpu  4``
CONFIG_KEY_RE = re.compile(r"  (?P<key>[A-Za-z_]\w{0,200}) \.* (?P<value>.*)$", re.ASCII)

#: ``print_user_config``: the user's JSON, on this and the following header-less lines.
#:
#: Sample: ``  json = {``
JSON_START_RE = re.compile(r"\s{0,8}json = (?P<rest>.*)$", re.ASCII)

#: Sample: ``DeepSpeed info: version=0.14.0, git-hash=unknown, git-branch=unknown``
VERSION_RE = re.compile(r"DeepSpeed info: version=(?P<version>[^\s,]{1,64})", re.ASCII)

#: ``launch.py``, once per node. Sample: ``dist_world_size=32``
DIST_WORLD_RE = re.compile(r"(?<!\w)dist_world_size=(?P<n>\d{1,9})\s*$", re.ASCII)

#: ZeRO-3 prefetch trace mismatch (``print_rank_0``; a logger warning in later versions).
#:
#: Sample: ``Invalidate trace cache @ step 5: expected module 12, but got module 14``
TRACE_CACHE = "Invalidate trace cache @ step"

#: ``zero.Init`` on rank 0 when the model was built under it (ZeRO-3): how many
#: parameters (tensors) and elements it created; elements in billions, two decimals.
#:
#: Sample: ``finished initializing model - num_params = 695, num_elems = 7.95B``
MODEL_INIT_RE = re.compile(
    r"finished initializing model - num_params = (?P<tensors>\d{1,12}), "
    r"num_elems = (?P<billions>\d{1,9}(?:\.\d{1,6})?)B\s*$",
    re.ASCII,
)

#: The ZeRO optimizer's training dtype, from its ``Creating`` line.
#:
#: Sample: ``Creating torch.bfloat16 ZeRO stage 3 optimizer``
CREATING_DTYPE_RE = re.compile(
    r"^Creating (?:torch\.)?(?P<dtype>[a-z]{1,16}\d{0,3}) ZeRO stage \d optimizer", re.ASCII
)
