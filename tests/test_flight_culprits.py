"""Culprits from the Flight Recorder dumps alone (issue #28), over generated dump sets.

Two classes: in a process group, the member whose dump holds no entry at all for the
collective the others entered; and a member with no dump at all while the others wait
inside a collective.  The sets vary the world size (4-16), the group layout (the world
alone, halves, pairs), which member is the culprit, cut dumps (a ring that wrapped, a
file cut short) and two runs' dumps given together; healthy sets (every member at the
same point, a rank one completion behind while entries are in flight) name nobody.  A
wrong culprit fails at once; each class must be right in at least 95% of its variants.
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ncclscope.analysis import run_analysis

T0 = 1_764_124_400_000_000_000  # ns
GAP = 10_000_000  # ns between collectives
LAYOUTS = ("world", "halves", "pairs")


@dataclass
class Proc:
    """One rank's recorder: its groups (name -> (pg_id, desc, members)) and entries."""

    rank: int
    groups: dict[str, tuple[int, str, list[int]]] = field(default_factory=dict)
    entries: list[dict[str, Any]] = field(default_factory=list)

    def call(self, pg: str, t_ns: int, state: str = "completed", seq: int | None = None) -> None:
        pg_id, desc, _ = self.groups[pg]
        done = [e["collective_seq_id"] for e in self.entries if e["pg_id"] == pg_id]
        n = seq if seq is not None else max(done, default=0) + 1
        self.entries.append(
            {
                "record_id": len(self.entries),
                "pg_id": pg_id,
                "process_group": (pg, desc),
                "collective_seq_id": n,
                "p2p_seq_id": 0,
                "op_id": len(self.entries) + 1,
                "profiling_name": "nccl:all_reduce",
                "time_created_ns": t_ns,
                "input_sizes": [[1024]],
                "input_dtypes": ["Float"],
                "output_sizes": [[1024]],
                "output_dtypes": ["Float"],
                "state": state,
                "time_discovered_started_ns": None if state == "scheduled" else t_ns + 1_000,
                "time_discovered_completed_ns": t_ns + 2_000 if state == "completed" else None,
                "retired": state == "completed",
                "timeout_ms": 600_000,
                "is_p2p": False,
                "frames": [],
            }
        )

    def dump(self, *, status_for_unused: str = "zero", keep_last: int | None = None) -> bytes:
        status: dict[str, dict[str, int]] = {}
        for pg_id, _, _ in self.groups.values():
            mine = [e for e in self.entries if e["pg_id"] == pg_id]
            if not mine and status_for_unused == "absent":
                continue
            never = 0 if status_for_unused == "zero" else -1
            status[str(pg_id)] = {
                "last_enqueued_collective": max(
                    (e["collective_seq_id"] for e in mine), default=never
                ),
                "last_started_collective": -1,
                "last_completed_collective": max(
                    (e["collective_seq_id"] for e in mine if e["state"] == "completed"),
                    default=never,
                ),
            }
        entries = self.entries if keep_last is None else self.entries[-keep_last:]
        return pickle.dumps(
            {
                "version": "2.10",
                "comm_lib_version": "2.27.3",
                "pg_config": {
                    name: {"name": name, "desc": desc, "ranks": str(members)}
                    for name, (_, desc, members) in self.groups.items()
                },
                "pg_status": status,
                "entries": entries,
            }
        )


