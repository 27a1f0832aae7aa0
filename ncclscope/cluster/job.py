"""``analyze --prometheus``: the job's hosts and window from its logs, read from the
cluster's Prometheus, and the result joined into the tables the detectors read."""

from __future__ import annotations

from dataclasses import fields, replace
from datetime import datetime, timedelta

import polars as pl

from ncclscope.cluster.prometheus import PromClient
from ncclscope.cluster.read import read_cluster
from ncclscope.cluster.tables import ClusterTables
from ncclscope.model import Analysis, Built

__all__ = ["MARGIN", "log_window", "read_for_job", "with_cluster"]

_OFFSET = "ncclscope_log_utc_offset_seconds"
#: The window read: the logs' first..last time widened by this much each side.
MARGIN = timedelta(minutes=5)


def log_window(analysis: Analysis) -> tuple[datetime, datetime] | None:
    """The logs' first and last time (UTC) over their collectives, errors and framework
    lines; None when no line has a time."""
    lows: list[datetime] = []
    highs: list[datetime] = []

    def take(frame: pl.DataFrame | pl.LazyFrame, col: str = "ts") -> None:
        got = frame.select(pl.col(col).min().alias("lo"), pl.col(col).max().alias("hi"))
        row = (got.collect() if isinstance(got, pl.LazyFrame) else got).row(0)
        if row[0] is not None:
            lows.append(row[0])
            highs.append(row[1])

    if analysis.collectives is not None:
        take(analysis.collectives)
    take(analysis.errors)
    fw = analysis.frameworks
    for f in fields(fw):
        table = getattr(fw, f.name)
        if isinstance(table, pl.DataFrame) and "ts" in table.columns and len(table):
            take(table)
    if not lows:
        return None
    return min(lows), max(highs)


def read_for_job(analysis: Analysis, client: PromClient) -> ClusterTables:
    """What ``client``'s Prometheus holds for the logs' hosts over their window (±
    :data:`MARGIN`); nothing is asked when the logs have no times or no hosts (a problem
    says so)."""
    window = log_window(analysis)
    if window is None:
        return ClusterTables(
            url=client.url,
            problems=["the logs have no times: no window to read Prometheus over, nothing read"],
        )
    start, end = window[0] - MARGIN, window[1] + MARGIN
    tables = read_cluster(client, list(analysis.hosts), start, end)
    offset = tables.telemetry.filter(pl.col("metric") == _OFFSET)["value"]
    if analysis.log_zone_source == "assumed" and len(offset) and offset[-1] != 0:
        hours = offset[-1] / 3600
        tables.problems.append(
            f"the agent learned that the logs' clock is UTC{hours:+g} h, but they were read "
            "as UTC: the window read is off by as much (analyze --log-tz sets their zone)"
        )
    return tables


def with_cluster(built: Built, cluster: ClusterTables, *, telemetry: bool) -> Built:
    """``built`` with ``cluster`` on the job and each attempt; with ``telemetry``, the
    agent's series read from Prometheus as the detectors' telemetry too (where no
    ``--telemetry`` was given)."""

    def put(a: Analysis) -> Analysis:
        if telemetry and not cluster.telemetry.is_empty():
            return replace(a, cluster=cluster, telemetry=cluster.telemetry)
        return replace(a, cluster=cluster)

    return replace(
        built, analysis=put(built.analysis), views=[(put(v), at) for v, at in built.views]
    )
