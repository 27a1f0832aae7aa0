"""Findings: what the detectors say about a job, as data every output reads.

A finding names what it blames (ranks, hosts), with the evidence a user can check in
their logs (``lines``) and JSON-ready facts (``evidence``).  Detectors make them
(``ncclscope.detect``); the tables of an analysis hold them (``ncclscope.model``);
outputs render them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

__all__ = [
    "HANG_CLASSES",
    "KINDS",
    "SEVERITIES",
    "Finding",
    "HangClass",
    "Kind",
    "LineRef",
    "Severity",
    "duration_text",
    "ranks_text",
    "severity_at_least",
]

Severity = Literal["info", "warning", "critical"]
#: Severities from the least to the most severe.
SEVERITIES: tuple[Severity, ...] = get_args(Severity)
Kind = Literal[
    "straggler",
    "hang",
    "mismatch",
    "timeout",
    "timeout_imminent",
    "nccl_error",
    "config",
    "zero_stage",
    "pcie_contention",
    "oom_risk",
    "collective_cost",
    "cluster_cause",
]
KINDS: tuple[Kind, ...] = get_args(Kind)
HangClass = Literal[
    "missing_rank",
    "mismatch",
    "dead_process",
    "nccl_error",
    "unknown",
    # told by an evidence folder (``ncclscope.evidence``): the process's own state
    "stuck_outside_nccl",
    "stuck_in_nccl",
    "frozen_node",
]
HANG_CLASSES: tuple[HangClass, ...] = get_args(HangClass)


def severity_at_least(severity: Severity, floor: Severity) -> bool:
    """``severity_at_least("critical", "warning")`` is True."""
    return SEVERITIES.index(severity) >= SEVERITIES.index(floor)


@dataclass(frozen=True)
class LineRef:
    """A line of the user's logs: ``file_id`` indexes ``Analysis.paths``; ``line_no`` is
    1-based.  The text is filled in when findings are reported."""

    file_id: int
    line_no: int


@dataclass
class Finding:
    """One thing wrong with the job, with the evidence a user can check in their logs.

    ``ranks`` and ``hosts`` name what the finding blames (the culprit, the straggler, the
    failing host), never the ranks that merely waited: those go in ``evidence``.
    ``seq`` is the collective's index in its communicator's call order from 0.
    """

    kind: Kind
    severity: Severity
    message: str
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    op: str | None = None
    seq: int | None = None
    #: JSON-ready facts; line pointers go in ``lines``, not here
    evidence: dict[str, Any] = field(default_factory=dict)
    lines: list[LineRef] = field(default_factory=list)
    cost_gpu_s: float | None = None
    hang_class: HangClass | None = None

    def order(self) -> tuple[int, float]:
        """Sort key: most severe first, then most costly."""
        return (-SEVERITIES.index(self.severity), -(self.cost_gpu_s or 0.0))


def ranks_text(ranks: list[int]) -> str:
    """``[0, 1, 2, 4, 6, 7]`` -> ``"0-2, 4, 6-7"``.

    >>> ranks_text([0, 1, 2, 4, 6, 7]), ranks_text([5])
    ('0-2, 4, 6-7', '5')
    """
    out: list[str] = []
    for r in sorted(set(ranks)):
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ", ".join(out)


def duration_text(seconds: float) -> str:
    """``552.0`` -> ``"9m12s"``; ``0.0042`` -> ``"4.2 ms"``.

    >>> duration_text(552.0), duration_text(0.0042), duration_text(7200.0)
    ('9m12s', '4.2 ms', '2h00m')
    """
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
