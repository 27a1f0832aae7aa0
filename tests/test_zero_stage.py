"""The ZeRO stage advisor: its estimator on hand-computed numbers, and the detector on
synthetic DeepSpeed jobs with and without telemetry."""

from __future__ import annotations

import doctest
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from ncclscope.analysis import Diagnosis, run_analysis
from ncclscope.detect import zero_stage
from ncclscope.detect.zero_stage import (
    Fact,
    Inputs,
    Option,
    buffers,
    comm_bus_bytes,
    model_states,
    options,
)
from ncclscope.model.timeline import find_period
from ncclscope.schema import TELEMETRY_SCHEMA
from ncclscope.synth import SynthSpec, generate

GiB = 2**30
ZERO2 = Option(2, offload_optimizer=False, offload_param=False)
ZERO3_OFF = Option(3, offload_optimizer=True, offload_param=True)


def test_module_doctests() -> None:
    result = doctest.testmod(zero_stage)
    assert result.attempted > 0
    assert result.failed == 0


# --------------------------------------------------------------------------------------
# The estimator, by hand


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        # 1e9 parameters, 4 ranks, bf16: weights 2e9, gradients 2e9, optimizer 12e9.
        (Option(0, False, False), (2e9, 2e9, 12e9)),
        (Option(1, False, False), (2e9, 2e9, 3e9)),
        (Option(1, True, False), (2e9, 2e9, 0.0)),
        (Option(2, False, False), (2e9, 0.5e9, 3e9)),
        (Option(2, True, False), (2e9, 0.0, 0.0)),
        (Option(3, False, False), (0.5e9, 0.5e9, 3e9)),
        (Option(3, False, True), (0.0, 0.5e9, 3e9)),
        (Option(3, True, True), (0.0, 0.0, 0.0)),
    ],
)
def test_model_states_by_stage(option: Option, expected: tuple[float, float, float]) -> None:
    s = model_states(option, params=1e9, dp=4, weight_bytes=2)
    assert (s["weights"], s["grads"], s["optimizer"]) == expected
    assert s["total"] == sum(expected)


def test_model_states_fp32_is_also_16_bytes_a_parameter() -> None:
    # fp32: weights 4, gradients 4, two Adam moments 8; no master copy.
    s = model_states(Option(0, False, False), params=1e6, dp=8, weight_bytes=4)
    assert (s["weights"], s["grads"], s["optimizer"], s["total"]) == (4e6, 4e6, 8e6, 16e6)
    assert model_states(Option(3, False, False), params=1e6, dp=8, weight_bytes=4)["total"] == 2e6


def test_comm_bus_bytes_by_stage() -> None:
    # 1e9 bf16 parameters, 4 ranks: W (N-1)/N = 2e9 x 3/4 = 1.5e9 bus bytes per pass.
    kw: dict[str, Any] = {"params": 1e9, "dp": 4, "weight_bytes": 2}
    assert comm_bus_bytes(0, **kw) == 3e9  # all-reduce = reduce-scatter + all-gather
    assert comm_bus_bytes(1, **kw) == 3e9
    assert comm_bus_bytes(2, **kw) == 3e9
    assert comm_bus_bytes(3, **kw) == 4.5e9  # 1.5x: all-gather in forward and backward
    # Gradient accumulation: stage 2 reduces every micro-step, stage 3 gathers too.
    assert comm_bus_bytes(1, **kw, grad_accum=4) == 3e9
    assert comm_bus_bytes(2, **kw, grad_accum=4) == 7.5e9
    assert comm_bus_bytes(3, **kw, grad_accum=4) == 18e9
    assert comm_bus_bytes(3, params=1e9, dp=1) == 0.0


def test_buffers() -> None:
    kw: dict[str, Any] = {
        "weight_bytes": 2,
        "reduce_bucket": 1e8,
        "allgather_bucket": 2e8,
        "prefetch_bucket": 5e7,
    }
    assert buffers(Option(0, False, False), **kw) == 0.0
    assert buffers(ZERO2, **kw) == 2 * (1e8 + 2e8)
    assert buffers(ZERO3_OFF, **kw) == 2 * (1e8 + 5e7)


def test_step_period() -> None:
    warmup = [7, 8]
    step = [1, 1, 2, 3, 4]
    assert find_period(warmup + step * 5) == 5
    # A period is found even when the log ends inside a step.
    assert find_period(warmup + step * 5 + step[:2]) == 5
    assert find_period([1] * 10) == 1
    assert find_period([1, 2, 3]) is None


def _inputs(**kw: Any) -> Inputs:
    base: dict[str, Any] = {
        "current": ZERO3_OFF,
        "params": Fact(1e9, "test"),
        "weight_bytes": Fact(2, "test"),
        "dp": Fact(8, "test"),
        "grad_accum": Fact(1, "test"),
        "reduce_bucket": Fact(1e8, "test"),
        "allgather_bucket": Fact(1e8, "test"),
        "prefetch_bucket": Fact(5e7, "test"),
        "pcie_bw": Fact(25e9, "test"),
    }
    base.update(kw)
    return Inputs(**base)


