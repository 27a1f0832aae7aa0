"""The Prometheus side of the agent: a board of latest values and a collector over it.

Collectors (NVML, host, the job's logs) each replace their own rows on the
:class:`Board` after every run; a scrape gets whatever the board holds, rendered once
per change of the board, in the text format one custom collector built from the catalog
would write (client_python's custom-collector pattern: no global registry, no per-series
objects to expire).  A series that stops being reported (a process that exited, a rank
that left) disappears with the collector's next rows.

:class:`MetricsServer` answers scrapes from a fixed pool of handler threads and a
bounded queue of accepted connections; past that it answers ``503`` at once, as
node_exporter does past ``--web.max-requests``, so a crowd of scrapers costs the agent a
bounded number of threads and never a queue of renders.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import platform
import queue
import socket
import socketserver
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import cast

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ncclscope import __version__
from ncclscope.catalog import CATALOG, by_name
from ncclscope.catalog import Metric as CatalogMetric

__all__ = [
    "DEFAULT_LISTEN",
    "Board",
    "CatalogCollector",
    "MetricsServer",
    "Rows",
    "identity_rows",
    "new_registry",
    "render",
    "serve",
    "write_textfile",
]

_log = logging.getLogger(__name__)

#: One label-value tuple and a value, per series.
Rows = Sequence[tuple[tuple[str, ...], float]]

#: 127.0.0.1 only, on a port neither node_exporter (9100) nor dcgm-exporter (9400) uses.
DEFAULT_LISTEN = "127.0.0.1:9477"


class Board:
    """The latest rows per collector, per metric; thread-safe.

    ``version`` grows with every :meth:`set`, so what is rendered from the board can be
    kept until the board changes (:func:`render`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, dict[str, list[tuple[tuple[str, ...], float]]]] = {}
        self._known = by_name()
        self._version = 0
        #: the last exposition and the version it was rendered at or after
        self._rendered: tuple[int, bytes] | None = None
        self._render_lock = threading.Lock()

    @property
    def version(self) -> int:
        """How many times :meth:`set` has been called."""
        return self._version

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
            self._version += 1

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


#: client_python's value formatting (Go's: ``1e+06``, ``+Inf``, ``NaN``), typed
_fmt = cast("Callable[[float], str]", floatToGoString)

#: The Prometheus text format's content type.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


@functools.cache
def _layout(metric: CatalogMetric) -> tuple[str, str]:
    """A family's HELP/TYPE lines and a template of its sample lines: the labels in name
    order (the order client_python writes them), each filled from its position in the
    catalog's order."""
    name = metric.name
    sample = name if metric.kind != "counter" or name.endswith("_total") else name + "_total"
    doc = metric.help.replace("\\", r"\\").replace("\n", r"\n")
    kind = "counter" if metric.kind == "counter" else "gauge"  # info metrics are gauges of 1
    head = f"# HELP {sample} {doc}\n# TYPE {sample} {kind}\n"
    order = sorted((label, i) for i, label in enumerate(metric.labels))
    pairs = ",".join(f'{label}="{{{i}}}"' for label, i in order)
    return head, f"{sample}{{{{{pairs}}}}} " if pairs else f"{sample} "


def _needs_escape(series: Sequence[tuple[tuple[str, ...], float]]) -> bool:
    return any('"' in v or "\\" in v or "\n" in v for labels, _ in series for v in labels)


def render(board: Board) -> bytes:
    """The board in the Prometheus text format (what ``generate_latest`` would write for
    :func:`new_registry`, at a fraction of the cost), rendered once per version of the
    board however many scrapes ask."""
    # The version is read before the rows, so a body is never older than its tag: a
    # set() in between costs one more render, never a stale answer.
    version = board.version
    done = board._rendered
    if done is not None and done[0] >= version:
        return done[1]
    with board._render_lock:  # scrapes that missed together wait for one render
        done = board._rendered
        if done is not None and done[0] >= version:
            return done[1]
        body = _exposition(board.snapshot())
        board._rendered = (version, body)
    return body


def _exposition(rows: Mapping[str, Sequence[tuple[tuple[str, ...], float]]]) -> bytes:
    """Rows (as :meth:`Board.snapshot` gives them) in the Prometheus text format."""
    out: list[str] = []
    for metric in CATALOG:
        series = rows.get(metric.name)
        if not series:
            continue
        head, template = _layout(metric)
        out.append(head)
        escape = _needs_escape(series)
        for labels, value in series:
            text = repr(value)
            if "n" in text or value >= 1e6:  # nan, inf, or where Go switches to exponents
                text = _fmt(value)
            filled = template.format(*map(_escape, labels)) if escape else template.format(*labels)
            out.append(f"{filled}{text}\n")
    return "".join(out).encode("utf-8")


