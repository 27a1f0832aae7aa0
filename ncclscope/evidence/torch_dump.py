"""Ask a running PyTorch process for its Flight Recorder dump and its Python stacks.

PyTorch offers a running job two ways to be asked, besides the dump it writes itself on
a timeout.  What each release line has (read in PyTorch's source: ``control_plane.py``,
``control_plane/WorkerServer.cpp``, ``Handlers.cpp``, ``PythonHandlers.cpp``,
``ProcessGroupNCCL.cpp``, ``FlightRecorder*.cpp``; 2.13 checked by running it, CPU
build, gloo; a release named "about" is where the history read places the change, not
checked by running that release)::

    2.2   Flight Recorder in ProcessGroupNCCL only (TORCH_NCCL_TRACE_BUFFER_SIZE, off by
          default), dumped on a timeout (TORCH_NCCL_DUMP_ON_TIMEOUT) as a pickle to
          TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>, default /tmp/nccl_trace_rank_<rank>,
          dump version 1.x.  No control plane, no pipe.
    2.3   + the debug-info pipe: with TORCH_NCCL_DEBUG_INFO_PIPE_FILE and a trace buffer,
          ProcessGroupNCCL's heartbeat monitor (the first process group of the process)
          mkfifo()s <prefix><global rank>.pipe, opens it O_RDONLY|O_NONBLOCK and reads it
          every wake-up; any byte written triggers the same dump as a timeout.  The
          monitor wakes every second with TORCH_NCCL_DUMP_ON_TIMEOUT=1, else only every
          heartbeat timeout (minutes).  The writer opens the file with ofstream and
          writes it in place (no rename): a dump is whole when its size stays put and it
          reads.
    2.4   + the control plane: c10d::control_plane::WorkerServer, cpp-httplib serving
          HTTP/1.1 on a Unix socket (or TCP), GET /handler/ lists handler names as a JSON
          list, POST /handler/<name> runs one (404 unknown, 500 "Handler X failed: ...").
          ProcessGroupNCCL registers dump_nccl_trace_pickle (query includecollectives,
          includestacktraces, onlyactive = true|false; any other parameter is a 400).
          torch.distributed.elastic.control_plane.worker_main() starts the server on
          TORCH_WORKER_SERVER_SOCKET when that is set; nothing else does: torchrun
          neither sets the variable nor calls worker_main, the training script must.
          The server refuses a path that exists, so the variable must differ per
          process: one value for all of torchrun's local workers fails every
          worker_main after the first.
    2.5   + dump_nccl_trace_json (includecollectives, onlyactive); dumps version 2.x.
    2.6   about: + dump_traceback (PythonHandlers.cpp: faulthandler.dump_traceback of
          all threads, under the GIL, as text/plain) and Python-registered handlers.
    2.7   about: the heartbeat monitor becomes a class of its own, the pipe named by the
          global rank; TORCH_FR_BUFFER_SIZE / TORCH_FR_DUMP_TEMP_FILE become the names,
          the TORCH_NCCL_ ones still read; default dump file under ~/.cache/torch.
    2.8+  about: the Flight Recorder is generic (FlightRecorder.hpp, a template over the
          event type); ProcessGroupGloo records into its own recorder; control-plane
          handler fr_trace_json dumps that one (dump_fr_trace_json).  Newer still: the
          default dump prefix is ${XDG_CACHE_HOME:-~/.cache}/torch/comm_lib_trace_rank_,
          TORCH_FR_DUMP_DYNAMIC_FILE_NAME takes the whole name from the variable.
    2.13  run here (CPU build, gloo): GET /handler/ lists dump_traceback, pyspy_dump,
          wait_counter_values, fr_trace_json, ping (+ torch_profile once
          torch.distributed.debug is imported); no NCCL handlers (no NCCL in the build).
          fr_trace_json holds the gloo collectives ("gloo:all_reduce", version "2.10").
          ProcessGroupGloo makes no pipe and writes no dump on a timeout: for gloo the
          control plane is the only way.  torch.distributed.debug.start_debug_server()
          starts a TCP worker server on every rank (its address in the TCPStore), not
          read here.

How this module asks (each bounded by ``timeout_s``, never raising for what the peer
does; the outcome names what happened, see :mod:`ncclscope.evidence.manifest`):

- Flight Recorder: the control plane first (GET /handler/, then the first of
  dump_nccl_trace_pickle, dump_nccl_trace_json, fr_trace_json it lists; one with no
  entries gives way to the next), else the debug-info pipe (a byte written, then the
  dump file watched).  The answer is read with ncclscope's own dump reader before it is
  kept as ``dumps/rank<R>.pickle`` or ``.json``.
- Python stacks: the control plane's dump_traceback, kept as ``stacks/rank<R>.txt``.

A sample (rank 1 of ``benchmarks/torch_hang_job.py --fault python`` on 2.13)::

    >>> procs, unreadable = find_torch_processes(match="torch_hang_job")  # doctest: +SKIP
    >>> request_dump(folder, procs[1]).to_json()  # doctest: +SKIP
    {'what': 'flight_dump', 'target': 'rank 1 (pid 30223)',
     'via': 'control_plane /handler/fr_trace_json', 'outcome': 'answered', 'why': '',
     'file': 'dumps/rank1.json', 'elapsed_s': 0.004, 'pid': 30223, 'rank': 1,
     'size_bytes': 1631}
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from ncclscope.evidence.manifest import Ask, Outcome, What
from ncclscope.parsers.torch.flight import (
    DUMP_FORMATS,
    SNIFF_BYTES,
    DumpRefusedError,
    load_dump,
    sniff_dump,
)

__all__ = [
    "DUMP_HANDLERS",
    "STACK_HANDLER",
    "TorchProcess",
    "describe_process",
    "find_torch_processes",
    "request_dump",
    "request_py_stack",
]

#: Control-plane handlers that answer with a Flight Recorder dump, in the order asked:
#: the NCCL recorder (pickle, then JSON), then the generic one gloo records into.
DUMP_HANDLERS = ("dump_nccl_trace_pickle", "dump_nccl_trace_json", "fr_trace_json")
#: The control-plane handler that answers with faulthandler's text of every thread.
STACK_HANDLER = "dump_traceback"
#: The environment this module reads from a process (the first of a pair wins).
_ENV_NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "TORCH_WORKER_SERVER_SOCKET",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "XDG_CACHE_HOME",
    "HOME",
)
#: The most of one answer kept: a 2,000-entry dump with stacks is a few MB; an answer
#: past this is cut and reported truncated rather than filling the agent's memory.
MAX_ANSWER_BYTES = 256 << 20
#: How often the dump file is looked at while waiting for the pipe's answer.
_POLL_S = 0.05
#: How long a dump file's size must stay put before it is read (the writer writes in
#: place, in one or several write calls).
_SETTLE_S = 0.2


@dataclass(frozen=True)
class TorchProcess:
    """One PyTorch training process of this node, as its environment describes it.

    Attributes:
        pid: its process id.
        rank / local_rank / world_size: from RANK, LOCAL_RANK, WORLD_SIZE (None where
            missing or not a number).
        host: the node's name, for the manifest.
        socket_path: its control-plane worker server: TORCH_WORKER_SERVER_SOCKET, or a
            Unix socket the process listens on (a script may set the variable only
            after it started, which /proc does not show).
        pipe_path: ``<TORCH_NCCL_DEBUG_INFO_PIPE_FILE><rank>.pipe`` where both are known.
        dump_prefix: TORCH_FR_DUMP_TEMP_FILE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE where set.
        dump_paths: the files a dump asked through the pipe may land in: the prefix plus
            the rank, or each release's default when no prefix is set.
        env: the names of :data:`_ENV_NAMES` found in its environment.
        environ: its NCCL_*, TORCH_* and launcher variables (RANK, MASTER_ADDR, ...),
            for other askers (NCCL_RAS_ADDR); not the whole environment, which may
            hold secrets.
    """

    pid: int
    rank: int | None
    local_rank: int | None
    world_size: int | None
    host: str
    socket_path: str | None = None
    pipe_path: str | None = None
    dump_prefix: str | None = None
    dump_paths: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    environ: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def target(self) -> str:
        """``rank 5 (pid 4321)``: whom, in the manifest's words."""
        who = "rank ?" if self.rank is None else f"rank {self.rank}"
        return f"{who} (pid {self.pid})"

    @property
    def stem(self) -> str:
        """``rank5`` (``pid4321`` for a process without a rank): its files' name."""
        return f"pid{self.pid}" if self.rank is None else f"rank{self.rank}"


