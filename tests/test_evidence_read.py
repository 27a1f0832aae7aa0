"""Evidence folders read back: the culprit and its kind from what each process answered.

Folders are written here as the collector writes them (manifest + stacks in py-spy's
text layout); ``analyze FOLDER`` must name the culprit and its kind from them, and never
blame a rank that only waited.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ncclscope.cli import cli
from ncclscope.evidence.manifest import Ask, Manifest, read_manifest, write_manifest
from ncclscope.evidence.read import judge, read_evidence

IN_COLLECTIVE = """Process {pid}: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread {pid} (idle): "MainThread"
    all_reduce (/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:2950)
    wrapper (/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:81)
    {func} (/job/train.py:{line})
    <module> (/job/train.py:97)
"""

IN_LOCK = """Process {pid}: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread {pid} (idle): "MainThread"
    acquire (/usr/lib/python3.11/threading.py:327)
    save_shard (/job/train.py:52)
    train (/job/train.py:80)
    <module> (/job/train.py:97)
"""

IN_LOADER = """Process {pid}: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread {pid} (idle): "MainThread"
    get (/usr/lib/python3.11/multiprocessing/queues.py:113)
    __next__ (/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py:725)
    next_batch (/job/train.py:88)
    <module> (/job/train.py:97)
"""


def _folder(
    root: Path,
    host: str,
    procs: list[tuple[int, int, str | None, str]],
    *,
    gone: list[tuple[int, int]] = (),  # type: ignore[assignment]
) -> Path:
    """One node's folder: ``procs`` are (rank, pid, stack text or None, state)."""
    folder = root / f"20261128T043000Z-{host}-0xabc-120"
    (folder / "stacks").mkdir(parents=True)
    asks = []
    for rank, pid, text, state in procs:
        asks.append(
            Ask("flight_dump", f"rank {rank} (pid {pid})", "control_plane", "unavailable",
                why="no worker server socket", pid=pid, rank=rank, state=state)
        )  # fmt: skip
        if text is None:
            asks.append(
                Ask("stack", f"rank {rank} (pid {pid})", "py-spy", "no_answer",
                    why="no answer within 5.0 s", pid=pid, rank=rank, state=state)
            )  # fmt: skip
            continue
        rel = f"stacks/rank{rank}.txt"
        (folder / rel).write_text(text.format(pid=pid, func="step", line=40), encoding="utf-8")
        asks.append(
            Ask("stack", f"rank {rank} (pid {pid})", "py-spy", "answered", file=rel,
                pid=pid, rank=rank, state=state)
        )  # fmt: skip
    for rank, pid in gone:
        asks.append(
            Ask("stack", f"rank {rank} (pid {pid})", "process table", "error",
                why=f"process {pid} is gone", pid=pid, rank=rank, state="gone")
        )  # fmt: skip
    write_manifest(
        folder,
        Manifest(
            host=host,
            written_utc="2026-11-28T04:30:00Z",
            stall={"comm": "0xabc", "seq": 120, "op": "AllReduce", "complete": True},
            asks=asks,
        ),
    )
    return folder


def _job(root: Path, fault: str) -> None:
    """Two nodes of two ranks; rank 3 on node-b is the culprit of kind ``fault``."""
    a = [(0, 100, IN_COLLECTIVE, "sleeping"), (1, 101, IN_COLLECTIVE, "sleeping")]
    b: list[tuple[int, int, str | None, str]] = [(2, 200, IN_COLLECTIVE, "sleeping")]
    gone: list[tuple[int, int]] = []
    if fault == "lock":
        b.append((3, 201, IN_LOCK, "sleeping"))
    elif fault == "loader":
        b.append((3, 201, IN_LOADER, "sleeping"))
    elif fault == "dead":
        gone.append((3, 201))
    elif fault == "frozen":
        b = [(2, 200, IN_COLLECTIVE, "stopped"), (3, 201, IN_COLLECTIVE, "stopped")]
    elif fault == "other_collective":
        other = IN_COLLECTIVE.replace("{func} (/job/train.py:{line})", "side (/job/train.py:61)")
        b.append((3, 201, other, "sleeping"))
    _folder(root, "node-a", a)
    _folder(root, "node-b", b, gone=gone)


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        ("lock", "stuck_outside_nccl"),
        ("loader", "stuck_outside_nccl"),
        ("dead", "dead_process"),
        ("other_collective", "stuck_in_nccl"),
    ],
)
def test_judge_names_the_culprit_and_its_kind(tmp_path: Path, fault: str, kind: str) -> None:
    _job(tmp_path, fault)
    ev = read_evidence(sorted(tmp_path.rglob("manifest.json")))
    got = judge(ev)
    assert [(c.ranks, c.hosts, c.kind) for c in got] == [([3], ["node-b"], kind)]


