"""Read evidence folders back, and say from them who stopped the job and how.

``read_evidence`` takes the manifests ``analyze`` found (one per node and stall, see
``evidence.manifest``) and reads, per rank, what its process answered: its state, its
Python stack (``evidence.stacks``, classified), whether it dumped its Flight Recorder.
``judge`` turns that into culprits with a kind, each from evidence about that rank
(DESIGN.md: never from a headcount):

- ``dead_process``: the logs placed the rank's process on a node whose agent looked for
  it at the stall and found it gone;
- ``frozen_node`` / frozen process: its process was stopped (SIGSTOP, a debugger) or in
  uninterruptible sleep (a driver or file system that never returns) when asked;
- ``stuck_outside_nccl``: its main thread's stack is not in a collective (the data
  loader, a checkpoint, a lock, a sleep, its own code) while other ranks' stacks are;
- ``stuck_in_nccl``: every stack is in a collective, and this rank's is in another one
  (another call site or another collective) than every other rank's.

The last two are read only where no process is dead or frozen: those explain the stall
by themselves, and the others' stacks are its consequences.

A rank with no stack and no dump among ranks that gave both, or a node that wrote no
folder while the others did, is said as what it is (no answer), never named a culprit
on that alone.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ncclscope.evidence.manifest import Ask, Manifest, read_manifest
from ncclscope.sources import EVIDENCE_KIND, LOG_KINDS, Input, Problem

__all__ = [
    "FROZEN_STATES",
    "Culprit",
    "Evidence",
    "RankView",
    "judge",
    "read_evidence",
    "split_evidence",
]

#: psutil states of a process that cannot move on its own.
FROZEN_STATES = frozenset({"stopped", "disk-sleep", "tracing-stop"})

CulpritKind = Literal["dead_process", "frozen_node", "stuck_outside_nccl", "stuck_in_nccl"]


@dataclass
class RankView:
    """What one rank's process answered, on one node, at one stall."""

    host: str
    rank: int | None
    pid: int | None
    #: psutil state when asked, or ``gone``
    state: str | None = None
    #: ``evidence.stacks`` kind of its main thread (None: no stack)
    stack_kind: str | None = None
    #: the frame that says it, ``train.py:88 in next_batch``
    frame: str | None = None
    #: the collective call site, for stacks in a collective
    call_site: str | None = None
    stack_file: str | None = None
    dump_file: str | None = None
    #: why there is no stack / no dump, as the manifest says
    why: list[str] = field(default_factory=list)

    def label(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"
        return f"{who} ({self.host}" + (f", pid {self.pid})" if self.pid is not None else ")")


@dataclass
class Evidence:
    """Every node's folder for one stall (the newest per node where several)."""

    manifests: list[tuple[Manifest, Path]]
    ranks: list[RankView]
    #: RAS reports and dumps the folders hold (paths), read by their own readers
    ras_files: list[Path] = field(default_factory=list)
    dump_files: list[Path] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)

    @property
    def hosts(self) -> list[str]:
        return sorted({m.host for m, _p in self.manifests})


@dataclass
class Culprit:
    ranks: list[int]
    hosts: list[str]
    kind: CulpritKind
    #: one sentence with the frame or the state
    reason: str
    frame: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)


