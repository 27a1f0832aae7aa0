"""``ncclscope agent`` and ``ncclscope replay``: the sidecar and its recorded twin."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import click

from ncclscope.agent.exporter import DEFAULT_LISTEN
from ncclscope.agent.run import Agent, AgentConfig, LineSource
from ncclscope.parsers.common import parse_zone

if TYPE_CHECKING:  # ``ncclscope run`` only: the sidecar never loads it
    from ncclscope.agent.launch import SignalForwarder

__all__ = ["agent", "replay", "run"]

_F = TypeVar("_F", bound=Callable[..., Any])

#: How --log-start may be written (the logs' own ``2025-03-14 09:00:00.126364`` too).
_LOG_TIME_FORMATS = (
    "%Y-%m-%d %H:%M:%S.%f",
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%dT%H:%M:%S.%f",
    "%Y-%m-%dT%H:%M:%S",
)

_LISTEN_HELP = (
    "Serve /metrics on ADDR:PORT. The default listens on 127.0.0.1 only; to let the "
    "cluster's Prometheus scrape it, give the node's address or 0.0.0.0, e.g. "
    "--listen 0.0.0.0:9477 (9477: not node_exporter's 9100 nor dcgm-exporter's 9400). "
    "'none' serves nothing."
)


def _stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT (the loop waits on it, so it stops at once)."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def _listen(value: str) -> str | None:
    return None if value.lower() == "none" else value


def _follower(patterns: list[str], *, from_start: bool) -> LineSource:
    from ncclscope.agent.follow import Follower

    return Follower(patterns, from_start=from_start)


def _nvml(fake_gpus: int, per_switch: int = 1) -> Any:
    """NVML's collector, or one over ``fake_gpus`` simulated GPUs (``per_switch`` of them
    behind each PCIe switch)."""
    from ncclscope.agent.nvml import NvmlCollector

    if fake_gpus:
        from ncclscope.agent.fake_nvml import FakeNvml

        return NvmlCollector(FakeNvml.with_devices(fake_gpus, gpus_per_switch=per_switch))
    return NvmlCollector()


def _collect_config(
    collect_at: tuple[float, float | None] | None, out: Path | None
) -> dict[str, Any]:
    """AgentConfig's evidence fields from ``--collect-at`` and the folder."""
    if collect_at is None or out is None:
        return {"evidence_out": None}
    share, seconds = collect_at
    return {"evidence_out": out, "collect_at": share, "collect_at_s": seconds}


def _announce(a: Agent) -> None:
    if a.nvml_message:
        click.echo(f"ncclscope agent: {a.nvml_message}", err=True)
    if a.bound is not None:
        host, port = a.bound
        click.echo(f"ncclscope agent: serving http://{host}:{port}/metrics", err=True)


def _collect_at(
    _ctx: click.Context, _param: click.Parameter, value: str
) -> tuple[float, float | None] | None:
    """``--collect-at``: (share of the timeout, seconds or None); None for ``off``."""
    text = value.strip().lower()
    if text in ("off", "never", "none"):
        return None
    share: float | None = None
    seconds: float | None = None
    try:
        if text.endswith("%"):
            share = float(text[:-1]) / 100
        else:
            seconds = float(text.removesuffix("s"))
    except ValueError:
        pass
    if share is not None and 0 < share <= 1:
        return share, None
    if seconds is not None and seconds > 0:
        return 0.5, seconds
    raise click.BadParameter(
        f"{value!r}: give a share of the collective timeout (50%), seconds (240) or off"
    )


