"""The framework stage: picking lines in polars, and DeepSpeed's chattiest lines read in
polars.

Plain DeepSpeed timer, progress and throughput lines skip ``parse_deepspeed`` (a chatty
job prints hundreds of thousands); these tests hold the polars readers to the parser's
rows, line for line.
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

T = H.replace("logging.py:96:log_dist", "timer.py:264:stop")
#: ThroughputTimer lines in every shape: plain ones go the fast way, the rest to the parser.
HOSTILE_THROUGHPUT = [
    T.format(s=20, ms=1) + "epoch=0/micro_step=40/global_step=10, RunningAvgSamplesPerSec="
    "21.873046128374906, CurrSamplesPerSec=22.41, MemAllocated=3.47GB, MaxMemAllocated=9.12GB",
    H.format(s=20, ms=2) + "[Rank 0] time (ms) | fwd_microstep: 1.00",
    T.format(s=21, ms=3) + "epoch=0/micro_step=44/global_step=11, RunningAvgSamplesPerSec="
    "-inf, CurrSamplesPerSec=nan, MemAllocated=3.47GB, MaxMemAllocated=9.12GB",
    T.format(s=22, ms=4) + "epoch=0/micro_step=48/global_step=12, RunningAvgSamplesPerSec="
    "1e-05, CurrSamplesPerSec=2.5E+3, MemAllocated=0GB, MaxMemAllocated=12GB",
    T.format(s=23, ms=5) + "epoch=1/micro_step=52/global_step=13, RunningAvgSamplesPerSec="
    "0.1, CurrSamplesPerSec=0.30000000000000004, MemAllocated=0.000000000001GB, "
    "MaxMemAllocated=999999999999.999999999999GB   ",
    T.format(s=24, ms=6) + "[Rank 3] epoch=1/micro_step=56/global_step=14, "
    "RunningAvgSamplesPerSec=7.0, CurrSamplesPerSec=7.25, MemAllocated=1.5GB, "
    "MaxMemAllocated=2.0GB, and more",
    T.format(s=25, ms=7) + "epoch=1/micro_step=60/global_step=15, RunningAvgSamplesPerSec="
    "7.0, CurrSamplesPerSec=7.25, MemAllo",
    "cated=1.5GB, MaxMemAllocated=2.0GB",  # cut by a terminal: the parser joins them
    T.format(s=26, ms=8) + "0/40, RunningAvgSamplesPerSec=21.87, CurrSamplesPerSec=22.41, "
    "MemAllocated=3.47GB, MaxMemAllocated=9.12GB",
    T.format(s=27, ms=9) + "1/200, SamplesPerSec=88.31",
    "\u2588" + T.format(s=28, ms=10) + "epoch=2/micro_step=64/global_step=16, "
    "RunningAvgSamplesPerSec=7.0, CurrSamplesPerSec=7.25, MemAllocated=1.5GB, "
    "MaxMemAllocated=2.0GB",
    T.format(s=29, ms=11) + "epoch=2/micro_step=68/global_step=17, RunningAvgSamplesPerSec="
    "7.0, CurrSamplesPerSec=7.25, MemAllocated=1.5GB, MaxMemAllocated=2.0GB"
    + T.format(s=29, ms=12),  # a second header: two records spliced
    H.format(s=30, ms=13) + "[Rank 0] time (ms) | fwd_microstep: 2.00",
]


def _timers_both_ways(paths: list[Path], tmp_path: Path) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    """Timer rows as ``read_frameworks`` gives them and as the parser alone gives them,
    and how many timer lines went the fast way; throughput rows are held to the parser's
    too."""
    scan = scan_inputs([ScanTarget(k, p, ()) for k, p in enumerate(paths)], tmp_path / "store")
    tables = frameworks.read_frameworks(scan.text_store)
    lines = frameworks._needed_lines(scan.text_store)
    fast = frameworks._fast_timer_lines(frameworks._headed(lines)).height
    want, want_tput = [], []
    for (file_id,), part in lines.filter(pl.col("ds")).group_by("file_id"):
        rows = list(zip(part["i"].to_list(), part["text"].to_list(), strict=True))
        result = parse_deepspeed(rows, file_id=int(file_id))
        want.append(result.timers)
        want_tput.append(result.throughput)
    assert tables.throughput.rows() == pl.concat(want_tput).sort("file_id", "line_no").rows()
    key = ["file_id", "line_no", "name_printed"]
    return tables.timers.sort(key), pl.concat(want).sort(key), fast


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


def test_hostile_throughput_lines_agree(tmp_path: Path) -> None:
    log = tmp_path / "ds.log"
    log.write_text("\n".join(HOSTILE_THROUGHPUT) + "\n")
    scan = scan_inputs([ScanTarget(0, log, ())], tmp_path / "fast")
    headed = frameworks._headed(frameworks._needed_lines(scan.text_store))
    fast = frameworks._fast_throughput(headed)["line_no"].to_list()
    assert fast == [1, 5]  # plain decimals, nothing after the record, one header
    got, want, _fast = _timers_both_ways([log], tmp_path)  # checks throughput rows too
    assert got.rows() == want.rows()
    steps = dict(zip(got["line_no"].to_list(), got["step"].to_list(), strict=True))
    # line 12 holds two headers: the parser reads the last one, which carries no record
    assert steps == {2: 10, 13: 16}  # the step of the last throughput line before


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


def _tables(tables: frameworks.FrameworkTables) -> dict[str, list[tuple[object, ...]]]:
    names = ("timers", "throughput", "memory", "comms", "timeouts", "failures", "torch_events")
    return {name: getattr(tables, name).rows() for name in names}


@pytest.mark.parametrize(
    ("rows", "job"), [(1, False), (2, False), (3, False), (50, True), (333, True)]
)
def test_batches_give_the_same_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: int, job: bool
):
    """The stage reads the text store in batches: a batch edge between a line and its
    continuation, or inside a config dump or a torchelastic summary, changes nothing."""
    hostile = tmp_path / "hostile.log"
    hostile.write_text("\n".join(HOSTILE + HOSTILE_THROUGHPUT) + "\n")
    paths = [hostile]
    if job:
        spec = SynthSpec(ranks=4, hosts=1, steps=6, framework="deepspeed", zero_stage=3, seed=3)
        generate(spec, tmp_path / "job")
        fixture = REPO / "fixtures" / "zero3-offload-hang"
        paths += [*sorted((tmp_path / "job").glob("*.log")), *sorted(fixture.glob("*.log"))]
    scan = scan_inputs([ScanTarget(k, p, ()) for k, p in enumerate(paths)], tmp_path / "store")
    whole = frameworks.read_frameworks(scan.text_store)
    monkeypatch.setattr(frameworks, "_BATCH_ROWS", rows)
    batched = frameworks.read_frameworks(scan.text_store)
    assert _tables(batched) == _tables(whole)
    assert whole.timers.height > 20
    assert whole.timeouts.height == (7 if job else 0)
    assert (batched.zero, batched.parsed, batched.malformed) == (
        whole.zero,
        whole.parsed,
        whole.malformed,
    )
