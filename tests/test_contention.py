"""The timeline, telemetry alignment, pcie_contention and oom_risk, on synthetic jobs
with the telemetry ``synth --telemetry`` writes (its truth is what it injected)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from ncclscope import synth
from ncclscope.agent.telemetry import read_telemetry
from ncclscope.analysis import Diagnosis, run_analysis
from ncclscope.cli import cli
from ncclscope.detect.context import Context
from ncclscope.detect.oom_risk import oom_metric
from ncclscope.errors import InputError
from ncclscope.model.timeline import find_pattern, normalise_bus_id
from ncclscope.schema import STEPS_SCHEMA, TELEMETRY_SCHEMA
from ncclscope.synth.telemetry import nvml_bus_id


def _spec(**kw: object) -> synth.SynthSpec:
    base: dict[str, object] = {
        "ranks": 8,
        "hosts": 2,
        "steps": 7,
        "layers": 2,
        "era": "2.27",
        "timestamps": True,
        "framework": "deepspeed",
        "zero_stage": 3,
        "offload": "optimizer",
        "step_time_s": 1.5,
        "telemetry": True,
        "telemetry_interval_s": 0.1,
        "seed": 3,
    }
    base.update(kw)
    return synth.SynthSpec(**base)  # type: ignore[arg-type]


def _analyse(job: Path, tmp: Path, *, telemetry: bool = True) -> Diagnosis:
    tel = read_telemetry([job / "telemetry"]) if telemetry else None
    return run_analysis([str(job / "job.log")], workdir=tmp, telemetry=tel)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("contention")
    specs = {
        "contended": _spec(pcie_contention=("node-1",), contention_from_step=2),
        "contended_z2": _spec(
            zero_stage=2, pcie_contention=("node-0",), contention_from_step=1, seed=5
        ),
        "healthy_offload": _spec(),
        "healthy": _spec(offload="none"),
        "growth": _spec(memory_growth=(5,), memory_growth_bytes_per_step=5 << 30),
        "no_ts": _spec(timestamps=False),
    }
    out = {}
    for name, spec in specs.items():
        synth.generate(spec, root / name)
        out[name] = root / name
    return out


def _kinds(a: Diagnosis, kind: str) -> list[tuple[list[int], list[str]]]:
    return [(f.ranks, f.hosts) for f in a.findings if f.kind == kind]


# --- timeline -----------------------------------------------------------------------


def test_timeline_zero3_phases(jobs: dict[str, Path], tmp_path: Path) -> None:
    a = _analyse(jobs["healthy_offload"], tmp_path)
    from ncclscope.model.timeline import step_timeline

    tl = step_timeline(a.analysis)
    assert tl.schema == STEPS_SCHEMA
    pattern = find_pattern(a.analysis)
    assert pattern is not None
    assert (pattern.period, pattern.shape) == (7, "zero3")  # 2 layers: 2 + 2x2 + 1
    coll = tl.filter(pl.col("source") == "collectives")
    assert sorted(coll["rank"].unique().to_list()) == list(range(8))
    per = coll.group_by("phase").agg(pl.len(), pl.col("duration_s").median())
    counts = dict(zip(per["phase"], per["len"], strict=True))
    # 7 steps x 8 ranks; the last step's optimizer phase has no next collective
    assert counts == {"forward": 56, "backward": 56, "optimizer": 48}
    opt = per.filter(pl.col("phase") == "optimizer")["duration_s"][0]
    # CPU Adam: 35% of the step, plus the gap before the next collective's slot
    assert opt == pytest.approx(1.5 * 0.35 + 1.5 * 0.65 / 7, rel=0.05)
    timers = tl.filter(pl.col("source") == "timers")
    assert set(timers["rank"].to_list()) == {0}
    assert timers["start_ts"].null_count() == len(timers)


def test_timeline_zero2_shape(jobs: dict[str, Path], tmp_path: Path) -> None:
    pattern = find_pattern(_analyse(jobs["contended_z2"], tmp_path).analysis)
    assert pattern is not None
    assert (pattern.period, pattern.shape) == (5, "zero12")  # RS x2, AR, AG x2


def test_timeline_needs_timestamps(jobs: dict[str, Path], tmp_path: Path) -> None:
    from ncclscope.model.timeline import step_timeline

    a = _analyse(jobs["no_ts"], tmp_path)
    assert find_pattern(a.analysis) is None
    tl = step_timeline(a.analysis)
    assert set(tl["source"].to_list()) == {"timers"}  # rank 0's timers are still there


def test_bus_ids_match_between_nccl_and_nvml() -> None:
    frame = pl.DataFrame({"b": ["3a000", "00000000:3A:00.0", "00000001:08:00.0", "108000"]})
    got = frame.select(normalise_bus_id(pl.col("b")))["b"].to_list()
    assert got[0] == got[1]
    assert got[2] == got[3]
    assert nvml_bus_id("5d000") == "00000000:5D:00.0"


# --- pcie_contention ----------------------------------------------------------------


def test_contention_found_on_the_injected_host(jobs: dict[str, Path], tmp_path: Path) -> None:
    a = _analyse(jobs["contended"], tmp_path)
    found = [f for f in a.findings if f.kind == "pcie_contention"]
    assert [(f.ranks, f.hosts) for f in found] == [([4, 5, 6, 7], ["node-1"])]
    ev = found[0].evidence
    assert ev["offload"] == {"optimizer": "cpu"}
    assert ev["inflation"] > 2.0
    assert ev["pcie_load_ratio"] >= 0.85
    assert ev["host_memory_pressure"] is True
    assert next(g["pci_bus_id"] for g in ev["gpus"]) == "00000000:18:00.0"
    assert found[0].cost_gpu_s
    assert found[0].cost_gpu_s > 0
    assert found[0].lines  # the next step's AllGather on a contended rank


def test_contention_found_with_zero2(jobs: dict[str, Path], tmp_path: Path) -> None:
    a = _analyse(jobs["contended_z2"], tmp_path)
    assert _kinds(a, "pcie_contention") == [([0, 1, 2, 3], ["node-0"])]


@pytest.mark.parametrize("name", ["healthy_offload", "healthy", "growth"])
def test_no_contention_without_injection(name: str, jobs: dict[str, Path], tmp_path: Path) -> None:
    assert _kinds(_analyse(jobs[name], tmp_path), "pcie_contention") == []


def test_no_contention_without_telemetry(jobs: dict[str, Path], tmp_path: Path) -> None:
    a = _analyse(jobs["contended"], tmp_path, telemetry=False)
    assert not [f for f in a.findings if f.kind in ("pcie_contention", "oom_risk")]


def test_no_contention_when_offload_is_off(jobs: dict[str, Path], tmp_path: Path) -> None:
    """Saturated links without offload are someone else's traffic, not this detector's."""
    tel = read_telemetry([jobs["contended"] / "telemetry"])
    a = run_analysis([str(jobs["healthy"] / "job.log")], workdir=tmp_path, telemetry=tel)
    assert _kinds(a, "pcie_contention") == []


# --- oom_risk -----------------------------------------------------------------------


def test_oom_risk_names_the_growing_gpu(jobs: dict[str, Path], tmp_path: Path) -> None:
    a = _analyse(jobs["growth"], tmp_path)
    found = [f for f in a.findings if f.kind == "oom_risk"]
    assert [(f.ranks, f.hosts) for f in found] == [([5], ["node-1"])]
    gpu = found[0].evidence["gpus"][0]
    assert gpu["trend_r"] > 0.95
    assert gpu["slope_bytes_per_step"] == pytest.approx(5 << 30, rel=0.15)


@pytest.mark.parametrize("name", ["healthy_offload", "healthy", "contended"])
def test_no_gpu_oom_risk_without_growth(name: str, jobs: dict[str, Path], tmp_path: Path) -> None:
    found = [
        f
        for f in _analyse(jobs[name], tmp_path).findings
        if f.kind == "oom_risk" and f.evidence["resource"] == "gpu"
    ]
    assert found == []


def test_no_oom_risk_from_samples_drifting_against_the_step(tmp_path: Path) -> None:
    """Sampled every 0.2 s in ~2 s steps, the samples slide along each step's activation
    peak, so per-step peaks rise steadily (r 0.99) though nothing grows: the floor of
    each step stays flat, and that is what tells the two apart (found by
    bench_contention.py, seed 7, job 23)."""
    spec = _spec(
        ranks=16, hosts=4, steps=8, seed=7086, step_time_s=2.0199364649247036,
        offload="both", clock_offset_max_s=0.002, jitter_events=2, telemetry_interval_s=0.2,
    )  # fmt: skip
    synth.generate(spec, tmp_path / "job")
    a = _analyse(tmp_path / "job", tmp_path / "w")
    peaks = oom_metric(Context(a.analysis))
    assert (peaks["trend_r"] > 0.9).sum() > 0  # the peaks do look like a trend...
    assert [f for f in a.findings if f.kind == "oom_risk"] == []  # ...but nothing grows


def test_host_oom_risk_when_available_memory_stays_low(
    jobs: dict[str, Path], tmp_path: Path
) -> None:
    tel = read_telemetry([jobs["healthy_offload"] / "telemetry"])
    low = pl.col("metric") == "ncclscope_host_memory_available_bytes"
    tel = tel.with_columns(
        pl.when(low & (pl.col("host") == "node-0"))
        .then(pl.col("value") * 0.04)
        .otherwise(pl.col("value"))
        .alias("value")
    )
    a = run_analysis([str(jobs["healthy_offload"] / "job.log")], workdir=tmp_path, telemetry=tel)
    found = [f for f in a.findings if f.kind == "oom_risk"]
    assert [(f.hosts, f.evidence["resource"]) for f in found] == [(["node-0"], "host")]


# --- bad or missing telemetry -------------------------------------------------------


def test_telemetry_without_gpu_metrics_finds_nothing(jobs: dict[str, Path], tmp_path: Path) -> None:
    tel = read_telemetry([jobs["contended"] / "telemetry"])
    host_only = tel.filter(pl.col("metric").str.starts_with("ncclscope_host_"))
    a = run_analysis([str(jobs["contended"] / "job.log")], workdir=tmp_path, telemetry=host_only)
    assert not [f for f in a.findings if f.kind in ("pcie_contention", "oom_risk")]


def test_empty_telemetry_frame(jobs: dict[str, Path], tmp_path: Path) -> None:
    empty = pl.DataFrame(schema=TELEMETRY_SCHEMA)
    a = run_analysis([str(jobs["contended"] / "job.log")], workdir=tmp_path, telemetry=empty)
    assert not [f for f in a.findings if f.kind in ("pcie_contention", "oom_risk")]


def test_cli_empty_telemetry_folder_says_so(jobs: dict[str, Path], tmp_path: Path) -> None:
    empty = tmp_path / "tel"
    empty.mkdir()
    result = CliRunner().invoke(
        cli, ["analyze", str(jobs["contended"] / "job.log"), "--telemetry", str(empty)]
    )
    assert result.exit_code == 0, result.output
    assert "no samples" in result.stderr


def test_cli_truncated_part_is_a_clear_problem(jobs: dict[str, Path], tmp_path: Path) -> None:
    parts = sorted((jobs["contended"] / "telemetry").glob("part-*.parquet"))
    folder = tmp_path / "tel"
    folder.mkdir()
    for p in parts:
        (folder / p.name).write_bytes(p.read_bytes())
    bad = folder / parts[0].name
    bad.write_bytes(parts[0].read_bytes()[:500])  # cut short, as a full disk would
    args = ["analyze", str(jobs["contended"] / "job.log"), "--telemetry", str(folder)]
    result = CliRunner().invoke(cli, [*args, "--format", "json"])
    assert result.exit_code == 1
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    assert "telemetry part cannot be read" in result.stderr
    doc = json.loads(result.stdout)
    assert any("telemetry part" in p["reason"] for p in doc["problems"])
    # the other parts were read: the contention is still found
    assert any(f["kind"] == "pcie_contention" for f in doc["findings"])


def test_read_telemetry_raises_input_error_without_a_problem_list(tmp_path: Path) -> None:
    bad = tmp_path / "part-1.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(InputError, match="telemetry part cannot be read"):
        read_telemetry([tmp_path])


# --- synth ----------------------------------------------------------------------------


def test_synth_truth_names_the_injection(jobs: dict[str, Path]) -> None:
    truth = json.loads((jobs["contended"] / "truth.json").read_text())
    tele = truth["telemetry"]
    assert tele["contention"] == [
        {
            "host": "node-1",
            "ranks": [4, 5, 6, 7],
            "steps": [2, 3, 4, 5, 6],
            "inflation": 2.5,
            "link": "own",
            "uplink": None,
            "memory_pressure": True,
        }
    ]
    ranks = {r["rank"]: r["bus_id"] for r in truth["ranks"]}
    assert all(nvml_bus_id(ranks[g["rank"]]) == g["pci_bus_id"] for g in tele["gpus"])


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"pcie_contention": ("node-1",), "offload": "none"}, "offload"),
        ({"pcie_contention": ("nope",)}, "unknown host"),
        ({"telemetry": False, "memory_growth": (1,)}, "need telemetry"),
        ({"memory_growth": (99,)}, "rank must be"),
    ],
)
def test_synth_refuses_bad_telemetry_options(kw: dict[str, object], msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        _spec(**kw)


def test_telemetry_of_a_job_that_dies_before_its_first_step_is_a_usage_error(
    tmp_path: Path,
) -> None:
    # The job dies at world instance 6, before any optimizer step: nothing to sample.
    args = ["synth", "--out", str(tmp_path / "job"), "--ranks", "8", "--hosts", "2",
            "--framework", "deepspeed", "--offload", "optimizer", "--telemetry",
            "--dead-process", "3:6:SIGSEGV", "--pcie-contention", "node-1"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "needs at least one completed step" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    # The same job dying later writes its telemetry.
    args[args.index("3:6:SIGSEGV")] = "3:60:SIGSEGV"
    args[args.index(str(tmp_path / "job"))] = str(tmp_path / "later")
    assert CliRunner().invoke(cli, args).exit_code == 0
    assert list((tmp_path / "later" / "telemetry").glob("part-*.parquet"))
