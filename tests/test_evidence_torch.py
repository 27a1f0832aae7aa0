"""The recorded run of real PyTorch jobs (benchmarks/bench_evidence.py --record): the
folders two nodes' agents wrote at a stall name the culprit and its kind.

fixtures/evidence-torch/<fault>/ holds what the collectors took from a real CPU PyTorch
job (gloo, 4 ranks played as 2 nodes, each rank with its control-plane worker server):
Flight Recorder dumps and stacks through the control plane, py-spy's stacks where a
process did not answer, and the process states.  ``truth.json`` says what was broken.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ncclscope.cli import cli

RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "evidence-torch"
FAULTS = sorted(p.name for p in RECORDED.iterdir() if (p / "truth.json").exists())


def test_every_fault_was_recorded() -> None:
    assert FAULTS == ["collective", "dead", "frozen", "python"]


@pytest.mark.parametrize("fault", FAULTS)
def test_the_folders_name_the_culprit_and_its_kind(fault: str) -> None:
    truth = json.loads((RECORDED / fault / "truth.json").read_text())
    got = CliRunner().invoke(cli, ["analyze", str(RECORDED / fault), "--format", "json"])
    assert got.exit_code == 0, got.stderr
    hangs = [f for f in json.loads(got.stdout)["findings"] if f["kind"] == "hang"]
    assert [(f["ranks"], f["hang_class"]) for f in hangs] == [(truth["ranks"], truth["kind"])]
    assert hangs[0]["hosts"] == [truth["node"]]


@pytest.mark.parametrize("fault", FAULTS)
def test_every_rank_has_its_stack_and_dump_or_a_reason(fault: str) -> None:
    for manifest in (RECORDED / fault).rglob("manifest.json"):
        doc = json.loads(manifest.read_text())
        assert doc["stall"]["complete"] is True
        ranks = {a["rank"] for a in doc["asks"] if a.get("rank") is not None}
        assert len(ranks) == 2
        for rank in ranks:
            mine = [a for a in doc["asks"] if a.get("rank") == rank]
            if any(a.get("state") == "gone" for a in mine):
                continue  # its process is gone: that is the reason
            for what in ("stack", "flight_dump"):
                asks = [a for a in mine if a["what"] == what]
                assert asks, (manifest, rank, what)
                answered = [a for a in asks if a["outcome"] == "answered"]
                for a in answered:
                    assert (manifest.parent / a["file"]).is_file()
                assert answered or all(a["why"] for a in asks)


def test_the_stuck_rank_is_not_drained_and_the_dead_ones_node_is() -> None:
    python = json.loads((RECORDED / "python" / "truth.json").read_text())
    got = CliRunner().invoke(cli, ["analyze", str(RECORDED / "python"), "--exclude-list", "json"])
    assert json.loads(got.stdout)["exclude"] == [], "a Python hang is the program's, not the node's"
    assert sorted(json.loads(got.stdout)["keep"]) == sorted({"node-a", "node-b"} | {python["node"]})
    dead = json.loads((RECORDED / "dead" / "truth.json").read_text())
    got = CliRunner().invoke(cli, ["analyze", str(RECORDED / "dead"), "--exclude-list", "slurm"])
    assert got.stdout.strip() == dead["node"]
