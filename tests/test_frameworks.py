"""The framework stage: picking lines in polars, and timer lines read in polars.

Plain DeepSpeed timer lines skip ``parse_deepspeed`` (a chatty job prints hundreds of
thousands); these tests hold the polars reader to the parser's rows, line for line.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from ncclscope.parsers import frameworks
from ncclscope.parsers.deepspeed.lines import parse_deepspeed
from ncclscope.parsers.nccl.scan import ScanTarget, scan_inputs
from ncclscope.synth import SynthSpec, generate

REPO = Path(__file__).resolve().parent.parent
H = "[2024-05-02 10:00:{s:02d},{ms:03d}] [INFO] [logging.py:96:log_dist] "

#: Timer lines in every shape, with the lines that set the step between them.
HOSTILE = [
    H.format(s=1, ms=5) + "[Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]",
    H.format(s=1, ms=6) + "[Rank 0] time (ms) | fwd_microstep: 101.25 | bwd_microstep: 210.50",
    "[default0]:" + H.format(s=2, ms=7) + "[Rank 0] rank=0 time (ms) | forward: 99.00 | "
    "backward_inner: 12.34",
    H.format(s=3, ms=8) + "[Rank 0] time (ms) | fwd: 120.50 (fwd_moe: 30.10, 1st_a2a: 5.20)",
    H.format(s=4, ms=9) + "[Rank 0] time (ms) | fwd_microstep: -inf | bwd_microstep: 1.00",
    H.format(s=5, ms=10) + "[Rank 0] time (ms) | fwd_microstep: 101.25 | bwd_",
    "microstep: 210.50",
    "x"
    + H.format(s=6, ms=11)
    + "[Rank 0] time (ms) | fwd: 1"
    + H.format(s=6, ms=12)
    + "[Rank 0] time (ms) | fwd: 2.00",
    H.format(s=7, ms=13) + "[Rank -1] time (ms) | step: 3.00",
    "[2024-13-45 10:00:08,001] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | step: 4.00",
    H.format(s=9, ms=14) + "epoch=0/micro_step=20/global_step=20, RunningAvgSamplesPerSec="
    "10.5, CurrSamplesPerSec=11.0, MemAllocated=1.5GB, MaxMemAllocated=2.0GB",
    "\x1b[32m" + H.format(s=10, ms=15) + "[Rank 0] time (ms) | step_microstep: 5.00\x1b[0m",
    H.format(s=11, ms=16) + "[Rank 0] time (ms) | optimizer_step: 6.00   ",
    "epoch 0 loss 2.31",
    H.format(s=12, ms=17) + "[Rank 0] time (ms) | optimizer_allgather: 7.00",
    H.format(s=13, ms=18) + "[Rank 0] time (ms) | fwd_microstep: 8.00 | bwd_microstep: 9.00",
    " | step_microstep: 3.12",  # cut right after a value: the parser joins the two lines
    H.format(s=14, ms=19) + "[Rank 0] time (ms) | fwd_microstep: 10.00",
    "epoch 0 loss 2.29",  # adjacent, but not the rest of a timer line
]


def _timers_both_ways(paths: list[Path], tmp_path: Path) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    scan = scan_inputs([ScanTarget(k, p, ()) for k, p in enumerate(paths)], tmp_path / "store")
    got = frameworks.read_frameworks(scan.text_store).timers
    lines = frameworks._needed_lines(scan.text_store)
    fast = frameworks._fast_timer_lines(lines).height
    want = []
    for (file_id,), part in lines.filter(pl.col("ds")).group_by("file_id"):
        rows = list(zip(part["i"].to_list(), part["text"].to_list(), strict=True))
        want.append(parse_deepspeed(rows, file_id=int(file_id)).timers)
    key = ["file_id", "line_no", "name_printed"]
    return got.sort(key), pl.concat(want).sort(key), fast


def test_hostile_timer_lines_agree(tmp_path: Path) -> None:
    log = tmp_path / "ds.log"
    log.write_text("\n".join(HOSTILE) + "\n")
    got, want, fast = _timers_both_ways([log], tmp_path)
    assert fast >= 4  # the plain ones went the fast way
    assert got.rows() == want.rows()
    assert got.filter(pl.col("line_no") == 2)["step"].to_list() == [10, 10]
    assert got.filter(pl.col("line_no") == 15)["step"].to_list() == [20]
    assert sorted(got.filter(pl.col("line_no") == 16)["name"].to_list()) == [
        "bwd_microstep", "fwd_microstep", "step_microstep"
    ]  # fmt: skip


@pytest.mark.parametrize("case", ["zero3-offload-hang", "zero2-timers-eras"])
def test_fixture_timers_agree(tmp_path: Path, case: str) -> None:
    paths = sorted((REPO / "fixtures" / case).glob("*.log"))
    got, want, fast = _timers_both_ways(paths, tmp_path)
    assert fast > 0
    assert got.rows() == want.rows()


def test_synthetic_job_timers_agree(tmp_path: Path) -> None:
    """DeepSpeed's own lines and the generator's random DeepSpeed-looking noise."""
    for framework in ("deepspeed", "none"):
        out = tmp_path / framework
        extra = {"zero_stage": 2, "ds_era": "old"} if framework == "deepspeed" else {}
        spec = SynthSpec(
            ranks=8,
            hosts=2,
            steps=40,
            launcher="torchrun",
            framework=framework,
            seed=2,
            **extra,  # type: ignore[arg-type]
        )
        generate(spec, out)
        got, want, fast = _timers_both_ways(sorted(out.glob("*.log")), tmp_path / "s" / framework)
        assert fast > 20
        assert got.rows() == want.rows()
