"""Findings from the Flight Recorder's dumps, and how they join what the logs found.

The hang detector hands its findings to ``with_flight``: a stop or a mismatch the dumps
show is told once.  Where the logs already tell it (the same communicator, or the one
hang of the job), the dumps' reading joins that finding as evidence, and names the
culprit where the logs could not (who never enqueued the collective is direct
evidence); elsewhere it is a finding of its own.  A member that left no dump while
its group waits is named as likely dead or stuck; where several members are
unaccounted for, nobody is.  A stop whose missing ranks wait inside another group's
collective follows from that one, whichever its waiters entered first.
``wait_findings`` gives the straggler detector the ranks the dumps' enqueue times show
late.

Severity follows the stop's evidence as for the logs: the job's own lines (a watchdog,
a launcher's failure summary) make it critical; dumps alone make it a warning (PyTorch
dumps on a timeout, but a dump taken on demand from a running job looks the same); logs
that show no stop leave it at info, naming nobody.
"""

from __future__ import annotations

import statistics
from typing import Any

import polars as pl

from ncclscope.detect.base import Finding, Severity, duration_text, ranks_text
from ncclscope.detect.context import Context
from ncclscope.detect.flight import (
    FlightMismatch,
    FlightStop,
    apart_runs,
    flight_mismatches,
    flight_stops,
    flight_waits,
    pg_desc,
)
from ncclscope.detect.lateness import MIN_EXCESS_S, MIN_INSTANCES, MIN_SLOWDOWN, MIN_Z
from ncclscope.detect.watchdog import GAP_MULTIPLE, stop_evidence

__all__ = ["wait_findings", "with_flight"]

_SOURCE = "flight_recorder"


def _label(pg: str, desc: str | None) -> str:
    return f"process group {pg}" + (f" ({desc})" if desc and desc != pg else "")


def _joined_comm(ctx: Context, pg: str) -> str | None:
    joined = ctx.analysis.flight.pg_comms.filter(
        (pl.col("pg_name") == pg) & pl.col("comm_key").is_not_null()
    )
    return str(joined["comm_key"][0]) if len(joined) else None


def _paths(ctx: Context, file_ids: list[int]) -> list[str]:
    paths = ctx.analysis.paths
    return [paths[k] for k in file_ids if 0 <= k < len(paths)]


def _stop_json(ctx: Context, s: FlightStop) -> dict[str, Any]:
    return {
        "source": _SOURCE,
        "pg": s.pg_name,
        "pg_desc": s.pg_desc,
        "collective_seq_id": s.seq,
        "op": s.op,
        "waiting_ranks": s.waiting,
        # a member with no dump: whether it enqueued the collective is not known
        "never_enqueued": [] if s.never_started or s.no_dump else s.culprits,
        "no_dump": s.no_dump,
        "never_started": s.culprits if s.never_started else [],
        "last_enqueued": {str(r): n for r, n in sorted(s.last.items())},
        "in_flight_at_dump": s.in_flight,
        "dumps": _paths(ctx, s.file_ids),
    }


def _mismatch_json(ctx: Context, m: FlightMismatch) -> dict[str, Any]:
    return {
        "source": _SOURCE,
        "pg": m.pg_name,
        "pg_desc": m.pg_desc,
        "collective_seq_id": m.seq,
        "expected": (
            None
            if m.majority is None
            else {"op": m.majority[0], "elements": m.majority[1], "dtype": m.majority[2]}
        ),
        "calls": [
            {"rank": r, "op": c[0], "elements": c[1], "dtype": c[2]}
            for r, c in sorted(m.calls.items())
        ],
        "dumps": _paths(ctx, m.file_ids),
    }


def _call(c: tuple[str, int, str]) -> str:
    return f"{c[0]} of {c[1]:,} {c[2]}"


