"""A hang is a claim that the job stopped, and a culprit a claim about one rank: both
need evidence, and both must survive (or be withheld on) logs cut anywhere.

Generated jobs (``ncclscope.synth``) are cut the way real logs are: a copy taken
mid-run (the head kept), a rotated log or a ticket's excerpt (the tail kept).  The
watchdog-only cases are lines written here in PyTorch's formats (``shared/formats/
deepspeed-torch.md`` T2, T6), with our own values.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest

from ncclscope.analysis import Diagnosis, run_analysis
from ncclscope.detect import Context
from ncclscope.detect.base import Finding, severity_at_least
from ncclscope.detect.hang import HangDetector
from ncclscope.detect.waits import EARLY_STALL_S
from ncclscope.detect.watchdog import MIN_STALL_S
from ncclscope.synth import DeadProcess, StopRank, SynthSpec, generate

#: Watchdog-only excerpts written for these tests in PyTorch 2.4's formats.
_DATA = Path(__file__).parent / "data" / "hang"

# --------------------------------------------------------------------------------------
# Helpers


def _cut(src: Path, dst: Path, *, head: float | None = None, tail: int | None = None) -> Path:
    """Copy a job keeping the first ``head`` fraction or the last ``tail`` lines of each
    file (truth.json left out)."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        if f.name == "truth.json":
            continue
        lines = f.read_text().splitlines(keepends=True)
        if head is not None:
            lines = lines[: int(len(lines) * head)]
        if tail is not None:
            lines = lines[-tail:]
        (dst / f.name).write_text("".join(lines))
    return dst


def _run(path: Path, work: Path) -> Diagnosis:
    return run_analysis([str(path)], workdir=work)


def _serious(a: Diagnosis) -> list[str]:
    return [
        f"{f.severity} {f.kind} {f.ranks}: {f.message}"
        for f in a.findings
        if severity_at_least(f.severity, "warning")
    ]


def _blamed(a: Diagnosis) -> set[int]:
    """Every rank a hang-related finding blames."""
    kinds = ("hang", "timeout", "timeout_imminent", "mismatch")
    return {r for f in a.findings if f.kind in kinds for r in f.ranks}


def _one(a: Diagnosis, kind: str) -> Finding:
    found = [f for f in a.findings if f.kind == kind]
    assert len(found) == 1, [(f.kind, f.severity, f.message) for f in a.findings]
    return found[0]


# --------------------------------------------------------------------------------------
# Healthy jobs cut mid-run: no alarm


_HEALTHY = {
    "torch-227-ts": SynthSpec(
        ranks=8, hosts=2, steps=6, era="2.27", timestamps=True, seed=1, framework="torch"
    ),
    "deepspeed-221-torchrun": SynthSpec(
        ranks=16, hosts=2, steps=5, era="2.21", seed=2, framework="deepspeed", launcher="torchrun"
    ),
    "nccl-218-one-host": SynthSpec(ranks=8, hosts=1, steps=6, era="2.18", seed=3),
    "torch-227-per-rank": SynthSpec(
        ranks=16,
        hosts=4,
        steps=4,
        era="2.27",
        timestamps=True,
        seed=4,
        layout="per-rank",
        framework="torch",
    ),
}


@pytest.fixture(scope="module")
def healthy_jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("healthy")
    out = {}
    for name, spec in _HEALTHY.items():
        generate(spec, root / name)
        out[name] = root / name
    return out


@pytest.mark.parametrize("name", sorted(_HEALTHY))
@pytest.mark.parametrize("frac", [0.5, 0.73, 0.9])
def test_healthy_job_cut_mid_run_raises_no_alarm(
    healthy_jobs: dict[str, Path], tmp_path: Path, name: str, frac: float
) -> None:
    cut = _cut(healthy_jobs[name], tmp_path / "cut", head=frac)
    a = _run(cut, tmp_path / "work")
    assert _serious(a) == []
    assert _blamed(a) == set()
    for f in a.findings:
        if f.kind == "hang":  # at most the "log ends mid-run" note
            assert f.severity == "info"
            assert "log ends mid-run" in f.message
            assert f.evidence["stop_evidence"] == []


