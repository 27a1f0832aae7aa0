"""Build: sources -> first pass -> records -> identity -> tables.

``build`` returns the tables (:class:`~ncclscope.model.Built`: the job's
:class:`~ncclscope.model.Analysis` and each attempt's own); ``ncclscope.diagnose`` runs
the detectors on them; ``run_analysis`` is the two together.  Outputs (terminal, JSON,
HTML, the agent's metrics) read the tables and never parse.  Nothing here prints:
progress goes to a callback.
"""

from __future__ import annotations

import copy
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, tzinfo
from pathlib import Path
from typing import BinaryIO

import polars as pl

from ncclscope.diagnose import Diagnosis, diagnose
from ncclscope.evidence.read import split_evidence
from ncclscope.model import Analysis, Built, Gap, Progress
from ncclscope.model.attempts import HINTS as ATTEMPT_HINTS
from ncclscope.model.attempts import Attempt, find_cuts, segment_starts
from ncclscope.model.collectives import (
    CollSummary,
    apply_host_repairs,
    build_collectives,
    coll_lines,
    coll_only_comms,
    proc_comm_stats,
    proc_table,
    repair_spliced_hosts,
    summarise,
)
from ncclscope.model.flight import join_flight, read_flight
from ncclscope.model.identity import Identity, listable_size, pid_ranks, resolve_identity
from ncclscope.model.inspector import join_inspector
from ncclscope.model.tools import read_tools
from ncclscope.parsers.common import read_as, zone_name
from ncclscope.parsers.frameworks import FrameworkTables, mtime_years, read_frameworks
from ncclscope.parsers.nccl import errors as nccl_errors
from ncclscope.parsers.nccl.records import (
    TOO_LONG_BYTES,
    LineRecords,
    add_connection_lines,
    add_info_messages,
    add_plain_info_lines,
    collect_records,
    connection_lines,
    info_messages,
    plain_info_lines,
)
from ncclscope.parsers.nccl.scan import Scan, ScanTarget, scan_inputs, sniff_offsets
from ncclscope.parsers.zone import guess_zone
from ncclscope.schema import (
    COMMUNICATORS_SCHEMA,
    CONNECTIONS_SCHEMA,
    ERRORS_SCHEMA,
    INPUTS_SCHEMA,
    LINE_KIND,
    TELEMETRY_SCHEMA,
    validate,
)
from ncclscope.sources import LOG_KINDS, Input, Problem, expand_inputs

__all__ = ["Analysis", "Built", "Diagnosis", "Gap", "Progress", "build", "run_analysis"]


_SKIP_REASONS = ("blank", "other", "malformed", "binary", "too_long")


def run_analysis(
    names: Sequence[str],
    *,
    workdir: Path,
    stdin: BinaryIO | None = None,
    progress: Progress | None = None,
    coll_ts_source: str = "nccl",
    telemetry: pl.DataFrame | None = None,
    now: datetime | None = None,
    log_zone: tzinfo | None = None,
    log_zone_source: str = "given",
) -> Diagnosis:
    """``build`` then ``diagnose``: the tables of the logs named by ``names``
    (``Diagnosis.analysis``) and what the detectors found on them.  The arguments are
    ``build``'s, and ``now`` is ``diagnose``'s."""
    return diagnose(
        build(
            names,
            workdir=workdir,
            stdin=stdin,
            progress=progress,
            coll_ts_source=coll_ts_source,
            telemetry=telemetry,
            log_zone=log_zone,
            log_zone_source=log_zone_source,
        ),
        now=now,
        progress=progress,
    )


def build(
    names: Sequence[str],
    *,
    workdir: Path,
    stdin: BinaryIO | None = None,
    progress: Progress | None = None,
    coll_ts_source: str = "nccl",
    telemetry: pl.DataFrame | None = None,
    log_zone: tzinfo | None = None,
    log_zone_source: str = "given",
) -> Built:
    """The tables of the logs named by ``names`` (files, directories, globs, ``.gz``,
    ``-``): the job's (its last attempt's) and each attempt's own.  Nothing is judged
    here: ``diagnose`` runs the detectors on them.

    ``log_zone``: the zone the logs' wall times were written in (NCCL, PyTorch and
    DeepSpeed print local time without a zone); None reads them as UTC and says so
    (``Analysis.log_zone``) unless a clock in the inputs that names its zone says which
    (``parsers.zone``: source ``learned``); ``log_zone_source`` says where a given zone
    came from (``given``, ``telemetry``).  Arrival times the agent stamped are UTC
    whatever it is.

    ``coll_ts_source`` is where COLL lines' times came from: ``nccl`` (NCCL printed
    them), or ``stamped`` (the agent wrote each line's arrival time in front of it).
    ``telemetry`` is the agent's samples (``read_telemetry``), for the detectors that
    correlate logs with GPU and host telemetry.

    ``workdir`` holds the Parquet stores and decompressed copies; the caller owns it
    (and should keep it alive while reading ``Analysis.collectives``).
    """

    def report(stage: str, done: int, total: int) -> None:
        if progress is not None:
            progress(stage, done, total)

    inputs, problems = expand_inputs(
        names, workdir=workdir / "inputs", stdin=stdin, on_copy=lambda _n, b: report("read", b, 0)
    )
    evidence = None
    if log_zone is None:
        guess = guess_zone([i.path for i in inputs if i.kind in LOG_KINDS])
        log_zone, log_zone_source = guess.zone, "learned"
        evidence = guess.evidence or None
    # Arrival stamps the agent wrote in front of NCCL lines are UTC whatever the zone.
    with read_as(log_zone, nccl_utc=coll_ts_source == "stamped"):
        built = _tables(
            inputs, problems, workdir=workdir, report=report, coll_ts_source=coll_ts_source,
            telemetry=telemetry,
        )  # fmt: skip
    zone = zone_name(log_zone) if log_zone is not None else None
    source = log_zone_source if log_zone is not None else "assumed"

    def said(a: Analysis) -> Analysis:
        return replace(a, log_zone=zone, log_zone_source=source, log_zone_evidence=evidence)

    analysis = said(built.analysis)
    views = [(said(v), a) for v, a in built.views]
    return replace(built, analysis=analysis, views=views)


