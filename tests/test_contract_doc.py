"""docs/json-contract.md documents every field ``analyze --format json`` prints.

Convention (stated in the doc): the field tables of docs/json-contract.md hold the full
key path of a field, in backticks, in their first column, e.g.::

    | `job.ranks[].bus_id` | string | yes | ... |

``a[]`` is each element of array ``a``.  Arrays of scalars are leaves (``inputs[].notes``);
the two objects whose keys are data (``job.env``: variable names, ``collectives.by_op``:
op names) are leaves too.  ``inputs[].unparsed_by_reason`` has a fixed set of keys, so
each one is a path of its own.

The real CLI runs on every fixture and on one damaged log that has every line-damage
reason, an unreadable name (``problems[]``) and a WARN (``errors[]``).  Every key path
seen must be documented.  Every documented path must show up in some run, so a field
that was removed or renamed cannot stay in the doc.  The only exception is reason keys,
which appear only when their count is non-zero.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from cluster_env import FakeProm, stamped_log
from conftest import sample_text
from test_fixtures import telemetry_args
from test_flight_recorder import write_dumps

from ncclscope.cli import cli

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "json-contract.md"
CASES = sorted(p.name for p in (REPO / "fixtures").iterdir() if p.is_dir())

#: Objects whose keys are data, not field names: documented as a whole.
OPEN_MAPS = frozenset(
    {
        "job.env",
        "collectives.by_op",
        "timers",
        "flight_recorder.dumps[].skipped_by_reason",
        "nccl_tools.files[].skipped_by_reason",
        "findings[].evidence.flight_recorder.last_enqueued",
        "evidence.folders[].asks",
        "cluster.ports[].errors",
        "cluster.gpus[].errors",
    }
)
#: Objects whose keys are documented one by one but appear only when their value is non-zero.
#: Finding evidence keys depend on the finding's kind: each is documented, not each seen.
SPARSE_MAPS = frozenset({"inputs[].unparsed_by_reason", "findings[].evidence"})

_PATH = r"[A-Za-z_]\w*(?:\[\])?(?:\.[A-Za-z_]\w*(?:\[\])?)*"
#: A Markdown table row whose first cell is one key path in backticks.
_ROW = re.compile(rf"^\|\s*`({_PATH})`\s*\|", re.MULTILINE)


def key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key path in a JSON value: ``a.b`` for keys, ``a[]`` for array elements."""
    paths: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else key
            paths.add(path)
            if path not in OPEN_MAPS:
                paths |= key_paths(item, path)
    elif isinstance(value, list):
        for item in value:
            paths |= key_paths(item, f"{prefix}[]")
    return paths


def documented_paths(markdown: str) -> set[str]:
    """The key paths in the first column of the doc's tables."""
    return set(_ROW.findall(markdown))


def top_level(paths: set[str]) -> set[str]:
    return {re.split(r"[.\[]", p, maxsplit=1)[0] for p in paths}


def contract_problems(doc_text: str, seen: set[str], top_keys: set[str]) -> list[str]:
    """What is wrong between the doc and the output: empty when they agree.

    ``seen``: key paths from the outputs; ``top_keys``: top-level keys every output has.
    """
    documented = documented_paths(doc_text)
    out = [f"not documented: `{p}`" for p in sorted(seen - documented)]
    out += [
        f"documented top-level key the output lacks: `{k}`"
        for k in sorted(top_level(documented) - top_keys)
    ]
    never = {p for p in documented - seen if not any(p.startswith(m + ".") for m in SPARSE_MAPS)}
    out += [f"documented but never in the output: `{p}`" for p in sorted(never)]
    return out


