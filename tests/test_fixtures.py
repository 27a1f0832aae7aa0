"""Each fixture's hand-written expected.json must be a subset of `analyze --format json`.

expected.json files are facts read off the fixture logs by a person, never generated
by ncclscope; they change only by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ncclscope.cli import cli

REPO = Path(__file__).resolve().parent.parent
CASES = sorted(p.parent.name for p in (REPO / "fixtures").glob("*/expected.json"))


def assert_subset(expected: Any, actual: Any, where: str = "$") -> None:
    """Dicts: every expected key present and equal (recursively); lists: same length,
    element-wise subset; scalars: equal."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: expected an object, got {actual!r}"
        for key, value in expected.items():
            assert key in actual, f"{where}: missing key {key!r}"
            assert_subset(value, actual[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list), f"{where}: expected a list, got {actual!r}"
        assert len(actual) == len(expected), (
            f"{where}: {len(actual)} items, expected {len(expected)}: {actual!r}"
        )
        for k, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert_subset(e, a, f"{where}[{k}]")
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def telemetry_args(case: str) -> list[str]:
    """``--telemetry`` for a fixture that carries the agent's parts in ``telemetry/``."""
    folder = REPO / "fixtures" / case / "telemetry"
    return ["--telemetry", f"fixtures/{case}/telemetry"] if folder.is_dir() else []


def test_cases_exist() -> None:
    assert len(CASES) >= 5


@pytest.mark.parametrize("case", CASES)
def test_fixture_matches_expected(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    expected = json.loads((REPO / "fixtures" / case / "expected.json").read_text())
    result = CliRunner().invoke(
        cli, ["analyze", f"fixtures/{case}/", "--format", "json", *telemetry_args(case)]
    )
    assert result.exit_code == 0, result.output
    actual = json.loads(result.output)
    assert_subset(expected, actual)


@pytest.mark.parametrize("case", CASES)
def test_fixture_text_summary(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    expected = json.loads((REPO / "fixtures" / case / "expected.json").read_text())
    result = CliRunner().invoke(cli, ["analyze", f"fixtures/{case}", *telemetry_args(case)])
    assert result.exit_code == 0, result.output
    job = expected["job"]
    for version in job.get("nccl_versions", []):
        assert f"NCCL {version}" in result.output
    if job.get("world_size") is not None:
        assert f"world size {job['world_size']}" in result.output
    elif "nccl_versions" in job and not job["nccl_versions"]:
        assert "no NCCL lines" in result.output
    for transport in job.get("transports", []):
        assert transport in result.output
    for entry in [*expected.get("errors", []), *expected.get("timeouts", [])[:1]]:
        line = entry["first_line"]
        assert f"{line['path']}:{line['line_no']}" in result.output
    if job.get("zero"):
        assert f"ZeRO stage {job['zero']['stage']}" in result.output
    for name in expected.get("timers", {}):
        assert name in result.output


def test_assert_subset_catches_differences() -> None:
    assert_subset({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2, "c": 3}], "d": 4})
    for bad in ({"a": [1]}, {"a": [1, {"b": 3}]}, {"x": 1}):
        with pytest.raises(AssertionError):
            assert_subset(bad, {"a": [1, {"b": 2}]})