def _tables(
    inputs: list[Input],
    problems: list[Problem],
    *,
    workdir: Path,
    report: Callable[[str, int, int], None],
    coll_ts_source: str,
    telemetry: pl.DataFrame | None,
) -> Built:
    inputs, evidence, manifest_names = split_evidence(inputs, problems)
    dumps = [(i.display, i.path, i.kind) for i in inputs if i.kind.startswith("flight_")]
    tool_inputs = [i for i in inputs if not i.kind.startswith("flight_") and i.kind != "log"]
    inputs = [inp for inp in inputs if inp.kind in LOG_KINDS]
    paths = [inp.display for inp in inputs]
    targets = _targets(inputs)
    store = workdir / "store"
    total_bytes = sum(inp.size_bytes for inp in inputs)
    report("scan", 0, total_bytes)
    targets, scan = _scan(targets, inputs, store, problems)
    report("scan", total_bytes, total_bytes)
    n_lines = scan.n_lines if scan is not None else {}

    frameworks = FrameworkTables()
    if scan is not None:
        records = _records(scan)
        lines = coll_lines(scan.coll, records)
        procs, stats = _process_stats(lines, scan.tokens, records)
        frameworks = read_frameworks(
            scan.text_store,
            year_hint=lambda: _nccl_year(lines, records),
            file_years=mtime_years({t.file_id: t.path for t in targets}),
        )
        _account_frameworks(records, frameworks)
    else:
        records = LineRecords()
        lines = None
        stats = pl.DataFrame()
        procs = pl.DataFrame()
    report("build", 0, 1)
    hints = _hint_lines(scan.text_store) if scan is not None else None
    starts = (
        _attempt_starts(hints, records, stats, frameworks, [t.file_id for t in targets])
        if hints is not None
        else None
    )
    n_attempts = len(starts["attempt"].unique()) if starts is not None else 1
    builds: list[tuple[_Built, LineRecords, pl.DataFrame, FrameworkTables]] = []
    for k in range(n_attempts):
        if n_attempts == 1 or starts is None:
            part = (records, lines, stats, frameworks)
        else:
            part = _attempt_part(k, starts, records, lines, procs, frameworks)
        rec_k, lines_k, stats_k, fw_k = part
        built = _build(rec_k, lines_k, stats_k, procs, paths, workdir / f"attempt-{k}",
                       coll_ts_source, pid_ranks(fw_k.failures))  # fmt: skip
        builds.append((built, rec_k, stats_k, fw_k))
    # The job as it stands is its last attempt; the earlier ones keep their findings.
    last, _rec, last_stats, _fw = builds[-1]
    account = _account(inputs, n_lines, records)
    hosts = sorted(
        set(last.identity.members["host"].to_list())
        | records.hosts
        | set(evidence.hosts if evidence is not None else ())
    )
    flight, dump_problems = read_flight(dumps, first_file_id=len(paths))
    flight = join_flight(flight, last.communicators, last.collectives)
    # nccl-tests output is a log too (its file_id is the log's); the others follow the dumps.
    log_ids = {inp.display: k for k, inp in enumerate(inputs)}
    extra = [i for i in tool_inputs if i.kind not in LOG_KINDS]
    first_tool = len(paths) + len(dumps)
    tools, tool_problems = read_tools(
        [
            (log_ids[i.display], i.display, i.path, i.kind)
            for i in tool_inputs
            if i.kind in LOG_KINDS
        ]
        + [(first_tool + k, i.display, i.path, i.kind) for k, i in enumerate(extra)]
    )
    tools = join_inspector(tools, last.collectives)
    analysis = Analysis(
        paths=paths
        + [display for display, _path, _kind in dumps]
        + [i.display for i in extra]
        + manifest_names,
        inputs=account,
        notes=_notes(inputs, records, frameworks),
        problems=problems + dump_problems + tool_problems,
        nccl_versions=sorted({v.version for *_, v in records.versions}, key=_version_key),
        cuda_versions=sorted({v.cuda for *_, v in records.versions}, key=_version_key),
        hosts=hosts,
        identity=last.identity,
        communicators=last.communicators,
        networks=sorted(records.networks),
        connections=last.connections,
        transports=sorted(last.connections["transport"].unique().to_list()),
        # Errors and framework tables of every attempt: a failed run's errors stay.
        errors=pl.concat([b.errors for b, *_ in builds]).sort("file_id", "line_no"),
        collectives=last.collectives,
        summary=last.summary,
        stats=last_stats,
        timestamps=_timestamps(
            records,
            sum(b.summary.calls for b, *_ in builds if b.summary is not None),
            sum(b.summary.with_ts for b, *_ in builds if b.summary is not None),
        ),
        env={k: sorted(v) for k, v in sorted(records.env.items())},
        frameworks=frameworks,
        workdir=workdir,
        sources=inputs,
        flight=flight,
        tools=tools,
        evidence=evidence,
        telemetry=(
            validate(telemetry, TELEMETRY_SCHEMA, "telemetry")
            if telemetry is not None
            else pl.DataFrame(schema=TELEMETRY_SCHEMA)
        ),
    )
    analysis = replace(analysis, gaps=_gaps(analysis, records))
    report("build", 1, 1)
    sizes = _launcher_world_sizes(hints) if hints is not None else []
    boot = _bootstrap_world_sizes(hints) if hints is not None else []
    analysis, views = _views(analysis, builds, starts, sizes, boot)
    return Built(analysis, views, scan.text_store if scan is not None else None)