def _mismatch_finding(ctx: Context, m: FlightMismatch) -> Finding:
    where = f"collective #{m.seq} of {_label(m.pg_name, m.pg_desc)}"
    if m.majority is not None:
        theirs = m.calls[m.culprits[0]]
        msg = (
            f"rank {ranks_text(m.culprits)} called {_call(theirs)} where the others called "
            f"{_call(m.majority)} at {where} (Flight Recorder)"
        )
    else:
        shapes = "; ".join(f"rank {r}: {_call(c)}" for r, c in sorted(m.calls.items()))
        msg = f"the members called different collectives at {where} ({shapes}; Flight Recorder)"
    return Finding(
        kind="mismatch",
        severity="critical" if m.culprits else "warning",
        message=msg,
        ranks=m.culprits,
        op=m.majority[0] if m.majority else None,
        seq=m.seq,
        evidence={
            "flight_recorder": _mismatch_json(ctx, m),
            "culprit_basis": _SOURCE if m.culprits else "withheld",
            "culprit_bases": [_SOURCE] if m.culprits else ["withheld"],
            **({} if m.culprits else {"withheld": "no call is a strict majority"}),
        },
        hang_class="mismatch",
    )


def _stop_severity(ctx: Context) -> tuple[Severity, list[str]]:
    ev = stop_evidence(ctx)
    if ev.direct:
        return "critical", ev.kinds
    if not ctx.analysis.sources:  # the dumps alone
        return "warning", ev.kinds
    return "info", ev.kinds


def _stop_finding(ctx: Context, s: FlightStop) -> Finding:
    severity, kinds = _stop_severity(ctx)
    op = s.op or "the collective"
    where = f"{op} #{s.seq} of {_label(s.pg_name, s.pg_desc)}"
    evidence: dict[str, Any] = {"flight_recorder": _stop_json(ctx, s), "stop_evidence": kinds}
    if s.withheld is not None:
        gone = f"; rank {ranks_text(s.no_dump)} left no dump" if s.no_dump else ""
        msg = (
            f"rank {ranks_text(s.waiting)} waited in {where}, and not every member is "
            f"accounted for{gone}: {s.withheld} (Flight Recorder)"
        )
        evidence.update(
            {"culprit_basis": "withheld", "culprit_bases": ["withheld"], "withheld": s.withheld}
        )
        ranks: list[int] = []
    elif severity == "info":
        behind = (
            "its GPU had not started it"
            if s.never_started
            else "left no dump"
            if s.no_dump
            else "had not"
        )
        msg = (
            f"the Flight Recorder dumps stop apart, but the logs show no stop: "
            f"{len(s.waiting)} rank(s) had entered {where} and rank "
            f"{ranks_text(s.culprits)} {behind}; if the job was stuck there, it waited for "
            f"rank {ranks_text(s.culprits)}"
        )
        evidence.update(
            {"waited_for": s.culprits, "culprit_basis": "withheld", "culprit_bases": ["withheld"]}
        )
        evidence["withheld"] = "the logs show no stop"
        ranks = []
    elif s.never_started:
        msg = (
            f"rank {ranks_text(s.culprits)} enqueued {where} but its GPU never started it, "
            f"while rank {ranks_text(s.waiting)} started it and waited (Flight Recorder "
            "states): its stream was still busy before it"
        )
    elif s.no_dump:
        msg = (
            f"rank {ranks_text(s.culprits)} left no Flight Recorder dump while rank "
            f"{ranks_text(s.waiting)} waited in {where}: likely dead, or stuck where even "
            "its watchdog could not dump"
        )
    else:
        msg = (
            f"rank {ranks_text(s.culprits)} never enqueued {where}, which rank "
            f"{ranks_text(s.waiting)} entered and waited in (Flight Recorder)"
        )
    if severity != "info" and s.withheld is None:
        evidence.update({"culprit_basis": _SOURCE, "culprit_bases": [_SOURCE]})
        ranks = s.culprits
    return Finding(
        kind="hang",
        severity=severity,
        message=msg,
        ranks=ranks,
        op=s.op,
        seq=s.seq,
        evidence=evidence,
        hang_class="missing_rank" if ranks else "unknown",
    )


