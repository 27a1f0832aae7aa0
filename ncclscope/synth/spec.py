"""``SynthSpec``: what to generate, validated when constructed, and its truth.json form."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from ncclscope.synth.eras import _ERA_FORMATS
from ncclscope.synth.faults import (
    _SIGNUM,
    DEAD_SIGNALS,
    DeadProcess,
    ExtraCollective,
    Fault,
    IbError,
    Mismatch,
    SlowHost,
    SlowRank,
    SlowSpell,
    StopRank,
    _fault_json,
    _is_terminal,
)
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
    Offload,
    TorchEra,
)


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
            "2.21" (2.21.5), "2.26" (2.26.2), "2.26.5" or "2.27" (2.27.3). "2.26" prints
            its sub-second timestamp digits wrong, as 2.26.2 does (see ``_subsec_226``);
            "2.26.5" writes the same lines with them right (fixed in 2.26.3).
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
            host (``telemetry/part-*.parquet``, see ``ncclscope.synth.telemetry``), and run the
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
        gpus_per_switch: The PCIe topology the telemetry records: 1, every GPU on a root
            port of its own; 2, 4 or 8, that many GPUs (by local index) behind one PCIe
            switch whose Gen4 x16 uplink they share. Needs ``telemetry``.
        contention_switch: With ``pcie_contention`` and ``gpus_per_switch`` > 1: only
            the GPUs behind this switch (0-based, on each contended host) are contended,
            on their shared uplink: together they carry what the uplink delivers (about
            25 GB/s), each GPU's own link reading 1/k of that. ``None``: every GPU of the
            host, on its own link (85-97% of it).
        contention_memory_pressure: A contended host's memory runs low and it swaps
            actively; False: its memory stays as a healthy host's.
        idle_swap_bytes: Swap every host has in use from before the job (old pages),
            its swap-in/out counters flat.
        telemetry_domain: The telemetry's host names carry this domain
            (``node-7.cluster.internal``), as the agent records ``gethostname()``; the
            logs keep NCCL's short names.
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
    gpus_per_switch: int = 1
    contention_switch: int | None = None
    contention_memory_pressure: bool = True
    idle_swap_bytes: int = 0
    telemetry_domain: str = ""

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
        per_host = self.ranks // self.hosts
        if self.gpus_per_switch not in (1, 2, 4, 8) or per_host % self.gpus_per_switch:
            raise ValueError(
                f"gpus_per_switch must be 1, 2, 4 or 8 and divide the {per_host} GPUs per host"
            )
        if self.contention_switch is not None and not (
            self.gpus_per_switch > 1
            and 0 <= self.contention_switch < per_host // self.gpus_per_switch
        ):
            raise ValueError(
                "contention_switch needs gpus_per_switch > 1 and must name one of the "
                f"{per_host // self.gpus_per_switch} switches of a host"
            )
        if self.idle_swap_bytes < 0:
            raise ValueError("idle_swap_bytes must be >= 0")
        if self.telemetry_domain and (
            self.telemetry_domain.startswith(".") or any(c.isspace() for c in self.telemetry_domain)
        ):
            raise ValueError("telemetry_domain: a domain such as cluster.internal")

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
    "gpus_per_switch": 1,
    "contention_switch": None,
    "contention_memory_pressure": True,
    "idle_swap_bytes": 0,
    "telemetry_domain": "",
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
