"""The collector: bounded, off the caller's thread, once per stall, a manifest at every
step, and the rows the agent exports from what answered (RAS from a stand-in server that
speaks NCCL's protocol)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_evidence_agent import stuck_rank_process

from ncclscope.evidence.collect import CollectConfig, EvidenceCollector
from ncclscope.evidence.manifest import read_manifest
from ncclscope.synth.ras_server import RasJob, RasServer


@pytest.fixture
def rank_process(tmp_path: Path) -> Iterator[int]:
    yield from stuck_rank_process(tmp_path, rank=1, world=2)


def _fake_py_spy(tmp_path: Path, release: Path) -> str:
    """A py-spy that answers only once ``release`` exists (the test decides when)."""
    exe = tmp_path / "bin" / "py-spy"
    exe.parent.mkdir()
    exe.write_text(
        f"#!/bin/sh\nwhile [ ! -e {release} ]; do sleep 0.05; done\n"
        'echo "Thread 1 (idle): \\"MainThread\\""\n'
        'echo "    hold (/job/train.py:6)"\n'
    )
    exe.chmod(0o755)
    return str(exe)


def _manifest(out: Path) -> Path | None:
    found = sorted((out / "evidence").glob("*/manifest.json"))
    return found[0] if found else None


def test_collection_runs_off_the_callers_thread_and_writes_as_it_goes(
    tmp_path: Path, rank_process: int
) -> None:
    release = tmp_path / "release"
    out = tmp_path / "out"
    c = EvidenceCollector(
        CollectConfig(out=out, host="node-1", pids=[rank_process], ask_timeout_s=60.0,
                      py_spy=_fake_py_spy(tmp_path, release), ras_addr="127.0.0.1:9")
    )  # fmt: skip
    started = time.monotonic()
    assert c.maybe_collect(("0xabc", 7), {"comm": "0xabc", "seq": 7}) is True
    assert time.monotonic() - started < 5.0, "the caller (the agent's tick) never waits"
    assert c.running()
    assert c.maybe_collect(("0xdef", 1), {}) is False, "one collection at a time"
    deadline = time.monotonic() + 60
    while _manifest(out) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    path = _manifest(out)
    assert path is not None
    # py-spy has not answered: the folder says so, readable, while the job may die
    assert read_manifest(path).stall["complete"] is False
    release.touch()
    c.join(60)
    assert not c.running()
    m = read_manifest(path)
    assert m.stall["complete"] is True
    stacks = [a for a in m.asks if a.what == "stack" and a.via == "py-spy"]
    assert [(a.rank, a.outcome) for a in stacks] == [(1, "answered")]
    assert c.maybe_collect(("0xabc", 7), {"comm": "0xabc", "seq": 7}, wait=True) is False
    assert len(list((out / "evidence").iterdir())) == 1, "the same stall asks nothing twice"


def test_a_py_spy_that_never_answers_is_bounded(tmp_path: Path, rank_process: int) -> None:
    never = tmp_path / "never"
    c = EvidenceCollector(
        CollectConfig(out=tmp_path / "out", host="node-1", pids=[rank_process],
                      ask_timeout_s=1.0, py_spy=_fake_py_spy(tmp_path, never),
                      ras_addr="127.0.0.1:9")
    )  # fmt: skip
    started = time.monotonic()
    c.maybe_collect(("0xabc", 7), {}, wait=True)
    assert time.monotonic() - started < 1.0 * 3 + 10  # the asks' bounds, with slack
    path = _manifest(tmp_path / "out")
    assert path is not None
    m = read_manifest(path)
    stack = next(a for a in m.asks if a.via.startswith("py-spy"))
    assert stack.outcome == "no_answer"
    assert stack.why


def test_ras_dead_ranks_become_rows(tmp_path: Path, rank_process: int) -> None:
    job = RasJob(nodes=("10.0.0.1", "10.0.0.2"), ranks_per_node=2, dead=(3,))
    with RasServer(job, nccl_version="2.28.9") as server:
        c = EvidenceCollector(
            CollectConfig(out=tmp_path / "out", host="node-1", pids=[rank_process],
                          ask_timeout_s=10.0, ras_addr=server.addr, py_spy="/nonexistent")
        )  # fmt: skip
        c.maybe_collect(("0xabc", 7), {}, wait=True)
    m = read_manifest(_manifest(tmp_path / "out"))  # type: ignore[arg-type]
    ras = next(a for a in m.asks if a.what == "ras")
    assert ras.outcome == "answered", ras
    problems = c.rows["ncclscope_ras_rank_problem_info"]
    dead = [labels for labels, _v in problems if labels[3] == "dead"]
    assert [(lab[1], lab[2]) for lab in dead] == [("3", "10.0.0.2")]
    info = c.rows["ncclscope_evidence_rank_info"]
    assert [(lab[0], lab[3]) for lab, _v in info] == [("1", "none")], "py-spy missing: no stack"
    assert c.rows["ncclscope_evidence_collections_total"] == [((), 1.0)]
    asks = dict(c.rows["ncclscope_evidence_asks"])
    assert asks[("stack", "unavailable")] == 2.0  # no worker server, no py-spy


def test_a_rank_whose_process_is_gone_is_said_to_be(tmp_path: Path, rank_process: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    c = EvidenceCollector(
        CollectConfig(out=tmp_path / "out", host="node-1", ask_timeout_s=2.0,
                      ras_addr="127.0.0.1:9", pids=[rank_process], py_spy="/nonexistent")
    )  # fmt: skip
    c.maybe_collect(("0xabc", 7), {}, expected=[(1, rank_process), (5, proc.pid)], wait=True)
    m = read_manifest(_manifest(tmp_path / "out"))  # type: ignore[arg-type]
    gone = [a for a in m.asks if a.state == "gone"]
    assert [(a.rank, a.pid) for a in gone] == [(5, proc.pid)]
    assert "gone" in gone[0].why


def test_a_job_with_no_process_left_is_not_collected(tmp_path: Path) -> None:
    """Every rank's process gone: the job ended before the threshold. A folder would
    call every rank dead."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    c = EvidenceCollector(
        CollectConfig(out=tmp_path / "out", host="node-1", ask_timeout_s=2.0,
                      ras_addr="127.0.0.1:9", match="no-such-training-script")
    )  # fmt: skip
    c.maybe_collect(("quiet", 1), {}, expected=[(5, proc.pid)], wait=True)
    assert _manifest(tmp_path / "out") is None
    assert (c.collections, c.ended) == (0, 1)
