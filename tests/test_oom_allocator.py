"""oom_risk the way PyTorch's caching allocator works (issue #12, item 7).

NVML counts the allocator's cache as used: a healthy job sits flat at 95-99% of the
total, and must raise nothing.  A leak lifts the floor between activations, an OOM
message says it happened, DeepSpeed's MA/Max_MA count tensors only.  Log lines here are
written from PyTorch's and DeepSpeed's format strings; the values are invented.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from ncclscope import synth
from ncclscope.agent.telemetry import read_telemetry
from ncclscope.analysis import Diagnosis, run_analysis
from ncclscope.detect.base import Finding
from ncclscope.detect.oom_risk import kendall_tau, theil_sen
from ncclscope.parsers.torch.lines import parse_cuda_oom, parse_torch
from ncclscope.schema import TELEMETRY_SCHEMA
from ncclscope.synth.job import _Job
from ncclscope.synth.telemetry import GPU_TOTAL_BYTES

GiB = 1 << 30


def _spec(**kw: object) -> synth.SynthSpec:
    base: dict[str, object] = {
        "ranks": 8,
        "hosts": 2,
        "steps": 10,
        "layers": 2,
        "era": "2.27",
        "timestamps": True,
        "framework": "deepspeed",
        "zero_stage": 3,
        "offload": "none",
        "step_time_s": 1.5,
        "telemetry": True,
        "telemetry_interval_s": 0.1,
        "seed": 3,
    }
    base.update(kw)
    return synth.SynthSpec(**base)  # type: ignore[arg-type]


def _generate(
    spec: synth.SynthSpec, out: Path, monkeypatch: pytest.MonkeyPatch, **tel: Any
) -> Path:
    """A synthetic job whose telemetry job gets ``tel`` (e.g. the allocator's cache)."""
    if tel:
        made = _Job._telemetry_job

        def patched(self: _Job) -> Any:
            return replace(made(self), **tel)

        monkeypatch.setattr(_Job, "_telemetry_job", patched)
    synth.generate(spec, out)
    monkeypatch.undo()
    return out


def _analyse(job: Path, tmp: Path) -> Diagnosis:
    tel = read_telemetry([job / "telemetry"])
    return run_analysis([str(job / "job.log")], workdir=tmp, telemetry=tel)


def _oom(a: Diagnosis) -> list[Finding]:
    return [f for f in a.findings if f.kind == "oom_risk"]


def _alarms(a: Diagnosis) -> list[Finding]:
    return [f for f in _oom(a) if f.severity in ("warning", "critical")]


# --- robust fits ----------------------------------------------------------------------


def test_theil_sen_ignores_an_outlier_least_squares_would_follow() -> None:
    xs = [float(i) for i in range(10)]
    ys = [50.0] * 10
    ys[9] = 80.0  # one peak sample, e.g. an eval step
    assert theil_sen(xs, ys) == 0.0
    assert kendall_tau(xs, ys) == pytest.approx(9 / 45)


def test_kendall_tau_of_a_leak_and_of_noise() -> None:
    xs = [float(i) for i in range(12)]
    assert kendall_tau(xs, [10 + 0.5 * i for i in range(12)]) == 1.0
    noise = [97.0, 97.2, 96.9, 97.1, 97.0, 96.8, 97.2, 97.1, 96.9, 97.0, 97.1, 96.9]
    assert abs(kendall_tau(xs, noise) or 0.0) < 0.3


# --- NVML: the cache is not a risk, a rising floor is ---------------------------------


@pytest.mark.parametrize("seed", [3, 11, 29])
def test_flat_cache_at_95_to_99_percent_is_no_alarm(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _generate(_spec(seed=seed, gpu_cache_ratio=(0.95, 0.99)), tmp_path / "job", monkeypatch)
    a = _analyse(job, tmp_path / "w")
    tel = a.analysis.telemetry.filter(pl.col("metric") == "ncclscope_gpu_memory_used_bytes")
    # the job really does sit high: a GPU ends at >= 97% (the old critical line)
    last = tel.group_by("labels").agg(pl.col("value").sort_by("ts").last())["value"]
    assert (last >= 0.97 * GPU_TOTAL_BYTES).sum() >= 1
    assert (last >= 0.95 * GPU_TOTAL_BYTES * 0.998).all()
    assert _alarms(a) == []


def test_cache_flat_at_the_top_from_the_first_sample_is_no_alarm(tmp_path: Path) -> None:
    """A cache already full when the agent started (no warm-up in the samples)."""
    job = synth.generate(_spec(seed=5), tmp_path / "job")
    del job
    tel = read_telemetry([tmp_path / "job" / "telemetry"])
    used = pl.col("metric") == "ncclscope_gpu_memory_used_bytes"
    jitter = (pl.col("ts").dt.epoch("ms") % 7 - 3).cast(pl.Float64) * 1e-4
    tel = tel.with_columns(
        pl.when(used).then(GPU_TOTAL_BYTES * (0.985 + jitter)).otherwise("value").alias("value")
    )
    a = run_analysis([str(tmp_path / "job" / "job.log")], workdir=tmp_path / "w", telemetry=tel)
    assert _alarms(a) == []


@pytest.mark.parametrize(("seed", "gib_per_step"), [(3, 2), (7, 3), (13, 4)])
def test_a_leak_is_named_by_its_rising_floor(
    seed: int, gib_per_step: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec(seed=seed, memory_growth=(5,), memory_growth_bytes_per_step=gib_per_step * GiB)
    a = _analyse(_generate(spec, tmp_path / "job", monkeypatch), tmp_path / "w")
    found = _alarms(a)
    assert [(f.ranks, f.evidence["signal"]) for f in found] == [([5], "nvml")]
    gpu = found[0].evidence["gpus"][0]
    assert gpu["slope_bytes_per_step"] == pytest.approx(gib_per_step * GiB, rel=0.2)
    assert gpu["floor_tau"] >= 0.6
    assert gpu["seconds_to_full"] is not None


def test_a_warm_up_that_stops_is_no_trend(tmp_path: Path) -> None:
    """The floor climbs for three steps (the cache filling) then stays: the later half
    is flat, so nothing is projected."""
    synth.generate(_spec(seed=9, steps=12), tmp_path / "job")
    tel = read_telemetry([tmp_path / "job" / "telemetry"])
    used = pl.col("metric") == "ncclscope_gpu_memory_used_bytes"
    t0 = tel["ts"].min()
    assert isinstance(t0, datetime)
    secs = (pl.col("ts") - t0).dt.total_microseconds() / 1e6
    ramp = pl.min_horizontal(secs / 6.0, pl.lit(1.0))  # ~3 steps of 1.5 s and a bit
    tel = tel.with_columns(
        pl.when(used).then(GPU_TOTAL_BYTES * (0.80 + 0.17 * ramp)).otherwise("value").alias("value")
    )
    a = run_analysis([str(tmp_path / "job" / "job.log")], workdir=tmp_path / "w", telemetry=tel)
    assert _alarms(a) == []


def test_a_long_warm_up_that_ends_in_the_healthy_band_is_no_alarm(tmp_path: Path) -> None:
    """Half a short run spent filling the cache (shapes seen one by one), then flat at
    97%: the later half is flat and the top is below the ceiling, so no trend reaches
    the total, however steep the climb was."""
    synth.generate(_spec(seed=21, steps=10), tmp_path / "job")
    tel = read_telemetry([tmp_path / "job" / "telemetry"])
    used = pl.col("metric") == "ncclscope_gpu_memory_used_bytes"
    t0, t1 = tel["ts"].min(), tel["ts"].max()
    assert isinstance(t0, datetime)
    assert isinstance(t1, datetime)
    frac = (pl.col("ts") - t0).dt.total_microseconds() / ((t1 - t0).total_seconds() * 1e6)
    ramp = pl.min_horizontal(frac * 2.0, pl.lit(1.0))  # rises through the first half
    tel = tel.with_columns(
        pl.when(used).then(GPU_TOTAL_BYTES * (0.60 + 0.37 * ramp)).otherwise("value").alias("value")
    )
    a = run_analysis([str(tmp_path / "job" / "job.log")], workdir=tmp_path / "w", telemetry=tel)
    assert _alarms(a) == []


# --- CUDA out of memory ---------------------------------------------------------------

OLD_OOM = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB (GPU 2; "
    "79.21 GiB total capacity; 71.40 GiB already allocated; 2.10 GiB free; 73.90 GiB "
    "reserved in total by PyTorch) If reserved memory is >> allocated memory try setting "
    "max_split_size_mb to avoid fragmentation."
)
NEW_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 6 has a "
    "total capacity of 79.10 GiB of which 301.50 MiB is free. Process 31337 has 78.79 GiB "
    "memory in use. Of the allocated memory 72.25 GiB is allocated by PyTorch, and 5.82 GiB "
    "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
    "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


def test_parse_both_eras_of_the_oom_message() -> None:
    old = parse_cuda_oom(OLD_OOM)
    assert old is not None
    assert (old.gpu, old.tried_bytes, old.free_bytes) == (2, 3 * GiB, int(2.10 * GiB))
    assert (old.allocated_bytes, old.reserved_bytes) == (int(71.40 * GiB), int(73.90 * GiB))
    assert old.total_bytes == int(79.21 * GiB)
    new = parse_cuda_oom(NEW_OOM)
    assert new is not None
    assert (new.gpu, new.tried_bytes, new.total_bytes) == (6, 896 << 20, int(79.10 * GiB))
    assert new.free_bytes == int(301.50 * (1 << 20))
    assert new.allocated_bytes == int(72.25 * GiB)
    # reserved = allocated + the cached part the new message prints alone
    assert new.reserved_bytes == int(72.25 * GiB) + int(5.82 * GiB)
    bare = parse_cuda_oom("RuntimeError: CUDA error: out of memory")
    assert bare is not None
    assert bare.tried_bytes is None
    assert parse_cuda_oom("all good, 12 GiB free") is None


def test_oom_message_hard_wrapped_is_read_whole() -> None:
    cut = 150
    lines = [(10, "[rank6]: " + NEW_OOM[:cut]), (11, NEW_OOM[cut:])]
    res = parse_torch(lines, file_id=0, year=2024)
    ev = res.events.filter(pl.col("kind") == "cuda_oom")
    assert ev.select("line_no", "global_rank", "value").rows() == [(10, 6, 896 << 20)]
    oom = parse_cuda_oom(ev["message"][0])
    assert oom is not None
    assert oom.reserved_bytes == int(72.25 * GiB) + int(5.82 * GiB)


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_an_oom_that_happened_is_critical_and_names_its_rank(tmp_path: Path) -> None:
    log = _write(
        tmp_path / "train.log",
        [
            "node-b: [rank6]: Traceback (most recent call last):",
            '[rank6]:   File "train.py", line 88, in <module>',
            f"node-b: [rank6]: {NEW_OOM}",
            f"node-a: [rank2]: {OLD_OOM}",
            f"node-b: [rank6]: {NEW_OOM}",  # printed again by the launcher's summary
        ],
    )
    a = run_analysis([str(log)], workdir=tmp_path / "w")
    found = sorted(_oom(a), key=lambda f: f.hosts)
    assert [(f.severity, f.hosts, f.ranks) for f in found] == [
        ("critical", ["node-a"], [2]),
        ("critical", ["node-b"], [6]),
    ]
    assert [len(f.evidence["ooms"]) for f in found] == [1, 1]
    new = found[1].evidence["ooms"][0]
    assert new["tried_bytes"] == 896 << 20
    assert new["gpu"] == 6
    # 5.82 GiB cached but unallocated against an 896 MiB request: fragmentation
    assert "fragmentation" in found[1].message
    assert "fragmentation" not in found[0].message  # 2.5 GiB cached < 3 GiB asked
    assert found[0].evidence["ooms"][0]["reserved_bytes"] == int(73.90 * GiB)


# --- DeepSpeed's own figures ------------------------------------------------------------


def _gpu_total_telemetry(total: int, start: datetime) -> pl.DataFrame:
    rows = [
        (start + timedelta(seconds=s), "node-a", "ncclscope_gpu_memory_total_bytes",
         "0,GPU-0000,00000000:18:00.0", float(total))
        for s in range(0, 200, 10)
    ]  # fmt: skip
    return pl.DataFrame(rows, schema=TELEMETRY_SCHEMA, orient="row")


def _ds_tput(step: int, at: datetime, ma: float, max_ma: float) -> str:
    ts = at.strftime("%Y-%m-%d %H:%M:%S") + f",{at.microsecond // 1000:03d}"
    return (
        f"[{ts}] [INFO] [timer.py:260:stop] epoch=0/micro_step={step}/global_step={step}, "
        f"RunningAvgSamplesPerSec=41.5, CurrSamplesPerSec=41.7, "
        f"MemAllocated={ma:.2f}GB, MaxMemAllocated={max_ma:.2f}GB"
    )


T0 = datetime(2024, 6, 3, 9, 0, 0, tzinfo=UTC)


def test_allocated_leak_from_deepspeed_throughput_lines(tmp_path: Path) -> None:
    lines = [
        _ds_tput(k, T0 + timedelta(seconds=10 * k), 30.0 + 1.0 * k, 41.0 + 1.0 * k)
        for k in range(1, 13)
    ]
    log = _write(tmp_path / "ds.log", lines)
    tel = _gpu_total_telemetry(80 * GiB, T0)
    a = run_analysis([str(log)], workdir=tmp_path / "w", telemetry=tel)
    found = [f for f in _oom(a) if f.evidence.get("signal") == "deepspeed"]
    assert [f.severity for f in found] == ["critical"]  # ~27 GiB left at 1 GiB per 10 s
    assert found[0].evidence["seconds_to_full"] == pytest.approx(270, rel=0.1)


def test_flat_deepspeed_allocation_is_no_alarm_and_a_tight_peak_warns(tmp_path: Path) -> None:
    flat = [
        _ds_tput(k, T0 + timedelta(seconds=10 * k), 30.0 + 0.05 * (k % 3), 60.0 + 0.1 * (k % 2))
        for k in range(1, 13)
    ]
    tel = _gpu_total_telemetry(80 * GiB, T0)
    a = run_analysis([str(_write(tmp_path / "a.log", flat))], workdir=tmp_path / "w", telemetry=tel)
    assert _alarms(a) == []
    tight = [
        _ds_tput(k, T0 + timedelta(seconds=10 * k), 30.0 + 0.05 * (k % 3), 77.2)
        for k in range(1, 13)
    ]
    a = run_analysis(
        [str(_write(tmp_path / "b.log", tight))], workdir=tmp_path / "v", telemetry=tel
    )
    found = _alarms(a)
    assert [(f.severity, f.evidence["signal"]) for f in found] == [("warning", "deepspeed")]
    assert found[0].evidence["allocated_ratio"] == pytest.approx(77.2 / 80, abs=0.01)
