"""Pure DeepSpeed log parser: the ``(line_no, text)`` of one file in, tidy tables out.

The grammar is ``shared/formats/deepspeed-torch.md`` PART D, read from DeepSpeed's own
format strings (v0.3 to v0.16).  Where a format changed between versions every shape
is taken at once (``rank=0 time (ms) | forward: ...`` and ``time (ms) | fwd: ...``), so
no version dispatch is needed; timer names are normalised to the >= v0.10.1 spelling.

The caller selects the lines with :data:`CANDIDATES` and :data:`BLOCK_STARTS` (both in
the regex syntax polars uses) and hands over, in file order, every candidate line, the
line after each (hard wraps), and up to :data:`BLOCK_LINES` lines after a block start.
A gap in ``line_no`` ends any block being read.

Families and what becomes of them:

* wall-clock, ZeRO, fp16, swap, pipeline and MoE timer lines -> ``timers`` (one row per
  value, values in the MoE line's parentheses included);
* ``ThroughputTimer`` lines (three formats) -> ``throughput``;
* ``see_memory_usage``'s label, ``MA ...`` and ``CPU Virtual Memory:`` lines -> one
  ``memory`` row;
* comms-logger verbose lines (``source`` "call"), its summary table ("summary") and the
  ``show_straggler`` table ("straggler": ``latency_s``/``total_latency_s`` there are the
  *straggler* times, the average and total time rank 0 waited beyond the fastest rank);
* the engine configuration dump -> ``config``, ``world_size`` and :class:`ZeroConfig`;
* ``DeepSpeed info: version=``, ``dist_world_size=``, ``Invalidate trace cache`` and the
  step counters (progress ``step=N, skipped=``, throughput, pipeline ``steps: N loss:``).

Example::

    >>> res = parse_deepspeed(
    ...     [(7, "[2024-02-19 10:11:12,345] [INFO] [logging.py:96:log_dist] [Rank 0] "
    ...          "rank=0 time (ms) | forward_microstep: 287.41 | backward_microstep: 612.86")],
    ...     file_id=0,
    ... )
    >>> res.timers.select("rank", "name", "name_printed", "duration_s").rows()
    [(0, 'fwd_microstep', 'forward_microstep', 0.28741), (0, 'bwd_microstep', 'backward_microstep', 0.61286)]
    >>> res.year, res.seen, res.parsed
    (2024, True, 1)
"""  # noqa: E501

from __future__ import annotations

import enum
import functools
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import polars as pl

from ncclscope.parsers.common import last_segment, strip_ansi, to_dt
from ncclscope.schema import (
    COMMS_SCHEMA,
    MEMORY_SCHEMA,
    THROUGHPUT_SCHEMA,
    TIMERS_SCHEMA,
    validate,
)

__all__ = [
    "BLOCK_LINES",
    "BLOCK_STARTS",
    "CANDIDATES",
    "DeepSpeedResult",
    "ZeroConfig",
    "normalise_timer_name",
    "parse_deepspeed",
]

# --------------------------------------------------------------------------------------
# Selection regexes (Rust `regex` syntax, as polars runs them in `str.contains`)

#: Lines this parser needs on their own.  The logger header is matched from its
#: ``] [LEVEL] [file:line:func]`` part: starting at a literal lets polars' regex engine
#: skip ahead with a substring search (starting with the date made it 6x slower on
#: NCCL-heavy logs); the Python side checks the full header with its date.
#:
#: Samples::
#:
#:     [2024-02-19 10:11:12,345] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | ...
#:     rank=0 time (ms) | forward: 120.31 | backward: 250.12              (v0.3, print)
#:     Invalidate trace cache @ step 5: expected module 12, but got module 14   (print)
#:     Comm. Op            Message Size        Count               Total Latency(ms) ...
#:     steps: 100 loss: 2.3456 iter time (s): 0.512 samples/sec: 125.000  (pipeline, print)
#:     Parameter Offload: Total persistent parameters: 92160 in 81 params     (ZeRO-3, print)
CANDIDATES: str = (
    r"\] \[[A-Z]+\] \[[^\]\s]+:[0-9]+:[^\]\s]+\]"
    r"|time \(ms\) \|"
    r"|Invalidate trace cache @ step"
    r"|Comm\. Op {2,}Message Size"
    r"|SamplesPerSec="
    r"|steps: [0-9]+ loss: "
    r"|Parameter Offload: Total persistent parameters"
)

#: Lines that open a multi-line block: the engine configuration dump (its key lines carry
#: the logger header, but multi-line values and the ``json = {`` object do not), the
#: user-config JSON itself, and the comms-logger tables (printed with ``print``).
#: ``see_memory_usage`` is not here: each of its three lines carries the logger header,
#: so CANDIDATES delivers them, and a window after every per-step memory report
#: (``memory_breakdown: true``) would deliver most of the file.
#:
#: Samples::
#:
#:     [2024-02-19 10:11:12,345] [INFO] [config.py:984:print] DeepSpeedEngine configuration:
#:     [2024-02-19 10:11:12,351] [INFO] [config.py:974:print_user_config]   json = {
#:     Comm. Op            Message Size        Count               Total Latency(ms) ...
BLOCK_STARTS: str = (
    r"DeepSpeed(?:Engine|Light) configuration:|\] +json = \{|Comm\. Op {2,}Message Size"
)

#: Lines delivered after each BLOCK_STARTS line (a dump is ~150 keys plus its JSON).
BLOCK_LINES: int = 400

# --------------------------------------------------------------------------------------
# Line anatomy

#: A DeepSpeed record is at most a few KiB; of a longer line only the tail is read (what
#: comes before is a progress bar or another process's output glued in front).
_MAX_LINE = 1 << 16

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

_BUCKET = r"(?P<v>[\d,.eE+]{1,40})\s*$"

