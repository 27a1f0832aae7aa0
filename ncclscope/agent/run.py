"""The agent's loop: sample, follow, detect, export, on a fixed drift-free schedule.

Each tick (default 1 s) samples NVML and the host, polls the followed logs into the live
window, and replaces the collectors' rows on the board; every ``analyse_s`` the window
goes through the detectors.  Ticks are scheduled from the start time (tick k at
start + k x interval), so a slow tick does not shift the ones after it; a tick that
overran is skipped, not queued.  ``run`` returns when ``stop`` is set (SIGTERM/SIGINT in
the CLI), within one wait: it then flushes the telemetry and the textfile.
"""

from __future__ import annotations

import logging
import math
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Any, Protocol

from ncclscope.agent.exporter import Board, MetricsServer, Rows, identity_rows, write_textfile
from ncclscope.agent.live import LiveWindow, countdown_rows
from ncclscope.agent.nvml import NvmlCollector
from ncclscope.agent.progress import LiveContext, LiveProgress, member_rows, might_stall
from ncclscope.agent.reference import (
    AnalysisFailedError,
    AnalysisStoppedError,
    IsolatedAnalysis,
    Reference,
    reference,
)
from ncclscope.agent.rollup import NodeRollup
from ncclscope.agent.telemetry import TelemetryWriter
from ncclscope.agent.topology import collector_topology, link_rows
from ncclscope.detect.timeout import countdown
from ncclscope.detect.waits import BOUND_METRIC, MIN_HISTORY
from ncclscope.evidence.collect import CollectConfig, EvidenceCollector
from ncclscope.hosts import short_host

__all__ = ["Agent", "AgentConfig", "LineSource", "gpu_rows", "host_rows"]

_log = logging.getLogger(__name__)


class LineSource(Protocol):
    """Where followed lines come from: the live follower, or a replay."""

    def poll(self) -> Sequence[Any]: ...


@dataclass
class AgentConfig:
    """What ``ncclscope agent`` was asked to do."""

    follow: list[str] = field(default_factory=list)
    listen: str | None = None
    interval_s: float = 1.0
    #: the shortest time between two reference analyses of the window, run when lines
    #: that change what it says arrive (a new member, an NCCL WARN, a watchdog line)
    analyse_s: float = 5.0
    #: while lines arrive but none of those, a reference analysis this often (findings,
    #: lateness, errors); stalls, sequences and countdowns follow every tick anyway
    refresh_s: float = 300.0
    out: Path | None = None
    part_s: float = 10.0
    textfile: Path | None = None
    pids: list[int] = field(default_factory=list)
    match: str | None = None
    window_lines: int = 100_000
    hostname: str | None = None
    from_start: bool = False
    #: where sysfs is mounted, for the GPUs' PCIe paths (read once at start); None: skip
    sysfs_root: Path | None = Path("/sys")
    #: run the detectors in a thread of their own, so that a run over the window never
    #: delays a sample or a stop (the CLI's choice); off, ``tick()`` runs them in place
    #: and their rows are on the board when it returns (tests, replays driven by hand)
    detect_in_thread: bool = False
    #: the zone the job's logs print their times in (NCCL: the node's local time);
    #: None: learned from the lines' arrival times
    log_zone: tzinfo | None = None
    #: run each reference analysis in a short-lived process of its own
    #: (``agent.reference``): the agent's memory stays that of its live state (the
    #: CLI's choice); off, in the agent (tests, replays driven by hand)
    isolate_analysis: bool = False
    #: where evidence folders go at a stall (``ncclscope.evidence``); None: none taken
    evidence_out: Path | None = None
    #: when to take them: a stall's age as a fraction of the collective timeout
    #: (``0.5``), or seconds (``collect_at_s``) where given
    collect_at: float = 0.5
    collect_at_s: float | None = None
    #: the most one ask (a dump, a stack, RAS) may take
    ask_timeout_s: float = 5.0


