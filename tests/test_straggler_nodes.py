"""Slow nodes as units, clock offsets told from slowness, stragglers in time (#12).

Jobs come from ``synth``: SlowHost (every rank of one host late at every collective),
SlowSpell (one rank late for a window), and host clock offsets (drawn up to 50 ms, or
given).  Clocks only shift the times a host prints; the combined layout keeps the order in
which lines were written.
"""

from __future__ import annotations

import statistics
from datetime import datetime
from pathlib import Path
from typing import Any

import jobgen
import pytest

from ncclscope.analysis import Diagnosis, run_analysis
from ncclscope.detect.base import Finding, severity_at_least
from ncclscope.detect.straggler import find_window
from ncclscope.synth import SlowHost, SlowRank, SlowSpell, SynthSpec, generate

_GAP = 0.5 / 13  # the time model's gap between collectives (0.5 s steps, 4 layers)


def _late(share: float) -> float:
    """Lateness that is ``share`` of the gap between collectives it makes."""
    return share * _GAP / (1 - share)


def _run(tmp_path: Path, spec: SynthSpec) -> tuple[Diagnosis, dict[str, Any]]:
    truth = generate(spec, tmp_path / "job").to_dict()
    return run_analysis([str(tmp_path / "job")], workdir=tmp_path / "work"), truth


def _stragglers(a: Diagnosis) -> list[Finding]:
    return [f for f in a.findings if f.kind == "straggler"]


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=None).timestamp()


@pytest.mark.parametrize(("hosts", "share"), [(2, 0.10), (3, 0.25), (4, 0.50)])
def test_slow_host_is_named_as_a_node(tmp_path: Path, hosts: int, share: float) -> None:
    slow = f"node-{hosts - 1}"
    spec = SynthSpec(
        ranks=8 * hosts, hosts=hosts, steps=12, timestamps=True, seed=hosts,
        faults=(SlowHost(slow, lateness_s=_late(share)),),
    )  # fmt: skip
    a, _ = _run(tmp_path, spec)
    found = [f for f in _stragglers(a) if severity_at_least(f.severity, "warning")]
    assert [f.hosts for f in found] == [[slow]], [f.message for f in _stragglers(a)]
    f = found[0]
    assert f.ranks == list(range(8 * (hosts - 1), 8 * hosts))
    assert f.evidence["ranks"] == f.ranks
    assert f.evidence["cause"] == "slow"
    assert f.evidence["unit"] == "host"
    assert f.evidence["median_lateness_s"] == pytest.approx(_late(share), rel=0.2)
    # no rank of the slow host is reported on its own: they are all equally late
    assert all(f2.hosts != [slow] or f2 is f for f2 in _stragglers(a))


def test_slow_host_proportional_to_compute(tmp_path: Path) -> None:
    spec = SynthSpec(
        ranks=16, hosts=2, steps=12, timestamps=True, seed=5,
        faults=(SlowHost("node-0", slowdown=0.3),),
    )  # fmt: skip
    a, _ = _run(tmp_path, spec)
    found = [f for f in _stragglers(a) if severity_at_least(f.severity, "warning")]
    assert [(f.hosts, f.evidence["cause"]) for f in found] == [(["node-0"], "slow")]


def test_hosts_of_one_rank(tmp_path: Path) -> None:
    spec = SynthSpec(
        ranks=4, hosts=4, steps=12, timestamps=True, seed=7,
        faults=(SlowRank(2, _late(0.15)),),
    )  # fmt: skip
    a, _ = _run(tmp_path, spec)
    found = [f for f in _stragglers(a) if severity_at_least(f.severity, "warning")]
    assert [(f.ranks, f.hosts, f.evidence["cause"]) for f in found] == [([2], ["node-2"], "slow")]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("layout", ["combined", "per-rank"])
def test_clock_offsets_up_to_50ms_are_no_warning(tmp_path: Path, seed: int, layout: str) -> None:
    spec = SynthSpec(
        ranks=8 * (2 + seed % 3), hosts=2 + seed % 3, steps=10, timestamps=True, seed=seed,
        layout=layout, clock_offset_max_s=0.05,  # type: ignore[arg-type]
    )  # fmt: skip
    a, truth = _run(tmp_path, spec)
    offsets = [o["offset_s"] for o in truth["clock_offsets"]]
    assert max(offsets) - min(offsets) > 0.005  # the clocks do differ
    assert not [f.message for f in a.findings if severity_at_least(f.severity, "warning")]
    # What is said about the clocks does not blame a rank.
    assert all(f.ranks == [] for f in _stragglers(a))