@dataclass
class _Built:
    """The tables built from one attempt's records and COLL lines."""

    identity: Identity
    collectives: pl.LazyFrame | None
    summary: CollSummary | None
    errors: pl.DataFrame
    connections: pl.DataFrame
    communicators: pl.DataFrame


def _build(
    records: LineRecords,
    lines: pl.LazyFrame | None,
    stats: pl.DataFrame,
    procs: pl.DataFrame,
    paths: list[str],
    out_dir: Path,
    coll_ts_source: str,
    pid_ranks: dict[tuple[str | None, int], int] | None = None,
) -> _Built:
    coll_only = coll_only_comms(stats) if len(stats) else []
    identity = resolve_identity(records, coll_only, paths, pid_ranks)
    collectives = summary = None
    if lines is not None and len(stats):
        collectives = build_collectives(
            lines, stats, identity.members, procs, out_dir, ts_source=coll_ts_source
        )
        summary = summarise(lines, collectives, stats, identity.members)
    return _Built(
        identity=identity,
        collectives=collectives,
        summary=summary,
        errors=_errors(records, identity),
        connections=_connections(records),
        communicators=_communicators(identity, summary, records),
    )


def _framework_marks(frameworks: FrameworkTables) -> pl.DataFrame:
    """(file_id, line_no) of every framework line read: content that keeps a segment."""
    frames = [
        t.select(pl.col("file_id").cast(pl.UInt32), pl.col("line_no").cast(pl.UInt32))
        for t in _framework_frames(frameworks).values()
    ]
    schema = {"file_id": pl.UInt32, "line_no": pl.UInt32}
    return pl.concat([pl.DataFrame(schema=schema), *frames])


def _framework_frames(frameworks: FrameworkTables) -> dict[str, pl.DataFrame]:
    """The framework tables that point at lines (``file_id``, ``line_no``), by field."""
    return {
        name: table
        for name, table in vars(frameworks).items()
        if isinstance(table, pl.DataFrame) and {"file_id", "line_no"} <= set(table.columns)
    }


def _attempt_starts(
    hints: pl.DataFrame,
    records: LineRecords,
    stats: pl.DataFrame,
    frameworks: FrameworkTables,
    file_ids: list[int],
) -> pl.DataFrame:
    """Per file, where each attempt starts (``segment_starts``)."""
    cuts = find_cuts(hints, LINE_KIND["nccl"], records, stats, _framework_marks(frameworks))
    return segment_starts(cuts, file_ids)


def _hint_lines(text_store: Path) -> pl.DataFrame:
    """The few lines of the text store that attempts and world sizes are read from (a
    banner, a restart, a stated world size), in one pass with literal filters."""
    text = pl.col("text")
    wanted = pl.any_horizontal(
        [text.str.contains(h, literal=True) for h in (*ATTEMPT_HINTS, *_WORLD_HINTS)]
    )
    return (
        pl.scan_parquet(text_store)
        .filter(wanted)
        .select("file_id", "i", "kind", "text")
        .collect(engine="streaming")
    )


def _in_attempt(frame: pl.LazyFrame, starts: pl.DataFrame, k: int, line: str) -> pl.LazyFrame:
    """The rows of ``frame`` (``file_id``, ``line``) that fall in attempt ``k``: a join
    on the file with its segment's bounds (one row a file), no sort of the rows."""
    bounds = (
        starts.sort("file_id", "start")
        .with_columns(
            (pl.col("start").shift(-1).over("file_id").cast(pl.Int64) - 1)
            .fill_null(2**62)
            .alias("end")
        )
        .filter(pl.col("attempt") == k)
        .select(pl.col("file_id").cast(pl.UInt32), pl.col("start").cast(pl.Int64), "end")
    )
    columns = frame.collect_schema().names()
    return (
        frame.with_columns(pl.col("file_id").cast(pl.UInt32))
        .join(bounds.lazy(), on="file_id", how="inner")
        .filter(pl.col(line).cast(pl.Int64).is_between(pl.col("start"), pl.col("end")))
        .select(columns)
    )