# --------------------------------------------------------------------------------------
# A hang whose log lost its head or its tail


@pytest.fixture(scope="module")
def stop5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rank 5 never enters world collective #30; the seven others time out (torch 2.4
    lines, torchrun prefixes); their watchdogs abort them (SIGABRT), the agents name a
    SIGABRT-ed rank as each host's root cause."""
    out = tmp_path_factory.mktemp("stop5") / "job"
    spec = SynthSpec(
        ranks=8, hosts=2, steps=4, era="2.21", seed=3, framework="torch", launcher="torchrun",
        faults=(StopRank(5, 30),),
    )  # fmt: skip
    generate(spec, out)
    return out


@pytest.mark.parametrize("tail", [None, 300, 500])
def test_culprit_survives_a_head_cut(stop5: Path, tmp_path: Path, tail: int | None) -> None:
    """Init lines gone (last 300 lines kept): the hang is still reported, and its
    culprit is the one rank that reported no timeout, not the SIGABRT-ed root cause the
    launcher names (the watchdog's abort is a consequence)."""
    a = _run(_cut(stop5, tmp_path / "cut", tail=tail), tmp_path / "work")
    hang = _one(a, "hang")
    assert (hang.severity, hang.ranks) == ("critical", [5])
    assert hang.evidence["culprit_basis"] == "non_reporting_member"
    assert _blamed(a) == {5}
    # The launcher named a SIGABRT-ed rank as root cause: not taken for the culprit.
    assert any(
        r["signal"] == "SIGABRT" for r in a.analysis.frameworks.failures.iter_rows(named=True)
    )


@pytest.mark.parametrize("tail", [120, 200])
def test_culprit_withheld_when_the_cut_falls_inside_the_reports(
    stop5: Path, tmp_path: Path, tail: int
) -> None:
    """The kept lines begin inside the block of watchdog reports: the ranks without one
    may only have lost it.  The hang is said (the watchdog fired), nobody is blamed."""
    a = _run(_cut(stop5, tmp_path / "cut", tail=tail), tmp_path / "work")
    assert _blamed(a) == set()
    hang = _one(a, "hang")
    assert hang.severity == "warning"
    assert hang.evidence["culprit_basis"] == "withheld"
    assert "inside the watchdog reports" in hang.evidence["withheld"]
    assert all(f.severity == "critical" for f in a.findings if f.kind == "timeout")


def test_a_lost_report_withholds_instead_of_guessing(stop5: Path, tmp_path: Path) -> None:
    """Rank 2's watchdog lines (timeout, companion, termination) are missing (an excerpt
    that left them out, a lost file): ranks 2 and 5 both reported nothing, and the logs
    cannot tell which one stopped."""
    cut = _cut(stop5, tmp_path / "cut", tail=300)
    log = next(cut.iterdir())
    kept = [
        line
        for line in log.read_text().splitlines(keepends=True)
        if "[rank2]:" not in line and "Rank 2]" not in line
    ]
    log.write_text("".join(kept))
    a = _run(cut, tmp_path / "work")
    assert _blamed(a) == set()
    hang = _one(a, "hang")
    assert hang.evidence["non_reporting"] == [2, 5]
    assert hang.severity == "warning"


def test_the_log_that_ends_before_the_watchdog_fired_is_info(stop5: Path, tmp_path: Path) -> None:
    """Cut before any watchdog line: the ranks are a collective apart and nothing says
    the job stopped."""
    text = next(p for p in stop5.iterdir() if p.suffix == ".log").read_text()
    first_wd = text.index("Watchdog caught")
    keep = text[:first_wd].count("\n") - 5
    a = _run(_cut(stop5, tmp_path / "cut", head=keep / text.count("\n")), tmp_path / "work")
    assert _serious(a) == []
    assert _blamed(a) == set()
    hang = _one(a, "hang")
    assert hang.severity == "info"
    assert 5 in hang.evidence["waited_for"]