def test_a_frozen_node_is_named_whole(tmp_path: Path) -> None:
    _job(tmp_path, "frozen")
    got = judge(read_evidence(sorted(tmp_path.rglob("manifest.json"))))
    assert [(c.ranks, c.hosts, c.kind) for c in got] == [([2, 3], ["node-b"], "frozen_node")]
    assert "every process of node-b" in got[0].reason


def test_ranks_that_all_wait_alike_blame_nobody(tmp_path: Path) -> None:
    _job(tmp_path, "none")
    assert judge(read_evidence(sorted(tmp_path.rglob("manifest.json")))) == []


def test_every_process_gone_blames_nobody(tmp_path: Path) -> None:
    """A job that ended (or was torn down) before the folders were written."""
    _folder(tmp_path, "node-a", [], gone=[(0, 100), (1, 101)])
    _folder(tmp_path, "node-b", [], gone=[(2, 200), (3, 201)])
    assert judge(read_evidence(sorted(tmp_path.rglob("manifest.json")))) == []


def test_a_rank_that_did_not_answer_is_not_a_culprit(tmp_path: Path) -> None:
    _folder(tmp_path, "node-a", [(0, 100, IN_COLLECTIVE, "sleeping"), (1, 101, None, "running")])
    ev = read_evidence(sorted(tmp_path.rglob("manifest.json")))
    assert judge(ev) == []
    silent = next(v for v in ev.ranks if v.rank == 1)
    assert any("no answer within" in w for w in silent.why)


def test_analyze_reads_the_folders(tmp_path: Path) -> None:
    _job(tmp_path, "loader")
    got = CliRunner().invoke(cli, ["analyze", str(tmp_path), "--format", "json"])
    assert got.exit_code == 0, got.output
    doc = json.loads(got.stdout)
    hangs = [f for f in doc["findings"] if f["kind"] == "hang"]
    assert [(f["ranks"], f["hosts"], f["hang_class"]) for f in hangs] == [
        ([3], ["node-b"], "stuck_outside_nccl")
    ]
    assert "next_batch" in hangs[0]["message"]
    text = CliRunner().invoke(cli, ["analyze", str(tmp_path)])
    assert "stuck outside NCCL" in text.stdout


def test_a_damaged_manifest_is_a_problem_not_a_stop(tmp_path: Path) -> None:
    _job(tmp_path, "lock")
    bad = tmp_path / "20261128T043000Z-node-a-0xabc-120" / "manifest.json"
    bad.write_text(
        '{"schema": "ncclscope.evidence/1", "host": "node-a", "asks": [{"what": 3', "utf-8"
    )
    got = CliRunner().invoke(cli, ["analyze", str(tmp_path), "--format", "json"])
    assert got.exit_code == 1  # an input could not be read, and says so
    assert "manifest" in got.stderr
    doc = json.loads(got.stdout)
    hangs = [f for f in doc["findings"] if f["kind"] == "hang"]
    assert [(f["ranks"], f["hang_class"]) for f in hangs] == [([3], "stuck_outside_nccl")]


