"""Findings, and the registry every detector joins.

A detector is a metric (a polars table computed from the analysis's tables, which tests
and benchmarks can inspect on their own) plus a policy (the rules that turn rows of the
metric into findings).  Detectors register themselves with :func:`register`; outputs
never see a detector, only its findings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, get_args

import polars as pl

if TYPE_CHECKING:
    from ncclscope.detect.context import Context

__all__ = [
    "DETECTORS",
    "HANG_CLASSES",
    "KINDS",
    "SEVERITIES",
    "Detector",
    "Finding",
    "LineRef",
    "Severity",
    "register",
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
]
KINDS: tuple[Kind, ...] = get_args(Kind)
HangClass = Literal["missing_rank", "mismatch", "dead_process", "nccl_error", "unknown"]
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


class Detector(Protocol):
    """A metric and a policy.  ``metric`` may return an empty frame when the inputs hold
    nothing it can measure; ``policy`` then says so (as a ``config`` finding) or returns
    nothing."""

    name: str

    def metric(self, ctx: Context) -> pl.DataFrame: ...

    def policy(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]: ...


#: Every detector, by name, in the order they run.
DETECTORS: dict[str, Detector] = {}


_D = TypeVar("_D", bound=Detector)


def register(factory: type[_D]) -> type[_D]:
    """Class decorator: instantiate the detector and add it to :data:`DETECTORS`."""
    detector = factory()
    DETECTORS[detector.name] = detector
    return factory


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