#: ZeRO optimizer init lines (rank 0), the weakest source of :class:`ZeroConfig`.
#:
#: Samples: ``Reduce bucket size 500000000``, ``Allgather bucket size 500,000,000``,
#: ``Prefetch bucket size 50000000``, ``CPU Offload: True``,
#: ``Creating torch.float16 ZeRO stage 3 optimizer``
INIT_LINE_RES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("reduce_bucket_size", re.compile(rf"^Reduce bucket size {_BUCKET}", re.ASCII)),
    ("allgather_bucket_size", re.compile(rf"^Allgather bucket size {_BUCKET}", re.ASCII)),
    ("prefetch_bucket_size", re.compile(rf"^Prefetch bucket size {_BUCKET}", re.ASCII)),
    ("offload_optimizer", re.compile(r"^CPU Offload: (?P<v>True|False)\s*$", re.ASCII)),
    ("stage", re.compile(r"^Creating (?:\S{1,64} )?ZeRO stage (?P<v>\d) optimizer", re.ASCII)),
)

#: Lines only ZeRO stage 3 prints, the weakest source of its stage (a job whose config
#: dump and optimizer line were not kept, e.g. an excerpt around its offload setup):
#: its modules' logger headers, ``see_memory_usage`` labels of the parameter offload
#: (``DeepSpeedZeRoOffload``, ZeRO-3's parameter manager whether or not it offloads),
#: and the persistent-parameters count.
#:
#: Samples::
#:
#:     [2024-03-07 14:02:11,481] [INFO] [stage3.py:412:_setup_for_real_optimizer] optimizer
#:     state initialized
#:     [2024-03-07 14:02:10,003] [INFO] [utils.py:781:see_memory_usage] DeepSpeedZeRoOffload
#:     initialize [begin]
#:     Parameter Offload: Total persistent parameters: 92160 in 81 params
#:     [2024-03-07 14:02:09,990] [INFO] [logging.py:96:log_dist] [Rank 0] Creating ZeRO Offload
ZERO3_FILES = frozenset(
    {
        "stage3.py",
        "parameter_offload.py",
        "partition_parameters.py",
        "partitioned_param_coordinator.py",
    }
)
ZERO3_LABELS = ("DeepSpeedZeRoOffload initialize", "Stage 3 initialize")
ZERO3_PERSISTENT = "Parameter Offload: Total persistent parameters"
#: The engine's line for a stage-3 job without an optimizer (``DummyOptim``: inference,
#: or an optimizer the engine does not build).
ZERO3_ENGINE = "Creating ZeRO Offload"

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

_JSON_NONFINITE_RE = re.compile(r"(?<=[:\[,\s])(-?)(inf|nan)(?=\s*[,\]}]|\s*$)", re.MULTILINE)
_DEVICE_RE = re.compile(
    r"\bdevice=(?:'(?P<q>[^']*)'|\"(?P<dq>[^\"]*)\"|<\w+\.(?P<enum>\w+)[^>]*>|(?P<bare>\w+))"
)
_ENUM_INT_RE = re.compile(r":\s*(?P<v>\d+)>$")
_INT_RE = re.compile(r"-?\d{1,19}")
#: A JSON dump is a few KiB; more is not a config (and json.loads has to stop somewhere).
_MAX_JSON_CHARS = 1 << 22
#: Lines a block may skip in a row (other processes' lines) before it is given up.
_BLOCK_MISSES = {"config": 20, "json": 20, "comms": 8}
_DEVICES = frozenset({"cpu", "nvme", "none"})
_I64 = (1 << 63) - 1


# --------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class ZeroConfig:
    """What the log says about ZeRO.

    ``offload_*`` is ``"cpu"``, ``"nvme"``, ``"none"`` (the config says offload is off) or
    ``None`` (unknown).  ``source`` names the best source seen: ``"json"`` (the user
    config printed after the dump) > ``"zero_config"`` (the effective pydantic config of
    the dump) > ``"init_lines"`` (the ZeRO optimizer's init lines); a field the best
    source lacks is taken from the next one.
    """

    stage: int | None
    offload_optimizer: str | None
    offload_param: str | None
    overlap_comm: bool | None
    reduce_bucket_size: int | None
    allgather_bucket_size: int | None
    prefetch_bucket_size: int | None
    source: str


@dataclass
class DeepSpeedResult:
    """Everything :func:`parse_deepspeed` read from one file."""

    timers: pl.DataFrame
    throughput: pl.DataFrame
    memory: pl.DataFrame
    comms: pl.DataFrame
    zero: ZeroConfig | None
    config: dict[str, str]
    version: str | None
    world_size: int | None
    trace_cache_warnings: int
    year: int | None
    seen: bool
    parsed: int
    malformed: int
    first_malformed: int | None
    #: ``zero.Init``'s count of model elements (parameters), rounded to 10 million as
    #: printed, and the line that printed it
    model_elems: int | None = None
    model_elems_line: int | None = None
    #: the ZeRO optimizer's dtype as its ``Creating`` line names it (``bfloat16``)
    train_dtype: str | None = None
    #: ``(line_no, step)`` each time a line set the current global step (throughput,
    #: progress, pipeline lines): a timer line read elsewhere takes the last one before it
    step_marks: list[tuple[int, int]] = field(default_factory=list)


# --------------------------------------------------------------------------------------
# Small helpers


def _clean(raw: str) -> str:
    """The text of a physical line: tail of an overlong line, no ANSI, last ``\\r`` segment.

    >>> _clean("host-1: \\r 7%|#  | 41/596\\r[2024-02-19 10:11:12,345] [INFO] x\\r\\n")
    'host-1: [2024-02-19 10:11:12,345] [INFO] x'
    >>> _clean("[Rank 0] time (ms) | fwd: 80.20\\r 7%|#  | 41/596 [00:30<07:11]")
    '[Rank 0] time (ms) | fwd: 80.20'
    """
    text = strip_ansi(raw[-_MAX_LINE:] if len(raw) > _MAX_LINE else raw)
    if "\r" in text:
        # the record is the last segment that holds one (a bar redrawn after the record,
        # as an unbuffered stderr interleaves with stdout, must not hide it); keep the
        # launcher tag of the physical line, which only the first segment carries.
        last = last_segment(text, _holds_record)
        if not last:
            return ""
        head, _ = _split_prefix(text)
        text = last if not head or last.startswith(head) else head + last
    return text.rstrip("\n")


def _holds_record(segment: str) -> bool:
    return "time (ms) |" in segment or HEADER_RE.search(segment) is not None