def _agent_options(fn: _F) -> _F:
    """The agent's options that ``agent`` and ``run`` share."""
    options = [
        click.option("--listen", default=DEFAULT_LISTEN, show_default=True, help=_LISTEN_HELP),
        click.option(
            "--interval",
            type=click.FloatRange(0.1, 60),
            default=1.0,
            show_default=True,
            help="Seconds between samples (0.1 to 60).",
        ),
        click.option(
            "--analyse-every",
            type=click.FloatRange(0.1, 600),
            default=5.0,
            show_default=True,
            help="Shortest time in seconds between two full analyses of the followed logs, "
            "run when a new rank, an NCCL warning or a watchdog line arrives. Stalls, "
            "sequences and the timeout countdown are updated every --interval anyway.",
        ),
        click.option(
            "--refresh-every",
            type=click.FloatRange(1, 3600),
            default=300.0,
            show_default=True,
            help="While lines arrive, a full analysis (findings, lateness, errors) at least "
            "this often, in seconds. A log at rest is never analysed again.",
        ),
        click.option(
            "--window-lines",
            type=click.IntRange(1_000, 10_000_000),
            default=100_000,
            show_default=True,
            help="Latest lines of the followed logs (over all files) the detectors look at; "
            "the logs' other lines (init, config, errors) are kept apart. Memory grows "
            "with it.",
        ),
        click.option(
            "--part-seconds",
            type=click.FloatRange(0.1, 3600),
            default=10.0,
            show_default=True,
            help="Seconds between telemetry part files (agent: with --out).",
        ),
        click.option(
            "--textfile",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Also write the metrics to this file for node_exporter's textfile collector.",
        ),
        click.option(
            "--pid", "pids", multiple=True, type=int, help="A job process to watch (repeatable)."
        ),
        click.option("--match", help="Watch the processes whose command line contains this text."),
        click.option(
            "--collect-at",
            default="50%",
            metavar="SHARE|SECONDS|off",
            show_default=True,
            callback=_collect_at,
            help="When a stalled collective has waited this long (a share of the collective "
            "timeout such as 50%, or seconds such as 240), ask the node's PyTorch processes "
            "for their Flight Recorder dumps and Python stacks (py-spy where they give "
            "none) and NCCL's RAS for its report, once per stall, into OUT/evidence/ "
            "(needs --out); 'off' asks nothing. Read them with analyze OUT/evidence.",
        ),
        click.option(
            "--fake-gpus",
            type=click.IntRange(0, 64),
            default=0,
            help="Sample N simulated GPUs instead of NVML (demos and benchmarks without a GPU).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@click.command()
@click.option(
    "--follow",
    "follow",
    multiple=True,
    metavar="PATH_OR_GLOB",
    help="A log to follow (repeatable; quote globs: files that appear later are followed).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write telemetry part files here (read them with analyze --telemetry).",
)
@click.option("--from-start", is_flag=True, help="Read followed logs from their start.")
@click.option(
    "--sysfs-root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/sys"),
    show_default=True,
    help="Where the host's sysfs is mounted (in a container, e.g. /host/sys): the GPUs' PCIe "
    "paths and switch uplinks are read there once at start; 'none' skips it (NVML's "
    "topology calls still group GPUs behind a switch).",
)
@click.option(
    "--fake-gpus-per-switch",
    type=click.IntRange(1, 64),
    default=1,
    hidden=True,
    help="With --fake-gpus: that many simulated GPUs behind each PCIe switch.",
)
@click.option(
    "--log-tz",
    "log_tz",
    metavar="ZONE",
    help="The time zone the job's logs print their times in (NCCL: the node's local "
    "time, unless the job sets TZ): UTC, an offset such as +09:00, or a name such as "
    "America/New_York. Default: learned from when the lines arrive (NCCL's stamps, else "
    "PyTorch's and DeepSpeed's).",
)
@_agent_options
def agent(
    follow: tuple[str, ...],
    listen: str,
    interval: float,
    analyse_every: float,
    refresh_every: float,
    window_lines: int,
    out: Path | None,
    part_seconds: float,
    textfile: Path | None,
    pids: tuple[int, ...],
    match: str | None,
    from_start: bool,
    sysfs_root: Path,
    fake_gpus_per_switch: int,
    log_tz: str | None,
    fake_gpus: int,
    collect_at: tuple[float, float | None] | None,
) -> None:
    """Run beside a training job: sample GPUs and the host, follow its logs, export.

    \b
    Examples:
      ncclscope agent --follow 'logs/*.log'
      ncclscope agent --follow train.log --match train.py --out /scratch/telemetry
      ncclscope agent --listen 0.0.0.0:9477 --textfile /var/lib/node_exporter/ncclscope.prom

    Stops on SIGTERM or SIGINT within a second, after writing what it sampled.
    """
    from ncclscope.agent.host import HostCollector

    try:
        zone = parse_zone(log_tz) if log_tz is not None else None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--log-tz") from None
    config = AgentConfig(
        detect_in_thread=True,
        isolate_analysis=True,
        log_zone=zone,
        follow=list(follow),
        listen=_listen(listen),
        interval_s=interval,
        analyse_s=analyse_every,
        refresh_s=refresh_every,
        window_lines=window_lines,
        out=out,
        part_s=part_seconds,
        textfile=textfile,
        pids=list(pids),
        match=match,
        from_start=from_start,
        sysfs_root=None if str(sysfs_root).lower() == "none" else sysfs_root,
        **_collect_config(collect_at, out),
    )
    stop = _stop_on_signals()
    nvml = _nvml(fake_gpus, fake_gpus_per_switch)
    a = Agent(
        config,
        nvml=nvml,
        host=HostCollector(pids=pids, match=match),
        lines=_follower(list(follow), from_start=from_start) if follow else None,
    )
    a.start()
    _announce(a)
    if collect_at is not None and out is None and follow:
        click.echo(
            "ncclscope agent: no --out: no evidence (dumps, stacks, RAS) will be taken at a "
            "stall; give --out DIR to keep it, or --collect-at off to silence this",
            err=True,
        )
    a.run(stop)


@click.command()
@click.argument(
    "logs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--speed", type=click.FloatRange(min=0.01), default=1.0, show_default=True,
    help="How many times faster than the job ran.",
)  # fmt: skip
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, help=_LISTEN_HELP)
@click.option("--interval", type=click.FloatRange(0.05, 60), default=0.5, show_default=True)
@click.option(
    "--analyse-every", type=click.FloatRange(0.05, 600), default=1.0, show_default=True,
    help="Shortest time in seconds (real time) between two full analyses, run when a new "
    "rank, an NCCL warning or a watchdog line arrives; stalls and countdowns follow every "
    "--interval.",
)  # fmt: skip
@click.option(
    "--refresh-every", type=click.FloatRange(0.05, 3600), default=60.0, show_default=True,
    help="While lines arrive, a full analysis at least this often (real time).",
)  # fmt: skip
@click.option("--textfile", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--linger", type=click.FloatRange(min=0), default=0.0, show_default=True,
    help="Seconds to keep serving after the last line (the countdown keeps falling).",
)  # fmt: skip
@click.option(
    "--telemetry", "telemetry", multiple=True, type=click.Path(exists=True, path_type=Path),
    help="Telemetry written by 'ncclscope agent --out' to replay beside the logs.",
)  # fmt: skip
@click.option(
    "--hostname", default="replay", show_default=True,
    help="The host name the replay reports as its own (one replay per simulated node).",
)  # fmt: skip
@click.option(
    "--start-at", type=float, metavar="UNIX_SECONDS",
    help="Wall-clock time (seconds since the epoch, as 'date +%s.%N' prints it) at "
    "which the replay's clock reads its start (--log-start): nothing goes out before "
    "it, and a past time is caught up at once. Replays given the same --start-at and "
    "--log-start share one clock. Default: when the replay starts.",
)  # fmt: skip
@click.option(
    "--log-start", type=click.DateTime(_LOG_TIME_FORMATS), metavar="TIME",
    help="The log time the replay starts at, UTC as the logs print it (e.g. "
    "'2025-03-14 09:00:00'); lines before it go out at once. Default: the first time "
    "in the logs (or the telemetry).",
)  # fmt: skip
def replay(
    logs: tuple[Path, ...],
    speed: float,
    listen: str,
    interval: float,
    analyse_every: float,
    refresh_every: float,
    textfile: Path | None,
    linger: float,
    telemetry: tuple[Path, ...],
    hostname: str,
    start_at: float | None,
    log_start: datetime | None,
) -> None:
    """Play recorded logs through the agent's live path, serving /metrics.

    For demos, dashboards and tests without a GPU. Times come from the logs'
    timestamps (scaled by --speed); the detectors see the logs as the agent would have.
    Several files (per-rank logs) are merged by time, each file in its own order and on
    its own clock (no offset between hosts is corrected); a line without a time keeps
    the time of the line before it in its file.

    \b
    Examples:
      ncclscope replay fixtures/stalled-227-ts/job.log --speed 60 --linger 30
      ncclscope replay logs/node-0.*.log --hostname node-0 --listen 127.0.0.1:9478 \\
          --start-at 1767225600 --log-start '2025-03-14 09:00:00'
    """
    from ncclscope.agent.replay import ReplaySource, TelemetryReplay
    from ncclscope.agent.telemetry import read_telemetry

    recorded = TelemetryReplay(read_telemetry(telemetry)) if telemetry else None
    source = ReplaySource(
        list(logs),
        speed=speed,
        # A shared start is a wall-clock time, the same for every replay on the host.
        clock=time.monotonic if start_at is None else time.time,
        start=recorded.first if recorded else None,
        t0=log_start.replace(tzinfo=UTC) if log_start is not None else None,
        origin=start_at,
    )
    config = AgentConfig(
        detect_in_thread=True,
        isolate_analysis=True,
        listen=_listen(listen),
        interval_s=interval,
        analyse_s=analyse_every,
        refresh_s=refresh_every,
        textfile=textfile,
        hostname=hostname,
    )
    stop = _stop_on_signals()
    a = Agent(config, lines=source, wall=source.now, recorded=recorded)
    a.start()
    _announce(a)

    def until_done() -> None:
        while not stop.is_set() and not source.done:
            stop.wait(0.05)
        deadline = time.monotonic() + linger
        while not stop.is_set() and time.monotonic() < deadline:
            stop.wait(0.05)
        stop.set()

    threading.Thread(target=until_done, daemon=True).start()
    a.run(stop)
    sys.stdout.flush()