def _int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _dump_paths(env: dict[str, str], rank: int | None) -> tuple[str | None, tuple[str, ...]]:
    """The prefix set (if any) and the files a triggered dump may be written to."""
    prefix = env.get("TORCH_FR_DUMP_TEMP_FILE") or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if rank is None:
        return prefix, ()
    if prefix:
        return prefix, (f"{prefix}{rank}",)
    # The defaults, newest release first (see the module's table).
    cache = env.get("XDG_CACHE_HOME") or f"{env.get('HOME', '/tmp')}/.cache"
    return None, (
        f"{cache}/torch/comm_lib_trace_rank_{rank}",
        f"{env.get('HOME', '/tmp')}/.cache/torch/nccl_trace_rank_{rank}",
        f"/tmp/nccl_trace_rank_{rank}",
    )


def describe_process(pid: int, env: dict[str, str], host: str) -> TorchProcess:
    """A :class:`TorchProcess` from a process's environment (a pure function).

    >>> p = describe_process(7, {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8",
    ...     "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/runs/42/flight/debug_pipe_rank_",
    ...     "TORCH_FR_DUMP_TEMP_FILE": "/runs/42/flight/nccl_trace_rank_"}, "node-1")
    >>> p.target, p.pipe_path
    ('rank 3 (pid 7)', '/runs/42/flight/debug_pipe_rank_3.pipe')
    >>> p.dump_paths
    ('/runs/42/flight/nccl_trace_rank_3',)
    """
    rank = _int(env.get("RANK"))
    pipe = env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    prefix, paths = _dump_paths(env, rank)
    return TorchProcess(
        pid=pid,
        rank=rank,
        local_rank=_int(env.get("LOCAL_RANK")),
        world_size=_int(env.get("WORLD_SIZE")),
        host=host,
        socket_path=env.get("TORCH_WORKER_SERVER_SOCKET") or None,
        pipe_path=f"{pipe}{rank}.pipe" if pipe and rank is not None else None,
        dump_prefix=prefix,
        dump_paths=paths,
        env=tuple(n for n in _ENV_NAMES if n in env),
        environ={k: v for k, v in env.items() if _kept(k)},
    )


