"""A dashboard panel and its queries, as the dashboards' modules declare them
(``dashboards``: ncclscope's own series; ``fabric``: the cluster's other exporters')."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Panel", "Target"]


@dataclass(frozen=True)
class Target:
    """One query of a panel."""

    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class Panel:
    """One panel: a Grafana panel type, its queries, unit and place on a 24-wide grid."""

    kind: str
    title: str
    targets: tuple[Target, ...]
    w: int
    h: int
    unit: str = ""
    description: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
