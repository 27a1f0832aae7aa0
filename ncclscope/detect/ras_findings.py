"""What NCCL's RAS reports say, joined into the hang and mismatch findings.

A RAS report (``ncclras``) is what NVIDIA asks users to run while a job hangs: every
process's view of its communicators, gathered over RAS's own network.  Its dead and
missing processes and ranks are evidence for a hang (``evidence.ras`` of the logs' hang
findings, or a hang finding of its own when the logs show none); a communicator whose
ranks launched different numbers of an op is a mismatch.  Like ``flight_findings``, this
is a hook the hang detector calls on its findings, not a detector of its own.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from ncclscope.detect.base import Finding, ranks_text
from ncclscope.detect.context import Context
from ncclscope.parsers.tools.inspector import normalise_hash

__all__ = ["with_ras"]

_STOPPED = ("dead", "missing", "unresponsive")


def _members(ctx: Context) -> dict[tuple[str, int], int]:
    members = ctx.analysis.identity.members
    if members.is_empty():
        return {}
    rows = (
        members.filter(pl.col("comm_id").is_not_null() & pl.col("rank").is_not_null())
        .select(normalise_hash(pl.col("comm_id")).alias("h"), "comm_rank", "rank")
        .unique()
    )
    return {(h, int(cr)): int(r) for h, cr, r in rows.iter_rows() if cr is not None}


def _row_json(r: dict[str, Any], ranks: dict[tuple[str, int], int]) -> dict[str, Any]:
    g = ranks.get((r["comm_hash"], r["comm_rank"])) if r["comm_hash"] is not None else None
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
    in_comms = sorted(
        {
            f"rank {s['comm_rank']} of {s['communicator']}"
            for s in stopped
            if s["comm_rank"] is not None
        }
    )
    who = (
        f"rank {ranks_text(named)}"
        if named
        else ", ".join(["process " + ", ".join(pids)] * bool(pids) + in_comms)
    )
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
