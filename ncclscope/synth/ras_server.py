"""A stand-in for NCCL's RAS client socket, for tests and benchmarks.

It speaks the server side of the RAS client protocol (see
:mod:`ncclscope.evidence.ras` for the protocol and where it was read) and answers
``STATUS`` with a report of one job written from :class:`RasJob`'s parameters, in the
layout of the NCCL release it pretends to be, from the format strings of
``src/ras/client_support.cc`` at that release:

============  =========================================================================
NCCL          what it prints
============  =========================================================================
2.24, 2.25    text; one operation count per communicator ("different collective
              operation counts"); a communicator's missing ranks as numbers only
              ("The missing ranks: 6,7"); the collection time as ``(%.2fs)``
2.26 - 2.28.3 text; per-op counts ("different AllGather operation counts"); each missing
              rank on its own ``Rank N -- GPU ...`` line
2.28.7+       the same text with ``(%.3fs)``; JSON on ``SET FORMAT json``
2.28.7-2.28.9 JSON without the comma after a missing rank's ``nvml_dev``
2.29.2+       JSON with it
============  =========================================================================

Sample (``RasJob(nodes=("10.0.0.1", "10.0.0.2"), ranks_per_node=2, dead=(3,),
mismatched={1: 639})``, NCCL 2.26.2, text, trimmed)::

    NCCL version 2.26.2 compiled with CUDA 12.6
    CUDA runtime version 12060, driver version 12060

    Job summary
    ===========

      Nodes  Processes         GPUs  Processes     GPUs
    (total)   per node  per process    (total)  (total)
          2          2            1          4        4

    Communicators... (0.00s)
    =============

    Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
        #  in group  per comm  per node  per comm  in group
        0         1         2       1-2         4         3   RUNNING  INCOMPLETE,MISMATCH

    Errors
    ======

    DEAD
      1 job process is considered dead (unreachable via the RAS network)
      Process 4003 on node 10.0.0.2 managing GPU 1
    ...
    #0-0 (7a3e5c0f1b2d4968) MISMATCH
      Communicator ranks have different AllReduce operation counts
      2 ranks have launched up to operation 640
      Rank 1 has launched up to operation 639 -- GPU 1 managed by process 4001 on node 10.0.0.1

The job is one communicator over every rank, one GPU per process, process ``base_pid +
rank``, GPU ``rank % ranks_per_node``.  Misbehaviour (``mode``): ``silent`` accepts and
never says a word; ``stall`` completes the handshake and never sends the report;
``drip`` sends the report one byte every ``drip_s``; ``truncate`` closes the connection
half-way through the report; ``garbage`` speaks the protocol and then sends something
that is not a report; ``noise`` answers the handshake with bytes that are not the protocol
(another service on the port).  An old server is simply an old ``nccl_version`` (before
2.28.7 it answers ``SET FORMAT`` with ``ERROR: Unknown command``).

Example::

    with RasServer(RasJob(dead=(5,)), nccl_version="2.28.9") as ras:
        ask = ask_ras(folder, addr=ras.addr)
"""

from __future__ import annotations

import socket
import socketserver
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Literal, Self

__all__ = [
    "PROTOCOL",
    "Mode",
    "RasJob",
    "RasServer",
    "free_port",
    "has_json",
    "ras_json_report",
    "ras_text_report",
]

Mode = Literal["ok", "silent", "stall", "drip", "truncate", "garbage", "noise"]

#: ``NCCL_RAS_CLIENT_PROTOCOL`` in ``src/ras/ras_internal.h``: 2 from 2.24.3 to 2.29.7.
PROTOCOL = 2
#: ``ncclFuncStr`` (``src/init.cc``): the order of ``collective_counts`` and of the text's
#: per-op blocks.
_FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
#: ``RAS_CLIENT_DETAIL_THRESHOLD`` and the outlier fractions in client_support.cc.
_DETAIL, _FRACTION, _VERBOSE_FRACTION = 10, 0.25, 0.5
#: Bytes sent instead of ``SERVER PROTOCOL 2`` in ``noise`` mode (what an HTTP server
#: says to a stray line).
_NOISE = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n\x00\xff\xfe"
#: The "report" of ``garbage`` mode: JSON, but no RAS report.
_GARBAGE = b'{"detail": "Not Found"}\n'


