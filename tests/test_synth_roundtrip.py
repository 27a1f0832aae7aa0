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
from ncclscope.synth import IbError, StopRank, SynthSpec, generate


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


@pytest.mark.parametrize(
    ("framework", "torch_era", "ds_era", "layout", "launcher", "zero_stage", "offload"),
    [
        ("deepspeed", "2.4", "new", "combined", "torchrun", 3, "both"),
        ("deepspeed", "2.1", "old", "combined", "pdsh", 2, "optimizer"),
        ("deepspeed", "2.7", "new", "per-rank", "none", 1, "none"),
        ("torch", "2.4", None, "combined", "torchrun", None, None),
        ("torch", "2.7", None, "per-rank", "none", None, None),
    ],
)
def test_framework_tables_match_truth(
    tmp_path: Path,
    framework: str,
    torch_era: str,
    ds_era: str | None,
    layout: str,
    launcher: str,
    zero_stage: int | None,
    offload: str | None,
) -> None:
    """A job that hangs on rank 5: the watchdog lines of the ranks that waited, the
    torchelastic report, the ZeRO configuration and the timers all come back as written."""
    extra: dict[str, Any] = {}
    if framework == "deepspeed":
        extra = {"zero_stage": zero_stage, "offload": offload, "ds_era": ds_era}
    spec = SynthSpec(
        ranks=8,
        hosts=2,
        steps=4,
        layout=layout,
        launcher=launcher,
        framework=framework,
        torch_era=torch_era,
        faults=(StopRank(rank=5, at_instance=30),),
        seed=5,
        **extra,
    )
    truth = json.loads(generate(spec, tmp_path).to_json())["framework"]
    doc = _analyze(tmp_path)
    job = doc["job"]

    assert job["frameworks"]["torch"]["seen"]
    assert job["frameworks"]["deepspeed"]["seen"] == (framework == "deepspeed")
    assert (job["timeout_s"], job["timeout_source"]) == (truth["timeout_s"], "logged")
    if framework == "deepspeed":
        assert job["zero"] == truth["zero"]
        assert job["frameworks"]["deepspeed"]["version"] == truth["deepspeed_version"]
        assert {k: v["count"] for k, v in doc["timers"].items()} == truth["timer_lines"]
    else:
        assert job["zero"] is None
        assert doc["timers"] == {}

    # PyTorch prints the global rank as a [rankG]: prefix from 2.2 on only.
    printed = torch_era != "2.1"

    def key(t: dict[str, Any]) -> tuple[Any, ...]:
        grank = t["global_rank"] if printed else None
        return (t["rank"], grank, t["seq"], t["op"], t["numel_in"], t["numel_out"])

    assert truth["timeouts"], "the hang must make the other ranks' watchdogs fire"
    assert sorted(key(t) for t in doc["timeouts"]) == sorted(key(t) for t in truth["timeouts"])
    assert all(t["timeout_s"] == truth["timeout_s"] for t in doc["timeouts"])
    assert 5 not in {t["rank"] for t in doc["timeouts"]}
    lines = {
        (t["first_line"]["path"].rsplit("/", 1)[-1], t["first_line"]["line_no"])
        for t in doc["timeouts"]
    }
    assert lines == {(Path(t["path"]).name, t["line_no"]) for t in truth["timeouts"]}

    def fkey(f: dict[str, Any]) -> tuple[Any, ...]:
        return (f["rank"], f["local_rank"], f["host"], f["exitcode"], f["signal"], f["root_cause"])

    assert sorted(fkey(f) for f in doc["failures"]) == sorted(fkey(f) for f in truth["failures"])
