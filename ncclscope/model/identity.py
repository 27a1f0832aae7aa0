"""Who is who: processes to ranks, communicators matched across ranks (DESIGN §3).

* A process is ``(file_id, host, pid)``: host names repeat across nodes.
* A communicator pointer is unique only inside one process.  Members of one
  communicator are matched across processes by ``commId`` (2.17+); before that by
  (nranks, order of creation in the process), split further when that puts two
  members with the same rank together (e.g. one 8-rank group per host).
* The *world* communicator is the largest one (first created on a tie); a rank in it
  is the global rank.  Processes holding several GPUs map by CUDA device.
* Where a communicator's Init lines were cut away (a log's head lost, a file opened
  late), its member is still named by the lines that remain (``known_from``): the
  ``Init timings`` line NCCL prints right after Init COMPLETE (rank and size, no comm
  pointer: matched to the process's next communicator of that size on COLL lines), or
  its teardown line (``comm 0x55 rank 3 nranks 8 cudaDev 3 busId 4e000 - Destroy
  COMPLETE``; ``Abort``, ``Revoke``).  A teardown line comes after the member's calls,
  so it does not say where they began: where calls are counted in log order (opCount
  constant, 2.27+ single node) such a member's count starts wherever the log does, and
  is no sequence (``ANCHORED``).  ``ended`` says how the member left its communicator.
  The one member of a whole communicator that no line names takes the one rank its
  other members left (``elimination``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import polars as pl

from ncclscope.parsers.nccl.records import LineRecords, ProcKey
from ncclscope.schema import MEMBERS_SCHEMA, RANKS_SCHEMA, validate

__all__ = [
    "ANCHORED",
    "MAX_RANKS",
    "CollOnlyComm",
    "Identity",
    "Member",
    "listable_size",
    "pid_ranks",
    "resolve_identity",
]


@dataclass
class Member:
    """One process's handle on one communicator."""

    proc: ProcKey
    comm: str
    nranks: int
    first_line: int
    comm_rank: int | None = None
    cuda_dev: int | None = None
    nvml_dev: int | None = None
    bus_id: str | None = None
    comm_id: str | None = None
    complete: bool = False
    nnodes: int | None = None
    local_rank: int | None = None
    comm_key: str = ""
    rank: int | None = None  # global rank
    #: what named the member: ``init`` (Init START/COMPLETE), ``init_timings``,
    #: ``teardown`` (Destroy/Abort/Revoke only), ``hint`` (Trees, Ring), ``elimination``
    #: (the one rank its communicator's other members left), ``coll`` (no rank)
    known_from: str = "init"
    #: ``Destroy`` or ``Abort``: the member's ``- Destroy COMPLETE`` / ``- Abort COMPLETE``
    ended: str | None = None


@dataclass(frozen=True)
class CollOnlyComm:
    """A (process, comm pointer) seen only on COLL lines: no init line names its rank."""

    proc: ProcKey
    comm: str
    nranks: int | None  # None: the line was cut before ``[nranks=N]``
    first_line: int


#: More ranks than any job runs (the largest run ~10^5 GPUs).  A communicator or world size
#: above it is a damaged number (``[nranks=2147483647]``): kept as data, never enumerated
#: (a list of the ranks that left no line would hold billions).
MAX_RANKS = 1 << 20


#: A member whose lines in the log start with its communicator (its Init lines, its Init
#: timings, an init-time hint), so that its calls counted in log order are its sequence
#: numbers.  A member named only by its teardown line (or by elimination) may have lost
#: its first calls with the log's head: counted from where the log starts, its calls
#: are no sequence.
ANCHORED = ~pl.col("known_from").is_in(["teardown", "elimination"])


def listable_size(size: int | None) -> bool:
    """A size whose ranks can be listed one by one (``0 < size <= MAX_RANKS``).

    >>> listable_size(8), listable_size(2**31 - 1), listable_size(None)
    (True, False, False)
    """
    return size is not None and 0 < size <= MAX_RANKS


