"""The live window's reference analysis (``analyze``'s pipeline), optionally in a
short-lived process of its own.

A whole analysis touches most of polars: run in the agent, it left ~45 MB of polars'
code and the analysis's working set resident for the agent's life, though it runs only
when lines that change who is who arrive and then every few minutes.  Run in a process
that exits when it is done, the agent keeps only what its live path reads between
analyses: the analysis's identity and framework tables (``Reference.analysis``, without
its collectives table, which the live progress replaces) and the rows only a whole
analysis tells.  The price is the process's start (~0.4 s of CPU on a 2-core EPYC),
counted in the agent's ``detect`` collector with the analysis itself.  The analysis
comes back pickled apart and is unpickled only when a stall may be there to read
(``progress.might_stall``): a healthy job's agent runs no polars at all between
analyses, and its memory stays that of the imports and its live state.

The request travels as a JSON file and the answer as a pickle, both in the agent's own
private folder; the process exits non-zero with its error on stderr.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path

from ncclscope.agent.exporter import Rows
from ncclscope.agent.live import diagnosis_rows, timeout_of
from ncclscope.agent.progress import MemberIndex
from ncclscope.analysis import Analysis, build
from ncclscope.diagnose import diagnose
from ncclscope.parsers.common import parse_zone, zone_name

__all__ = [
    "AnalysisFailedError",
    "AnalysisStoppedError",
    "IsolatedAnalysis",
    "Reference",
    "reference",
]

#: polars' thread pool in the analysis process: a guest on a training node does not
#: take every core for a few seconds' work (as ``entry`` sets it for the CLI; the user's own
#: POLARS_MAX_THREADS wins)
ANALYSIS_THREADS = "1"


#: the process's program: ``main`` imported from this module (run as ``-m``, the module
#: would be ``__main__`` and the answer's class one the agent cannot unpickle)
_MAIN = "import sys; from ncclscope.agent.reference import main; sys.exit(main(sys.argv[1:]))"


class AnalysisFailedError(RuntimeError):
    """The analysis process failed: its exit status and the last line it wrote."""


class AnalysisStoppedError(AnalysisFailedError):
    """The agent is stopping: the analysis was not run, or was ended (nothing failed)."""


@dataclass(frozen=True)
class Reference:
    """What the agent keeps of one reference analysis of its window."""

    #: the analysis's inputs (the window's files), by file id
    paths: list[str]
    #: its identity members, for the live rows read every tick
    members: MemberIndex
    #: (host, pid) of every rank it knows: the processes the agent watches
    rank_pids: list[tuple[str, int]]
    #: ``live.diagnosis_rows``: lateness, findings, errors, bandwidth, unread lines
    rows: Mapping[str, Rows]
    #: the collective timeout in force (``live.timeout_of``)
    timeout_s: float
    #: the context's analysis (the last attempt's) without its collectives table, or
    #: its pickle: read (``analysis``) only when a stall may be there to read
    kept: Analysis | bytes
    #: peak resident memory of the process that ran it; None when run in the agent
    max_rss_bytes: int | None = None
    #: (host, rank, pid) of every rank the logs place: whose process evidence asks for
    host_ranks: list[tuple[str, int, int]] = field(default_factory=list)
    #: CPU seconds of that process, its start included; 0 when run in the agent
    cpu_s: float = 0.0
    _read: list[Analysis] = field(default_factory=list, compare=False, repr=False)

    def analysis(self) -> Analysis:
        """The analysis (``kept``), unpickled the first time it is asked for."""
        if not self._read:
            kept = self.kept
            got = pickle.loads(kept) if isinstance(kept, bytes) else kept  # our child's
            if not isinstance(got, Analysis):
                raise AnalysisFailedError("the analysis process sent no analysis")
            self._read.append(got)
        return self._read[0]


def reference(
    paths: list[str],
    workdir: Path,
    *,
    stamped: bool,
    now: datetime | None,
    log_zone: tzinfo | None = None,
) -> Reference:
    """``analyze``'s pipeline over the window's files ``paths`` (``LiveWindow.write``);
    ``stamped``: their NCCL times are the arrival stamps the window wrote; ``log_zone``:
    the zone the job's times were written in (``build``)."""
    diagnosis = diagnose(
        build(
            paths,
            workdir=workdir,
            coll_ts_source="stamped" if stamped else "nccl",
            log_zone=log_zone,
        ),
        now=now,
    )
    # The live progress stands in for the collectives (LiveContext): the table, a
    # scan of Parquet files the next analysis replaces, stays behind.
    analysis = dataclasses.replace(diagnosis.context.analysis, collectives=None)
    ranks = analysis.identity.ranks
    return Reference(
        paths=list(diagnosis.analysis.paths),
        members=MemberIndex.of(analysis.identity.members),
        rank_pids=[
            (str(h), int(p))
            for h, p in zip(ranks["host"], ranks["pid"], strict=True)
            if h is not None and p is not None
        ],
        host_ranks=[
            (str(h), int(r), int(p))
            for h, r, p in zip(ranks["host"], ranks["rank"], ranks["pid"], strict=True)
            if h is not None and r is not None and p is not None
        ],
        rows=diagnosis_rows(diagnosis),
        timeout_s=timeout_of(diagnosis),
        kept=analysis,
    )


