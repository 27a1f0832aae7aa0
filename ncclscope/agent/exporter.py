"""The Prometheus side of the agent: a board of latest values and a collector over it.

Collectors (NVML, host, the job's logs) each replace their own rows on the
:class:`Board` after every run; the HTTP thread renders whatever the board holds at
scrape time, through one custom collector built from the catalog (client_python's
custom-collector pattern: no global registry, no per-series objects to expire).  A
series that stops being reported (a process that exited, a rank that left) disappears
with the collector's next rows.
"""

from __future__ import annotations

import importlib.metadata
import platform
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ncclscope import __version__
from ncclscope.agent.catalog import CATALOG, by_name

__all__ = [
    "DEFAULT_LISTEN",
    "Board",
    "CatalogCollector",
    "Rows",
    "identity_rows",
    "new_registry",
    "serve",
    "write_textfile",
]

#: One label-value tuple and a value, per series.
Rows = Sequence[tuple[tuple[str, ...], float]]

#: 127.0.0.1 only, on a port neither node_exporter (9100) nor dcgm-exporter (9400) uses.
DEFAULT_LISTEN = "127.0.0.1:9477"


class Board:
    """The latest rows per collector, per metric; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, dict[str, list[tuple[tuple[str, ...], float]]]] = {}
        self._known = by_name()

    def set(self, collector: str, rows: Mapping[str, Rows]) -> None:
        """Replace everything ``collector`` reported before with ``rows``."""
        checked: dict[str, list[tuple[tuple[str, ...], float]]] = {}
        for name, series in rows.items():
            metric = self._known.get(name)
            if metric is None:
                msg = f"{name} is not in the metric catalog"
                raise KeyError(msg)
            for labels, _value in series:
                if len(labels) != len(metric.labels):
                    msg = f"{name}: labels {labels} do not match {metric.labels}"
                    raise ValueError(msg)
            checked[name] = [(tuple(str(x) for x in labels), float(v)) for labels, v in series]
        with self._lock:
            self._rows[collector] = checked

    def snapshot(self) -> dict[str, list[tuple[tuple[str, ...], float]]]:
        """Every metric's rows, merged over collectors."""
        merged: dict[str, list[tuple[tuple[str, ...], float]]] = {}
        with self._lock:
            for rows in self._rows.values():
                for name, series in rows.items():
                    merged.setdefault(name, []).extend(series)
        return merged


class CatalogCollector(Collector):
    """Renders the board as metric families declared by the catalog."""

    def __init__(self, board: Board) -> None:
        self.board = board

    def collect(self) -> Iterator[Metric]:
        rows = self.board.snapshot()
        for m in CATALOG:
            series = rows.get(m.name)
            if not series:
                continue
            family: GaugeMetricFamily | CounterMetricFamily
            if m.kind == "counter":
                family = CounterMetricFamily(m.name, m.help, labels=list(m.labels))
            else:
                family = GaugeMetricFamily(m.name, m.help, labels=list(m.labels))
            for labels, value in series:
                family.add_metric(list(labels), value)
            yield family


def new_registry(board: Board) -> CollectorRegistry:
    """A registry of its own holding only the catalog collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CatalogCollector(board))
    return registry


def identity_rows(hostname: str | None = None) -> dict[str, Rows]:
    """``ncclscope_build_info`` and ``ncclscope_node_info``."""
    return {
        "ncclscope_build_info": [
            (
                (__version__, platform.python_version(), importlib.metadata.version("polars")),
                1.0,
            )
        ],
        "ncclscope_node_info": [((hostname or socket.gethostname(),), 1.0)],
    }


def serve(registry: CollectorRegistry, listen: str) -> tuple[str, int]:
    """Serve ``/metrics`` on ``listen`` (``ADDR:PORT``; port 0 picks a free one) in a
    daemon thread; returns the address and port bound."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    server, _thread = start_http_server(int(port), addr=host, registry=registry)
    bound = server.server_address
    return str(bound[0]), int(bound[1])


def write_textfile(registry: CollectorRegistry, path: Path) -> None:
    """Write the exposition for node_exporter's textfile collector, atomically (a
    temporary file renamed over ``path``)."""
    write_to_textfile(str(path), registry)