@dataclass
class Identity:
    """The resolved identity tables."""

    members: pl.DataFrame
    ranks: pl.DataFrame
    world_key: str | None
    world_size: int | None
    matched_by: dict[str, str] = field(default_factory=dict)
    nnodes: dict[str, int] = field(default_factory=dict)


def resolve_identity(
    records: LineRecords,
    coll_only: list[CollOnlyComm],
    paths: list[str],
    pid_ranks: dict[tuple[str | None, int], int] | None = None,
) -> Identity:
    """Build members and ranks from init lines, layouts and (as a fallback) teardown
    lines, Init timings and COLL lines.  ``pid_ranks``: job ranks by (host, pid) from
    outside NCCL's lines (torchrun's failure summary: ``rank : 3 (local_rank: 0)`` /
    ``exitcode : -6 (pid: 2436978)``), for processes no init line names."""
    members = _members_from_init(records)
    _members_from_teardown(records, members)
    for extra in coll_only:
        # No ``[nranks=N]``: the line was cut there (an excerpt's last line), and the
        # comm pointer in front of it may be cut too.  Nothing to match it by.
        if extra.nranks is None:
            continue
        member = members.get((extra.proc, extra.comm))
        if member is None:
            members[(extra.proc, extra.comm)] = Member(
                extra.proc, extra.comm, extra.nranks, extra.first_line, known_from="coll"
            )
        elif member.known_from == "teardown":
            # Created where its first call is, not where it was torn down: the order
            # of creation matches communicators across processes.
            member.first_line = min(member.first_line, extra.first_line)
    _members_from_timings(records, members)
    matched_by = _assign_keys(list(members.values()))
    _by_elimination(list(members.values()))
    world_key, world_size = _world(list(members.values()))
    _global_ranks(list(members.values()), world_key, records)
    if pid_ranks:
        _ranks_by_pid(list(members.values()), pid_ranks)
    nnodes = _nnodes(list(members.values()))
    return Identity(
        members=_members_frame(list(members.values())),
        ranks=_ranks_frame(list(members.values()), world_key, paths),
        world_key=world_key,
        world_size=world_size,
        matched_by=matched_by,
        nnodes=nnodes,
    )


def _members_from_init(records: LineRecords) -> dict[tuple[ProcKey, str], Member]:
    members: dict[tuple[ProcKey, str], Member] = {}
    for proc, line_no, ev in records.comm_events:
        if ev.event != "Init":
            continue
        key = (proc, ev.comm)
        member = members.get(key)
        if member is None:
            member = Member(proc, ev.comm, ev.nranks, line_no, comm_rank=ev.rank)
            members[key] = member
        elif member.complete:
            continue  # pointer reused after destroy: keep the first communicator
        member.comm_rank = ev.rank
        member.nranks = ev.nranks
        member.cuda_dev = ev.cuda_dev if ev.cuda_dev is not None else member.cuda_dev
        member.nvml_dev = ev.nvml_dev if ev.nvml_dev is not None else member.nvml_dev
        member.bus_id = ev.bus_id or member.bus_id
        member.comm_id = ev.comm_id or member.comm_id
        member.complete = member.complete or ev.phase == "COMPLETE"
    for proc, layout in records.layouts:
        member = members.get((proc, layout.comm))
        if member is not None:
            member.nnodes = layout.nnodes
            member.local_rank = layout.local_rank
    return members


#: Lifecycle events after a communicator's init: its member is named by them where the
#: Init lines were cut away.  Only a COMPLETE Destroy or Abort ends the member.
_TEARDOWN = frozenset({"Destroy", "Abort", "Revoke"})
_ENDS = frozenset({"Destroy", "Abort"})


