"""The ``ncclscope`` command line: the only module that prints or configures logging."""

from __future__ import annotations

import importlib
import json
import logging
import sys
import threading
import time
from datetime import tzinfo
from pathlib import Path
from typing import IO, ClassVar

import click

from ncclscope import __version__
from ncclscope.analysis import build, new_workdir
from ncclscope.detect.base import SEVERITIES, Severity, severity_at_least
from ncclscope.diagnose import diagnose
from ncclscope.export.exclude import FORMATS as EXCLUDE_FORMATS
from ncclscope.export.exclude import exclude_verdict
from ncclscope.export.json_report import to_json_dict
from ncclscope.export.text_report import render_text
from ncclscope.model import Built
from ncclscope.parsers.common import parse_zone
from ncclscope.sources import Problem
from ncclscope.units import human_bytes

__all__ = ["cli", "main"]

#: Inputs smaller than this finish before a progress line would help.
_PROGRESS_MIN_BYTES = 64 << 20


class _Progress:
    """A one-line progress display on a terminal's stderr, updated from a thread.

    polars runs the scan in native threads without callbacks, so the line shows the
    stage, the input size and the elapsed time rather than a guessed percentage.
    """

    def __init__(self, stream: IO[str], *, allowed: bool) -> None:
        self.stream = stream
        self.allowed = allowed  # --no-progress turns it off
        self.enabled = False
        self.stage = "reading"
        self.detail = ""
        self.start = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def update(self, stage: str, done: int, total: int) -> None:
        names = {"read": "reading", "scan": "parsing", "build": "matching ranks"}
        self.stage = names.get(stage, stage)
        if stage == "scan" and total:
            self.detail = human_bytes(total)
            big = total >= _PROGRESS_MIN_BYTES
            if self.allowed and not self.enabled and big and self.stream.isatty():
                self.enabled = True
                self._thread = threading.Thread(target=self._run, daemon=True)
                self._thread.start()
        elif stage == "read":
            self.detail = human_bytes(done)

    def _run(self) -> None:
        spinner = "|/-\\"
        k = 0
        while not self._stop.wait(0.2):
            elapsed = time.monotonic() - self.start
            self.stream.write(f"\r{spinner[k % 4]} {self.stage} {self.detail} ... {elapsed:5.1f}s ")
            self.stream.flush()
            k += 1

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.stream.write("\r" + " " * 60 + "\r")
            self.stream.flush()