def gpu_rows(
    statics: Sequence[Any], samples: Sequence[Any], xids: dict[tuple[int, int], int] | None = None
) -> dict[str, Rows]:
    """Catalog rows of the GPUs' static facts, latest samples and XID counts."""
    rows: dict[str, list[tuple[tuple[str, ...], float]]] = {}

    def put(name: str, labels: tuple[str, ...], value: float | None) -> None:
        if value is not None:
            rows.setdefault(name, []).append((labels, float(value)))

    ids = {}
    for s in statics:
        key = (str(s.index), str(s.uuid), str(s.pci_bus_id))
        ids[s.index] = key
        put("ncclscope_gpu_info", (*key, str(s.name)), 1.0)
        put("ncclscope_gpu_memory_total_bytes", key, s.memory_total_bytes)
        put("ncclscope_gpu_pcie_link_max_bytes_per_second", key, s.pcie_link_max_bytes_per_second)
        put("ncclscope_gpu_power_limit_watts", key, s.power_limit_watts)
    for g in samples:
        found = ids.get(g.index)
        if found is None:
            continue
        key = found
        put("ncclscope_gpu_memory_used_bytes", key, g.memory_used_bytes)
        put("ncclscope_gpu_utilization_ratio", key, g.utilization_gpu_ratio)
        put("ncclscope_gpu_pcie_tx_bytes_per_second", key, g.pcie_tx_bytes_per_second)
        put("ncclscope_gpu_pcie_rx_bytes_per_second", key, g.pcie_rx_bytes_per_second)
        put("ncclscope_gpu_pcie_link_generation", key, g.pcie_link_gen)
        put("ncclscope_gpu_pcie_link_width", key, g.pcie_link_width)
        put("ncclscope_gpu_clocks_event_reasons", key, g.clocks_event_reasons)
        put("ncclscope_gpu_temperature_celsius", key, g.temperature_celsius)
        put("ncclscope_gpu_power_watts", key, g.power_watts)
        put("ncclscope_gpu_ecc_uncorrected_errors_total", key, g.ecc_uncorrected_total)
        for pid, used in g.processes or ():
            put("ncclscope_gpu_process_memory_used_bytes", (*key, str(pid)), used)
    for (index, xid), n in sorted((xids or {}).items()):
        if index in ids:
            put("ncclscope_gpu_xid_errors_total", (*ids[index], str(xid)), n)
    return dict(rows.items())


def host_rows(sample: Any) -> dict[str, Rows]:
    """Catalog rows of a host sample and its job processes."""
    rows: dict[str, Rows] = {
        "ncclscope_host_memory_total_bytes": [((), sample.memory_total_bytes)],
        "ncclscope_host_memory_available_bytes": [((), sample.memory_available_bytes)],
        "ncclscope_host_swap_used_bytes": [((), sample.swap_used_bytes)],
        "ncclscope_host_swap_in_bytes_total": [((), sample.swap_in_bytes_total)],
        "ncclscope_host_swap_out_bytes_total": [((), sample.swap_out_bytes_total)],
        "ncclscope_host_cpu_utilization_ratio": [((), sample.cpu_ratio)],
        "ncclscope_process_resident_memory_bytes": [
            ((str(p.pid),), p.rss_bytes) for p in sample.processes
        ],
        "ncclscope_process_cpu_seconds_total": [
            ((str(p.pid),), p.cpu_seconds_total) for p in sample.processes
        ],
    }
    return {k: [(labels, v) for labels, v in series if v is not None] for k, series in rows.items()}


@dataclass
class _Health:
    success: dict[str, bool] = field(default_factory=dict)
    duration: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)

    def timed(self, name: str, fn: Callable[[], bool]) -> None:
        """Run a collector; it returns whether it succeeded."""
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            ok = fn()
        # A sidecar that runs for days: any collector's failure becomes a metric (and a
        # log line), never the end of the agent.
        except Exception:  # noqa: BLE001
            _log.exception("collector %s failed", name)
            ok = False
        self.success[name] = ok
        self.duration[name] = time.perf_counter() - wall
        self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - cpu

    def rows(self) -> dict[str, Rows]:
        return {
            "ncclscope_scrape_collector_success": [
                ((k,), float(v)) for k, v in self.success.items()
            ],
            "ncclscope_scrape_collector_duration_seconds": [
                ((k,), v) for k, v in self.duration.items()
            ],
            "ncclscope_sample_cpu_seconds_total": [((k,), v) for k, v in self.cpu.items()],
        }


@dataclass(frozen=True)
class _Reference:
    """The last reference analysis of the window (``analyze``'s pipeline): who is who,
    and what only a whole analysis tells (``live.diagnosis_rows``)."""

    got: Reference
    #: followed path -> its file id in the analysis
    file_ids: dict[str, int]


@dataclass
class _Seen:
    """What the window and the live progress had taken in when a reference analysis
    started (it says nothing of what came after)."""

    added: int = -1
    members: int = 0
    notable: int = 0


