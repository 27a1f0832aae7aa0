"""The window's reference analysis in a process of its own (``agent.reference``): it says
what the analysis in the agent says, fails with a message, and leaves the agent without
polars' working set on a healthy job."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import scrape_metrics

from ncclscope.agent.live import LiveWindow
from ncclscope.agent.reference import (
    AnalysisFailedError,
    AnalysisStoppedError,
    IsolatedAnalysis,
    reference,
)
from ncclscope.agent.replay import ReplaySource
from ncclscope.agent.run import Agent, AgentConfig

REPO = Path(__file__).resolve().parent.parent
STALLED = REPO / "fixtures" / "stalled-227-ts" / "job.log"
NOW = datetime(2026, 11, 27, 12, tzinfo=UTC)


def _window(tmp_path: Path) -> LiveWindow:
    window = LiveWindow(tmp_path / "window", max_lines=10**6)
    lines = STALLED.read_text(encoding="utf-8").splitlines()
    window.add((str(STALLED), text, NOW) for text in lines)
    window.close()
    return window


def test_the_analysis_process_says_what_the_agent_would(tmp_path: Path) -> None:
    window = _window(tmp_path)
    copied = window.copy_out(tmp_path / "copy")
    assert copied is not None
    paths, stamped = copied
    here = reference(paths, tmp_path / "here", stamped=stamped, now=NOW)
    there = IsolatedAnalysis().run(paths, tmp_path / "there", stamped=stamped, now=NOW)
    assert there.rows == here.rows
    assert there.members == here.members
    assert there.rank_pids == here.rank_pids
    assert there.timeout_s == here.timeout_s
    assert there.paths == here.paths
    # The analysis comes back pickled, read only when asked for.
    assert isinstance(there.kept, bytes)
    assert there.analysis().identity.members.equals(here.analysis().identity.members)
    assert there.analysis().collectives is None
    # Its own cost, for the agent's accounts.
    assert there.max_rss_bytes is not None
    assert there.max_rss_bytes > 20 * 2**20
    assert there.cpu_s > 0
    assert here.max_rss_bytes is None


def test_a_failed_analysis_process_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What any failure of the process looks like to the agent: a status and stderr.
    program = "import sys; print('Traceback ...', file=sys.stderr); sys.exit('OSError: disk full')"
    monkeypatch.setattr("ncclscope.agent.reference._MAIN", program)
    with pytest.raises(AnalysisFailedError, match=r"exited with status 1: OSError: disk full"):
        IsolatedAnalysis().run([str(STALLED)], tmp_path / "w", stamped=False, now=NOW)


def test_an_analysis_past_its_time_is_stopped(tmp_path: Path) -> None:
    with pytest.raises(AnalysisFailedError, match="was stopped"):
        IsolatedAnalysis(timeout_s=0.05).run([str(STALLED)], tmp_path / "w", stamped=False, now=NOW)


def test_a_stopped_analysis_starts_no_process(tmp_path: Path) -> None:
    runner = IsolatedAnalysis()
    runner.stop()
    with pytest.raises(AnalysisStoppedError, match="stopping"):
        runner.run([str(STALLED)], tmp_path / "w", stamped=False, now=NOW)


def test_an_analysis_ended_by_a_stop_is_no_failure(tmp_path: Path) -> None:
    runner = IsolatedAnalysis()
    ended: list[BaseException] = []

    def run() -> None:
        try:
            runner.run([str(STALLED)], tmp_path / "w", stamped=False, now=NOW)
        except AnalysisFailedError as e:
            ended.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 10
    while runner._proc is None and time.monotonic() < deadline:
        time.sleep(0.01)  # until the process runs: the stop is to end it
    runner.stop()
    worker.join(30)
    assert len(ended) == 1
    assert isinstance(ended[0], AnalysisStoppedError)


def _replayed(*, isolate: bool) -> tuple[dict[str, float], Agent]:
    clock = [0.0]
    source = ReplaySource([STALLED], speed=60.0, clock=lambda: clock[0])
    a = Agent(
        AgentConfig(
            listen="127.0.0.1:0", analyse_s=0.0, hostname="replay", isolate_analysis=isolate
        ),
        lines=source,
        wall=source.now,
    )
    a.start()
    assert a.bound is not None
    clock[0] = 5.0
    a.tick()
    assert source.done
    clock[0] = 10.0
    a.tick()
    got = scrape_metrics(a.bound[1])
    a.finish()
    return got, a


def test_the_agent_exports_the_same_hang_either_way() -> None:
    here, _ = _replayed(isolate=False)
    there, agent = _replayed(isolate=True)

    def job(metrics: dict[str, float]) -> dict[str, float]:
        skip = ("ncclscope_scrape_", "ncclscope_sample_", "ncclscope_analysis_")
        return {k: v for k, v in metrics.items() if not k.startswith(skip)}

    assert job(there) == job(here)
    assert any(k.startswith("ncclscope_timeout_culprit_info") and 'rank="6"' in k for k in there)
    assert there["ncclscope_analysis_max_rss_bytes"] > 20 * 2**20
    assert "ncclscope_analysis_max_rss_bytes" not in here
    assert there['ncclscope_scrape_collector_success{collector="detect"}'] == 1.0
    # The hang is read from the analysis the process sent back.
    ref = agent._reference
    assert ref is not None
    assert ref.got._read
