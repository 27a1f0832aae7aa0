"""NCCL errors: the root cause of each failure, per host, first seen, with its chain.

Metric: the errors table (one row per WARN with its ``file:line -> N`` chain), grouped
per (host, kind, message shape).  Policy: the first error of the job (by time where the
lines carry one, else by position) is the root cause; errors after it on other hosts
are reported as consequences (a peer's flush error after an IB completion error, a
remote process that exited); benign WARNs (an optional library missing, an IB subnet
manager event) are ``info``.  Sample root cause (2.21)::

    node-2:30412:30561 [1] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion
    from peer 10.0.1.17<54313> with status=12 opcode=0 len=0 vendor err 129 (Send)
"""

from __future__ import annotations

import polars as pl

from ncclscope.detect.base import Finding, LineRef, Severity, register
from ncclscope.detect.context import Context

__all__ = ["NcclErrorDetector"]

#: The errors table's severities as finding severities.
_SEVERITY: dict[str, Severity] = {"error": "critical", "warning": "warning", "info": "info"}


@register
class NcclErrorDetector:
    """Root causes of NCCL failures by kind and host."""

    name = "nccl_errors"

    def metric(self, ctx: Context) -> pl.DataFrame:
        errors = ctx.analysis.errors
        return (
            errors.with_columns(pl.int_range(pl.len()).alias("order"))
            .group_by("host", "kind", "severity", "signature", maintain_order=True)
            .agg(
                pl.col("rank").drop_nulls().unique().sort().alias("ranks"),
                pl.col("message").first(),
                pl.len().alias("count"),
                pl.col("file_id").first(),
                pl.col("line_no").first(),
                pl.col("hint").first(),
                pl.col("chain").first(),
                pl.col("code").first(),
                pl.col("src").first(),
                pl.col("ts").min().alias("first_ts"),
                pl.col("order").min(),
            )
            .sort("first_ts", "order", nulls_last=True)
        )

    def policy(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        out = []
        root = None
        for r in metric.iter_rows(named=True):
            severity = _SEVERITY.get(r["severity"], "warning")
            consequence = False
            if severity == "critical":
                if root is None:
                    root = r
                else:
                    # After the first failure: a consequence unless it is its own host's
                    # first error of another kind before the first one's time.
                    consequence = True
                    severity = "warning"
            where = r["host"] + (
                f" (rank {', '.join(str(x) for x in r['ranks'])})" if r["ranks"] else ""
            )
            prefix = "after the first error, " if consequence else ""
            times = f" ({r['count']} times)" if r["count"] > 1 else ""
            msg = f"{prefix}{r['kind']} on {where}{times}: {r['message']}"
            out.append(
                Finding(
                    kind="nccl_error",
                    severity=severity,
                    message=msg,
                    ranks=list(r["ranks"]),
                    hosts=[r["host"]],
                    evidence={
                        "error_kind": r["kind"],
                        "root_cause": r is root,
                        "count": r["count"],
                        "code": r["code"],
                        "source": r["src"],
                        "chain": list(r["chain"] or []),
                        "hint": r["hint"],
                        "first_seen": r["first_ts"].isoformat() if r["first_ts"] else None,
                    },
                    lines=[LineRef(int(r["file_id"]), int(r["line_no"]))],
                )
            )
        return out
