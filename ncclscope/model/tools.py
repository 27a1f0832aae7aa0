"""The tables of NCCL's own tools among the inputs: Inspector records, RAS reports and
nccl-tests runs, read by ``ncclscope.parsers.tools``; their file_ids follow the logs'
and the Flight Recorder dumps' in ``Analysis.paths``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ncclscope.parsers.tools.inspector import read_inspector_files
from ncclscope.parsers.tools.nccl_tests import parse_nccl_tests
from ncclscope.parsers.tools.ras import RasRead, parse_ras_json, parse_ras_text
from ncclscope.schema import (
    INSPECTOR_JOIN_SCHEMA,
    INSPECTOR_SCHEMA,
    NCCL_TESTS_RUNS_SCHEMA,
    NCCL_TESTS_SCHEMA,
    RAS_COMMS_SCHEMA,
    RAS_RANKS_SCHEMA,
    RAS_REPORTS_SCHEMA,
)
from ncclscope.sources import Problem

__all__ = ["ToolTables", "read_tools"]


@dataclass(frozen=True)
class ToolTables:
    """What NCCL's tools wrote, beside the logs.

    ``files``: per tool input, ``(file_id, path, kind, records)`` (kind: ``inspector``,
    ``ras_text``, ``ras_json``, ``nccl_tests``; records: Inspector records, RAS
    communicators or nccl-tests rows read); ``inspector``: INSPECTOR_SCHEMA;
    ``inspector_joined``: the records joined to the logs' COLL lines
    (INSPECTOR_JOIN_SCHEMA); ``nccl_tests_runs``/``nccl_tests``: the runs and their
    table rows; ``ras_reports``/``ras_comms``/``ras_ranks``: the RAS reports.
    ``skipped``: per path, records or lines skipped by reason.
    """

    files: list[tuple[int, str, str, int]] = field(default_factory=list)
    inspector: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=INSPECTOR_SCHEMA))
    inspector_joined: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(schema=INSPECTOR_JOIN_SCHEMA)
    )
    inspector_versions: list[str] = field(default_factory=list)
    nccl_tests_runs: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(schema=NCCL_TESTS_RUNS_SCHEMA)
    )
    nccl_tests: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=NCCL_TESTS_SCHEMA))
    ras_reports: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(schema=RAS_REPORTS_SCHEMA)
    )
    ras_comms: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=RAS_COMMS_SCHEMA))
    ras_ranks: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=RAS_RANKS_SCHEMA))
    skipped: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)
    #: Why no Inspector record joined a COLL line (``INSPECTOR_UNJOINED``), else None.
    inspector_unjoined: str | None = None
    #: Per RAS report's file_id, the CUDA its NCCL was compiled with (``NCCL version 2.26.2
    #: compiled with CUDA 12.6`` -> ``12.6``; text reports only).
    ras_compiled_cuda: dict[int, str] = field(default_factory=dict)


def _with_id(frame: pl.DataFrame, fid: int) -> pl.DataFrame:
    return frame.with_columns(pl.lit(fid, pl.UInt32).alias("file_id"))


def read_tools(
    tools: Sequence[tuple[int, str, Path, str]],
) -> tuple[ToolTables, list[Problem]]:
    """Read the tool inputs ``(file_id, display, path, kind)``.  A file that holds
    nothing readable is a problem; a bad record or line is counted in ``skipped``."""
    files: list[tuple[int, str, str, int]] = []
    parts: dict[str, list[pl.DataFrame]] = {}
    skipped: dict[str, dict[str, int]] = {}
    problems: list[Problem] = []
    versions: set[str] = set()
    notes: dict[str, list[str]] = {}
    compiled_cuda: dict[int, str] = {}

    def add(name: str, frame: pl.DataFrame, fid: int) -> None:
        parts.setdefault(name, []).append(_with_id(frame, fid))

    inspector = read_inspector_files(
        [(fid, path, display) for fid, display, path, kind in tools if kind == "inspector"]
    )
    for fid, display, path, kind in tools:
        reasons: Counter[str] = Counter()
        n = 0
        if kind == "inspector":
            read = inspector[fid]
            parts.setdefault("inspector", []).append(read.rows)
            reasons = read.skipped
            versions.update(read.versions)
            n = read.rows.height
            if not n:
                problems.append(Problem(display, "no Inspector record could be read"))
        elif kind == "nccl_tests":
            text = _text(path)
            t = parse_nccl_tests(text, display)
            add("nccl_tests_runs", t.runs, fid)
            add("nccl_tests", t.rows, fid)
            reasons = t.skipped
            n = t.rows.height
            if t.notes:
                notes[display] = list(t.notes)
        else:
            text = _text(path)
            ras: RasRead = (parse_ras_json if kind == "ras_json" else parse_ras_text)(text, display)
            if ras.problem:
                problems.append(Problem(display, ras.problem))
            add("ras_reports", ras.report, fid)
            add("ras_comms", ras.comms, fid)
            add("ras_ranks", ras.ranks, fid)
            reasons = ras.skipped
            if ras.cuda_version:
                compiled_cuda[fid] = ras.cuda_version
            if ras.notes:
                notes[display] = list(ras.notes)
            n = ras.comms.height
        files.append((fid, display, kind, n))
        kept = {r: c for r, c in sorted(reasons.items()) if c}
        if kept:
            skipped[display] = kept
    frames: dict[str, Any] = {name: pl.concat(part) for name, part in parts.items()}
    tables = ToolTables(
        files=files,
        inspector_versions=sorted(versions),
        skipped=skipped,
        notes=notes,
        ras_compiled_cuda=compiled_cuda,
        **frames,
    )
    return tables, problems


def _text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""