#: Launcher variables kept in :attr:`TorchProcess.environ` besides NCCL_* and TORCH_*.
_LAUNCHER = frozenset(
    (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "HOME",
        "XDG_CACHE_HOME",
        "CUDA_VISIBLE_DEVICES",
    )
)


def _kept(name: str) -> bool:
    return name.startswith(("NCCL_", "TORCH_")) or name in _LAUNCHER


def _is_python(cmdline: list[str]) -> bool:
    return bool(cmdline) and "python" in os.path.basename(cmdline[0]).lower()


def _listening_unix_sockets(pid: int, proc_root: Path) -> list[str]:
    """The paths of the Unix stream sockets ``pid`` listens on (``/proc/net/unix``)."""
    inodes: set[str] = set()
    try:
        for fd in (proc_root / str(pid) / "fd").iterdir():
            with_target = os.readlink(fd)
            if with_target.startswith("socket:["):
                inodes.add(with_target[8:-1])
    except OSError:
        return []
    if not inodes:
        return []
    found: list[str] = []
    try:
        lines = (proc_root / "net" / "unix").read_text(errors="replace").splitlines()[1:]
    except OSError:
        return []
    for line in lines:
        # Num RefCount Protocol Flags Type St Inode Path; flags 00010000 = listening
        f = line.split(None, 7)
        if len(f) == 8 and f[6] in inodes and f[3] == "00010000" and f[4] == "0001":
            if not f[7].startswith("@"):  # an abstract name has no path to connect to
                found.append(f[7])
    return found


