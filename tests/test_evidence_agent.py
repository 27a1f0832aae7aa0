"""The agent takes evidence once per stall past --collect-at, and exports what it found.

A replayed hang (fixtures/stalled-227-ts) drives the agent's clock; the node's "training
process" is a real Python process with a rank in its environment, stuck on a lock, so
its stack comes from a real py-spy.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_agent_run import STALLED, _Clock

from ncclscope.agent.replay import ReplaySource
from ncclscope.agent.run import Agent, AgentConfig
from ncclscope.evidence.manifest import read_manifest
from ncclscope.evidence.stacks import find_py_spy

_STUCK = """
import threading, sys
def wait_for_the_lock_nobody_releases():
    lock = threading.Lock()
    lock.acquire()
    print("ready", flush=True)
    lock.acquire()
wait_for_the_lock_nobody_releases()
"""


def _need_py_spy() -> None:
    if find_py_spy() is None:
        if os.environ.get("CI"):
            pytest.fail("py-spy is missing (pip install -e '.[test]' installs it)")
        pytest.skip("py-spy is not installed (pip install py-spy)")


def stuck_rank_process(tmp_path: Path, rank: int, world: int) -> Iterator[int]:
    """A training process's stand-in: ``RANK`` in its environment, its main thread stuck
    on a lock in ``tmp_path/train.py`` (a file, so py-spy can read its source line);
    yields its pid once it is stuck, and kills it after."""
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank % 4), WORLD_SIZE=str(world))
    script = tmp_path / "train.py"
    script.write_text(_STUCK, encoding="utf-8")
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"ready"
    yield proc.pid
    proc.kill()
    proc.wait()
    proc.stdout.close()


@pytest.fixture
def stuck_rank(tmp_path: Path) -> Iterator[int]:
    yield from stuck_rank_process(tmp_path, rank=6, world=8)


def _agent(tmp_path: Path, pid: int, **config: object) -> tuple[Agent, _Clock]:
    clock = _Clock()
    source = ReplaySource([STALLED], speed=60.0, clock=clock)
    a = Agent(
        AgentConfig(
            analyse_s=0.0, hostname="replay", pids=[pid], evidence_out=tmp_path / "out",
            **config,  # type: ignore[arg-type]
        ),
        lines=source,
        wall=source.now,
    )  # fmt: skip
    a.start()
    return a, clock


def _manifests(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "out" / "evidence").glob("*/manifest.json"))


def test_a_stall_past_the_threshold_is_collected_once(tmp_path: Path, stuck_rank: int) -> None:
    _need_py_spy()
    a, clock = _agent(tmp_path, stuck_rank, collect_at_s=200.0)
    # 60 s of the job a second: the stall (since 09:00:09) is 51, 111, 171 s old
    for t in (1.0, 2.0, 3.0):
        clock.t = t
        a.tick()
    assert a.collector is not None
    threshold = a.collect_threshold_s()
    assert threshold == 200.0
    assert _manifests(tmp_path) == []
    for t in (4.0, 5.0, 10.0, 20.0):  # 231 s and on: past it, again and again
        clock.t = t
        a.tick()
    found = _manifests(tmp_path)
    assert len(found) == 1, "one folder per stall, however often it is seen"
    m = read_manifest(found[0])
    assert m.stall["complete"] is True
    assert m.stall["culprit_ranks"] == [6]
    assert m.stall["waited_s"] >= threshold
    stack = [x for x in m.asks if x.what == "stack" and x.via == "py-spy"]
    assert [(x.rank, x.pid, x.outcome) for x in stack] == [(6, stuck_rank, "answered")]
    assert stack[0].file is not None
    text = (found[0].parent / stack[0].file).read_text()
    assert "wait_for_the_lock_nobody_releases" in text
    dump = [x for x in m.asks if x.what == "flight_dump"]
    assert [x.outcome for x in dump] == ["unavailable"]
    assert dump[0].why
    assert {x.what for x in m.asks} >= {"flight_dump", "stack", "ras", "log_tail"}
    ras = next(x for x in m.asks if x.what == "ras")
    assert ras.outcome in ("unavailable", "no_answer")
    assert "RAS" in ras.why
    tails = [x for x in m.asks if x.what == "log_tail"]
    assert tails
    assert all(x.outcome == "answered" for x in tails)
    # what it found is on /metrics, computed once
    text_metrics = _render(a)
    assert "ncclscope_evidence_collections_total 1.0" in text_metrics
    assert 'ncclscope_evidence_rank_info{frame="' in text_metrics
    line = next(
        x for x in text_metrics.splitlines() if x.startswith("ncclscope_evidence_rank_info")
    )
    assert 'rank="6"' in line
    assert 'stack="lock"' in line
    assert "wait_for_the_lock" in line
    a.finish()


def _render(a: Agent) -> str:
    from ncclscope.agent.exporter import render

    return render(a.board).decode()


def test_nothing_is_asked_before_the_threshold(tmp_path: Path, stuck_rank: int) -> None:
    a, clock = _agent(tmp_path, stuck_rank, collect_at_s=100_000.0)
    for t in (5.0, 10.0, 20.0):
        clock.t = t
        a.tick()
    assert _manifests(tmp_path) == []
    assert "ncclscope_evidence" not in _render(a)
    a.finish()


def test_the_default_threshold_is_half_the_timeout(tmp_path: Path, stuck_rank: int) -> None:
    a, clock = _agent(tmp_path, stuck_rank)
    clock.t = 15.0  # the stall is 891 s old
    a.tick()
    assert a.collect_threshold_s() == pytest.approx(900.0)  # the fixture's 1800 s timeout
    assert _manifests(tmp_path) == []
    started = time.monotonic()
    clock.t = 16.0  # 951 s
    a.tick()
    assert len(_manifests(tmp_path)) == 1
    assert time.monotonic() - started < 60  # bounded: every ask has its 5 s
    a.finish()


def test_a_node_whose_members_all_went_quiet_is_collected(tmp_path: Path, stuck_rank: int) -> None:
    """The culprit's node: its ranks never entered the collective the others wait in, so
    nothing is pending here; that every member went quiet past the threshold is the stall."""
    straggler = STALLED.parent.parent / "straggler-227-ts" / "job.log"
    clock = _Clock()
    source = ReplaySource([straggler], speed=60.0, clock=clock)
    a = Agent(
        AgentConfig(analyse_s=0.0, hostname="replay", pids=[stuck_rank],
                    evidence_out=tmp_path / "out", collect_at_s=120.0),
        lines=source,
        wall=source.now,
    )  # fmt: skip
    a.start()
    clock.t = 10.0  # every line is out (600 s of the job)
    a.tick()
    last = a.progress.last_seen()
    assert last is not None
    quiet = (source.now() - last).total_seconds()
    found = _manifests(tmp_path)
    if quiet < 120.0:  # the log ended less than the threshold before: not yet
        assert found == []
        clock.t += (120.0 - quiet) / 60.0 + 1.0
        a.tick()
        found = _manifests(tmp_path)
    assert len(found) == 1
    m = read_manifest(found[0])
    assert m.stall["comm"] is None
    assert m.stall["quiet_s"] >= 120.0
    assert m.stall["key"][0] == "quiet"
    clock.t += 5.0
    a.tick()
    assert len(_manifests(tmp_path)) == 1, "the same silence is collected once"
    a.finish()