def test_a_death_before_the_stall_is_the_culprit_after_a_head_cut(tmp_path: Path) -> None:
    """Rank 3 is SIGABRTed (its own abort, not a watchdog's: no timeout had fired yet)
    before collective #20; the kept tail holds the other host's timeouts and the agents'
    summaries."""
    spec = SynthSpec(
        ranks=8, hosts=2, steps=4, era="2.21", seed=7, framework="torch",
        faults=(DeadProcess(3, 20, "SIGABRT"),),
    )  # fmt: skip
    generate(spec, tmp_path / "job")
    a = _run(_cut(tmp_path / "job", tmp_path / "cut", tail=200), tmp_path / "work")
    hang = _one(a, "hang")
    assert (hang.ranks, hang.hang_class) == ([3], "dead_process")
    assert hang.evidence["culprit_basis"] == "died_first"
    assert _blamed(a) == {3}


# --------------------------------------------------------------------------------------
# Watchdog lines alone


_MISMATCH = _DATA / "watchdog-mismatch.log"


def test_same_seqnum_different_collectives_is_a_mismatch(tmp_path: Path) -> None:
    """Two ranks of the default group time out at SeqNum 212, one in BROADCAST, the other
    in ALLREDUCE with other sizes: a collective mismatch, told once, with both sides."""
    (tmp_path / "in").mkdir()
    shutil.copy(_MISMATCH, tmp_path / "in" / "train.log")
    a = _run(tmp_path / "in", tmp_path / "work")
    m = _one(a, "mismatch")
    assert m.severity == "critical"
    assert m.hang_class == "mismatch"
    assert m.seq == 212
    assert m.ranks == [0, 1]  # two sides, no majority: both named
    assert {(c["rank"], c["op"]) for c in m.evidence["calls"]} == {
        (0, "BROADCAST"),
        (1, "ALLREDUCE"),
    }
    assert m.evidence["differs_in"] == ["op", "size"]
    assert not [f for f in a.findings if f.kind == "hang"]  # the mismatch is the story
    t = _one(a, "timeout")  # one (group, SeqNum), not two unrelated timeouts
    assert t.evidence["torch_ops"] == ["ALLREDUCE", "BROADCAST"]
    assert t.evidence["pg"] == "0"


_INSIDE = _DATA / "inside-collective.log"


def test_companion_lines_join_and_every_member_entered(tmp_path: Path) -> None:
    """Each line carries a collector's ``[N]`` tag.  The companion lines state PG 1 and
    join their timeouts; rank 3 printed only its companion line and still counts among
    those waiting.  All four members (NumelOut/NumelIn = 4) enqueued past #1580: the
    hang is inside the collective, not a missing rank."""
    (tmp_path / "in").mkdir()
    shutil.copy(_INSIDE, tmp_path / "in" / "excerpt.log")
    a = _run(tmp_path / "in", tmp_path / "work")
    t = a.analysis.frameworks.timeouts.sort("rank")
    assert t["pg"].to_list() == ["1", "1", "1"]
    assert t["last_enqueued"].to_list() == [1582, 1582, 1582]
    timeout = _one(a, "timeout")
    assert timeout.evidence["pg"] == "1"
    assert timeout.evidence["waiting_ranks"] == [0, 1, 2, 3]
    assert timeout.ranks == []
    hang = _one(a, "hang")
    assert hang.ranks == []
    assert hang.evidence["inside_collective"] is True
    assert "inside the collective" in hang.message
    assert "process group 1" in hang.message


def _wd(grank: int, pg: str, prank: int, seq: int, nin: int, nout: int, t: str) -> str:
    head = f"[rank{grank}]:[E1105 10:41:{t} 77{grank} ProcessGroupNCCL.cpp"
    return (
        f"{head}:616] [Rank {prank}] Watchdog caught collective operation timeout: WorkNCCL("
        f"SeqNum={seq}, OpType=_ALLGATHER_BASE, NumelIn={nin}, NumelOut={nout}, "
        f"Timeout(ms)=600000) ran for 600051 milliseconds before timing out.\n"
        f"{head}:1785] [PG {pg} Rank {prank}] Exception (either an error or timeout) detected "
        f"by watchdog at work: {seq}, last enqueued NCCL work: {seq}, last completed NCCL "
        f"work: {seq - 1}.\n"
    )