def find_torch_processes(
    *,
    match: str | None = None,
    host: str | None = None,
    proc_root: Path = Path("/proc"),
) -> tuple[list[TorchProcess], int]:
    """The node's PyTorch training processes: Python processes whose environment holds
    RANK or LOCAL_RANK, ordered by rank; and how many Python processes' environments
    could not be read (another user's, without the right to read them).

    ``match`` keeps those whose command line contains it.  A process whose ancestor is
    taken for the same rank (a DataLoader worker forked from it, a compile worker it
    spawned with its environment) is left out: asking it would ask no one, or the same
    rank twice.

    >>> procs, unreadable = find_torch_processes(match="train.py")  # doctest: +SKIP
    >>> [(p.rank, p.pid, p.socket_path) for p in procs]  # doctest: +SKIP
    [(0, 4101, '/run/ws/rank0.sock'), (1, 4102, '/run/ws/rank1.sock')]
    """
    host = host or socket.gethostname()
    me = os.getpid()
    found: dict[int, TorchProcess] = {}
    parents: dict[int, list[int]] = {}
    unreadable = 0
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.pid == me or not _is_python(cmdline):
            continue
        if match is not None and match not in " ".join(cmdline):
            continue
        try:
            env = proc.environ()
            ancestors = [p.pid for p in proc.parents()]
        except psutil.AccessDenied:
            unreadable += 1
            continue
        except psutil.Error:  # gone since it was listed
            continue
        if "RANK" not in env and "LOCAL_RANK" not in env:
            continue
        tp = describe_process(proc.pid, env, host)
        if tp.socket_path is None:
            listening = _listening_unix_sockets(proc.pid, proc_root)
            if listening:
                tp = replace(tp, socket_path=listening[0])
        found[proc.pid] = tp
        parents[proc.pid] = ancestors
    kept = [
        tp
        for pid, tp in found.items()
        if not any(a in found and found[a].rank == tp.rank for a in parents[pid])
    ]
    kept.sort(key=lambda p: (p.rank is None, p.rank or 0, p.pid))
    return kept, unreadable


def _seen_from_here(pid: int, path: str) -> str:
    """``path`` as this process reaches it: itself where it exists here, else through
    the process's own root (an agent in another mount namespace than the job)."""
    if os.path.lexists(path):
        return path
    inside = f"/proc/{pid}/root{path}" if path.startswith("/") else path
    return inside if os.path.lexists(inside) else path


# -- HTTP/1.1 over a Unix socket, bounded --------------------------------------------


@dataclass
class _Reply:
    """One HTTP exchange: the status and body, or the outcome that stopped it."""

    status: int = 0
    body: bytes = b""
    outcome: Outcome | None = None
    why: str = ""
    #: bytes of the body received when it stopped early
    got: int = 0


def _remaining(deadline: float) -> float:
    return deadline - time.monotonic()