def _attempt_part(
    k: int,
    starts: pl.DataFrame,
    records: LineRecords,
    lines: pl.LazyFrame | None,
    procs: pl.DataFrame,
    frameworks: FrameworkTables,
) -> tuple[LineRecords, pl.LazyFrame | None, pl.DataFrame, FrameworkTables]:
    """Attempt ``k``'s share of the records, COLL lines, statistics and framework tables."""
    bounds: dict[int, list[tuple[int, int]]] = {}
    for f, start, attempt in starts.select("file_id", "start", "attempt").iter_rows():
        bounds.setdefault(int(f), []).append((int(start), int(attempt)))

    def inside(file_id: int, line_no: int) -> bool:
        segs = bounds.get(file_id)
        if not segs:
            return k == 0
        current = 0
        for start, attempt in segs:
            if start <= line_no:
                current = attempt
        return current == k

    part = _slice_records(records, inside, starts, k)
    part_lines = stats_k = None
    if lines is not None:
        part_lines = _in_attempt(lines, starts, k, "i").cast(lines.collect_schema())
        stats_k = proc_comm_stats(part_lines, procs)
    fw = copy.copy(frameworks)
    for name, table in _framework_frames(frameworks).items():
        setattr(fw, name, _in_attempt(table.lazy(), starts, k, "line_no").collect()
                .cast(table.schema))  # fmt: skip
    return part, part_lines, stats_k if stats_k is not None else pl.DataFrame(), fw


def _slice_records(
    records: LineRecords, inside: Callable[[int, int], bool], starts: pl.DataFrame, k: int
) -> LineRecords:
    """The records on lines ``inside`` says are kept (few: init, connection, WARN lines).
    Records without a line (layouts, rank hints) go with their process."""
    out = copy.copy(records)
    out.comm_events = [e for e in records.comm_events if inside(e[0][0], e[1])]
    out.connections = [c for c in records.connections if inside(c[0][0], c[1])]
    out.colls = [c for c in records.colls if inside(c[0][0], c[1])]
    out.errors = [g for g in records.errors if inside(g.proc[0], g.line_no)]
    out.connection_frames = [
        _in_attempt(t.lazy(), starts, k, "line_no").collect().cast(t.schema)
        for t in records.connection_frames
    ]
    procs = {e[0] for e in out.comm_events} | {c[0] for c in out.colls}
    out.layouts = [x for x in records.layouts if x[0] in procs]
    out.rank_hints = {p: h for p, h in records.rank_hints.items() if p in procs}
    return out


def _views(
    analysis: Analysis,
    builds: list[tuple[_Built, LineRecords, pl.DataFrame, FrameworkTables]],
    starts: pl.DataFrame | None,
    launcher_sizes: list[int],
    boot_sizes: list[int],
) -> tuple[Analysis, list[tuple[Analysis, Attempt]]]:
    """Each attempt's own tables (the job's, with that attempt's identity, collectives,
    errors and framework tables) and its description; and the job's tables with the
    last attempt's world size and ranks without logs."""
    out: list[tuple[Analysis, Attempt]] = []
    for k, (built, _records, stats, fw) in enumerate(builds):
        view = replace(
            analysis,
            identity=built.identity,
            communicators=built.communicators,
            connections=built.connections,
            errors=built.errors,
            collectives=built.collectives,
            summary=built.summary,
            stats=stats,
            frameworks=fw,
            followed_by=_next_reasons(starts, k) if k < len(builds) - 1 else None,
        )
        world_size, source = _world_size(view, launcher_sizes, boot_sizes)
        view = replace(view, world_size=world_size, world_size_source=source)
        view = replace(view, ranks_without_logs=_ranks_without_logs(view))
        out.append((view, _describe_attempt(k, view, starts)))
    last = out[-1][0]
    analysis = replace(
        analysis,
        world_size=last.world_size,
        world_size_source=last.world_size_source,
        ranks_without_logs=last.ranks_without_logs,
    )
    return analysis, out


#: Lines of launchers and PyTorch that state the world (or the default group's) size:
#: ``WORLD_SIZE=16`` (an environment dump), ``global_world_sizes=[16, 16]``
#: (torchelastic's rendezvous result), ``ProcessGroupNCCL initialization options: size:
#: 16, global rank: 3, ...`` (PyTorch, per process group: the largest is the world).
_WORLD_SIZE_RE = (
    r"(?:\bWORLD_SIZE\s*[=:]\s*|global_world_sizes=\[|initialization options: size: )(\d{1,7})"
)


#: NCCL's bootstrap root, when a rank checks in twice (a restarted process):
#: ``NCCL WARN Bootstrap Root : rank 3 of 16 ranks has already checked in``.
_BOOTSTRAP_RE = r"rank \d{1,7} of (\d{1,7}) ranks has already checked in"

#: Literal pieces of the lines ``_WORLD_SIZE_RE`` and ``_BOOTSTRAP_RE`` read.
_WORLD_HINTS = ("WORLD_SIZE", "world_sizes=", "options: size: ", "ranks has already checked in")


