"""One node's evidence for one stall, taken off the agent's sampling thread.

The agent calls :meth:`EvidenceCollector.maybe_collect` from its tick when a stall passes
``--collect-at``; the collector asks, in a thread of its own, every PyTorch process of
the node for its Flight Recorder dump and its Python stacks (``evidence.torch_dump``),
takes a stack from outside with py-spy where a process gave none (``evidence.stacks``),
asks NCCL's RAS (``evidence.ras``), keeps each followed log's tail and the node's
telemetry since the stall began, and writes the folder's manifest
(``evidence.manifest``) as each answer comes, so a job torn down mid-collection still
leaves a readable folder.

Bounds: each ask has ``ask_timeout_s``; the processes are asked in parallel (a few
threads), so a collection takes about two ask bounds whatever the peers do; one
collection runs at a time, and a stall (communicator, sequence) is collected once.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil

from ncclscope.evidence.manifest import Ask, Manifest, write_manifest

__all__ = ["TAIL_BYTES", "CollectConfig", "EvidenceCollector", "StallKey", "process_state"]

_log = logging.getLogger(__name__)

#: How much of each followed log's end is kept (whole lines within it).
TAIL_BYTES = 256 << 10
#: Threads asking the node's processes at once: 8 GPUs a node, one process each.
_WORKERS = 8

#: (communicator, sequence) of a stalled collective; ("quiet", t) for a node whose
#: members all went silent at t with no collective pending here (the culprit's node).
StallKey = tuple[str, int]


@dataclass
class CollectConfig:
    """What the collector asks, and how long it waits."""

    out: Path
    host: str
    #: the most one ask (a dump, a stack, RAS) may take
    ask_timeout_s: float = 5.0
    #: processes to ask: these pids (``--pid``); else those whose command line holds
    #: ``match`` (``--match``); else every process with a rank in its environment
    pids: list[int] = field(default_factory=list)
    match: str | None = None
    #: RAS's address; None: the job's own NCCL_RAS_ADDR, else NCCL's default
    ras_addr: str | None = None
    py_spy: str | None = None


def process_state(pid: int) -> str | None:
    """psutil's status of ``pid`` (``running``, ``sleeping``, ``stopped``,
    ``disk-sleep``, ``zombie``, ...), None when it is gone.  ``stopped`` (SIGSTOP, a
    debugger) and ``disk-sleep`` (a driver or file system that does not return) are a
    frozen process whatever its stack says."""
    try:
        return str(psutil.Process(pid).status())
    except (psutil.Error, OSError):
        return None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:40] or "stall"


class EvidenceCollector:
    """Collects at most once per stall, one collection at a time, in its own thread."""

    def __init__(
        self,
        config: CollectConfig,
        *,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.config = config
        self.wall = wall
        self._asked: set[StallKey] = set()
        self._thread: threading.Thread | None = None
        #: folders written (complete or not)
        self.collections = 0
        #: stalls past the threshold where no process of the job was left to ask
        self.ended = 0
        #: the last complete collection's manifest and folder (read by the agent's tick:
        #: one reference assignment, so a reader sees the old or the new, never half)
        self.last: tuple[Manifest, Path] | None = None
        #: the catalog rows of the last complete collection (``evidence.rows``)
        self.rows: dict[str, list[tuple[tuple[str, ...], float]]] = {}
        #: CPU seconds the collections took (this process's threads and the py-spy
        #: children), for the health metrics
        self.cpu_s = 0.0

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def asked(self, key: StallKey) -> bool:
        return key in self._asked

    def maybe_collect(
        self,
        key: StallKey,
        stall: dict[str, Any],
        *,
        tails: Sequence[str] = (),
        telemetry_dir: Path | None = None,
        expected: Sequence[tuple[int, int]] = (),
        wait: bool = False,
    ) -> bool:
        """Start a collection for ``key`` unless one ran for it or one is running.

        ``stall``: what the agent knows of it (JSON-ready; kept in the manifest);
        ``tails``: the followed logs; ``expected``: (rank, pid) the logs place on this
        node, so a rank whose process is gone is said to be; ``wait``: run in the
        caller's thread (tests, replays driven by hand).
        """
        if key in self._asked or self.running():
            return False
        self._asked.add(key)
        args = (key, dict(stall), list(tails), telemetry_dir, list(expected))
        if wait:
            self._collect(*args)
            return True
        self._thread = threading.Thread(
            target=self._collect, args=args, name="ncclscope-evidence", daemon=True
        )
        self._thread.start()
        return True

    def join(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- one collection -------------------------------------------------------------------

    def _collect(
        self,
        key: StallKey,
        stall: dict[str, Any],
        tails: list[str],
        telemetry_dir: Path | None,
        expected: list[tuple[int, int]],
    ) -> None:
        try:
            self._collect_unguarded(key, stall, tails, telemetry_dir, expected)
        except Exception:  # noqa: BLE001 -- a collection never takes the agent down; said once
            _log.exception("evidence collection for %s failed", key)

    def _collect_unguarded(
        self,
        key: StallKey,
        stall: dict[str, Any],
        tails: list[str],
        telemetry_dir: Path | None,
        expected: list[tuple[int, int]],
    ) -> None:
        from ncclscope.evidence.ras import ask_ras, ras_addr_from_env
        from ncclscope.evidence.torch_dump import find_torch_processes

        cpu0 = time.process_time()
        child0 = _children_cpu()
        now = self.wall()
        cfg = self.config
        name = f"{now.strftime('%Y%m%dT%H%M%SZ')}-{_slug(cfg.host)}-{_slug(key[0])}-{key[1]}"
        folder = cfg.out / "evidence" / name
        manifest = Manifest(
            host=cfg.host,
            written_utc=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            stall={**stall, "key": [key[0], key[1]], "complete": False},
        )
        lock = threading.Lock()

        def note(asks: Sequence[Ask]) -> None:
            with lock:
                manifest.asks.extend(asks)
                write_manifest(folder, manifest)

        procs, unreadable = find_torch_processes(match=cfg.match)
        if cfg.pids:
            procs = [p for p in procs if p.pid in set(cfg.pids)]
        if not procs and not unreadable and all(process_state(p) is None for _r, p in expected):
            # No process of the job lives here: it ended (or was torn down) before the
            # threshold; a folder would call every rank dead.
            self.ended += 1
            return
        folder.mkdir(parents=True, exist_ok=True)
        self.collections += 1
        write_manifest(folder, manifest)
        if unreadable:
            manifest.stall["environ_unreadable"] = unreadable
        seen = {p.pid for p in procs}
        gone = [
            Ask(
                what="stack",
                target=f"rank {rank} (pid {pid})",
                via="process table",
                outcome="error",
                why=f"process {pid} is gone: it exited before the stall was collected"
                + (" (a zombie its parent has not reaped)" if state == "zombie" else ""),
                pid=pid,
                rank=rank,
                state="gone",
            )
            for rank, pid in expected
            if pid not in seen and (state := process_state(pid)) in (None, "zombie")
        ]
        if gone:
            note(gone)
        workers = max(1, min(_WORKERS, len(procs)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ncclscope-ask") as pool:
            futures = [pool.submit(self._ask_process, folder, p) for p in procs]
            addr = cfg.ras_addr or ras_addr_from_env(procs[0].environ if procs else {})
            ras = pool.submit(ask_ras, folder, addr=addr, timeout_s=cfg.ask_timeout_s)
            note(self._tails(folder, tails))
            note(self._telemetry(folder, telemetry_dir, stall))
            for fut in futures:
                note(fut.result())
            note([ras.result()])
        manifest.stall["complete"] = True
        manifest.stall["processes_asked"] = len(procs)
        manifest.stall["collect_s"] = round((self.wall() - now).total_seconds(), 3)
        note([])
        from ncclscope.evidence.rows import evidence_rows

        self.rows = evidence_rows(manifest, folder, self.collections)
        self.cpu_s += time.process_time() - cpu0 + _children_cpu() - child0
        self.last = (manifest, folder)

    def _ask_process(self, folder: Path, proc: Any) -> list[Ask]:
        """A dump and a stack from one process: its own answers first; a stack from
        outside (py-spy) where it gave none."""
        from ncclscope.evidence.stacks import take_stack
        from ncclscope.evidence.torch_dump import request_dump, request_py_stack

        t = self.config.ask_timeout_s
        state = process_state(proc.pid)
        asks = [request_dump(folder, proc, timeout_s=t)]
        if asks[0].outcome == "no_answer":
            # A process that did not answer its own server will not answer for its
            # stack either: the bound goes to py-spy, which needs no answer from it.
            own = Ask("stack", proc.target, "control_plane", "skipped",
                      why="the process did not answer for its dump", pid=proc.pid,
                      rank=proc.rank)  # fmt: skip
        else:
            own = request_py_stack(folder, proc, timeout_s=t)
        asks.append(own)
        if own.outcome != "answered":
            asks.append(
                take_stack(folder, proc.pid, rank=proc.rank, timeout_s=t, py_spy=self.config.py_spy)
            )
        for a in asks:
            a.state = state
        return asks

    def _tails(self, folder: Path, paths: list[str]) -> list[Ask]:
        out = []
        used: set[str] = set()
        for path in paths:
            base = _slug(Path(path).name) or "log"
            name = base
            k = 1
            while name in used:  # two followed files of one name in different folders
                k += 1
                name = f"{base}-{k}"
            used.add(name)
            rel = f"logs/{name}.tail"
            try:
                size = _tail(Path(path), folder / rel)
            except OSError as e:
                out.append(
                    Ask("log_tail", path, "file", "error", why=f"cannot read: {e.strerror or e}")
                )
                continue
            out.append(Ask("log_tail", path, "file", "answered", file=rel, size_bytes=size))
        return out

    def _telemetry(
        self, folder: Path, telemetry_dir: Path | None, stall: dict[str, Any]
    ) -> list[Ask]:
        """The node's samples since a minute before the stall began, as one part that
        ``analyze --telemetry`` reads (parts written so far; the agent's buffer of the
        last seconds is not flushed from this thread)."""
        if telemetry_dir is None:
            return []
        import polars as pl

        from ncclscope.agent.telemetry import read_telemetry

        since = stall.get("since_utc")
        start = None
        if isinstance(since, str):
            try:
                start = datetime.fromisoformat(since.replace("Z", "+00:00")) - timedelta(seconds=60)
            except ValueError:
                start = None
        problems: list[Any] = []
        parts = sorted(telemetry_dir.glob("part-*.parquet"))
        frame = read_telemetry(parts, problems=problems) if parts else None
        if frame is None or frame.is_empty():
            return [
                Ask("telemetry", str(telemetry_dir), "file", "unavailable", why="no samples yet")
            ]
        if start is not None:
            frame = frame.filter(pl.col("ts") >= start)
        rel = "telemetry-stall.parquet"
        frame.write_parquet(folder / rel, compression="zstd")
        return [
            Ask(
                "telemetry",
                str(telemetry_dir),
                "file",
                "answered",
                file=rel,
                size_bytes=(folder / rel).stat().st_size,
            )
        ]


def _tail(src: Path, dest: Path) -> int:
    """The last ``TAIL_BYTES`` of ``src`` from a line start, into ``dest``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with src.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        start = max(0, size - TAIL_BYTES)
        fh.seek(start)
        data = fh.read(TAIL_BYTES)
    if start > 0:
        cut = data.find(b"\n")
        data = data[cut + 1 :] if cut >= 0 else b""
    dest.write_bytes(data)
    return len(data)


def _children_cpu() -> float:
    """CPU seconds of this process's waited-for children (py-spy runs)."""
    t = os.times()
    return t.children_user + t.children_system