def _split_prefix(text: str) -> tuple[str, str]:
    """Launcher tags at the start of ``text`` (up to four) and the rest.

    >>> _split_prefix("gpu-node-07: [default0]:                    4.0 MB   48")
    ('gpu-node-07: [default0]:', '                    4.0 MB   48')
    """
    pos = 0
    for _ in range(4):
        m = PREFIX_RE.match(text, pos)
        if m is None:
            break
        pos = m.end()
    return text[:pos], text[pos:]


def _last_header(text: str) -> re.Match[str] | None:
    # Two headers on one line are two processes' writes spliced: the last one starts
    # the complete record.
    m = HEADER_RE.search(text)
    while m is not None:
        nxt = HEADER_RE.search(text, m.end())
        if nxt is None:
            return m
        m = nxt
    return None


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@functools.lru_cache(maxsize=4096)
def _epoch_seconds(date: str, time: str) -> int | None:
    """Seconds since the epoch of a header's date and time (a log repeats each second)."""
    stamp = to_dt(date, time, None)
    return None if stamp is None else (stamp - _EPOCH) // timedelta(seconds=1)


def _header_us(m: re.Match[str]) -> int | None:
    """The header's time in microseconds since the epoch (polars casts them to ``TS``).

    Frames are built from these integers, not from ``datetime`` objects: ~100x cheaper
    per row, and a timer-heavy log has hundreds of thousands of rows.
    """
    seconds = _epoch_seconds(m["date"], m["time"])
    return None if seconds is None else seconds * 1_000_000 + int(m["ms"]) * 1000


def _finite(text: str | None) -> float | None:
    """A printed float; ``None`` when absent or not finite (``-inf`` before start_step)."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _i64(value: float | None) -> int | None:
    if value is None or not math.isfinite(value):
        return None
    out = round(value)
    return out if -_I64 <= out <= _I64 else None


def _gib(text: str | None) -> int | None:
    """DeepSpeed's ``GB`` (it divides by 1024**3) in bytes."""
    value = _finite(text)
    return _i64(value * 2**30) if value is not None else None


def _size_bytes(text: str) -> int | None:
    """``convert_size`` output in bytes: ``0B`` -> 0, ``4.0 MB`` -> 4194304, ``2.0 KB`` -> 2048."""
    unit = text.lstrip("0123456789. ")
    number = _finite(text[: len(text) - len(unit)].strip())
    power = _SIZE_UNITS.get(unit)
    if number is None or power is None:
        return None
    return _i64(number * 1024**power)


def _rank(text: str | None) -> int | None:
    if text is None:
        return None
    value = int(text)
    return value if 0 <= value < 2**31 else None  # -1: logged before dist init