class _LazyGroup(click.Group):
    """Subcommands imported when used: ``synth`` pulls in the generator (~45 ms) and
    ``agent``/``replay``/``run`` prometheus_client, which ``analyze`` should not pay for."""

    lazy: ClassVar[dict[str, str]] = {
        "agent": "ncclscope.agent_cli:agent",
        "replay": "ncclscope.agent_cli:replay",
        "run": "ncclscope.agent_cli:run",
        "synth": "ncclscope.synth.cli:synth",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            module, name = self.lazy[cmd_name].split(":")
            command = getattr(importlib.import_module(module), name)
            if not isinstance(command, click.Command):
                msg = f"{self.lazy[cmd_name]} is not a click command"
                raise TypeError(msg)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ncclscope")
@click.option("-v", "--verbose", count=True, help="Log more to stderr (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """Diagnose distributed GPU training from the NCCL logs it already writes.

    \b
    Start with:  ncclscope analyze run.log
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="ncclscope: %(levelname)s: %(message)s")


@cli.command()
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text: a summary to read; json: the ncclscope.analysis/1 contract.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Write the report to this file instead of stdout.",
)
@click.option("--no-progress", is_flag=True, help="Never show the progress line on stderr.")
@click.option(
    "--fail-on",
    type=click.Choice(SEVERITIES),
    default=None,
    help="Exit 3 when a finding of this severity or worse exists (for CI pipelines).",
)
@click.option(
    "--prom-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the job's metrics (as the agent exports them) to this file, "
    "in Prometheus text format, atomically (for node_exporter's textfile collector).",
)
@click.option(
    "--telemetry",
    "telemetry",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Telemetry written by 'ncclscope agent --out' (a folder or part files; "
    "repeatable): correlated with the logs by the detectors and summarised after the report.",
)
@click.option(
    "--log-tz",
    "log_tz",
    metavar="ZONE",
    help="The time zone the logs' times were written in: NCCL, PyTorch and DeepSpeed "
    "print the node's local time without a zone (UTC, an offset such as +09:00, or a "
    "name such as America/New_York). Default: the offset the agent learned "
    "(--telemetry, or its series in --prometheus), else one learned from stamps in the "
    "logs that name their zone (kubectl logs --timestamps), else UTC; the report says which.",
)
@click.option(
    "--html",
    "html_out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write an HTML report to this file: one self-contained page (plotly.js "
    "embedded, works offline) with per-rank timeline, lateness heatmap, step phases, "
    "telemetry and the findings.",
)
@click.option(
    "--exclude-list",
    "exclude_list",
    type=click.Choice(list(EXCLUDE_FORMATS)),
    default=None,
    help="Print, in place of the report, the nodes with evidence of a fault (dead, "
    "frozen or slow, a network error there, GPU XID/ECC or a degraded PCIe link from "
    "--telemetry), never one that only waited: slurm, a hostlist for --exclude; "
    "kubectl, taint commands; json, each node with its reasons. Empty when none.",
)
@click.option(
    "--prometheus",
    "prometheus",
    metavar="URL",
    help="The cluster's Prometheus (http://host:9090): read, for the logs' hosts and "
    "time window (first..last line, 5 min either side), node_exporter's InfiniBand "
    "ports, dcgm-exporter's GPU health and the agent's own series (used as --telemetry "
    "where none is given). A handful of bounded requests; what was asked and what came "
    "back is in the report's CLUSTER section. Never fatal: an unreachable or slow "
    "Prometheus is said, the logs' analysis is unchanged. Behind a proxy that asks for "
    "a login: https://user:password@host (the password is never printed).",
)
@click.option(
    "--prometheus-token-file",
    "prometheus_token_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    metavar="FILE",
    help="A bearer token for --prometheus, read from FILE (as Prometheus' "
    "bearer_token_file; in a pod: /var/run/secrets/kubernetes.io/serviceaccount/token).",
)
@click.option(
    "--prometheus-timeout",
    "prometheus_timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="How long each request to --prometheus may take (Prometheus' own query "
    "timeout; the connection waits up to 2 s more).",
)
def analyze(
    paths: tuple[str, ...],
    fmt: str,
    output: Path | None,
    no_progress: bool,
    fail_on: Severity | None,
    prom_out: Path | None,
    telemetry: tuple[Path, ...],
    log_tz: str | None,
    html_out: Path | None,
    exclude_list: str | None,
    prometheus: str | None,
    prometheus_token_file: Path | None,
    prometheus_timeout: float,
) -> None:
    """Analyse NCCL_DEBUG=INFO logs: versions, ranks, communicators, collectives, errors.

    PATH may be a file, a directory (every log inside, recursively), a glob
    ('logs/*.log', quoted), a .gz file, or - for standard input. One file per rank
    (NCCL_DEBUG_FILE=%h.%p, torchrun --log-dir) or one combined file both work.
    Flight Recorder dumps, NCCL tools' output and the agent's evidence folders
    (--collect-at) are known by their content and read beside the logs.

    \b
    Examples:
      ncclscope analyze fixtures/ib-completion-error/
      ncclscope analyze 'logs/rank*.log' --format json > analysis.json
      zcat run.log.gz | ncclscope analyze -
      ncclscope analyze logs/ --fail-on critical   # exit 3 on a hang, in CI
      ncclscope analyze logs/ --telemetry tel/ --html report.html
      ncclscope analyze logs/ --log-tz America/New_York   # the job ran in New York time
      ncclscope analyze logs/ runs/42/evidence/   # with what the agent took at a stall
      ncclscope analyze logs/ --exclude-list slurm   # node-[03,07]: for sbatch --exclude
      ncclscope analyze logs/ --telemetry tel/ --exclude-list kubectl > taint.sh   # review, run
      ncclscope analyze logs/ --prometheus http://prometheus:9090   # ports, GPUs, the agent

    Exit status: 0 analysed (whatever was found), 1 an input could not be read,
    2 usage error, 3 a finding at or above --fail-on.
    """
    zone = None
    if log_tz is not None:
        try:
            zone = parse_zone(log_tz)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--log-tz") from None
    progress = _Progress(sys.stderr, allowed=not no_progress)
    samples = None
    telemetry_problems: list[Problem] = []
    if telemetry:
        from ncclscope.agent.telemetry import read_telemetry

        samples = read_telemetry(telemetry, problems=telemetry_problems)
        if samples.is_empty() and not telemetry_problems:
            click.echo(
                "ncclscope: --telemetry: no samples in "
                + ", ".join(str(t) for t in telemetry)
                + " (expected part-*.parquet files written by 'ncclscope agent --out')",
                err=True,
            )
    learned = None
    if samples is not None:
        from ncclscope.agent.telemetry import learned_zone

        learned = learned_zone(samples)
    with new_workdir() as tmp:
        try:
            stdin = sys.stdin.buffer if "-" in paths else None
            built = build(
                list(paths),
                workdir=Path(tmp),
                stdin=stdin,
                progress=progress.update,
                telemetry=samples,
                log_zone=zone if zone is not None else learned,
                log_zone_source="given" if zone is not None else "telemetry",
            )
            if prometheus is not None and built.analysis.paths:
                from ncclscope.cluster.job import read_for_job, with_cluster, zone_from_agents
                from ncclscope.cluster.prometheus import PromClient

                progress.update("reading Prometheus", 0, 0)
                token = None
                if prometheus_token_file is not None:
                    token = prometheus_token_file.read_text(errors="replace").strip() or None
                client = PromClient(prometheus, timeout_s=prometheus_timeout, token=token)
                zone_problems: list[str] = []
                if zone is None and learned is None:
                    # The logs' zone decides their window: the agents' learned one first.
                    def rezoned(z: tzinfo) -> Built:
                        return build(list(paths), workdir=Path(tmp) / "zoned",
                                     progress=progress.update, telemetry=samples, log_zone=z,
                                     log_zone_source="telemetry")  # fmt: skip

                    built, zone_problems = zone_from_agents(
                        built, client, rezoned, stdin="-" in paths
                    )
                cluster = read_for_job(built.analysis, client)
                cluster.problems[:0] = zone_problems
                built = with_cluster(built, cluster, telemetry=samples is None)
                if any(a.status not in ("ok", "partial") for a in cluster.asks):
                    failed = next(a for a in cluster.asks if a.status not in ("ok", "partial"))
                    click.echo(
                        f"ncclscope: --prometheus {client.url}: {failed.what} {failed.status}"
                        f" ({failed.message or 'no message'}); see the report's CLUSTER section",
                        err=True,
                    )
                if samples is None and not cluster.telemetry.is_empty():
                    samples = cluster.telemetry
            diagnosis = diagnose(built, progress=progress.update)
            analysis = diagnosis.analysis
        finally:
            progress.close()
        analysis.problems.extend(telemetry_problems)  # the list is the report's to complete
        doc = to_json_dict(diagnosis)
        text = (
            json.dumps(doc, indent=2) + "\n" if fmt == "json" else render_text(diagnosis, doc=doc)
        )
        if prom_out is not None and analysis.paths:
            from ncclscope.agent.postmortem import write_postmortem

            write_postmortem(diagnosis, prom_out)
        if html_out is not None and analysis.paths:
            # Inside the work directory: the report reads the collectives' Parquet.
            try:
                from ncclscope.export.html_report import write_html
            except ModuleNotFoundError as e:  # an image without plotly (deploy/Dockerfile)
                raise click.ClickException(
                    f"--html needs {e.name}, which this installation lacks: "
                    "pip install plotly (the text and JSON reports need nothing more)"
                ) from None

            size = write_html(diagnosis, html_out)
            click.echo(f"ncclscope: wrote {html_out} ({human_bytes(size)})", err=True)
        if exclude_list is not None:
            # In place of the report, wherever it would go (stdout or -o).
            text = EXCLUDE_FORMATS[exclude_list](exclude_verdict(diagnosis, samples=samples))
        elif samples is not None and fmt == "text":
            from ncclscope.agent.telemetry import summary_lines

            text += "\n".join(summary_lines(samples))
    if not analysis.paths and (fmt == "text" or exclude_list is not None):
        text = ""  # nothing was read: the messages below say why, an empty report would not
    if output is not None:
        output.write_text(text, encoding="utf-8")
    elif text:
        click.echo(text, nl=False)
    for problem in analysis.problems:
        click.echo(f"ncclscope: {problem.path}: {problem.reason}", err=True)
    if not analysis.paths:
        click.echo("ncclscope: no readable input: nothing was analysed", err=True)
    if analysis.problems or not analysis.paths:
        sys.exit(1)
    if fail_on is not None and any(
        severity_at_least(f.severity, fail_on) for f in diagnosis.findings
    ):
        sys.exit(3)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="ncclscope")
