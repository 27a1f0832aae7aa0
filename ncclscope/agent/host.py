"""Host telemetry through psutil: memory, swap, CPU, and the job's processes, non-blocking.

:class:`HostCollector` reads the host's memory, swap and CPU use and, for each process of
the job, its name, RSS and CPU time. Processes are found by pid (:meth:`HostCollector.set_pids`,
as the agent learns them from the logs) and/or by a substring of their command line,
looked for at most every ``rescan_interval_s`` seconds. The same numbers by hand::

    free -b; grep -E '^psw(pin|pout)' /proc/vmstat; ps -o pid,comm,rss,cputimes -p PID

Every call returns at once: CPU use is the share of CPU time, over all cores, that was
busy since the previous :meth:`~HostCollector.sample` (``psutil.cpu_percent(interval=None)``
semantics, but with the collector's own previous reading, so another caller of
``cpu_percent`` in the process or a change of thread cannot skew it). Vanished processes
drop out silently; a process psutil may not read is reported with ``None`` fields.
Nothing here prints or configures logging.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import psutil

__all__ = ["FULL_SCAN_EVERY", "HostCollector", "HostSample", "ProcSample"]

#: Every this many ``match`` scans, re-read every process's command line, not only new pids'.
FULL_SCAN_EVERY = 12


@dataclasses.dataclass(frozen=True)
class ProcSample:
    """One process at one sample.

    Attributes:
        pid: the process id (in the agent's pid namespace).
        name: the process name (``comm``, at most 15 characters on Linux).
        rss_bytes: resident set size.
        cpu_seconds_total: user + system CPU time since the process started (its children
            not included), a counter.
    """

    pid: int
    name: str | None
    rss_bytes: int | None
    cpu_seconds_total: float | None


@dataclasses.dataclass(frozen=True)
class HostSample:
    """The host at one sample, in base units.

    Attributes:
        memory_total_bytes: physical memory (``/proc/meminfo`` MemTotal; not a cgroup limit).
        memory_available_bytes: memory that can be given to processes without swapping.
        swap_used_bytes: swap in use.
        swap_in_bytes_total: bytes swapped in from disk since boot, a counter.
        swap_out_bytes_total: bytes swapped out to disk since boot, a counter.
        cpu_ratio: busy share of all cores since the previous sample, 0-1; ``None`` when no
            time has passed yet (first sample right after construction).
        processes: the processes followed, by pid.
    """

    memory_total_bytes: int
    memory_available_bytes: int
    swap_used_bytes: int
    swap_in_bytes_total: int
    swap_out_bytes_total: int
    cpu_ratio: float | None
    processes: tuple[ProcSample, ...]


def _total_and_busy(times: Any) -> tuple[float, float]:
    """Total and busy CPU seconds in a ``psutil.cpu_times()`` delta, as ``cpu_percent`` counts.

    On Linux guest time is already inside user/nice, so it is taken out of the total, and
    iowait is idle time.
    """
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    busy = total - times.idle - getattr(times, "iowait", 0.0)
    return total, busy


class HostCollector:
    """Samples the host and the job's processes; one instance per agent process.

    Args:
        pids: processes to follow from the start (more later with :meth:`set_pids`).
        match: also follow every process whose command line (arguments joined by spaces)
            contains this substring, except the agent itself.
        rescan_interval_s: at most this often, look for new ``match`` processes and check
            that followed pids were not reused by another process.
        clock: monotonic seconds; tests may pass their own.

    >>> host = HostCollector([os.getpid()])
    >>> sample = host.sample()
    >>> [p.pid for p in sample.processes] == [os.getpid()], sample.memory_total_bytes > 0
    (True, True)
    """

    def __init__(
        self,
        pids: Iterable[int] = (),
        match: str | None = None,
        *,
        rescan_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._match = match
        self._rescan_interval_s = rescan_interval_s
        self._clock = clock
        self._own_pid = os.getpid()
        #: Explicit pids -> their process, or None once it is gone (not looked up again).
        self._explicit: dict[int, psutil.Process | None] = {}
        self._matched: dict[int, psutil.Process] = {}
        self._checked: set[int] = set()  # pids whose command line a scan has read
        self._scans = 0
        self._next_check = clock()  # due at the first sample
        self._last_cpu = psutil.cpu_times()
        self.set_pids(pids)

    def set_pids(self, pids: Iterable[int]) -> None:
        """Follow exactly these pids (besides ``match``); pids already followed keep state."""
        explicit: dict[int, psutil.Process | None] = {}
        for pid in pids:
            if pid in explicit:
                continue
            if pid in self._explicit:
                explicit[pid] = self._explicit[pid]
            elif pid in self._matched:
                explicit[pid] = self._matched[pid]
            else:
                explicit[pid] = self._open(pid)
        self._explicit = explicit

    @property
    def pids(self) -> list[int]:
        """The pids followed now (explicit ones still alive, and matched ones), sorted."""
        alive = {pid for pid, proc in self._explicit.items() if proc is not None}
        return sorted(alive | self._matched.keys())

    def sample(self) -> HostSample:
        """Read the host and every followed process; never blocks, never raises for a process."""
        now = self._clock()
        if now >= self._next_check:
            self._next_check = now + self._rescan_interval_s
            self._check_identities()
            if self._match is not None:
                self._scan()
        memory = psutil.virtual_memory()
        swap = psutil.swap_memory()
        processes = self._read_processes()
        return HostSample(
            memory_total_bytes=int(memory.total),
            memory_available_bytes=int(memory.available),
            swap_used_bytes=int(swap.used),
            swap_in_bytes_total=int(swap.sin),
            swap_out_bytes_total=int(swap.sout),
            cpu_ratio=self._cpu_ratio(),
            processes=processes,
        )

    # -- internals ------------------------------------------------------------------------

    @staticmethod
    def _open(pid: int) -> psutil.Process | None:
        try:
            return psutil.Process(pid)
        except psutil.NoSuchProcess:
            return None

    def _cpu_ratio(self) -> float | None:
        now = psutil.cpu_times()
        delta = type(now)(*(max(0.0, b - a) for a, b in zip(self._last_cpu, now, strict=True)))
        self._last_cpu = now
        total, busy = _total_and_busy(delta)
        if total <= 0:
            return None
        return min(1.0, max(0.0, busy / total))

    def _check_identities(self) -> None:
        """Drop followed processes whose pid now belongs to another process (or to none).

        ``Process.is_running()`` compares creation times; it costs a ``/proc`` read, so it
        runs on the rescan schedule, not every sample.
        """
        for pid, proc in self._explicit.items():
            if proc is not None and not proc.is_running():
                self._explicit[pid] = None
        for pid in [pid for pid, proc in self._matched.items() if not proc.is_running()]:
            del self._matched[pid]

    def _scan(self) -> None:
        """Follow new processes whose command line contains ``match``.

        Only pids not seen at an earlier scan have their command line read, so a scan of a
        busy host costs one ``/proc`` listing plus a read per new process. Every
        :data:`FULL_SCAN_EVERY`-th scan reads them all again, for a process that exec'd
        into a matching command line after it was first seen, or a reused pid.
        """
        if self._scans % FULL_SCAN_EVERY == 0:
            self._checked.clear()
        self._scans += 1
        current = set(psutil.pids())
        self._checked &= current
        for pid in current - self._checked:
            self._checked.add(pid)
            if pid == self._own_pid or pid in self._matched:
                continue
            try:
                proc = psutil.Process(pid)
                cmdline = proc.cmdline()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if self._match is not None and self._match in " ".join(cmdline):
                self._matched[pid] = proc

    def _read_processes(self) -> tuple[ProcSample, ...]:
        followed = {pid: proc for pid, proc in self._explicit.items() if proc is not None}
        followed.update(self._matched)
        out: list[ProcSample] = []
        for pid in sorted(followed):
            sample = self._read(followed[pid])
            if sample is None:
                self._forget(pid)
            else:
                out.append(sample)
        return tuple(out)

    def _forget(self, pid: int) -> None:
        if pid in self._explicit:
            self._explicit[pid] = None
        self._matched.pop(pid, None)

    @staticmethod
    def _read(proc: psutil.Process) -> ProcSample | None:
        """One process, its ``/proc`` files read once (``oneshot``); ``None`` if it is gone.

        A zombie (exited, not yet reaped) counts as gone. A field psutil may not read
        (``AccessDenied``) is ``None``.
        """
        name: str | None = None
        rss: int | None = None
        cpu: float | None = None
        try:
            with proc.oneshot():
                if proc.status() == psutil.STATUS_ZOMBIE:
                    return None
                try:
                    name = proc.name()
                except psutil.AccessDenied:
                    pass
                try:
                    rss = int(proc.memory_info().rss)
                except psutil.AccessDenied:
                    pass
                try:
                    times = proc.cpu_times()
                    cpu = float(times.user + times.system)
                except psutil.AccessDenied:
                    pass
        except psutil.NoSuchProcess:  # ZombieProcess included
            return None
        except psutil.AccessDenied:  # status() itself
            pass
        return ProcSample(pid=proc.pid, name=name, rss_bytes=rss, cpu_seconds_total=cpu)
