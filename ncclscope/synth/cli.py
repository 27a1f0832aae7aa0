"""``ncclscope synth``: the command-line face of :mod:`ncclscope.synth`.

The main CLI group registers it with ``cli.add_command(synth)``; it also runs on its own as
``python -m ncclscope.synth.cli``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import click

from ncclscope.synth import (
    DEAD_SIGNALS,
    DS_ERAS,
    ERAS,
    FRAMEWORKS,
    LAUNCHERS,
    LAYOUTS,
    MISMATCH_FIELDS,
    OFFLOADS,
    TORCH_ERAS,
    ZERO_STAGES,
    DeadProcess,
    ExtraCollective,
    Fault,
    IbError,
    Mismatch,
    SlowRank,
    StopRank,
    SynthSpec,
    Truth,
    generate,
)

__all__ = ["parse_size", "synth"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Parse a size such as ``1GB``, ``200MB``, ``1.5GiB`` or ``4096`` into bytes.

    Units are binary (``1GB`` = ``1GiB`` = 2**30 bytes), matching what ``ls -lh`` shows.

    Raises:
        ValueError: The text is not a positive size.
    """
    m = _SIZE_RE.match(text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (try 1GB, 200MB, 512KiB or a byte count)")
    size = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if size <= 0:
        raise ValueError(f"size must be > 0: {text!r}")
    return size


def _split(value: str, n: int, option: str, shape: str) -> list[str]:
    parts = value.split(":")
    if len(parts) != n or not all(parts):
        raise click.UsageError(f"{option} expects {shape}, got {value!r}")
    return parts


def _int(text: str, option: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise click.UsageError(f"{option}: {what} must be an integer, got {text!r}") from None


def _faults(
    slow: tuple[str, ...],
    stop: tuple[str, ...],
    mismatch: tuple[str, ...],
    ib: tuple[str, ...],
    extra: tuple[str, ...] = (),
    dead: tuple[str, ...] = (),
) -> tuple[Fault, ...]:
    out: list[Fault] = []
    for v in slow:
        rank, secs = _split(v, 2, "--slow-rank", "RANK:SECONDS")
        try:
            lateness = float(secs)
        except ValueError:
            raise click.UsageError(f"--slow-rank: SECONDS must be a number, got {secs!r}") from None
        out.append(SlowRank(_int(rank, "--slow-rank", "RANK"), lateness))
    for v in stop:
        rank, inst = _split(v, 2, "--stop-rank", "RANK:INSTANCE")
        out.append(
            StopRank(_int(rank, "--stop-rank", "RANK"), _int(inst, "--stop-rank", "INSTANCE"))
        )
    for v in mismatch:
        rank, inst, field = _split(v, 3, "--mismatch", "RANK:INSTANCE:FIELD")
        if field not in MISMATCH_FIELDS:
            raise click.UsageError(
                f"--mismatch: FIELD must be one of {', '.join(MISMATCH_FIELDS)}, got {field!r}"
            )
        out.append(
            Mismatch(
                _int(rank, "--mismatch", "RANK"),
                _int(inst, "--mismatch", "INSTANCE"),
                field,  # type: ignore[arg-type]  # checked against MISMATCH_FIELDS above
            )
        )
    for v in ib:
        host, inst = _split(v, 2, "--ib-error", "HOST:INSTANCE")
        out.append(IbError(host, _int(inst, "--ib-error", "INSTANCE")))
    for v in extra:
        rank, inst = _split(v, 2, "--extra-collective", "RANK:INSTANCE")
        out.append(
            ExtraCollective(
                _int(rank, "--extra-collective", "RANK"),
                _int(inst, "--extra-collective", "INSTANCE"),
            )
        )
    for v in dead:
        shape = "RANK:INSTANCE[:SIGNAL]"
        parts = _split(v, v.count(":") + 1, "--dead-process", shape)
        if len(parts) not in (2, 3):
            raise click.UsageError(f"--dead-process expects {shape}, got {v!r}")
        sig = parts[2] if len(parts) == 3 else "SIGKILL"
        if sig not in DEAD_SIGNALS:
            raise click.UsageError(
                f"--dead-process: SIGNAL must be one of {', '.join(DEAD_SIGNALS)}, got {sig!r}"
            )
        out.append(
            DeadProcess(
                _int(parts[0], "--dead-process", "RANK"),
                _int(parts[1], "--dead-process", "INSTANCE"),
                sig,  # type: ignore[arg-type]  # checked against DEAD_SIGNALS above
            )
        )
    return tuple(out)


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{size} B"  # pragma: no cover - loop always returns


def _summary(truth: Truth, out_dir: Path, seconds: float) -> str:
    size = sum(f.bytes for f in truth.files)
    lines = sum(f.lines for f in truth.files)
    files = truth.files[0].path if len(truth.files) == 1 else f"{len(truth.files)} per-rank files"
    rate = size / seconds / 1e6 if seconds > 0 else 0.0
    warns = f", {len(truth.benign_warns)} benign WARNs" if truth.benign_warns else ""
    if truth.noise:
        warns += f", {len(truth.noise)} one-off delays"
    fw = ""
    if truth.framework is not None:
        timeouts = truth.framework.get("timeouts")
        n_timeouts = len(timeouts) if isinstance(timeouts, list) else 0
        fw = (
            f", {truth.framework['name']} {truth.framework['lines']:,} lines"
            f"{f' ({n_timeouts} watchdog timeouts)' if n_timeouts else ''}"
        )
    return (
        f"synth: wrote {files} to {out_dir}: {_human(size)}, {lines:,} lines, "
        f"{truth.coll_calls:,} COLL calls{warns}{fw}, {truth.steps_completed} steps, "
        f"end={truth.end_reason}; truth.json beside it ({seconds:.1f} s, {rate:.0f} MB/s)"
    )


_EPILOG = """\b
Examples:
  ncclscope synth --out /tmp/job --ranks 16 --hosts 2 --steps 20 \\
      --era 2.27 --timestamps --launcher torchrun --slow-rank 5:0.05
  ncclscope synth --out /tmp/hang --stop-rank 3:40
  ncclscope synth --out /tmp/big --ranks 64 --hosts 8 --timestamps --size 1GB
  ncclscope synth --out /tmp/noisy --ranks 64 --hosts 8 --size 1GB --warns 8
  ncclscope synth --out /tmp/ds --framework deepspeed --zero-stage 3 --offload optimizer \\
      --launcher torchrun --timestamps --slow-rank 5:0.05 --comms-summary
  ncclscope synth --out /tmp/ds-hang --framework deepspeed --torch-era 2.7 \\
      --stop-rank 5:40 --desync-report
  ncclscope synth --out /tmp/fsdp --framework torch --torch-era 2.1 --layout per-rank \\
      --stop-rank 3:40
  ncclscope synth --out /tmp/bench --era 2.26 --timestamps --clock-offset-max 0.001 \\
      --jitter-events 20 --slow-rank 3:0.02 --slow-rank 9:0.05 --truth-format 2
  ncclscope synth --out /tmp/extra --framework torch --extra-collective 5:40
  ncclscope synth --out /tmp/oom --framework torch --torch-era 2.7 --dead-process 5:40

\b
Collective instances are numbered from 0 along the world communicator; one step has
3 x LAYERS + 1 of them (per layer an AllGather forward, AllGather + ReduceScatter
backward, then one grad-norm AllReduce); 2 x LAYERS + 1 with --zero-stage 1|2 (a
ReduceScatter per layer, the grad-norm AllReduce, then an AllGather per layer).

\b
--framework adds what PyTorch and DeepSpeed print (formats/deepspeed-torch.md):
DeepSpeed start-up, config dump and per-step timers on rank 0; on a hang, after
--pg-timeout, the watchdog lines of every rank that entered the collective and the
torchrun agent's SIGTERM / ChildFailedError lines. truth.json gets a "framework" key.
"""


@click.command("synth", epilog=_EPILOG)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to write the logs and truth.json into (created if missing).",
)
@click.option("--ranks", default=16, show_default=True, help="Number of ranks (GPUs).")
@click.option("--hosts", default=2, show_default=True, help="Number of hosts (divides --ranks).")
@click.option(
    "--steps",
    default=10,
    show_default=True,
    help="Training steps to emit (ignored with --size).",
)
@click.option("--layers", default=4, show_default=True, help="Layers per step.")
@click.option(
    "--era",
    type=click.Choice(ERAS),
    default="2.27",
    show_default=True,
    help="NCCL release whose exact line formats are written.",
)
@click.option(
    "--timestamps/--no-timestamps",
    default=False,
    show_default=True,
    help=(
        "NCCL 2.26+ '[%F %T.%6f] ' prefix on INFO and WARN lines (needs --era 2.26|2.26.5|2.27)."
    ),
)
@click.option(
    "--layout",
    type=click.Choice(LAYOUTS),
    default="combined",
    show_default=True,
    help="One interleaved job.log, or one <host>.<pid>.log per process (NCCL_DEBUG_FILE).",
)
@click.option(
    "--launcher",
    type=click.Choice(LAUNCHERS),
    default="none",
    show_default=True,
    help="Launcher line prefix: [default0]:, [rank0]:, '0: ' or 'host: '.",
)
@click.option("--seed", default=0, show_default=True, help="Random seed (same seed, same bytes).")
@click.option(
    "--non-nccl-frac",
    default=0.05,
    show_default=True,
    help="Fraction of non-NCCL lines (python, DeepSpeed, tqdm, blanks); combined layout only.",
)
@click.option(
    "--size",
    "size",
    default=None,
    metavar="SIZE",
    help="Emit steps until the output reaches SIZE (e.g. 200MB, 1GB; binary units).",
)
@click.option(
    "--step-time",
    default=0.5,
    show_default=True,
    help="Seconds per training step (before stragglers).",
)
@click.option(
    "--tp-traffic/--no-tp-traffic",
    default=False,
    show_default=True,
    help="Also AllReduce per layer on each intra-host communicator.",
)
@click.option(
    "--host-names",
    default=None,
    metavar="A,B,...",
    help="Comma-separated host names (default node-0, node-1, ...).",
)
@click.option(
    "--warns",
    "warns",
    default=0,
    show_default=True,
    metavar="N",
    help=(
        "N harmless WARN lines spread evenly over the run (by bytes with --size), each on a "
        "random rank: an IB async 'SM change' event in the era's WARN format, which NCCL only "
        "logs; the job goes on. Recorded in truth.json (benign_warns). Needs >= 2 hosts."
    ),
)
@click.option(
    "--framework",
    type=click.Choice(FRAMEWORKS),
    default="none",
    show_default=True,
    help="Also write the training framework's lines: a DeepSpeed ZeRO job on PyTorch, or "
    "plain PyTorch DDP/FSDP. 'none' writes NCCL lines only.",
)
@click.option(
    "--zero-stage",
    type=click.Choice([str(s) for s in ZERO_STAGES]),
    default="3",
    show_default=True,
    help="DeepSpeed ZeRO stage (needs --framework deepspeed); 1|2 change the collectives.",
)
@click.option(
    "--offload",
    type=click.Choice(OFFLOADS),
    default="none",
    show_default=True,
    help="DeepSpeed ZeRO CPU offload (param|both need --zero-stage 3).",
)
@click.option(
    "--ds-era",
    type=click.Choice(DS_ERAS),
    default="new",
    show_default=True,
    help="DeepSpeed timer format: old (<= 0.10.0, 'rank=0 time (ms) | forward_microstep') "
    "or new (>= 0.10.1, 'time (ms) | fwd_microstep').",
)
@click.option(
    "--torch-era",
    type=click.Choice(TORCH_ERAS),
    default="2.4",
    show_default=True,
    help="PyTorch generation of the watchdog and torchrun lines (prefixes, companion lines).",
)
@click.option(
    "--pg-timeout",
    "pg_timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help="Process-group timeout [default: 1800 for deepspeed, 600 for torch >= 2.2].",
)
@click.option(
    "--steps-per-print",
    default=10,
    show_default=True,
    metavar="N",
    help="DeepSpeed progress and throughput lines every N steps.",
)
@click.option(
    "--comms-summary/--no-comms-summary",
    default=False,
    show_default=True,
    help="DeepSpeed comms-logger summary table when the job ends normally.",
)
@click.option(
    "--desync-report/--no-desync-report",
    default=False,
    show_default=True,
    help="TORCH_NCCL_DESYNC_DEBUG=1: on a hang, each waiting rank names the lagging ranks.",
)
@click.option(
    "--clock-offset-max",
    "clock_offset_max",
    type=float,
    default=0.0,
    show_default=True,
    metavar="SECONDS",
    help="Each host's clock is off by a constant drawn in [-SECONDS, +SECONDS] (e.g. 0.001): "
    "every printed time of its processes shifts, the true order stays. truth.json: "
    "clock_offsets.",
)
@click.option(
    "--jitter-events",
    "jitter_events",
    default=0,
    show_default=True,
    metavar="N",
    help="N one-off delays (not faults): a random rank enqueues a random world collective "
    "5-50 ms late, holding everyone up. truth.json: noise.",
)
@click.option(
    "--truth-format",
    "truth_format",
    type=click.Choice(["1", "2"]),
    default="1",
    show_default=True,
    help="truth.json format_version: 2 always writes clock_offsets and noise, and each "
    "slow rank's slowdown (lateness / median gap between world collectives).",
)
@click.option(
    "--slow-rank",
    multiple=True,
    metavar="RANK:SECONDS",
    help="RANK enqueues every collective SECONDS late. Repeatable (one per rank).",
)
@click.option(
    "--stop-rank",
    multiple=True,
    metavar="RANK:INSTANCE",
    help="RANK never enters world instance INSTANCE; the job hangs there. Repeatable.",
)
@click.option(
    "--mismatch",
    multiple=True,
    metavar="RANK:INSTANCE:FIELD",
    help="RANK logs a different op|count|dtype at INSTANCE, then the job hangs. Repeatable.",
)
@click.option(
    "--ib-error",
    multiple=True,
    metavar="HOST:INSTANCE",
    help="IB completion error on HOST during INSTANCE; the job dies. Repeatable.",
)
@click.option(
    "--extra-collective",
    multiple=True,
    metavar="RANK:INSTANCE",
    help="RANK calls an extra AllReduce (count 1, fp32) before INSTANCE: at that opCount it "
    "differs from the others, its real call comes one later; the job hangs. Repeatable.",
)
@click.option(
    "--dead-process",
    multiple=True,
    metavar="RANK:INSTANCE[:SIGNAL]",
    help="RANK's process dies just before INSTANCE (SIGKILL by default, exit code -9; "
    f"or {', '.join(s for s in DEAD_SIGNALS if s != 'SIGKILL')}). With a framework its "
    "torchrun agent reports it at once. Repeatable.",
)
@click.option(
    "--telemetry/--no-telemetry",
    default=False,
    show_default=True,
    help="Also write what 'ncclscope agent --out' would have sampled on each host "
    "(telemetry/part-*.parquet: GPU memory, PCIe, host memory), for 'analyze --telemetry'. "
    "The optimizer step then shows as a pause between steps' collectives. truth.json: "
    "telemetry.",
)
@click.option(
    "--telemetry-interval",
    "telemetry_interval",
    type=float,
    default=0.1,
    show_default=True,
    metavar="SECONDS",
    help="The agent's sampling interval.",
)
@click.option(
    "--pcie-contention",
    "pcie_contention",
    multiple=True,
    metavar="HOST",
    help="HOST's GPUs saturate PCIe during the optimizer step (ZeRO offload): its ranks' "
    "optimizer step lasts --contention-inflation times as long, its host memory runs low. "
    "Needs --telemetry, --framework deepspeed, --offload optimizer|both. Repeatable.",
)
@click.option(
    "--contention-from-step",
    "contention_from_step",
    default=0,
    show_default=True,
    metavar="STEP",
    help="First (0-based) step that is contended.",
)
@click.option(
    "--contention-inflation",
    "contention_inflation",
    type=float,
    default=2.5,
    show_default=True,
    help="How many times longer a contended optimizer step lasts.",
)
@click.option(
    "--memory-growth",
    "memory_growth",
    multiple=True,
    type=int,
    metavar="RANK",
    help="RANK's GPU memory grows every step (--memory-growth-per-step). Needs --telemetry. "
    "Repeatable.",
)
@click.option(
    "--memory-growth-per-step",
    "memory_growth_per_step",
    default="1GiB",
    show_default=True,
    metavar="SIZE",
    help="How much a growing rank's GPU memory grows per step.",
)
@click.option(
    "--gpu-cache-ratio",
    "gpu_cache_ratio",
    default=None,
    metavar="LO,HI",
    help="Every GPU's memory sits flat between LO and HI of its total after the first step, "
    "as PyTorch's caching allocator holds it on a healthy job (e.g. 0.95,0.99). Needs "
    "--telemetry.",
)
@click.option(
    "--gpus-per-switch",
    "gpus_per_switch",
    type=click.Choice(["1", "2", "4", "8"]),
    default="1",
    show_default=True,
    help="The PCIe topology the telemetry records: GPUs behind each PCIe switch's Gen4 x16 "
    "uplink (1: each GPU on a root port of its own). Needs --telemetry.",
)
@click.option(
    "--contention-switch",
    "contention_switch",
    type=int,
    default=None,
    metavar="N",
    help="With --pcie-contention and --gpus-per-switch > 1: only the GPUs behind switch N "
    "(0-based) of each contended host are contended, on the uplink they share (~25 GB/s "
    "in all, each own link reading 1/k of it).",
)
@click.option(
    "--contention-memory-pressure/--no-contention-memory-pressure",
    "contention_memory_pressure",
    default=True,
    show_default=True,
    help="A contended host's memory runs low and it swaps actively.",
)
@click.option(
    "--idle-swap",
    "idle_swap",
    default="0",
    show_default=True,
    metavar="SIZE",
    help="Swap every host has in use from before the job (e.g. 135MB), counters flat.",
)
@click.option(
    "--telemetry-domain",
    "telemetry_domain",
    default="",
    metavar="DOMAIN",
    help="The telemetry's host names are HOST.DOMAIN (node-7.cluster.internal), as the agent "
    "records gethostname(); the logs keep NCCL's short names.",
)
def synth(
    out_dir: Path,
    ranks: int,
    hosts: int,
    steps: int,
    layers: int,
    era: str,
    timestamps: bool,
    layout: str,
    launcher: str,
    seed: int,
    non_nccl_frac: float,
    size: str | None,
    step_time: float,
    tp_traffic: bool,
    host_names: str | None,
    warns: int,
    framework: str,
    zero_stage: str,
    offload: str,
    ds_era: str,
    torch_era: str,
    pg_timeout: float | None,
    steps_per_print: int,
    comms_summary: bool,
    desync_report: bool,
    clock_offset_max: float,
    jitter_events: int,
    truth_format: str,
    slow_rank: tuple[str, ...],
    stop_rank: tuple[str, ...],
    mismatch: tuple[str, ...],
    ib_error: tuple[str, ...],
    extra_collective: tuple[str, ...],
    dead_process: tuple[str, ...],
    telemetry: bool,
    telemetry_interval: float,
    pcie_contention: tuple[str, ...],
    contention_from_step: int,
    contention_inflation: float,
    memory_growth: tuple[int, ...],
    memory_growth_per_step: str,
    gpu_cache_ratio: str | None,
    gpus_per_switch: str,
    contention_switch: int | None,
    contention_memory_pressure: bool,
    idle_swap: str,
    telemetry_domain: str,
) -> None:
    """Write a synthetic multi-rank NCCL_DEBUG=INFO job log with known ground truth.

    The logs follow the exact NCCL line formats of the chosen --era; truth.json records the
    ranks, communicators, collective counts and what each injected fault did.
    """
    target: int | None = None
    if size is not None:
        try:
            target = parse_size(size)
        except ValueError as exc:
            raise click.UsageError(f"--size: {exc}") from None
    names = tuple(h.strip() for h in host_names.split(",")) if host_names else ()
    try:
        growth_bytes = parse_size(memory_growth_per_step)
    except ValueError as exc:
        raise click.UsageError(f"--memory-growth-per-step: {exc}") from None
    try:
        idle_swap_bytes = 0 if idle_swap.strip() in ("", "0") else parse_size(idle_swap)
    except ValueError as exc:
        raise click.UsageError(f"--idle-swap: {exc}") from None
    cache: tuple[float, float] | None = None
    if gpu_cache_ratio is not None:
        try:
            lo_s, hi_s = gpu_cache_ratio.split(",")
            cache = (float(lo_s), float(hi_s))
        except ValueError:
            raise click.UsageError(
                f"--gpu-cache-ratio: expected LO,HI such as 0.95,0.99, got {gpu_cache_ratio!r}"
            ) from None
    try:
        spec = SynthSpec(
            ranks=ranks,
            hosts=hosts,
            steps=steps,
            layers=layers,
            era=era,  # type: ignore[arg-type]  # click.Choice(ERAS) guarantees it
            timestamps=timestamps,
            layout=layout,  # type: ignore[arg-type]
            launcher=launcher,  # type: ignore[arg-type]
            seed=seed,
            non_nccl_frac=non_nccl_frac,
            target_size_bytes=target,
            faults=_faults(
                slow_rank, stop_rank, mismatch, ib_error, extra_collective, dead_process
            ),
            host_names=names,
            step_time_s=step_time,
            tp_traffic=tp_traffic,
            benign_warns=warns,
            framework=framework,  # type: ignore[arg-type]  # click.Choice guarantees these
            zero_stage=int(zero_stage),
            offload=offload,  # type: ignore[arg-type]
            ds_era=ds_era,  # type: ignore[arg-type]
            torch_era=torch_era,  # type: ignore[arg-type]
            pg_timeout_s=pg_timeout,
            steps_per_print=steps_per_print,
            comms_summary=comms_summary,
            desync_report=desync_report,
            clock_offset_max_s=clock_offset_max,
            jitter_events=jitter_events,
            truth_format=int(truth_format),
            telemetry=telemetry,
            telemetry_interval_s=telemetry_interval,
            pcie_contention=pcie_contention,
            contention_from_step=contention_from_step,
            contention_inflation=contention_inflation,
            memory_growth=memory_growth,
            memory_growth_bytes_per_step=growth_bytes,
            gpu_cache_ratio=cache,
            gpus_per_switch=int(gpus_per_switch),
            contention_switch=contention_switch,
            contention_memory_pressure=contention_memory_pressure,
            idle_swap_bytes=idle_swap_bytes,
            telemetry_domain=telemetry_domain,
        )
    except (ValueError, TypeError) as exc:
        raise click.UsageError(str(exc)) from None
    start = time.perf_counter()
    try:
        truth = generate(spec, out_dir)
    except OSError as exc:
        raise click.ClickException(f"cannot write to {out_dir}: {exc}") from None
    except ValueError as exc:  # options that each hold but together leave nothing to write
        raise click.UsageError(str(exc)) from None
    click.echo(_summary(truth, out_dir, time.perf_counter() - start))


if __name__ == "__main__":
    synth()
