"""``ncclscope replay`` of several files: merged by time, each file in its own order.

Per-rank logs (``NCCL_DEBUG_FILE=%h.%p``) are one file per process; a replay must release
their lines across files as the job wrote them, or a hang's countdown starts as late as
the files before the culprit's end (issue 13).
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ncclscope.agent.replay import ReplayLine, ReplaySource, line_time
from ncclscope.agent.run import Agent, AgentConfig
from ncclscope.parsers.torch.lines import logger_time

T = datetime(2025, 3, 14, 9, 0, 0, tzinfo=UTC)


def _nccl(second: float, pid: int, msg: str) -> str:
    """A 2.27 INFO line with its timestamp, ``second`` seconds after 09:00:00."""
    stamp = (T + timedelta(seconds=second)).strftime("%Y-%m-%d %H:%M:%S.%f")
    return f"[{stamp}] node-0:{pid}:{pid} [0] NCCL INFO {msg}"


class _Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{x}\n" for x in lines))
    return path


def _texts(lines: list[ReplayLine]) -> list[str]:
    return [x.text.rsplit(" ", 1)[-1] for x in lines]


def test_lines_go_out_in_time_order_across_files_and_in_file_order_within_each(
    tmp_path: Path,
) -> None:
    a = _write(
        tmp_path / "node-0.100.log",
        [
            _nccl(1.0, 100, "a1"),
            "a-untimed",  # keeps a1's time
            _nccl(4.0, 100, "a4"),
            _nccl(7.0, 100, "a7"),
        ],
    )
    b = _write(
        tmp_path / "node-0.200.log",
        [
            "b-lead",  # takes the file's first time, 2 s
            _nccl(2.0, 200, "b2"),
            _nccl(5.0, 200, "b5"),
            _nccl(3.0, 200, "b3-back"),  # its clock stepped back: stays after b5, at 5 s
            _nccl(6.0, 200, "b6"),
        ],
    )
    c = _write(
        tmp_path / "node-0.300.log",
        [
            _nccl(4.0, 300, "c4"),  # ties with a4: the file given first goes first
            # torchrun's own lines: the logger's time (year from the NCCL stamps)
            "W0314 09:00:06.500000 300 torch/distributed/elastic/multiprocessing/api.py:897] "
            "Sending process 100 closing signal c-glog",
        ],
    )
    clock = _Clock()
    source = ReplaySource([a, b, c], clock=clock)
    assert source.t0 == T + timedelta(seconds=1)
    got = source.poll()
    assert _texts(got) == ["a1", "a-untimed"]
    assert {x.arrived for x in got} == {T + timedelta(seconds=1)}
    clock.t = 2.5  # 09:00:03.5
    assert _texts(source.poll()) == ["b-lead", "b2"]
    clock.t = 4.5  # 09:00:05.5
    got = source.poll()
    assert _texts(got) == ["a4", "c4", "b5", "b3-back"]
    assert got[-1].arrived == T + timedelta(seconds=5)
    assert got[-1].path == str(b)
    assert not source.done
    clock.t = 10.0
    assert _texts(source.poll()) == ["b6", "c-glog", "a7"]
    assert source.done


def test_a_file_without_any_time_goes_out_at_the_start(tmp_path: Path) -> None:
    timed = _write(tmp_path / "a.log", [_nccl(3.0, 1, "x3"), _nccl(9.0, 1, "x9")])
    bare = _write(tmp_path / "b.log", ["plain one", "plain two"])
    source = ReplaySource([timed, bare], clock=_Clock())
    assert _texts(source.poll()) == ["x3", "one", "two"]


def test_the_start_can_be_given_on_the_wall_clock_and_in_log_time(tmp_path: Path) -> None:
    log = _write(tmp_path / "a.log", [_nccl(s, 1, f"x{s:g}") for s in (0.0, 10.0, 20.0, 30.0)])
    clock = _Clock()
    clock.t = 1000.0
    # Its clock reads 09:00:15 at t=1005: before that, nothing; 5 s later, up to 09:00:20.
    source = ReplaySource(
        [log], clock=clock, origin=1005.0, t0=T + timedelta(seconds=15), speed=1.0
    )
    assert source.poll() == []
    clock.t = 1005.0
    assert _texts(source.poll()) == ["x0", "x10"]  # before its start: at once
    clock.t = 1010.0
    assert _texts(source.poll()) == ["x20"]
    assert source.now() == T + timedelta(seconds=20)
    # Two replays of different files given the same origin and t0 read the same clock.
    other = ReplaySource(
        [_write(tmp_path / "b.log", [_nccl(40.0, 2, "y")])],
        clock=clock,
        origin=1005.0,
        t0=T + timedelta(seconds=15),
    )
    assert other.now() == source.now()


def _stamp(text: str) -> datetime | None:
    return line_time(text) or logger_time(text, 2025)


def _synth(out: Path, layout: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "ncclscope", "synth", "--out", str(out), "--ranks", "8",
         "--hosts", "2", "--layout", layout, "--timestamps", "--era", "2.27",
         "--stop-rank", "3:20", "--framework", "torch", "--pg-timeout", "600", "--seed", "3"],
        check=True, capture_output=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[Path]]:
    """One hung job (rank 3 never enters world collective #20, 600 s timeout) written
    as one combined log and as per-rank logs (torchrun's own file on each host too)."""
    root = tmp_path_factory.mktemp("job")
    _synth(root / "combined", "combined")
    _synth(root / "per-rank", "per-rank")
    return [root / "combined" / "job.log"], sorted((root / "per-rank").glob("*.log"))


def test_per_rank_files_go_out_in_time_order(job: tuple[list[Path], list[Path]]) -> None:
    _combined, per_rank = job
    assert len(per_rank) == 10  # 8 ranks and torchrun on each of the 2 hosts
    clock = _Clock()
    source = ReplaySource(per_rank, clock=clock)
    order: list[ReplayLine] = []
    for t in (3.0, 7.0, 8.0, 20.0, 1000.0):
        clock.t = t
        got = source.poll()
        assert all(x.arrived <= source.now() for x in got)
        order += got
        if t == 8.0:
            # Every file is out up to its first line stamped after now: none waits for
            # the files given before it.
            for path in per_rank:
                out = [x.text for x in order if x.path == str(path)]
                later = path.read_text().splitlines()[len(out) :]
                stamps = [s for s in map(_stamp, later) if s is not None]
                assert not later or stamps[0] > source.now()
    assert source.done
    assert [x.arrived for x in order] == sorted(x.arrived for x in order)
    for path in per_rank:  # each file whole, in its own order
        assert [x.text for x in order if x.path == str(path)] == path.read_text().splitlines()
    # The files interleave: the first 100 lines come from every rank's file.
    assert len({x.path for x in order[:100]}) == 8


#: Replay seconds (1 s of log time each) at which the two replays are compared: the
#: start, the hang (the waiters enter #20 ~7.5 s in), the countdown, the watchdog (600 s
#: after the hang) and after.
_TICKS = [*range(0, 14), 100, 300, 500, *range(598, 614)]


def _countdown(
    paths: list[Path],
) -> list[tuple[dict[tuple[str, ...], float], set[tuple[str, ...]], set[tuple[str, ...]]]]:
    """Per tick: the seconds left per communicator, the culprits, the findings."""
    clock = _Clock()
    source = ReplaySource(paths, clock=clock)
    a = Agent(AgentConfig(analyse_s=0.0, hostname="replay"), lines=source, wall=source.now)
    a.start()
    out = []
    for t in _TICKS:
        clock.t = float(t)
        a.tick()
        board = a.board.snapshot()
        out.append(
            (
                dict(board.get("ncclscope_timeout_remaining_seconds", [])),
                {k for k, _v in board.get("ncclscope_timeout_culprit_info", [])},
                {k for k, _v in board.get("ncclscope_findings", [])},
            )
        )
    a.finish()
    return out


def test_per_rank_replay_counts_down_as_the_combined_one(
    job: tuple[list[Path], list[Path]],
) -> None:
    """The issue's target: the countdown of per-rank files matches the combined file's
    within one scrape interval (1 s of log time here), each replay from its own start."""
    combined, per_rank = job
    one, many = _countdown(combined), _countdown(per_rank)
    counted = 0
    for t, (left1, culprits1, findings1), (left2, culprits2, findings2) in zip(
        _TICKS, one, many, strict=True
    ):
        assert left1.keys() == left2.keys(), t
        for comm, value in left1.items():
            assert left2[comm] == pytest.approx(value, abs=1.0), (t, comm)
        assert culprits1 == culprits2, t
        if t < 600:  # before the watchdog: the same findings (none of its lines early)
            assert findings1 == findings2, t
        if left1:
            counted += 1
            assert {c[1] for c in culprits1} == {"3"}
    assert counted >= len(_TICKS) - 9  # counting down from ~8 s in to the end
    assert min(min(x[0].values()) for x in one if x[0]) < 0  # through the timeout


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_replay_cli_hostname_and_a_shared_start(tmp_path: Path) -> None:
    """The replay serves from its start, and reads nothing before --start-at.  How long
    it takes to start is the machine's: where its first answer came too close to
    --start-at to say, it is started again with --start-at further off (never skipped)."""
    log = _write(tmp_path / "a.log", [_nccl(0.0, 1, "x0"), _nccl(2.0, 1, "x2")])
    margin = 1.5
    for attempt in range(4):
        port = _free_port()
        launched = time.time()
        start_at = launched + margin
        output = (tmp_path / f"replay-{attempt}.out").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "ncclscope", "replay", str(log), "--hostname", "node-7",
             "--listen", f"127.0.0.1:{port}", "--interval", "0.1", "--start-at", str(start_at),
             "--log-start", "2025-03-14 09:00:00"],
            stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            body, answered = "", None
            deadline = time.monotonic() + 30
            # Until the replay says how many lines it read: its server answers (with its
            # identity) before its first tick has published the rest.
            while time.monotonic() < deadline:
                try:
                    body = _scrape(port)
                except OSError:
                    time.sleep(0.1)
                    continue
                answered = time.time()
                if "ncclscope_log_lines_read_total" in body:
                    break
                time.sleep(0.05)
            assert answered is not None, (tmp_path / f"replay-{attempt}.out").read_text()
            assert 'hostname="node-7"' in body
            if answered < start_at - 0.3:
                # Before --start-at, nothing has been read.
                assert "ncclscope_log_lines_read_total 0.0" in body
                assert proc.wait(timeout=20) == 0  # both lines out by start_at + 2 s, then stop
                assert time.time() >= start_at + 2.0
                return
        finally:
            proc.kill()
            proc.wait()
            output.close()
        margin = 3 * (answered - launched) + 2.0  # this machine's start, and some
    raise AssertionError(f"the replay never answered before --start-at (last margin {margin} s)")
