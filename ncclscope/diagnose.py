"""Diagnose: the detectors over the tables ``build`` made, one context per attempt.

``diagnose(built)`` runs every detector on each attempt's own tables (a file that holds
a restart holds two runs), keeps advice that every attempt gives alike once, labels
what is about one attempt only, and quotes the lines the findings point at.  The last
attempt's :class:`~ncclscope.detect.Context` comes back with the findings, so that the
agent exports from the same tables the detectors read instead of building them again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import polars as pl

from ncclscope.detect import Context, run_context
from ncclscope.findings import Finding
from ncclscope.model import Analysis, Built, Progress
from ncclscope.model.attempts import Attempt
from ncclscope.sources import QUOTE_CHARS, Input, read_lines

__all__ = ["Diagnosis", "diagnose"]


@dataclass(frozen=True)
class Diagnosis:
    """What ``diagnose`` found on the job's tables (``analysis``, unchanged): every
    attempt's findings, the attempts with the findings that concern each, the lines the
    findings point at, and the context the last attempt's detectors read (the agent
    exports its metrics from it)."""

    analysis: Analysis
    context: Context
    #: most severe first (``Finding.order``)
    findings: list[Finding]
    #: the runs the inputs hold, the last being the job the tables describe
    attempts: list[Attempt]
    #: (file_id, line_no) -> text of the lines the findings point at
    quoted: dict[tuple[int, int], str]


def diagnose(
    built: Built, *, now: datetime | None = None, progress: Progress | None = None
) -> Diagnosis:
    """Every detector over each attempt of ``built``; ``now``: the wall clock of a live
    reading (the agent's window), for the last attempt (``Context.now``), None
    post-mortem."""
    if progress is not None:
        progress("detect", 0, 1)
    analysis = built.analysis
    found: list[tuple[Attempt, list[Finding]]] = []
    several = len(built.views) > 1
    advice: dict[tuple[str, str, str], Finding] = {}
    ctx: Context | None = None
    for k, (view, attempt) in enumerate(built.views):
        # Only the last attempt can still be running: the wall clock is about it.
        ctx = Context(view, now=now if k == len(built.views) - 1 else None)
        findings = run_context(ctx)
        if several:
            kept = []
            for f in findings:
                key = (f.kind, f.severity, f.message)
                if f.kind == "config" and key in advice:
                    kept.append(advice[key])  # the same advice: one finding
                    continue
                if f.kind == "config":
                    advice[key] = f
                kept.append(f)
            findings = kept
        found.append((attempt, findings))
    if several:  # label what is about one attempt only
        for k, (_a, findings) in enumerate(found):
            for f in findings:
                shared = any(f is g for j, (_b, other) in enumerate(found) if j != k for g in other)
                if not shared and "attempt" not in f.evidence:
                    f.evidence["attempt"] = k
                    f.message = f"attempt {k}: {f.message}"
    assert ctx is not None  # build makes one attempt at least
    unique = {id(f): f for _a, fs in found for f in fs}
    findings = sorted(unique.values(), key=Finding.order)
    at = {id(f): k for k, f in enumerate(findings)}
    attempts = [replace(a, findings=sorted(at[id(f)] for f in fs)) for a, fs in found]
    quoted = _quote(analysis.sources, findings, built.text_store)
    if progress is not None:
        progress("detect", 1, 1)
    return Diagnosis(analysis, ctx, findings, attempts, quoted)


def _quote(
    inputs: list[Input], findings: list[Finding], text_store: Path | None = None
) -> dict[tuple[int, int], str]:
    """The text of every line a finding points at.  Lines the scan kept (every line but
    the fast COLL lines: warnings, errors, PyTorch's) come from its text store; only the
    rest costs a pass over their file, one per file that has some."""
    wanted: dict[int, set[int]] = {}
    for f in findings:
        for ref in f.lines:
            wanted.setdefault(ref.file_id, set()).add(ref.line_no)
    quoted: dict[tuple[int, int], str] = {}
    plain = [k for k in wanted if 0 <= k < len(inputs) and not inputs[k].shifted]
    if text_store is not None and plain:
        keys = pl.DataFrame(
            [(k, n) for k in plain for n in wanted[k]],
            schema={"file_id": pl.UInt32, "i": pl.UInt32},
            orient="row",
        )
        kept = (
            pl.scan_parquet(text_store)
            .select("file_id", "i", "text")
            .join(keys.lazy(), on=["file_id", "i"], how="semi")
            .select("file_id", "i", pl.col("text").fill_null("").str.slice(0, QUOTE_CHARS))
            .collect(engine="streaming")
        )
        for file_id, line_no, text in kept.iter_rows():
            quoted[(file_id, line_no)] = text
            wanted[file_id].discard(line_no)
    for file_id, line_nos in wanted.items():
        if 0 <= file_id < len(inputs) and line_nos:
            for line_no, text in read_lines(inputs[file_id], line_nos).items():
                quoted[(file_id, line_no)] = text
    return quoted