def _http(path: str, method: str, target: str, deadline: float) -> _Reply:
    """``method target`` to the worker server at the Unix socket ``path``, all of it
    (connect, send, every read) before ``deadline`` (``time.monotonic``)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        return _exchange(sock, path, method, target, deadline)
    finally:
        sock.close()


def _exchange(sock: socket.socket, path: str, method: str, target: str, deadline: float) -> _Reply:
    try:
        sock.settimeout(max(0.001, _remaining(deadline)))
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError) as err:
        return _Reply(
            outcome="unavailable",
            why=f"no worker server listens on {path} ({err.strerror}): the job sets "
            "TORCH_WORKER_SERVER_SOCKET but does not run under "
            "torch.distributed.elastic.control_plane.worker_main()",
        )
    except PermissionError as err:
        return _Reply(outcome="refused", why=f"cannot connect to {path}: {err.strerror}")
    except TimeoutError:
        return _Reply(outcome="no_answer", why=f"{path} did not accept a connection in time")
    except OSError as err:
        return _Reply(outcome="error", why=f"cannot connect to {path}: {err}")
    request = (
        f"{method} {target} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    buf = bytearray()
    head_end = -1
    length: int | None = None
    try:
        sock.sendall(request)
        while True:
            chunk = _recv(sock, deadline)
            if not chunk:
                break
            buf += chunk
            if head_end < 0:
                head_end = buf.find(b"\r\n\r\n")
                if head_end >= 0:
                    length = _content_length(bytes(buf[:head_end]))
                elif len(buf) > 65536:
                    return _Reply(outcome="garbage", why="no HTTP header in the first 64 KiB")
            if head_end >= 0 and length is not None and len(buf) - head_end - 4 >= length:
                break
            if len(buf) > MAX_ANSWER_BYTES:
                return _Reply(
                    outcome="truncated",
                    why=f"answer over {MAX_ANSWER_BYTES >> 20} MiB: cut",
                    got=len(buf),
                )
    except TimeoutError:
        if head_end < 0:
            if not buf:
                return _Reply(outcome="no_answer", why="no answer in time")
            return _garbage_or_cut(bytes(buf), "no complete HTTP header in time")
        got = len(buf) - head_end - 4
        return _Reply(
            outcome="truncated",
            why=f"{got} of {_of(length)} body bytes in time",
            got=got,
        )
    except OSError as err:
        if head_end < 0:
            return _Reply(outcome="error", why=f"connection failed: {err}")
        got = len(buf) - head_end - 4
        return _Reply(
            outcome="truncated", why=f"connection failed after {got} body bytes: {err}", got=got
        )
    if head_end < 0:
        if not buf:
            return _Reply(outcome="no_answer", why="the server closed without an answer")
        return _garbage_or_cut(bytes(buf), "closed before the end of the HTTP header")
    status = _status(bytes(buf[:head_end]))
    if status is None:
        first = bytes(buf[: min(head_end, 40)])
        return _Reply(outcome="garbage", why=f"not an HTTP answer: {first!r}")
    body = bytes(buf[head_end + 4 :])
    if length is not None and len(body) < length:
        return _Reply(
            status=status,
            outcome="truncated",
            why=f"the server closed after {len(body)} of {length} body bytes",
            got=len(body),
        )
    return _Reply(status=status, body=body if length is None else body[:length])


def _recv(sock: socket.socket, deadline: float) -> bytes:
    """One read, before ``deadline``: a peer dripping a byte at a time still ends."""
    left = _remaining(deadline)
    if left <= 0:
        raise TimeoutError
    sock.settimeout(left)
    return sock.recv(1 << 20)


def _of(length: int | None) -> str:
    return "?" if length is None else str(length)


def _garbage_or_cut(head: bytes, why: str) -> _Reply:
    if head.startswith(b"HTTP/1."):
        return _Reply(outcome="truncated", why=why)
    return _Reply(outcome="garbage", why=f"not an HTTP answer: {head[:40]!r}")


def _status(head: bytes) -> int | None:
    """The status code of an HTTP/1.x status line, None for anything else."""
    line = head.split(b"\r\n", 1)[0].split()
    if len(line) >= 2 and line[0].startswith(b"HTTP/1.") and line[1].isdigit():
        return int(line[1])
    return None


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return int(value.strip())
    return None


def _handler_names(path: str, deadline: float) -> tuple[list[str] | None, _Reply]:
    """The names GET /handler/ lists (None where the answer is not such a list)."""
    reply = _http(path, "GET", "/handler/", deadline)
    if reply.outcome is not None or reply.status != 200:
        return None, reply
    try:
        names = json.loads(reply.body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None, _Reply(outcome="garbage", why="GET /handler/ is not a JSON list")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None, _Reply(outcome="garbage", why="GET /handler/ is not a list of names")
    return names, reply


def _http_failure(reply: _Reply, handler: str) -> tuple[Outcome, str]:
    """The outcome of a non-200 answer, with the server's first line of text."""
    text = reply.body[:200].decode("utf-8", errors="replace").strip().splitlines()
    said = f": {text[0]}" if text else ""
    if reply.status >= 500:
        return "error", f"HTTP {reply.status} from {handler}{said}"
    return "refused", f"HTTP {reply.status} from {handler}{said}"