def _follows(ctx: Context, s: FlightStop, root: FlightStop) -> Finding:
    """A stop that follows from an earlier one: told, blaming nobody."""
    where = f"{s.op or 'the collective'} #{s.seq} of {_label(s.pg_name, s.pg_desc)}"
    first = f"{root.op or 'the collective'} #{root.seq} of {_label(root.pg_name, root.pg_desc)}"
    return Finding(
        kind="hang",
        severity="info",
        message=(
            f"rank {ranks_text(s.waiting)} then waited in {where}, which rank "
            f"{ranks_text(s.culprits)} never enqueued: they were stuck in {first} "
            "(Flight Recorder)"
        ),
        op=s.op,
        seq=s.seq,
        evidence={
            "flight_recorder": _stop_json(ctx, s),
            "follows_from": {"pg": root.pg_name, "collective_seq_id": root.seq},
            "culprit_basis": "withheld",
            "culprit_bases": ["withheld"],
            "withheld": "a consequence of an earlier stop",
        },
        hang_class="unknown",
    )


def _join(found: Finding, extra: Finding) -> None:
    """``extra`` (the dumps' reading) into ``found`` (the logs'): its evidence, and its
    culprit where the logs named none or another."""
    found.evidence["flight_recorder"] = extra.evidence["flight_recorder"]
    if not extra.ranks:
        return
    bases = [b for b in found.evidence.get("culprit_bases", []) if b != "withheld"]
    if sorted(found.ranks) == sorted(extra.ranks):
        found.evidence["culprit_bases"] = [*bases, _SOURCE]
        return
    if found.ranks:
        found.evidence["logs_named"] = sorted(found.ranks)
    found.ranks = sorted(extra.ranks)
    found.hosts = []
    found.evidence["culprit_basis"] = _SOURCE
    found.evidence["culprit_bases"] = [_SOURCE]
    found.evidence.pop("withheld", None)
    found.message += f"; the Flight Recorder dumps name rank {ranks_text(extra.ranks)}"
    if extra.severity == "critical" or found.severity == "critical":
        found.severity = "critical"
    elif found.severity == "info":
        found.severity = extra.severity
    if found.hang_class in (None, "unknown"):
        found.hang_class = extra.hang_class


def _same_event(ctx: Context, f: Finding, pg: str, kind: str, n_events: int) -> bool:
    if f.kind != kind:
        return False
    comm = _joined_comm(ctx, pg)
    if comm is not None and f.evidence.get("communicator") == comm:
        return True
    # A hang told from PyTorch's lines or the logs' only one: the dumps' only one is it.
    return n_events == 1


def _stuck_in(s: FlightStop, other: FlightStop) -> bool:
    """Whether ``s`` follows from ``other``: its missing ranks are ``other``'s, some of
    them waiting inside ``other``'s collective (they could not enter ``s``'s)."""
    mine = set(s.culprits) | set(s.no_dump)
    return bool(mine & set(other.waiting)) and mine <= (
        set(other.culprits) | set(other.unaccounted) | set(other.waiting)
    )


def _roots_first(stops: list[FlightStop]) -> list[FlightStop]:
    """The stops (in ``flight_stops``'s order, by when their waiters entered) with those
    that follow from another last: a group whose members stopped in another group's
    collective first is its consequence, whichever its members entered first."""
    follows = [
        any(j != i and _stuck_in(s, o) for j, o in enumerate(stops)) for i, s in enumerate(stops)
    ]
    if all(follows):
        return stops  # each waits on another: the clock decides
    return [s for s, f in zip(stops, follows, strict=True) if not f] + [
        s for s, f in zip(stops, follows, strict=True) if f
    ]


