"""A host stamped late: its clock, or a slow node (#28).

A clock offset shifts every stamp of a host by the same amount, at every collective
kind and on every communicator; a slow GPU loses more before the collectives that follow
more compute (``SlowHost(by_phase=True)``: a backward layer twice a forward one, the
gradient norm's little).  Where the host's lateness differs between kinds the node is
slow, said at ``warning`` or above with the node named, in per-rank files as in a merged
log, with or without clock offsets, with hosts of one rank too.  Where every stamp of the
host is shifted alike (a pure clock offset; a slow node that is a constant delay) the
ambiguity stays.
"""

from __future__ import annotations

import random
from pathlib import Path

import jobgen
import pytest

from ncclscope.analysis import Diagnosis, run_analysis
from ncclscope.detect.base import Finding, severity_at_least
from ncclscope.synth import SlowHost, SynthSpec, generate

_SEEDS = 20


def _run(tmp_path: Path, spec: SynthSpec) -> Diagnosis:
    generate(spec, tmp_path / "job")
    return run_analysis([str(tmp_path / "job")], workdir=tmp_path / "work")


def _slow(a: Diagnosis) -> list[Finding]:
    """Straggler findings that call a host slow."""
    return [
        f
        for f in a.findings
        if f.kind == "straggler" and f.evidence.get("cause") == "slow" and f.evidence.get("unit")
    ]


def _said_slow(a: Diagnosis, host: str) -> bool:
    """Host ``host`` is said slow at ``warning`` or above, by name (in each attempt of
    the log where it is said at all), and no other host is."""
    slow = [f for f in _slow(a) if severity_at_least(f.severity, "warning")]
    return bool(slow) and all(f.hosts == [host] and host in f.message for f in slow)


def _slow_spec(seed: int, layout: str, clock_s: float) -> tuple[SynthSpec, str]:
    rng = random.Random(seed)
    hosts = rng.choice([2, 3, 4])
    per = rng.choice([1, 2, 4])
    host = f"node-{rng.randrange(hosts)}"
    fault = SlowHost(host, slowdown=rng.choice([0.2, 0.3, 0.5]), by_phase=True)
    spec = SynthSpec(
        ranks=hosts * per, hosts=hosts, steps=8, seed=seed, timestamps=True, layout=layout,
        clock_offset_max_s=clock_s, faults=(fault,),
    )  # fmt: skip
    return spec, host


@pytest.mark.parametrize("clock_s", [0.0, 0.02])
@pytest.mark.parametrize("layout", ["per-rank", "combined"])
def test_slow_node_whose_lateness_differs_by_kind_is_said_slow(
    tmp_path: Path, layout: str, clock_s: float
) -> None:
    missed: list[tuple[int, list[str]]] = []
    for seed in range(_SEEDS):
        spec, host = _slow_spec(seed, layout, clock_s)
        a = _run(tmp_path / str(seed), spec)
        if not _said_slow(a, host):
            missed.append((seed, [f.message for f in a.findings if f.kind == "straggler"]))
    assert len(missed) <= _SEEDS // 20, missed


def test_per_rank_slow_node_says_which_kinds_differ(tmp_path: Path) -> None:
    spec = SynthSpec(
        ranks=6, hosts=3, steps=8, seed=3, timestamps=True, layout="per-rank",
        clock_offsets_s=(0.0, -0.03, 0.01),
        faults=(SlowHost("node-1", slowdown=0.2, by_phase=True),),
    )  # fmt: skip
    a = _run(tmp_path, spec)
    assert _said_slow(a, "node-1"), [f.message for f in a.findings]
    f = _slow(a)[0]
    assert "differs between collective kinds" in f.message
    assert "ReduceScatter" in f.message
    assert "AllReduce" in f.message
    kinds = {k["op"] for k in f.evidence["lateness_by_kind"]}
    assert {"ReduceScatter", "AllReduce"} <= kinds
    # the node's share, not its clock (30 ms behind): 0.2 x (2 - 0.1) of the compute
    assert f.evidence["kind_spread_s"] > 0.005
    assert f.ranks == [2, 3]


@pytest.mark.parametrize("layout", ["per-rank", "combined"])
def test_pure_clock_offset_is_never_called_slow(tmp_path: Path, layout: str) -> None:
    for seed in range(_SEEDS):
        rng = random.Random(seed)
        hosts = rng.choice([2, 3, 4])
        offsets = tuple(rng.choice([0.0, 0.0, 0.03, -0.02, 0.2]) for _ in range(hosts))
        spec = SynthSpec(
            ranks=hosts * rng.choice([1, 2, 4]), hosts=hosts, steps=8, seed=seed,
            timestamps=True, layout=layout, clock_offsets_s=offsets,
        )  # fmt: skip
        a = _run(tmp_path / str(seed), spec)
        assert _slow(a) == [], (seed, offsets, [f.message for f in _slow(a)])


def test_constant_delay_in_per_rank_files_keeps_the_ambiguity(tmp_path: Path) -> None:
    """Every stamp of the host shifted alike: a clock or a constant delay, not told."""
    spec = SynthSpec(
        ranks=8, hosts=2, steps=8, seed=11, timestamps=True, layout="per-rank",
        faults=(SlowHost("node-1", lateness_s=0.01),),
    )  # fmt: skip
    a = _run(tmp_path, spec)
    late = [f for f in a.findings if f.kind == "straggler" and "node-1" in f.hosts]
    assert [f.evidence["cause"] for f in late] == ["clock_or_constant_delay"]
    assert late[0].severity == "info"
    assert "lateness_by_kind" not in late[0].evidence


def _variant(tmp_path: Path, spec: SynthSpec, how: str) -> Diagnosis:
    generate(spec, tmp_path / "job")
    files = jobgen.load_files(tmp_path / "job")
    if how == "cut":
        files = jobgen.cut_lines(files, 0.0, 0.6)
    elif how == "joined":
        files = jobgen.join_runs(files)
    out = jobgen.write_files(files, tmp_path / "variant")
    return run_analysis([str(out)], workdir=tmp_path / "work")


@pytest.mark.parametrize("how", ["cut", "joined", "skewed"])
def test_variants_of_a_slow_node(tmp_path: Path, how: str) -> None:
    """Cut (the log copied mid-run), joined (a restart appended to each file) and
    skewed (the slow host's clock 40 ms behind: its times say it is early)."""
    hits = 0
    for seed in range(10):
        rng = random.Random(100 + seed)
        hosts = rng.choice([3, 4])
        host = f"node-{rng.randrange(hosts)}"
        offsets = tuple(-0.04 if f"node-{h}" == host else 0.0 for h in range(hosts))
        spec = SynthSpec(
            ranks=hosts * rng.choice([1, 2]), hosts=hosts, steps=20, seed=seed,
            timestamps=True, layout="per-rank",
            clock_offsets_s=offsets if how == "skewed" else (),
            faults=(SlowHost(host, slowdown=0.3, by_phase=True),),
        )  # fmt: skip
        a = _variant(tmp_path / str(seed), spec, how)
        hits += _said_slow(a, host)
    assert hits >= 9


@pytest.mark.parametrize("how", ["cut", "joined"])
def test_variants_of_a_pure_clock_offset(tmp_path: Path, how: str) -> None:
    for seed in range(6):
        spec = SynthSpec(
            ranks=6, hosts=3, steps=10, seed=seed, timestamps=True, layout="per-rank",
            clock_offsets_s=(0.0, 0.03, -0.01),
        )  # fmt: skip
        a = _variant(tmp_path / str(seed), spec, how)
        assert _slow(a) == [], [f.message for f in _slow(a)]