def test_json_nested_too_deeply_in_a_manifest_or_a_stack_is_a_problem_not_a_stop(
    tmp_path: Path,
) -> None:
    """Fuzz #28: ``[[[[...`` junk in a manifest or a py-spy JSON stack was a
    RecursionError out of the JSON decoder; the manifest is a problem, the stack holds
    no thread, the other folder is read."""
    from ncclscope.evidence.stacks import parse_stacks

    assert parse_stacks("[" * 100_000) == []
    _job(tmp_path, "lock")
    bad = tmp_path / "20261128T043000Z-node-a-0xabc-120" / "manifest.json"
    bad.write_text('{"schema": "ncclscope.evidence/1", "host": "node-a", "asks": ' + "[" * 100_000)
    with pytest.raises(ValueError, match="nested too deeply"):
        read_manifest(bad)
    stack = tmp_path / "20261128T043000Z-node-b-0xabc-120" / "stacks" / "rank2.txt"
    stack.write_text("[" * 100_000)
    got = CliRunner().invoke(cli, ["analyze", str(tmp_path), "--format", "json"])
    assert got.exception is None or isinstance(got.exception, SystemExit), got.exception
    assert got.exit_code == 1  # the manifest could not be read, and says so
    assert "nested too deeply" in got.stderr
    assert json.loads(got.stdout)["evidence"]["folders"]


def test_manifest_round_trip_keeps_every_field(tmp_path: Path) -> None:
    m = Manifest(
        host="node-a",
        written_utc="2026-11-28T04:30:00Z",
        stall={"comm": "0xabc", "seq": 1},
        asks=[Ask("stack", "rank 1 (pid 7)", "py-spy", "refused", why="ptrace", file=None,
                  elapsed_s=0.25, pid=7, rank=1, size_bytes=0, state="sleeping")],
    )  # fmt: skip
    (tmp_path / "f").mkdir()
    write_manifest(tmp_path / "f", m)
    assert read_manifest(tmp_path / "f" / "manifest.json") == m


def test_the_folders_complete_a_hang_the_logs_could_only_suppose(tmp_path: Path) -> None:
    """The stalled fixture ends mid-collective: alone, analyze names nobody at info ("if
    the job was stuck"). Node-1's folder shows rank 6 in the data loader while the others
    wait in the all-gather: the hang is named, at warning, with its kind and host."""
    repo = Path(__file__).resolve().parent.parent
    log = repo / "fixtures" / "stalled-227-ts" / "job.log"
    waiting = [(r, 100 + r, IN_COLLECTIVE, "sleeping") for r in (4, 5, 7)]
    _folder(tmp_path / "ev", "node-1", [*waiting, (6, 106, IN_LOADER, "sleeping")])
    alone = CliRunner().invoke(cli, ["analyze", str(log), "--format", "json"])
    before = [f for f in json.loads(alone.stdout)["findings"] if f["kind"] == "hang"]
    assert [(f["severity"], f["ranks"]) for f in before] == [("info", [])]
    got = CliRunner().invoke(cli, ["analyze", str(log), str(tmp_path / "ev"), "--format", "json"])
    assert got.exit_code == 0, got.stderr
    hangs = [f for f in json.loads(got.stdout)["findings"] if f["kind"] == "hang"]
    assert [(f["severity"], f["ranks"], f["hosts"], f["hang_class"]) for f in hangs] == [
        ("warning", [6], ["node-1"], "stuck_outside_nccl")
    ]
    assert "AllGather #30" in hangs[0]["message"]
    assert "next_batch" in hangs[0]["message"]


@pytest.mark.parametrize("file", ["/etc/hostname", "../outside.txt", "stacks/../../outside.txt"])
def test_a_manifest_names_no_file_outside_its_folder(tmp_path: Path, file: str) -> None:
    """A damaged or hostile manifest's answer file outside the evidence folder (an
    absolute path, ``..``) is no file: the reader never opens it."""
    doc = {"what": "py_stack", "target": "rank 5", "via": "py-spy", "outcome": "answered",
           "file": file, "rank": 5, "pid": 4321}  # fmt: skip
    assert Ask.from_json(doc).file is None
    assert Ask.from_json({**doc, "file": "stacks/rank5.txt"}).file == "stacks/rank5.txt"