def analyze(args: list[str]) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["analyze", *args, "--format", "json", "--no-progress"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """JSON output per fixture, plus ``damaged``: every reason, a problem and an error."""
    mp = pytest.MonkeyPatch()
    mp.chdir(REPO)
    try:
        docs = {case: analyze([f"fixtures/{case}/", *telemetry_args(case)]) for case in CASES}
        damaged = tmp_path_factory.mktemp("contract") / "damaged.log"
        damaged.write_bytes(
            (
                sample_text()
                + "\n"  # blank
                + "garbage NCCL INFO with no header\n"  # malformed
                + "\x01\x02\x03\x04 binary junk\n"  # binary
                + "x" * 70_000  # too_long (and no final newline)
                + "\n"
            ).encode()
        )
        docs["damaged"] = analyze([str(damaged), str(damaged.parent / "missing.log")])
        # Flight Recorder dumps beside a log: the flight_recorder object's arrays filled.
        with_dumps = tmp_path_factory.mktemp("contract-dumps")
        write_dumps(with_dumps)
        (with_dumps / "train.log").write_text(sample_text())
        docs["dumps"] = analyze([str(with_dumps)])
        # analyze --prometheus: the cluster object filled (a fake Prometheus).
        stamped = stamped_log(tmp_path_factory.mktemp("contract-cluster") / "job.log",
                              datetime(2026, 3, 1, 12, 0, tzinfo=UTC))  # fmt: skip
        prom = FakeProm()
        try:
            docs["cluster"] = analyze([str(stamped), "--prometheus", prom.url])
        finally:
            prom.close()
    finally:
        mp.undo()
    return docs


def test_fixtures_exist() -> None:
    assert len(CASES) >= 5
    assert DOC.is_file()


def test_damaged_run_covers_the_sparse_fields(outputs: dict[str, dict[str, Any]]) -> None:
    doc = outputs["damaged"]
    assert doc["problems"], "the missing file should be a problem"
    assert doc["errors"], "the sample log's WARN should be an error"
    reasons = doc["inputs"][0]["unparsed_by_reason"]
    assert set(reasons) == {"blank", "other", "malformed", "binary", "too_long"}, reasons


@pytest.mark.parametrize("case", [*CASES, "damaged", "dumps", "cluster"])
def test_every_output_key_is_documented(case: str, outputs: dict[str, dict[str, Any]]) -> None:
    documented = documented_paths(DOC.read_text(encoding="utf-8"))
    missing = sorted(key_paths(outputs[case]) - documented)
    assert not missing, f"{case}: key paths missing from {DOC.name}: {missing}"


def test_doc_documents_no_top_level_key_the_output_lacks(
    outputs: dict[str, dict[str, Any]],
) -> None:
    documented = top_level(documented_paths(DOC.read_text(encoding="utf-8")))
    for case, doc in outputs.items():
        extra = sorted(documented - set(doc))
        assert not extra, f"{case}: documented top-level keys the output lacks: {extra}"


def test_doc_and_output_agree(outputs: dict[str, dict[str, Any]]) -> None:
    seen = set().union(*(key_paths(doc) for doc in outputs.values()))
    tops = set.intersection(*(set(doc) for doc in outputs.values()))
    assert contract_problems(DOC.read_text(encoding="utf-8"), seen, tops) == []


def test_doc_states_the_schema(outputs: dict[str, dict[str, Any]]) -> None:
    schemas = {doc["schema"] for doc in outputs.values()}
    assert len(schemas) == 1
    assert f"`{schemas.pop()}`" in DOC.read_text(encoding="utf-8").splitlines()[0]


# The checker itself, on fake docs.

_OUTPUT = {"schema": "s", "job": {"ranks": [{"rank": 0, "bus_id": None}], "env": {"NCCL_X": ["1"]}}}
_FULL = """
| key path | type |
|---|---|
| `schema` | string |
| `job` | object |
| `job.ranks` | array |
| `job.ranks[].rank` | integer |
| `job.ranks[].bus_id` | string |
| `job.env` | object |

| value | meaning |
|---|---|
| `"error"` | a value, not a key path |
"""


def test_key_paths() -> None:
    assert key_paths(_OUTPUT) == {
        "schema",
        "job",
        "job.ranks",
        "job.ranks[].rank",
        "job.ranks[].bus_id",
        "job.env",
    }
    assert key_paths({"a": [1, 2], "b": []}) == {"a", "b"}


def test_checker_accepts_a_matching_doc() -> None:
    assert contract_problems(_FULL, key_paths(_OUTPUT), set(_OUTPUT)) == []


def test_checker_finds_an_undocumented_field() -> None:
    doc = _FULL.replace("| `job.ranks[].bus_id` | string |\n", "")
    problems = contract_problems(doc, key_paths(_OUTPUT), set(_OUTPUT))
    assert problems == ["not documented: `job.ranks[].bus_id`"]


def test_checker_finds_a_prose_mention_is_not_enough() -> None:
    doc = _FULL.replace("| `job.ranks[].bus_id` | string |\n", "") + "\nSee `job.ranks[].bus_id`.\n"
    assert contract_problems(doc, key_paths(_OUTPUT), set(_OUTPUT)) == [
        "not documented: `job.ranks[].bus_id`"
    ]


def test_checker_finds_a_documented_key_the_output_lacks() -> None:
    doc = _FULL + "| `summary` | object |\n| `job.hosts` | array |\n"
    assert contract_problems(doc, key_paths(_OUTPUT), set(_OUTPUT)) == [
        "documented top-level key the output lacks: `summary`",
        "documented but never in the output: `job.hosts`",
        "documented but never in the output: `summary`",
    ]


def test_checker_runs_against_the_real_doc_and_can_fail(
    outputs: dict[str, dict[str, Any]],
) -> None:
    """Dropping any one documented row from the real doc makes the check fail."""
    text = DOC.read_text(encoding="utf-8")
    seen = set().union(*(key_paths(doc) for doc in outputs.values()))
    tops = set.intersection(*(set(doc) for doc in outputs.values()))
    row = next(line for line in text.splitlines() if line.startswith("| `job.ranks[].bus_id`"))
    problems = contract_problems(text.replace(row + "\n", ""), seen, tops)
    assert problems == ["not documented: `job.ranks[].bus_id`"]