def _two_groups() -> str:
    """World of 8 (PG 0) and a tensor-parallel group of global ranks 4-7 (PG 1).  Global
    rank 5 (PG 1 rank 1) stopped: ranks 4, 6 and 7 time out in PG 1 at #120; ranks 0-3,
    waiting for the TP group at #40 of PG 0, time out there.  A DeepSpeed timer line
    before and the watchdog's termination lines after frame the block of reports."""
    ds = "[2025-11-05 10:31:02,417] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | "
    out = [ds + "fwd: 151.20 | bwd: 302.77 | step: 39.10\n"]
    out += [_wd(g, "1", g - 4, 120, 2048, 8192, f"07.{g:02d}0000") for g in (4, 6, 7)]
    out += [_wd(g, "0 (default_pg)", g, 40, 1024, 8192, f"09.{g:02d}0000") for g in range(4)]
    for g in range(8):
        if g == 5:
            continue
        out.append(
            f"[rank{g}]:[E1105 10:41:10.500000 77{g} ProcessGroupNCCL.cpp:1515] "
            f"[PG {'1' if g >= 4 else '0 (default_pg)'} Rank {g - 4 if g >= 4 else g}] "
            "Process group watchdog thread terminated with exception: see above\n"
        )
    return "".join(out)


def test_each_timeout_is_judged_in_its_own_process_group(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "train.log").write_text(_two_groups())
    a = _run(tmp_path / "in", tmp_path / "work")
    timeouts = {f.evidence["pg"]: f for f in a.findings if f.kind == "timeout"}
    assert sorted(timeouts) == ["0", "1"]
    tp, world = timeouts["1"], timeouts["0"]
    assert tp.evidence["waiting_ranks"] == [0, 2, 3]  # PG 1's own numbering
    assert tp.evidence["non_reporting"] == [1]
    # Which global rank PG 1 rank 1 is, no line says: not guessed.
    assert tp.ranks == []
    assert tp.evidence["culprit_pg_ranks"] == [1]
    # PG 0: ranks 4, 6 and 7 timed out in PG 1 (waiting there); 5 reported nothing.
    assert world.evidence["waiting_ranks"] == [0, 1, 2, 3]
    assert world.ranks == [5]
    assert world.evidence["culprit_basis"] == "non_reporting_member"
    assert tp.ranks != world.ranks  # not one culprit reused for every group


# --------------------------------------------------------------------------------------
# Timestamps alone


def test_no_progress_for_minutes_is_evidence_of_a_stop(tmp_path: Path) -> None:
    """NCCL lines only, with timestamps.  Where the logs end right after the stall, it is
    a mid-run note; where a later line (here: the end of the logs moved 20 minutes on)
    shows nothing moved for far longer than the job's gaps and than the 5-minute floor,
    the timestamps say the job stopped: a hang on rank 6, a warning (inferred, not
    printed by the job)."""
    spec = SynthSpec(
        ranks=8, hosts=2, steps=4, era="2.27", timestamps=True, seed=6, faults=(StopRank(6, 30),)
    )
    generate(spec, tmp_path / "job")
    a = _run(tmp_path / "job", tmp_path / "work")
    assert _one(a, "hang").severity == "info"
    ctx = Context(a.analysis)
    end = ctx.last_ts
    assert end is not None
    detector = HangDetector()
    # Just under the floor: still only a note.
    ctx.__dict__["last_ts"] = end + timedelta(seconds=MIN_STALL_S - 1)
    (note,) = detector.policy(detector.metric(ctx), ctx)
    assert (note.severity, note.ranks) == ("info", [])
    ctx.__dict__["last_ts"] = end + timedelta(minutes=20)
    (hang,) = detector.policy(detector.metric(ctx), ctx)
    assert (hang.severity, hang.ranks, hang.seq) == ("warning", [6], 30)
    assert hang.evidence["stop_evidence"] == ["no_progress"]
    assert hang.evidence["culprit_basis"] == "last_seen"
    assert hang.evidence["idle_s"] > MIN_STALL_S


