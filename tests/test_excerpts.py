"""Shapes of real excerpts the parsers missed (issue #12): DeepSpeed timers behind tqdm
bars and from old releases, a ZeRO-3 offload job known only by its offload lines, a
watchdog line hard-wrapped by a job runner.

The shapes were learnt from logs users pasted in public issues; every line here is
written from the format strings (shared/formats/deepspeed-torch.md) with invented values.
Each excerpt goes through the whole pipeline (``run_analysis``), as a user's file would.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from ncclscope.analysis import Diagnosis, run_analysis

DS = "[2023-11-20 16:41:{s:02d},{ms:03d}] [INFO] [logging.py:96:log_dist] [Rank 0] "


def _ds(s: int, ms: int = 250) -> str:
    return DS.format(s=s, ms=ms)


def _bar(done: int, total: int = 800) -> str:
    pct = 100 * done // total
    return f" {pct:2d}%|\u2589{' ' * 9}| {done}/{total} [00:{done % 60:02d}<05:31,  2.41it/s]"


def _analyse(tmp: Path, lines: list[str], name: str = "excerpt.log") -> Diagnosis:
    path = tmp / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return run_analysis([str(path)], workdir=tmp / "work")


def _timer_lines(a: Diagnosis) -> list[tuple[int, int | None]]:
    t = a.analysis.frameworks.timers
    return t.group_by("line_no").agg(pl.col("rank").first()).sort("line_no").rows()


# --- DeepSpeed timers ---------------------------------------------------------------


def test_timer_records_around_tqdm_bars_are_all_counted(tmp_path: Path) -> None:
    """Six records, one per physical line, in every placement a bar takes."""
    rec = "time (ms) | fwd_microstep: 96.{:02d} | bwd_microstep: 201.37 | step_microstep: 12.08"
    lines = [
        _bar(40) + _ds(1) + rec.format(1),  # glued right after the bar
        "\r" + _bar(41) + "\r" + _bar(42) + _ds(2) + rec.format(2),  # after \r redraws
        _ds(3) + rec.format(3) + "\r" + _bar(43),  # a redraw after the record
        "\r" + _bar(44) + _ds(4) + rec.format(4) + "\r" + _bar(45) + "\r" + _bar(46),
        "gpu-a7: " + _bar(47) + _ds(5) + rec.format(5),  # pdsh tag, bar, record
        _ds(6) + rec.format(6),  # plain
    ]
    a = _analyse(tmp_path, lines)
    assert _timer_lines(a) == [(n, 0) for n in range(1, 7)]
    fwd = a.analysis.frameworks.timers.filter(pl.col("name") == "fwd_microstep").sort("line_no")
    assert fwd["duration_s"].to_list() == pytest.approx([0.09601 + 0.00001 * k for k in range(6)])


def test_print_dist_timers_keep_their_rank(tmp_path: Path) -> None:
    """Recent releases print the timers with ``print_dist``: ``[Rank N]``, no header."""
    lines = [
        "[Rank 0] time (ms) | fwd: 88.10 | bwd: 170.44 | step: 9.75",
        _bar(3) + "[Rank 0] time (ms) | fwd: 87.90 | bwd: 171.02 | step: 9.80",
    ]
    a = _analyse(tmp_path, lines)
    assert _timer_lines(a) == [(1, 0), (2, 0)]


def test_old_release_timers_with_memory_breakdown(tmp_path: Path) -> None:
    """``rank=N`` heads, pre-0.10 names and ``memory_usage()`` figures after the pairs."""
    mem = (
        " | mem_allocated: 6.2031 GB | max_mem_allocated: 11.5078 GB"
        " | cache_allocated: 13.0000 GB | max_cache_allocated: 13.2500 GB"
    )
    lines = [
        _ds(10, 5)
        + f"rank=0 time (ms) | forward: 301.{k:02d} | backward: 655.20 | backward_inner: 601.33"
        f" | backward_allreduce: 53.80 | step: 40.02{mem}"
        for k in range(4)
    ] + [
        f"rank=0 time (ms) | forward_microstep: 75.{k:02d} | backward_microstep: 160.40{mem}"
        for k in range(2)
    ]
    a = _analyse(tmp_path, lines)
    assert _timer_lines(a) == [(n, 0) for n in range(1, 7)]
    names = set(a.analysis.frameworks.timers["name"].to_list())
    assert names == {"fwd", "bwd", "bwd_inner", "bwd_allreduce", "step"} | {
        "fwd_microstep",
        "bwd_microstep",
    }
    assert not names & {"mem_allocated", "max_cache_allocated"}


# --- ZeRO stage from the offload lines ------------------------------------------------


def test_zero3_offload_job_known_by_its_offload_lines(tmp_path: Path) -> None:
    u = "[2023-11-20 16:40:{s:02d},{ms:03d}] [INFO] [utils.py:{n}:see_memory_usage] "
    lines = [
        u.format(s=2, ms=10, n=802) + "DeepSpeedZeRoOffload initialize [begin]",
        u.format(s=2, ms=11, n=803)
        + "MA 0.62 GB         Max_MA 1.05 GB         CA 1.11 GB         Max_CA 1 GB ",
        u.format(s=2, ms=11, n=810) + "CPU Virtual Memory:  used = 88.41 GB, percent = 17.5%",
        "Parameter Offload: Total persistent parameters: 266240 in 129 params",
        u.format(s=3, ms=480, n=802) + "DeepSpeedZeRoOffload initialize [end]",
        u.format(s=3, ms=481, n=803)
        + "MA 0.31 GB         Max_MA 0.77 GB         CA 1.11 GB         Max_CA 1 GB ",
    ]
    a = _analyse(tmp_path, lines)
    assert a.analysis.frameworks.zero is not None
    assert a.analysis.frameworks.zero.stage == 3


def test_zero3_known_by_the_engine_offload_line(tmp_path: Path) -> None:
    a = _analyse(tmp_path, [_ds(1) + "Creating ZeRO Offload"])
    assert a.analysis.frameworks.zero is not None
    assert a.analysis.frameworks.zero.stage == 3


def test_zero3_known_by_a_stage3_module_line(tmp_path: Path) -> None:
    lines = [
        "[2023-11-20 16:40:05,900] [INFO] [stage3.py:131:__init__] Reduce bucket size 26214400",
        "[2023-11-20 16:40:05,900] [INFO] [stage3.py:132:__init__] Prefetch bucket size 23592960",
    ]
    a = _analyse(tmp_path, lines)
    zero = a.analysis.frameworks.zero
    assert zero is not None
    assert (zero.stage, zero.prefetch_bucket_size) == (3, 23_592_960)


def test_zero2_lines_do_not_claim_stage3(tmp_path: Path) -> None:
    lines = [
        "[2023-11-20 16:40:05,900] [INFO] [stage_1_and_2.py:150:__init__] Reduce bucket size "
        "500000000",
        "[2023-11-20 16:40:05,901] [INFO] [utils.py:802:see_memory_usage] Before initializing "
        "optimizer states",
    ]
    a = _analyse(tmp_path, lines)
    assert a.analysis.frameworks.zero is not None
    assert a.analysis.frameworks.zero.stage is None


# --- a watchdog line wrapped by a job runner ------------------------------------------

WD = (
    "[rank3]:[E1120 16:52:07.604818 23117 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=4711, OpType=_REDUCE_SCATTER_BASE, "
    "NumelIn=33554432, NumelOut=4194304, Timeout(ms)=1800000) ran for 1800094 milliseconds "
    "before timing out."
)


def _wrap(line: str, width: int, tag: str = "") -> list[str]:
    """``line`` as a runner that wraps at ``width`` and tags every piece writes it."""
    return [tag + line[k : k + width] for k in range(0, len(line), width)]


@pytest.mark.parametrize("width", [80, 100, 120, 150, 200])
@pytest.mark.parametrize("tag", ["", "worker-2: ", "[default3]:"])
def test_wrapped_watchdog_line_is_one_timeout(tmp_path: Path, width: int, tag: str) -> None:
    lines = [f"{tag}epoch 3 | step 4700 | loss 2.0314", *_wrap(WD, width, tag)]
    a = _analyse(tmp_path, lines)
    rows = a.analysis.frameworks.timeouts.select("global_rank", "seq", "op", "timeout_s").rows()
    assert rows == [(3, 4711, "_REDUCE_SCATTER_BASE", 1800.0)]
    assert a.analysis.frameworks.timeouts["numel_out"].to_list() == [4_194_304]


def test_a_tagged_line_of_another_rank_is_not_glued(tmp_path: Path) -> None:
    """Conservative: a piece with other tags is another process's line."""
    cut = WD.index("NumelIn")
    lines = ["node-a: " + WD[:cut], "node-b: " + WD[cut:]]
    a = _analyse(tmp_path, lines)
    assert a.analysis.frameworks.timeouts.is_empty()
