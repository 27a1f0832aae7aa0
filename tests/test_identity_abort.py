"""Identity from Destroy/Abort lines where a communicator's Init lines were cut away
(issue #18): ``comm 0x55 rank 1 nRanks 2 cudaDev 0 busId 19000 - Abort COMPLETE``."""

from __future__ import annotations

from pathlib import Path

from conftest import sample_text

from ncclscope.analysis import run_analysis


def _cut_init(text: str) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if "Init START" not in line and "Init COMPLETE" not in line and " nNodes " not in line
    ]


def _ranks(lines: list[str], tmp: Path) -> dict[int, str]:
    log = tmp / "job.log"
    log.write_text("\n".join(lines) + "\n")
    d = run_analysis([str(log)], workdir=tmp / "w")
    ranks = d.analysis.identity.ranks.drop_nulls("rank")
    return dict(zip(ranks["rank"].to_list(), ranks["host"].to_list(), strict=True))


def test_abort_lines_name_the_ranks_init_lines_no_longer_do(tmp_path: Path) -> None:
    cut = _cut_init(sample_text())
    aborts = [
        "node-a:4101:4101 [0] NCCL INFO comm 0x55aa10c0ffee rank 0 nRanks 2 cudaDev 0 "
        "busId 18000 - Abort COMPLETE",
        "node-b:5202:5202 [0] NCCL INFO comm 0x55bb20c0ffee rank 1 nRanks 2 cudaDev 0 "
        "busId 19000 - Abort COMPLETE",
    ]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert _ranks(cut + aborts, tmp_path / "a") == {0: "node-a", 1: "node-b"}
    # Without them the same log names neither rank by its communicator rank.
    assert _ranks(cut, tmp_path / "b") != {0: "node-a", 1: "node-b"}
