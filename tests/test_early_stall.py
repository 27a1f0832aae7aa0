"""A stall is named at ``warning`` as soon as it is longer than the job has ever waited
(``detect.waits``), not minutes later; a pause the job has made before is no stall."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ncclscope.agent.live import diagnosis_rows
from ncclscope.analysis import run_analysis
from ncclscope.detect.waits import EARLY_STALL_S, HISTORY_MARGIN, wait_bounds
from ncclscope.diagnose import Diagnosis
from ncclscope.synth import StopRank, SynthSpec, generate
from ncclscope.synth.faults import Fault, SlowSpell

_TS = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\]")
#: rank 0 keeps the others waiting 40 s (a checkpoint it writes) at these instances
_PAUSES = (30, 70, 110, 150)


def _job(tmp_path: Path, faults: tuple[Fault, ...]) -> tuple[Path, list[str]]:
    spec = SynthSpec(ranks=8, hosts=2, steps=40, timestamps=True, era="2.27", faults=faults,
                     seed=1)  # fmt: skip
    generate(spec, tmp_path / "job")
    log = tmp_path / "job" / "job.log"
    return log, log.read_text(encoding="utf-8").splitlines()


def _stamp(line: str) -> datetime | None:
    m = _TS.search(line)
    return datetime.fromisoformat(m[1]).replace(tzinfo=UTC) if m else None


def _cut_in_last_pause(log: Path, lines: list[str]) -> datetime:
    """The log as it stood 1 s into its last pause longer than 30 s."""
    stamps = [_stamp(t) for t in lines]
    order = sorted(t for t in stamps if t is not None)
    start = [a for a, b in itertools.pairwise(order) if b - a > timedelta(seconds=30)][-1]
    cut = start + timedelta(seconds=1)
    kept = [t for t, s in zip(lines, stamps, strict=True) if s is None or s <= cut]
    log.write_text("\n".join(kept) + "\n", encoding="utf-8")
    return cut


def _hangs(log: Path, work: Path, now: datetime) -> list[tuple[str, list[int]]]:
    d = run_analysis([str(log)], workdir=work, now=now)
    return [(f.severity, f.ranks) for f in d.findings if f.kind == "hang"]


def test_a_hang_is_named_at_warning_within_a_minute(tmp_path: Path) -> None:
    log, lines = _job(tmp_path, (StopRank(5, at_instance=150),))
    last = max(t for t in map(_stamp, lines) if t is not None)
    assert _hangs(log, tmp_path / "a", last + timedelta(seconds=20)) == [("info", [])]
    # Past the job's bound (the floor: its collectives never waited long), well before
    # the minutes the timestamps alone used to need.
    after = timedelta(seconds=EARLY_STALL_S + 5)
    assert _hangs(log, tmp_path / "b", last + after) == [("warning", [5])]


def test_a_pause_the_job_made_before_is_no_stall(tmp_path: Path) -> None:
    faults = tuple(SlowSpell(0, lateness_s=40, from_instance=k, to_instance=k + 1)
                   for k in _PAUSES)  # fmt: skip
    log, lines = _job(tmp_path, faults)
    d = run_analysis([str(log)], workdir=tmp_path / "whole")
    bounds = wait_bounds(d.context)
    assert len(bounds) == 1
    assert bounds["longest_wait_s"][0] == pytest.approx(40, abs=1)
    assert bounds["bound_s"][0] == pytest.approx(HISTORY_MARGIN * 40, abs=2)
    # The agent exports the same bound for the rules.
    rows = diagnosis_rows(d)["ncclscope_collective_wait_bound_seconds"]
    assert rows == [((bounds["comm_key"][0],), bounds["bound_s"][0])]
    # 55 s into the fourth checkpoint (the log cut there): past the floor, within what
    # the job has done before.
    cut = _cut_in_last_pause(log, lines)
    assert EARLY_STALL_S < 55 < bounds["bound_s"][0]
    assert _hangs(log, tmp_path / "cut", cut + timedelta(seconds=55)) == [("info", [])]


def test_a_first_pause_has_no_history_and_is_named(tmp_path: Path) -> None:
    """What a first checkpoint costs: one warning (critical needs the job's evidence)."""
    log, lines = _job(tmp_path, (SlowSpell(0, lateness_s=40, from_instance=150,
                                           to_instance=151),))  # fmt: skip
    cut = _cut_in_last_pause(log, lines)
    assert _hangs(log, tmp_path / "cut", cut + timedelta(seconds=55)) == [("warning", [0])]
    assert _hangs(log, tmp_path / "cut2", cut + timedelta(seconds=EARLY_STALL_S - 5)) == [
        ("info", [])
    ]


def test_too_little_history_keeps_the_long_bound(tmp_path: Path) -> None:
    log, lines = _job(tmp_path, (StopRank(5, at_instance=6),))
    d: Diagnosis = run_analysis([str(log)], workdir=tmp_path / "a")
    assert wait_bounds(d.context).is_empty()
    assert "ncclscope_collective_wait_bound_seconds" not in diagnosis_rows(d)
    last = max(t for t in map(_stamp, lines) if t is not None)
    assert _hangs(log, tmp_path / "b", last + timedelta(seconds=55)) == [("info", [])]