@pytest.mark.parametrize("frac", [0.6, 0.85])
def test_per_rank_files_cut_one_by_one_blame_nobody_wrong(tmp_path: Path, frac: float) -> None:
    """One file per rank, each cut at the same fraction of its own lines: the files end
    at scattered collectives, and some ranks' watchdog lines are gone.  Neither the rank
    furthest behind nor the ranks without a report are the culprit: nobody is named
    (the real culprit, rank 6, would do; any other rank is wrong)."""
    spec = SynthSpec(
        ranks=8, hosts=2, steps=4, era="2.21", seed=13, framework="torch", layout="per-rank",
        faults=(StopRank(6, 30),),
    )  # fmt: skip
    generate(spec, tmp_path / "job")
    a = _run(_cut(tmp_path / "job", tmp_path / "cut", head=frac), tmp_path / "work")
    assert _blamed(a) <= {6}
    for f in a.findings:
        if f.kind == "hang" and not f.ranks and f.severity != "info":
            assert f.evidence["culprit_basis"] == "withheld"


def test_a_group_no_line_names_is_not_taken_for_the_world_when_its_size_differs(
    tmp_path: Path,
) -> None:
    """Old releases print no PG.  Three ranks time out in an all-gather whose sizes say
    the group has 4 members, in a world of 8 (DeepSpeed's launcher says so): the silent
    member is counted in the group's own numbering, never as global ranks 3-7."""
    lines = [
        "[2025-11-05 10:01:02,118] [INFO] [launch.py:256:main] dist_world_size=8\n",
    ]
    lines += [
        f"[rank{g}]:[E ProcessGroupNCCL.cpp:607] [Rank {g}] Watchdog caught collective "
        f"operation timeout: WorkNCCL(SeqNum=77, OpType=_ALLGATHER_BASE, NumelIn=512, "
        f"NumelOut=2048, Timeout(ms)=600000) ran for 600011 milliseconds before timing out.\n"
        for g in range(3)
    ]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "train.log").write_text("".join(lines))
    a = _run(tmp_path / "in", tmp_path / "work")
    t = _one(a, "timeout")
    assert t.evidence["waiting_ranks"] == [0, 1, 2]
    assert a.analysis.frameworks.world_size == 8
    assert t.evidence.get("non_reporting") in (None, [3])  # group rank 3, not 3-7
    assert _blamed(a) == set()  # its global rank is not in the logs


def test_heartbeat_monitor_alone_says_the_job_stopped(tmp_path: Path) -> None:
    """No timeout line: the heartbeat monitor found two ranks' watchdogs stuck.  The
    job stopped (a warning: inside a CUDA or NCCL call), and nobody is blamed."""
    (tmp_path / "in").mkdir()
    shutil.copy(_DATA / "heartbeat.log", tmp_path / "in" / "train.log")
    a = _run(tmp_path / "in", tmp_path / "work")
    hang = _one(a, "hang")
    assert (hang.severity, hang.ranks) == ("warning", [])
    assert hang.evidence["monitor_ranks"] == [1, 3]
    assert hang.evidence["outstanding_works"] == [
        {"rank": 1, "works": 14},
        {"rank": 3, "works": 12},
    ]


# --------------------------------------------------------------------------------------
# Live: the idle time runs to the agent's wall clock


STALLED = Path(__file__).resolve().parent.parent / "fixtures" / "stalled-227-ts"