# -- checking and keeping an answer ---------------------------------------------------


def _check_dump(data: bytes) -> tuple[Outcome, str, str, int]:
    """(outcome, why, file extension, entries) of bytes that should be a dump."""
    if not data:
        return "garbage", "an empty answer", "", 0
    kind = sniff_dump(data[:SNIFF_BYTES])
    if kind is None:
        return "garbage", f"not a Flight Recorder dump: starts {data[:24]!r}", "", 0
    fmt = DUMP_FORMATS[kind]
    try:
        top = load_dump(data, fmt)
    except DumpRefusedError as err:
        cut = "ends early" in str(err) or "was the file cut" in str(err)
        return ("truncated" if cut else "garbage"), str(err), fmt, 0
    if not isinstance(top, dict):
        return "garbage", f"the dump's top level is a {type(top).__name__}", fmt, 0
    entries = top.get("entries", [])
    return "answered", "", fmt, len(entries) if isinstance(entries, list) else 0


def _keep(folder: Path, sub: str, name: str, data: bytes) -> str:
    """Write ``folder/sub/name`` whole (a reader never sees half of it); its relative path."""
    (folder / sub).mkdir(parents=True, exist_ok=True)
    tmp = folder / sub / f".{name}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, folder / sub / name)
    return f"{sub}/{name}"


def _ask(proc: TorchProcess, what: What, via: str, started: float, **kw: Any) -> Ask:
    return Ask(
        what=what,
        target=proc.target,
        via=via,
        pid=proc.pid,
        rank=proc.rank,
        elapsed_s=round(time.monotonic() - started, 3),
        **kw,
    )


# -- the askers -----------------------------------------------------------------------


def request_dump(folder: Path, proc: TorchProcess, *, timeout_s: float = 5.0) -> Ask:
    """Ask ``proc`` for its Flight Recorder dump; keep it as ``folder/dumps/<stem>.<ext>``.

    The control plane where the process has a socket, else (or where its server has no
    dump handler, or none listens) the debug-info pipe.  Returns within about
    ``timeout_s`` whatever the process does; never raises for it.

    >>> request_dump(Path("evidence/x"), proc, timeout_s=5.0).outcome  # doctest: +SKIP
    'answered'
    """
    started = time.monotonic()
    deadline = started + timeout_s
    tried: Ask | None = None
    if proc.socket_path:
        tried = _dump_by_control_plane(folder, proc, started, deadline)
        if tried.outcome != "unavailable" or not proc.pipe_path:
            return tried
    if proc.pipe_path:
        return _dump_by_pipe(folder, proc, started, deadline)
    if tried is not None:
        return tried
    return _ask(
        proc,
        "flight_dump",
        "none",
        started,
        outcome="unavailable",
        why="the process has neither a control-plane socket (TORCH_WORKER_SERVER_SOCKET, "
        "and worker_main() in the script) nor a debug-info pipe "
        "(TORCH_NCCL_DEBUG_INFO_PIPE_FILE, which `ncclscope run` sets; NCCL process "
        "groups only)",
    )