def read_evidence(manifest_paths: list[Path]) -> Evidence:
    """The folders of ``manifest_paths``; a manifest that cannot be read is a problem,
    not a stop."""
    problems: list[tuple[str, str]] = []
    newest: dict[str, tuple[Manifest, Path]] = {}
    for path in manifest_paths:
        try:
            m = read_manifest(path)
        except ValueError as e:
            problems.append((str(path), str(e)))
            continue
        held = newest.get(m.host)
        if held is None or m.written_utc > held[0].written_utc:
            newest[m.host] = (m, path.parent)
    manifests = sorted(newest.values(), key=lambda mp: mp[0].host)
    ranks: list[RankView] = []
    ras: list[Path] = []
    dumps: list[Path] = []
    for m, folder in manifests:
        views: dict[tuple[int | None, int | None], RankView] = {}
        for a in m.asks:
            if a.what == "ras" and a.file and a.outcome in ("answered", "truncated", "late"):
                ras.append(folder / a.file)
            if a.what not in ("stack", "flight_dump") or (a.rank is None and a.pid is None):
                continue
            key = (a.rank, a.pid)
            v = views.setdefault(key, RankView(host=m.host, rank=a.rank, pid=a.pid))
            if a.state and (v.state is None or a.state == "gone"):
                v.state = a.state
            _take(v, a, folder, dumps, problems)
        ranks += views.values()
    return Evidence(manifests, ranks, ras, dumps, problems)


def _take(
    v: RankView, a: Ask, folder: Path, dumps: list[Path], problems: list[tuple[str, str]]
) -> None:
    usable = a.outcome in ("answered", "late") and a.file is not None
    if a.what == "flight_dump":
        if usable and a.file is not None:
            v.dump_file = a.file
            dumps.append(folder / a.file)
        elif a.why:
            v.why.append(f"no dump: {a.why}")
        return
    if not usable or a.file is None or v.stack_kind not in (None, "unknown"):
        if a.why and not usable:
            v.why.append(f"no stack by {a.via}: {a.why}")
        return
    from ncclscope.evidence.stacks import classify_stack, parse_stacks

    try:
        text = (folder / a.file).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        problems.append((str(folder / a.file), f"cannot read: {e.strerror or e}"))
        return
    threads = parse_stacks(text)
    if not threads:
        v.why.append(f"the stack from {a.via} holds no thread")
        return
    verdict = classify_stack(threads)
    v.stack_kind = str(verdict.kind)
    v.frame = verdict.frame
    v.call_site = _call_site(verdict)
    v.stack_file = a.file


def _call_site(verdict: Any) -> str | None:
    """Which collective, called from where, for a stack in a collective: the user's
    frame and the collective's function (``train.py:40 in step -> all_reduce``)."""
    if str(verdict.kind) != "in_collective" or not verdict.frame:
        return None
    inner = str(verdict.inner or "")
    called = inner.rsplit(" in ", 1)[-1] if " in " in inner else inner
    return f"{verdict.frame} -> {called}" if called else str(verdict.frame)


#: Stack kinds that are not a collective: the rank is busy, or waits, elsewhere.
_OUTSIDE = frozenset({"data_loader", "checkpoint", "lock", "sleep", "io", "compute"})


