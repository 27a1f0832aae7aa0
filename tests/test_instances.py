"""Instance counting: distinct (communicator, sequence) across ranks, exact in odd logs."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from ncclscope.cli import cli
from ncclscope.model.collectives import _merged_length


def _coll(host: str, pid: int, comm: str, opcount: int) -> str:
    return (
        f"{host}:{pid}:{pid} [0] NCCL INFO AllReduce: opCount {opcount:x} sendbuff 0x7f00 "
        f"recvbuff 0x7f00 count 1024 datatype 7 op 0 root 0 comm {comm} [nranks=2] "
        "stream 0x55aa"
    )


def _init(host: str, pid: int, comm: str, rank: int) -> str:
    return (
        f"{host}:{pid}:{pid} [0] NCCL INFO comm {comm} rank {rank} nranks 2 cudaDev 0 "
        f"nvmlDev 0 busId 1000 commId 0xfeed - Init COMPLETE"
    )


def _run(tmp_path: Path, lines: list[str]) -> dict[str, object]:
    log = tmp_path / "job.log"
    log.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(cli, ["analyze", str(log), "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["collectives"]  # type: ignore[no-any-return]


def test_merged_length() -> None:
    assert _merged_length([(0, 4), (3, 9)]) == 10
    assert _merged_length([(5, 5), (0, 1), (1, 2)]) == 4
    assert _merged_length([]) == 0


def test_ranges_that_differ(tmp_path: Path) -> None:
    """Rank 1 stopped early (a hang): the union of both ranks' sequences counts."""
    lines = [_init("a", 1, "0x11", 0), _init("b", 2, "0x22", 1)]
    lines += [_coll("a", 1, "0x11", k) for k in range(6)]
    lines += [_coll("b", 2, "0x22", k) for k in range(4)]
    coll = _run(tmp_path, lines)
    assert (coll["calls"], coll["instances"]) == (10, 6)


def test_sequences_with_gaps(tmp_path: Path) -> None:
    """A rank whose opCounts skip values forces the exact distinct count."""
    lines = [_init("a", 1, "0x11", 0), _init("b", 2, "0x22", 1)]
    lines += [_coll("a", 1, "0x11", k) for k in (0, 1, 2, 9)]
    lines += [_coll("b", 2, "0x22", k) for k in (0, 1, 2, 3)]
    coll = _run(tmp_path, lines)
    assert (coll["calls"], coll["instances"]) == (8, 5)