def _members_from_teardown(
    records: LineRecords, members: dict[tuple[ProcKey, str], Member]
) -> None:
    """Members whose Init lines are not in the log, from their teardown lines; and how
    every member left its communicator (``ended``).

    Sample (2.12+, INIT subsystem; DESTROY from 2.30.3)::

        node-a:4101:4177 [0] NCCL INFO comm 0x7f00faaa5c00 rank 0 nranks 4 cudaDev 0
        busId 6000 - Abort COMPLETE
    """
    for proc, line_no, ev in records.comm_events:
        if ev.event not in _TEARDOWN or ev.comm == "(nil)":
            continue
        key = (proc, ev.comm)
        member = members.get(key)
        if member is None:
            member = Member(
                proc,
                ev.comm,
                ev.nranks,
                line_no,
                comm_rank=ev.rank,
                cuda_dev=ev.cuda_dev,
                nvml_dev=ev.nvml_dev,
                bus_id=ev.bus_id,
                known_from="teardown",
            )
            members[key] = member
        elif line_no < member.first_line or member.comm_rank != ev.rank:
            continue  # an earlier communicator at that pointer, or another one
        if ev.event in _ENDS and ev.phase == "COMPLETE" and member.ended is None:
            member.ended = ev.event


def _members_from_timings(records: LineRecords, members: dict[tuple[ProcKey, str], Member]) -> None:
    """Ranks from ``Init timings`` for members whose Init lines were cut away.

    Sample (2.23+, INIT|PROFILE)::

        node-a:4101:4101 [0] NCCL INFO Init timings - ncclCommInitRankConfig: rank 3
        nranks 8 total 0.74 (kernels 0.17, alloc 0.03, bootstrap 0.00, ...)

    NCCL prints it right after the communicator's Init COMPLETE, before any call on
    it, and names no pointer: it belongs to a communicator of that size whose first
    call in the same process comes after it.  A member takes its rank where every
    such line before its first call names the same rank (a process may have created
    several communicators of one size before using them), and is then anchored: its
    calls in the log start with the communicator.  A rank that disagrees with the
    member's own teardown line names nothing.
    """
    if not records.init_timings:
        return
    # Per process, in file order: Init COMPLETE lines and Init timings.  A timings line
    # right after an Init COMPLETE of the same rank and size belongs to that member,
    # whose Init lines are in the log: it names no other.
    events: dict[ProcKey, list[tuple[int, int, int, int]]] = defaultdict(list)
    for proc, line_no, ev in records.comm_events:
        if ev.event == "Init" and ev.phase == "COMPLETE":
            events[proc].append((line_no, 0, ev.rank, ev.nranks))
    for proc, line_no, t in records.init_timings:
        events[proc].append((line_no, 1, t.rank, t.nranks))
    by_proc: dict[ProcKey, list[tuple[int, int, int]]] = defaultdict(list)
    for proc, rows in events.items():
        complete: tuple[int, int] | None = None
        for line_no, is_timings, rank, nranks in sorted(rows):
            if not is_timings:
                complete = (rank, nranks)
            elif complete == (rank, nranks):
                complete = None  # the timings of that Init COMPLETE
            else:
                by_proc[proc].append((line_no, rank, nranks))
    for member in members.values():
        if member.known_from not in ("teardown", "coll"):
            continue
        timings = by_proc.get(member.proc)
        if not timings:
            continue
        before = {r for line, r, n in timings if line < member.first_line and n == member.nranks}
        if len(before) != 1:
            continue
        rank = next(iter(before))
        if member.comm_rank is not None and member.comm_rank != rank:
            continue
        member.comm_rank = rank
        member.known_from = "init_timings"


