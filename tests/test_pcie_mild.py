"""Issue #28: steady mild PCIe contention (about 1.15x on most optimizer steps) is the
``info`` finding the README promises, also when the optimizer phases are noisy; healthy
runs (noisy, with bursts of saturation, without offload) get none.

Jobs come from ``ncclscope synth --telemetry`` (its truth is what it injected).  The
synthetic optimizer phases are exact, so step-to-step noise is put on the analysed
timeline's optimizer phases (``_noisy``: a log-normal factor per host and step, shared by
the host's ranks, times one per rank and step) before the detector reads it; the PCIe
samples stay where the agent took them.
"""

from __future__ import annotations

import json
import math
import os
import random
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from ncclscope import synth
from ncclscope.agent.telemetry import read_telemetry
from ncclscope.analysis import Diagnosis, run_analysis
from ncclscope.detect.base import Finding
from ncclscope.detect.context import Context
from ncclscope.detect.pcie_contention import PcieContentionDetector

pytestmark = pytest.mark.slow  # 28 synthetic jobs of 30 steps: about 80 s

#: Injected slowdowns of the optimizer step (the synth's ``contention_inflation``).
SLOWDOWNS = (1.10, 1.15, 1.20, 1.25)
#: Share of the measured steps contended (contention from a step on): most of them.
SHARES = (0.6, 0.75, 0.9)
#: Log-normal sigma of the optimizer phases' step-to-step noise.
NOISE = (0.0, 0.02, 0.04, 0.06)
#: A harder slice, reported (and never misclassified), not held to the 95%.
HARD_NOISE = 0.10
#: Noise draws per job and noisy level: 1 in the suite (its time), 3 for the benchmark
#: row (``NCCLSCOPE_PCIE_DRAWS=3``).
DRAWS = int(os.environ.get("NCCLSCOPE_PCIE_DRAWS", "1"))
STEPS = 30


def _spec(seed: int, **kw: object) -> synth.SynthSpec:
    base: dict[str, object] = {
        "ranks": 8 * (1 + seed % 2),
        "hosts": 1 + seed % 2,
        "steps": STEPS,
        "layers": 2,
        "era": "2.27",
        "timestamps": True,
        "framework": "deepspeed",
        "zero_stage": 2 + seed % 2,
        "offload": "optimizer",
        "step_time_s": 1.5,
        "telemetry": True,
        "telemetry_interval_s": 0.1,
        "seed": seed,
    }
    base.update(kw)
    return synth.SynthSpec(**base)  # type: ignore[arg-type]


def _jobs() -> dict[str, tuple[str, synth.SynthSpec]]:
    """name -> (class, spec): ``mild`` jobs over slowdown x share (own links and shared
    uplinks alternating, one or two hosts), and healthy ones."""
    out: dict[str, tuple[str, synth.SynthSpec]] = {}
    seed = 0
    for slow in SLOWDOWNS:
        for share in SHARES:
            seed += 1
            hosts = 1 + seed % 2
            # the last host is contended; measured steps are the generator's 1..STEPS-1
            first = max(1, round(STEPS - share * (STEPS - 1)))
            link: dict[str, object] = (
                {"gpus_per_switch": 2, "contention_switch": seed % 4} if seed % 3 == 0 else {}
            )
            out[f"mild-{slow}-{share}"] = (
                "mild",
                _spec(
                    seed,
                    pcie_contention=(f"node-{hosts - 1}",),
                    contention_inflation=slow,
                    contention_from_step=first,
                    **link,
                ),
            )
    for k in range(4):
        out[f"healthy-offload-{k}"] = ("healthy", _spec(100 + k, gpus_per_switch=1 + 3 * (k % 2)))
        out[f"healthy-no-offload-{k}"] = ("healthy", _spec(200 + k, offload="none"))
        # links saturated on most steps, the steps no longer: busy, not contended
        out[f"healthy-saturated-{k}"] = (
            "healthy",
            _spec(
                400 + k,
                pcie_contention=(f"node-{k % 2}",),
                contention_inflation=1.0,
                contention_from_step=2 + 4 * k,
            ),
        )
        # bursts: a few steps saturated and slow, the rest healthy
        out[f"healthy-burst-{k}"] = (
            "healthy",
            _spec(
                300 + k,
                hosts=2,
                ranks=16,
                pcie_contention=("node-1",),
                contention_inflation=1.3 + 0.4 * k,
                contention_from_step=STEPS - 2,
            ),
        )
    return out


def _placed(diag: Diagnosis) -> Context:
    """A context with the agent's samples placed in the phases of the (exact) timeline:
    once per job, every noisy copy of it shares them."""
    ctx = Context(analysis=diag.analysis)
    _ = ctx.phase_samples
    return ctx