def with_flight(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """``findings`` (the logs' hangs and mismatches) with what the dumps show joined in."""
    apart = apart_runs(ctx)
    if apart is not None:
        # Ranks of two runs compared with each other would blame whoever is behind.
        seq, spread = apart
        return [
            *findings,
            Finding(
                kind="config",
                severity="info",
                message=(
                    f"the Flight Recorder dumps do not come from one run (ranks entered "
                    f"collective #{seq} {duration_text(spread)} apart, more than its "
                    "timeout): they are not used to name culprits; give one run's dumps"
                ),
                evidence={"source": _SOURCE, "collective_seq_id": seq, "spread_s": spread},
            ),
        ]
    mismatches = flight_mismatches(ctx)
    out = list(findings)
    for m in mismatches:
        extra = _mismatch_finding(ctx, m)
        logs = [f for f in out if _same_event(ctx, f, m.pg_name, "mismatch", len(mismatches))]
        if logs:
            _join(logs[0], extra)
        else:
            out.append(extra)
    first_mismatch = {m.pg_name: m.seq for m in mismatches}
    # A group whose members called different collectives falls out of step there: what
    # stops after it follows from the mismatch.
    stops = _roots_first(
        [s for s in flight_stops(ctx) if first_mismatch.get(s.pg_name, s.seq + 1) > s.seq]
    )
    # The group that stopped first is the story (``flight_stops`` orders them by when
    # their waiters entered): a later stop whose missing ranks were all stuck in it
    # (its culprits or its waiters) follows from it.
    root: FlightStop | None = None
    for s in stops:
        if root is not None and (
            set(s.culprits) <= set(root.culprits) | set(root.waiting) or _stuck_in(s, root)
        ):
            out.append(_follows(ctx, s, root))
            continue
        root = root or s
        extra = _stop_finding(ctx, s)
        logs = [f for f in out if _same_event(ctx, f, s.pg_name, "hang", len(stops))]
        if logs:
            _join(logs[0], extra)
        else:
            out.append(extra)
    return out


def wait_findings(ctx: Context, named: set[int]) -> list[Finding]:
    """Ranks the dumps' enqueue times show late (those in ``named`` left out: the logs
    already told them): one that came last far more often than chance over at least
    ``MIN_INSTANCES`` collectives, and pauses where the others waited for one rank far
    longer than the group's usual gap between collectives."""
    if apart_runs(ctx) is not None:
        return []  # told by ``with_flight``: enqueue times of two runs say nothing
    waits = flight_waits(ctx)
    out: list[Finding] = []
    for (pg,), g in waits.partition_by("pg_name", as_dict=True, maintain_order=True).items():
        g = g.sort("collective_seq_id")
        gaps = g["ts_first"].diff().dt.total_microseconds().drop_nulls() / 1e6
        gap_s = float(statistics.median(gaps.to_list())) if len(gaps) else 0.0
        label = _label(str(pg), pg_desc(ctx, str(pg)))
        out += _persistent(g, str(pg), label, gap_s, named, _one_clock(ctx, g))
        out += _pauses(g, str(pg), label, gap_s, named)
    return out


def _one_clock(ctx: Context, g: pl.DataFrame) -> bool:
    """Whether every rank of the group is known to run on one host: then its enqueue
    times share one clock.  Across hosts (or hosts unknown) a clock offset reads the
    same as a late rank, constant collective after collective."""
    dumps = ctx.analysis.flight.dumps["rank"].drop_nulls().unique()
    hosts = ctx.analysis.identity.ranks.filter(pl.col("rank").is_in(dumps.implode()))
    return len(hosts) == len(dumps) and hosts["host"].n_unique() == 1 and len(g) > 0


def _persistent(
    g: pl.DataFrame, pg: str, label: str, gap_s: float, named: set[int], one_clock: bool
) -> list[Finding]:
    n = len(g)
    members = len(g) and int(g["members"][0])
    if n < MIN_INSTANCES or members < 2:
        return []
    p = 1.0 / members
    out = []
    for (rank,), r in g.partition_by("last_rank", as_dict=True).items():
        if rank is None or int(rank) in named:
            continue
        k = len(r)
        z = (k - n * p) / (n * p * (1 - p)) ** 0.5
        median_wait = float(statistics.median(r["wait_s"].to_list()))
        if z < MIN_Z or median_wait < max(MIN_SLOWDOWN * gap_s, MIN_EXCESS_S):
            continue
        clock = "" if one_clock else (
            "; its host's clock may be ahead instead (the ranks are not known to share a "
            "host): check `chronyc tracking`"
        )  # fmt: skip
        out.append(
            Finding(
                kind="straggler",
                severity="warning" if one_clock else "info",
                message=(
                    f"rank {rank} enqueued last at {k} of {n} collectives of {label}, "
                    f"a median {duration_text(median_wait)} after the next-to-last rank "
                    f"(Flight Recorder enqueue times){clock}"
                ),
                ranks=[int(rank)],
                evidence={
                    "source": _SOURCE,
                    "pg": pg,
                    "last_at": k,
                    "collectives": n,
                    "median_wait_s": round(median_wait, 6),
                    "gap_s": round(gap_s, 6),
                    "clock": "one host"
                    if one_clock
                    else "each process's CPU clock: "
                    "ranks on different or unknown hosts also compare the hosts' clocks",
                },
            )
        )
    return out


def _pauses(g: pl.DataFrame, pg: str, label: str, gap_s: float, named: set[int]) -> list[Finding]:
    waits = g["wait_s"].to_list()
    if len(waits) < 2:
        return []
    centre = statistics.median(waits)
    spread = 1.4826 * statistics.median(abs(w - centre) for w in waits)
    bound = max(GAP_MULTIPLE * gap_s, centre + MIN_Z * spread, MIN_EXCESS_S)
    long = g.filter((pl.col("wait_s") >= bound) & pl.col("last_rank").is_not_null())
    long = long.filter(~pl.col("last_rank").is_in(sorted(named)))
    if long.is_empty():
        return []
    ts = g["ts_first"].drop_nulls().sort()
    span_s = (ts[-1] - ts[0]).total_seconds() if len(ts) else 0.0
    total = float(long["wait_s"].sum())
    ranks = sorted({int(r) for r in long["last_rank"]})
    top = long.sort("wait_s", descending=True).head(3)
    events = "; ".join(
        f"{duration_text(float(r['wait_s']))} at {r['op'] or 'a collective'} "
        f"#{r['collective_seq_id']} for rank {r['last_rank']}"
        for r in top.iter_rows(named=True)
    )
    return [
        Finding(
            kind="straggler",
            severity="warning" if span_s and total >= MIN_SLOWDOWN * span_s else "info",
            message=(
                f"the other ranks of {label} waited for rank {ranks_text(ranks)}: {events} "
                f"(Flight Recorder enqueue times; usual gap between collectives "
                f"{duration_text(gap_s)})"
            ),
            ranks=ranks,
            op=str(top["op"][0]) if top["op"][0] is not None else None,
            seq=int(top["collective_seq_id"][0]),
            evidence={
                "source": _SOURCE,
                "pg": pg,
                "pauses": [
                    {
                        "collective_seq_id": int(r["collective_seq_id"]),
                        "op": r["op"],
                        "rank": int(r["last_rank"]),
                        "wait_s": round(float(r["wait_s"]), 6),
                    }
                    for r in long.iter_rows(named=True)
                ],
                "wait_s": round(total, 6),
                "span_s": round(span_s, 6),
                "bound_s": round(bound, 6),
                "gap_s": round(gap_s, 6),
                "clock": "each process's CPU clock: ranks on different hosts also "
                "compare the hosts' clocks",
            },
        )
    ]