def _as_int(value: object) -> int | None:
    """An integer from JSON or printed text: ``500000000``, ``5.000000e+08``, ``100,000,000``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -_I64 <= value <= _I64 else None
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if not isinstance(value, str):
        return None
    text = value.strip().replace(",", "").replace("_", "")
    if _INT_RE.fullmatch(text):
        return int(text)
    enum_value = _ENUM_INT_RE.search(text)  # <ZeroStageEnum.weights: 3>
    if enum_value:
        return int(enum_value["v"])
    if len(text) > 40:
        return None
    try:
        return _as_int(float(text))
    except ValueError:
        return None


def _as_bool(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip() in ("True", "False", "true", "false"):
        return value.strip() in ("True", "true")
    return None


def _device(value: object) -> str | None:
    """An offload device: ``"cpu"``, ``"nvme"``, ``"none"`` (``None``/null = off) or unknown."""
    if value is None:
        return "none"
    if not isinstance(value, str):
        return None
    text = value.strip().strip("'\"").lower()
    if text in _DEVICES:
        return text
    if text == "null":
        return "none"
    m = re.search(r"offloaddeviceenum\.(\w+)", text)
    return m[1] if m and m[1] in _DEVICES else None


def _depth(text: str) -> int:
    """Brackets opened minus closed, outside JSON strings.

    >>> _depth('    "a{": {'), _depth('}, '), _depth('"}" ["')
    (1, -1, 1)
    """
    if '"' in text:
        text = _outside_strings(text)
    return text.count("{") + text.count("[") - text.count("}") - text.count("]")


def _outside_strings(text: str) -> str:
    """``text`` without its double-quoted strings (an unclosed one runs to the end).

    A scan with ``str.find``, not a regex: a string pattern retried at every quote of
    an unclosed ``"\\"\\"...`` run takes quadratic time.
    """
    out: list[str] = []
    pos = 0
    while (start := text.find('"', pos)) >= 0:
        out.append(text[pos:start])
        end = start + 1
        while (end := text.find('"', end)) >= 0:
            first = end  # the run of backslashes right before this quote
            while first > start + 1 and text[first - 1] == "\\":
                first -= 1
            if (end - first) % 2 == 0:  # not escaped: the string ends here
                break
            end += 1
        if end < 0:
            return "".join(out)
        pos = end + 1
    out.append(text[pos:])
    return "".join(out)


def _loads(text: str) -> object:
    """JSON as DeepSpeed prints it (``ScientificNotationEncoder`` writes ``inf`` bare)."""
    if len(text) > _MAX_JSON_CHARS:
        return None
    for attempt in (text, None):
        if attempt is None:
            attempt = _JSON_NONFINITE_RE.sub(
                lambda m: m[1] + ("Infinity" if m[2] == "inf" else "NaN"), text
            )
        try:
            return json.loads(attempt)
        except (ValueError, RecursionError):
            continue
    return None


def _split_top_level(text: str) -> list[str]:
    """Split a pydantic repr at spaces outside parentheses, brackets and quotes.

    >>> _split_top_level("stage=3 offload_param=Cfg(device='cpu', pin_memory=True) x='a b'")
    ['stage=3', "offload_param=Cfg(device='cpu', pin_memory=True)", "x='a b'"]
    """
    tokens: list[str] = []
    depth = 0
    quote = ""
    start = 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == " " and depth == 0:
            if i > start:
                tokens.append(text[start:i])
            start = i + 1
    if start < len(text):
        tokens.append(text[start:])
    return tokens


# --------------------------------------------------------------------------------------
# ZeRO configuration from its three sources

ZeroFields = dict[str, int | str | bool | None]

#: (field, deprecated boolean keys that meant "offload to CPU") for the two offloads.
_OFFLOADS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("offload_optimizer", ("cpu_offload",)),
    ("offload_param", ("cpu_offload_param", "cpu_offload_params")),
)


def zero_from_json(zo: Mapping[str, object], *, user: bool) -> ZeroFields:
    """ZeRO fields of a ``zero_optimization`` mapping.

    ``user``: the mapping is the user's config, where an absent key means DeepSpeed's
    default (stage 0, no offload); otherwise (the effective config printed as JSON by
    DeepSpeed < 0.6) an absent key is unknown.

    >>> zero_from_json({"stage": 3, "offload_param": {"device": "cpu"}}, user=True)["offload_param"]
    'cpu'
    """
    out: ZeroFields = {}
    stage = zo.get("stage")
    out["stage"] = _as_int(stage) if stage is not None else (0 if user else None)
    for name, legacy in _OFFLOADS:
        if name in zo:
            value = zo[name]
            # A mapping without "device" is off: the device defaults to "none".
            if isinstance(value, dict):
                out[name] = _device(value.get("device", "none"))
            else:
                out[name] = _device(value)
            continue
        flags = [zo[k] for k in legacy if isinstance(zo.get(k), bool)]
        if flags:
            out[name] = "cpu" if flags[0] else "none"
        else:
            out[name] = "none" if user else None
    out["overlap_comm"] = _as_bool(zo.get("overlap_comm"))
    out["reduce_bucket_size"] = _as_int(zo.get("reduce_bucket_size"))
    out["allgather_bucket_size"] = _as_int(zo.get("allgather_bucket_size"))
    prefetch = zo.get("stage3_prefetch_bucket_size", zo.get("prefetch_bucket_size"))
    out["prefetch_bucket_size"] = _as_int(prefetch)
    return out


def zero_from_user_config(config: Mapping[str, object]) -> ZeroFields:
    """ZeRO fields of the whole user config (``json = {...}``)."""
    zo = config.get("zero_optimization")
    if isinstance(zo, dict):
        return zero_from_json(zo, user=True)
    if isinstance(zo, bool):  # the v0.1 form: "zero_optimization": true meant stage 1
        return {"stage": int(zo), "offload_optimizer": "none", "offload_param": "none"}
    if zo is None:  # no ZeRO section: ZeRO is off
        return {"stage": 0, "offload_optimizer": "none", "offload_param": "none"}
    return {}


def zero_from_repr(text: str) -> ZeroFields:
    """ZeRO fields of the dump's ``zero_config`` value: a pydantic repr (>= v0.6) or JSON.

    >>> f = zero_from_repr("stage=2 reduce_bucket_size=500,000,000 overlap_comm=True "
    ...                    "offload_param=None offload_optimizer=DeepSpeedZeroOffloadOptimizer"
    ...                    "Config(device='cpu', nvme_path=None, pin_memory=True)")
    >>> f["stage"], f["reduce_bucket_size"], f["overlap_comm"], f["offload_param"]
    (2, 500000000, True, 'none')
    >>> f["offload_optimizer"]
    'cpu'
    """
    text = text.strip()
    if text.startswith("{"):
        data = _loads(text)
        return zero_from_json(data, user=False) if isinstance(data, dict) else {}
    kv: dict[str, str] = {}
    for token in _split_top_level(text):
        key, sep, value = token.partition("=")
        if sep and key.isidentifier():
            kv.setdefault(key, value)
    out: ZeroFields = {}
    if "stage" in kv:
        out["stage"] = _as_int(kv["stage"])
    for name, legacy in _OFFLOADS:
        if name in kv:
            value = kv[name]
            if value == "None":
                out[name] = "none"
            else:
                m = _DEVICE_RE.search(value)
                out[name] = _device(m["q"] or m["dq"] or m["enum"] or m["bare"]) if m else None
        else:
            flags = [_as_bool(kv[k]) for k in legacy if _as_bool(kv.get(k)) is not None]
            if flags:
                out[name] = "cpu" if flags[0] else "none"
    if "overlap_comm" in kv:
        out["overlap_comm"] = _as_bool(kv["overlap_comm"])
    for name in ("reduce_bucket_size", "allgather_bucket_size", "prefetch_bucket_size"):
        if name in kv:
            out[name] = _as_int(kv[name])
    return out if any(v is not None for v in out.values()) else {}


#: Sources of ZeRO facts, best first.
ZERO_SOURCES = ("json", "zero_config", "init_lines", "zero3_lines")


def merge_zero(sources: Mapping[str, ZeroFields]) -> ZeroConfig | None:
    """One :class:`ZeroConfig` from the sources seen, field by field in precedence order."""
    present = [s for s in ZERO_SOURCES if sources.get(s)]
    if not present:
        return None

    def pick(name: str) -> int | str | bool | None:
        for source in present:
            value = sources[source].get(name)
            if value is not None:
                return value
        return None

    def pick_int(name: str) -> int | None:
        value = pick(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def pick_str(name: str) -> str | None:
        value = pick(name)
        return value if isinstance(value, str) else None

    overlap = pick("overlap_comm")
    return ZeroConfig(
        stage=pick_int("stage"),
        offload_optimizer=pick_str("offload_optimizer"),
        offload_param=pick_str("offload_param"),
        overlap_comm=overlap if isinstance(overlap, bool) else None,
        reduce_bucket_size=pick_int("reduce_bucket_size"),
        allgather_bucket_size=pick_int("allgather_bucket_size"),
        prefetch_bucket_size=pick_int("prefetch_bucket_size"),
        source=present[0],
    )


# --------------------------------------------------------------------------------------
# The parser


class _Outcome(enum.Enum):
    """What a family handler made of a line.

    PARSED: the line contributed to a record.  SEEN: a DeepSpeed line, no record (yet).
    MALFORMED: it began like the family but could not be parsed.
    """

    PARSED = "parsed"
    SEEN = "seen"
    MALFORMED = "malformed"


class _Verdict(enum.Enum):
    """What an open block made of a line.

    TAKEN: part of the block.  SKIPPED: not the block's (another process's line), read
    on its own and the block stays open.  ENDED: the block is over; read on its own.
    """

    TAKEN = "taken"
    SKIPPED = "skipped"
    ENDED = "ended"


@dataclass(slots=True)
class _Line:
    """One physical line, read."""

    line_no: int
    text: str  # cleaned
    prefix: str  # launcher tags at the start
    body: str  # text after the launcher tags
    msg: str  # message after the logger header and ``[Rank N]``; the text when no header
    header: bool
    func: str | None
    ts: int | None  # microseconds since the epoch
    rank: int | None

    @property
    def ts_source(self) -> str:
        return "logger" if self.ts is not None else "none"


@dataclass(slots=True)
class _Block:
    """A multi-line record being read: the configuration dump, its JSON, a comms table."""

    kind: str  # config | json | comms
    prefix: str  # the launcher tags of the line that opened it
    start: int
    keep: bool = True  # config: the first dump of the file (later ones are not stored)
    misses: int = 0
    key: str | None = None  # config: the key of a multi-line value being read
    parts: list[str] = field(default_factory=list)
    chars: int = 0
    depth: int = 0
    table: str = "summary"  # comms: summary | straggler
    op: str | None = None


Row = tuple[object, ...]


class _Parser:
    """State of one file: rows so far, the open block, counters."""

    def __init__(self, file_id: int) -> None:
        self.file_id = file_id
        self.timers: list[Row] = []
        self.throughput: list[Row] = []
        self.memory: list[list[object]] = []
        self.comms: list[Row] = []
        self.config: dict[str, str] = {}
        self.zero: dict[str, ZeroFields] = {}
        self.version: str | None = None
        self.world_config: int | None = None
        self.world_launcher: int | None = None
        self.trace_cache = 0
        self.year: int | None = None
        self.seen = False
        self.parsed = 0
        self.malformed = 0
        self.first_malformed: int | None = None
        self.step: int | None = None
        self.step_marks: list[tuple[int, int]] = []
        self.prev: int | None = None
        self.block: _Block | None = None
        self.dumps = 0
        self.label: tuple[int, str] | None = None  # see_memory_usage label waiting for MA
        self.open_mem: tuple[int, int] | None = None  # (row index, MA line) waiting for CPU
        self.model_elems: tuple[int, int] | None = None  # (elements, line_no)
        self.train_dtype: str | None = None

    # -- reading ---------------------------------------------------------------------

    def read(self, line_no: int, raw: str) -> _Line:
        text = _clean(raw)
        prefix, body = _split_prefix(text)
        hm = _last_header(text) if "] [" in text else None
        if hm is None:
            # The whole text is searched: a "word: " at the start may be a message
            # ("steps: 100 loss: ..."), not a host name.
            return _Line(line_no, text, prefix, body, text, False, None, None, None)
        self.seen = True
        if hm["file"] in ZERO3_FILES:
            self.zero3_seen()
        ts = _header_us(hm)
        if ts is not None and self.year is None:
            self.year = int(hm["date"][:4])
        msg = text[hm.end() :]
        rank = None
        rm = RANK_RE.match(msg)
        if rm:
            rank = _rank(rm["rank"])
            msg = msg[rm.end() :]
        return _Line(line_no, text, prefix, body, msg, True, hm["func"], ts, rank)

    def feed(self, line_no: int, raw: str, nxt: tuple[int, str] | None) -> bool:
        """Read one line; True when it also took ``nxt`` (its hard-wrapped continuation)."""
        if self.prev is not None and line_no != self.prev + 1:
            self.close_block()  # a gap: the lines in between were not delivered
        self.prev = line_no
        line = self.read(line_no, raw)
        if self.block is not None:
            verdict = _BLOCK_FEEDERS[self.block.kind](self, self.block, line)
            if verdict is _Verdict.TAKEN:
                self.parsed += 1
                self.seen = True
                return False
            if verdict is _Verdict.ENDED:
                self.close_block()
        took_next = self.single(line, nxt)
        if took_next and nxt is not None:
            self.prev = nxt[0]
        return took_next

    def follow(self, line: _Line, nxt: tuple[int, str] | None) -> str | None:
        """The next line's text if it can continue ``line``: adjacent, no logger header."""
        if nxt is None or nxt[0] != line.line_no + 1 or not isinstance(nxt[1], str):
            return None
        text = _clean(nxt[1])
        if not text or HEADER_RE.search(text):
            return None
        return text

    def single(self, line: _Line, nxt: tuple[int, str] | None) -> bool:
        msg = line.msg
        for needle, handler, cont in _FAMILIES:
            if needle not in msg:
                continue
            if cont is not None:
                # Cut right after a value: the rest of the record is on the next line.
                rest = self.follow(line, nxt)
                if rest is not None and cont.match(rest):
                    joined = self.read(line.line_no, line.text + rest)
                    if handler(self, joined) is _Outcome.PARSED:
                        self.count(_Outcome.PARSED, line.line_no, 2)
                        return True
            outcome = handler(self, line)
            if outcome is None:
                continue
            if outcome is _Outcome.MALFORMED:
                # Cut by a terminal inside the record: retry with the next line glued on.
                rest = self.follow(line, nxt)
                if rest is not None:
                    joined = self.read(line.line_no, line.text + rest)
                    if handler(self, joined) is _Outcome.PARSED:
                        self.count(_Outcome.PARSED, line.line_no, 2)
                        return True
            self.count(outcome, line.line_no, 1)
            return False
        return False

    def count(self, outcome: _Outcome, line_no: int, lines: int) -> None:
        if outcome is _Outcome.PARSED:
            self.parsed += lines
            self.seen = True
        elif outcome is _Outcome.SEEN:
            self.seen = True
        else:
            self.malformed += 1
            if self.first_malformed is None:
                self.first_malformed = line_no

    def zero3_seen(self) -> None:
        """A line only ZeRO stage 3 prints was read (see :data:`ZERO3_FILES`)."""
        self.zero.setdefault("zero3_lines", {})["stage"] = 3

    # -- blocks ------------------------------------------------------------------------

    def open_block(self, block: _Block) -> None:
        self.close_block()
        self.block = block

    def start_json(self, block: _Block, line_no: int, rest: str) -> None:
        """Turn the open ``block`` into the JSON object that starts with ``rest``."""
        block.kind = "json"
        block.start = line_no
        block.parts = [rest]
        block.chars = len(rest)
        block.depth = _depth(rest)
        block.misses = 0
        if block.depth <= 0:  # the whole object on one line
            self.finish_json(block)
            self.block = None

    def finish_json(self, block: _Block) -> None:
        data = _loads("\n".join(block.parts))
        if not isinstance(data, dict):
            self.count(_Outcome.MALFORMED, block.start, 1)
            return
        fields = zero_from_user_config(data)
        if fields and block.keep and "json" not in self.zero:
            self.zero["json"] = fields

    def store_config(self, key: str, value: str) -> None:
        if key in self.config:
            return
        self.config[key] = value
        if key == "world_size":
            self.world_config = _as_int(value)
        elif key == "zero_config":
            fields = zero_from_repr(value)
            if fields:
                self.zero.setdefault("zero_config", fields)

    def close_block(self) -> None:
        block = self.block
        self.block = None
        if block is None:
            return
        if block.kind == "config" and block.key is not None and block.keep:
            # A multi-line value cut off: keep what was printed.
            self.store_config(block.key, "\n".join(block.parts))
        elif block.kind == "json":
            self.count(_Outcome.MALFORMED, block.start, 1)  # the object never closed

    def miss(self, block: _Block) -> _Verdict:
        block.misses += 1
        return _Verdict.ENDED if block.misses >= _BLOCK_MISSES[block.kind] else _Verdict.SKIPPED

    def result(self) -> DeepSpeedResult:
        self.close_block()
        return DeepSpeedResult(
            timers=_frame(self.timers, TIMERS_SCHEMA, "timers"),
            throughput=_frame(self.throughput, THROUGHPUT_SCHEMA, "throughput"),
            memory=_frame([tuple(r) for r in self.memory], MEMORY_SCHEMA, "memory"),
            comms=_frame(self.comms, COMMS_SCHEMA, "comms"),
            zero=merge_zero(self.zero),
            config=self.config,
            version=self.version,
            world_size=self.world_config if self.world_config is not None else self.world_launcher,
            trace_cache_warnings=self.trace_cache,
            year=self.year,
            seen=self.seen,
            parsed=self.parsed,
            malformed=self.malformed,
            first_malformed=self.first_malformed,
            step_marks=self.step_marks,
            model_elems=self.model_elems[0] if self.model_elems else None,
            model_elems_line=self.model_elems[1] if self.model_elems else None,
            train_dtype=self.train_dtype,
        )