def _default_out() -> Path:
    return Path(f"ncclscope-run-{datetime.now():%Y%m%d-%H%M%S}")


def _start_agent(
    config: AgentConfig, fake_gpus: int, stop: threading.Event
) -> threading.Thread | None:
    """The agent over the run's folder, in a thread; None (after one warning) when it
    cannot run at all.  A busy port costs the metrics only."""
    from ncclscope.agent.host import HostCollector

    try:
        a = Agent(
            config,
            nvml=_nvml(fake_gpus),
            host=HostCollector(pids=config.pids, match=config.match),
            lines=_follower(config.follow, from_start=True),
        )
    except OSError as e:  # the telemetry folder, the window's work folder
        msg = f"the agent cannot start ({e}): the job runs without metrics or telemetry"
        click.echo(f"ncclscope run: warning: {msg}", err=True)
        return None
    try:
        a.start()
    except OSError as e:  # the port is taken, or the address is not this host's
        msg = (
            f"cannot serve metrics on {config.listen} ({e}): the job runs without "
            "/metrics (choose another address with --listen)"
        )
        click.echo(f"ncclscope run: warning: {msg}", err=True)
    if a.nvml_message:
        click.echo(f"ncclscope run: warning: {a.nvml_message}", err=True)
    if a.bound is not None:
        host, port = a.bound
        click.echo(f"ncclscope run: metrics on http://{host}:{port}/metrics", err=True)
    thread = threading.Thread(target=a.run, args=(stop,), name="ncclscope-agent", daemon=True)
    thread.start()
    return thread