def _noisy(placed: Context, sigma: float, seed: int) -> Context:
    """A context whose optimizer phases carry step-to-step noise of ``sigma``."""
    ctx = Context(analysis=placed.analysis)
    # the agent's samples fall where they fell (in the exact phases, as ``_placed`` put them)
    ctx.__dict__["gpu_samples"] = placed.gpu_samples
    ctx.__dict__["phase_samples"] = placed.phase_samples
    tl = placed.timeline
    rnd = random.Random(seed)
    half = sigma / math.sqrt(2.0)
    per_host: dict[tuple[str, int], float] = {}
    factors = []
    for host, step in tl.select("host", "step").iter_rows():
        common = per_host.setdefault((host, step), rnd.lognormvariate(0.0, half))
        factors.append(common * rnd.lognormvariate(0.0, half))
    optimizer = (pl.col("source") == "collectives") & (pl.col("phase") == "optimizer")
    ctx.__dict__["timeline"] = tl.with_columns(
        pl.when(optimizer)
        .then(pl.col("duration_s") * pl.Series(factors, dtype=pl.Float64))
        .otherwise(pl.col("duration_s"))
        .alias("duration_s")
    )
    return ctx


def _findings(ctx: Context) -> list[Finding]:
    det = PcieContentionDetector()
    return det.policy(det.metric(ctx), ctx)


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("mild")
    counts: dict[str, Counter[str]] = {"mild": Counter(), "healthy": Counter(), "hard": Counter()}
    by_noise: dict[float, Counter[str]] = {s: Counter() for s in (*NOISE, HARD_NOISE)}
    wrong: list[str] = []
    for name, (cls, spec) in _jobs().items():
        synth.generate(spec, root / name)
        truth = synth_truth(root / name)
        tel = read_telemetry([root / name / "telemetry"])
        diag = run_analysis(
            [str(root / name / "job.log")], workdir=root / f"w-{name}", telemetry=tel
        )
        placed = _placed(diag)
        for sigma in (*NOISE, HARD_NOISE):
            for draw in range(DRAWS if sigma else 1):
                seed = zlib.crc32(f"{name}/{sigma}/{draw}".encode())
                found = _findings(_noisy(placed, sigma, seed))
                verdict = _score(cls, found, truth)
                counts["hard" if cls == "mild" and sigma == HARD_NOISE else cls][verdict] += 1
                if cls == "mild":
                    by_noise[sigma][verdict] += 1
                if verdict != "right":
                    wrong.append(
                        f"{name} noise={sigma} draw={draw}: "
                        + ", ".join(f"{f.severity} {f.hosts} {f.ranks}" for f in found)
                    )
    return {"counts": counts, "by_noise": by_noise, "wrong": wrong}


def synth_truth(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "truth.json").read_text())["telemetry"]
    return data


def _score(cls: str, found: list[Finding], truth: dict[str, Any]) -> str:
    """``right``: mild, one ``info`` naming the contended host and exactly its ranks;
    healthy, nothing.  ``missed``: mild, nothing.  Anything else is ``wrong``."""
    if cls == "healthy":
        return "right" if not found else "wrong"
    if not found:
        return "missed"
    (want,) = truth["contention"]
    ok = (
        len(found) == 1
        and found[0].severity == "info"
        and found[0].hosts == [want["host"]]
        and found[0].ranks == want["ranks"]
    )
    return "right" if ok else "wrong"


def test_mild_contention_is_an_info_on_most_variants(scored: dict[str, Any]) -> None:
    mild: Counter[str] = scored["counts"]["mild"]
    total = sum(mild.values())
    print("mild:", dict(mild), "by noise:", {k: dict(v) for k, v in scored["by_noise"].items()})
    print("\n".join(scored["wrong"]))
    assert total >= 12 * (1 + 3 * DRAWS)  # every mild job at every noise level
    assert mild["right"] >= 0.95 * total, scored["wrong"]


def test_noisier_mild_contention_is_missed_never_misnamed(scored: dict[str, Any]) -> None:
    hard: Counter[str] = scored["counts"]["hard"]
    print("noise", HARD_NOISE, dict(hard))
    assert hard["wrong"] == 0, scored["wrong"]
    assert hard["right"] >= 0.5 * sum(hard.values())


def test_no_finding_on_healthy_runs(scored: dict[str, Any]) -> None:
    healthy: Counter[str] = scored["counts"]["healthy"]
    print("healthy:", dict(healthy))
    assert sum(healthy.values()) >= 50
    assert healthy["wrong"] == 0, scored["wrong"]
