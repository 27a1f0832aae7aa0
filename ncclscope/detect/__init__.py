"""Detectors: each a metric table plus a policy that turns it into findings.

``run_detectors`` runs every registered detector over an :class:`~ncclscope.analysis.
Analysis` and returns its findings, most severe and most costly first.  Detectors read
tables and return findings; they never print and never parse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Importing a detector's module registers it; this order is the order they run in.
from ncclscope.detect import (
    config,
    hang,
    nccl_errors,
    oom_risk,
    pcie_contention,
    straggler,
    timeout,
    zero_stage,
)
from ncclscope.detect.base import DETECTORS, Finding
from ncclscope.detect.context import Context

if TYPE_CHECKING:
    from datetime import datetime

    from ncclscope.model import Analysis

__all__ = ["DETECTORS", "Context", "Finding", "run_detectors"]

_MODULES = (config, hang, nccl_errors, straggler, timeout, pcie_contention, oom_risk, zero_stage)


def run_detectors(analysis: Analysis, *, now: datetime | None = None) -> list[Finding]:
    """Every detector's findings, the most severe and most costly first.  ``now``: the
    wall clock of a live reading (``Context.now``), None post-mortem."""
    ctx = Context(analysis, now=now)
    findings: list[Finding] = []
    for detector in DETECTORS.values():
        findings += detector.policy(detector.metric(ctx), ctx)
    return sorted(findings, key=Finding.order)