def _gbps(text: str) -> float | None:
    """The comms logger's Gbps (1e9 bits/s) in bytes per second."""
    value = _finite(text)
    return value * 1e9 / 8 if value is not None else None


def _frame(rows: list[Row], schema: pl.Schema, name: str) -> pl.DataFrame:
    """The frame of ``rows`` (tuples in schema order; ``ts`` in epoch microseconds)."""
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    series = []
    for (col, dtype), values in zip(schema.items(), columns, strict=True):
        if isinstance(dtype, pl.Datetime):
            series.append(pl.Series(col, values, dtype=pl.Int64).cast(dtype))
        else:
            series.append(pl.Series(col, values, dtype=dtype))
    return validate(pl.DataFrame(series), schema, name)


# -- block feeders -----------------------------------------------------------------------


def feed_config(p: _Parser, block: _Block, line: _Line) -> _Verdict:
    """The engine configuration dump: key lines, multi-line values, then ``json = {``.

    Samples::

        [2024-02-19 10:11:12,346] [INFO] [config.py:988:print]   activation_checkpointing_config  {
            "partition_activations": false,
        }
        [2024-02-19 10:11:12,347] [INFO] [config.py:988:print]   zero_optimization_stage ...... 3
    """
    if line.prefix != block.prefix:
        return p.miss(block)
    if block.key is not None:
        if not line.header:
            block.parts.append(line.body.rstrip())
            block.depth += _depth(line.body)
            if block.depth <= 0 or len(block.parts) > BLOCK_LINES:
                if block.keep:
                    p.store_config(block.key, "\n".join(block.parts))
                block.key, block.parts = None, []
            return _Verdict.TAKEN
        # A logger line before the value closed: the value was cut; keep what we have.
        if block.keep:
            p.store_config(block.key, "\n".join(block.parts))
        block.key, block.parts = None, []
    if not line.header:
        return p.miss(block)
    m = JSON_START_RE.match(line.msg)
    if m is not None:
        p.start_json(block, line.line_no, m["rest"])  # a later dump's is read, not stored
        return _Verdict.TAKEN
    m = CONFIG_KEY_RE.match(line.msg)
    if m is None:
        return p.miss(block)
    block.misses = 0
    key, value = m["key"], m["value"].rstrip()
    if _depth(value) > 0:
        block.key, block.parts, block.depth = key, [value], _depth(value)
    elif block.keep:
        p.store_config(key, value)
    return _Verdict.TAKEN