class Agent:
    """One agent: collectors, the live window, the board and its outputs.

    ``nvml`` is the NVML collector (``agent.nvml.NvmlCollector``) or None; ``host`` the
    psutil collector; ``lines`` where followed lines come from.  All are seams for
    tests and replay.
    """

    def __init__(
        self,
        config: AgentConfig,
        *,
        nvml: Any = None,
        host: Any = None,
        lines: LineSource | None = None,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        recorded: Any = None,
    ) -> None:
        self.config = config
        self.nvml = nvml
        self.host = host
        self.lines = lines
        self.wall = wall
        #: recorded telemetry to replay (``replay.TelemetryReplay``), in place of sampling
        self.recorded = recorded
        self.board = Board()
        self.health = _Health()
        self.hostname = config.hostname or socket.gethostname()
        self.board.set("identity", identity_rows(self.hostname))
        self.telemetry = (
            TelemetryWriter(config.out, self.hostname, part_s=config.part_s)
            if config.out is not None
            else None
        )
        self.bound: tuple[str, int] | None = None
        #: the /metrics server, once started with ``listen``
        self.server: MetricsServer | None = None
        self.lines_read = 0
        self.bytes_read = 0
        self._last_analysis = -math.inf
        self.nvml_message: str | None = None
        #: the GPUs' PCIe uplinks (``agent.topology``), read once at start, sent each tick
        self.topology_rows: dict[str, Rows] = {}
        #: guards the window: the sampling thread adds lines, a detector run copies it
        self._window_lock = threading.Lock()
        self._detector: threading.Thread | None = None
        self._finished = False
        self._workdir = tempfile.TemporaryDirectory(
            prefix="ncclscope-agent-", ignore_cleanup_errors=True
        )
        self.window = LiveWindow(Path(self._workdir.name) / "window", max_lines=config.window_lines)
        #: every member's progress, line by line: what the job rows are read from
        self.progress = LiveProgress(zone=config.log_zone)
        self._reference: _Reference | None = None
        self._isolated = IsolatedAnalysis() if config.isolate_analysis else None
        self._seen = _Seen()
        #: stalls (communicator, sequence) that asked for an analysis of their own, and
        #: whether one is owed: the window's history up to a stall gives the bound the
        #: rules name it by (``detect.waits``) and the hang finding, minutes before a
        #: refresh would
        self._stalls_analysed: set[tuple[str, int]] = set()
        self._stall_due = False
        #: the most collectives a member had logged when the last analysis started: an
        #: analysis that found too little history for a bound is run again once that
        #: has doubled (a node that sees no stall of its own needs the bound too)
        self._history_calls = 0
        #: (progress version, reference) -> its live context and member rows
        self._live: tuple[tuple[int, int, bool], LiveContext | None, Mapping[str, Rows]] | None = (
            None
        )
        #: the job's rows as exported: the node's summary per communicator added
        self._rollup = NodeRollup()
        self.collector: EvidenceCollector | None = None
        if config.evidence_out is not None:
            self.collector = EvidenceCollector(
                CollectConfig(
                    out=config.evidence_out,
                    host=short_host(self.hostname),
                    ask_timeout_s=config.ask_timeout_s,
                    pids=list(config.pids),
                    match=config.match,
                ),
                wall=wall,
            )
        #: the last collection exported (its rows are computed once per collection), and
        #: when the node's members last logged a collective as it was
        self._evidence_rows: tuple[int, dict[str, Rows]] = (0, {})
        self._evidence_seen: datetime | None = None

    # -- collectors ---------------------------------------------------------------------

    def _sample_nvml(self) -> bool:
        if self.nvml is None:
            return False  # no driver: said once at start, reported as a failed collector
        samples = self.nvml.sample()
        rows = gpu_rows(self.nvml.statics, samples, getattr(self.nvml, "xid_counts", {}))
        rows.update(self.topology_rows)
        self.board.set("nvml", rows)
        self._record(rows)
        return bool(getattr(self.nvml, "ok", True))

    def _sample_host(self) -> bool:
        rows = host_rows(self.host.sample())
        self.board.set("host", rows)
        self._record(rows)
        return True

    def _follow(self) -> bool:
        if self.lines is None:
            return True
        poll_texts = getattr(self.lines, "poll_texts", None)
        if poll_texts is not None:  # the follower: runs of one file's texts
            batches: list[tuple[str, list[str], datetime]] = poll_texts()
        else:  # a seam's lines (replay, tests), one at a time; paths are str there too
            batches = [(x.path, [x.text.rstrip("\n")], x.arrived) for x in self.lines.poll()]
        with self._window_lock:
            self.window.add_texts(batches)
        self.progress.add_texts(batches, own_times=self.window.own_times)
        stats = getattr(self.lines, "stats", None)
        if stats is not None:  # the follower counts bytes as read, incomplete lines too
            self.lines_read, self.bytes_read = stats.lines_read, stats.bytes_read
            files = stats.files_followed
        else:
            self.lines_read += sum(len(texts) for _p, texts, _a in batches)
            self.bytes_read += sum(len(t) + 1 for _p, texts, _a in batches for t in texts)
            files = self.window.files
        self.board.set(
            "logs",
            {
                "ncclscope_log_lines_read_total": [((), float(self.lines_read))],
                "ncclscope_log_bytes_read_total": [((), float(self.bytes_read))],
                "ncclscope_log_files_followed": [((), float(files))],
            },
        )
        return True

    def _detect(self) -> bool:
        """The job's rows from the live progress, every tick (ages and seconds left move
        with the clock even when no line came); a reference analysis of the window when
        one is due (``_due``)."""
        now = self.wall()
        if self._due():
            self._start_reference()
        self._publish(now)
        return True

    def _due(self) -> bool:
        """A reference analysis is due when lines came since the last one started, and
        either they hold a new member or a notable line (``progress.NOTABLE``), or a new
        stall began, and ``analyse_s`` has passed, or ``refresh_s`` has; never while one
        runs."""
        if self._detector is not None and self._detector.is_alive():
            return False  # the last run is still going: no queue of runs behind it
        seen, p = self._seen, self.progress
        if self.window.added == seen.added:
            return False  # nothing new: an unchanged window is never read again
        since = time.monotonic() - self._last_analysis
        if (
            self._reference is None
            or self._stall_due
            or self._history_short()
            or p.new_members != seen.members
            or p.notable != seen.notable
        ):
            return since >= self.config.analyse_s
        return since >= self.config.refresh_s

    def _history_short(self) -> bool:
        """The last analysis knew no stall bound (``detect.waits``) though the job's
        lines carry times, and members have logged twice the collectives since."""
        ref = self._reference
        if ref is None or not self.window.own_times or BOUND_METRIC in ref.got.rows:
            return False
        return self.progress.most_calls() >= max(MIN_HISTORY, 2 * self._history_calls)

    def _start_reference(self) -> None:
        self._last_analysis = time.monotonic()
        self._stall_due = False
        self._history_calls = self.progress.most_calls()
        p = self.progress
        self._seen = _Seen(self.window.added, p.new_members, p.notable)
        if not self.config.detect_in_thread:
            self.health.timed("detect", self._reference_once)
            return
        self._detector = threading.Thread(
            target=self._detect_thread,
            name="ncclscope-detect",
            daemon=True,  # a stop never waits for a run: its rows would be stale anyway
        )
        self._detector.start()

    def _detect_thread(self) -> None:
        self.health.timed("detect", self._reference_once)
        if self._finished:  # the agent stopped during this run: the folder goes now
            self._workdir.cleanup()

    def _reference_once(self) -> bool:
        work = Path(self._workdir.name) / "live"
        now = self.wall()
        copied = self.window.copy_out(work, lock=self._window_lock)
        if copied is None:
            return True
        paths, stamped = copied
        zone = self._log_zone()  # stamped: NCCL's times are UTC arrivals, the rest not
        if self._isolated is None:
            got = reference(paths, work / "analysis", stamped=stamped, now=now, log_zone=zone)
        else:
            try:
                got = self._isolated.run(paths, work, stamped=stamped, now=now, log_zone=zone)
            except AnalysisStoppedError:
                return True  # the agent is stopping: nothing to say
            except AnalysisFailedError as e:
                # Said without a traceback (the process's own error is in it); the
                # live rows go on from the last analysis.
                _log.error("%s", e)
                return False
            # Its CPU is the agent's too (the detect collector's account), and its peak
            # memory is exported: the agent's own RSS no longer shows it.
            self.health.cpu["detect"] = self.health.cpu.get("detect", 0.0) + got.cpu_s
            if got.max_rss_bytes is not None:
                self.board.set(
                    "analysis",
                    {"ncclscope_analysis_max_rss_bytes": [((), float(got.max_rss_bytes))]},
                )
        self._reference = _Reference(got, self.window.file_ids(got.paths))
        self._learn_pids(got.rank_pids)
        return True

    def _log_zone(self) -> tzinfo | None:
        """The zone the job's times were written in: named, else the offset learned
        from its lines' arrivals (``LiveProgress._learn``), else unknown (UTC)."""
        p = self.progress
        if p.zone is not None:
            return p.zone
        return timezone(timedelta(seconds=p.offset_s)) if p.offset_s else None

    def _publish(self, now: datetime) -> None:
        """The job's rows at ``now``: the members' rows are computed again only when a
        line or a reference analysis changed them; the stalls only once a member has
        been silent for an ``interval`` (until then a collective some members entered
        and others not is one the poll cut through: reading it every tick on a healthy
        job would cost more than all the rest); the countdown is arithmetic on them as
        the clock moves."""
        ref = self._reference
        if ref is None:
            return
        silent = self.progress.silent(now, self.config.interval_s)
        key = (self.progress.version, id(ref), silent)
        got = ref.got
        if self._live is None or self._live[0] != key:
            ctx = None
            if silent and might_stall(self.progress, got.members, ref.file_ids):
                ctx = LiveContext(
                    got.analysis(), now=now, live=self.progress, file_ids=ref.file_ids
                )
            self._live = (key, ctx, member_rows(self.progress, got.members, ref.file_ids))
        _key, ctx, rows = self._live
        pending = countdown(ctx, now, got.timeout_s) if ctx is not None else None
        counted = countdown_rows(pending) if pending is not None else {}
        if pending is not None and len(pending):
            stalled = {(str(c), int(q)) for c, q in pending.select("comm_key", "seq").iter_rows()}
            if not stalled <= self._stalls_analysed:
                self._stalls_analysed |= stalled
                self._stall_due = True
        self.board.set("job", self._rollup({**got.rows, **rows, **counted}, now.timestamp()))
        if self.collector is not None and silent:
            self._maybe_collect(now, pending)

    def collect_threshold_s(self) -> float | None:
        """A stall's age at which evidence is taken (``--collect-at``)."""
        ref = self._reference
        if self.config.collect_at_s is not None:
            return self.config.collect_at_s
        return ref.got.timeout_s * self.config.collect_at if ref is not None else None

    def _maybe_collect(self, now: datetime, pending: Any) -> None:
        """Start a collection once per stall past the threshold: a collective some
        members of this node entered and others not, or, on the node whose members all
        went quiet with nothing pending (the culprit's node: a rank stuck in Python, or
        frozen), that silence."""
        collector, ref = self.collector, self._reference
        threshold = self.collect_threshold_s()
        if collector is None or ref is None or threshold is None or collector.running():
            return
        stall: dict[str, Any] | None = None
        key: tuple[str, int] | None = None
        if pending is not None:
            for r in pending.iter_rows(named=True):
                age = r["age_s"]
                if age is None or age < threshold:
                    continue
                key = (str(r["comm_key"]), int(r["seq"]))
                since = r["since"]
                stall = {
                    "comm": key[0],
                    "seq": key[1],
                    "op": r["op"],
                    "waited_s": round(float(age), 3),
                    "timeout_s": r["timeout_s"],
                    "entered_ranks": list(r["entered_ranks"]),
                    "culprit_ranks": list(r["culprit_ranks"]),
                    "culprit_hosts": list(r["culprit_hosts"]),
                    "since_utc": since.astimezone(UTC).isoformat() if since is not None else None,
                }
                break
        if key is None:
            last = self.progress.last_seen()
            if last is None or self.progress.most_calls() < MIN_HISTORY:
                return
            quiet = (now - last).total_seconds()
            if quiet < threshold:
                return
            key = ("quiet", int(last.timestamp()))
            stall = {
                "comm": None,
                "quiet_s": round(quiet, 3),
                "timeout_s": ref.got.timeout_s,
                "since_utc": last.astimezone(UTC).isoformat(),
            }
        if stall is None or collector.asked(key):
            return
        stall["threshold_s"] = threshold
        host = short_host(self.hostname)
        collector.maybe_collect(
            key,
            stall,
            tails=self.window.file_paths(),
            telemetry_dir=self.config.out,
            expected=[(r, p) for h, r, p in ref.got.host_ranks if h == host],
            wait=not self.config.detect_in_thread,
        )

    def _publish_evidence(self, collector: EvidenceCollector) -> None:
        """The last collection's rows, once each; gone (but the count) once the node's
        members log a collective again: the stall they describe is over."""
        last = collector.last
        if last is None:
            return
        seen = self.progress.last_seen()
        if self._evidence_rows[0] != id(last):
            rows: dict[str, Rows] = dict(collector.rows)
            self._evidence_rows = (id(last), rows)
            self._evidence_seen = seen
            self.board.set("evidence", rows)
        elif self._evidence_seen != seen and self._evidence_rows[1]:
            total = "ncclscope_evidence_collections_total"
            kept = {total: collector.rows[total]} if total in collector.rows else {}
            self._evidence_rows = (id(last), {})
            self.board.set("evidence", kept)

    def _learn_pids(self, rank_pids: list[tuple[str, int]]) -> None:
        """Without --pid or --match, watch the processes the logs name on this host."""
        if self.host is None or self.config.pids or self.config.match:
            return
        short = short_host(self.hostname)
        pids = [pid for host, pid in rank_pids if host == short]
        if pids and hasattr(self.host, "set_pids"):
            self.host.set_pids(pids)

    def _record(self, rows: dict[str, Rows]) -> None:
        if self.telemetry is not None:
            self.telemetry.add(self.wall(), rows)

    def tick(self) -> None:
        """One round of every collector."""
        if self.nvml is not None or self.nvml_message is not None:
            self.health.timed("nvml", self._sample_nvml)
        if self.host is not None:
            self.health.timed("host", self._sample_host)
        if self.recorded is not None:
            self.board.set("telemetry", self.recorded.rows_until(self.wall()))
        if self.lines is not None:
            # The clock the job's ages are read against (a replay's runs at its speed):
            # the rules measure a wait from it, not from Prometheus' own time.
            clock: dict[str, Rows] = {
                "ncclscope_clock_timestamp_seconds": [((), self.wall().timestamp())]
            }
            if self.progress.offset_s is not None:
                learned: dict[str, Rows] = {
                    "ncclscope_log_utc_offset_seconds": [((), self.progress.offset_s)]
                }
                clock.update(learned)
                # Kept with the samples: analyze --telemetry reads the logs in it.
                self._record(learned)
            self.board.set("clock", clock)
            self.health.timed("logs", self._follow)
            self.health.timed("progress", self._detect)
        if self.collector is not None:
            self._publish_evidence(self.collector)
        self.board.set("health", self.health.rows())
        if self.server is not None:
            # Published here, once a tick, not at each 503: a board that changed at
            # every rejection would be rendered again for every scrape that got through.
            self.board.set("http", self.server.rows())
        if self.telemetry is not None:
            self.telemetry.maybe_flush()
        if self.config.textfile is not None:
            write_textfile(self.board, self.config.textfile)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start NVML and the HTTP endpoint."""
        if self.nvml is not None:
            self.nvml_message = self.nvml.start()
            if self.nvml_message is not None:
                # The CLI says it once on stderr; the log keeps it for -v runs.
                _log.info("%s", self.nvml_message)
                self.nvml = None
            elif isinstance(self.nvml, NvmlCollector):
                topo = collector_topology(self.nvml, sysfs_root=self.config.sysfs_root)
                keys = {
                    s.index: (str(s.index), str(s.uuid), str(s.pci_bus_id))
                    for s in self.nvml.statics
                }
                self.topology_rows = dict(link_rows(topo, keys))
        if self.config.listen:
            self.server = MetricsServer(self.board, self.config.listen)
            self.server.start()
            self.bound = self.server.address

    def run(self, stop: threading.Event, *, ticks: int | None = None) -> None:
        """Tick on schedule until ``stop`` is set (or ``ticks`` ticks have run)."""
        interval = self.config.interval_s
        start = time.monotonic()
        k = 0
        while not stop.is_set() and (ticks is None or k < ticks):
            self.tick()
            k += 1
            # The next tick on the grid; one that is already past is skipped.
            k = max(k, math.ceil((time.monotonic() - start) / interval))
            stop.wait(max(0.0, start + k * interval - time.monotonic()))
        self.finish()

    def finish(self) -> None:
        """Flush what was sampled: the last textfile and telemetry part."""
        if self.config.textfile is not None:
            write_textfile(self.board, self.config.textfile)
        if self.telemetry is not None:
            self.telemetry.flush()
        if self.nvml is not None:
            self.nvml.close()
        self._finished = True
        if self._isolated is not None:
            self._isolated.stop()
        running = self._detector is not None and self._detector.is_alive()
        with self._window_lock:  # waits only while a run copies the window
            self.window.close()
        if not running:  # else the run still reads it, and removes it when it ends
            self._workdir.cleanup()