def test_clock_offset_is_told_from_the_merged_order(tmp_path: Path) -> None:
    spec = SynthSpec(
        ranks=16, hosts=2, steps=10, timestamps=True, seed=2, clock_offsets_s=(0.0, 0.03)
    )
    a, _ = _run(tmp_path, spec)
    (f,) = _stragglers(a)
    assert (f.severity, f.hosts, f.ranks, f.evidence["cause"]) == ("info", ["node-1"], [], "clock")
    assert "chronyc tracking" in f.evidence["check"]


@pytest.mark.parametrize("layout", ["combined", "per-rank"])
def test_clock_offset_of_two_seconds_is_not_a_slow_node(tmp_path: Path, layout: str) -> None:
    spec = SynthSpec(
        ranks=16, hosts=2, steps=10, timestamps=True, seed=2, layout=layout,  # type: ignore[arg-type]
        clock_offsets_s=(0.0, 2.0),
    )  # fmt: skip
    a, _ = _run(tmp_path, spec)
    (f,) = _stragglers(a)
    assert f.hosts == ["node-1"]
    assert f.ranks == []  # no rank blamed
    assert f.severity == "warning"  # a clock seconds off needs fixing
    assert f.evidence["cause"] == ("clock" if layout == "combined" else "clock_or_constant_delay")
    assert "chronyc tracking" in f.message
    assert not [x for x in a.findings if x.severity == "critical"]


@pytest.mark.parametrize("offsets", [(0.0, 0.02), (0.02, 0.0), (0.0, 0.3)])
def test_slow_host_with_clock_offset_is_still_slow(
    tmp_path: Path, offsets: tuple[float, float]
) -> None:
    spec = SynthSpec(
        ranks=16, hosts=2, steps=12, timestamps=True, seed=9, clock_offsets_s=offsets,
        faults=(SlowHost("node-1", lateness_s=_late(0.25)),),
    )  # fmt: skip
    a, _ = _run(tmp_path, spec)
    found = [f for f in _stragglers(a) if severity_at_least(f.severity, "warning")]
    assert [(f.hosts, f.evidence["cause"]) for f in found] == [(["node-1"], "slow")]
    assert found[0].ranks == list(range(8, 16))


def test_slow_host_per_rank_logs_says_both(tmp_path: Path) -> None:
    """Separate files, a constant delay: the times cannot tell a slow node from a clock
    offset; the finding names the host, says both, and what to check."""
    spec = SynthSpec(
        ranks=16, hosts=2, steps=12, timestamps=True, seed=3, layout="per-rank",
        faults=(SlowHost("node-1", lateness_s=_late(0.2)),),
    )  # fmt: skip
    a, _ = _run(tmp_path, spec)
    (f,) = _stragglers(a)
    assert (f.hosts, f.evidence["cause"], f.severity) == (
        ["node-1"], "clock_or_constant_delay", "info",
    )  # fmt: skip
    assert "chronyc tracking" in f.message


def _window_ok(f: Finding, start: str, end: str, tol_s: float) -> None:
    assert abs(_ts(f.evidence["window_start"]) - _ts(start)) <= tol_s
    assert abs(_ts(f.evidence["window_end"]) - _ts(end)) <= tol_s


def test_intermittent_rank_window(tmp_path: Path) -> None:
    spec = SynthSpec(
        ranks=16, hosts=2, steps=30, timestamps=True, seed=4,
        faults=(SlowSpell(5, lateness_s=0.008, from_instance=120, to_instance=220),),
    )  # fmt: skip
    a, truth = _run(tmp_path, spec)
    found = [f for f in _stragglers(a) if severity_at_least(f.severity, "warning")]
    assert [f.ranks for f in found] == [[5]]
    f = found[0]
    details = truth["faults"][0]["details"]
    # within three collectives of the true start and end
    _window_ok(f, details["start"], details["end"], 3 * _GAP + 0.01)
    assert f.evidence["intermittent"] is True
    assert f.evidence["window_instances"] == pytest.approx(100, abs=4)
    # cost: ~8 ms per collective for ~100 collectives
    assert f.evidence["window_cost_s"] == pytest.approx(0.8, rel=0.2)
    assert f.cost_gpu_s == pytest.approx(0.8 * 15, rel=0.2)