def feed_json(p: _Parser, block: _Block, line: _Line) -> _Verdict:
    """The user config after ``json = {``: header-less, indented lines up to the closing brace.

    Samples (``ScientificNotationEncoder``, >= v0.9; older dumps have no spaces)::

            "reduce_bucket_size": 5.000000e+08,
        }
    """
    if line.prefix != block.prefix or line.header:
        return p.miss(block)
    body = line.body
    if not (body[:1].isspace() or body.startswith(("}", "]"))):
        return p.miss(block)  # not JSON printed with an indent: another process's line
    block.parts.append(body)
    block.chars += len(body)
    block.depth += _depth(body)
    block.misses = 0
    if block.depth <= 0:
        p.finish_json(block)
        p.block = None
    elif block.chars > _MAX_JSON_CHARS:
        p.count(_Outcome.MALFORMED, block.start, 1)
        p.block = None
    return _Verdict.TAKEN


def feed_comms(p: _Parser, block: _Block, line: _Line) -> _Verdict:
    """A comms-logger table: record-name lines, each followed by its rows (one per size)."""
    if line.prefix != block.prefix:
        return p.miss(block)
    body = line.body
    row = COMM_ROW_RE.match(body)
    if row is not None:
        block.misses = 0
        if block.op is None:  # a row before any record name: whose is it?
            p.count(_Outcome.MALFORMED, line.line_no, 1)
            return _Verdict.SKIPPED
        a, b, c, d = (_finite(row[k]) for k in "abcd")
        if block.table == "summary":
            # total latency, avg latency (ms), tput_avg, busbw_avg (Gbps)
            latency, total = _ms_to_s(b), _ms_to_s(a)
            algbw = c * 1e9 / 8 if c is not None else None
            busbw = d * 1e9 / 8 if d is not None else None
        else:
            # total comm lat, total straggler, avg comm lat, avg straggler (ms)
            latency, total, algbw, busbw = _ms_to_s(d), _ms_to_s(b), None, None
        p.comms.append(
            (
                p.file_id,
                line.line_no,
                block.table,
                block.op,
                _size_bytes(row["size"]),
                int(row["count"]),
                latency,
                total,
                algbw,
                busbw,
                None,
                "none",
            )
        )
        return _Verdict.TAKEN
    if COMM_HDR_RE.search(body):
        return _Verdict.ENDED  # the next table starts: read on its own
    if COMM_SEP_RE.match(body):
        return _Verdict.TAKEN
    if line.header or not body.strip():
        return p.miss(block)
    op = COMM_OP_RE.match(body)
    if op is None:
        return p.miss(block)
    block.op = op["op"]
    block.misses = 0
    return _Verdict.TAKEN


