"""``analyze --prometheus``: the job's hosts and window from its logs, read from the
cluster's Prometheus, and the result joined into the tables the detectors read."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta, timezone, tzinfo

import polars as pl

from ncclscope.cluster.hosts import HostMatcher
from ncclscope.cluster.prometheus import PromClient
from ncclscope.cluster.read import STOPS, alternation, promql_string, read_cluster
from ncclscope.cluster.tables import ClusterTables
from ncclscope.model import Analysis, Built
from ncclscope.parsers.common import parse_zone, zone_name

__all__ = [
    "MARGIN",
    "AgentsZone",
    "agents_zone",
    "log_window",
    "read_for_job",
    "with_cluster",
    "zone_from_agents",
]

_OFFSET = "ncclscope_log_utc_offset_seconds"
_NODE = "ncclscope_node_info"
#: The window read: the logs' first..last time widened by this much each side.
MARGIN = timedelta(minutes=5)
#: Local clocks run from UTC-12 to UTC+14: logs read as UTC lie at most that far from
#: the hours they were written in.
_BEHIND, _AHEAD = timedelta(hours=12), timedelta(hours=14)


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


@dataclass(frozen=True)
class AgentsZone:
    """The logs' clock as the agents on their hosts learned it: ``offset_s`` (local time
    less UTC) where they agree, else None; ``problems`` in words."""

    offset_s: float | None = None
    problems: list[str] = field(default_factory=list)


def agents_zone(
    analysis: Analysis, client: PromClient, window: tuple[datetime, datetime] | None = None
) -> AgentsZone:
    """``ncclscope_log_utc_offset_seconds`` of the agents that ran on the logs' hosts, in
    one instant query over every hour the logs could have been written in (their times
    read as UTC, from UTC-12 to UTC+14): where the logs' zone was not given, their window
    is only known once it is.  Each agent's latest offset, joined to its host by
    ``ncclscope_node_info``::

        ncclscope_log_utc_offset_seconds{instance="10.0.0.7:9477",job="ncclscope"} 32400

    ``window``: the logs' (:func:`log_window`), where the caller has it."""
    window = window or log_window(analysis)
    if window is None or not analysis.hosts:
        return AgentsZone()
    lo, hi = window
    at = hi + _BEHIND + MARGIN
    reach = f"{round((at - (lo - _AHEAD - MARGIN)).total_seconds())}s"
    names = promql_string(f"(?i)({alternation(analysis.hosts)})([.].*)?")
    info = f"last_over_time({_NODE}{{hostname=~{names}}}[{reach}])"
    expr = (
        f'label_replace(last_over_time({_OFFSET}[{reach}]) and on (job, instance) {info}, '
        f'"ncclscope_metric", "offset", "", "")'
        f' or label_replace(max by (job, instance, hostname) ({info}), '
        f'"ncclscope_metric", "host", "", "")'
    )  # fmt: skip
    answer = client.instant(expr, at, what="zone")
    if not answer.answered:
        why = f"Prometheus {answer.ask.status} at zone ({answer.ask.message or 'no message'})"
        return AgentsZone(problems=[why])
    match = HostMatcher(list(analysis.hosts))
    host: dict[tuple[str, str], str] = {}
    offsets: dict[tuple[str, str], float] = {}
    for s in answer.series:
        key = (s.labels.get("job", ""), s.labels.get("instance", ""))
        if s.labels.get("ncclscope_metric") == "host":
            named = match(s.labels.get("hostname"))
            if named is not None:
                host[key] = named
        elif s.values:
            offsets[key] = s.values[-1]
    per_host = {host[k]: v for k, v in offsets.items() if k in host}
    # An agent exports a zone's offset (a quarter hour, UTC-12..+14); anything else is
    # no clock (a damaged or foreign series) and is said, not applied.
    odd = {
        h: v
        for h, v in per_host.items()
        if not -_BEHIND.total_seconds() <= v <= _AHEAD.total_seconds() or v % 900
    }
    problems = (
        [
            "an agent's learned clock is no zone's, left unused: "
            + ", ".join(f"{h} {v:g} s" for h, v in sorted(odd.items()))
        ]
        if odd
        else []
    )
    per_host = {h: v for h, v in per_host.items() if h not in odd}
    if not per_host:
        return AgentsZone(problems=problems)
    seen = Counter(per_host.values())
    if len(seen) > 1:
        said = ", ".join(f"{h} UTC{v / 3600:+g} h" for h, v in sorted(per_host.items()))
        return AgentsZone(
            problems=[
                *problems,
                "the agents learned different clocks for the logs' hosts (" + said + "): "
                "their times were read as the logs said them (--log-tz sets one zone)",
            ],
        )
    return AgentsZone(offset_s=next(iter(seen)), problems=problems)


def zone_from_agents(
    built: Built, client: PromClient, rebuild: Callable[[tzinfo], Built], *, stdin: bool = False
) -> tuple[Built, list[str]]:
    """``built`` read in the zone the agents on its hosts learned (:func:`agents_zone`),
    where no zone was given: ``rebuild(zone)`` reads the logs again where it is not the
    one they were read in (``log_zone_source`` ``telemetry``, as from ``--telemetry``);
    where it is, the zone assumed is said confirmed.  Logs read from standard input
    cannot be read again: a problem says which ``--log-tz`` to give.  Returns the build
    and the problems, in words."""
    a = built.analysis
    window = log_window(a)
    got = agents_zone(a, client, window)
    if got.offset_s is None or window is None:
        return built, got.problems
    learned = timezone(timedelta(seconds=got.offset_s))
    current = parse_zone(a.log_zone or "UTC").utcoffset(window[0].replace(tzinfo=None))
    if current == learned.utcoffset(None):
        if a.log_zone_source != "assumed":
            return built, got.problems
        return _with_zone_source(built, "telemetry"), got.problems
    if stdin:
        return built, [
            *got.problems,
            f"the agents on the logs' hosts learned that their clock is {zone_name(learned)}, "
            f"but the logs came on standard input and were read as {a.log_zone}: the window "
            f"read is off by as much (give --log-tz {zone_name(learned)})",
        ]
    return rebuild(learned), got.problems


def _with_zone_source(built: Built, source: str) -> Built:
    def said(a: Analysis) -> Analysis:
        return replace(a, log_zone_source=source)

    views = [(said(v), at) for v, at in built.views]
    return replace(built, analysis=said(built.analysis), views=views)


def read_for_job(analysis: Analysis, client: PromClient) -> ClusterTables:
    """What ``client``'s Prometheus holds for the logs' hosts over their window (±
    :data:`MARGIN`); nothing is asked when the logs have no times or no hosts, or a
    request before (:func:`agents_zone`) found Prometheus unreachable or too slow (a
    problem says so)."""
    window = log_window(analysis)
    if window is None:
        return ClusterTables(
            url=client.url,
            asks=client.asks,
            problems=["the logs have no times: no window to read Prometheus over, nothing read"],
        )
    start, end = window[0] - MARGIN, window[1] + MARGIN
    if any(a.status in STOPS for a in client.asks):
        return ClusterTables(url=client.url, start=start, end=end, asks=client.asks, problems=[
            "Prometheus did not answer the first request: nothing more was asked"])  # fmt: skip
    return read_cluster(client, list(analysis.hosts), start, end)


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