def _row(frame: pl.DataFrame, stage: int, opt: bool, param: bool) -> dict[str, Any]:
    return frame.filter(
        (pl.col("stage") == stage)
        & (pl.col("offload_optimizer") == opt)
        & (pl.col("offload_param") == param)
    ).row(0, named=True)


def test_options_calibrated_on_the_measured_peak_and_step() -> None:
    inp = _inputs(
        gpu_total=Fact(80 * 1e9, "test"),
        peak=Fact(10e9, "test"),
        step_s=Fact(1.0, "test"),
        optimizer_s=Fact(0.4, "test"),
        bus_bw=Fact(100e9, "test"),
    )
    frame = options(inp)
    assert len(frame) == 9
    cur = _row(frame, 3, opt=True, param=True)
    # Current: no model states on the GPU; buffers 2 x (1e8 + 5e7) = 0.3e9; the other
    # 9.7e9 of the measured peak is activations and the rest, the same for every row.
    assert (cur["model_states_bytes"], cur["buffers_bytes"]) == (0.0, 0.3e9)
    assert cur["peak_bytes"] == pytest.approx(10e9)
    assert (cur["fits"], cur["step_s"]) == (True, 1.0)
    # Its step: ZeRO-3 traffic 3 x 2e9 x 7/8 = 5.25e9 bytes at 100 GB/s = 52.5 ms;
    # parameter fetch 2 x 2e9 / 8 bytes at 25 GB/s = 20 ms; CPU Adam 400 ms measured.
    compute = 1.0 - 0.0525 - 0.4 - 0.02
    z2 = _row(frame, 2, opt=False, param=False)
    # ZeRO-2: 2e9 + 2e9/8 + 12e9/8 = 3.75e9 states, 2 x (1e8 + 1e8) = 0.4e9 buffers.
    assert z2["model_states_bytes"] == pytest.approx(3.75e9)
    assert z2["peak_bytes"] == pytest.approx(3.75e9 + 0.4e9 + 9.7e9)
    assert z2["fits"] is True
    # 2 x 2e9 x 7/8 = 3.5e9 bytes: 35 ms; GPU Adam on 1e9/8 parameters x 32 B / 1.5 TB/s.
    gpu_adam = 1e9 / 8 * 32 / 1.5e12
    assert z2["comm_s"] == pytest.approx(0.035)
    assert z2["step_s"] == pytest.approx(compute + 0.035 + gpu_adam)
    ddp = _row(frame, 0, opt=False, param=False)
    assert ddp["model_states_bytes"] == pytest.approx(16e9)
    assert ddp["fits"] is True  # 16e9 + 9.7e9 < 0.9 x 80e9
    # CPU offload the job did not run with ZeRO-1 is the same CPU Adam (same shard).
    assert _row(frame, 1, opt=True, param=False)["optimizer_s"] == 0.4


def test_options_without_total_or_bandwidth_say_null() -> None:
    frame = options(_inputs(peak=Fact(10e9, "test"), step_s=Fact(1.0, "test")))
    z2 = _row(frame, 2, opt=False, param=False)
    assert (z2["fits"], z2["comm_s"], z2["step_s"]) == (None, None, None)
    assert z2["peak_bytes"] is not None
    assert options(_inputs(params=None)).is_empty()


def test_options_do_not_fit_a_small_gpu() -> None:
    frame = options(_inputs(gpu_total=Fact(12e9, "test"), peak=Fact(10e9, "test")))
    assert _row(frame, 2, opt=False, param=False)["fits"] is False
    assert _row(frame, 3, opt=True, param=True)["fits"] is True


def test_communication_above_the_step_predicts_no_step_times() -> None:
    # 5.25e9 bus bytes at 1 GB/s = 5.25 s, more than the 1 s step: it overlaps compute.
    frame = options(
        _inputs(step_s=Fact(1.0, "test"), optimizer_s=Fact(0.4, "test"), bus_bw=Fact(1e9, "test"))
    )
    assert _row(frame, 2, opt=False, param=False)["step_s"] is None


# --------------------------------------------------------------------------------------
# The detector on synthetic jobs

NODE = "node-0"
TS0 = datetime(2025, 3, 14, 9, 0, 0, tzinfo=UTC)


def _telemetry(*, total: float, used: float, gpus: int = 8) -> pl.DataFrame:
    rows = []
    for g in range(gpus):
        labels = f"{g},GPU-{g:04x},00000000:{0x18 + g:02X}:00.0"
        for k in range(3):
            ts = TS0.replace(second=k)
            rows.append((ts, NODE, "ncclscope_gpu_memory_total_bytes", labels, total))
            rows.append((ts, NODE, "ncclscope_gpu_memory_used_bytes", labels, used * (k + 1) / 3))
    return pl.DataFrame(rows, schema=TELEMETRY_SCHEMA, orient="row")


