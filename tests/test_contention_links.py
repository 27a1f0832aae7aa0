"""Issue #19: contention behind a shared PCIe uplink, full host names in the telemetry,
idle swap, mild contention and the 2.26.2-only timestamp gate, on synthetic jobs whose
truth is what the generator injected."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from ncclscope import synth
from ncclscope.agent.telemetry import read_telemetry
from ncclscope.analysis import Diagnosis, run_analysis
from ncclscope.detect.config import subsecond_digits_unreliable
from ncclscope.detect.context import Context
from ncclscope.detect.lateness import timing_usable
from ncclscope.detect.pcie_contention import SATURATED, _swap_rate
from ncclscope.hosts import host_map, short_host, unmatched_hosts
from ncclscope.schema import TELEMETRY_SCHEMA


def _spec(**kw: object) -> synth.SynthSpec:
    base: dict[str, object] = {
        "ranks": 16,
        "hosts": 2,
        "steps": 9,
        "layers": 2,
        "era": "2.27",
        "timestamps": True,
        "framework": "deepspeed",
        "zero_stage": 2,
        "offload": "optimizer",
        "step_time_s": 1.5,
        "telemetry": True,
        "telemetry_interval_s": 0.1,
        "seed": 7,
    }
    base.update(kw)
    return synth.SynthSpec(**base)  # type: ignore[arg-type]


SPECS: dict[str, dict[str, Any]] = {
    "uplink2": {
        "gpus_per_switch": 2,
        "pcie_contention": ("node-1",),
        "contention_switch": 2,
        "contention_from_step": 1,
        "contention_inflation": 2.0,
    },
    "uplink4": {
        "gpus_per_switch": 4,
        "pcie_contention": ("node-0",),
        "contention_switch": 1,
        "contention_from_step": 2,
        "contention_inflation": 1.6,
        "telemetry_domain": "cluster.internal",
    },
    "healthy4": {"gpus_per_switch": 4, "telemetry_domain": "cluster.internal"},
    "own_idle_swap": {
        "pcie_contention": ("node-1",),
        "contention_inflation": 2.5,
        "contention_memory_pressure": False,
        "idle_swap_bytes": 135 << 20,
    },
    "own_no_swap": {
        "pcie_contention": ("node-1",),
        "contention_inflation": 2.5,
        "contention_memory_pressure": False,
    },
    "own_pressure": {"pcie_contention": ("node-1",), "contention_inflation": 2.5},
    "mild": {
        "gpus_per_switch": 2,
        "pcie_contention": ("node-1",),
        "contention_switch": 0,
        "contention_inflation": 1.16,
        "steps": 12,
    },
    "healthy_idle_swap": {"idle_swap_bytes": 135 << 20},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Diagnosis, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("links")
    out = {}
    for name, kw in SPECS.items():
        synth.generate(_spec(**kw), root / name)
        truth = json.loads((root / name / "truth.json").read_text())["telemetry"]
        tel = read_telemetry([root / name / "telemetry"])
        diag = run_analysis(
            [str(root / name / "job.log")], workdir=root / f"w-{name}", telemetry=tel
        )
        out[name] = (diag, truth)
    return out


def _contention(d: Diagnosis) -> list[Any]:
    return [f for f in d.findings if f.kind == "pcie_contention"]


@pytest.mark.parametrize("name", ["uplink2", "uplink4"])
def test_shared_uplink_contention_names_the_link_and_its_gpus(
    runs: dict[str, tuple[Diagnosis, dict[str, Any]]], name: str
) -> None:
    diag, truth = runs[name]
    (want,) = truth["contention"]
    (f,) = _contention(diag)
    assert f.hosts == [want["host"]]
    assert f.ranks == want["ranks"]
    assert f.severity == "warning"  # no memory pressure injected beyond the default
    ev = f.evidence
    assert ev["saturated_link"] == "uplink"
    (link,) = ev["shared_links"]
    assert link["link"] == want["uplink"]
    assert link["ranks"] == want["ranks"]
    assert link["load_ratio"] >= SATURATED
    assert (link["generation"], link["width"]) == (4, 16)
    assert ev["pcie_load_ratio"] < 0.5  # each GPU's own link reads far below saturation
    assert want["uplink"] in f.message
    assert "shared by GPUs" in f.message


def test_full_host_names_meet_the_logs(runs: dict[str, tuple[Diagnosis, dict[str, Any]]]) -> None:
    diag, truth = runs["uplink4"]
    assert all(h.endswith(".cluster.internal") for h in truth["hosts"])
    assert _contention(diag)[0].hosts == ["node-0"]
    assert not [f for f in diag.findings if "matches no host" in f.message]


@pytest.mark.parametrize("name", ["healthy4", "healthy_idle_swap"])
def test_no_claim_on_healthy_jobs(
    runs: dict[str, tuple[Diagnosis, dict[str, Any]]], name: str
) -> None:
    diag, _ = runs[name]
    assert _contention(diag) == []
    assert [f for f in diag.findings if f.severity in ("warning", "critical")] == []


def test_idle_swap_changes_no_severity(runs: dict[str, tuple[Diagnosis, dict[str, Any]]]) -> None:
    swap = _contention(runs["own_idle_swap"][0])
    none = _contention(runs["own_no_swap"][0])
    pressure = _contention(runs["own_pressure"][0])
    assert [f.severity for f in swap] == [f.severity for f in none] == ["warning"]
    assert swap[0].evidence["swap_used_max_bytes"] == 135 << 20
    assert swap[0].evidence["host_memory_pressure"] is False
    assert swap[0].evidence["swap_in_bytes_per_second"] == 0.0
    assert "swapped" not in swap[0].message
    assert [f.severity for f in pressure] == ["critical"]  # runs low and swaps: pressure
    assert pressure[0].evidence["swap_out_bytes_per_second"] > 1 << 20


def test_mild_contention_is_an_info_with_its_cost(
    runs: dict[str, tuple[Diagnosis, dict[str, Any]]],
) -> None:
    diag, truth = runs["mild"]
    (f,) = _contention(diag)
    assert f.severity == "info"
    assert f.message.startswith("mild PCIe contention on node-1")
    assert f.ranks == truth["contention"][0]["ranks"]
    assert f.cost_gpu_s is not None
    assert f.cost_gpu_s > 0
    assert 1.07 <= f.evidence["inflation"] < 1.25


def test_telemetry_of_no_log_host_is_said(
    runs: dict[str, tuple[Diagnosis, dict[str, Any]]], tmp_path: Path
) -> None:
    diag, _ = runs["own_pressure"]
    a = diag.analysis
    tel = a.telemetry.with_columns(
        pl.when(pl.col("host") == "node-1")
        .then(pl.lit("gpu-77.other.site"))
        .otherwise(pl.col("host"))
        .alias("host")
    )
    job = Path(a.paths[0])
    again = run_analysis([str(job)], workdir=tmp_path, telemetry=tel)
    notes = [f for f in again.findings if f.kind == "config" and "matches no host" in f.message]
    assert len(notes) == 1
    assert "gpu-77.other.site" in notes[0].message
    assert "node-0, node-1" in notes[0].message
    assert _contention(again) == []


# --- host names ------------------------------------------------------------------------


def test_host_names_are_cut_as_nccl_cuts_them() -> None:
    assert short_host("node-7.cluster.internal") == "node-7"
    assert short_host("10.0.0.1") == "10.0.0.1"
    assert host_map(["10.0.0.1"], ["10.0.0.1"]) == {"10.0.0.1": "10.0.0.1"}
    assert host_map(["10.0.0.1", "10.0.1.2"], ["10"]) == {
        "10.0.0.1": "10.0.0.1",
        "10.0.1.2": "10.0.1.2",
    }
    assert unmatched_hosts(["10.0.0.1", "10.0.1.2"], ["10"]) == ["10.0.0.1", "10.0.1.2"]
    assert unmatched_hosts(["node-7.a"], []) == []


# --- swap rates ------------------------------------------------------------------------


def _counter(values: list[float]) -> pl.DataFrame:
    t0 = datetime(2025, 3, 14, tzinfo=UTC)
    return pl.DataFrame(
        {
            "ts": [t0 + timedelta(seconds=i) for i in range(len(values))],
            "host": ["h"] * len(values),
            "metric": ["ncclscope_host_swap_in_bytes_total"] * len(values),
            "labels": [""] * len(values),
            "value": values,
        },
        schema=TELEMETRY_SCHEMA,
    )


def test_swap_rate_from_the_counter() -> None:
    metric = "ncclscope_host_swap_in_bytes_total"
    assert _swap_rate(_counter([5e8, 5e8, 5e8]), metric) == 0.0
    assert _swap_rate(_counter([0, 1e6, 3e6]), metric) == 1.5e6
    assert _swap_rate(_counter([9e6, 1e6, 2e6]), metric) == 0.5e6  # a reset counts from zero
    assert _swap_rate(_counter([1.0]), metric) is None


# --- the 2.26.2 gate -------------------------------------------------------------------


def test_only_2262_has_unreliable_subseconds() -> None:
    assert subsecond_digits_unreliable(["2.26.2"])
    assert not subsecond_digits_unreliable(["2.26.3"])
    assert not subsecond_digits_unreliable(["2.26.5", "2.27.3"])
    assert subsecond_digits_unreliable(["2.26.2+cuda12.8"])


@pytest.mark.parametrize(
    ("era", "version", "usable"), [("2.26", "2.26.2", False), ("2.26.5", "2.26.5", True)]
)
def test_226_timing_gate(tmp_path: Path, era: str, version: str, usable: bool) -> None:
    spec = synth.SynthSpec(ranks=8, hosts=2, steps=6, layers=2, era=era, timestamps=True, seed=4)  # type: ignore[arg-type]
    synth.generate(spec, tmp_path / "job")
    diag = run_analysis([str(tmp_path / "job" / "job.log")], workdir=tmp_path / "w")
    assert diag.analysis.nccl_versions == [version]
    assert timing_usable(Context(diag.analysis)) is usable
    gap = [f for f in diag.findings if f.kind == "config" and "sub-second" in f.message]
    assert bool(gap) is not usable


def _again(diag: Diagnosis, tel: pl.DataFrame, tmp: Path) -> list[Any]:
    return _contention(run_analysis([diag.analysis.paths[0]], workdir=tmp, telemetry=tel))


def test_uplink_capacity_from_generation_and_width(
    runs: dict[str, tuple[Diagnosis, dict[str, Any]]], tmp_path: Path
) -> None:
    diag, truth = runs["uplink2"]
    tel = diag.analysis.telemetry.filter(
        pl.col("metric") != "ncclscope_pcie_uplink_max_bytes_per_second"
    )
    (f,) = _again(diag, tel, tmp_path)
    assert f.ranks == truth["contention"][0]["ranks"]
    assert f.evidence["shared_links"][0]["link"] == truth["contention"][0]["uplink"]


def test_gpus_sampled_at_different_instants_are_binned(
    runs: dict[str, tuple[Diagnosis, dict[str, Any]]], tmp_path: Path
) -> None:
    diag, truth = runs["uplink4"]
    # each GPU's samples a few milliseconds apart from the others' (not one NVML pass)
    gpu = pl.col("labels").str.split(",").list.get(0, null_on_oob=True)
    skew = pl.duration(milliseconds=gpu.cast(pl.Int64, strict=False).fill_null(0) * 3)
    tel = diag.analysis.telemetry.with_columns(
        pl.when(pl.col("metric").str.starts_with("ncclscope_gpu_"))
        .then(pl.col("ts") + skew)
        .otherwise(pl.col("ts"))
        .alias("ts")
    ).sort("ts")
    (f,) = _again(diag, tel, tmp_path)
    assert f.ranks == truth["contention"][0]["ranks"]
    assert f.evidence["saturated_link"] == "uplink"
