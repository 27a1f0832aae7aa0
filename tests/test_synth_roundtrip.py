"""`analyze` on synthetic jobs agrees with the generator's ground truth.

synth never imports the parsers: its truth.json records what it wrote.  These tests
hold the whole pipeline (sources, first pass, identity, collectives, errors) to it,
across NCCL eras, layouts and launcher prefixes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ncclscope.cli import cli
from ncclscope.synth import IbError, SynthSpec, generate


def _analyze(folder: Path) -> dict[str, Any]:
    logs = sorted(str(p) for p in folder.glob("*.log"))
    result = CliRunner().invoke(cli, ["analyze", *logs, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize(
    ("era", "layout", "launcher", "timestamps"),
    [
        ("2.7", "combined", "srun", False),
        ("2.18", "combined", "torchrun", False),
        ("2.21", "per-rank", "none", False),
        ("2.21", "combined", "pdsh", False),
        ("2.27", "combined", "rank", True),
        ("2.27", "per-rank", "none", True),
    ],
)
def test_analysis_matches_truth(
    tmp_path: Path, era: str, layout: str, launcher: str, timestamps: bool
) -> None:
    spec = SynthSpec(
        ranks=16,
        hosts=2,
        steps=3,
        era=era,
        layout=layout,
        launcher=launcher,
        timestamps=timestamps,
        tp_traffic=True,
        benign_warns=2,
        seed=11,
    )
    truth = json.loads(generate(spec, tmp_path).to_json())
    doc = _analyze(tmp_path)
    job = doc["job"]

    assert job["nccl_versions"] == [truth["nccl_version"]]
    assert job["world_size"] == 16
    assert [(r["rank"], r["host"], r["pid"], r["bus_id"]) for r in job["ranks"]] == [
        (r["rank"], r["host"], r["pid"], r["bus_id"]) for r in truth["ranks"]
    ]
    assert len(job["communicators"]) == len(truth["communicators"])
    by_nranks = sorted((c["nranks"], sorted(c["ranks"])) for c in truth["communicators"])
    assert sorted((c["nranks"], c["ranks_seen"]) for c in job["communicators"]) == by_nranks
    assert doc["collectives"]["calls"] == truth["coll_calls"]
    assert doc["collectives"]["instances"] == truth["coll_instances"]
    assert doc["collectives"]["by_op"] == truth["calls_by_op"]
    assert job["timestamps"] == ("full" if timestamps else ("partial" if era == "2.27" else "none"))
    # The benign WARNs are reported at their lines, and as nothing worse than a warning.
    reported = {(e["host"], e["pid"], e["first_line"]["line_no"]) for e in doc["errors"]}
    for warn in truth["benign_warns"]:
        assert (warn["host"], warn["pid"], warn["line_no"]) in reported
    assert all(e["severity"] != "error" for e in doc["errors"])
    for inp in doc["inputs"]:
        assert inp["unparsed_by_reason"].keys() <= {"blank", "other"}


def test_ib_error_is_the_first_root_cause(tmp_path: Path) -> None:
    spec = SynthSpec(ranks=8, hosts=2, steps=4, era="2.21", faults=(IbError("node-1", 20),), seed=3)
    truth = json.loads(generate(spec, tmp_path).to_json())
    doc = _analyze(tmp_path)
    outcome = next(f for f in truth["faults"] if f["kind"] == "IbError")
    assert outcome["effective"]
    details = outcome["details"]
    first = doc["errors"][0]
    assert first["kind"] == "ib_completion"
    assert first["severity"] == "error"
    assert (first["host"], first["pid"], first["rank"]) == (
        details["host"],
        details["pid"],
        details["rank"],
    )
    assert first["first_line"]["line_no"] == details["line_no"]
    assert first["chain"], "the return-code chain belongs to the root cause"
    peers = {(e["host"], e["pid"], e["first_line"]["line_no"]) for e in doc["errors"][1:]}
    for peer in details["consequential"]:
        assert (peer["host"], peer["pid"], peer["line_no"]) in peers