def _ms_to_s(value: float | None) -> float | None:
    return value / 1000 if value is not None else None


# -- single-line families ------------------------------------------------------------


def timers_line(p: _Parser, line: _Line) -> _Outcome | None:
    head = TIMER_HEAD_RE.search(line.msg)
    if head is None:
        return None
    pairs = line.msg[head.end() :]
    if (mem := TIMER_MEM_RE.search(pairs)) is not None:
        pairs = pairs[: mem.start()]  # memory figures, not timers
    if not TIMER_PAIRS_RE.fullmatch(pairs):
        return _Outcome.MALFORMED  # cut, spliced, or not a timer line after all
    values: list[tuple[str, str]] = []
    for name, ms, inner in TIMER_PAIR_RE.findall(pairs):
        values.append((name.strip(), ms))
        if inner:  # the MoE breakdown: "(fwd_moe: 30.10, 1st_a2a: 5.20, ...)"
            matches = [TIMER_INNER_RE.fullmatch(x.strip()) for x in inner.split(", ")]
            if not all(matches):
                return _Outcome.MALFORMED
            values += [(m["name"].strip(), m["ms"]) for m in matches if m is not None]
    rank = line.rank if line.rank is not None else _rank(head["rank"])
    if rank is None:
        printed = TIMER_PRINT_RANK_RE.search(line.msg, max(head.start() - 20, 0), head.start())
        rank = _rank(printed["rank"]) if printed else None
    # Every row of the line shares these; only name and value differ.
    fid, no, step, ts, src = p.file_id, line.line_no, p.step, line.ts, line.ts_source
    p.timers += [
        (
            fid,
            no,
            rank,
            step,
            TIMER_RENAMES.get(name, name),
            name,
            _ms_to_s(_finite(ms)),
            ts,
            src,
        )
        for name, ms in values
    ]
    return _Outcome.PARSED


def throughput_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = TPUT_RE.search(line.msg)
    if m is not None:
        epoch, micro, gstep = int(m["epoch"]), int(m["micro"]), int(m["gstep"])
        avg, cur = _finite(m["avg"]), _finite(m["cur"])
    else:
        m = TPUT_OLD_RE.search(line.msg)
        if m is None or line.msg[m.end() :].strip():
            # Text after the last field: the record was cut inside "MemAllocated".
            return _Outcome.MALFORMED
        # The second number counted micro steps (within the epoch) before v0.7.6.
        epoch, micro, gstep = int(m["epoch"]), int(m["step"]), None
        # <= v0.6 printed only the running average, as "SamplesPerSec".
        avg = _finite(m["avg"] if m["sps"] is None else m["sps"])
        cur = _finite(m["cur"])
    p.throughput.append(
        (
            p.file_id,
            line.line_no,
            epoch,
            micro,
            gstep,
            cur,
            avg,
            _gib(m["ma"]),
            _gib(m["mma"]),
            line.ts,
            line.ts_source,
        )
    )
    p.step = gstep if gstep is not None else micro
    if p.step is not None:
        p.step_marks.append((line.line_no, p.step))
    return _Outcome.PARSED


def progress_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = PROGRESS_RE.search(line.msg)
    if m is None:
        return _Outcome.MALFORMED if "step=" in line.msg else None
    p.step = int(m["step"])
    p.step_marks.append((line.line_no, p.step))
    return _Outcome.PARSED


def pipe_steps_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = PIPE_STEPS_RE.search(line.msg)
    if m is None:
        return None
    p.step = int(m["step"])
    p.step_marks.append((line.line_no, p.step))
    return _Outcome.PARSED


def comm_call_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = COMM_CALL_RE.search(line.msg)
    if m is None:
        return _Outcome.MALFORMED
    latency = _finite(m["ms"])
    latency_s = latency / 1000 if latency is not None else None
    p.comms.append(
        (
            p.file_id,
            line.line_no,
            "call",
            m["op"].strip(),
            _size_bytes(m["size"]),
            1,
            latency_s,
            latency_s,
            _gbps(m["algbw"]),
            _gbps(m["busbw"]),
            line.ts,
            line.ts_source,
        )
    )
    return _Outcome.PARSED


def memory_ma_line(p: _Parser, line: _Line) -> _Outcome | None:
    if not _MEM_MA_START_RE.match(line.msg):
        return None
    m = MEM_MA_RE.match(line.msg)
    if m is None:
        return _Outcome.MALFORMED
    label = None
    if p.label is not None and 0 < line.line_no - p.label[0] <= _MEM_JOIN_LINES:
        label = p.label[1]
        p.parsed += 1  # the label line contributed to this row
    p.label = None
    p.memory.append(
        [
            p.file_id,
            line.line_no,
            label,
            _gib(m["ma"]),
            _gib(m["max_ma"]),
            _gib(m["ca"]),
            _gib(m["max_ca"]),
            None,
            None,
            line.ts,
            line.ts_source,
        ]
    )
    p.open_mem = (len(p.memory) - 1, line.line_no)
    return _Outcome.PARSED


