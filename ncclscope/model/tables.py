"""The tables of one analysis: what ``build`` makes and every later stage reads.

:class:`Analysis` holds each table the pipeline builds (identity, communicators,
collectives, errors, framework tables, telemetry) and what the detectors found; the
detectors (``ncclscope.detect``) and the outputs (``ncclscope.export``) import it from
here, below the pipeline that fills it (``ncclscope.analysis``), so the imports run one
way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from ncclscope.cluster.tables import ClusterTables
from ncclscope.evidence.read import Evidence
from ncclscope.model.attempts import Attempt
from ncclscope.model.collectives import CollSummary
from ncclscope.model.flight import FlightTables
from ncclscope.model.identity import Identity
from ncclscope.model.tools import ToolTables
from ncclscope.parsers.frameworks import FrameworkTables
from ncclscope.schema import TELEMETRY_SCHEMA
from ncclscope.sources import Input, Problem

__all__ = ["Analysis", "Built", "Gap", "Progress"]

#: progress(stage, done, total): stages are "read", "scan", "build", "detect".
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Gap:
    """Something these logs cannot tell, and the settings that would make them tell it."""

    what: str
    settings: tuple[str, ...]


@dataclass(frozen=True)
class Analysis:
    """Every table ``analyze`` builds, plus what the reports need to say about the inputs.

    Frozen: ``build`` makes it whole and nothing later changes it (a variant, such as
    one attempt's view, is a ``dataclasses.replace`` copy).  Identity, communicators,
    collectives and stats describe the job's last attempt (a restart kept in the same
    file starts a new one); errors and framework tables cover every attempt.  What the
    detectors find is ``ncclscope.diagnose.Diagnosis``'s."""

    paths: list[str]
    inputs: pl.DataFrame  # INPUTS_SCHEMA
    notes: dict[str, list[str]]  # path -> messages about that input
    problems: list[Problem]
    nccl_versions: list[str]
    cuda_versions: list[str]
    hosts: list[str]
    identity: Identity
    communicators: pl.DataFrame  # COMMUNICATORS_SCHEMA
    connections: pl.DataFrame  # CONNECTIONS_SCHEMA
    transports: list[str]
    networks: list[str]  # network plugins in use: IB, Socket, IBext, ...
    errors: pl.DataFrame  # ERRORS_SCHEMA
    collectives: pl.LazyFrame | None  # COLLECTIVES_SCHEMA, in Parquet
    summary: CollSummary | None
    #: per (file_id, host, pid, comm pointer): calls, opCount range, lines, signature
    #: (``proc_comm_stats``); empty without COLL lines
    stats: pl.DataFrame
    timestamps: str  # none | partial | full
    env: dict[str, list[str]]
    frameworks: FrameworkTables = field(default_factory=FrameworkTables)
    gaps: list[Gap] = field(default_factory=list)
    workdir: Path | None = None
    #: the inputs as read, by file_id (for quoting their lines)
    sources: list[Input] = field(default_factory=list)
    #: the agent's samples given with ``--telemetry`` (TELEMETRY_SCHEMA, long format);
    #: empty without them
    telemetry: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=TELEMETRY_SCHEMA))
    #: the job's world size and where it came from: ``init`` (NCCL's Init lines), ``coll``
    #: (COLL lines' ``[nranks=N]``: no Init line kept), ``launcher`` (launcher or
    #: PyTorch lines: ``WORLD_SIZE=16``, ``global_world_sizes=[16]``, ``size: 16``);
    #: None when nothing says
    world_size: int | None = None
    world_size_source: str | None = None
    #: the zone the logs' wall times were read in (``build``'s ``log_zone``: ``UTC``,
    #: ``+09:00``, ``America/New_York``); None: read as UTC, nothing said otherwise
    log_zone: str | None = None
    #: where ``log_zone`` came from: ``given`` (--log-tz), ``telemetry`` (the offset the
    #: agent learned from the lines' arrivals), ``learned`` (a clock in the logs that names
    #: its zone: ``parsers.zone``), ``assumed`` (UTC: nothing said)
    log_zone_source: str = "assumed"
    #: what taught ``log_zone`` where it was ``learned`` from the logs' own zoned clocks
    #: (or why they taught nothing); None otherwise
    log_zone_evidence: str | None = None
    #: ranks of the world that left no line in these inputs (a host whose files are
    #: absent); None when that cannot be told (world size unknown, or members whose
    #: rank no line names)
    ranks_without_logs: list[int] | None = None
    #: while detectors run on an attempt that a later one followed: why the next one
    #: started (``restart``, ``banner``, ``init``, ``pids``).  The job stopped there and
    #: was started again: evidence that this attempt's run ended.  None for the last.
    followed_by: list[str] | None = None
    #: PyTorch Flight Recorder dumps among the inputs (``ncclscope.model.flight``):
    #: per dump, entry, process group and group status, and the join to the COLL lines;
    #: empty tables without dumps.  Their file_ids follow the logs' in ``paths``.
    flight: FlightTables = field(default_factory=FlightTables)
    #: NCCL's own tools among the inputs (``ncclscope.model.tools``): Inspector records
    #: (and their join to the COLL lines), RAS reports, nccl-tests runs; empty without
    #: them.  nccl-tests output is also a log; the others' file_ids follow the dumps'.
    tools: ToolTables = field(default_factory=ToolTables)
    #: evidence folders the agent wrote at a stall (``ncclscope.evidence.read``): each
    #: node's processes' states, stacks and dumps; None without them
    evidence: Evidence | None = None
    #: what the cluster's exporters measured for the job's hosts and window, read from
    #: its Prometheus (``analyze --prometheus``, ``ncclscope.cluster``); None without it
    cluster: ClusterTables | None = None


@dataclass
class Built:
    """What ``analysis.build`` made: the job's tables (its last attempt's, every
    attempt's errors and framework tables), each attempt's own tables with its
    description, and the scan's text store (for quoting lines)."""

    analysis: Analysis
    views: list[tuple[Analysis, Attempt]]
    text_store: Path | None
