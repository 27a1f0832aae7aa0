"""Detectors: each a metric table plus a policy that turns it into findings.

``run_context`` runs every registered detector over a :class:`Context` (an
:class:`~ncclscope.model.Analysis` and the tables computed from it) and returns its
findings, most severe and most costly first.  Detectors read
tables and return findings; they never print and never parse.
"""

from __future__ import annotations

# Importing a detector's module registers it (``base.register``); ``RUN_ORDER`` says
# in which order they run.
from ncclscope.detect import (
    collective_cost,
    config,
    exec_straggler,
    fabric,
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

__all__ = ["DETECTORS", "RUN_ORDER", "Context", "Finding", "run_context"]

_MODULES = (
    collective_cost,
    config,
    exec_straggler,
    fabric,
    hang,
    nccl_errors,
    oom_risk,
    pcie_contention,
    straggler,
    timeout,
    zero_stage,
)

#: The order detectors run in, by name.  Findings are sorted by severity and cost; ties
#: keep this order, so it shows in the reports.
RUN_ORDER = (
    "config",
    "hang",
    "nccl_errors",
    "pcie_contention",
    "oom_risk",
    "straggler",
    "exec_straggler",
    "collective_cost",
    "timeout_countdown",
    "timeout",
    "zero_stage",
    # last: it explains the others' findings with the cluster's counters (``ctx.found``)
    "fabric",
)
if set(RUN_ORDER) != set(DETECTORS):  # a detector added without a place in the order
    msg = f"RUN_ORDER {sorted(RUN_ORDER)} != registered {sorted(DETECTORS)}"
    raise ImportError(msg)


def run_context(ctx: Context) -> list[Finding]:
    """Every detector's findings on ``ctx``, the most severe and most costly first (the
    context keeps what they computed, for whoever reads it next)."""
    findings: list[Finding] = []
    ctx.found = findings  # what ran so far, for detectors that explain others' findings
    for name in RUN_ORDER:
        detector = DETECTORS[name]
        findings += detector.policy(detector.metric(ctx), ctx)
    return sorted(findings, key=Finding.order)