def test_intermittent_host_window_with_clock_offsets(tmp_path: Path) -> None:
    spec = SynthSpec(
        ranks=24, hosts=3, steps=30, timestamps=True, seed=8, layout="per-rank",
        clock_offset_max_s=0.02,
        faults=(SlowHost("node-1", lateness_s=0.006, from_instance=200, to_instance=300),),
    )  # fmt: skip
    a, truth = _run(tmp_path, spec)
    found = [f for f in _stragglers(a) if severity_at_least(f.severity, "warning")]
    assert [(f.hosts, f.evidence["cause"]) for f in found] == [(["node-1"], "slow")]
    details = truth["faults"][0]["details"]
    # printed times carry the hosts' clocks (up to 20 ms)
    _window_ok(found[0], details["start"], details["end"], 3 * _GAP + 0.05)


def test_find_window_rejects_noise() -> None:
    """Noise alone (no stretch above its level) gives no window, nor does one spike."""
    xs = [0.001 * ((i * 7919) % 13 - 6) / 6 for i in range(300)]
    assert find_window(xs, 0.0, 0.002) is None
    xs[150] = 0.05
    assert find_window(xs, 0.0, 0.002) is None
    for i in range(100, 140):
        xs[i] += 0.004
    w = find_window(xs, 0.0, 0.002)
    assert w is not None
    assert abs(w.first - 100) <= 2
    assert abs(w.last - 139) <= 2


@pytest.mark.parametrize("offsets", [(0.0, 0.0, 0.0), (0.0, -0.03, 0.02), (0.01, 0.04, -0.02)])
def test_slowdown_that_grows_with_the_compute_is_slow_in_separate_files(
    tmp_path: Path, offsets: tuple[float, float, float]
) -> None:
    """Per-rank files (no merged order), a node 25% slower at computing: its lateness is
    larger after the optimizer step than after a layer, which no clock does; the slowdown
    is read from that growth, clock-free, and the rest of the shift is the clock."""
    spec = SynthSpec(
        ranks=24, hosts=3, steps=20, timestamps=True, seed=3, layout="per-rank",
        telemetry=True, clock_offsets_s=offsets, faults=(SlowHost("node-1", slowdown=0.25),),
    )  # fmt: skip
    a, truth = _run(tmp_path, spec)
    found = [f for f in _stragglers(a) if severity_at_least(f.severity, "warning")]
    assert [(f.hosts, f.evidence["cause"]) for f in found] == [(["node-1"], "slow")]
    f = found[0]
    # its delay at a typical collective over the gap it makes (0.25 / 1.25 = 0.2)
    assert truth["faults"][0]["details"]["slowdown"] == pytest.approx(0.2, abs=0.01)
    assert f.evidence["slowdown"] == pytest.approx(0.2, abs=0.03)
    clock = offsets[1] - statistics.median([offsets[0], offsets[2]])
    assert f.evidence["clock_offset_estimate_s"] == pytest.approx(clock, abs=0.004)


def test_constant_clock_offsets_do_not_grow_with_the_compute(tmp_path: Path) -> None:
    spec = SynthSpec(
        ranks=24, hosts=3, steps=20, timestamps=True, seed=3, layout="per-rank",
        telemetry=True, clock_offsets_s=(0.0, 0.04, -0.02),
    )  # fmt: skip
    a, _ = _run(tmp_path, spec)
    assert not [f.message for f in a.findings if severity_at_least(f.severity, "warning")]
    assert all(f.evidence["cause"] != "slow" for f in _stragglers(a))