def _assign_keys(members: list[Member]) -> dict[str, str]:
    matched_by: dict[str, str] = {}
    by_proc: dict[ProcKey, list[Member]] = defaultdict(list)
    for member in members:
        if member.comm_id:
            member.comm_key = member.comm_id
            matched_by[member.comm_key] = "commId"
        else:
            by_proc[member.proc].append(member)
    # Without commId: the k-th communicator of size n that a process created.
    base: dict[str, list[Member]] = defaultdict(list)
    for proc_members in by_proc.values():
        seen: Counter[int] = Counter()
        for member in sorted(proc_members, key=lambda m: m.first_line):
            base[f"n{member.nranks}#{seen[member.nranks]}"].append(member)
            seen[member.nranks] += 1
    for key, group in base.items():
        parts = _partition(group)
        for index, part in enumerate(parts):
            part_key = key if len(parts) == 1 else f"{key}/{index}"
            for member in part:
                member.comm_key = part_key
            matched_by[part_key] = "order"
    return matched_by


def _partition(group: list[Member]) -> list[list[Member]]:
    """Split members that cannot be one communicator (a rank twice, or too many)."""
    nranks = group[0].nranks
    ranks = [m.comm_rank for m in group]
    if len(group) <= nranks and len(set(ranks)) == len(ranks):
        return [group]
    parts: list[list[Member]] = []
    for member in sorted(group, key=lambda m: m.proc):
        for part in parts:
            taken = {m.comm_rank for m in part}
            if len(part) < nranks and (member.comm_rank is None or member.comm_rank not in taken):
                part.append(member)
                break
        else:
            parts.append([member])
    return parts


def _by_elimination(members: list[Member]) -> None:
    """The rank of the one member no line names, where all the others of a whole
    communicator are named: ranks 0, 1 and 3 of a 4-rank communicator named by their
    Abort lines leave rank 2 to the fourth process, seen only on COLL lines (it never
    aborted: it was elsewhere while the others timed out).

    Only in a communicator matched as one (not split apart, ``_partition``) that has
    exactly ``nranks`` members, all other ranks distinct: then no other rank is left.
    """
    groups: dict[str, list[Member]] = defaultdict(list)
    for member in members:
        groups[member.comm_key].append(member)
    for key, group in groups.items():
        nranks = group[0].nranks
        if "/" in key or len(group) != nranks or any(m.nranks != nranks for m in group):
            continue
        unnamed = [m for m in group if m.comm_rank is None]
        named = {m.comm_rank for m in group if m.comm_rank is not None}
        if len(unnamed) != 1 or len(named) != nranks - 1:
            continue
        left = set(range(nranks)) - named
        if len(left) == 1:
            unnamed[0].comm_rank = left.pop()
            unnamed[0].known_from = "elimination"


def _world(members: list[Member]) -> tuple[str | None, int | None]:
    if not members:
        return None, None
    stats: dict[str, tuple[int, int, int]] = {}
    for member in members:
        n, seen, first = stats.get(member.comm_key, (member.nranks, 0, member.first_line))
        stats[member.comm_key] = (max(n, member.nranks), seen + 1, min(first, member.first_line))
    key = max(stats, key=lambda k: (stats[k][0], stats[k][1], -stats[k][2]))
    return key, stats[key][0]


def _global_ranks(members: list[Member], world_key: str | None, records: LineRecords) -> None:
    by_dev: dict[ProcKey, dict[int | None, int]] = defaultdict(dict)
    for member in members:
        if member.comm_key == world_key and member.comm_rank is not None:
            member.rank = member.comm_rank
            by_dev[member.proc][member.cuda_dev] = member.comm_rank
    for member in members:
        if member.rank is not None:
            continue
        world = by_dev.get(member.proc)
        if world and len(world) == 1:
            member.rank = next(iter(world.values()))
        elif world and member.cuda_dev in world:
            member.rank = world[member.cuda_dev]
        elif not world and member.comm_rank is None:
            hints = records.rank_hints.get(member.proc)
            if hints and len(hints) == 1:
                member.comm_rank = next(iter(hints))
                member.known_from = "hint"