def _layout(world: int, layout: str) -> dict[str, list[int]]:
    """Process group name -> members: the world, plus halves or pairs."""
    groups = {"0": list(range(world))}
    if layout == "halves":
        h = world // 2
        groups |= {"1": list(range(h)), "2": list(range(h, world))}
    elif layout == "pairs":
        groups |= {str(1 + k): [2 * k, 2 * k + 1] for k in range(world // 2)}
    return groups


def _procs(world: int, layout: str) -> dict[int, Proc]:
    groups = _layout(world, layout)
    procs = {r: Proc(r) for r in range(world)}
    for name, members in groups.items():
        desc = "default_pg" if name == "0" else ("half" if layout == "halves" else "pair")
        for r in members:
            procs[r].groups[name] = (len(procs[r].groups), desc, members)
    return procs


def _own_group(p: Proc) -> str:
    """The rank's sub-group (the world where there is none)."""
    return next((n for n in p.groups if n != "0"), "0")


def _steps(procs: dict[int, Proc], rng: random.Random, k: int, t: int) -> int:
    """``k`` healthy rounds: a world collective, then each sub-group's, all completed."""
    for _ in range(k):
        for p in procs.values():
            p.call("0", t + rng.randrange(0, 500_000))
        t += GAP
        for p in procs.values():
            if _own_group(p) != "0":
                p.call(_own_group(p), t + rng.randrange(0, 500_000))
        t += GAP
    return t


@dataclass
class Variant:
    """One generated dump set: the dumps to write (rank -> bytes) and the true culprit
    (empty: nobody should be named)."""

    name: str
    dumps: dict[int, bytes]
    truth: list[int]
    names: dict[int, str] = field(default_factory=dict)


def _silent_member(world: int, layout: str, rng: random.Random, cut: str) -> Variant:
    """The culprit's group-mates enter its group's next collective; the culprit never
    does (``first``: its dump holds no entry of the group at all; else it stops after
    some).  The other groups carry on into the world's next collective and wait there."""
    procs = _procs(world, layout)
    first = rng.random() < 0.6
    t = _steps(procs, rng, 0 if first else rng.randint(1, 4), T0)
    if first and layout != "world":
        # Every sub-group's first collective after a few of the world's: the culprit
        # skips its own.  (In the world alone, the culprit's dump holds no entry at all.)
        for _ in range(rng.randint(1, 6)):
            for p in procs.values():
                p.call("0", t + rng.randrange(0, 500_000))
            t += GAP
    culprit = rng.randrange(world)
    group = _own_group(procs[culprit])
    t_stuck = t + rng.randrange(0, 3 * GAP)
    for p in procs.values():
        if p.rank == culprit:
            continue
        if _own_group(p) == group:
            p.call(group, t_stuck + rng.randrange(0, 500_000), state="started")
        else:
            if _own_group(p) != "0":
                p.call(_own_group(p), t + rng.randrange(0, 500_000))
            p.call("0", t + GAP + rng.randrange(0, 3 * GAP), state="started")
    unused = rng.choice(["zero", "minus", "absent"])
    dumps = {r: p.dump(status_for_unused=unused) for r, p in procs.items()}
    truth = [culprit]
    if cut == "wrapped-culprit":
        # The culprit's ring wrapped: its dump no longer reaches back, so its missing entry
        # says nothing (naming nobody is right here).
        kept = procs[culprit].entries[-2:]
        dumps[culprit] = procs[culprit].dump(status_for_unused=unused, keep_last=2)
        pg_id = procs[culprit].groups[group][0]
        if len(kept) < len(procs[culprit].entries) and all(e["pg_id"] != pg_id for e in kept):
            truth = []  # neither its entries nor a status it can name tell the group
    elif cut == "wrapped-waiter":
        mate = next((r for r in _layout(world, layout)[group] if r != culprit), None)
        if mate is not None:
            dumps[mate] = procs[mate].dump(status_for_unused=unused, keep_last=2)
    elif cut == "cut-bystander":
        others = [r for r in procs if r not in _layout(world, layout)[group]]
        if others:
            r = rng.choice(others)
            dumps[r] = dumps[r][: len(dumps[r]) // 2]
    return Variant(f"silent-{layout}-{world}-{culprit}-{cut}-{first}", dumps, truth)


def _no_dump(world: int, layout: str, rng: random.Random, cut: str) -> Variant:
    """The culprit's group-mates enter its group's next collective and wait; the culprit
    left no dump (dead).  The other groups carry on into the world's next one."""
    procs = _procs(world, layout)
    t = _steps(procs, rng, rng.randint(1, 4), T0)
    culprit = rng.randrange(world)
    group = _own_group(procs[culprit])
    for p in procs.values():
        if p.rank == culprit:
            continue
        if _own_group(p) == group:
            p.call(group, t + rng.randrange(0, 3 * GAP), state="started")
        else:
            if _own_group(p) != "0":
                p.call(_own_group(p), t + rng.randrange(0, 500_000))
            p.call("0", t + GAP + rng.randrange(0, 3 * GAP), state="started")
    dumps = {r: p.dump() for r, p in procs.items() if r != culprit}
    truth = [culprit]
    mates = [r for r in _layout(world, layout)[group] if r != culprit]
    if cut == "cut-mate" and len(mates) > 1:
        # A group-mate's file cut short: it may be the one, too (naming nobody is right).
        r = rng.choice(mates)
        dumps[r] = dumps[r][: len(dumps[r]) // 2]
        truth = []
    elif cut == "two-missing" and len(mates) > 1:
        del dumps[rng.choice(mates)]
        truth = []
    elif cut == "wrapped-waiter":
        r = rng.choice([r for r in procs if r != culprit])
        dumps[r] = procs[r].dump(keep_last=2)
    return Variant(f"nodump-{layout}-{world}-{culprit}-{cut}", dumps, truth)


def _healthy(world: int, layout: str, rng: random.Random, cut: str) -> Variant:
    """Every member at the same point (``same``), or all inside the world's next
    collective with one rank a completion behind (its previous one still running, its
    last not started: ``lag``); cut variants leave one rank's file short."""
    procs = _procs(world, layout)
    t = _steps(procs, rng, rng.randint(1, 4), T0)
    if cut.startswith("lag"):
        lagging = rng.randrange(world)
        for p in procs.values():
            if p.rank == lagging:
                p.entries[-1]["state"] = "started"
                p.entries[-1]["retired"] = False
                p.entries[-1]["time_discovered_completed_ns"] = None
            p.call("0", t + rng.randrange(0, 500_000),
                   state="scheduled" if p.rank == lagging else "started")  # fmt: skip
    dumps = {r: p.dump() for r, p in procs.items()}
    if cut.endswith("cut"):
        r = rng.randrange(world)
        dumps[r] = dumps[r][: len(dumps[r]) // 2]
    return Variant(f"healthy-{layout}-{world}-{cut}", dumps, [])


def _two_runs(world: int, layout: str, rng: random.Random, cut: str) -> Variant:
    """Half the ranks' dumps from a healthy run, the rest from a run an hour later in
    which one of them skipped a collective: compared across runs they would blame."""
    del cut
    healthy = _healthy(world, layout, rng, "same")
    later = _silent_member(world, layout, rng, "none")
    shift = 3_600 * 10**9
    dumps = dict(healthy.dumps)
    for r in range(world // 2, world):
        d = pickle.loads(later.dumps[r])  # our own pickle
        for e in d["entries"]:
            e["time_created_ns"] += shift
        dumps[r] = pickle.dumps(d)
    return Variant(f"tworuns-{layout}-{world}", dumps, [])


def _variants(
    make: Callable[[int, str, random.Random, str], Variant], cuts: tuple[str, ...], n: int
) -> list[Variant]:
    rng = random.Random(f"issue-28 {make.__name__}")
    out = []
    for k in range(n):
        world = rng.choice([w for w in range(4, 17) if w % 2 == 0])
        layout = LAYOUTS[k % len(LAYOUTS)]
        v = make(world, layout, rng, cuts[k % len(cuts)])
        v.name = f"{k:02d}-{v.name}"
        out.append(v)
    return out


def _verdict(v: Variant, tmp: Path) -> tuple[str, list[list[int]]]:
    """right | wrong | not_named, and the ranks every finding that blames anyone names."""
    where = tmp / v.name
    where.mkdir(parents=True)
    for r, raw in v.dumps.items():
        (where / f"nccl_trace_rank_{r}").write_bytes(raw)
    d = run_analysis([str(where)], workdir=tmp / f"{v.name}-work")
    blamed = [
        f.ranks
        for f in d.findings
        if f.kind in ("hang", "mismatch", "straggler") and f.severity != "info" and f.ranks
    ]
    if any(set(b) - set(v.truth) for b in blamed):
        return "wrong", blamed
    if v.truth and blamed and sorted(blamed[0]) == v.truth:
        return "right", blamed
    return ("not_named" if v.truth else "right"), blamed


def _score(variants: list[Variant], tmp: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"right": [], "wrong": [], "not_named": []}
    for v in variants:
        verdict, blamed = _verdict(v, tmp)
        out[verdict].append(f"{v.name}: truth {v.truth}, blamed {blamed}")
    return out


def _assert_class(score: dict[str, list[str]], n: int) -> None:
    assert score["wrong"] == [], score["wrong"]
    assert len(score["right"]) >= 0.95 * n, score["not_named"]


N = 36


def test_the_member_without_an_entry_in_its_group_is_the_culprit(tmp_path: Path) -> None:
    """A sub-group member (or the world's) that never enqueued the collective its
    group-mates entered, most often with no entry of the group at all: named, never
    another; a culprit whose ring wrapped is not named (its dump does not reach back)."""
    cuts = ("none", "none", "wrapped-waiter", "cut-bystander", "wrapped-culprit", "none")
    _assert_class(_score(_variants(_silent_member, cuts, N), tmp_path), N)


def test_the_member_with_no_dump_is_the_likely_culprit(tmp_path: Path) -> None:
    """A member with no dump while its group-mates wait inside a collective: named as
    dead or stuck; with two members missing, or a group-mate's file cut short, nobody."""
    cuts = ("none", "none", "wrapped-waiter", "cut-mate", "two-missing", "none")
    _assert_class(_score(_variants(_no_dump, cuts, N), tmp_path), N)


def test_healthy_dump_sets_name_nobody(tmp_path: Path) -> None:
    """Every member at the same point, or one rank a completion behind while the world's
    next collective is in flight; with a file cut short too: nobody named."""
    cuts = ("same", "lag", "same-cut", "lag-cut")
    score = _score(_variants(_healthy, cuts, N), tmp_path)
    assert score["wrong"] == [], score["wrong"]


def test_dumps_of_two_runs_are_not_compared(tmp_path: Path) -> None:
    """Half the dumps from a healthy run, half from a later run with a silent member:
    nobody named (the later run alone would name its culprit)."""
    score = _score(_variants(_two_runs, ("none",), 12), tmp_path)
    assert score["wrong"] == [], score["wrong"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_no_dump_culprit_says_so(layout: str, tmp_path: Path) -> None:
    """The finding for a member with no dump says what it is and names the op."""
    v = _no_dump(8, layout, random.Random(5), "none")
    where = tmp_path / "d"
    where.mkdir()
    for r, raw in v.dumps.items():
        (where / f"nccl_trace_rank_{r}").write_bytes(raw)
    d = run_analysis([str(where)], workdir=tmp_path / "w")
    (h,) = [f for f in d.findings if f.kind == "hang" and f.ranks]
    assert h.ranks == v.truth
    assert h.op == "AllReduce"
    assert "left no Flight Recorder dump" in h.message
    assert h.evidence["culprit_basis"] == "flight_recorder"
    assert h.evidence["flight_recorder"]["never_enqueued"] == []
    assert str(v.truth[0]) not in h.evidence["flight_recorder"]["last_enqueued"]
