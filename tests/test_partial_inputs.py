"""Partial inputs: excerpts cut anywhere, hosts or ranks whose files are absent, logs
without init lines, world sizes only a launcher states."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest
from conftest import run_cli

from ncclscope.analysis import run_analysis
from ncclscope.detect import Context
from ncclscope.parsers.tools import sniff_tool
from ncclscope.synth import StopRank, SynthSpec, generate

REPO = Path(__file__).resolve().parent.parent
#: Every fixture log; NCCL tools' outputs (Inspector records, RAS reports: not logs, read
#: by ``parsers.tools``) are left out, nccl-tests output (a log too) is kept.
LOGS = sorted(
    p
    for p in (REPO / "fixtures").glob("*/*")
    if p.is_file()
    and p.name not in ("README.md", "expected.json")
    and sniff_tool(p.read_bytes()[:8192]) in (None, "nccl_tests")
)


def _excerpt(data: bytes, start_frac: float) -> bytes:
    """From mid-line at ``start_frac`` of the file to mid-line near its end: inside the
    comm pointer of the last COLL line (before ``[nranks=``) where there is one."""
    start = int(len(data) * start_frac) + 17
    last_coll = data.rfind(b" [nranks=")
    end = last_coll - 3 if last_coll > start else len(data) - 13
    return data[start:end]


@pytest.mark.parametrize("start_frac", [0.0, 0.37, 0.81])
@pytest.mark.parametrize("log", LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_excerpts_cut_mid_line_parse(tmp_path: Path, log: Path, start_frac: float) -> None:
    piece = _excerpt(log.read_bytes(), start_frac)
    path = tmp_path / "excerpt.log"
    path.write_bytes(piece)
    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    assert run.doc["problems"] == []
    assert run.input(str(path))["lines"] == piece.count(b"\n") + 1
    # A cut is not a restart: no more attempts than the whole file holds.
    assert 1 <= len(run.doc["attempts"]) <= _attempts_in(log)
    assert run.doc["attempts"][0]["started_by"] == ["start"]


@functools.cache
def _attempts_in(log: Path) -> int:
    doc = run_cli([log]).doc
    assert doc is not None
    return len(doc["attempts"])


def _per_rank_job(tmp_path: Path, spec: SynthSpec) -> Path:
    folder = tmp_path / "job"
    generate(spec, folder)
    (folder / "truth.json").unlink()
    return folder


def _file_of(folder: Path, rank: int, nranks: int) -> Path:
    found = [p for p in folder.glob("*.log") if f"rank {rank} nranks {nranks} " in p.read_text()]
    assert len(found) == 1
    return found[0]


def test_a_host_whose_files_are_absent(tmp_path: Path) -> None:
    spec = SynthSpec(ranks=8, hosts=2, steps=3, era="2.27", timestamps=True, seed=3,
                     layout="per-rank")  # fmt: skip
    folder = _per_rank_job(tmp_path, spec)
    for rank in range(4, 8):
        _file_of(folder, rank, 8).unlink()
    doc = run_cli([folder]).doc
    assert doc is not None
    job = doc["job"]
    assert (job["world_size"], job["world_size_source"]) == (8, "init")
    assert job["ranks_without_logs"] == [4, 5, 6, 7]
    assert [r["rank"] for r in job["ranks"]] == [0, 1, 2, 3]
    for f in doc["findings"]:
        assert f["severity"] == "info", f
        assert not set(f["ranks"]) & {4, 5, 6, 7}, f


def test_the_stopped_rank_without_a_file_is_exposed_to_detectors(tmp_path: Path) -> None:
    spec = SynthSpec(ranks=8, hosts=2, steps=4, era="2.27", timestamps=True, seed=3,
                     layout="per-rank", faults=(StopRank(rank=2, at_instance=9),))  # fmt: skip
    folder = _per_rank_job(tmp_path, spec)
    _file_of(folder, 2, 8).unlink()
    analysis = run_analysis([str(folder)], workdir=tmp_path / "w")
    assert analysis.analysis.ranks_without_logs == [2]
    assert Context(analysis.analysis).ranks_without_logs == frozenset({2})


def _drop_lines(folder: Path, needle: str) -> None:
    """Remove from every log of ``folder`` the lines that hold ``needle``."""
    for path in folder.glob("*.log"):
        kept = [x for x in path.read_text().splitlines() if needle not in x]
        path.write_text("\n".join(kept) + "\n")


def test_world_size_from_coll_lines_without_init_lines(tmp_path: Path) -> None:
    spec = SynthSpec(ranks=8, hosts=2, steps=3, era="2.27", timestamps=True, seed=4,
                     layout="per-rank")  # fmt: skip
    folder = _per_rank_job(tmp_path, spec)
    _drop_lines(folder, " Init ")
    doc = run_cli([folder]).doc
    assert doc is not None
    job = doc["job"]
    # The Destroy lines at the end still name each member's rank and size (issue #18).
    assert (job["world_size"], job["world_size_source"]) == (8, "teardown")
    assert job["ranks_without_logs"] == []
    _drop_lines(folder, " COMPLETE")
    doc = run_cli([folder]).doc
    assert doc is not None
    job = doc["job"]
    assert (job["world_size"], job["world_size_source"]) == (8, "coll")
    # Members whose rank no line names: which ranks are absent cannot be told.
    assert job["ranks_without_logs"] is None


_WATCHDOG = (
    "[rank{r}]:[E1103 14:02:51.311000 2201 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog "
    "caught collective operation timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE, "
    "NumelIn=4096, NumelOut=4096, Timeout(ms)=600000) ran for 600045 milliseconds before "
    "timing out."
)


@pytest.mark.parametrize(
    "launcher",
    [
        "  global_world_sizes=[16, 16, 16, 16, 16, 16, 16, 16]",
        "WORLD_SIZE=16",
        "[rank0]:[I1103 13:51:02.004000 2201 ProcessGroupNCCL.cpp:919] [PG 0 Rank 0] "
        "ProcessGroupNCCL initialization options: size: 16, global rank: 0, "
        "TIMEOUT(ms): 600000",
    ],
)
def test_world_size_from_launcher_lines(tmp_path: Path, launcher: str) -> None:
    lines = [launcher, _WATCHDOG.format(r=3), _WATCHDOG.format(r=5)]
    path = tmp_path / "torch.log"
    path.write_text("\n".join(lines) + "\n")
    doc = run_cli([path]).doc
    assert doc is not None
    job = doc["job"]
    assert (job["world_size"], job["world_size_source"]) == (16, "launcher")
    assert job["ranks_without_logs"] == [r for r in range(16) if r not in (3, 5)]


def test_no_world_size_no_ranks_without_logs(tmp_path: Path) -> None:
    path = tmp_path / "torch.log"
    path.write_text(_WATCHDOG.format(r=1) + "\n")
    doc = run_cli([path]).doc
    assert doc is not None
    assert doc["job"]["world_size"] is None
    assert doc["job"]["ranks_without_logs"] is None
    shutil.rmtree(tmp_path, ignore_errors=True)
