"""The command line as a user meets it: help, exit codes, messages, output file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ncclscope.cli import cli
from ncclscope.entry import SIDECAR_ENV

REPO = Path(__file__).resolve().parent.parent
FIXTURE = str(REPO / "fixtures" / "ib-completion-error")


def test_help_shows_examples_and_exit_codes() -> None:
    result = CliRunner().invoke(cli, ["analyze", "--help"])
    assert result.exit_code == 0
    assert "Examples:" in result.output
    assert "Exit status" in result.output
    assert CliRunner().invoke(cli, ["--help"]).output.count("analyze") >= 1


def test_nothing_readable_prints_only_the_reasons(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(cli, ["analyze", str(empty), str(tmp_path / "missing.log")])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "directory holds no log files" in result.stderr
    assert "missing.log: no such file or directory" in result.stderr


def test_one_unreadable_input_among_good_ones(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["analyze", FIXTURE, str(tmp_path / "missing.log"), "--format", "json"]
    )
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["job"]["world_size"] == 8  # the readable input was still analysed
    assert [p["reason"] for p in doc["problems"]] == ["no such file or directory"]


def test_output_file(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    result = CliRunner().invoke(cli, ["analyze", FIXTURE, "--format", "json", "-o", str(out)])
    assert result.exit_code == 0
    assert result.stdout == ""
    assert json.loads(out.read_text())["schema"] == "ncclscope.analysis/1"


def test_usage_error_is_exit_2() -> None:
    assert CliRunner().invoke(cli, ["analyze"]).exit_code == 2
    assert CliRunner().invoke(cli, ["analyze", FIXTURE, "--format", "xml"]).exit_code == 2


@pytest.mark.parametrize(
    ("command", "sidecar"), [("agent", True), ("replay", True), ("analyze", False)]
)
def test_sidecar_commands_take_one_polars_thread(command: str, sidecar: bool) -> None:
    """The agent's detector runs must not take every core the training job uses; the
    setting only works when it is in place before polars loads (ncclscope.entry)."""
    code = (
        "import os, sys\n"
        f"sys.argv = ['ncclscope', {command!r}, '--help']\n"
        "from ncclscope import entry\n"
        "try:\n    entry.main()\nexcept SystemExit:\n    pass\n"
        "import polars\n"
        "print(polars.thread_pool_size(), os.environ.get('_RJEM_MALLOC_CONF'), file=sys.stderr)\n"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("POLARS_MAX_THREADS", "_RJEM_MALLOC_CONF")
    }
    got = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    threads, conf = got.stderr.split()[-2:]
    # polars puts its own defaults first; jemalloc takes the last setting of a key
    if sidecar:
        assert threads == "1"
        assert conf.endswith(SIDECAR_ENV["_RJEM_MALLOC_CONF"])
    else:
        assert SIDECAR_ENV["_RJEM_MALLOC_CONF"] not in conf