class _Handler(BaseHTTPRequestHandler):
    board: Board  # set on the subclass made by MetricsServer
    # One request per connection (HTTP/1.0): Prometheus reconnects each scrape anyway,
    # and an idle keep-alive connection never pins a handler.
    protocol_version = "HTTP/1.0"
    # Headers and body go out as two writes: without this, Nagle's algorithm can hold
    # the body until the client's delayed ACK of the headers (tens of ms).
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        if self.path.split("?")[0] not in ("/metrics", "/"):
            self.send_error(404, "ncclscope serves /metrics")
            return
        body = render(self.board)
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Scrapes are not worth a line each."""


def _busy_response(handlers: int, waiting: int) -> bytes:
    body = (
        f"ncclscope: all {handlers} /metrics handlers are busy and {waiting} scrapes "
        "wait; try again later\n"
    ).encode()
    head = (
        "HTTP/1.0 503 Service Unavailable\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n"
        "Retry-After: 1\r\n\r\n"
    )
    return head.encode() + body


def _drain(sock: socket.socket) -> None:
    """Read what the client sent so far without blocking (a socket closed with unread
    data sends a reset, which can destroy the answer before the client reads it)."""
    for _ in range(16):  # a bound: a client streaming bytes does not hold the acceptor
        try:
            if not sock.recv(65536):
                return
        except OSError:  # nothing more yet (BlockingIOError), or the client is gone
            return


class MetricsServer(socketserver.TCPServer):
    """``/metrics`` over HTTP from ``handlers`` threads and a queue of ``waiting``
    accepted connections.

    One thread accepts and queues; each handler serves one request per connection under
    a ``timeout_s`` socket timeout, so a client that connects and sends nothing, or
    reads slowly, holds a handler that long at most.  With every handler busy and the
    queue full the accepting thread answers ``503`` itself, unrendered, and counts it in
    :attr:`rejected` (node_exporter's ``--web.max-requests``, default 40, does the
    same).  ``backlog`` is the listen backlog of connections not yet accepted.
    """

    allow_reuse_address = True  # as HTTPServer: a restarted agent rebinds its port

    def __init__(
        self,
        board: Board,
        listen: str,
        *,
        handlers: int = 4,
        waiting: int = 32,
        backlog: int = socket.SOMAXCONN,
        timeout_s: float = 5.0,
    ) -> None:
        if handlers < 1 or waiting < 1:
            msg = f"need handlers >= 1 and waiting >= 1, not {handlers} and {waiting}"
            raise ValueError(msg)
        host, _, port = listen.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.request_queue_size = backlog
        super().__init__(
            (host, int(port)),
            type("Handler", (_Handler,), {"board": board, "timeout": timeout_s}),
        )
        self.handlers = handlers
        #: scrapes answered 503 since the start
        self.rejected = 0
        self._waiting: queue.Queue[tuple[socket.socket, object] | None] = queue.Queue(waiting)
        self._busy = _busy_response(handlers, waiting)
        self._threads: list[threading.Thread] = []

    @property
    def address(self) -> tuple[str, int]:
        """The address and port bound."""
        bound = self.server_address
        return str(bound[0]), int(bound[1])

    def start(self) -> None:
        """Accept and serve in daemon threads (a scrape in flight never holds the
        agent's exit)."""
        for k in range(self.handlers):
            self._threads.append(
                threading.Thread(target=self._work, name=f"ncclscope-http-{k}", daemon=True)
            )
        self._threads.append(
            threading.Thread(target=self.serve_forever, name="ncclscope-http", daemon=True)
        )
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        """Stop accepting, let the handlers finish their requests, close every socket."""
        if self._threads:
            self.shutdown()  # returns once the accepting loop has stopped
            for _ in range(self.handlers):
                self._waiting.put(None)  # after the queued connections: they are served
            for thread in self._threads:
                thread.join()
            self._threads = []
        self.server_close()

    def rows(self) -> dict[str, Rows]:
        """The server's own metrics, for the board."""
        return {"ncclscope_http_requests_rejected_total": [((), float(self.rejected))]}

    # -- socketserver hooks ---------------------------------------------------------------

    # A TCP server's requests are sockets (the base class also allows UDP's tuples).
    def process_request(  # type: ignore[override]
        self, request: socket.socket, client_address: object
    ) -> None:
        """Queue the connection for a handler, or answer 503 when there is no room."""
        try:
            self._waiting.put_nowait((request, client_address))
        except queue.Full:
            self._reject(request)

    def handle_error(self, request: object, client_address: object) -> None:
        """Log, where socketserver would print a traceback."""
        _log.debug("/metrics: error from %s", client_address, exc_info=True)

    # -- internals ----------------------------------------------------------------------

    def _reject(self, request: socket.socket) -> None:
        self.rejected += 1
        try:
            request.setblocking(False)
            _drain(request)
            request.send(self._busy)  # a few hundred bytes: an empty socket buffer takes all
            request.shutdown(socket.SHUT_WR)
        except OSError:  # the client is gone already
            pass
        finally:
            request.close()

    def _work(self) -> None:
        while True:
            item = self._waiting.get()
            if item is None:
                return
            request, client_address = item
            try:
                self.finish_request(request, client_address)
            except OSError:  # the client went away, or stalled past timeout_s
                pass
            # A handler thread lives as long as the server: a bug met by one request
            # must not shrink the pool.
            except Exception:  # noqa: BLE001
                _log.exception("/metrics: the request from %s failed", client_address)
            finally:
                self.shutdown_request(request)


def serve(
    board: Board,
    listen: str,
    *,
    handlers: int = 4,
    waiting: int = 32,
    backlog: int = socket.SOMAXCONN,
    timeout_s: float = 5.0,
) -> tuple[str, int]:
    """Serve ``/metrics`` on ``listen`` (``ADDR:PORT``; port 0 picks a free one) from
    a :class:`MetricsServer` in daemon threads; returns the address and port bound."""
    server = MetricsServer(
        board, listen, handlers=handlers, waiting=waiting, backlog=backlog, timeout_s=timeout_s
    )
    server.start()
    return server.address


def write_textfile(board: Board, path: Path) -> None:
    """Write the exposition for node_exporter's textfile collector, atomically (a
    temporary file renamed over ``path``)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(render(board))
    os.replace(tmp, path)  # node_exporter never reads half a file