def _bootstrap_world_sizes(hints: pl.DataFrame) -> list[int]:
    """The job sizes NCCL's bootstrap root states in its ``already checked in`` WARN."""
    sizes = hints.select(
        pl.col("text").str.extract(_BOOTSTRAP_RE, 1).cast(pl.Int64, strict=False).alias("n")
    ).drop_nulls()
    return sorted({int(n) for n in sizes["n"] if n > 0})


def _launcher_world_sizes(hints: pl.DataFrame) -> list[int]:
    """Every world size the launcher and PyTorch lines state (``hints``: the lines
    ``_hint_lines`` kept)."""
    text = pl.col("text")
    sizes = (
        hints.filter(pl.col("kind") != LINE_KIND["nccl"])
        .select(text.str.extract(_WORLD_SIZE_RE, 1).cast(pl.Int64, strict=False).alias("n"))
        .drop_nulls()
    )
    return sorted({int(n) for n in sizes["n"] if n > 0})


def _world_size(
    view: Analysis, launcher_sizes: list[int], boot_sizes: list[int]
) -> tuple[int | None, str | None]:
    """NCCL's count first (Init lines, else Init timings, teardown lines or COLL lines'
    ``nranks``, else the bootstrap root's WARN), then what the launcher, PyTorch or
    DeepSpeed lines state."""
    ident = view.identity
    if ident.world_size is not None:
        world = ident.members.filter(pl.col("comm_key") == ident.world_key)
        named = set(world["known_from"].to_list())
        for source in ("init", "init_timings", "teardown"):
            if source in named:
                return ident.world_size, source
        return ident.world_size, "coll"
    if boot_sizes:
        return max(boot_sizes), "bootstrap"
    stated = [
        *launcher_sizes,
        *([view.frameworks.world_size] if view.frameworks.world_size else []),
    ]
    return (max(stated), "launcher") if stated else (None, None)


def _ranks_without_logs(view: Analysis) -> list[int] | None:
    """Ranks in ``range(world_size)`` that left no line: not a member of the world
    communicator, no PyTorch line with their ``[rankN]:`` prefix.  A launcher's failure
    summary naming a rank is not that rank's log, and DeepSpeed prints its timers on
    rank 0 while the other ranks' lines carry no rank.  None when that cannot be told
    (no line names the rank that wrote it)."""
    world = view.world_size
    if not listable_size(world):
        return None  # none stated, or a damaged number: nothing to list
    assert world is not None
    ident = view.identity
    members = ident.members.filter(pl.col("comm_key") == (ident.world_key or ""))
    if members["comm_rank"].null_count():
        return None  # a member no line names the rank of: it may be any missing rank
    # A process whose NCCL lines name no rank (its init lines cut away, its calls on
    # communicators matched by order) is some rank's too: it may be any missing one.
    unnamed = (
        ident.members.group_by("host", "pid")
        .agg(pl.col("rank").is_not_null().any().alias("named"))
        .filter(~pl.col("named"))
    )
    if len(unnamed):
        return None
    seen = set(members["comm_rank"].to_list()) | set(ident.ranks["rank"].to_list())
    fw = view.frameworks
    for table, column in (
        (fw.timeouts, "global_rank"),
        (fw.torch_events, "global_rank"),
    ):
        seen |= set(table[column].drop_nulls().to_list())
    if not seen:
        return None  # no line names its rank (DeepSpeed's unlabelled stdout)
    return [r for r in range(world) if r not in seen]


def _next_reasons(starts: pl.DataFrame | None, k: int) -> list[str]:
    """Why attempt ``k + 1`` started, over all files."""
    if starts is None:
        return []
    reasons = starts.filter(pl.col("attempt") == k + 1)["reason"].to_list()
    return sorted({r for joined in reasons for r in joined.split("+")})


def _describe_attempt(k: int, view: Analysis, starts: pl.DataFrame | None) -> Attempt:
    """Attempt ``k``'s spans, processes, ranks and first and last times."""
    spans: dict[int, tuple[int, int | None]] = {}
    reasons: list[str] = []
    if starts is not None:
        by_file = starts.sort("file_id", "start").group_by("file_id", maintain_order=True)
        for (file_id,), segs in by_file:
            rows = segs.to_dicts()
            for j, row in enumerate(rows):
                if row["attempt"] == k:
                    end = rows[j + 1]["start"] - 1 if j + 1 < len(rows) else None
                    spans[int(file_id)] = (max(1, int(row["start"])), end)
                    reasons += row["reason"].split("+")
    members = view.identity.members
    ranks = members["rank"].drop_nulls().unique().sort().to_list()
    ts_start = ts_end = None
    if "ts_min" in view.stats.columns:  # read with the statistics: no pass over the lines
        lo, hi = view.stats["ts_min"].min(), view.stats["ts_max"].max()
        ts_start = lo if isinstance(lo, datetime) else None
        ts_end = hi if isinstance(hi, datetime) else None
    return Attempt(
        index=k,
        spans=spans,
        reasons=sorted(set(reasons)) if k else ["start"],
        hosts=sorted(set(members["host"].to_list())),
        pids=sorted(set(members["pid"].to_list())),
        ranks=[int(r) for r in ranks],
        world_size=view.identity.world_size,
        ts_start=ts_start,
        ts_end=ts_end,
    )


