"""Stragglers: the rank or the node every collective waits for, all along or for a while.

NCCL logs a COLL line when the call is enqueued, so with sub-second timestamps on those
lines a rank's arrival at each collective instance is known.  Three comparisons:

* **A rank against its own host's members** (hosts of at least 2 members): its median
  lateness over the host's typical member's (of two, the earlier's), at the instances
  its whole host logged.  One clock: offsets cancel, the lateness is real (``cause``
  ``slow``), and no other host's cut or late start enters.
* **A host against the other hosts**: per instance every member logged, each host's
  median arrival against the median host's (the other host's when there are two), so a
  node whose ranks are all late is named as a node, and a host of one rank is a host
  like the others.  A host is a slow node only when its ranks are late together (its
  first member too): one late rank of a small host is that rank, not the node.  Hosts'
  clocks differ (NTP: milliseconds; a broken one: seconds), so a constant shift is
  either a clock or a constant delay.  What does not read the clocks decides: in a log
  merged as lines were written (one launcher reading every worker's pipe) a late host's
  lines come *after* the others', a host whose clock is ahead only prints later times on
  lines that sit among theirs (``order_after``); a lateness that comes and goes is not a
  clock.  Where nothing tells (separate files, a constant shift) the finding says both
  and what to check (``chronyc tracking``), as ``info`` within what NTP drifts.  Two
  hosts mirror each other (one's spell is the other's rest of the run): the spell whose
  lateness grows with the compute gap is the slow one; where none does, neither is
  blamed (``cause`` ``slow_unattributed``, ``info``).
* **A unit against itself in time**: the stretch of collectives over which its lateness
  stood highest above its baseline (a CUSUM-like search with half the minimum effect as
  allowance, kept when its median exceeds the rest's by the minimum effect and stands
  ``MIN_Z`` robust standard errors above the noise), with its start, end and cost.

The metric and the windows are in ``detect/lateness.py``, the hosts' comparison and the
clock-or-slow decision in ``detect/straggler_hosts.py``; this module is the detector:
its metric, and the policy over ranks within their host.

Every threshold is a minimum effect (``MIN_SLOWDOWN`` of the gap between collectives,
``MIN_EXCESS_S``) and a noise bound (robust z from the median absolute deviation).

Sample: rank 5's lines come ~4 ms after the others' at every instance::

    [default0]:[2025-03-14 09:00:31.120001] node-0:41230:41230 [0] NCCL INFO AllGather: ...
    [default5]:[2025-03-14 09:00:31.124310] node-0:41235:41235 [5] NCCL INFO AllGather: ...
"""

from __future__ import annotations

import statistics
from typing import Any

import polars as pl

from ncclscope.detect.base import (
    Finding,
    LineRef,
    duration_text,
    register,
)
from ncclscope.detect.context import Context
from ncclscope.detect.flight_findings import wait_findings
from ncclscope.detect.lateness import (
    CRITICAL_SLOWDOWN,
    MIN_EXCESS_S,
    MIN_INSTANCES,
    MIN_SLOWDOWN,
    MIN_WINDOW,
    MIN_Z,
    WHOLE_RUN,
    Window,
    find_window,
    lateness,
    may_hold_spell,
    quantile,
    window_evidence,
    with_lateness,
    within_host_rows,
)
from ncclscope.detect.straggler_hosts import host_findings

__all__ = ["MIN_SLOWDOWN", "StragglerDetector", "Window", "find_window", "lateness"]

#: A host's own typical lateness is used when it holds at least this many members.
_HOST_BASELINE_MEMBERS = 3


