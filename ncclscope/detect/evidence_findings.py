"""The evidence folders' culprits (``evidence.read.judge``) joined to the logs' hangs.

A hang the logs found gets the kind the folders tell (``hang_class``: dead process,
frozen node, stuck outside NCCL with the frame, stuck in another collective) and, where
the logs withheld the culprit, the folders' culprit.  A culprit the logs did not find
(the folder alone was given, or the logs end before the stall) is a finding of its own:
``critical`` for a dead process or a frozen node (it will not come back), ``warning``
for a rank stuck in Python or in another collective (it may still move).
"""

from __future__ import annotations

from typing import Any

from ncclscope.detect.context import Context
from ncclscope.evidence.read import Culprit, Evidence, judge, silent_hosts
from ncclscope.findings import Finding, Severity, ranks_text, severity_at_least

__all__ = ["evidence_summary", "with_evidence"]

_SOURCE = "evidence_folder"


def evidence_summary(ev: Evidence | None) -> dict[str, Any]:
    """JSON-ready (the report's ``evidence``): per node, what was asked and how it ended;
    per process, its state, its stack's kind and frame, and why it gave no stack or
    dump."""
    if ev is None:
        return {"folders": [], "processes": []}
    nodes = []
    for m, folder in ev.manifests:
        outcomes: dict[str, dict[str, int]] = {}
        for a in m.asks:
            by = outcomes.setdefault(a.what, {})
            by[a.outcome] = by.get(a.outcome, 0) + 1
        nodes.append(
            {
                "host": m.host,
                "folder": str(folder),
                "written_utc": m.written_utc,
                "complete": bool(m.stall.get("complete", False)),
                "asks": outcomes,
            }
        )
    processes = [
        {
            "host": v.host,
            "rank": v.rank,
            "pid": v.pid,
            "state": v.state,
            "stack": v.stack_kind,
            "frame": v.frame,
            "stack_file": v.stack_file,
            "dump_file": v.dump_file,
            "why": list(v.why),
        }
        for v in sorted(ev.ranks, key=lambda v: (v.host, v.rank if v.rank is not None else -1))
    ]
    return {"folders": nodes, "processes": processes}


def _facts(c: Culprit, _ev: Evidence) -> dict[str, Any]:
    return {"kind": c.kind, "reason": c.reason, "frame": c.frame, **c.facts}


def with_evidence(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """``findings`` with what the evidence folders show joined in (module doc)."""
    ev = ctx.analysis.evidence
    if ev is None:
        return findings
    culprits = judge(ev)
    out = list(findings)
    hangs = [f for f in out if f.kind == "hang"]
    for c in culprits:
        target = next(
            (f for f in hangs if c.ranks and (not f.ranks or set(c.ranks) <= set(f.ranks))), None
        )
        if target is not None:
            _join(target, c, ev)
            continue
        out.append(
            Finding(
                kind="hang",
                severity=_severity(c),
                message=f"{_WORDS[c.kind]}: {c.reason}",
                ranks=c.ranks,
                hosts=c.hosts,
                evidence={_SOURCE: _facts(c, ev), "culprit_basis": _SOURCE},
                hang_class=c.kind,
            )
        )
    if not culprits and ev.manifests:
        quiet = silent_hosts(ev, list(ctx.analysis.hosts))
        if quiet:
            out.append(
                Finding(
                    kind="hang",
                    severity="info",
                    message=(
                        f"no evidence folder from {', '.join(quiet)} while "
                        f"{len(ev.manifests)} node(s) wrote one: no agent there, or a node "
                        "too frozen for its agent to write (look at it first)"
                    ),
                    evidence={"silent_hosts": quiet, "culprit_basis": "withheld"},
                    hang_class="unknown",
                )
            )
    return out


_WORDS = {
    "dead_process": "a rank's process died",
    "frozen_node": "frozen processes",
    "stuck_outside_nccl": "a rank is stuck outside NCCL (a CPU-side hang)",
    "stuck_in_nccl": "a rank waits in another collective",
}


def _severity(c: Culprit) -> Severity:
    """A process that is gone or frozen will not come back; one stuck may still move."""
    return "critical" if c.kind in ("dead_process", "frozen_node") else "warning"


def _join(f: Finding, c: Culprit, ev: Evidence) -> None:
    f.evidence[_SOURCE] = _facts(c, ev)
    bases = [b for b in f.evidence.get("culprit_bases", []) if b != "withheld"]
    f.evidence["culprit_bases"] = [*bases, _SOURCE]
    if not f.hosts and set(f.ranks) <= set(c.ranks):
        f.hosts = list(c.hosts)  # a dump knows its rank, not its host; the folder does
    if not f.ranks:
        f.ranks = list(c.ranks)
        f.hosts = list(c.hosts)
        f.evidence["culprit_basis"] = _SOURCE
        f.evidence.pop("withheld", None)
        f.message += f"; the evidence folders name rank {ranks_text(c.ranks)}"
    f.message += f"; the evidence folders: {c.reason}"
    f.hang_class = c.kind
    # The folders were taken at a stall past --collect-at: a stop the logs could only
    # suppose ("if the job was stuck") is one the processes' own state shows.
    if not severity_at_least(f.severity, _severity(c)):
        f.severity = _severity(c)
