#!/usr/bin/env python3
"""ncclscope against PyTorch's own Flight Recorder analyzer, case by case, on real dumps.

The cases are ``fixtures/flight-recorder/<case>/`` (made by ``make_fixtures.py`` there with
a real PyTorch on gloo): per-rank dumps, the job's log and ``expected.json`` (the true
culprit, and the verdict PyTorch's ``fr_trace`` gave when the fixtures were made).

For each case this runs ``ncclscope analyze --format json`` on what a user would have,
the job's log and the dumps (``--json-dumps``: the JSON form of the same dumps), and
takes the ranks ncclscope blames: ``findings[].ranks`` of its ``hang``, ``timeout`` and
``mismatch`` findings (culprits), and of its ``straggler`` findings. PyTorch's verdict is
read from ``expected.json``, or, with ``--torch-python``, by running
``python -m torch.distributed.flight_recorder.fr_trace`` again under that interpreter (on
the dumps as written, where it crashes in torch 2.14.1, and on a copy with ``pg_config``
repaired; see ``make_fixtures.repaired_copy``).

Usage:
    .venv/bin/python benchmarks/fr_compare.py
    .venv/bin/python benchmarks/fr_compare.py --torch-python /work/torchvenv/bin/python
    .venv/bin/python benchmarks/fr_compare.py --json-dumps --format json

Sample output (ncclscope before it read dumps):

    case                 truth          PyTorch fr_trace       ncclscope          agree?
    skipped-collective   hang [2]       [2] (not_joined @7)    no culprit         no
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures" / "flight-recorder"
CULPRIT_KINDS = ("hang", "timeout", "mismatch")


def load_maker() -> ModuleType:
    """make_fixtures.py, for its fr_trace output parser (stdlib only at import time)."""
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {FIXTURES / 'make_fixtures.py'}")
    module = importlib.util.module_from_spec(spec)
    # No __pycache__ inside the fixtures: fr_trace walks the case folders' parent too.
    sys.dont_write_bytecode = True
    spec.loader.exec_module(module)
    return module


def cases(root: Path, wanted: list[str]) -> list[Path]:
    found = sorted(p.parent for p in root.glob("*/expected.json"))
    return [p for p in found if not wanted or p.name in wanted]


def ncclscope_inputs(case: Path, json_dumps: bool) -> list[Path]:
    """The job's log and its dumps: what a user has, not fr_trace's output beside them."""
    if json_dumps:
        dumps = sorted((case.parent / f"{case.name}-json").glob("fr_trace_json_rank_*.json"))
    else:
        dumps = sorted(case.glob("fr_trace_rank_*"))
    return [case / "job.log", *dumps]


def run_ncclscope(paths: list[Path]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "ncclscope", "analyze", "--format", "json"]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [*cmd, *(str(p.relative_to(REPO)) for p in paths)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    took = time.perf_counter() - t0
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1], "took_s": took}
    culprits: set[int] = set()
    stragglers: set[int] = set()
    kinds = []
    for finding in report.get("findings", []):
        kinds.append(finding["kind"])
        if finding["kind"] in CULPRIT_KINDS:
            culprits.update(finding["ranks"])
        elif finding["kind"] == "straggler":
            stragglers.update(finding["ranks"])
    return {
        "exit_code": proc.returncode,
        "culprit_ranks": sorted(culprits),
        "straggler_ranks": sorted(stragglers),
        "finding_kinds": kinds,
        "problems": len(report.get("problems", [])),
        "dump_inputs": sum(1 for i in report.get("inputs", []) if "fr_trace" in i["path"]),
        "took_s": took,
    }


def run_torch(case: Path, torch_python: str, maker: ModuleType, world: int) -> dict[str, Any]:
    """fr_trace on the dumps as written, and on a repaired copy; the repaired verdict leads."""

    def analyze(folder: Path) -> tuple[int, str]:
        proc = subprocess.run(
            [torch_python, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        return proc.returncode, proc.stdout + proc.stderr

    rc, text = analyze(case)
    with tempfile.TemporaryDirectory() as tmp:
        maker.repaired_copy(case, Path(tmp), world)
        rc_fixed, fixed = analyze(Path(tmp))
    repaired = maker.parse_analyzer(fixed)
    return {
        "culprit_ranks": repaired["culprit_ranks"],
        "verdict": repaired["verdict"],
        "as_dumped": {"exit_code": rc, **maker.parse_analyzer(text)},
        "repaired_pg_config": {"exit_code": rc_fixed, **repaired},
    }


def describe_torch(verdict: dict[str, Any]) -> str:
    first = (verdict.get("repaired_pg_config", {}).get("findings") or [None])[0]
    if not verdict["culprit_ranks"]:
        return verdict["verdict"]
    where = f" ({first['kind']} @{first['seq']})" if first else ""
    return f"{verdict['culprit_ranks']}{where}"


def describe_ncclscope(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"error: {result['error']}"
    parts = []
    if result["culprit_ranks"]:
        parts.append(f"culprit {result['culprit_ranks']}")
    if result["straggler_ranks"]:
        parts.append(f"straggler {result['straggler_ranks']}")
    return ", ".join(parts) or "no culprit"


def agree(torch_ranks: list[int], ours: dict[str, Any], truth: list[int]) -> str:
    """Whether ncclscope names whom PyTorch's analyzer names, and who says more."""
    if "error" in ours:
        return "-"
    mine = ours["culprit_ranks"] or ours["straggler_ranks"]
    if torch_ranks == mine:
        return "yes" if mine else "yes (none)"
    if not torch_ranks:
        return "ncclscope says more" + (" (right)" if mine == truth else "")
    if not mine:
        return "PyTorch says more"
    right = "ncclscope" if mine == truth else "PyTorch" if torch_ranks == truth else "neither"
    return f"no ({right} right)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", help="case names (default: all)")
    ap.add_argument("--fixtures", type=Path, default=FIXTURES)
    ap.add_argument("--torch-python", help="an interpreter with torch: rerun fr_trace")
    ap.add_argument("--json-dumps", action="store_true", help="give ncclscope the JSON dumps")
    ap.add_argument("--format", choices=["text", "json"], default="text")
    args = ap.parse_args(argv)
    maker = load_maker()
    rows = []
    for case in cases(args.fixtures, args.cases):
        expected = json.loads((case / "expected.json").read_text())
        if args.torch_python:
            torch_verdict = run_torch(case, args.torch_python, maker, expected["world_size"])
        else:
            torch_verdict = expected["pytorch_analyzer"]
        ours = run_ncclscope(ncclscope_inputs(case, args.json_dumps))
        rows.append(
            {
                "case": case.name,
                "truth": {"kind": expected["kind"], "culprit_ranks": expected["culprit_ranks"]},
                "pytorch": torch_verdict,
                "ncclscope": ours,
                "agree": agree(torch_verdict["culprit_ranks"], ours, expected["culprit_ranks"]),
            }
        )
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    header = f"{'case':<21}{'truth':<15}{'PyTorch fr_trace':<28}{'ncclscope':<30}agree?"
    print(header)
    print("-" * len(header))
    for row in rows:
        truth = f"{row['truth']['kind']} {row['truth']['culprit_ranks'] or ''}".strip()
        print(
            f"{row['case']:<21}{truth:<15}{describe_torch(row['pytorch']):<28}"
            f"{describe_ncclscope(row['ncclscope']):<30}{row['agree']}"
        )
    source = "rerun with " + args.torch_python if args.torch_python else "from expected.json"
    print(f"\nPyTorch column: fr_trace on dumps with pg_config repaired ({source});")
    crashed = sum(r["pytorch"].get("as_dumped", {}).get("verdict") == "crashed" for r in rows)
    print(f"on the dumps as written it crashed in {crashed} of {len(rows)} cases.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