def test_several_clock_offsets_are_said_once(tmp_path: Path) -> None:
    spec = SynthSpec(
        ranks=40, hosts=5, steps=10, timestamps=True, seed=6, layout="per-rank",
        clock_offsets_s=(0.0, 0.03, -0.001, 0.012, 0.001),
    )  # fmt: skip
    a, _ = _run(tmp_path, spec)
    (f,) = _stragglers(a)
    assert (f.severity, f.ranks, f.evidence["cause"]) == ("info", [], "clock_or_constant_delay")
    assert f.hosts == ["node-1", "node-3"]
    by_host = {h["host"]: h["median_lateness_s"] for h in f.evidence["by_host"]}
    # against the median of the other hosts' clocks (0.0005 s for both)
    assert by_host["node-1"] == pytest.approx(0.0295, abs=0.001)
    assert by_host["node-3"] == pytest.approx(0.0115, abs=0.001)


# ---- a lone late rank on a small host; files cut short; spells mirrored on two hosts --


@pytest.mark.parametrize("layout", ["combined", "per-rank"])
@pytest.mark.parametrize(
    ("share", "offsets"),
    [
        (0.10, (0.0, 0.02, 0.045, 0.01)),
        (0.25, (0.0, 0.02, 0.045, 0.01)),
    ],
)
def test_lone_late_rank_on_a_host_of_two_is_the_rank(
    tmp_path: Path, layout: str, share: float, offsets: tuple[float, ...]
) -> None:
    """Hosts of two ranks, clocks apart: one late rank is named on its own, measured
    against its host's other rank (one clock), and its healthy neighbour is not blamed
    as part of a slow node."""
    spec = SynthSpec(
        ranks=8, hosts=4, steps=12, timestamps=True, seed=11, layout=layout,  # type: ignore[arg-type]
        clock_offsets_s=offsets, faults=(SlowRank(5, _late(share)),),
    )  # fmt: skip
    a, _ = _run(tmp_path, spec)
    found = [f for f in _stragglers(a) if severity_at_least(f.severity, "warning")]
    assert [(f.ranks, f.hosts, f.evidence["cause"]) for f in found] == [([5], ["node-2"], "slow")]
    f = found[0]
    assert f.evidence["compared_with"] == "host"
    assert f.evidence["host_members"] == 2
    assert f.evidence["excess_lateness_s"] == pytest.approx(_late(share), rel=0.2)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("offsets_ms", [(35.0, 20.0, 6.0), (6.0, 20.0, 35.0)])
def test_lone_late_rank_in_a_merged_log_is_not_its_host(
    tmp_path: Path, seed: int, offsets_ms: tuple[float, ...]
) -> None:
    """One merged log (a launcher's), the late rank on a host of two whose clock is
    behind the others' (its times say it is early) or ahead (they say it is late): the
    host's median line comes after the others' (its late rank's), its first does not;
    the host is not a slow node: the rank is named, on its own, measured against its
    host's other rank.  (Late enough to be named for every seed: at 5% seeds 2 and 3
    name no one, and a check over no findings passes whatever the detector does.)"""
    job = jobgen.generate(
        jobgen.JobSpec(
            kind="slow_rank", hosts=(4, 4, 2), offsets_ms=offsets_ms, slowdown=0.08,
            culprit_rank=8, layout="combined", seed=seed,
        )
    )  # fmt: skip
    logs = jobgen.write_files(job.files, tmp_path / "logs")
    a = run_analysis([str(logs)], workdir=tmp_path / "work")
    found = [f for f in _stragglers(a) if severity_at_least(f.severity, "warning")]
    got = [(f.ranks, f.hosts, f.evidence["cause"], f.evidence["compared_with"]) for f in found]
    assert got == [([8], job.truth["culprit_hosts"], "slow", "host")], [f.message for f in found]


def _host_file(files: jobgen.Files, host: str) -> str:
    (name,) = [n for n in files if host in n]
    return name


@pytest.mark.parametrize("cut_host", [0, 1, 2])
def test_a_host_file_cut_short_moves_no_one(tmp_path: Path, cut_host: int) -> None:
    """Healthy, clocks 0-45 ms apart, one host's file ends at 30% of its lines: the
    instances it is missing from are not compared (the others' reference would jump by
    its clock), so no host is late."""
    job = jobgen.generate(
        jobgen.JobSpec(kind="healthy", hosts=(4, 2, 3), offsets_ms=(0.0, 45.0, 20.0), seed=5)
    )
    names = sorted(job.files)
    cut = jobgen.cut_lines(job.files, 0.0, 0.3, only=names[cut_host])
    logs = jobgen.write_files(cut, tmp_path / "logs")
    a = run_analysis([str(logs)], workdir=tmp_path / "work")
    assert not [f.message for f in a.findings if severity_at_least(f.severity, "warning")]