@dataclass(frozen=True)
class RasJob:
    """The job a stand-in RAS reports on: one communicator over every rank."""

    nodes: tuple[str, ...] = ("10.0.0.1", "10.0.0.2")
    ranks_per_node: int = 4
    #: ranks whose processes RAS considers dead
    dead: tuple[int, ...] = ()
    #: ranks whose processes are alive in RAS but did not answer the query
    missing: tuple[int, ...] = ()
    #: rank -> the count of ``op`` it has launched (every other rank: ``op_count``)
    mismatched: Mapping[int, int] = field(default_factory=dict)
    op: str = "AllReduce"
    op_count: int = 640
    cuda_compiled: str = "12.6"
    cuda_runtime: int = 12060
    cuda_driver: int = 12060
    comm_hash: int = 0x7A3E5C0F1B2D4968
    base_pid: int = 4000
    timeouts: int = 0
    collect_s: float = 0.0

    @property
    def nranks(self) -> int:
        return len(self.nodes) * self.ranks_per_node

    def host(self, rank: int) -> str:
        return self.nodes[rank // self.ranks_per_node]

    def pid(self, rank: int) -> int:
        return self.base_pid + rank

    def gpu(self, rank: int) -> int:
        return rank % self.ranks_per_node

    def answering(self) -> list[int]:
        """The ranks whose data reached the queried process."""
        gone = set(self.dead) | set(self.missing)
        return [r for r in range(self.nranks) if r not in gone]

    def counts(self, rank: int) -> dict[str, int]:
        """A rank's launched operations per collective (2.26+); only ``op`` differs."""
        base = {f: 0 for f in _FUNCS} | {"AllGather": 2, "Broadcast": 1}
        return base | {self.op: self.mismatched.get(rank, self.op_count)}


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")[:3] if x.isdigit())


def has_json(nccl_version: str) -> bool:
    """Whether a RAS of this release knows ``SET FORMAT json`` (2.28.7+)."""
    return _version(nccl_version) >= (2, 28, 7)


def _outlier(count: int, verbose: bool, total: int = -1) -> bool:
    """``rasCountIsOutlier``: whether RAS names each member of a group of ``count``."""
    if count == 1:
        return True
    if verbose:
        return count < total * _VERBOSE_FRACTION if total != -1 else True
    return count <= _DETAIL and (total == -1 or count <= total * _FRACTION)


def _s(n: int, many: str = "s", one: str = "") -> str:
    return many if n > 1 else one


def ras_text_report(job: RasJob, nccl_version: str = "2.26.2", *, verbose: bool = True) -> str:
    """The text report of ``job`` as ``(VERBOSE) STATUS`` of that release prints it."""
    v = _version(nccl_version)
    per_op = v >= (2, 26)
    out = [
        f"NCCL version {nccl_version} compiled with CUDA {job.cuda_compiled}\n",
        f"CUDA runtime version {job.cuda_runtime}, driver version {job.cuda_driver}\n\n",
        "Job summary\n===========\n\n",
        "  Nodes  Processes         GPUs  Processes     GPUs\n"
        "(total)   per node  per process    (total)  (total)\n",
        f"{len(job.nodes):7d}  {job.ranks_per_node:9d}  {1:11d}  {job.nranks:9d}  "
        f"{job.nranks:7d}\n",
        "\nCommunicators...",
        f" ({job.collect_s:.3f}s)\n" if v >= (2, 28, 7) else f" ({job.collect_s:.2f}s)\n",
        "=============\n\n",
    ]
    answering = job.answering()
    # 2.24/2.25 keep one count of every collective a communicator launched; 2.26+ one per op.
    ops = {r: job.counts(r)[job.op] if per_op else sum(job.counts(r).values()) for r in answering}
    n_missing_procs = len(job.missing)
    errors = []
    if len(answering) < job.nranks:  # "INCOMPLETE" since peers are known dead or missing
        errors.append("INCOMPLETE")
    if len(set(ops.values())) > 1:
        errors.append("MISMATCH")
    per_node = Counter(job.host(r) for r in answering)
    lo, hi = min(per_node.values(), default=0), max(per_node.values(), default=0)
    out.append(
        "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n"
        "    #  in group  per comm  per node  per comm  in group\n"
    )
    out.append(
        f"{0:5d}  {1:8d}  {len(per_node):8d}  {str(lo) if lo == hi else f'{lo}-{hi}':>8}  "
        f"{job.nranks:8d}  {len(answering):8d}  {'RUNNING':>8}  {','.join(errors) or 'OK':>6}\n"
    )
    out.append("\nErrors\n======\n\n")
    if n_missing_procs:
        out.append(
            "INCOMPLETE\n  Missing communicator data from "
            f"{n_missing_procs} job process{_s(n_missing_procs, 'es')}\n"
        )
        if _outlier(n_missing_procs, verbose):
            out += [_process_line(job, r) for r in sorted(job.missing, key=_by(job))]
        out.append("\n")
    if job.dead:
        n = len(job.dead)
        out.append(
            f"DEAD\n  {n} job process{_s(n, 'es are', ' is')} considered dead "
            "(unreachable via the RAS network)\n"
        )
        if _outlier(n, verbose):
            out += [_process_line(job, r) for r in sorted(job.dead, key=_by(job))]
        out.append("\n")
    head = f"#0-0 ({job.comm_hash:016x})"
    gone = sorted(set(job.dead) | set(job.missing))
    if gone:
        out.append(f"{head} INCOMPLETE\n  Missing communicator data from {len(gone)} "
                   f"rank{_s(len(gone))}\n")  # fmt: skip
        if _outlier(len(gone), verbose):
            if per_op:
                out += [f"  Rank {r} -- {_where(job, r)}\n" for r in gone]
            else:
                out.append(f"  The missing rank{_s(len(gone))}: {','.join(map(str, gone))}\n")
        out.append("\n")
    out.append("Warnings\n========\n\n")
    if job.timeouts:
        out.append(
            f"TIMEOUT\n  Encountered {job.timeouts} communication timeout{_s(job.timeouts)} "
            "while gathering communicator data\n\n"
        )
    if "MISMATCH" in errors:
        out.append(f"{head} MISMATCH\n")
        what = job.op if per_op else "collective"
        out.append(f"  Communicator ranks have different {what} operation counts\n")
        groups = Counter(ops.values())
        # Most frequent count first, as rasValCountsCompareRev sorts them.
        for value, count in sorted(groups.items(), key=lambda kv: (-kv[1], kv[0])):
            launched = (
                f"launched up to operation {value}" if value > 0 or not per_op
                else "not launched any operations"
            )  # fmt: skip
            if count > 1:
                out.append(f"  {count} ranks have {launched}\n")
            if _outlier(count, verbose, job.nranks):
                for r in sorted(r for r, n in ops.items() if n == value):
                    said = "" if count > 1 else f" has {launched}"
                    out.append(f"  Rank {r}{said} -- {_where(job, r)}\n")
        out.append("\n")
    return "".join(out)


def _by(job: RasJob) -> Callable[[int], tuple[str, int]]:
    # client_support.cc sorts the process lists by host, then pid.
    return lambda r: (job.host(r), job.pid(r))


def _where(job: RasJob, rank: int) -> str:
    return f"GPU {job.gpu(rank)} managed by process {job.pid(rank)} on node {job.host(rank)}"


def _process_line(job: RasJob, rank: int) -> str:
    return f"  Process {job.pid(rank)} on node {job.host(rank)} managing GPU {job.gpu(rank)}\n"


def ras_json_report(
    job: RasJob, nccl_version: str = "2.28.9", *, now: datetime | None = None
) -> str:
    """The ``SET FORMAT json`` report of ``job`` as that release writes it, byte for byte
    (``rasDumpCommsToJSON``), with 2.28.7-2.28.9's missing comma where it belongs."""
    comma = "" if _version(nccl_version) < (2, 29, 2) else ","
    stamp = (now or datetime.now()).strftime("%Y-%m-%d %H:%M:%S")  # "%F %T", local time
    answering = job.answering()
    gone = sorted(set(job.dead) | set(job.missing))
    out = [
        "{\n",
        f'  "nccl_version": "{nccl_version}",\n',
        f'  "cuda_runtime_version": {job.cuda_runtime},\n',
        f'  "cuda_driver_version": {job.cuda_driver},\n',
        f'  "timestamp": "{stamp}",\n',
        '  "communicators_count": 1,\n',
        '  "communicators": [\n',
        "    {\n",
        f'      "hash": "0x{job.comm_hash:x}",\n',
        f'      "secondary_hash": "0x{job.comm_hash ^ 0x5A5A:x}:0x{job.base_pid:x}",\n',
        f'      "size": {job.nranks},\n',
        f'      "ranks_count": {len(answering)},\n',
        f'      "missing_ranks_count": {len(gone)},\n',
        '      "ranks": [\n',
    ]
    ranks = []
    for r in answering:
        counts = ",\n".join(f'            "{f}": {n}' for f, n in job.counts(r).items())
        ranks.append(
            "        {\n"
            f'          "rank": {r},\n'
            f'          "host": "{job.host(r)}",\n'
            f'          "pid": {job.pid(r)},\n'
            f'          "cuda_dev": {job.gpu(r)},\n'
            f'          "nvml_dev": {job.gpu(r)},\n'
            '          "status": {\n'
            '            "init_state": 0,\n'
            '            "async_error": 0,\n'
            '            "finalize_called": false,\n'
            '            "destroy_flag": false,\n'
            '            "abort_flag": false\n'
            "          },\n"
            '          "collective_counts": {\n'
            f"{counts}\n"
            "          }\n"
            "        }"
        )
    out.append(",\n".join(ranks))
    out.append('\n      ],\n      "missing_ranks": [\n')
    missing = [
        "        {\n"
        f'          "rank": {r},\n'
        f'          "host": "{job.host(r)}",\n'
        f'          "pid": {job.pid(r)},\n'
        f'          "cuda_dev": {job.gpu(r)},\n'
        f'          "nvml_dev": {job.gpu(r)}{comma}\n'
        '          "status": {\n'
        '            "unresponsive": true,\n'
        f'            "considered_dead": {"true" if r in job.dead else "false"}\n'
        "          }\n"
        "        }"
        for r in gone
    ]
    out.append(",\n".join(missing))
    out.append("\n      ]\n    }")
    out.append(
        "\n  ],\n"
        '  "ras": {\n'
        f'    "collection_time_sec": {job.collect_s:.3f},\n'
        f'    "timeouts_count": {job.timeouts}\n'
        "  }\n"
        "}\n"
    )
    return "".join(out)


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        srv = self.server.owner
        if srv.mode == "silent":
            srv.stop.wait()
            return
        fmt = "text"
        while not srv.stop.is_set():
            raw = self.rfile.readline(4096)
            if not raw:
                return
            cmd = raw.decode("ascii", "replace").rstrip("\r\n")
            srv.commands.append(cmd)
            low = cmd.lower()
            if low.startswith("client protocol "):
                if srv.mode == "noise":
                    self.wfile.write(_NOISE)
                    return
                self.wfile.write(f"SERVER PROTOCOL {srv.protocol}\n".encode())
            elif low.startswith("timeout "):
                arg = cmd[len("timeout ") :]
                timeout_ok = arg.isdigit()
                self.wfile.write(
                    b"OK\n" if timeout_ok else f"ERROR: Invalid timeout value {arg}\n".encode()
                )
            elif low.startswith("set format ") and has_json(srv.nccl_version):
                arg = cmd[len("set format ") :].lower()
                if arg in ("text", "json"):
                    fmt = arg
                    self.wfile.write(b"OK\n")
                else:
                    self.wfile.write(
                        f"ERROR: Invalid format {cmd[len('set format ') :]}\n".encode()
                    )
            elif low in ("status", "verbose status"):
                self._report(fmt, verbose=low.startswith("verbose"))
                return  # RAS closes the connection once the report is sent
            else:
                self.wfile.write(f"ERROR: Unknown command {cmd}\n".encode())

    def _report(self, fmt: str, *, verbose: bool) -> None:
        srv = self.server.owner
        job = srv.job
        if srv.mode == "stall":
            srv.stop.wait()
            return
        if srv.mode == "garbage":
            self.wfile.write(_GARBAGE)
            return
        if fmt == "json":
            pieces = [ras_json_report(job, srv.nccl_version)]
        else:
            # The header and job summary go out before the communicator query starts; the
            # rest when it ends (rasClientRunInit, then rasClientRunComms).
            text = ras_text_report(job, srv.nccl_version, verbose=verbose)
            cut = text.index("\nCommunicators...") + len("\nCommunicators...")
            pieces = [text[:cut], text[cut:]]
        data = [p.encode() for p in pieces]
        if srv.mode == "truncate":
            whole = b"".join(data)
            self.wfile.write(whole[: len(whole) // 2])
            return
        for k, chunk in enumerate(data):
            if k and srv.stop.wait(job.collect_s):
                return
            if srv.mode == "drip":
                for b in chunk:
                    self.wfile.write(bytes([b]))
                    if srv.stop.wait(srv.drip_s):
                        return
            else:
                self.wfile.write(chunk)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False

    def __init__(self, owner: RasServer) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)


class RasServer:
    """A stand-in RAS listening on 127.0.0.1 on a free port, as a context manager."""

    def __init__(
        self,
        job: RasJob | None = None,
        *,
        nccl_version: str = "2.28.9",
        mode: Mode = "ok",
        protocol: int = PROTOCOL,
        drip_s: float = 0.5,
    ) -> None:
        self.job = job or RasJob()
        self.nccl_version = nccl_version
        self.mode = mode
        self.protocol = protocol
        self.drip_s = drip_s
        #: every command line received, in order (list.append is atomic across threads)
        self.commands: list[str] = []
        self.stop = threading.Event()
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def addr(self) -> str:
        port = self._server.server_address[1]
        return f"127.0.0.1:{port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop.set()  # releases silent, stalled and dripping handlers
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (just closed; good enough for a test
    of a refused connection)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
