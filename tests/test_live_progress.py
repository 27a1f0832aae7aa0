"""The agent's live progress equals ``analyze`` on the same lines (issue #25): every
fixture, and jobs from ``tests/jobgen.py`` (a generator written apart from the parsers)
cut at random points, fed as the agent's polls would feed them.  ``live_equality``
says what is compared; ``benchmarks/bench_live_equality.py`` runs 200 jobs.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import jobgen
import pytest
from live_equality import compare, read_files

from ncclscope.agent.progress import LiveProgress
from ncclscope.agent.run import Agent, AgentConfig

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


def _coll_line(rank: int, seq: int, at: datetime) -> str:
    return (
        f"[{at:%Y-%m-%d %H:%M:%S.%f}] node-{rank // 2}:{100 + rank}:{100 + rank} [{rank % 2}] "
        f"NCCL INFO AllGather: opCount {seq:x} sendbuff 0x7f00 recvbuff 0x7f80 count 4096 "
        f"datatype 9 op 0 root 0 comm 0x55{rank} [nranks=4] stream 0x56"
    )


def _init_line(rank: int, at: datetime) -> str:
    return (
        f"[{at:%Y-%m-%d %H:%M:%S.%f}] node-{rank // 2}:{100 + rank}:{100 + rank} [{rank % 2}] "
        f"NCCL INFO comm 0x55{rank} rank {rank} nranks 4 cudaDev {rank % 2} nvmlDev "
        f"{rank % 2} busId {rank + 1}8000 commId 0x5e1f00c0ffee0001 - Init COMPLETE"
    )


def test_the_agent_names_a_stall_once_a_rank_is_silent_for_an_interval() -> None:
    """Every tick the agent exports the countdown from the live state: not for a
    collective a poll merely cut through (every rank's lines still arrive), but within
    an interval of a rank falling silent, with the seconds left counted on the logs'
    clock; the clock is the test's own (no sleep, no dependence on the machine)."""
    t0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
    clock = [t0]
    polls: list[list[SimpleNamespace]] = []

    class Source:
        def poll(self) -> list[SimpleNamespace]:
            return polls.pop(0) if polls else []

    agent = Agent(
        AgentConfig(interval_s=1.0, analyse_s=0.0, hostname="node-0"),
        lines=Source(),
        wall=lambda: clock[0],
    )

    def poll(texts: list[tuple[int, str]]) -> None:
        polls.append(
            [SimpleNamespace(path=f"rank{r}.log", text=t, arrived=clock[0]) for r, t in texts]
        )
        agent.tick()

    def job() -> dict[str, list[tuple[tuple[str, ...], float]]]:
        return agent.board.snapshot()

    poll([(r, _init_line(r, clock[0])) for r in range(4)])
    seq = 0
    for _ in range(5):  # a healthy job: every rank's lines arrive every poll...
        clock[0] += timedelta(seconds=1)
        lines = [(r, _coll_line(r, s, clock[0])) for s in range(seq, seq + 10) for r in range(4)]
        seq += 10
        # ...but the poll cuts through the last collective: rank 3's line comes next time
        poll(lines[:-1] if _ % 2 else lines)
        assert "ncclscope_timeout_culprit_info" not in job()
    # Rank 3 stops; the others enter the next collective and wait.
    clock[0] += timedelta(seconds=1)
    entered = clock[0]
    poll([(r, _coll_line(r, seq, entered)) for r in range(3)])
    clock[0] += timedelta(seconds=1.5)  # one interval and a half later
    agent.tick()
    rows = job()
    assert [labels[1] for labels, _ in rows["ncclscope_timeout_culprit_info"]] == ["3"]
    ((_, left),) = rows["ncclscope_timeout_remaining_seconds"]
    assert left == pytest.approx(600 - (clock[0] - entered).total_seconds(), abs=1e-3)
    clock[0] += timedelta(seconds=60)  # no line: the countdown is arithmetic on the state
    agent.tick()
    ((_, later),) = job()["ncclscope_timeout_remaining_seconds"]
    assert later == pytest.approx(left - 60, abs=1e-3)
    agent.finish()


def test_damaged_coll_lines_cost_only_themselves() -> None:
    """A COLL line with a number past its column's type is damage (counted as a line
    the reference analysis must see, read into no member); two processes' lines spliced
    are read as the reference parser reads them (the last header starts the line); a
    line cut mid-body is no call; the good lines around them all count."""
    at = datetime(2026, 11, 27, 12, tzinfo=UTC)
    good = _coll_line(0, 1, at)
    overflow = _coll_line(1, 1, at).replace(":101:101 ", ":99999999999999:101 ")
    spliced = _coll_line(2, 5, at)[:60] + _coll_line(3, 7, at)
    cut = _coll_line(1, 2, at)[:-60]
    live = LiveProgress()
    read = live.add(
        [("a.log", t, at) for t in (good, overflow, spliced, cut, _coll_line(0, 2, at))],
        own_times=True,
    )
    assert read == 3  # rank 0 twice, and rank 3 from the spliced line
    assert {(host, pid): m.calls for (_p, host, pid, _c), m in live.members.items()} == {
        ("node-0", 100): 2,
        ("node-1", 103): 1,
    }
    assert live.notable == 2  # the overflowing line and the cut one: the reference's to count