def _records(scan: Scan) -> LineRecords:
    """Every non-COLL line into records: simple shapes counted in polars, the rest
    through the reference parser; plus the per-file count of fast COLL lines."""
    # Host names seen on intact COLL lines, to repair spliced lines' hosts.
    fast_procs = proc_table(scan.tokens)
    # Read once: four readers below go over these lines (init output: ~100 per rank).
    nccl_lines = (
        pl.scan_parquet(scan.text_store)
        .filter(pl.col("kind") == LINE_KIND["nccl"])
        .collect(engine="streaming")
        .lazy()
    )
    conns = connection_lines(nccl_lines)
    plain = plain_info_lines(nccl_lines)
    done = pl.concat([conns.select("file_id", "i"), plain.select("file_id", "i")])
    records = LineRecords()
    messages = info_messages(nccl_lines.join(done.lazy(), on=["file_id", "i"], how="anti"))
    done = pl.concat([done, add_info_messages(records, messages)])
    rest = nccl_lines.join(done.lazy(), on=["file_id", "i"], how="anti")
    collect_records(
        rest.collect(engine="streaming").iter_rows(),
        known_hosts=fast_procs["host"].to_list(),
        out=records,
    )
    # Creation order matters to identity: file order, whichever reader took the line.
    records.comm_events.sort(key=lambda e: (e[0][0], e[1]))
    add_connection_lines(records, conns)
    add_plain_info_lines(records, plain)
    records.fast_calls.update(scan.coll_lines)
    _count_other_lines(scan.text_store, records)
    return records


def _nccl_year(lines: pl.LazyFrame, records: LineRecords) -> int | None:
    """A year from NCCL's own timestamps (for PyTorch's year-less glog times)."""
    for group in records.errors:
        if group.ts is not None:
            return group.ts.year
    first = lines.select(pl.col("ts").drop_nulls().first()).collect(engine="streaming").item()
    return first.year if first is not None else None


def _account_frameworks(records: LineRecords, frameworks: FrameworkTables) -> None:
    """Lines the PyTorch and DeepSpeed parsers used were counted as other text."""
    for file_id, n in frameworks.parsed.items():
        records.parsed[file_id] += n
        records.unparsed.setdefault(file_id, Counter())["other"] -= n
    for file_id, (n, first) in frameworks.malformed.items():
        counts = records.unparsed.setdefault(file_id, Counter())
        counts["other"] -= n
        counts["malformed"] += n
        firsts = records.first_bad.setdefault(file_id, {})
        firsts["malformed"] = min(firsts.get("malformed", first), first)