@pytest.fixture(scope="module")
def offload_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ZeRO-3 with optimizer and parameter offload on one 8-GPU host, ~0.8e9 parameters."""
    out = tmp_path_factory.mktemp("zero3-offload")
    generate(
        SynthSpec(
            ranks=8,
            hosts=1,
            steps=12,
            framework="deepspeed",
            zero_stage=3,
            offload="both",
            timestamps=True,
        ),
        out,
    )
    return out


def _analyse(path: Path, tmp_path: Path, telemetry: pl.DataFrame | None = None) -> Diagnosis:
    return run_analysis([str(path)], workdir=tmp_path, telemetry=telemetry)


def _finding(a: Diagnosis) -> Any:
    found = [f for f in a.findings if f.kind == "zero_stage"]
    assert len(found) == 1
    return found[0]


def test_advises_stage_2_without_offload_when_it_fits_on_fast_links(
    offload_job: Path, tmp_path: Path
) -> None:
    a = _analyse(offload_job, tmp_path, _telemetry(total=80 * GiB, used=6 * GiB))
    f = _finding(a)
    assert f.severity == "info"  # advice, not a fault
    ev = f.evidence
    assert ev["current"] == {"stage": 3, "offload_optimizer": True, "offload_param": True}
    # ZeRO-1 and ZeRO-2 move the same bytes per step: the one with less memory wins.
    assert ev["recommended"] == {"stage": 2, "offload_optimizer": False, "offload_param": False}
    assert "ZeRO-2 would fit" in f.message
    inputs = {i["name"]: i for i in ev["inputs"]}
    assert inputs["gpu_memory_total_bytes"]["value"] == 80 * GiB
    assert inputs["peak_memory_bytes"]["value"] == 6 * GiB
    assert inputs["params"]["source"].startswith("one step's ReduceScatter")
    assert inputs["bus_bandwidth_bytes_per_s"]["source"].startswith("nominal for P2P")
    assert inputs["weight_bytes"]["value"] == 2
    assert inputs["dp_size"]["value"] == 8
    assert ev["missing"] == []
    best = next(o for o in ev["options"] if o["stage"] == 2 and not o["offload_optimizer"])
    cur = next(o for o in ev["options"] if o["current"])
    assert best["fits"] is True
    assert best["step_s"] <= 0.9 * cur["step_s"]


def test_params_from_the_collectives_match_the_synthetic_model(
    offload_job: Path, tmp_path: Path
) -> None:
    ev = _finding(_analyse(offload_job, tmp_path)).evidence
    params = next(i for i in ev["inputs"] if i["name"] == "params")
    # The generator's model: an embedding of 50304 x hidden and 3 layers of
    # 12 h^2 + 13 h, with hidden one of 2048/4096/5120/8192; ReduceScatter counts are
    # the per-rank partitions (ceil(layer / 8)), so 8 x their sum is within 8 x 4 of it.
    totals = [50304 * h + 3 * (12 * h * h + 13 * h) for h in (2048, 4096, 5120, 8192)]
    assert min(abs(params["value"] - t) for t in totals) <= 32
    assert "13 calls a step" in params["source"]  # 4 + 4 all-gathers, 4 reduce, 1 norm


def test_no_advice_when_nothing_else_fits(offload_job: Path, tmp_path: Path) -> None:
    # An 8 GiB GPU already 6 GiB full: ZeRO-2 (~3 GiB of states more) does not fit.
    f = _finding(_analyse(offload_job, tmp_path, _telemetry(total=8 * GiB, used=6 * GiB)))
    assert f.severity == "info"
    assert f.evidence["recommended"] is None
    assert "No other stage both fits and is clearly faster" in f.message


def test_without_telemetry_says_what_is_missing(offload_job: Path, tmp_path: Path) -> None:
    f = _finding(_analyse(offload_job, tmp_path))
    assert f.severity == "info"
    assert f.evidence["recommended"] is None
    assert any(m.startswith("GPU memory total") for m in f.evidence["missing"])
    assert all(o["fits"] is None for o in f.evidence["options"] if not o["current"])
    assert "GPU memory total missing" in f.message


def test_zero_init_line_gives_the_parameter_count(offload_job: Path, tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    text = (offload_job / "job.log").read_text()
    line = (
        "[2025-03-14 09:00:01,500] [INFO] [partition_parameters.py:366:__exit__] "
        "finished initializing model - num_params = 13, num_elems = 0.81B\n"
    )
    log.write_text(line + text)
    ev = _finding(_analyse(log, tmp_path / "work")).evidence
    params = next(i for i in ev["inputs"] if i["name"] == "params")
    assert params["value"] == 810_000_000
    assert params["source"].startswith("DeepSpeed zero.Init")


def test_stage_2_job_is_fine(tmp_path: Path) -> None:
    out = tmp_path / "job"
    generate(
        SynthSpec(ranks=8, hosts=1, steps=12, framework="deepspeed", zero_stage=2),
        out,
    )
    f = _finding(_analyse(out, tmp_path / "work", _telemetry(total=80 * GiB, used=20 * GiB)))
    assert f.severity == "info"
    assert f.evidence["recommended"] is None


def test_no_finding_without_deepspeed(tmp_path: Path) -> None:
    out = tmp_path / "job"
    generate(SynthSpec(ranks=4, hosts=1, steps=3), out)
    a = _analyse(out, tmp_path / "work")
    assert not [f for f in a.findings if f.kind == "zero_stage"]
