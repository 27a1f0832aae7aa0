"""All-gather cost against the fabric (issue #18): the network or a late rank explains it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from ncclscope.cli import cli
from ncclscope.synth.inspector import InspectorJob, write_job

FIX = Path(__file__).resolve().parent.parent / "fixtures"


def _cost(folder: Path) -> dict[str, Any]:
    out = CliRunner().invoke(cli, ["analyze", str(folder), "--format", "json", "--no-progress"])
    doc = json.loads(out.stdout)
    found = [f for f in doc["findings"] if f["kind"] == "collective_cost"]
    assert len(found) == 1
    finding: dict[str, Any] = found[0]
    return finding


def test_a_slow_fabric_against_its_nccl_tests_baseline(tmp_path: Path) -> None:
    # 4 ranks, buses at 3 GB/s while nccl-tests measured ~11.4-11.8 GB/s at 16-64 MiB.
    write_job(InspectorJob(nranks=4, ranks_per_host=2, bus_bw_bytes_per_s=3e9, seed=2), tmp_path)
    (tmp_path / "ag.txt").write_bytes((FIX / "nccl-tests/all_gather_2_13.txt").read_bytes())
    f = _cost(tmp_path)
    assert f["severity"] == "warning"
    assert f["op"] == "AllGather"
    assert f["evidence"]["explained_by"] == "network"
    assert f["evidence"]["net_ratio"] < 0.5
    sizes = {s["size_bytes_min"]: s for s in f["evidence"]["by_size"]}
    assert sizes[64 << 20]["baseline_bus_bw_bytes_per_s"] == 11.84e9
    assert "nccl-tests all_gather" in sizes[64 << 20]["baseline_source"]


def test_a_late_rank_not_the_network(tmp_path: Path) -> None:
    write_job(
        InspectorJob(nranks=4, ranks_per_host=2, bus_bw_bytes_per_s=12e9, straggler=1,
                     slowdown=0.4, seed=3),
        tmp_path,
    )  # fmt: skip
    (tmp_path / "ag.txt").write_bytes((FIX / "nccl-tests/all_gather_2_13.txt").read_bytes())
    f = _cost(tmp_path)
    assert f["severity"] == "info"
    assert f["evidence"]["explained_by"] == "ranks"
    assert f["evidence"]["wait_share"] >= 0.25


def test_without_a_baseline_nothing_is_judged_against_one(tmp_path: Path) -> None:
    write_job(InspectorJob(nranks=4, ranks_per_host=2, seed=4), tmp_path)
    f = _cost(tmp_path)
    assert f["evidence"]["net_ratio"] is None
    assert f["severity"] == "info"


def test_zero_stage_advice_uses_the_measured_bandwidth(tmp_path: Path) -> None:
    from ncclscope.analysis import build
    from ncclscope.detect.context import Context
    from ncclscope.detect.zero_stage import _inspector_bus_bw

    write_job(InspectorJob(nranks=4, ranks_per_host=2, bus_bw_bytes_per_s=7e9, seed=5), tmp_path)
    built = build([str(tmp_path)], workdir=tmp_path / "work")
    fact = _inspector_bus_bw(Context(built.analysis))
    assert fact is not None
    assert "NCCL Inspector all-gather busbw" in fact.source
    # Waits for late ranks are included, so the figure is at most the bus rate.
    assert 0 < fact.value <= 7e9 * 1.1


def test_the_html_report_plots_bandwidth_against_the_baseline(tmp_path: Path) -> None:
    write_job(InspectorJob(nranks=4, ranks_per_host=2, seed=6), tmp_path / "in")
    (tmp_path / "in" / "ag.txt").write_bytes((FIX / "nccl-tests/all_gather_2_13.txt").read_bytes())
    html = tmp_path / "r.html"
    out = CliRunner().invoke(
        cli, ["analyze", str(tmp_path / "in"), "--html", str(html), "--no-progress"]
    )
    assert out.exit_code == 0, out.output
    text = html.read_text()
    assert 'id="plot-bandwidth"' in text
    assert "baseline all_gather" in text
    assert "AllGather: network (shortest execution)" in text