def pid_ranks(failures: pl.DataFrame) -> dict[tuple[str | None, int], int]:
    """(host, pid) -> job rank from torchrun's failure summary (``FAILURES_SCHEMA``),
    where the summary gives one rank each."""
    rows = failures.select("host", "pid", "rank").drop_nulls(["pid", "rank"]).unique()
    seen: dict[tuple[str | None, int], set[int]] = {}
    for host, pid, rank in rows.iter_rows():
        seen.setdefault((host, int(pid)), set()).add(int(rank))
    return {key: next(iter(r)) for key, r in seen.items() if len(r) == 1}


def _short(host: str | None) -> str | None:
    """``dgx002`` of ``dgx002.cluster.local``: NCCL prints the host name up to its first
    dot, torchelastic may print the full one."""
    return host.split(".", 1)[0] if host else None


def _ranks_by_pid(members: list[Member], pid_ranks: dict[tuple[str | None, int], int]) -> None:
    """The job rank of each process no NCCL line names, where the launcher's summary
    gives its pid (the worker process is the one that calls NCCL): on its host, or, where
    the summary names no host, by a pid no other host's process has."""
    by_host = {(_short(h), p): r for (h, p), r in pid_ranks.items() if h is not None}
    bare = {p: r for (h, p), r in pid_ranks.items() if h is None}
    hosts_of_pid: dict[int, set[str]] = defaultdict(set)
    for member in members:
        hosts_of_pid[member.proc[2]].add(member.proc[1])
    for member in members:
        if member.rank is not None:
            continue
        _file, host, pid = member.proc
        rank = by_host.get((_short(host), pid))
        if rank is None and pid in bare and len(hosts_of_pid[pid]) == 1:
            rank = bare[pid]
        if rank is not None:
            member.rank = rank


def _nnodes(members: list[Member]) -> dict[str, int]:
    hosts: dict[str, set[str]] = defaultdict(set)
    logged: dict[str, int] = {}
    for member in members:
        hosts[member.comm_key].add(member.proc[1])
        if member.nnodes is not None:
            logged[member.comm_key] = max(logged.get(member.comm_key, 0), member.nnodes)
    # NCCL's own count beats host names, which can collide across nodes.
    return {key: logged.get(key, len(names)) for key, names in hosts.items()}


def _members_frame(members: list[Member]) -> pl.DataFrame:
    rows = [
        {
            "file_id": m.proc[0],
            "host": m.proc[1],
            "pid": m.proc[2],
            "comm": m.comm,
            "comm_key": m.comm_key,
            "comm_id": m.comm_id,
            "comm_rank": m.comm_rank,
            "nranks": m.nranks,
            "cuda_dev": m.cuda_dev,
            "nvml_dev": m.nvml_dev,
            "bus_id": m.bus_id,
            "complete": m.complete,
            "line_no": m.first_line,
            "rank": m.rank,
            "known_from": m.known_from,
            "ended": m.ended,
        }
        for m in members
    ]
    frame = pl.DataFrame(rows, schema=MEMBERS_SCHEMA)
    frame = frame.sort("comm_key", "comm_rank", "file_id", "host", "pid", nulls_last=True)
    return validate(frame, MEMBERS_SCHEMA, "members")


def _ranks_frame(members: list[Member], world_key: str | None, paths: list[str]) -> pl.DataFrame:
    rows = []
    world = [m for m in members if m.comm_key == world_key and m.comm_rank is not None]
    local_by_host: dict[str, int] = Counter()
    for member in sorted(world, key=lambda m: m.comm_rank or 0):
        local = member.local_rank
        if local is None:
            local = local_by_host[member.proc[1]]
        local_by_host[member.proc[1]] += 1
        rows.append(
            {
                "rank": member.comm_rank,
                "host": member.proc[1],
                "pid": member.proc[2],
                "path": paths[member.proc[0]],
                "cuda_dev": member.cuda_dev,
                "nvml_dev": member.nvml_dev,
                "bus_id": member.bus_id,
                "local_rank": local,
            }
        )
    return validate(pl.DataFrame(rows, schema=RANKS_SCHEMA), RANKS_SCHEMA, "ranks")
