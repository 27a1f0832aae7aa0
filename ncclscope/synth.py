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
* Era "2.27" creates the world communicator with ``ncclCommInitRankConfig`` (as PyTorch
  does) and the host communicators with ``ncclCommInitRank``, so both 2.23+ spellings occur.
* Time: collective slot ``k`` (any comm) has a base time ``base_k``; each rank enqueues it at
  ``base_k + U(0, 2 ms) + lateness(rank)``, and because every collective waits for its
  slowest member, ``base`` advances by ``step_time_s / calls_per_step + max(lateness)``.
  The combined layout is ordered by these times whether or not they are printed.
* The job ends at the earliest instance that has a terminal fault (StopRank, IbError,
  Mismatch with ``hang``); every fault at that instance applies (two StopRanks = two
  missing ranks), later ones are reported with ``effective=False``. The IB error is raised
  by the last rank of the host (the one whose ring ``[send]`` crosses the network); its
  receiver on the next host logs a consequential flush error; PyTorch-style
  ``Abort COMPLETE`` lines (2.12+) follow.
* Benign WARNs (``benign_warns``): an InfiniBand async event that NCCL's IB async thread
  only logs (``SM change``: the subnet manager moved; established connections are not
  touched), so no return-code chain follows and the job goes on. Each one is printed by
  one process on a random rank, from its NIC's async thread (own TID, ``[0]`` because that
  thread never sets a CUDA device). A real port event reaches every process that opened
  the NIC; one line per event keeps ``N`` = the number of WARN lines.
* Invented but plausible: pids, pointers, commIds, ``file:line`` numbers of WARN and
  return-code chains, IB GIDs, timings. Everything else follows ``formats/nccl.md``.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import BinaryIO, Literal, TypeAlias, get_args

__all__ = [
    "ERAS",
    "LAUNCHERS",
    "LAYOUTS",
    "MISMATCH_FIELDS",
    "BenignWarnRecord",
    "CommRecord",
    "Era",
    "Fault",
    "FaultOutcome",
    "FileRecord",
    "IbError",
    "Json",
    "Launcher",
    "Layout",
    "Mismatch",
    "MismatchField",
    "RankRecord",
    "SlowRank",
    "StopRank",
    "SynthSpec",
    "Truth",
    "generate",
]

Json: TypeAlias = str | int | float | bool | list["Json"] | dict[str, "Json"] | None

Era = Literal["2.7", "2.18", "2.21", "2.27"]
Layout = Literal["combined", "per-rank"]
Launcher = Literal["none", "torchrun", "rank", "srun", "pdsh"]
MismatchField = Literal["op", "count", "dtype"]

ERAS: tuple[str, ...] = get_args(Era)
LAYOUTS: tuple[str, ...] = get_args(Layout)
LAUNCHERS: tuple[str, ...] = get_args(Launcher)
MISMATCH_FIELDS: tuple[str, ...] = get_args(MismatchField)

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


Fault: TypeAlias = SlowRank | StopRank | Mismatch | IbError


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
            "2.21" (2.21.5) or "2.27" (2.27.3).
        timestamps: Prefix INFO and WARN lines with ``[%F %T.%6f] `` as NCCL does with
            ``NCCL_DEBUG_TIMESTAMP_LEVELS=INFO,WARN`` and
            ``NCCL_DEBUG_TIMESTAMP_FORMAT="[%F %T.%6f] "``. Needs an era >= 2.26 (raises
            ``ValueError`` otherwise). Without it, era "2.27" still stamps WARN lines with
            the default ``[%F %T] ``, as real 2.26+ does.
        layout: ``"combined"``: one ``job.log`` with all processes' stdout interleaved (what
            a launcher or ``kubectl logs`` captures); ``"per-rank"``: one ``<host>.<pid>.log``
            per process, as ``NCCL_DEBUG_FILE=%h.%p.log`` writes (NCCL output only: no
            launcher prefix, no non-NCCL lines, and the <=2.22 bare banner becomes its INFO
            copy, as NCCL writes it to the debug file).
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
        self._validate_faults()

    @property
    def ranks_per_host(self) -> int:
        """Ranks (GPUs, processes) on each host."""
        return self.ranks // self.hosts

    @property
    def world_per_step(self) -> int:
        """World-communicator collectives per step (3 x layers + 1)."""
        return 3 * self.layers + 1

    def host_name(self, index: int) -> str:
        """Name of host ``index``."""
        return self.host_names[index] if self.host_names else f"node-{index}"

    def _validate_faults(self) -> None:
        limit = self.steps * self.world_per_step if self.target_size_bytes is None else None
        slow_seen: set[int] = set()
        names = [self.host_name(h) for h in range(self.hosts)]
        for fault in self.faults:
            if isinstance(fault, SlowRank | StopRank | Mismatch) and not (
                0 <= fault.rank < self.ranks
            ):
                raise ValueError(f"{fault}: rank must be in [0, {self.ranks - 1}]")
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
            if isinstance(fault, StopRank | Mismatch | IbError):
                if fault.at_instance < 0:
                    raise ValueError(f"{fault}: at_instance must be >= 0")
                if limit is not None and fault.at_instance >= limit:
                    raise ValueError(
                        f"{fault}: at_instance must be < {limit} "
                        f"({self.steps} steps x {self.world_per_step} world collectives)"
                    )
            elif not isinstance(fault, SlowRank):
                raise TypeError(f"unknown fault {fault!r}")