def test_slow_node_named_when_another_host_file_is_cut(tmp_path: Path) -> None:
    job = jobgen.generate(
        jobgen.JobSpec(
            kind="slow_node", hosts=(4, 4, 4), offsets_ms=(20.0, 0.0, 41.0), slowdown=0.25,
            culprit_host=1, steps=16, seed=15,
        )
    )  # fmt: skip
    names = sorted(job.files)
    cut = jobgen.cut_lines(job.files, 0.0, 0.6, only=names[0])
    logs = jobgen.write_files(cut, tmp_path / "logs")
    a = run_analysis([str(logs)], workdir=tmp_path / "work")
    found = [f for f in _stragglers(a) if severity_at_least(f.severity, "warning")]
    slow_host = job.truth["culprit_hosts"]
    assert [(f.hosts, f.evidence["cause"]) for f in found] == [(slow_host, "slow")]


def test_spell_over_most_of_the_run_is_the_slow_host(tmp_path: Path) -> None:
    """Two hosts in separate files, one late by a constant delay over most of the run
    (from instance 40 to 230 of 260): its lateness rises above its own lower level for
    that stretch; the other host's only dips.  The host is named from its window."""
    spec = SynthSpec(
        ranks=16, hosts=2, steps=20, timestamps=True, seed=6, layout="per-rank",
        clock_offsets_s=(0.0, 0.015),
        faults=(SlowHost("node-0", lateness_s=0.012, from_instance=40, to_instance=230),),
    )  # fmt: skip
    a, truth = _run(tmp_path, spec)
    found = [f for f in _stragglers(a) if severity_at_least(f.severity, "warning")]
    assert [(f.hosts, f.evidence["cause"]) for f in found] == [(["node-0"], "slow")]
    details = truth["faults"][0]["details"]
    _window_ok(found[0], details["start"], details["end"], 3 * _GAP + 0.02)


def test_spell_mirrored_on_two_hosts_blames_neither(tmp_path: Path) -> None:
    """One of two hosts late by a constant delay from the start to 3/4 of the run: against
    each other that reads as well as the other host late over the last quarter (clocks
    apart, no merged order).  The delay does not grow with the compute, so nothing tells
    which: an info finding names both hosts, blaming no rank."""
    spec = SynthSpec(
        ranks=16, hosts=2, steps=20, timestamps=True, seed=6, layout="per-rank",
        clock_offsets_s=(0.0, 0.015),
        faults=(SlowHost("node-0", lateness_s=0.012, from_instance=0, to_instance=190),),
    )  # fmt: skip
    a, _ = _run(tmp_path, spec)
    assert not [f.message for f in _stragglers(a) if severity_at_least(f.severity, "warning")]
    (f,) = [f for f in _stragglers(a) if f.evidence["cause"] == "slow_unattributed"]
    assert (f.hosts, f.ranks, f.severity) == (["node-0", "node-1"], [], "info")


def test_spell_that_grows_with_the_compute_is_told_from_its_mirror(tmp_path: Path) -> None:
    """The same, but the node is slower at computing (its lateness grows with the gap
    before each collective, the optimizer's longest): inside its window the lateness
    grows with the gap, inside its mirror's it is a clock, flat."""
    spec = SynthSpec(
        ranks=16, hosts=2, steps=20, timestamps=True, seed=6, layout="per-rank",
        telemetry=True, clock_offsets_s=(0.0, 0.015),
        faults=(SlowHost("node-0", slowdown=0.3, from_instance=0, to_instance=190),),
    )  # fmt: skip
    a, _ = _run(tmp_path, spec)
    found = [f for f in _stragglers(a) if severity_at_least(f.severity, "warning")]
    assert [(f.hosts, f.evidence["cause"]) for f in found] == [(["node-0"], "slow")]