def judge(ev: Evidence) -> list[Culprit]:
    """The culprits the folders show, most certain kind first (see the module doc)."""
    out: list[Culprit] = []
    blamed: set[tuple[str, int | None, int | None]] = set()

    def add(
        views: list[RankView], kind: CulpritKind, reason: str, frame: str | None = None
    ) -> None:
        for v in views:
            blamed.add((v.host, v.rank, v.pid))
        out.append(
            Culprit(
                ranks=sorted(v.rank for v in views if v.rank is not None),
                hosts=sorted({v.host for v in views}),
                kind=kind,
                reason=reason,
                frame=frame,
                facts={
                    "processes": [
                        {
                            "host": v.host,
                            "rank": v.rank,
                            "pid": v.pid,
                            "state": v.state,
                            "stack": v.stack_kind,
                            "frame": v.frame,
                        }
                        for v in views
                    ]
                },
            )
        )

    by_host: dict[str, list[RankView]] = defaultdict(list)
    for v in ev.ranks:
        by_host[v.host].append(v)
    alive = [v for v in ev.ranks if v.state not in ("gone", "zombie")]
    for v in ev.ranks:
        # Gone while others still wait: it died. Every process gone: the job ended or
        # was torn down before the folders were written, and nobody is to blame here.
        if v.state in ("gone", "zombie") and alive:
            add([v], "dead_process", f"{v.label()}: its process was gone when the agent asked")
    for host, views in sorted(by_host.items()):
        frozen = [v for v in views if v.state in FROZEN_STATES and _free(v, blamed)]
        if not frozen:
            continue
        live = [v for v in views if v.state != "gone"]
        states = ", ".join(sorted({str(v.state) for v in frozen}))
        if len(frozen) == len(live) and len(live) > 1:
            add(frozen, "frozen_node", f"every process of {host} was frozen ({states}) when asked")
        else:
            add(frozen, "frozen_node", f"{_labels(frozen)}: frozen ({states}) when asked")
    if out:
        # A dead or frozen process explains the stall by itself: what the others'
        # stacks show now (an error path, a wait of the launcher's) is its consequence.
        return out
    stacked = [v for v in ev.ranks if v.stack_kind is not None and _free(v, blamed)]
    inside = [v for v in stacked if v.stack_kind == "in_collective"]
    outside = [v for v in stacked if v.stack_kind in _OUTSIDE]
    if inside:
        for v in outside:
            add(
                [v],
                "stuck_outside_nccl",
                f"{v.label()} is not in a collective: its stack is in "
                f"{_KIND_WORDS.get(str(v.stack_kind), str(v.stack_kind))}"
                + (f" ({v.frame})" if v.frame else "")
                + f" while {len(inside)} other rank(s) wait in one",
                v.frame,
            )
    if not out and len(inside) >= 3 and not outside:
        sites = Counter(v.call_site for v in inside if v.call_site)
        if len(sites) > 1:
            common, n_common = sites.most_common(1)[0]
            odd = [v for v in inside if v.call_site and v.call_site != common]
            if n_common >= 2 and odd and len(odd) < n_common:
                for site in sorted({str(v.call_site) for v in odd}):
                    group = [v for v in odd if v.call_site == site]
                    add(
                        group,
                        "stuck_in_nccl",
                        f"{_labels(group)} wait(s) in another collective ({site}) than the "
                        f"{n_common} other ranks ({common})",
                        site,
                    )
    return out


def _free(v: RankView, blamed: set[tuple[str, int | None, int | None]]) -> bool:
    return (v.host, v.rank, v.pid) not in blamed


def _labels(views: list[RankView]) -> str:
    return ", ".join(v.label() for v in views)


_KIND_WORDS = {
    "data_loader": "the data loader",
    "checkpoint": "a checkpoint",
    "lock": "a lock wait",
    "sleep": "a sleep",
    "io": "I/O",
    "compute": "its own code",
}


def silent_hosts(ev: Evidence, log_hosts: list[str]) -> list[str]:
    """Hosts the logs name that wrote no folder while others did (no agent there, or a
    node too frozen for its agent to write)."""
    if not ev.manifests:
        return []
    have = set(ev.hosts)
    return sorted(h for h in log_hosts if h and h not in have)


def split_evidence(
    inputs: list[Input], problems: list[Problem]
) -> tuple[list[Input], Evidence | None, list[str]]:
    """The evidence folders' manifests among ``inputs`` read, and taken out of them (with
    their names, for the report's inputs).  A folder's log tails are the logs where
    nothing else is; beside the logs themselves they are the same lines again, and are
    left out."""
    manifests = [i for i in inputs if i.kind == EVIDENCE_KIND]
    if not manifests:
        return inputs, None, []
    folders = [i.path.parent for i in manifests]

    def tail(i: Input) -> bool:
        return i.path.suffix == ".tail" and any(i.path.parent == f / "logs" for f in folders)

    rest = [i for i in inputs if i.kind != EVIDENCE_KIND]
    if any(i.kind in LOG_KINDS and not tail(i) for i in rest):
        rest = [i for i in rest if not tail(i)]
    evidence = read_evidence([i.path for i in manifests])
    problems.extend(Problem(path, reason) for path, reason in evidence.problems)
    return rest, evidence, [i.display for i in manifests]
