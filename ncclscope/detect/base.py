"""The registry every detector joins (findings themselves: ``ncclscope.findings``).

A detector is a metric (a polars table computed from the analysis's tables, which tests
and benchmarks can inspect on their own) plus a policy (the rules that turn rows of the
metric into findings).  Detectors register themselves with :func:`register`; outputs
never see a detector, only its findings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

import polars as pl

from ncclscope.findings import (
    HANG_CLASSES,
    KINDS,
    SEVERITIES,
    Finding,
    HangClass,
    Kind,
    LineRef,
    Severity,
    duration_text,
    ranks_text,
    severity_at_least,
)

if TYPE_CHECKING:
    from ncclscope.detect.context import Context

__all__ = [
    "DETECTORS",
    "HANG_CLASSES",
    "KINDS",
    "SEVERITIES",
    "Detector",
    "Finding",
    "HangClass",
    "Kind",
    "LineRef",
    "Severity",
    "duration_text",
    "ranks_text",
    "register",
    "severity_at_least",
]


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