def memory_cpu_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = MEM_CPU_RE.search(line.msg)
    if m is None:
        return _Outcome.MALFORMED
    if p.open_mem is None or not 0 < line.line_no - p.open_mem[1] <= _MEM_JOIN_LINES:
        return _Outcome.SEEN  # its MA line was not read: nothing to join it to
    row = p.memory[p.open_mem[0]]
    row[7] = _gib(m["used"])
    row[8] = _finite(m["pct"])
    p.open_mem = None
    return _Outcome.PARSED


def trace_cache_line(p: _Parser, line: _Line) -> _Outcome | None:
    p.trace_cache += 1
    return _Outcome.PARSED


def version_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = VERSION_RE.search(line.msg)
    if m is None:
        return _Outcome.MALFORMED
    if p.version is None:
        p.version = m["version"]
    return _Outcome.PARSED


def dist_world_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = DIST_WORLD_RE.search(line.msg)
    if m is None:
        return None
    if p.world_launcher is None:
        p.world_launcher = int(m["n"])
    return _Outcome.PARSED


def model_init_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = MODEL_INIT_RE.search(line.msg)
    if m is None:
        return _Outcome.MALFORMED
    if p.model_elems is None:
        elems = _i64(float(m["billions"]) * 1e9)
        if elems is not None:
            p.model_elems = (elems, line.line_no)
    return _Outcome.PARSED


def init_line(p: _Parser, line: _Line) -> _Outcome | None:
    msg = line.msg.strip()
    dm = CREATING_DTYPE_RE.match(msg)
    if dm is not None and p.train_dtype is None:
        p.train_dtype = dm["dtype"]
    for name, regex in INIT_LINE_RES:
        m = regex.match(msg)
        if m is None:
            continue
        fields = p.zero.setdefault("init_lines", {})
        if name == "offload_optimizer":
            value: int | str | None = "cpu" if m["v"] == "True" else "none"
        else:
            value = _as_int(m["v"])
        if fields.get(name) is None:
            fields[name] = value
        return _Outcome.PARSED
    return None


def by_func_line(p: _Parser, line: _Line) -> _Outcome | None:
    handler = _BY_FUNC.get(line.func or "")
    return handler(p, line) if handler is not None and line.header else None


def memory_label_line(p: _Parser, line: _Line) -> _Outcome | None:
    p.label = (line.line_no, line.msg.rstrip())
    if line.msg.startswith(ZERO3_LABELS):
        p.zero3_seen()
    return _Outcome.SEEN


def zero3_line(p: _Parser, line: _Line) -> _Outcome | None:
    p.zero3_seen()
    return _Outcome.PARSED


def config_key_line(p: _Parser, line: _Line) -> _Outcome | None:
    """A dump key line with no open block (its start was cut off by a gap)."""
    if not CONFIG_KEY_RE.match(line.msg):
        return None
    # The rest of the dump being read (a gap cut it), unless a second dump started.
    block = _Block("config", line.prefix, line.line_no, keep=p.dumps <= 1)
    p.open_block(block)
    feed_config(p, block, line)
    return _Outcome.PARSED


def config_start_line(p: _Parser, line: _Line) -> _Outcome | None:
    if not CONFIG_START_RE.search(line.msg):
        return None
    p.open_block(_Block("config", line.prefix, line.line_no, keep=p.dumps == 0))
    p.dumps += 1
    return _Outcome.PARSED


def json_start_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = JSON_START_RE.match(line.msg)
    if m is None or not line.header:
        return None
    block = _Block("json", line.prefix, line.line_no)
    p.open_block(block)
    p.start_json(block, line.line_no, m["rest"])
    return _Outcome.PARSED


def comm_table_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = COMM_HDR_RE.search(line.msg)
    if m is None:
        return None
    table = "straggler" if m["kind"].startswith("Total comm") else "summary"
    p.open_block(_Block("comms", line.prefix, line.line_no, table=table))
    return _Outcome.PARSED


_BLOCK_FEEDERS: dict[str, Callable[[_Parser, _Block, _Line], _Verdict]] = {
    "config": feed_config,
    "json": feed_json,
    "comms": feed_comms,
}

Handler = Callable[[_Parser, _Line], _Outcome | None]

#: Single-line families: (needle, handler, continuation pattern).  A handler runs when
#: its needle is in the message; the first that claims the line wins.  The
#: continuation pattern says when the next line is the rest of a record cut after a value.
_FAMILIES: tuple[tuple[str, Handler, re.Pattern[str] | None], ...] = (
    ("time (ms) |", timers_line, TIMER_CONT_RE),
    ("SamplesPerSec=", throughput_line, None),
    ("comm op: ", comm_call_line, None),
    ("MA ", memory_ma_line, None),
    ("CPU Virtual Memory:", memory_cpu_line, None),
    (", skipped=", progress_line, None),
    (TRACE_CACHE, trace_cache_line, None),
    ("DeepSpeed info: ", version_line, None),
    ("dist_world_size=", dist_world_line, None),
    ("bucket size ", init_line, None),
    ("CPU Offload: ", init_line, None),
    ("ZeRO stage ", init_line, None),
    ("finished initializing model - ", model_init_line, None),
    ("configuration:", config_start_line, None),
    ("json = ", json_start_line, None),
    ("Comm. Op", comm_table_line, None),
    ("steps: ", pipe_steps_line, None),
    (ZERO3_PERSISTENT, zero3_line, None),
    (ZERO3_ENGINE, zero3_line, None),
    ("", by_func_line, None),
)

#: Logger lines known by the function that logged them.
_BY_FUNC: dict[str, Handler] = {
    "see_memory_usage": memory_label_line,
    "print": config_key_line,
}


def parse_deepspeed(lines: Iterable[tuple[int, str]], *, file_id: int) -> DeepSpeedResult:
    """Parse the DeepSpeed lines of one file (``(line_no, text)`` in file order).

    Never raises on the text: lines that cannot be read are counted in ``malformed``
    (when they began like a DeepSpeed record) or ignored.
    """
    parser = _Parser(file_id)
    it = iter(lines)
    current = next(it, None)
    while current is not None:
        nxt = next(it, None)
        line_no, text = current
        if isinstance(line_no, int) and 0 <= line_no < 2**32 and isinstance(text, str):
            if parser.feed(line_no, text, nxt):
                nxt = next(it, None)
        current = nxt
    return parser.result()