@pytest.mark.parametrize(
    ("idle_s", "severity"), [(None, "info"), (20.0, "info"), (60.0, "warning"), (900.0, "warning")]
)
def test_live_now_makes_a_long_stall_stop_evidence(
    tmp_path: Path, idle_s: float | None, severity: str
) -> None:
    """Seven ranks entered AllGather #30 and the log ends (no watchdog yet).  Post-mortem
    (no ``now``) or live 20 s later, that is a log that ends: ``info``.  Live, with the
    wall clock past the job's own bound (``waits``: 45 s here) since the waiters' last
    line, the stall is the evidence: a ``warning`` naming rank 6, and the countdown with
    it."""
    end = Context(run_analysis([str(STALLED)], workdir=tmp_path / "w0").analysis).last_ts
    assert end is not None
    now = None if idle_s is None else end + timedelta(seconds=idle_s)
    a = run_analysis([str(STALLED)], workdir=tmp_path / "w1", now=now)
    (hang,) = [f for f in a.findings if f.kind == "hang"]
    (soon,) = [f for f in a.findings if f.kind == "timeout_imminent"]
    assert (hang.severity, soon.severity) == (severity, severity)
    if severity == "info":
        assert hang.ranks == []
        assert hang.evidence["stop_evidence"] == []
    else:
        assert hang.ranks == [6]
        assert soon.ranks == [6]
        assert hang.evidence["stop_evidence"] == ["no_progress"]
        assert hang.evidence["idle_s"] > hang.evidence["idle_bound_s"] == EARLY_STALL_S
        # The countdown itself is still measured at the last line (the metrics' time).
        assert soon.evidence["age_s"] < 1.0


def test_live_window_passes_the_wall_clock(tmp_path: Path) -> None:
    """The agent's window hands its wall clock to the detectors: the same lines give an
    ``info`` hang without it and a ``warning`` 15 minutes after the waiters' last line."""
    from ncclscope.agent.live import LiveWindow

    window = LiveWindow(tmp_path / "seg")
    end = Context(run_analysis([str(STALLED)], workdir=tmp_path / "w0").analysis).last_ts
    assert end is not None
    text = (STALLED / "job.log").read_text().splitlines()
    window.add([("job.log", line, end) for line in text])
    severities = []
    try:
        for now in (None, end + timedelta(minutes=15)):
            a = window.analyse(tmp_path / f"live-{now is None}", now=now)
            assert a is not None
            severities.append([f.severity for f in a.findings if f.kind == "hang"])
    finally:
        window.close()
    assert severities == [["info"], ["warning"]]


def test_a_run_that_a_restart_followed_ended_but_blames_nobody(tmp_path: Path) -> None:
    """The same stall in a run that a later run followed (``Context.followed_by``): the
    run ended there (``restarted`` is stop evidence), but a killed or preempted healthy
    run ends so too; with nothing else, the hang stays ``info`` and nobody is blamed."""
    a = run_analysis([str(STALLED)], workdir=tmp_path / "w")
    ctx = Context(replace(a.analysis, followed_by=["restart"]))
    detector = HangDetector()
    (hang,) = detector.policy(detector.metric(ctx), ctx)
    assert hang.evidence["stop_evidence"] == ["restarted"]
    assert (hang.severity, hang.ranks) == ("info", [])
    assert hang.message.startswith("this run ended (a new run followed)")
    assert hang.evidence["waited_for"] == [6]


def test_a_log_that_ends_with_the_watchdogs_aborts_holds_the_whole_block(
    tmp_path: Path,
) -> None:
    """A combined log whose last lines are the ranks' own aborts ("To avoid data
    inconsistency, we are taking the entire process down.", printed after each rank's
    reports) kept the whole block of reports: the one member without a report is the
    culprit, though nothing (no launcher summary) follows."""
    src = Path(__file__).parent.parent / "fixtures" / "hang-tail-only" / "train.log"
    lines = src.read_text().splitlines(keepends=True)
    assert "taking the entire process down" in lines[-3]
    cut = tmp_path / "tail.log"
    cut.write_text("".join(lines[:-2]))  # the launcher's two lines dropped
    a = _run(cut, tmp_path / "work")
    hang = _one(a, "hang")
    assert hang.ranks == [5]
    assert hang.severity == "critical"
    assert hang.evidence["culprit_basis"] == "non_reporting_member"
    aborts = a.analysis.frameworks.torch_events.filter(pl.col("kind") == "process_abort")
    assert aborts.height == 7
