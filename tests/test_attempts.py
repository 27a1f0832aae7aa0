"""Several runs in one file split into attempts, each diagnosed on its own; and live
sequence numbers that keep growing once the follower's window is full."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from ncclscope.agent.live import LiveWindow, job_rows


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
        analysis = window.analyse(tmp_path / f"w{poll}")
        assert analysis is not None
        rows = dict(job_rows(analysis, at, dropped=window.dropped)["ncclscope_collective_seq"])
        assert len(rows) == 2
        assert len(set(rows.values())) == 1  # both members at the same call
        seen.append(next(iter(rows.values())))
    window.close()
    assert window.added > 3 * 40  # the window was overrun several times over
    # Every call since the follower started, counted from 0: 15 calls a poll.
    assert seen == [15.0 * (k + 1) - 1 for k in range(6)]
