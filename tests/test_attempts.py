"""Several runs in one file split into attempts, each diagnosed on its own; and live
sequence numbers that keep growing once the follower's window is full."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import run_cli

import ncclscope.analysis as analysis_module
import ncclscope.diagnose as diagnose_module
from ncclscope.agent.live import LiveWindow
from ncclscope.agent.progress import LiveProgress, MemberIndex, member_rows
from ncclscope.detect.base import Finding
from ncclscope.detect.context import Context

REPO = Path(__file__).resolve().parent.parent

#: 2 hosts x 2 GPUs; NCCL 2.7 shapes (no commId, no Init START), written from
#: shared/formats/nccl.md.
_HOSTS = ("gpu-b1", "gpu-b1", "gpu-b2", "gpu-b2")
_PTRS = ("0x7f31a8000b70", "0x7f62c4000b70", "0x7f31a8000b70", "0x7f62c4000b70")


def _run(
    pids: tuple[int, ...], calls: int, *, banners: bool = True, stop: int | None = None
) -> list[list[str]]:
    """One run's lines per rank: banner (rank 0 only, as NCCL prints it), Init COMPLETE,
    then ``calls`` AllReduce calls (``stop``: that rank logs one call fewer)."""
    out: list[list[str]] = []
    for rank, (host, pid) in enumerate(zip(_HOSTS, pids, strict=True)):
        dev = rank % 2
        lines = [
            f"{host}:{pid}:{pid} [{dev}] NCCL INFO Bootstrap : Using [0]ib0:10.4.0.{7 + rank}<0>"
        ]
        if banners and rank == 0:
            lines.append(f"{host}:{pid}:{pid} [{dev}] NCCL INFO NCCL version 2.7.8+cuda11.0")
        lines.append(
            f"{host}:{pid}:{pid + 41} [{dev}] NCCL INFO comm {_PTRS[rank]} rank {rank} nranks 4 "
            f"cudaDev {dev} busId {dev + 1}a000 - Init COMPLETE"
        )
        n = calls - 1 if stop == rank else calls
        lines += [
            f"{host}:{pid}:{pid} [{dev}] NCCL INFO AllReduce: opCount {k:x} sendbuff "
            f"0x7f2e00000000 recvbuff 0x7f2e00000000 count {4096 + k % 2} datatype 7 op 0 "
            f"root 0 comm {_PTRS[rank]} [nranks=4] stream 0x5591c0e0"
            for k in range(n)
        ]
        out.append(lines)
    return out


def _interleave(per_rank: list[list[str]]) -> list[str]:
    """A combined log (torchrun's stdout): the ranks' lines in turn."""
    longest = max(len(lines) for lines in per_rank)
    return [lines[k] for k in range(longest) for lines in per_rank if k < len(lines)]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_two_runs_without_comm_id_are_two_attempts_and_no_hang(tmp_path: Path) -> None:
    # Both runs healthy.  The second's pids sort before the first's on one host and after
    # on the other: matched by (nranks, creation order) and split by rank, run 2's ranks
    # 0-1 and run 1's ranks 2-3 made one communicator (12 calls against 8: a "hang").
    first = _run((3101, 3102, 5120, 5121), 12)
    second = _run((211, 212, 5230, 5231), 8)
    log = _write(tmp_path / "job.log", _interleave(first) + _interleave(second))
    doc = run_cli([log]).doc
    assert doc is not None
    assert [f for f in doc["findings"] if f["kind"] == "hang"] == []
    attempts = doc["attempts"]
    assert [a["index"] for a in attempts] == [0, 1]
    assert attempts[0]["started_by"] == ["start"]
    assert attempts[1]["started_by"] == ["pids"]
    assert attempts[0]["pids"] == [3101, 3102, 5120, 5121]
    assert attempts[1]["pids"] == [211, 212, 5230, 5231]
    assert all(a["ranks"] == [0, 1, 2, 3] and a["world_size"] == 4 for a in attempts)
    # Run 2 starts at the first line that names its process: rank 0's banner, after the
    # four Bootstrap lines (which name no communicator).
    banner = len(_interleave(first)) + 5
    assert "NCCL version" in log.read_text().splitlines()[banner - 1]
    assert attempts[0]["spans"][0]["last_line"] == banner - 1
    assert attempts[1]["spans"][0]["first_line"] == banner
    # The job as it stands is the last run: 8 calls per rank.
    assert doc["collectives"]["calls"] == 32


def test_reused_pids_split_at_the_second_banner(tmp_path: Path) -> None:
    # A container restarted: the same pids, the same comm pointers.  Run 1 lost rank 2's
    # last call (it died); run 2 is healthy.  Merged, rank 2 looked stuck in the job as
    # it stands; split, the stop belongs to attempt 0.
    pids = (31, 32, 31, 32)
    first = _interleave(_run(pids, 12, stop=2))
    log = _write(tmp_path / "job.log", first + _interleave(_run(pids, 8)))
    doc = run_cli([log]).doc
    assert doc is not None
    attempts = doc["attempts"]
    assert len(attempts) == 2
    assert attempts[1]["started_by"] == ["banner"]
    assert attempts[1]["spans"][0]["first_line"] == len(first) + 5  # its banner line
    later = [doc["findings"][k] for k in attempts[1]["findings"]]
    assert all(f["kind"] != "hang" for f in later)
    only_first = set(attempts[0]["findings"]) - set(attempts[1]["findings"])
    assert only_first  # the stop (a hang, or "the log ends mid-run" without evidence)
    for k in only_first:
        assert doc["findings"][k]["evidence"]["attempt"] == 0
        assert doc["findings"][k]["message"].startswith("attempt 0: ")
    # Advice about the logs that both attempts give is one finding, in both lists.
    shared = set(attempts[0]["findings"]) & set(attempts[1]["findings"])
    assert {doc["findings"][k]["kind"] for k in shared} == {"config"}
    assert all("attempt" not in doc["findings"][k]["evidence"] for k in shared)
    hangs = [f for f in doc["findings"] if f["kind"] == "hang"]
    assert hangs
    for f in hangs:
        assert f["evidence"]["attempt"] == 0
        assert set(f["ranks"]) <= {2}


def test_reused_pids_without_banner_split_at_the_launcher_restart(tmp_path: Path) -> None:
    pids = (31, 32, 31, 32)
    first = _interleave(_run(pids, 12, banners=False))
    restart = [
        "[2026-03-02 10:04:11,220] torch.distributed.elastic.agent.server.api: [WARNING] "
        "[default] Worker group FAILED. 2/3 attempts left; will restart worker group",
        "[2026-03-02 10:04:14,901] torch.distributed.elastic.agent.server.api: [INFO] "
        "[default] Rendezvous complete for workers. Result:",
        "  restart_count=1",
    ]
    second = _interleave(_run(pids, 8, banners=False))
    doc = run_cli([_write(tmp_path / "job.log", first + restart + second)]).doc
    assert doc is not None
    attempts = doc["attempts"]
    assert len(attempts) == 2
    assert "restart" in attempts[1]["started_by"]
    assert attempts[1]["spans"][0]["first_line"] == len(first) + 1
    assert doc["collectives"]["calls"] == 32


def test_per_rank_files_with_two_runs_each(tmp_path: Path) -> None:
    first = _run((3101, 3102, 5120, 5121), 12)
    second = _run((4101, 4102, 6120, 6121), 8)
    paths = [_write(tmp_path / f"rank{r}.log", first[r] + second[r]) for r in range(4)]
    doc = run_cli(paths).doc
    assert doc is not None
    attempts = doc["attempts"]
    assert len(attempts) == 2
    assert [len(a["spans"]) for a in attempts] == [4, 4]
    assert attempts[1]["pids"] == [4101, 4102, 6120, 6121]


def test_one_run_is_one_attempt_even_when_files_are_joined(tmp_path: Path) -> None:
    # Two ranks' logs of one run joined end to end: new pids, but other (host, rank)
    # slots, so not a new run.
    run = _run((3101, 3102, 5120, 5121), 6)
    doc = run_cli([_write(tmp_path / "joined.log", [x for lines in run for x in lines])]).doc
    assert doc is not None
    assert len(doc["attempts"]) == 1
    assert doc["attempts"][0]["started_by"] == ["start"]
    assert doc["attempts"][0]["findings"] == list(range(len(doc["findings"])))
    assert all("attempt" not in f["evidence"] for f in doc["findings"])


def _headless(lines: list[str]) -> list[str]:
    """A run's lines cut at the head: its banner, bootstrap and init lines gone."""
    return [x for x in lines if "opCount" in x][3:]


def test_per_rank_files_whose_first_run_lost_its_head(tmp_path: Path) -> None:
    """Each rank's file holds the first run cut at the head (calls only: no line says
    which rank its process is) and then the whole second run: the same turnover in every
    file is a restart, so two attempts, each diagnosed on its own."""
    first = _run((3101, 3102, 5120, 5121), 12)
    second = _run((4101, 4102, 6120, 6121), 8)
    paths = [_write(tmp_path / f"rank{r}.log", _headless(first[r]) + second[r]) for r in range(4)]
    doc = run_cli(paths).doc
    assert doc is not None
    assert [a["started_by"] for a in doc["attempts"]] == [["start"], ["pids"]]
    assert doc["attempts"][1]["pids"] == [4101, 4102, 6120, 6121]


def test_one_file_whose_first_process_lost_its_head_is_one_run(tmp_path: Path) -> None:
    """The same in one file only (the others hold one process each): two ranks' files
    joined end to end look so too; no restart is read from one file."""
    first = _run((3101, 3102, 5120, 5121), 12)
    second = _run((4101, 4102, 6120, 6121), 8)
    paths = [_write(tmp_path / "rank0.log", _headless(first[0]) + second[0])]
    paths += [_write(tmp_path / f"rank{r}.log", second[r]) for r in range(1, 4)]
    doc = run_cli(paths).doc
    assert doc is not None
    assert len(doc["attempts"]) == 1


def _coll(pid: int, dev: int, seq: int, comm: str) -> str:
    # NCCL >= 2.27 on a single node: opCount is 0 on every call.
    return (
        f"gpu-a:{pid}:{pid} [{dev}] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f10a0000000 "
        f"recvbuff 0x7f10a0000000 count {1024 + seq % 3} datatype 7 op 0 root 0 comm {comm} "
        f"[nranks=2] stream 0x5600aa00"
    )


def _init(pid: int, dev: int, comm: str) -> str:
    return (
        f"[2026-03-02 10:00:00.000100] gpu-a:{pid}:{pid} [{dev}] NCCL INFO ncclCommInitRank "
        f"comm {comm} rank {dev} nranks 2 cudaDev {dev} nvmlDev {dev} busId {dev + 1}8000 "
        f"commId 0x5e1f00c0ffee0001 - Init COMPLETE"
    )


def test_live_sequence_keeps_growing_past_the_window(tmp_path: Path) -> None:
    window = LiveWindow(tmp_path / "seg", max_lines=40, segment_lines=10, keep_lines=20)
    comms = {0: "0x55d400a0", 1: "0x55e500b0"}
    t0 = datetime(2026, 3, 2, 10, 0, 1, tzinfo=UTC)
    live = LiveProgress()  # what the agent counts the calls with, line by line
    window.add([("r.log", _init(700 + d, d, comms[d]), t0) for d in (0, 1)])
    seen: list[float] = []
    seq = 0
    for poll in range(6):
        at = t0 + timedelta(seconds=poll + 1)
        lines = []
        for _ in range(15):  # 30 lines a poll: the window holds 40
            lines += [("r.log", _coll(700 + d, d, seq, comms[d]), at) for d in (0, 1)]
            seq += 1
        window.add(lines)
        live.add(lines, own_times=window.own_times)
        analysis = window.analyse(tmp_path / f"w{poll}")
        assert analysis is not None
        ids = window.file_ids(analysis.analysis.paths)
        members = analysis.context.analysis.identity.members
        rows = dict(member_rows(live, MemberIndex.of(members), ids)["ncclscope_collective_seq"])
        assert len(rows) == 2
        assert len(set(rows.values())) == 1  # both members at the same call
        seen.append(next(iter(rows.values())))
    window.close()
    assert window.added > 3 * 40  # the window was overrun several times over
    # Every call since the follower started, counted from 0: 15 calls a poll.
    assert seen == [15.0 * (k + 1) - 1 for k in range(6)]


def test_restart_fixture_no_false_hang() -> None:
    # fixtures/restart-27-no-commid: run 1 lost rank 3's process (SIGKILL), the launcher
    # restarted the workers with new pids.  Matched as one job, the two runs made two
    # communicators of mixed members and two critical hangs.
    doc = run_cli([REPO / "fixtures" / "restart-27-no-commid"]).doc
    assert doc is not None
    assert len(doc["attempts"]) == 2
    now = [doc["findings"][k] for k in doc["attempts"][1]["findings"]]
    assert [f for f in now if f["kind"] in ("hang", "mismatch", "timeout")] == []
    for f in doc["findings"]:
        if f["kind"] == "hang":  # only about run 1, whose rank 3 was killed
            assert f["evidence"]["attempt"] == 0
            assert set(f["ranks"]) <= {3}


def test_per_rank_files_with_reused_pids_and_new_pointers(tmp_path: Path) -> None:
    # Containers restarted: every process is pid 1 again, its communicator at another
    # address, and only rank 0 prints the banner: ranks 1-3's files show only a new Init
    # in the same (nranks, rank) place after the old communicator's last call.
    global _PTRS
    old = _PTRS
    first = _run((1, 1, 1, 1), 12, banners=False)
    _PTRS = ("0x7f99e8001200", "0x7fa0b4001200", "0x7f99e8001200", "0x7fa0b4001200")
    try:
        second = _run((1, 1, 1, 1), 8, banners=False)
    finally:
        _PTRS = old
    paths = [_write(tmp_path / f"rank{r}.log", first[r] + second[r]) for r in range(4)]
    doc = run_cli(paths).doc
    assert doc is not None
    attempts = doc["attempts"]
    assert len(attempts) == 2
    assert attempts[1]["started_by"] == ["init"]
    assert [s["first_line"] for s in attempts[1]["spans"]] == [len(first[r]) + 2 for r in range(4)]
    assert doc["collectives"]["calls"] == 32
    assert [f for f in doc["findings"] if f["kind"] == "hang"] == []


def test_a_failed_attempts_errors_stay(tmp_path: Path) -> None:
    first = _run((3101, 3102, 5120, 5121), 12, stop=2)
    first[2].append(
        "gpu-b2:5120:5188 [0] transport/net_socket.cc:424 NCCL WARN NET/Socket : peer "
        "10.4.0.9<43512> closed connection"
    )
    second = _run((211, 212, 5230, 5231), 8)
    log = _write(tmp_path / "job.log", _interleave(first) + _interleave(second))
    doc = run_cli([log]).doc
    assert doc is not None
    assert len(doc["attempts"]) == 2
    text = log.read_text().splitlines()
    warn = next(k for k, x in enumerate(text, start=1) if "NCCL WARN" in x)
    assert warn < len(_interleave(first))
    assert [e["first_line"]["line_no"] for e in doc["errors"]] == [warn]
    errs = [f for f in doc["findings"] if f["kind"] == "nccl_error"]
    assert errs
    assert all(f["evidence"]["attempt"] == 0 for f in errs)
    assert all(doc["findings"].index(f) in doc["attempts"][0]["findings"] for f in errs)


def test_files_joining_two_runs_of_different_ranks(tmp_path: Path) -> None:
    # Each file holds run 1's rank r, then run 2's rank r^1 (same host, other GPU): the
    # new process holds no slot the file held before, but one another file held.
    first = _run((3101, 3102, 5120, 5121), 12)
    second = _run((4101, 4102, 6120, 6121), 8)
    paths = [_write(tmp_path / f"f{r}.log", first[r] + second[r ^ 1]) for r in range(4)]
    doc = run_cli(paths).doc
    assert doc is not None
    attempts = doc["attempts"]
    assert [a["started_by"] for a in attempts] == [["start"], ["pids"]]
    assert attempts[1]["pids"] == [4101, 4102, 6120, 6121]
    assert [f for f in doc["findings"] if f["kind"] in ("hang", "mismatch")] == []


def test_detectors_see_that_an_attempt_was_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Run 1 stopped and run 2 started: the detectors on run 1 are told so (a stop's
    # evidence), those on the last run are not.
    seen: list[list[str] | None] = []
    real = diagnose_module.run_context

    def spy(ctx: Context) -> list[Finding]:
        seen.append(ctx.followed_by)
        return real(ctx)

    monkeypatch.setattr(diagnose_module, "run_context", spy)
    first = _run((3101, 3102, 5120, 5121), 12, stop=2)
    second = _run((211, 212, 5230, 5231), 8)
    log = _write(tmp_path / "job.log", _interleave(first) + _interleave(second))
    a = analysis_module.run_analysis([str(log)], workdir=tmp_path / "w")
    assert seen == [["pids"], None]
    assert a.analysis.followed_by is None
