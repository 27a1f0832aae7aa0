"""``ncclscope run``'s machinery: the job's environment, its process, and the tee.

The environment that makes a run diagnosable is one table, :data:`SETTINGS`: each entry
names the variable (with the other names the same setting goes by), the value, why it is
set and what it costs.  :func:`job_environment` applies it where the user set nothing,
and ``docs/run.md``'s table is :func:`settings_markdown` (a test keeps the two equal).

The job runs in a process group of its own (a new session), so that a signal reaches
all of it (torchrun and its workers) and only it.  Its stdout and stderr come through
pipes; :class:`Tee` writes each chunk unchanged to the terminal at once and each
complete line to one log, in the order the lines arrived.  NCCL lines that carry no
time of their own get the arrival time in front of their NCCL header, in NCCL's own
``[%F %T.%6f] `` form, as the agent's live window stamps them (``agent.live.stamp``), so
``analyze`` reads that time as the line's.  Other lines are written as they came: a
time in front of them would hide the prefixes (``[rank3]:``, glog's ``[E1108 ...]``,
``[PG 0 Rank 3]``) that the PyTorch and DeepSpeed readers take rank and process group
from.

Sample of ``output.log`` (a 2.21 COLL line printed to stdout, then a PyTorch line)::

    [2026-11-26 02:41:07.512230] node-0:4103:4103 [3] NCCL INFO AllReduce: opCount 4 ...
    [rank3]:[E1126 02:51:07.514 4103 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught ...
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import selectors
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from ncclscope.parsers.nccl.patterns import HEADER_RE, PREFIX_TS_RE

__all__ = [
    "SETTINGS",
    "JobEnvironment",
    "Setting",
    "SignalForwarder",
    "Tee",
    "TeeStats",
    "exit_status",
    "job_environment",
    "settings_markdown",
]

#: Bytes read from a pipe at once.
_CHUNK = 1 << 20
#: The pipes' capacity asked for (Linux's default limit for a user is 1 MiB).
_PIPE_BYTES = 1 << 20
#: After a read, wait up to this long before the next: a job printing fast then fills
#: the pipe without waking the tee at every write (a wake-up per line doubled the wall
#: time of a job printing 100,000 lines a second), and a chatty job (100 lines/s) wakes
#: it 20 times a second, not 100.  The wait is shorter where the job writes so fast
#: that a quarter of the pipe would fill first.  Lines reach the terminal and the log at
#: most this late; a line after a quiet spell goes through at once.
_BATCH_S = 0.05
#: HEADER_RE and PREFIX_TS_RE over bytes: no decoding of the lines that are stamped.
_HEADER_B = re.compile(HEADER_RE.pattern.encode())
_PREFIX_TS_B = re.compile(PREFIX_TS_RE.pattern.encode())
#: A line without its newline longer than this is written out cut (a tqdm bar redrawn
#: with ``\r`` for hours never ends its line; holding it all would grow without end).
_MAX_PENDING = 1 << 20


@dataclass(frozen=True)
class Setting:
    """One environment variable ``ncclscope run`` sets where the user did not.

    Attributes:
        names: the variable's names, the current first; older releases read the later
            ones.  A value the user gave under any of them is kept, and none is set.
        value: the value; ``{out}`` stands for the run's output folder.
        why: what the analysis gets from it.
        cost: what it costs the job.
    """

    names: tuple[str, ...]
    value: str
    why: str
    cost: str


SETTINGS: tuple[Setting, ...] = (
    Setting(
        ("NCCL_DEBUG",),
        "INFO",
        "NCCL prints its version, communicators, ranks, transports and errors.",
        "A few hundred lines per process at init; INFO itself does not slow collectives.",
    ),
    Setting(
        ("NCCL_DEBUG_SUBSYS",),
        "INIT,ENV,COLL",
        "INIT: who is who (ranks, GPUs, communicators); ENV: the NCCL settings in force "
        "(the config checks); COLL: one line per collective and rank, which hangs, "
        "mismatches and stragglers are read from.",
        "COLL writes ~250 bytes per collective per rank: about 1 GB a day for a rank "
        "that runs 50 collectives a second. It replaces NCCL's default list "
        "(INIT,BOOTSTRAP,ENV).",
    ),
    Setting(
        ("NCCL_DEBUG_FILE",),
        "{out}/nccl/%h.%p.log",
        "One file per process (NCCL expands %h to the host, %p to the pid): lines of "
        "different ranks never interleave, and the job's own output stays readable.",
        "NCCL's lines, WARN included, go to these files instead of the terminal.",
    ),
    Setting(
        ("NCCL_DEBUG_TIMESTAMP_LEVELS",),
        "WARN,INFO",
        "NCCL >= 2.26 stamps INFO lines with the wall time: lateness and stall lengths "
        "become measurable. Older NCCL ignores it.",
        "~29 bytes per line.",
    ),
    Setting(
        ("NCCL_DEBUG_TIMESTAMP_FORMAT",),
        "[%F %T.%6f] ",
        "Microseconds: one second (the default format) cannot order collectives.",
        "None beyond the bytes above; 2.26.2 prints wrong sub-second digits (fixed in 2.26.3).",
    ),
    Setting(
        ("TZ",),
        "UTC",
        "NCCL, PyTorch and DeepSpeed print the local time without a zone: in UTC the "
        "stamps mean the same on every node and to every reader. Where you set TZ, the "
        "agent learns it from when the lines arrive, and analyze takes --log-tz.",
        "The job's own local-time output (its logger's times, file names it dates) is in UTC too.",
    ),
    Setting(
        ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
        "2000",
        "PyTorch's flight recorder keeps each rank's last 2000 collectives (state, "
        "process group, sequence, sizes). On by default with 2000 in recent PyTorch; "
        "off (0) in older ones.",
        "A ring of 2000 entries per process in host memory, and a Python stack captured "
        "per collective (PyTorch calls the overhead low). PyTorch releases that know the "
        "first name warn once that the second is deprecated.",
    ),
    Setting(
        ("TORCH_NCCL_DUMP_ON_TIMEOUT",),
        "1",
        "On a collective timeout every rank dumps its flight recorder.",
        "After a timeout, the process waits a bounded time for the dumps before it exits "
        "(TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC).",
    ),
    Setting(
        ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),
        "{out}/flight/nccl_trace_rank_",
        "The dumps go beside the logs (PyTorch appends the rank); default is ~/.cache/torch.",
        "One file per rank, written only on a dump; it grows with the entries and their stacks.",
    ),
    Setting(
        ("TORCH_NCCL_DEBUG_INFO_PIPE_FILE",),
        "{out}/flight/debug_pipe_rank_",
        "PyTorch 2.3+ makes a named pipe per rank (the prefix, the global rank, `.pipe`); "
        "a byte written into it makes that rank dump its flight recorder at once, to the "
        "file above. The agent asks every rank of its node this way when a collective "
        "stalls, before NCCL's watchdog kills the job (NCCL process groups only; gloo has "
        "no pipe). The control plane's worker server "
        "(`TORCH_WORKER_SERVER_SOCKET`, read by `worker_main()`) is not set here: it must "
        "be one path per process, and torchrun's workers share one environment.",
        "One FIFO per rank in the folder; PyTorch's heartbeat thread already reads it at "
        "each wake-up (every second with TORCH_NCCL_DUMP_ON_TIMEOUT=1). The folder's "
        "filesystem must hold named pipes (NFS, Lustre and local disks do; a FUSE object "
        "store may not): set the variable empty to turn it off.",
    ),
    Setting(
        ("PYTHONUNBUFFERED",),
        "1",
        "A Python job writing to a pipe buffers 8 KB of output: lines would arrive late "
        "(wrong arrival times) and the last ones would be lost when it is killed.",
        "One write system call per print, as on a terminal.",
    ),
)


@dataclass(frozen=True)
class JobEnvironment:
    """The job's environment and what ``ncclscope run`` did to it.

    Attributes:
        env: the whole environment the job gets.
        set: the variables set here, with their values.
        kept: the variables of :data:`SETTINGS` the user had set, with the user's values
            (for an aliased setting, the names the user used).
    """

    env: dict[str, str]
    set: dict[str, str] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)


def job_environment(base: Mapping[str, str], out: Path) -> JobEnvironment:
    """``base`` plus :data:`SETTINGS` where the user set none of a setting's names.

    >>> e = job_environment({"NCCL_DEBUG": "WARN", "PATH": "/bin"}, Path("/runs/42"))
    >>> e.env["NCCL_DEBUG"], e.env["NCCL_DEBUG_FILE"], e.kept
    ('WARN', '/runs/42/nccl/%h.%p.log', {'NCCL_DEBUG': 'WARN'})
    """
    env = dict(base)
    done = JobEnvironment(env)
    for s in SETTINGS:
        mine = {n: base[n] for n in s.names if n in base}
        if mine:
            done.kept.update(mine)
            continue
        value = s.value.replace("{out}", str(out))
        for name in s.names:
            env[name] = value
            done.set[name] = value
    return done


def settings_markdown() -> str:
    """The table of :data:`SETTINGS` as ``docs/run.md`` shows it."""
    rows = ["| Variable | Value | Why | Cost |", "|---|---|---|---|"]
    for s in SETTINGS:
        names = " / ".join(f"`{n}`" for n in s.names)
        value = s.value.replace("|", "\\|")
        rows.append(f"| {names} | `{value}` | {s.why} | {s.cost} |")
    return "\n".join(rows) + "\n"


def exit_status(returncode: int) -> int:
    """The job's exit status as a shell reports it: a death by signal N is 128 + N.

    >>> exit_status(3), exit_status(-9), exit_status(-15)
    (3, 137, 143)
    """
    return 128 - returncode if returncode < 0 else returncode


def _pipe_capacity(fd: int) -> int:
    """Ask for ``_PIPE_BYTES`` of pipe; what the pipe holds now (64 KiB where it cannot
    be changed: not Linux, not a pipe, over the user's limit)."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        return int(fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ))
    except (OSError, AttributeError):
        return 1 << 16


def _local_now() -> datetime:
    # NCCL stamps its own lines with the host's local time: the same clock here keeps
    # output.log's times and DIR/nccl's comparable.
    return datetime.now()


@dataclass
class TeeStats:
    """What the tee passed on.

    Attributes:
        lines: lines written to the log (a last line without its newline counts).
        bytes: bytes read from the job's pipes.
        stamped: NCCL lines given their arrival time.
        cut: lines written cut because no newline came within ``_MAX_PENDING`` bytes.
        terminal_lost: bytes the terminal could not take (closed stdout or stderr);
            the log has them.
    """

    lines: int = 0
    bytes: int = 0
    stamped: int = 0
    cut: int = 0
    terminal_lost: int = 0


class Tee:
    """Copies a job's stdout and stderr to the terminal and, line by line, to one log.

    Args:
        pipes: the read ends of the job's stdout and stderr (file descriptors).
        terminal: where each pipe's bytes go unchanged, in the same order (descriptors;
            usually 1 and 2).  A descriptor that fails (a closed pipe) is dropped.
        log: the log, open for binary writing; flushed after each read.
        clock: the arrival time stamped on NCCL lines (local time, as NCCL prints it).
        batch_s: the pause after a small read (see ``_BATCH_S``).

    :meth:`run` returns once every pipe reached its end: a job's last lines, even a last
    one without its newline, are in the log.  A line is written whole, so lines of the
    two streams never mix; lines end with ``\\n`` in the log (one is added to a last
    line that had none).
    """

    def __init__(
        self,
        pipes: Sequence[int],
        terminal: Sequence[int],
        log: BinaryIO,
        *,
        clock: Callable[[], datetime] = _local_now,
        batch_s: float = _BATCH_S,
    ) -> None:
        if len(pipes) != len(terminal):
            raise ValueError("one terminal descriptor per pipe")
        self._terminal: dict[int, int | None] = dict(zip(pipes, terminal, strict=True))
        self._pending: dict[int, bytes] = dict.fromkeys(pipes, b"")
        self._log = log
        self._clock = clock
        self._batch_s = batch_s
        self.stats = TeeStats()

    def run(self, *, gone: Callable[[], bool] | None = None, linger_s: float = 5.0) -> None:
        """Pass everything on until every pipe is at its end.

        ``gone`` tells whether the job has exited: a process the job left behind can
        hold a pipe open for ever, so once the job is gone and the pipes were silent for
        ``linger_s`` seconds the tee stops, with what it has.
        """
        sel = selectors.DefaultSelector()
        capacity = _PIPE_BYTES
        for fd in self._pending:
            sel.register(fd, selectors.EVENT_READ)
            capacity = min(capacity, _pipe_capacity(fd))
        quiet_since: float | None = None
        last_read = time.monotonic()
        try:
            while sel.get_map():
                events = sel.select(timeout=0.5)
                if events:
                    quiet_since = None
                got = 0
                for key, _ in events:
                    fd = int(key.fd)  # registered as an int
                    data = os.read(fd, _CHUNK)
                    got += len(data)
                    if data:
                        self._feed(fd, data)
                    else:
                        sel.unregister(fd)
                        self._end(fd)
                self._log.flush()
                if events:
                    now = time.monotonic()
                    # At the rate the job writes, a quarter of the pipe fills before the
                    # next read: the job never waits for the tee.
                    rate = got / max(now - last_read, 1e-4)
                    last_read = now
                    pause = min(self._batch_s, capacity / 4 / rate) if rate else self._batch_s
                    if pause >= 0.001:
                        time.sleep(pause)
                elif gone is not None and gone():
                    now = time.monotonic()
                    quiet_since = quiet_since if quiet_since is not None else now
                    if now - quiet_since >= linger_s:
                        break
        finally:
            for key in list(sel.get_map().values()):
                self._end(int(key.fd))
            sel.close()
            self._log.flush()

    def _feed(self, fd: int, data: bytes) -> None:
        self.stats.bytes += len(data)
        self._to_terminal(fd, data)
        buf = self._pending[fd] + data if self._pending[fd] else data
        end = buf.rfind(b"\n")
        if end < 0:
            if len(buf) > _MAX_PENDING:
                self.stats.cut += 1
                self._write(buf + b"\n")
                buf = b""
            self._pending[fd] = buf
            return
        self._pending[fd] = buf[end + 1 :]
        self._write(buf[: end + 1])

    def _end(self, fd: int) -> None:
        """The pipe is at its end: its last line, even without a newline, goes out."""
        rest = self._pending.pop(fd, b"")
        if rest:
            self._write(rest + b"\n")
        if fd in self._terminal:
            self._terminal[fd] = None

    def _write(self, lines: bytes) -> None:
        """Complete lines to the log, NCCL lines stamped with their arrival time."""
        self.stats.lines += lines.count(b"\n")
        if b" NCCL " in lines:  # the common case (no NCCL line) costs one scan
            lines = self._stamp(lines)
        self._log.write(lines)

    def _stamp(self, lines: bytes) -> bytes:
        """``agent.live.stamp`` over bytes: the arrival time in front of each NCCL header
        that has no time of its own (2.26+ with timestamps on keeps NCCL's)."""
        ts = f"[{self._clock():%Y-%m-%d %H:%M:%S.%f}] ".encode()
        out = []
        for raw in lines.split(b"\n"):
            if b" NCCL " in raw and (m := _HEADER_B.search(raw)) is not None:
                at = m.start()
                if _PREFIX_TS_B.search(raw, 0, at) is None:
                    raw = raw[:at] + ts + raw[at:]
                    self.stats.stamped += 1
            out.append(raw)
        return b"\n".join(out)

    def _to_terminal(self, fd: int, data: bytes) -> None:
        target = self._terminal.get(fd)
        if target is None:
            self.stats.terminal_lost += len(data)
            return
        view = memoryview(data)
        try:
            while view:
                n = os.write(target, view)
                view = view[n:]
        except OSError as e:  # EPIPE (| head), EBADF: the log still gets every line
            if e.errno not in (errno.EPIPE, errno.EBADF, errno.EIO):
                raise
            self._terminal[fd] = None
            self.stats.terminal_lost += len(view)


class SignalForwarder:
    """Sends SIGINT and SIGTERM on to the job's process group while it runs.

    Installed before the job starts: a signal that comes before the group exists is
    kept and sent as soon as it does (:meth:`attach`), so the job is never left running
    without having had it.  Used as a context manager; the old handlers come back on
    exit.
    """

    signums = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.pgid: int | None = None
        #: the signals received, in order
        self.received: list[int] = []
        self._saved: dict[int, object] = {}

    def __enter__(self) -> SignalForwarder:
        self._saved = {s: signal.signal(s, self._handle) for s in self.signums}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._saved.items():
            signal.signal(s, h)  # type: ignore[arg-type]  # what signal.signal returned

    def attach(self, pgid: int) -> None:
        """The job's group exists now: send it what came before."""
        self.pgid = pgid
        for s in self.received:
            _send(pgid, s)

    def _handle(self, signum: int, frame: object) -> None:
        del frame
        self.received.append(signum)
        if self.pgid is not None:
            _send(self.pgid, signum)


def _send(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(pgid, signum)