def _dump_by_control_plane(
    folder: Path, proc: TorchProcess, started: float, deadline: float
) -> Ask:
    assert proc.socket_path is not None
    path = _seen_from_here(proc.pid, proc.socket_path)
    names, listing = _handler_names(path, deadline)
    if names is None and listing.outcome is not None:
        return _ask(
            proc,
            "flight_dump",
            "control_plane /handler/",
            started,
            outcome=listing.outcome,
            why=listing.why,
        )
    # A server that does not list its handlers (a 404 on GET /handler/) is asked for
    # each in turn; a 404 on the POST then says that one is missing.
    candidates = [h for h in DUMP_HANDLERS if names is None or h in names]
    if not candidates:
        return _ask(
            proc,
            "flight_dump",
            "control_plane /handler/",
            started,
            outcome="unavailable",
            why=f"the worker server has no dump handler (it lists {', '.join(names or [])})",
        )
    kept: Ask | None = None
    for handler in candidates:
        via = f"control_plane /handler/{handler}"
        reply = _http(path, "POST", f"/handler/{handler}", deadline)
        if reply.outcome is not None:
            return kept or _ask(
                proc,
                "flight_dump",
                via,
                started,
                outcome=reply.outcome,
                why=reply.why,
                size_bytes=reply.got,
            )
        if reply.status == 404:
            continue
        if reply.status != 200:
            outcome, why = _http_failure(reply, handler)
            return kept or _ask(proc, "flight_dump", via, started, outcome=outcome, why=why)
        outcome, why, ext, entries = _check_dump(reply.body)
        if outcome != "answered":
            return kept or _ask(
                proc,
                "flight_dump",
                via,
                started,
                outcome=outcome,
                why=why,
                size_bytes=len(reply.body),
            )
        # The NCCL recorder of a gloo-only job answers with no entries: the next
        # handler (the generic recorder gloo writes to) may hold them.
        if kept is None or entries:
            kept = _ask(
                proc,
                "flight_dump",
                via,
                started,
                outcome="answered",
                file=_keep(folder, "dumps", f"{proc.stem}.{ext}", reply.body),
                size_bytes=len(reply.body),
            )
        if entries:
            return kept
    return kept or _ask(
        proc,
        "flight_dump",
        "control_plane /handler/",
        started,
        outcome="unavailable",
        why=f"the worker server answered 404 for every dump handler ({', '.join(candidates)})",
    )


def _snapshot(paths: Iterable[str]) -> dict[str, tuple[int, int, int] | None]:
    out: dict[str, tuple[int, int, int] | None] = {}
    for p in paths:
        try:
            st = os.stat(p)
            out[p] = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            out[p] = None
    return out


def _poke_pipe(pipe: str) -> tuple[Outcome | None, str]:
    """Write one byte into the process's debug-info pipe; (None, "") when done."""
    try:
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as err:
        if err.errno == errno.ENXIO:
            return "unavailable", (
                f"nobody reads {pipe}: the process's NCCL heartbeat monitor is not running "
                "(TORCH_NCCL_ENABLE_MONITORING=0) or has ended"
            )
        if err.errno == errno.ENOENT:
            return "unavailable", (
                f"no pipe at {pipe}: the process made none (no NCCL process group yet, "
                "its trace buffer off, a gloo-only job, or PyTorch older than 2.3)"
            )
        if err.errno in (errno.EACCES, errno.EPERM):
            return "refused", f"cannot open {pipe}: {err.strerror}"
        return "error", f"cannot open {pipe}: {err}"
    try:
        # A regular file opens the same way: writing would change a file of the user's.
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return "unavailable", f"{pipe} is not a named pipe: not written"
        try:
            os.write(fd, b"1\n")
        except BlockingIOError:
            pass  # full of earlier requests not yet read: one more adds nothing
        except BrokenPipeError:
            return "unavailable", f"the reader of {pipe} closed it"
    finally:
        os.close(fd)
    return None, ""


