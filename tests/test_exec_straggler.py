"""The straggler from Inspector's execution times (issue #18): named with no clock."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from ncclscope.cli import cli
from ncclscope.detect.exec_straggler import MIN_EFFECT_S, exec_times_metric, flagged
from ncclscope.parsers.tools.inspector import read_inspector_text
from ncclscope.synth.inspector import InspectorJob, inspector_files

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "inspector"


def _rows(job: InspectorJob) -> pl.DataFrame:
    return read_inspector_text("".join(inspector_files(job).values()), "t").rows


@pytest.mark.parametrize(("nranks", "rank"), [(2, 1), (8, 5), (16, 0)])
def test_the_last_arriver_is_named_from_its_short_kernels(nranks: int, rank: int) -> None:
    job = InspectorJob(nranks=nranks, straggler=rank, slowdown=0.15, collectives=150, seed=nranks)
    named = flagged(exec_times_metric(_rows(job)))
    assert named["comm_rank"].to_list() == [rank]
    r = named.row(0, named=True)
    assert r["median_short_s"] >= MIN_EFFECT_S
    assert r["lost_s"] > 0


@pytest.mark.parametrize("seed", range(6))
def test_a_healthy_job_names_nobody(seed: int) -> None:
    job = InspectorJob(nranks=8, collectives=200, seed=seed, spike_rate=0.05)
    assert flagged(exec_times_metric(_rows(job))).is_empty()


def test_too_few_collectives_name_nobody() -> None:
    job = InspectorJob(nranks=4, straggler=2, slowdown=0.5, collectives=8, seed=1)
    assert flagged(exec_times_metric(_rows(job))).is_empty()


def test_no_records_no_metric() -> None:
    assert flagged(exec_times_metric(read_inspector_text("", "t").rows)).is_empty()


def test_the_fixture_finding_names_the_global_rank() -> None:
    out = CliRunner().invoke(cli, ["analyze", str(FIX), "--format", "json", "--no-progress"])
    doc = json.loads(out.stdout)
    found = [f for f in doc["findings"] if f["kind"] == "straggler"]
    assert len(found) == 1
    f = found[0]
    assert (f["kind"], f["ranks"], f["hosts"]) == ("straggler", [3], ["gpu-b"])
    assert f["evidence"]["communicator"] == "7a3e5c0f1b2d4968"
    assert f["cost_gpu_s"] > 0
