"""The detectors on Flight Recorder dumps (issue #15): hangs, mismatches and late ranks
named from the dumps, on real PyTorch dumps (fixtures/flight-recorder) and on dumps
built here for what those jobs did not do."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import sample_text

from ncclscope.analysis import Diagnosis, run_analysis
from ncclscope.detect.flight_findings import with_flight
from ncclscope.findings import Finding

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "flight-recorder"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.json").exists())
T0 = 1_764_124_400_000_000_000  # ns
#: The sample log's failure (an IB error, the abort): left out for a healthy log.
_FAILURE = re.compile(r"WARN|Error|-> \d|aborted")


def _diagnose(paths: list[Path], tmp: Path) -> Diagnosis:
    return run_analysis([str(p) for p in paths], workdir=tmp / "work")


def _blamed(d: Diagnosis, kinds: tuple[str, ...]) -> list[Finding]:
    return [f for f in d.findings if f.kind in kinds and f.severity != "info"]


@pytest.mark.parametrize("case", CASES)
def test_real_dumps_name_the_true_culprit(case: str, tmp_path: Path) -> None:
    """Dumps and the job's log together: the rank the job's script made the culprit,
    in a finding of the kind it is (nothing at all for the healthy run)."""
    expected = json.loads((FIXTURES / case / "expected.json").read_text())
    d = _diagnose([FIXTURES / case], tmp_path)
    kinds = ("hang", "mismatch", "straggler")
    found = _blamed(d, kinds)
    if expected["kind"] == "none":
        assert found == []
        return
    first = found[0]
    assert first.kind == expected["kind"]
    assert first.ranks == expected["culprit_ranks"]
    if first.kind in ("hang", "mismatch"):
        assert first.severity == "critical"  # the launcher's failure summary: it stopped
        assert first.evidence["culprit_basis"] == "flight_recorder"


@pytest.mark.parametrize("case", [c for c in CASES if (FIXTURES / f"{c}-json").is_dir()])
def test_the_json_dumps_alone_tell_the_same(case: str, tmp_path: Path) -> None:
    """The JSON form, without the job's log: the same culprit; a hang without the log's
    stop evidence is a warning (an on-demand dump of a running job looks the same)."""
    expected = json.loads((FIXTURES / case / "expected.json").read_text())
    d = _diagnose([FIXTURES / f"{case}-json"], tmp_path)
    found = _blamed(d, ("hang", "mismatch", "straggler"))
    if expected["kind"] == "none":
        assert found == []
        return
    assert (found[0].kind, found[0].ranks) == (expected["kind"], expected["culprit_ranks"])
    if found[0].kind == "hang":
        assert found[0].severity == "warning"


def test_a_stop_that_follows_from_an_earlier_one_blames_nobody(tmp_path: Path) -> None:
    """Rank 3 skips an all_reduce of a two-rank group; rank 1 waits in it, so the world
    group then waits for ranks 1 and 3: the pair is the story, the world's stop is told
    as its consequence."""
    case = FIXTURES / "subgroup-hang"
    if not case.is_dir():
        pytest.skip("fixture not generated")
    d = _diagnose([case], tmp_path)
    hangs = [f for f in d.findings if f.kind == "hang"]
    assert [(f.severity, f.ranks) for f in hangs] == [("critical", [3]), ("info", [])]
    assert hangs[0].evidence["flight_recorder"]["pg_desc"] == "pair"
    assert hangs[1].evidence["follows_from"]["pg"] == hangs[0].evidence["flight_recorder"]["pg"]


# --- dumps built here


def _entry(rank: int, seq: int, *, created_ns: int, numel: int = 4, op: str = "all_reduce",
           retired: bool = True, state: str | None = None) -> dict[str, Any]:  # fmt: skip
    return {
        "record_id": seq - 1,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": f"nccl:{op}",
        "time_created_ns": created_ns,
        "input_sizes": [[numel]],
        "input_dtypes": ["Float"],
        "output_sizes": [[numel]],
        "output_dtypes": ["Float"],
        "state": state or ("completed" if retired else "started"),
        "time_discovered_started_ns": created_ns + 1_000,
        "time_discovered_completed_ns": created_ns + 2_000 if retired else None,
        "retired": retired,
        "timeout_ms": 600_000,
        "is_p2p": False,
        "frames": [],
    }


def _write(where: Path, entries: dict[int, list[dict[str, Any]]]) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    ranks = sorted(entries)
    for rank, es in entries.items():
        last = max((e["collective_seq_id"] for e in es), default=0)
        done = max((e["collective_seq_id"] for e in es if e["retired"]), default=0)
        dump = {
            "version": "2.10",
            "comm_lib_version": "2.27.3",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(ranks)}},
            "pg_status": {
                "0": {
                    "last_enqueued_collective": last,
                    "last_started_collective": last,
                    "last_completed_collective": done,
                }
            },
            "entries": es,
        }
        (where / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
    return where


def test_two_ranks_that_disagree_name_nobody(tmp_path: Path) -> None:
    """Of two ranks that called different sizes, neither is the majority: the mismatch
    is told, nobody is blamed (PyTorch's analyzer blames whichever it read second)."""
    gap = 10_000_000
    entries = {
        r: [_entry(r, s, created_ns=T0 + s * gap, numel=4 if (s < 3 or r == 0) else 8)
            for s in range(1, 5)]
        for r in (0, 1)
    }  # fmt: skip
    d = _diagnose([_write(tmp_path / "dumps", entries)], tmp_path)
    (m,) = [f for f in d.findings if f.kind == "mismatch"]
    assert (m.severity, m.ranks, m.seq) == ("warning", [], 3)
    calls = m.evidence["flight_recorder"]["calls"]
    assert [c["elements"] for c in calls] == [4, 8]


def test_dumps_that_end_apart_beside_a_log_showing_no_stop_blame_nobody(
    tmp_path: Path,
) -> None:
    """A dump taken on demand from a running job: one rank one collective behind.  The
    log beside it shows no stop, so the hang is only what it would mean (info)."""
    gap = 10_000_000
    entries = {r: [_entry(r, s, created_ns=T0 + s * gap) for s in range(1, 6 if r else 7)]
               for r in (0, 1, 2)}  # fmt: skip
    log = tmp_path / "run.log"
    healthy = [line for line in sample_text().splitlines() if not _FAILURE.search(line)]
    log.write_text("\n".join(healthy) + "\n")
    d = _diagnose([_write(tmp_path / "dumps", entries), log], tmp_path)
    (h,) = [f for f in d.findings if f.kind == "hang"]
    assert (h.severity, h.ranks) == ("info", [])
    assert h.evidence["waited_for"] == [1, 2]


def test_a_rank_late_at_most_collectives_is_a_straggler(tmp_path: Path) -> None:
    """Rank 2 enqueues every collective 3 ms after the others (10 ms apart): named from
    the enqueue times alone; a lone 2 ms jitter of another rank is not."""
    gap = 10_000_000
    entries: dict[int, list[dict[str, Any]]] = {r: [] for r in range(4)}
    for s in range(1, 61):
        for r in range(4):
            late = 3_000_000 if r == 2 else r * 10_000
            if s == 30 and r == 1:
                late = 2_000_000
            entries[r].append(_entry(r, s, created_ns=T0 + s * gap + late))
    d = _diagnose([_write(tmp_path / "dumps", entries)], tmp_path)
    stragglers = [f for f in d.findings if f.kind == "straggler"]
    assert [f.ranks for f in stragglers] == [[2]]
    assert stragglers[0].evidence["last_at"] == 60
    # Dumps alone say nothing of hosts: a clock ahead reads the same, so it is only info.
    assert stragglers[0].severity == "info"
    assert "chronyc" in stragglers[0].message


def test_the_dumps_name_the_culprit_a_log_finding_withheld(tmp_path: Path) -> None:
    """A hang the logs saw but could not blame anyone for takes the dumps' culprit, with
    the basis said; one that named the same rank keeps it, with the dumps as a basis."""
    gap = 10_000_000
    entries = {r: [_entry(r, s, created_ns=T0 + s * gap, retired=s < 5)
                   for s in range(1, 6 if r != 1 else 5)]
               for r in (0, 1, 2)}  # fmt: skip
    d = _diagnose([_write(tmp_path / "dumps", entries)], tmp_path)
    ctx = d.context
    withheld = Finding(
        kind="hang",
        severity="warning",
        message="the job stopped at AllReduce #9",
        evidence={"culprit_basis": "withheld", "culprit_bases": ["withheld"], "withheld": "x"},
    )
    (joined,) = with_flight(ctx, [withheld])
    assert joined is withheld
    assert joined.ranks == [1]
    assert joined.evidence["culprit_basis"] == "flight_recorder"
    assert "withheld" not in joined.evidence
    assert joined.evidence["flight_recorder"]["in_flight_at_dump"] == [0, 2]
    agreed = Finding(kind="hang", severity="critical", message="m", ranks=[1],
                     evidence={"culprit_basis": "desync", "culprit_bases": ["desync"]})  # fmt: skip
    (same,) = with_flight(ctx, [agreed])
    assert same.evidence["culprit_bases"] == ["desync", "flight_recorder"]
    assert same.ranks == [1]


def test_a_rank_whose_gpu_never_started_the_collective_is_the_culprit(tmp_path: Path) -> None:
    """NCCL's states: every member enqueued #5, ranks 0 and 2 started it, rank 1's GPU
    never did (its stream still busy before it): rank 1 is named."""
    gap = 10_000_000
    entries = {
        r: [_entry(r, s, created_ns=T0 + s * gap, retired=s < 5,
                   state="scheduled" if (s == 5 and r == 1) else None)
            for s in range(1, 6)]
        for r in (0, 1, 2)
    }  # fmt: skip
    d = _diagnose([_write(tmp_path / "dumps", entries)], tmp_path)
    (h,) = [f for f in d.findings if f.kind == "hang"]
    assert (h.severity, h.ranks, h.seq) == ("warning", [1], 5)
    assert h.evidence["flight_recorder"]["never_started"] == [1]
    assert "never started" in h.message


def test_dumps_of_two_runs_given_together_blame_nobody(tmp_path: Path) -> None:
    """Ranks 0-1 from the healthy run, ranks 2-3 from the one where rank 2 skipped a
    collective: compared with each other they would blame rank 2 for a stop that run's
    partners never saw.  Entered further apart than the timeout, they are not one run."""
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for rank, case in ((0, "healthy"), (1, "healthy"), (2, "skipped-collective"),
                       (3, "skipped-collective")):  # fmt: skip
        name = f"fr_trace_rank_{rank}"
        (mixed / name).write_bytes((FIXTURES / case / name).read_bytes())
    d = _diagnose([mixed], tmp_path)
    assert _blamed(d, ("hang", "mismatch", "straggler")) == []
    (note,) = [f for f in d.findings if f.evidence.get("source") == "flight_recorder"]
    assert note.kind == "config"
    assert "not come from one run" in note.message