def _process_stats(
    lines: pl.LazyFrame, tokens: list[str], records: LineRecords
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The header-token table and per (process, comm) stats, spliced hosts repaired.

    ``tokens``: the header tokens of the field reader's lines.
    """
    slow = (f"{proc[1]}:{proc[2]}:{tid}" for proc, _line, tid, _c, _ts in records.colls)
    procs = proc_table([*tokens, *slow])
    stats = proc_comm_stats(lines, procs)
    repairs = repair_spliced_hosts(stats, records)
    if repairs.is_empty():
        return procs, stats
    procs = apply_host_repairs(procs, repairs)
    for r in repairs.iter_rows(named=True):
        records.spliced[r["file_id"]] += r["calls"]
        first = records.first_bad.setdefault(r["file_id"], {})
        first["spliced"] = min(first.get("spliced", r["first_line"]), r["first_line"])
    return procs, proc_comm_stats(lines, procs)


#: With more files than this, a sample of them is sniffed for COLL offsets (files of one
#: job share their shape; scan_inputs learns any offset a file adds).
_SNIFF_FILES = 16


def _targets(inputs: list[Input]) -> list[ScanTarget]:
    nonempty = [(k, inp) for k, inp in enumerate(inputs) if inp.size_bytes > 0]
    step = max(1, len(nonempty) // _SNIFF_FILES)
    shared: set[int] = set()
    for _k, inp in nonempty[::step]:
        shared.update(sniff_offsets(inp.path, inp.size_bytes))
    return [ScanTarget(k, inp.path, tuple(sorted(shared)), inp.shifted) for k, inp in nonempty]


def _scan(
    targets: list[ScanTarget], inputs: list[Input], store: Path, problems: list[Problem]
) -> tuple[list[ScanTarget], Scan | None]:
    if not targets:
        return [], None
    try:
        return targets, scan_inputs(targets, store)
    except (pl.exceptions.PolarsError, OSError):
        # OSError: polars decompresses by magic bytes and a text file may start with them.
        pass
    # One file broke the combined query: find it, report it, scan the rest.
    good: list[ScanTarget] = []
    for target in targets:
        try:
            scan_inputs([target], store / "probe")
            good.append(target)
        except (pl.exceptions.PolarsError, OSError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            problems.append(Problem(inputs[target.file_id].display, f"cannot be read: {reason}"))
    if not good:
        return [], None
    return good, scan_inputs(good, store)


def _count_other_lines(text_store: Path, records: LineRecords) -> None:
    """Count the lines without an NCCL marker by reason, vectorised (they are most lines
    of a chatty job that logs no COLL)."""
    kind = pl.col("kind")
    reason = (
        pl.when(pl.col("n_bytes") > TOO_LONG_BYTES)
        .then(pl.lit("too_long"))
        .when(kind == LINE_KIND["blank"])
        .then(pl.lit("blank"))
        .when(kind == LINE_KIND["binary"])
        .then(pl.lit("binary"))
        .otherwise(pl.lit("other"))
    )
    counts = (
        pl.scan_parquet(text_store)
        .filter(kind != LINE_KIND["nccl"])
        .group_by("file_id", reason.alias("reason"))
        .agg(pl.len().alias("n"), pl.col("i").min().alias("first"))
        .collect(engine="streaming")
    )
    for r in counts.iter_rows(named=True):
        records.unparsed.setdefault(r["file_id"], Counter())[r["reason"]] += r["n"]
        records.first_bad.setdefault(r["file_id"], {}).setdefault(r["reason"], r["first"])


_DAMAGE = {
    "binary": "of binary data or invalid UTF-8 skipped",
    "too_long": "longer than any NCCL line skipped",
    "malformed": "with an NCCL marker but no known NCCL format skipped",
    "spliced": "holding two processes' writes spliced together (the whole tail was kept)",
}


def _notes(
    inputs: list[Input], records: LineRecords, frameworks: FrameworkTables
) -> dict[str, list[str]]:
    """Per input: what the sources said, where each kind of damage first appears, and
    where the year of year-less PyTorch (glog) times came from."""
    notes: dict[str, list[str]] = {}
    undated = frameworks.year_less_files()
    for k, inp in enumerate(inputs):
        found = list(inp.notes)
        skipped = records.unparsed.get(k, Counter())
        for reason, what in _DAMAGE.items():
            n = records.spliced.get(k, 0) if reason == "spliced" else skipped.get(reason, 0)
            first = records.first_bad.get(k, {}).get(reason)
            if n and first is not None:
                found.append(f"{n:,} line{'s' if n > 1 else ''} {what}, first at line {first}")
        if k in undated:
            found.append(undated[k])
        if found:
            notes[inp.display] = found
    return notes


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".") if x.isdecimal())


def _account(inputs: list[Input], per_file: dict[int, int], records: LineRecords) -> pl.DataFrame:
    fast = records.fast_calls
    rows = []
    for k, inp in enumerate(inputs):
        n_lines = per_file.get(k, 0)
        skipped = records.unparsed.get(k, Counter())
        parsed = fast.get(k, 0) + records.parsed.get(k, 0)
        rows.append(
            {
                "path": inp.display,
                "size_bytes": inp.size_bytes,
                "lines": n_lines,
                "parsed": parsed,
                "unparsed": n_lines - parsed,
                **{reason: skipped.get(reason, 0) for reason in _SKIP_REASONS},
                "spliced": records.spliced.get(k, 0),
            }
        )
    return validate(pl.DataFrame(rows, schema=INPUTS_SCHEMA), INPUTS_SCHEMA, "inputs")


def _communicators(
    identity: Identity, summary: CollSummary | None, records: LineRecords
) -> pl.DataFrame:
    members = identity.members
    if members.is_empty():
        return pl.DataFrame(schema=COMMUNICATORS_SCHEMA)
    grouped = members.group_by("comm_key").agg(
        pl.col("comm_id").drop_nulls().first().alias("comm_id"),
        pl.col("nranks").max().cast(pl.Int32).alias("nranks"),
        pl.len().cast(pl.Int32).alias("members_seen"),
        pl.coalesce("rank", "comm_rank").drop_nulls().unique().sort().alias("ranks_seen"),
    )
    nnodes = pl.DataFrame(
        {"comm_key": list(identity.nnodes), "nnodes": list(identity.nnodes.values())},
        schema={"comm_key": pl.String, "nnodes": pl.Int32},
    )
    matched = pl.DataFrame(
        {"comm_key": list(identity.matched_by), "matched_by": list(identity.matched_by.values())},
        schema={"comm_key": pl.String, "matched_by": pl.String},
    )
    aborted_keys = {
        (proc, ev.comm) for proc, _line, ev in records.comm_events if ev.event == "Abort"
    }
    aborted = pl.DataFrame(
        [{"file_id": f, "host": h, "pid": p, "comm": c} for (f, h, p), c in aborted_keys],
        schema={"file_id": pl.UInt32, "host": pl.String, "pid": pl.Int32, "comm": pl.String},
    )
    aborted_per_comm = (
        members.join(aborted, on=["file_id", "host", "pid", "comm"], how="semi")
        .group_by("comm_key")
        .agg(pl.len().cast(pl.Int32).alias("aborted"))
    )
    per_comm = (
        summary.per_comm
        if summary is not None
        else pl.DataFrame(
            schema={
                "comm_key": pl.String,
                "calls": pl.Int64,
                "instances": pl.Int64,
                "last_seq": pl.Int64,
            }
        )
    )
    frame = (
        grouped.join(nnodes, on="comm_key", how="left")
        .join(matched, on="comm_key", how="left")
        .join(per_comm, on="comm_key", how="left")
        .join(aborted_per_comm, on="comm_key", how="left")
        .with_columns(
            pl.col("aborted").fill_null(0),
            pl.col("calls").fill_null(0).cast(pl.Int64),
            pl.col("ranks_seen").cast(pl.List(pl.Int32)),
        )
        .select(list(COMMUNICATORS_SCHEMA))
        .sort(["nranks", "comm_id", "comm_key"], descending=[True, False, False], nulls_last=True)
    )
    return validate(frame, COMMUNICATORS_SCHEMA, "communicators")


def _connections(records: LineRecords) -> pl.DataFrame:
    return validate(records.connection_table(), CONNECTIONS_SCHEMA, "connections")


def _errors(records: LineRecords, identity: Identity) -> pl.DataFrame:
    ranks: dict[tuple[int, str, int], dict[int | None, int]] = {}
    for r in identity.members.filter(pl.col("rank").is_not_null()).iter_rows(named=True):
        ranks.setdefault((r["file_id"], r["host"], r["pid"]), {})[r["cuda_dev"]] = r["rank"]
    rows = []
    for group in records.errors:
        if group.from_warn:
            kind, severity = nccl_errors.classify_warn(group.message)
        else:
            kind, severity = nccl_errors.kind_of_code(group.code or 0), "error"
        by_dev = ranks.get(group.proc, {})
        rank = (
            next(iter(by_dev.values())) if len(set(by_dev.values())) == 1 else by_dev.get(group.dev)
        )
        rows.append(
            {
                "file_id": group.proc[0],
                "line_no": group.line_no,
                "host": group.proc[1],
                "pid": group.proc[2],
                "tid": group.tid,
                "rank": rank,
                "kind": kind,
                "severity": severity,
                "message": group.message,
                "signature": nccl_errors.signature(group.message),
                "hint": nccl_errors.hint_for(kind, group.message),
                "src": group.src,
                "chain": group.chain,
                "code": group.code,
                "ts": group.ts,
            }
        )
    frame = pl.DataFrame(rows, schema=ERRORS_SCHEMA).sort("file_id", "line_no")
    return validate(frame, ERRORS_SCHEMA, "errors")


def _timestamps(records: LineRecords, calls: int, calls_with_ts: int) -> str:
    total = records.header_lines + calls - len(records.colls)
    with_ts = records.header_lines_with_ts + calls_with_ts
    with_ts -= sum(1 for *_x, ts in records.colls if ts is not None)
    if total <= 0 or with_ts <= 0:
        return "none"
    return "full" if with_ts >= total else "partial"


def _gaps(analysis: Analysis, records: LineRecords) -> list[Gap]:
    gaps: list[Gap] = []
    has_nccl = records.header_lines > 0 or analysis.summary is not None or records.versions
    if not has_nccl:
        gaps.append(
            Gap(
                "No NCCL lines at all: nothing about communicators, transports or collectives.",
                ("NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,COLL"),
            )
        )
        return gaps
    if analysis.summary is None:
        gaps.append(
            Gap(
                "No COLL lines: collective sequences, hangs and stragglers cannot be followed.",
                ("NCCL_DEBUG_SUBSYS=INIT,COLL (add COLL to the list you use)",),
            )
        )
    if not any(ev.event == "Init" for _p, _l, ev in records.comm_events):
        named = not analysis.identity.ranks.is_empty()
        gaps.append(
            Gap(
                "No communicator init lines: ranks were named only by NCCL's Init timings or "
                "Destroy/Abort COMPLETE lines (no commId; where opCount stays 0, 2.27+ on one "
                "node, a rank named by its teardown line alone has no collective sequence)."
                if named
                else "No communicator init lines: ranks cannot be tied to hosts, pids and GPUs.",
                ("NCCL_DEBUG=INFO from process start", "NCCL_DEBUG_SUBSYS must include INIT"),
            )
        )
    if analysis.timestamps != "full":
        gaps.append(
            Gap(
                "NCCL INFO lines carry no time: lateness (stragglers) and how long a collective "
                "was stuck cannot be measured, only the order of events.",
                (
                    "NCCL >= 2.26: NCCL_DEBUG_TIMESTAMP_LEVELS=WARN,INFO",
                    "NCCL_DEBUG_TIMESTAMP_FORMAT='[%F %T.%6f] '",
                ),
            )
        )
    if any(ev.comm_id is None and ev.event == "Init" for _p, _l, ev in records.comm_events):
        gaps.append(
            Gap(
                "Init lines carry no commId (NCCL < 2.17): communicators were matched across "
                "ranks by size and creation order, which sub-communicators can confuse.",
                ("NCCL >= 2.17 prints commId on Init lines",),
            )
        )
    if not analysis.nccl_versions:
        gaps.append(
            Gap(
                "No NCCL version banner: the log starts after NCCL initialised, or it was cut.",
                ("keep the log from process start (NCCL_DEBUG=VERSION at least)",),
            )
        )
    return gaps


def new_workdir() -> tempfile.TemporaryDirectory[str]:
    """A work directory for one analysis (Parquet stores, decompressed inputs)."""
    return tempfile.TemporaryDirectory(prefix="ncclscope-")
