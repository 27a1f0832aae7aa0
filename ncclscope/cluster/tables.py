"""The cluster's tables as ``analyze --prometheus`` reads them (``ClusterTables``), and
what was asked of Prometheus (``Ask``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import polars as pl

from ncclscope.schema import (
    CLUSTER_INSTANCES_SCHEMA,
    GPU_SAMPLES_SCHEMA,
    PORT_SAMPLES_SCHEMA,
    TELEMETRY_SCHEMA,
)

__all__ = ["Ask", "AskStatus", "ClusterTables"]

#: ``ok``: answered whole; ``partial``: Prometheus answered with warnings (a shard or a
#: remote read missing); ``truncated``: more series than the limit, the rest dropped;
#: ``error``: an error document (a bad query, an overload); ``timeout``: no answer in
#: time; ``unreachable``: no connection.
AskStatus = Literal["ok", "partial", "truncated", "error", "timeout", "unreachable"]


@dataclass(frozen=True)
class Ask:
    """One request made of Prometheus and what came back."""

    what: str  # ports_errors, ports_rates, ports_state, gpus, agent, uname, ...
    expr: str
    start: datetime | None
    end: datetime | None
    step_s: float | None
    status: AskStatus
    series: int = 0
    samples: int = 0
    seconds: float = 0.0
    #: the error or warning text, as Prometheus or the connection said it
    message: str | None = None


@dataclass(frozen=True)
class ClusterTables:
    """``ports``: PORT_SAMPLES_SCHEMA; ``gpus``: GPU_SAMPLES_SCHEMA; ``telemetry``:
    the agent's series as ``--telemetry`` gives them (TELEMETRY_SCHEMA); ``instances``:
    CLUSTER_INSTANCES_SCHEMA; ``asks``: every request; ``problems``: what could not be
    read or matched, in words; ``url``, ``start``, ``end``, ``step_s``: what was read."""

    url: str
    start: datetime | None = None
    end: datetime | None = None
    step_s: float | None = None
    ports: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=PORT_SAMPLES_SCHEMA))
    gpus: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=GPU_SAMPLES_SCHEMA))
    telemetry: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=TELEMETRY_SCHEMA))
    instances: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(schema=CLUSTER_INSTANCES_SCHEMA)
    )
    asks: list[Ask] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
