"""The Flight Recorder fixtures are complete and plain data: safe to ship and to read.

``fixtures/flight-recorder/<case>/`` holds real PyTorch dumps (made by ``make_fixtures.py``
beside them, under a separate torch install); this test needs no torch. Every pickle is
loaded with an unpickler that refuses every global, so a dump that needed code to load
(a class, a function, ``__reduce__``) fails here instead of shipping.
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any, NoReturn

import pytest

ROOT = Path(__file__).resolve().parent.parent / "fixtures" / "flight-recorder"
CASES = sorted(p.parent.name for p in ROOT.glob("*/expected.json"))
PLAIN = (dict, list, tuple, str, int, float, bool, type(None))


class NoGlobals(pickle.Unpickler):
    """Loads only what pickle's opcodes build by themselves: dicts, lists, tuples, scalars."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise pickle.UnpicklingError(f"global {module}.{name} refused")


def load_plain(raw: bytes) -> Any:
    return NoGlobals(io.BytesIO(raw)).load()


def only_plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and only_plain(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(only_plain(v) for v in value)
    return isinstance(value, PLAIN)


def test_cases_present() -> None:
    assert set(CASES) >= {"healthy", "skipped-collective", "slow-rank", "mismatch"}


def test_refusing_unpickler_refuses(tmp_path: Path) -> None:
    # A payload that creates a file when loaded: refused at its global, nothing created.
    target = tmp_path / "created-by-payload"

    class Payload:
        def __reduce__(self) -> tuple[Any, tuple[str, str]]:
            return (open, (str(target), "w"))

    raw = pickle.dumps(Payload())
    with pytest.raises(pickle.UnpicklingError, match=r"global io\.open refused"):
        load_plain(raw)
    assert not target.exists()


@pytest.mark.parametrize("case", CASES)
def test_expected(case: str) -> None:
    expected = json.loads((ROOT / case / "expected.json").read_text())
    world = expected["world_size"]
    assert all(0 <= r < world for r in expected["culprit_ranks"])
    assert expected["kind"] in {"none", "hang", "straggler", "mismatch"}
    assert (expected["kind"] == "none") == (expected["culprit_ranks"] == [])
    analyzer = expected["pytorch_analyzer"]
    assert analyzer["verdict"] in {"culprit", "nothing reported", "crashed"}
    assert all(0 <= r < world for r in analyzer["culprit_ranks"])
    assert (ROOT / case / "fr_trace.txt").is_file()
    assert (ROOT / case / "job.log").stat().st_size > 0


@pytest.mark.parametrize("case", CASES)
def test_pickle_dumps_plain_and_complete(case: str) -> None:
    world = json.loads((ROOT / case / "expected.json").read_text())["world_size"]
    dumps = sorted((ROOT / case).glob("fr_trace_rank_*"))
    assert [p.name for p in dumps] == [f"fr_trace_rank_{r}" for r in range(world)]
    for path in dumps:
        assert path.stat().st_size < 64 * 1024, f"{path} is no longer small"
        dump = load_plain(path.read_bytes())
        assert only_plain(dump), path
        assert isinstance(dump["version"], str)
        assert dump["entries"], path
        for entry in dump["entries"]:
            assert isinstance(entry["collective_seq_id"], int)
            assert entry["profiling_name"].startswith("gloo:")


@pytest.mark.parametrize("case", CASES)
def test_json_dumps_match_pickles(case: str) -> None:
    world = json.loads((ROOT / case / "expected.json").read_text())["world_size"]
    folder = ROOT / f"{case}-json"
    for rank in range(world):
        as_json = json.loads((folder / f"fr_trace_json_rank_{rank}.json").read_text())
        as_pickle = load_plain((ROOT / case / f"fr_trace_rank_{rank}").read_bytes())
        assert as_json["version"] == as_pickle["version"]
        # Both forms come from the same moment of the same recorder.
        seqs = [(e["collective_seq_id"], e["profiling_name"]) for e in as_json["entries"]]
        assert seqs == [(e["collective_seq_id"], e["profiling_name"]) for e in as_pickle["entries"]]


def test_culprits_visible_in_dumps() -> None:
    # The hang cases: the culprit's last sequence is behind every other rank's.
    for case in ("skipped-collective", "hang-dump-in-flight"):
        expected = json.loads((ROOT / case / "expected.json").read_text())
        last = {
            r: max(
                e["collective_seq_id"]
                for e in load_plain((ROOT / case / f"fr_trace_rank_{r}").read_bytes())["entries"]
            )
            for r in range(expected["world_size"])
        }
        behind = sorted(r for r, seq in last.items() if seq < max(last.values()))
        assert behind == expected["culprit_ranks"], (case, last)
