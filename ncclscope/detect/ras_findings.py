"""What NCCL's RAS reports say, joined into the hang and mismatch findings.

A RAS report (``ncclras``) is what NVIDIA asks users to run while a job hangs: every
process's view of its communicators, gathered over RAS's own network.  Its dead and
missing processes and ranks are evidence for a hang (``evidence.ras`` of the logs' hang
findings, or a hang finding of its own when the logs show none); a communicator whose
ranks launched different numbers of an op is a mismatch.  Like ``flight_findings``, this
is a hook the hang detector calls on its findings, not a detector of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from ncclscope.detect.base import Finding, ranks_text
from ncclscope.detect.context import Context
from ncclscope.parsers.tools.inspector import normalise_hash

__all__ = ["with_ras"]

_STOPPED = ("dead", "missing", "unresponsive")


@dataclass(frozen=True)
class _RankMap:
    """How the logs map what RAS names to a job (global) rank: a communicator's rank by
    its hash, else the process by its pid and GPU (RAS prints the node as an address,
    the logs a host name, so the pid is the key; one that several hosts' logs hold, or
    that drives several ranks without a GPU to tell them apart, maps to none)."""

    by_comm: dict[tuple[str, int], int] = field(default_factory=dict)
    by_pid: dict[int, set[int]] = field(default_factory=dict)
    by_pid_gpu: dict[tuple[int, str], set[int]] = field(default_factory=dict)

    def rank(self, r: dict[str, Any]) -> int | None:
        if r["comm_hash"] is not None and r["comm_rank"] is not None:
            g = self.by_comm.get((r["comm_hash"], r["comm_rank"]))
            if g is not None:
                return g
        pid = r["pid"]
        if pid is None:
            return None
        found = self.by_pid_gpu.get((pid, r["gpu"])) if r["gpu"] else None
        found = found or self.by_pid.get(pid, set())
        return next(iter(found)) if len(found) == 1 else None


def _members(ctx: Context) -> _RankMap:
    members = ctx.analysis.identity.members
    if members.is_empty():
        return _RankMap()
    known = members.filter(pl.col("rank").is_not_null())
    rows = (
        known.filter(pl.col("comm_id").is_not_null())
        .select(normalise_hash(pl.col("comm_id")).alias("h"), "comm_rank", "rank")
        .unique()
    )
    out = _RankMap({(h, int(cr)): int(r) for h, cr, r in rows.iter_rows() if cr is not None})
    hosts: dict[int, set[str]] = {}
    for host, pid, dev, rank in known.select("host", "pid", "cuda_dev", "rank").iter_rows():
        if pid is None:
            continue
        hosts.setdefault(pid, set()).add(host)
        out.by_pid.setdefault(pid, set()).add(rank)
        if dev is not None:
            out.by_pid_gpu.setdefault((pid, str(dev)), set()).add(rank)
    for pid, on in hosts.items():
        if len(on) > 1:  # the same pid on two hosts: the pid alone says nothing
            out.by_pid.pop(pid, None)
            for key in [k for k in out.by_pid_gpu if k[0] == pid]:
                out.by_pid_gpu.pop(key)
    return out


def _row_json(r: dict[str, Any], ranks: _RankMap) -> dict[str, Any]:
    g = ranks.rank(r)
    return {
        "communicator": r["comm_hash"],
        "comm_rank": r["comm_rank"],
        "rank": g,
        "pid": r["pid"],
        "host": r["host"],
        "state": r["state"],
        "detail": r["detail"],
    }


def _comm_of(f: Finding) -> str | None:
    comm = f.evidence.get("communicator")
    if not isinstance(comm, str) or not comm.startswith("0x"):
        return None
    return comm[2:].lower().lstrip("0") or "0"


def with_ras(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """``findings`` with the RAS reports' dead/missing ranks and mismatches joined in."""
    tools = ctx.analysis.tools
    if tools.ras_reports.is_empty() or ctx.analysis.followed_by is not None:
        return findings
    paths = {fid: path for fid, path, _kind, _n in tools.files}
    ranks = _members(ctx)
    out = list(findings)
    for rep in tools.ras_reports.sort("file_id").iter_rows(named=True):
        fid = rep["file_id"]
        rows = tools.ras_ranks.filter(pl.col("file_id") == fid).to_dicts()
        head = {
            "source": "ras",
            "report": paths.get(fid),
            "ts": rep["ts"].isoformat() if rep["ts"] is not None else None,
            "nccl_version": rep["nccl_version"],
        }
        stopped = [_row_json(r, ranks) for r in rows if r["state"] in _STOPPED]
        if stopped:
            _hang(out, head, stopped, rep)
        mism = [_row_json(r, ranks) for r in rows if r["state"] in ("mismatch", "status")]
        if mism:
            _mismatch(out, head, mism)
    return out