class IsolatedAnalysis:
    """Runs ``reference`` in a new Python process, one at a time; ``stop`` ends one
    that is running (the agent is stopping: its result would be stale)."""

    def __init__(self, *, timeout_s: float = 600.0) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopped = False

    def run(
        self,
        paths: list[str],
        workdir: Path,
        *,
        stamped: bool,
        now: datetime | None,
        log_zone: tzinfo | None = None,
    ) -> Reference:
        workdir.mkdir(parents=True, exist_ok=True)
        request, answer = workdir / "request.json", workdir / "reference.pickle"
        answer.unlink(missing_ok=True)
        request.write_text(
            json.dumps(
                {
                    "paths": paths,
                    "workdir": str(workdir / "analysis"),
                    "stamped": stamped,
                    "now": now.isoformat() if now is not None else None,
                    "log_zone": zone_name(log_zone) if log_zone is not None else None,
                    "answer": str(answer),
                }
            )
        )
        env = dict(os.environ)
        env.setdefault("POLARS_MAX_THREADS", ANALYSIS_THREADS)
        with self._lock:
            if self._stopped:
                raise AnalysisStoppedError("the agent is stopping")
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _MAIN, str(request)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
            )
        proc = self._proc
        try:
            _out, err = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise AnalysisFailedError(
                f"the window's analysis took over {self.timeout_s:.0f} s and was stopped"
            ) from None
        finally:
            with self._lock:
                self._proc = None
        if self._stopped:
            raise AnalysisStoppedError("the agent is stopping")
        if proc.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            last = lines[-1] if lines else "no message"
            raise AnalysisFailedError(
                f"the window's analysis process exited with status {proc.returncode}: {last}"
            )
        with answer.open("rb") as f:
            got = pickle.load(f)  # our own child wrote it, in our private folder
        if not isinstance(got, Reference):
            raise AnalysisFailedError(f"{answer} holds no reference analysis")
        return got

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()


def main(argv: list[str]) -> int:
    """The analysis process, given its request's path (``IsolatedAnalysis.run``)."""
    req = json.loads(Path(argv[0]).read_text())
    now = datetime.fromisoformat(req["now"]) if req["now"] is not None else None
    zone = parse_zone(req["log_zone"]) if req.get("log_zone") else None
    ref = reference(
        req["paths"], Path(req["workdir"]), stamped=req["stamped"], now=now, log_zone=zone
    )
    usage = resource.getrusage(resource.RUSAGE_SELF)
    ref = dataclasses.replace(
        ref,
        # pickled apart: the agent unpickles it only when a stall may be there to read
        kept=pickle.dumps(ref.analysis(), protocol=pickle.HIGHEST_PROTOCOL),
        max_rss_bytes=usage.ru_maxrss * 1024,  # kB on Linux
        cpu_s=time.process_time(),
        _read=[],
    )
    answer = Path(req["answer"])
    part = answer.with_suffix(".part")
    with part.open("wb") as f:
        pickle.dump(ref, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(part, answer)
    return 0