@register
class StragglerDetector:
    """Ranks and nodes that arrive late at collective after collective, or for a while."""

    name = "straggler"

    def metric(self, ctx: Context) -> pl.DataFrame:
        return lateness(ctx)

    def policy(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        found = [] if metric.is_empty() else self._ranks(metric, ctx) + host_findings(metric, ctx)
        # The Flight Recorder's enqueue times: ranks the logs could not time, or did not name.
        named = {r for f in found for r in f.ranks}
        return found + wait_findings(ctx, named)

    # ---- ranks within their host (one clock: offsets cancel) -------------------------

    def _ranks(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        rows = within_host_rows(ctx)
        if rows.is_empty():
            return []
        per = rows.group_by("comm_key", "comm_rank").agg(
            pl.col("rank").first(),
            pl.col("host").first(),
            pl.len().alias("instances"),
            pl.col("hlate").median().alias("h_median_s"),
            pl.col("hlate").mean().alias("h_mean_s"),
            pl.col("k").max().alias("host_members"),
            pl.col("file_id").first(),
            pl.col("line_no").min(),
        )
        comms = metric.group_by("comm_key").agg(pl.col("gap_s").first(), pl.col("members").max())
        whole = metric.select("comm_key", "comm_rank", "median_s", "p95_s", "last")
        # A host's typical member: its median one where it has a median member; of two,
        # the earlier (a single late rank must not drag the baseline halfway to itself).
        typical = (
            pl.when(pl.col("host_members") >= _HOST_BASELINE_MEMBERS)
            .then(pl.col("h_median_s").median().over("comm_key", "host"))
            .otherwise(pl.col("h_median_s").min().over("comm_key", "host"))
        )
        ranked = (
            per.filter(pl.col("instances") >= MIN_INSTANCES)
            .join(comms, on="comm_key")
            .join(whole, on=["comm_key", "comm_rank"], how="left")
            .with_columns(typical.alias("typical"))
        )
        # How far members' medians stray from their own host's typical one.
        spread = pl.col("excess_s").abs().median().over("comm_key") * 1.4826
        scored = ranked.with_columns(
            (pl.col("h_median_s") - pl.col("typical")).alias("excess_s"),
            (pl.col("h_mean_s") - pl.col("typical")).clip(lower_bound=0).alias("mean_excess_s"),
        ).with_columns(spread.alias("spread_s"))
        flagged = scored.filter(
            (pl.col("excess_s") >= MIN_SLOWDOWN * pl.col("gap_s"))
            & (pl.col("excess_s") >= MIN_EXCESS_S)
            & (pl.col("excess_s") >= MIN_Z * pl.col("spread_s"))
        )
        series = self._rank_series(rows, scored, set(flagged["rank"].drop_nulls().to_list()))
        out: list[Finding] = []
        seen: set[int] = set()
        # The largest communicator first: a straggler is late on every communicator it is
        # in, and the world one says most.
        order = flagged.sort(["members", "excess_s"], descending=[True, True])
        for r in order.iter_rows(named=True):
            who = r["rank"] if r["rank"] is not None else r["comm_rank"]
            if who in seen:
                continue
            seen.add(who)
            out.append(self._rank_finding(ctx, r, who, series.get((r["comm_key"], who))))
        out += self._rank_spells(ctx, scored, series, seen)
        return out

    def _rank_series(
        self, rows: pl.DataFrame, scored: pl.DataFrame, flagged: set[int]
    ) -> dict[tuple[str, int], tuple[list[float], pl.Series]]:
        """Per (communicator, rank) of the largest communicator: its lateness over its
        host's typical member, instance after instance, and the instances' times.  Only
        the flagged ranks and those that could hold a window: at least half a window's
        instances ``effect`` above their lower decile (a window's median is that high)."""
        if scored.is_empty():
            return {}
        top = scored.sort("members", descending=True)["comm_key"][0]
        rows = rows.filter(pl.col("comm_key") == top).join(
            scored.filter(pl.col("comm_key") == top).select("comm_rank"), on="comm_rank"
        )
        gap = scored.filter(pl.col("comm_key") == top)["gap_s"].max()
        effect = max(MIN_SLOWDOWN * (gap if isinstance(gap, float) else 0.0), MIN_EXCESS_S)
        x = pl.col("x")
        # The same baseline as the ranks' medians: a host's median member, or of two
        # the earlier (``hlate`` already counts from it).
        base = (
            pl.when(pl.col("k") >= _HOST_BASELINE_MEMBERS)
            .then(pl.col("hlate").median().over("seq", "host"))
            .otherwise(0.0)
        )
        rows = rows.select("rank", "seq", "ts_first", (pl.col("hlate") - base).alias("x"))
        # Which ranks to keep, decided per rank (a group-by, no window over every row),
        # so that only their rows are sorted and turned into lists.
        kept = (
            rows.group_by("rank")
            .agg(
                (
                    ((x >= x.quantile(0.1) + effect).sum() >= MIN_WINDOW // 2)
                    & may_hold_spell(x.sort_by("seq"), effect)
                ).alias("keep")
            )
            .filter(pl.col("keep") & pl.col("rank").is_not_null())["rank"]
            .to_list()
        )
        keep = sorted(set(kept) | flagged)
        rows = rows.filter(pl.col("rank").is_in(pl.Series(keep, dtype=pl.Int32).implode())).sort(
            "rank", "seq"
        )
        out: dict[tuple[str, int], tuple[list[float], pl.Series]] = {}
        # The times stay a Series: a window reads two of them, and turning thousands of
        # datetimes per rank into Python objects costs more than the search.
        for (rank,), g in rows.partition_by("rank", as_dict=True, maintain_order=True).items():
            if rank is None:
                continue
            out[(top, int(rank))] = (g["x"].to_list(), g["ts_first"])
        return out

    def _rank_finding(
        self,
        ctx: Context,
        r: dict[str, Any],
        who: int,
        series: tuple[list[float], pl.Series] | None,
    ) -> Finding:
        slowdown = r["excess_s"] / r["gap_s"] if r["gap_s"] else None
        cost = r["mean_excess_s"] * r["instances"] * max(0, r["members"] - 1)
        ops = self._per_op(ctx, r["comm_key"], r["comm_rank"])
        base_who = (
            "its host's typical rank"
            if r["host_members"] >= _HOST_BASELINE_MEMBERS
            else "its host's other rank"
        )
        msg = (
            f"rank {who} on {r['host']} arrives late at collectives: median "
            f"{duration_text(r['excess_s'])} after {base_who}, over {r['instances']:,} "
            f"collectives its whole host logged"
            + (f", {slowdown:.0%} of the gap between collectives" if slowdown else "")
        )
        whole = r["median_s"] is not None
        if whole and r["last"] is not None and r["p95_s"] is not None:
            # Against every member (instances every member logged): what it makes them wait.
            msg += (
                f"; by the timestamps (which carry the hosts' clocks), "
                f"{duration_text(r['median_s'])} after the first rank of all (p95 "
                f"{duration_text(r['p95_s'])}), last at {r['last']:,} of them"
            )
        evidence: dict[str, Any] = {
            "communicator": r["comm_key"],
            "instances": r["instances"],
            "sampled_every": ctx.stride,
            "host_members": r["host_members"],
            "excess_lateness_s": round(r["excess_s"], 6),
            "last": r["last"],
            "median_lateness_s": round(r["median_s"], 6) if whole else None,
            "p95_lateness_s": round(r["p95_s"], 6) if r["p95_s"] is not None else None,
            "typical_lateness_s": round(r["median_s"] - r["excess_s"], 6) if whole else None,
            "median_gap_s": round(r["gap_s"], 6) if r["gap_s"] else None,
            "slowdown": round(slowdown, 4) if slowdown is not None else None,
            # its own host's members share its clock: the lateness is not a clock's
            "cause": "slow",
            "compared_with": "host",
            "by_op": ops,
        }
        if series is not None:
            effect = max(MIN_SLOWDOWN * (r["gap_s"] or 0.0), MIN_EXCESS_S)
            xs, times = series
            # The baseline of a unit late all along: its lower decile, where it was not.
            base = quantile(xs, 0.1)
            w = find_window(xs, base, effect)
            evidence.update(window_evidence(ctx, w, xs, times, base, None))
        return Finding(
            kind="straggler",
            severity="critical"
            if slowdown is not None and slowdown >= CRITICAL_SLOWDOWN
            else "warning",
            message=msg,
            ranks=[int(who)],
            hosts=[r["host"]] if r["host"] else [],
            op=str(ops[0]["op"]) if ops else None,
            evidence=evidence,
            lines=[LineRef(int(r["file_id"]), int(r["line_no"]))],
            cost_gpu_s=round(cost, 3),
        )

    def _rank_spells(
        self,
        ctx: Context,
        scored: pl.DataFrame,
        series: dict[tuple[str, int], tuple[list[float], pl.Series]],
        seen: set[int],
    ) -> list[Finding]:
        """Ranks late over their host's members for part of the run only."""
        out: list[Finding] = []
        info = {
            (r["comm_key"], r["rank"]): r
            for r in scored.iter_rows(named=True)
            if r["rank"] is not None
        }
        for (comm, rank), (xs, times) in series.items():
            r = info.get((comm, rank))
            if r is None or rank in seen or len(xs) < 2 * MIN_WINDOW:
                continue
            gap = r["gap_s"] or 0.0
            effect = max(MIN_SLOWDOWN * gap, MIN_EXCESS_S)
            base = statistics.median(xs)
            w = find_window(xs, base, effect)
            if w is None or w.last - w.first + 1 >= WHOLE_RUN * len(xs):
                continue
            ev = window_evidence(ctx, w, xs, times, base, int(r["members"]) - 1)
            slowdown = w.excess_s / gap if gap else None
            out.append(
                Finding(
                    kind="straggler",
                    severity="warning",
                    message=(
                        f"rank {rank} on {r['host']} was late at collectives from "
                        f"{ev['window_start']} to {ev['window_end']} "
                        f"({ev['window_instances']:,} sampled collectives): "
                        f"{duration_text(w.excess_s)} after its host's other ranks"
                        + (f", {slowdown:.0%} of the gap between collectives" if slowdown else "")
                        + f"; the job lost {duration_text(ev['window_cost_s'])} to it"
                    ),
                    ranks=[int(rank)],
                    hosts=[r["host"]] if r["host"] else [],
                    evidence={
                        "communicator": comm,
                        "cause": "slow",
                        "compared_with": "host",
                        "intermittent": True,
                        "window_excess_s": round(w.excess_s, 6),
                        "window_z": round(w.z, 1),
                        "median_gap_s": round(gap, 6) if gap else None,
                        "slowdown": round(slowdown, 4) if slowdown is not None else None,
                        "sampled_every": ctx.stride,
                        **ev,
                    },
                    lines=[LineRef(int(r["file_id"]), int(r["line_no"]))],
                    cost_gpu_s=ev.get("window_cost_gpu_s"),
                )
            )
            seen.add(rank)
        return out

    def _per_op(self, ctx: Context, comm_key: str, comm_rank: int) -> list[dict[str, object]]:
        """The straggler's lateness per collective type, AllGather first."""
        rows = (
            with_lateness(ctx)
            .filter((pl.col("comm_key") == comm_key) & (pl.col("comm_rank") == comm_rank))
            .group_by("op")
            .agg(pl.len().alias("calls"), pl.col("late").median().alias("median_s"))
            .sort(pl.col("op") != "AllGather", "op")
        )
        return [
            {"op": r["op"], "calls": r["calls"], "median_lateness_s": round(r["median_s"], 6)}
            for r in rows.iter_rows(named=True)
        ]