@click.command(context_settings={"allow_interspersed_args": False})
@click.argument(
    "command", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD [ARGS]..."
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="A new (or empty) folder for everything the run writes. "
    "Default: ncclscope-run-<date>-<time> here.",
)
@click.option("--html", is_flag=True, help="Also write DIR/report.html at the end.")
@click.option("--no-summary", is_flag=True, help="Do not print the analysis at the end.")
@click.option(
    "--no-agent",
    is_flag=True,
    help="Run no agent beside the job (no metrics, no telemetry): only the settings, "
    "the output into DIR and the analysis at the end.",
)
@_agent_options
@click.pass_context
def run(
    ctx: click.Context,
    command: tuple[str, ...],
    out: Path | None,
    html: bool,
    no_summary: bool,
    no_agent: bool,
    listen: str,
    interval: float,
    analyse_every: float,
    refresh_every: float,
    window_lines: int,
    part_seconds: float,
    textfile: Path | None,
    pids: tuple[int, ...],
    match: str | None,
    fake_gpus: int,
    collect_at: tuple[float, float | None] | None,
) -> None:
    """Run a training job with everything that makes it diagnosable, then analyse it.

    Sets the NCCL and PyTorch variables that make the logs diagnosable (where you
    have not set them; docs/run.md lists each with its cost), writes NCCL's logs, the
    flight recorder's dumps and the job's output with arrival times into DIR, runs the
    agent beside the job (metrics on --listen, telemetry into DIR/telemetry), and
    prints the analysis of DIR when the job ends.

    \b
    Examples:
      ncclscope run --out runs/42 -- torchrun --nproc-per-node 8 train.py
      ncclscope run --out runs/43 --html --listen 0.0.0.0:9477 -- python train.py

    \b
    DIR holds: output.log (stdout and stderr, in arrival order), nccl/%h.%p.log,
    flight/nccl_trace_rank_N (on a timeout), telemetry/part-*.parquet,
    evidence/ (dumps, stacks and RAS's report taken at a stall, --collect-at), run.json,
    report.html (--html).

    SIGINT and SIGTERM go to the job's process group; ncclscope waits for the job and
    exits with its status: 128+N when a signal N killed it, 127 when CMD is not found,
    126 when it cannot be run, 2 on a usage error.
    """
    out = out if out is not None else _default_out()
    try:
        out.mkdir(parents=True, exist_ok=True)
        if any(out.iterdir()):
            raise click.UsageError(f"--out {out} is not empty: give a new folder for this run")
        for sub in ("nccl", "flight", "telemetry"):
            (out / sub).mkdir()
    except OSError as e:
        raise click.UsageError(f"--out {out}: {e}") from e
    from ncclscope.agent.launch import SignalForwarder, job_environment

    job = job_environment(os.environ, out.resolve())  # absolute: the job may chdir
    kept = ", ".join(f"{k}={v}" for k, v in job.kept.items())
    mine = f"; kept yours: {kept}" if kept else ""
    click.echo(f"ncclscope run: writing to {out}/ (set {len(job.set)} variables{mine})", err=True)
    stop = threading.Event()
    config = AgentConfig(
        detect_in_thread=True,
        isolate_analysis=True,
        follow=[str(out / "output.log"), str(out / "nccl")],
        listen=_listen(listen),
        interval_s=interval,
        analyse_s=analyse_every,
        refresh_s=refresh_every,
        window_lines=window_lines,
        out=out / "telemetry",
        part_s=part_seconds,
        textfile=textfile,
        pids=list(pids),
        match=match,
        from_start=True,
        **_collect_config(collect_at, out),
    )
    agent_thread = None if no_agent else _start_agent(config, fake_gpus, stop)
    started = datetime.now(UTC)
    record: dict[str, Any] = {"command": list(command), "started": started.isoformat()}
    record |= {"set": job.set, "kept": job.kept}
    sys.stdout.flush()
    sys.stderr.flush()
    with SignalForwarder() as forwarder, (out / "output.log").open("wb") as log:
        code = _run_job(command, job.env, forwarder, log, record)
    stop.set()
    if agent_thread is not None:
        agent_thread.join(timeout=30)
    record |= {"ended": datetime.now(UTC).isoformat(), "exit_status": code}
    record["signals_forwarded"] = [signal.Signals(s).name for s in forwarder.received]
    (out / "run.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    died = f" (signal {signal.Signals(code - 128).name})" if 128 < code < 128 + 65 else ""
    click.echo(f"ncclscope run: the job exited with {code}{died}; files in {out}/", err=True)
    if not no_summary or html:
        _summarise(ctx, out, html=html, text=not no_summary)
    ctx.exit(code)


def _run_job(
    command: tuple[str, ...],
    env: dict[str, str],
    forwarder: SignalForwarder,
    log: BinaryIO,
    record: dict[str, Any],
) -> int:
    """Start the job, tee its output into ``log`` until it ends; its exit status.

    ``record`` gets the tee's counts and what ncclscope spent beside the job:
    ``cpu_s.tee`` (the tee's thread) and ``cpu_s.ncclscope`` (the whole process: the
    tee, the agent's threads, the HTTP endpoint), over ``job_wall_s``.
    """
    from ncclscope.agent.launch import Tee, exit_status

    wall, cpu = time.monotonic(), time.process_time()
    try:
        proc = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own group: signals reach torchrun's workers too
        )
    except OSError as e:
        click.echo(f"ncclscope run: cannot run {command[0]}: {e.strerror}", err=True)
        return 127 if isinstance(e, FileNotFoundError) else 126
    forwarder.attach(proc.pid)
    pipes = [p for p in (proc.stdout, proc.stderr) if p is not None]
    tee = Tee([p.fileno() for p in pipes], [sys.stdout.fileno(), sys.stderr.fileno()], log)
    tee_cpu = time.thread_time()  # the tee runs in this thread
    tee.run(gone=lambda: proc.poll() is not None)
    code = exit_status(proc.wait())
    record["cpu_s"] = {
        "tee": round(time.thread_time() - tee_cpu, 4),
        "ncclscope": round(time.process_time() - cpu, 4),
    }
    record["job_wall_s"] = round(time.monotonic() - wall, 4)
    for p in pipes:
        p.close()
    record["output"] = vars(tee.stats)
    return code


def _summarise(ctx: click.Context, out: Path, *, html: bool, text: bool) -> None:
    """``analyze DIR`` (with the run's telemetry), as the ``analyze`` command prints it."""
    from ncclscope.cli import analyze

    telemetry = out / "telemetry"
    has_parts = any(telemetry.glob("part-*.parquet"))
    try:
        ctx.invoke(
            analyze,
            paths=(str(out),),
            fmt="text",
            output=None if text else Path(os.devnull),
            no_progress=True,
            fail_on=None,
            prom_out=None,
            telemetry=(telemetry,) if has_parts else (),
            html_out=out / "report.html" if html else None,
        )
    except SystemExit:  # analyze's own status (an unreadable input): the job's wins
        pass
    except BrokenPipeError:
        # stdout's reader is gone (| head): the job's status still goes out, and the
        # flush at exit must not fail on the closed pipe either (Python's recipe).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
