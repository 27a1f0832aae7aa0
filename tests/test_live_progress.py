"""The agent's live progress equals ``analyze`` on the same lines (issue #25): every
fixture, and jobs from ``tests/jobgen.py`` (a generator written apart from the parsers)
cut at random points, fed as the agent's polls would feed them.  ``live_equality``
says what is compared; ``benchmarks/bench_live_equality.py`` runs 200 jobs.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path

import jobgen
import pytest
from live_equality import compare, read_files

from ncclscope.agent.progress import LiveProgress

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CASES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir() and read_files(p))
KINDS = ("healthy", "hang_watchdog", "hang_end", "multi_pg", "restart_hang", "slow_rank")


@pytest.mark.parametrize("case", CASES)
def test_live_progress_equals_analyze_on_every_fixture(case: str) -> None:
    assert compare(read_files(FIXTURES / case), seed=len(case)) == []


def _cut(rng: random.Random, files: jobgen.Files) -> jobgen.Files:
    """The job's lines up to a random moment, from a random one, or both (a log read while
    the job runs, the tail of a rotated log)."""
    frm = rng.choice((0.0, 0.0, rng.uniform(0.02, 0.6)))
    to = rng.uniform(max(frm + 0.05, 0.1), 1.0)
    return jobgen.cut_time(files, frm, to)


@pytest.mark.parametrize("seed", range(8))
def test_live_progress_equals_analyze_on_generated_jobs_cut_anywhere(seed: int) -> None:
    rng = random.Random(seed)
    spec = jobgen.random_spec(rng, KINDS[seed % len(KINDS)], max_ranks=32)
    job = jobgen.generate(spec)
    cut = _cut(rng, job.files)
    files = {name: [ln.text for ln in lines] for name, lines in cut.items()}
    assert compare(files, seed=seed) == []


def test_a_poll_without_coll_lines_changes_nothing() -> None:
    """A tick's cost follows the lines: no COLL line, no new version, nothing re-read."""
    live = LiveProgress()
    at = datetime(2026, 11, 27, tzinfo=UTC)
    line = (
        "[2026-11-27 12:00:00.000001] node-0:41:41 [0] NCCL INFO AllReduce: opCount 0 "
        "sendbuff 0x7f00 recvbuff 0x7f80 count 4 datatype 7 op 0 root 0 comm 0x55 "
        "[nranks=2] stream 0x56"
    )
    assert live.add([("a.log", line, at)], own_times=True) == 1
    version = live.version
    assert live.add([("a.log", "step 3 loss 1.25", at)], own_times=True) == 0
    assert live.add([], own_times=True) == 0
    assert live.version == version
    (member,) = live.members.values()
    assert (member.calls, member.coll_calls, member.op) == (1, 1, "AllReduce")
    assert member.ts == datetime(2026, 11, 27, 12, 0, 0, 1, tzinfo=UTC)