def _hang(
    out: list[Finding], head: dict[str, Any], stopped: list[dict[str, Any]], rep: dict[str, Any]
) -> None:
    evidence = {**head, "stopped": stopped}
    comms = {s["communicator"] for s in stopped}
    hangs = [f for f in out if f.kind == "hang" and (None in comms or _comm_of(f) in comms)]
    for f in hangs:
        f.evidence["ras"] = evidence
    if hangs:
        return
    dead = [s for s in stopped if s["state"] == "dead"]
    named = sorted({s["rank"] for s in stopped if s["rank"] is not None})
    pids = sorted({f"{s['pid']} on {s['host']}" for s in stopped if s["pid"] is not None})
    when = f" at {head['ts']}" if head["ts"] else ""
    what = (
        f"{rep['dead_processes'] or len(dead)} process(es) considered dead"
        if dead
        else f"{len(stopped)} rank(s) or process(es) not answering"
    )
    who = _who(stopped, named, pids)
    out.append(
        Finding(
            kind="hang",
            severity="critical" if dead else "warning",
            message=(
                f"NCCL's RAS report{when} ({head['report']}) shows {what}: {who}; "
                "the communicators they belong to cannot complete a collective"
            ),
            ranks=named,
            hosts=sorted({s["host"] for s in stopped if s["host"]}),
            evidence={"ras": evidence, "culprit_basis": "ras", "culprit_bases": ["ras"]},
            hang_class="dead_process" if dead else "missing_rank",
        )
    )


def _one(s: dict[str, Any]) -> str:
    """A stopped rank or process as the report names it, with its host::

    rank 6 (comm rank 6 of 3c9e0b2d4e6f5a10, process 60417 on 10.20.0.12)
    """
    where = [f"comm rank {s['comm_rank']} of {s['communicator']}"] * (s["comm_rank"] is not None)
    if s["pid"] is not None:
        where.append(f"process {s['pid']} on {s['host'] or 'an unknown node'}")
    elif s["host"]:
        where.append(f"on {s['host']}")
    if s["rank"] is not None:
        return f"rank {s['rank']} ({', '.join(where)})" if where else f"rank {s['rank']}"
    return ", ".join(where) or "a process the report could not name"


def _who(stopped: list[dict[str, Any]], named: list[int], pids: list[str]) -> str:
    """Each stopped rank or process once, a job rank first where the logs map it; a
    process that a communicator row names again is not repeated."""
    in_comms = {(s["pid"], s["host"]) for s in stopped if s["comm_rank"] is not None}
    seen: list[str] = []
    for s in sorted(stopped, key=lambda s: (s["rank"] is None, s["rank"] or 0)):
        if s["comm_rank"] is None and s["rank"] is None and (s["pid"], s["host"]) in in_comms:
            continue
        text = _one(s)
        if text not in seen:
            seen.append(text)
    if not seen:
        return f"rank {ranks_text(named)}" if named else "process " + ", ".join(pids)
    more = f" and {len(seen) - 8} more" if len(seen) > 8 else ""
    return "; ".join(seen[:8]) + more


def _mismatch(out: list[Finding], head: dict[str, Any], mism: list[dict[str, Any]]) -> None:
    by_comm: dict[str | None, list[dict[str, Any]]] = {}
    for m in mism:
        by_comm.setdefault(m["communicator"], []).append(m)
    for comm, rows in by_comm.items():
        evidence = {**head, "mismatched": rows}
        logs = [f for f in out if f.kind == "mismatch" and _comm_of(f) == comm]
        if logs:
            logs[0].evidence["ras"] = evidence
            continue
        named = sorted({r["rank"] for r in rows if r["rank"] is not None})
        who = (
            f"rank {ranks_text(named)}"
            if named
            else "comm rank "
            + ranks_text([r["comm_rank"] for r in rows if r["comm_rank"] is not None])
        )
        detail = "; ".join(sorted({r["detail"] for r in rows if r["detail"]}))
        out.append(
            Finding(
                kind="mismatch",
                severity="warning",
                message=(
                    f"NCCL's RAS report ({head['report']}): the ranks of communicator {comm} "
                    f"disagree: {who} {detail or 'differs from the others'}"
                ),
                ranks=named,
                hosts=sorted({r["host"] for r in rows if r["host"]}),
                evidence={"ras": evidence, "communicator": comm},
                hang_class="mismatch",
            )
        )