def _fault_json(fault: Fault) -> dict[str, Json]:
    out: dict[str, Json] = {"kind": type(fault).__name__}
    out.update(asdict(fault))
    return out


def _spec_json(spec: SynthSpec) -> dict[str, Json]:
    out: dict[str, Json] = {}
    for key, value in asdict(spec).items():
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

    def to_dict(self) -> dict[str, Json]:
        """Plain JSON-compatible dict."""
        out: dict[str, Json] = asdict(self)
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
    "2.27": _EraFormat(
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
    ),
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

    def __init__(self, rnd: random.Random, heads: list[str], total_steps: int) -> None:
        self._rnd = rnd
        self._heads = heads
        self._ds_sec = _SecondCache("%Y-%m-%d %H:%M:%S")
        self._total = max(total_steps, 1)
        self.count = 0
        kinds: list[tuple[float, Callable[[int, float, int], str]]] = [
            (0.15, self._blank),
            (0.20, self._print),
            (0.10, self._warning),
            (0.15, self._ds_progress),
            (0.15, self._ds_timers),
            (0.10, self._ds_throughput),
            (0.15, self._tqdm),
        ]
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
        return self.emit(rank, self._rnd.choice(_PY_WARNINGS), "  warnings.warn(")

    def _ds_progress(self, rank: int, t: float, step: int) -> str:
        lr = 3e-4 * min(1.0, (step + 1) / 100)
        return self.emit(
            0,
            f"{self.ds_ts(t)} [INFO] [logging.py:128:log_dist] [Rank 0] step={step}, "
            f"skipped=0, lr=[{lr!r}], mom=[(0.9, 0.95)]",
        )

    def _ds_timers(self, rank: int, t: float, step: int) -> str:
        r = self._rnd
        fwd, bwd = r.uniform(80, 160), r.uniform(160, 330)
        return self.emit(
            0,
            f"{self.ds_ts(t)} [INFO] [logging.py:128:log_dist] [Rank 0] time (ms) | "
            f"fwd_microstep: {fwd:.2f} | bwd_microstep: {bwd:.2f} | "
            f"bwd_inner_microstep: {bwd * 0.93:.2f} | bwd_allreduce_microstep: "
            f"{r.uniform(0.01, 0.2):.2f} | step_microstep: {r.uniform(10, 40):.2f}",
        )

    def _ds_throughput(self, rank: int, t: float, step: int) -> str:
        r = self._rnd
        cur = r.uniform(90, 140)
        return self.emit(
            0,
            f"{self.ds_ts(t)} [INFO] [timer.py:264:stop] epoch=0/micro_step={step}/"
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
        self.world, self.host_comms = self._make_comms()
        self.comms = [self.world, *self.host_comms]
        self.prog = self._program()
        self.late = [0.0] * self.n
        for f in spec.faults:
            if isinstance(f, SlowRank):
                self.late[f.rank] = f.lateness_s
        terminal = [
            f
            for f in spec.faults
            if isinstance(f, StopRank | IbError) or (isinstance(f, Mismatch) and f.hang)
        ]
        # World instance at which the job ends (-1: it does not end early).
        self.halt_at = min((f.at_instance for f in terminal), default=-1)
        self.stops_at_halt = frozenset(
            f.rank for f in spec.faults if isinstance(f, StopRank) and f.at_instance == self.halt_at
        )
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
            random.Random(spec.seed * 7919 + 1), [rk.head for rk in self.ranks], total_steps
        )
        self.noise_on = noise_on
        # Benign WARNs draw from their own generator, so that benign_warns=0 leaves every
        # other random choice (and so every byte) as it was.
        self.warn_rnd = random.Random(spec.seed * 7919 + 2)
        self.benign: list[BenignWarnRecord] = []

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

        prog: list[_Call] = []
        for layer in range(spec.layers):
            prog.append(_Call(True, "AllGather", shard(params[layer]), _BF16, layer))
            if spec.tp_traffic:
                prog.append(_Call(False, "AllReduce", activations, _BF16, 1000 + layer))
        for layer in reversed(range(spec.layers)):
            prog.append(_Call(True, "AllGather", shard(params[layer]), _BF16, layer))
            if spec.tp_traffic:
                prog.append(_Call(False, "AllReduce", activations, _BF16, 2000 + layer))
            prog.append(_Call(True, "ReduceScatter", shard(params[layer]), _BF16, 3000 + layer))
        prog.append(_Call(True, "AllReduce", lambda size: 1, _FP32, 4000))
        return prog

    # ---- line helpers ----------------------------------------------------------------

    def _ts(self, t: float) -> str:
        if not self.spec.timestamps:
            return ""
        sec = int(t)
        return f"{self.info_sec.get(sec)}.{int((t - sec) * 1e6):06d}] "

    def _warn_ts(self, t: float) -> str:
        if self.spec.timestamps:
            return self._ts(t)
        if self.era.warn_default_ts:  # 2.26+ default NCCL_DEBUG_TIMESTAMP_LEVELS=WARN
            return f"{self.info_sec.get(int(t))}] "
        return ""

    def _info(self, rk: _Rank, t: float, msg: str, *, proxy: bool = False) -> str:
        return f"{rk.head}{self._ts(t)}{rk.proxy_info if proxy else rk.info}{msg}\n"

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
            f"{rk.head}\n{rk.head}{self._warn_ts(t)}{rk.host}:{rk.pid}:"
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
        return self.noise.emit(
            rank,
            f"{self.noise.ds_ts(t)} [INFO] [real_accelerator.py:203:get_accelerator] "
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
        late = self.late
        any_late = any(late)
        gap = spec.step_time_s / len(prog) + max(late)  # everyone waits for the straggler
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
                if any_late:
                    times = [base + rnd() * _JITTER_S + late[r] for r in rr]
                else:
                    times = [base + rnd() * _JITTER_S for _ in rr]
                out: list[str] = []
                for r in sorted(rr, key=times.__getitem__) if combined else rr:
                    if skip and r in skip:
                        continue
                    t = times[r]
                    if ts_on:
                        sec = int(t)
                        if sec != last_sec:
                            last_sec = sec
                            sec_str = sec_cache.get(sec)
                        line = f"{heads[r]}{sec_str}.{int((t - sec) * 1e6):06d}] {bj[r]}{oc}{aj[r]}"
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
                    self._touch(max(times))
                    self._aftermath(max(times))
                    return
                if pending >= _FLUSH_CHARS:
                    written = self._flush_all()
                    pending = 0
            step += 1
            self.steps_completed = step
        if times:
            self._touch(max(times))

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
        for mm in mms or ():
            if mm.field == "op" and mm.rank not in skip:
                other = _OTHER_OP[call.op]
                by[call.op] -= 1
                by[other] = by.get(other, 0) + 1

    # ---- fault aftermath -------------------------------------------------------------

    def _aftermath(self, t_last: float) -> None:
        if self.ib_at_halt is not None:
            self.end_reason = "error"
            self._ib_error(self.ib_at_halt, t_last)
        else:
            self.end_reason = "hang"

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
        self._open_sinks()
        try:
            self._emit_events(init)
            self._run_steps(steps_t0)
            if self.end_reason in ("completed", "target_size"):
                self._emit_events(self._end_events())
        finally:
            for s in self.sinks:
                s.close()
        truth = self._truth()
        (self.out_dir / TRUTH_FILE).write_text(truth.to_json() + "\n", encoding="utf-8")
        return truth

    def _last_seq(self) -> dict[str, dict[str, int | None]]:
        out: dict[str, dict[str, int | None]] = {}
        for c in self.comms:
            last = c.seq - 1 if c.seq > 0 else None
            out[c.name] = {str(g): last for g in c.members}
        for r in self.skipped:
            out["world"][str(r)] = self.halt_at - 1 if self.halt_at > 0 else None
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
            non_nccl_lines=self.noise.count,
            first_ts=_iso(self.first_t if math.isfinite(self.first_t) else self.t0),
            last_ts=_iso(self.last_t),
            faults=[self._outcome(f, last) for f in self.spec.faults],
            benign_warns=list(self.benign),
        )

    def _world_call(self, instance: int) -> _Call:
        j = instance % self.spec.world_per_step
        return [call for call in self.prog if call.world][j]

    def _outcome(self, f: Fault, last: dict[str, dict[str, int | None]]) -> FaultOutcome:
        kind = type(f).__name__
        details: dict[str, Json] = {}
        if isinstance(f, SlowRank):
            rk = self.ranks[f.rank]
            details = {
                "rank": f.rank,
                "host": rk.host,
                "pid": rk.pid,
                "lateness_s": f.lateness_s,
                "visible_in_timestamps": self.spec.timestamps,
            }
            return FaultOutcome(kind, _fault_json(f), f.lateness_s > 0, details)
        reached = f.at_instance < self.world.seq
        if isinstance(f, Mismatch) and not f.hang:
            effective = reached and not (f.at_instance == self.halt_at and f.rank in self.skipped)
        elif isinstance(f, Mismatch):
            effective = reached and f.at_instance == self.halt_at and f.rank not in self.skipped
        else:
            effective = reached and f.at_instance == self.halt_at
        details = {"at_instance": f.at_instance, "reached": reached}
        if isinstance(f, StopRank):
            rk = self.ranks[f.rank]
            details.update({"rank": f.rank, "host": rk.host, "pid": rk.pid})
            last_json: dict[str, Json] = {name: dict(per) for name, per in last.items()}
            details["last_seq"] = last_json
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