def _dump_by_pipe(folder: Path, proc: TorchProcess, started: float, deadline: float) -> Ask:
    assert proc.pipe_path is not None
    via = "debug_pipe"
    pipe = _seen_from_here(proc.pid, proc.pipe_path)
    paths = [_seen_from_here(proc.pid, p) for p in proc.dump_paths]
    before = _snapshot(paths)
    outcome, why = _poke_pipe(pipe)
    if outcome is not None:
        return _ask(proc, "flight_dump", via, started, outcome=outcome, why=why)
    seen: dict[str, tuple[int, int, int] | None] = {}
    stable_since: dict[str, float] = {}
    #: the state each file was last read in: not read again until it changes
    read_at: dict[str, tuple[int, int, int]] = {}
    last: tuple[Outcome, str, bytes] | None = None
    while True:
        now = _snapshot(paths)
        for p, st in now.items():
            if st is None or st == before[p] or st[1] == 0:
                continue
            if seen.get(p) != st:
                seen[p], stable_since[p] = st, time.monotonic()
                continue
            if time.monotonic() - stable_since[p] < _SETTLE_S or read_at.get(p) == st:
                continue
            read_at[p] = st
            try:
                data = Path(p).read_bytes()
            except OSError as err:
                last = ("error", f"cannot read {p}: {err.strerror}", b"")
                continue
            got, why, ext, _ = _check_dump(data)
            if got == "answered":
                return _ask(
                    proc,
                    "flight_dump",
                    via,
                    started,
                    outcome="answered",
                    file=_keep(folder, "dumps", f"{proc.stem}.{ext}", data),
                    size_bytes=len(data),
                )
            last = (got, f"{p}: {why}", data)
        if _remaining(deadline) <= 0:
            break
        time.sleep(min(_POLL_S, max(0.0, _remaining(deadline))))
    if last is not None:
        return _ask(
            proc,
            "flight_dump",
            via,
            started,
            outcome=last[0],
            why=last[1],
            size_bytes=len(last[2]),
        )
    if any(seen.values()):
        return _ask(
            proc,
            "flight_dump",
            via,
            started,
            outcome="truncated",
            why="the dump file was still being written when the time ran out",
        )
    return _ask(
        proc,
        "flight_dump",
        via,
        started,
        outcome="no_answer",
        why=f"no dump in {', '.join(proc.dump_paths) or '?'} within "
        f"{deadline - started:.1f} s (the heartbeat monitor reads the pipe every second "
        "with TORCH_NCCL_DUMP_ON_TIMEOUT=1, else once per heartbeat timeout)",
    )


def _looks_like_traceback(text: str) -> bool:
    """faulthandler's text: ``Thread 0x...`` / ``Current thread 0x...`` blocks."""
    return "thread 0x" in text[:4096].lower() or text.startswith("Stack (most recent call first)")


def request_py_stack(folder: Path, proc: TorchProcess, *, timeout_s: float = 5.0) -> Ask:
    """Ask ``proc`` for its Python stacks (every thread) through the control plane's
    ``dump_traceback``; keep them as ``folder/stacks/<stem>.txt``.

    Unavailable without a control-plane socket or that handler (PyTorch before about
    2.6): py-spy from outside is the fallback.  The handler takes the GIL: a process
    stuck holding it (in a C call that never releases it) gives no_answer.

    A sample of the file (rank 1 of ``torch_hang_job.py --fault python``)::

        Thread 0x00007f5654dc0b80 (most recent call first):
          File "/work/main/benchmarks/torch_hang_job.py", line 56 in stuck_in_python
          File "/work/main/benchmarks/torch_hang_job.py", line 83 in run_rank
    """
    started = time.monotonic()
    deadline = started + timeout_s
    via = f"control_plane /handler/{STACK_HANDLER}"
    if not proc.socket_path:
        return _ask(
            proc,
            "stack",
            "none",
            started,
            outcome="unavailable",
            why="no control-plane socket (TORCH_WORKER_SERVER_SOCKET, and worker_main() in "
            "the script): take the stacks from outside (py-spy)",
        )
    path = _seen_from_here(proc.pid, proc.socket_path)
    reply = _http(path, "POST", f"/handler/{STACK_HANDLER}", deadline)
    if reply.outcome is not None:
        return _ask(
            proc, "stack", via, started, outcome=reply.outcome, why=reply.why, size_bytes=reply.got
        )
    if reply.status == 404:
        return _ask(
            proc,
            "stack",
            via,
            started,
            outcome="unavailable",
            why=f"the worker server has no {STACK_HANDLER} handler (PyTorch before about 2.6)",
        )
    if reply.status != 200:
        outcome, why = _http_failure(reply, STACK_HANDLER)
        return _ask(proc, "stack", via, started, outcome=outcome, why=why)
    text = reply.body.decode("utf-8", errors="replace")
    if not _looks_like_traceback(text):
        return _ask(
            proc,
            "stack",
            via,
            started,
            outcome="garbage",
            why=f"not faulthandler's text: starts {reply.body[:24]!r}",
            size_bytes=len(reply.body),
        )
    return _ask(
        proc,
        "stack",
        via,
        started,
        outcome="answered",
        file=_keep(folder, "stacks", f"{proc.stem}.txt", reply.body),
        size_bytes=len(reply.body),
    )
