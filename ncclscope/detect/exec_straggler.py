"""A straggler from NCCL Inspector's execution times alone, with no clock at all.

A collective cannot finish before its last member arrives, and each rank's kernel runs
from its own arrival to the end, so::

    exec(r) = (last arrival - arrival(r)) + transfer time + noise

The rank that arrives last waits least: its execution time is the shortest.  A rank
that computes longer than the others between collectives is therefore the one whose
execution time stays below its communicator's median, collective after collective.
No timestamp is needed, so this works where the logs carry none.

Metric, per (communicator, rank): over the collectives where at least half the members
wrote a record, ``short_s`` = the collective's median execution time minus the rank's
(positive: it waited less), its median and robust spread, how often the rank was the
shortest, and the time the others spent waiting beyond it (their execution time minus
its, summed: GPU-seconds lost to it).

Policy, per communicator, for the rank with the largest median ``short_s``: a minimum
effect (``MIN_EFFECT_S`` and ``MIN_SHARE`` of the collective's median time), a noise
bound (``MIN_Z`` robust standard errors of the median, as ``lateness.MIN_Z``), enough
collectives (``MIN_INSTANCES``), and consistency (the shortest in at least
``MIN_SHORTEST`` of them).

Three more shapes, each judged per communicator (a sub-communicator's calls are never
pooled with the world's, whose many calls would drown them):

* **A stretch of the run** (:func:`window_flagged`): for a rank no whole-run bound
  names, its ``short_s`` collective after collective (in run order: each collective
  placed by the median of how far through their files its records sit) searched with
  ``lateness.find_window`` (the log-based straggler's window search), the effect
  being the minimum above; kept when the window holds under ``lateness.WHOLE_RUN`` of
  the run and the rank was the shortest in at least
  ``MIN_SHORTEST`` of the window's collectives, a count as unlikely by chance (one in
  its members) as ``MIN_Z`` standard deviations once the stretches of that length the
  search could have picked are counted (on a two-rank communicator half the
  collectives are anyone's).
* **A whole node** (:func:`node_metric`, :func:`flagged_nodes`): per collective, a
  host's ``host_short_s`` is the median of the other hosts' median execution times
  minus the *longest* of its own (its first member to arrive: a node is slow only when
  its ranks are late together, so one late rank of a host leaves it near zero).  The
  same bounds as a rank's, over hosts of at least two members in communicators of at
  least two hosts.  A node named in a communicator answers for its ranks there: none of
  them is named on its own.
* **A sub-communicator's straggler seen from the world** (:func:`judge`): a rank
  named in a smaller communicator explains its group leaving it late, so a node named
  in a larger communicator on that rank's host is dropped.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import polars as pl

from ncclscope.detect.base import Finding, duration_text, register
from ncclscope.detect.context import Context
from ncclscope.detect.lateness import (
    MIN_INSTANCES,
    MIN_Z,
    WHOLE_RUN,
    find_window,
    may_hold_spell,
)
from ncclscope.parsers.tools.inspector import normalise_hash

__all__ = [
    "CRITICAL_SHARE",
    "MIN_EFFECT_S",
    "MIN_SHARE",
    "MIN_SHORTEST",
    "ExecStragglerDetector",
    "exec_times_metric",
    "explained_nodes",
    "flagged",
    "flagged_nodes",
    "judge",
    "node_metric",
    "window_flagged",
]

#: Inspector's times are whole microseconds and its kernel timing jitters by a few: a
#: rank must wait at least this much less than the median to be named.
MIN_EFFECT_S = 100e-6
#: ... and the others' wait for it must be at least this share of the collective's time.
MIN_SHARE = 0.05
#: The straggler is the shortest in at least this share of its collectives.
MIN_SHORTEST = 0.5
#: The others lose this share of the collective's time or more: critical.
CRITICAL_SHARE = 0.5


def exec_times_metric(inspector: pl.DataFrame) -> pl.DataFrame:
    """Per (comm_hash, comm_rank): instances, median and spread of ``short_s``, the
    share of collectives where it was the shortest, the collectives' median time and
    the others' wait beyond it (``lost_s``)."""
    key = ["comm_hash", "op", "sn"]
    recs = inspector.select(
        "comm_hash", "comm_rank", "nranks", "host", "pid", "op", "sn", "exec_time_s"
    ).unique(["comm_hash", "comm_rank", "op", "sn"])
    inst = recs.group_by(key).agg(
        pl.len().alias("n"),
        pl.col("nranks").max().alias("nranks"),
        pl.col("exec_time_s").median().alias("inst_median_s"),
        pl.col("exec_time_s").min().alias("inst_min_s"),
        pl.col("exec_time_s").sum().alias("inst_sum_s"),
    )
    inst = inst.filter(
        (pl.col("n") >= 2) & (pl.col("n") * 2 >= pl.col("nranks").fill_null(pl.col("n")))
    )
    rows = recs.join(inst, on=key, how="inner").with_columns(
        (pl.col("inst_median_s") - pl.col("exec_time_s")).alias("short_s"),
        (pl.col("exec_time_s") <= pl.col("inst_min_s")).alias("shortest"),
        (pl.col("inst_sum_s") - pl.col("n") * pl.col("exec_time_s")).clip(0).alias("lost_s"),
    )
    return (
        rows.group_by("comm_hash", "comm_rank")
        .agg(
            pl.col("host").drop_nulls().first(),
            pl.col("pid").drop_nulls().first(),
            pl.col("nranks").max(),
            pl.len().alias("instances"),
            pl.col("short_s").median().alias("median_short_s"),
            (pl.col("short_s") - pl.col("short_s").median()).abs().median().alias("mad_s"),
            pl.col("shortest").mean().alias("shortest_share"),
            pl.col("inst_median_s").median().alias("median_exec_s"),
            pl.col("lost_s").sum().alias("lost_s"),
        )
        .with_columns(
            # standard error of a median: 1.2533 x sigma / sqrt(n), sigma = 1.4826 x MAD
            (1.2533 * 1.4826 * pl.col("mad_s") / pl.col("instances").sqrt()).alias("se_s")
        )
        .with_columns(
            pl.when(pl.col("se_s") > 0)
            .then(pl.col("median_short_s") / pl.col("se_s"))
            .otherwise(pl.when(pl.col("median_short_s") > 0).then(math.inf).otherwise(0.0))
            .alias("z"),
            (pl.col("median_short_s") / pl.col("median_exec_s")).alias("share"),
        )
        .sort("comm_hash", "comm_rank")
    )


def flagged(metric: pl.DataFrame) -> pl.DataFrame:
    """The rows of ``metric`` the policy names: per communicator, the rank that waits
    least, where it passes every bound."""
    if metric.is_empty():
        return metric
    top = metric.sort("median_short_s", descending=True).group_by("comm_hash").first()
    return _bounds(top, "median_short_s").sort("comm_hash")


#: The one-sided chance of ``MIN_Z`` standard deviations of a normal variable.
_P_MIN_Z = 0.5 * math.erfc(MIN_Z / math.sqrt(2))


def _tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X binomial (n, p).

    >>> round(_tail(2, 2, 0.5), 3), _tail(0, 5, 0.1)
    (0.25, 1.0)
    """
    if k <= 0:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
        for i in range(k, n + 1)
    ]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def _bounds(df: pl.DataFrame, short: str) -> pl.DataFrame:
    """The rows passing the minimum effect, the noise bound, the count and consistency."""
    return df.filter(
        (pl.col("instances") >= MIN_INSTANCES)
        & (pl.col(short) >= MIN_EFFECT_S)
        & (pl.col("share") >= MIN_SHARE)
        & (pl.col("z") >= MIN_Z)
        & (pl.col("shortest_share") >= MIN_SHORTEST)
    )


def _instance_rows(inspector: pl.DataFrame) -> pl.DataFrame:
    """Each record of the collectives at least half their members wrote, with the
    collective's median (``inst_median_s``), ``short_s``, ``shortest`` and ``order``:
    the collective's place in the run (the median over its records of how far through
    its own file's records of that communicator each sits, 0 to 1)."""
    key = ["comm_hash", "op", "sn"]
    recs = (
        inspector.select(
            "file_id", "line_no", "comm_hash", "comm_rank", "nranks", "host", "pid", "op",
            "sn", "exec_time_s",
        )
        .unique(["comm_hash", "comm_rank", "op", "sn"], keep="first", maintain_order=True)
        .with_columns(
            (
                pl.col("line_no").rank("ordinal").over("file_id", "comm_hash")
                / pl.len().over("file_id", "comm_hash")
            ).alias("progress")
        )
    )  # fmt: skip
    inst = recs.group_by(key).agg(
        pl.len().alias("n"),
        pl.col("nranks").max().alias("nranks_i"),
        pl.col("exec_time_s").median().alias("inst_median_s"),
        pl.col("exec_time_s").min().alias("inst_min_s"),
        pl.col("progress").median().alias("order"),
    )
    inst = inst.filter(
        (pl.col("n") >= 2) & (pl.col("n") * 2 >= pl.col("nranks_i").fill_null(pl.col("n")))
    )
    return recs.join(inst, on=key, how="inner").with_columns(
        (pl.col("inst_median_s") - pl.col("exec_time_s")).alias("short_s"),
        (pl.col("exec_time_s") <= pl.col("inst_min_s")).alias("shortest"),
    )


def window_flagged(inspector: pl.DataFrame, metric: pl.DataFrame) -> pl.DataFrame:
    """Per communicator with no whole-run straggler, the rank whose ``short_s`` stood
    highest above its median over a stretch of the run (``lateness.find_window``), where the
    stretch passes the bounds: ``comm_hash``, ``comm_rank``, ``host``, ``pid``,
    ``first``/``last`` (the window, as indices into the rank's collectives in run
    order), ``of`` (their number), ``excess_s``, ``z``, ``shortest_share`` (in the
    window), ``median_exec_s`` and ``lost_s`` (the others' wait beyond it in the window)."""
    schema = {
        "comm_hash": pl.String, "comm_rank": pl.Int32, "host": pl.String, "pid": pl.Int32,
        "first": pl.Int64, "last": pl.Int64, "of": pl.Int64, "excess_s": pl.Float64,
        "z": pl.Float64, "shortest_share": pl.Float64, "median_exec_s": pl.Float64,
        "lost_s": pl.Float64,
    }  # fmt: skip
    if metric.is_empty():
        return pl.DataFrame(schema=schema)
    done = set(flagged(metric)["comm_hash"].to_list())
    rows = _instance_rows(inspector).filter(~pl.col("comm_hash").is_in(list(done)))
    if rows.is_empty():
        return pl.DataFrame(schema=schema)
    effect = (
        metric.group_by("comm_hash")
        .agg(pl.col("median_exec_s").median())
        .with_columns(
            pl.max_horizontal(pl.lit(MIN_EFFECT_S), MIN_SHARE * pl.col("median_exec_s")).alias(
                "effect_s"
            )
        )
    )
    rows = rows.join(effect.select("comm_hash", "effect_s"), on="comm_hash").sort(
        "comm_hash", "order", "op", "sn"
    )
    # A screen over every series at once (``may_hold_spell``), then the search per unit.
    series = rows.group_by("comm_hash", "comm_rank", maintain_order=True).agg(
        pl.col("host").drop_nulls().first(),
        pl.col("pid").drop_nulls().first(),
        pl.col("nranks_i").max().alias("nranks"),
        pl.col("n").max().alias("seen"),
        pl.col("effect_s").first(),
        pl.col("short_s"),
        pl.col("shortest"),
        pl.col("inst_median_s"),
        pl.col("exec_time_s"),
        may_hold_spell(pl.col("short_s"), MIN_EFFECT_S).alias("may"),
    )
    best: dict[str, dict[str, object]] = {}
    for r in series.filter(pl.col("may")).iter_rows(named=True):
        xs: list[float] = r["short_s"]
        if len(xs) < MIN_INSTANCES:
            continue
        # Its own median as the baseline, as the log-based straggler's spells: the
        # search's allowance then drains the rest of the run, whose noise can be larger
        # than the minimum effect.
        w = find_window(xs, statistics.median(xs), r["effect_s"])
        if w is None or w.last - w.first + 1 >= WHOLE_RUN * len(xs):
            continue
        inside = r["shortest"][w.first : w.last + 1]
        m, hits = len(inside), sum(inside)
        shortest_share = hits / m
        # The best of many stretches stands out by chance, so the rank being the
        # shortest must too: as unlikely by chance (one in its members) as ``MIN_Z``
        # standard deviations, over as many stretches of that length as the run and
        # the communicator's members hold (the bound a median's z alone does not give a
        # searched window).
        members = max(2, r["nranks"] or r["seen"])
        tries = members * len(xs) / m
        if shortest_share < MIN_SHORTEST or _tail(hits, m, 1 / members) * tries > _P_MIN_Z:
            continue
        med = r["inst_median_s"][w.first : w.last + 1]
        lost = sum(
            max(0.0, m - e)
            for m, e in zip(med, r["exec_time_s"][w.first : w.last + 1], strict=True)
        )
        row: dict[str, object] = {
            "comm_hash": r["comm_hash"], "comm_rank": r["comm_rank"], "host": r["host"],
            "pid": r["pid"], "first": w.first, "last": w.last, "of": len(xs),
            "excess_s": w.excess_s, "z": w.z, "shortest_share": shortest_share,
            "median_exec_s": sorted(med)[len(med) // 2], "lost_s": lost,
        }  # fmt: skip
        prev = best.get(r["comm_hash"])
        if prev is None or float(str(prev["excess_s"])) < w.excess_s:
            best[r["comm_hash"]] = row
    return pl.DataFrame(list(best.values()), schema=schema, orient="row").sort("comm_hash")


def node_metric(inspector: pl.DataFrame) -> pl.DataFrame:
    """Per (comm_hash, host) of at least two members in a communicator of at least two
    hosts: instances, median and spread of ``host_short_s`` (the other hosts' median
    execution time, the median over hosts, minus the host's longest), ``z``, ``share``
    (of the collective's median time), ``shortest_share`` (the host's longest was the
    shortest of the hosts' longest), ``ranks`` and ``lost_s``."""
    rows = _instance_rows(inspector).filter(pl.col("host").is_not_null())
    if rows.is_empty():
        return pl.DataFrame()
    members = rows.group_by("comm_hash", "host").agg(pl.col("comm_rank").n_unique().alias("k"))
    hosts = members.group_by("comm_hash").agg(pl.len().alias("hosts"))
    key = ["comm_hash", "op", "sn"]
    per_host = rows.group_by([*key, "host"]).agg(
        pl.col("exec_time_s").median().alias("host_median_s"),
        pl.col("exec_time_s").max().alias("host_max_s"),
        pl.col("inst_median_s").first(),
        (pl.col("inst_median_s").first() * pl.len() - pl.col("exec_time_s").sum()).alias("lost"),
    )
    per_host = (
        per_host.join(members, on=["comm_hash", "host"])
        .join(hosts, on="comm_hash")
        .filter(pl.col("hosts") >= 2)
    )
    if per_host.is_empty():
        return pl.DataFrame()
    # The other hosts' medians: each host against the median of the rest.
    pairs = per_host.select([*key, "host", "host_max_s", "k", "inst_median_s", "lost"]).join(
        per_host.select([*key, pl.col("host").alias("other"), "host_median_s"]), on=key
    )
    per_inst = (
        pairs.filter(pl.col("host") != pl.col("other"))
        .group_by([*key, "host"])
        .agg(
            pl.col("host_max_s").first(),
            pl.col("k").first(),
            pl.col("inst_median_s").first(),
            pl.col("lost").first(),
            pl.col("host_median_s").median().alias("ref_s"),
        )
        .with_columns((pl.col("ref_s") - pl.col("host_max_s")).alias("host_short_s"))
        .with_columns(
            (pl.col("host_max_s") <= pl.col("host_max_s").min().over(key)).alias("shortest")
        )
        .filter(pl.col("k") >= 2)
    )
    return (
        per_inst.group_by("comm_hash", "host")
        .agg(
            pl.col("k").first().alias("ranks"),
            pl.len().alias("instances"),
            pl.col("host_short_s").median().alias("median_short_s"),
            (pl.col("host_short_s") - pl.col("host_short_s").median())
            .abs()
            .median()
            .alias("mad_s"),
            pl.col("shortest").mean().alias("shortest_share"),
            pl.col("inst_median_s").median().alias("median_exec_s"),
            pl.col("lost").clip(0).sum().alias("lost_s"),
        )
        .with_columns(
            (1.2533 * 1.4826 * pl.col("mad_s") / pl.col("instances").sqrt()).alias("se_s")
        )
        .with_columns(
            pl.when(pl.col("se_s") > 0)
            .then(pl.col("median_short_s") / pl.col("se_s"))
            .otherwise(pl.when(pl.col("median_short_s") > 0).then(math.inf).otherwise(0.0))
            .alias("z"),
            (pl.col("median_short_s") / pl.col("median_exec_s")).alias("share"),
        )
        .sort("comm_hash", "host")
    )


def flagged_nodes(nodes: pl.DataFrame) -> pl.DataFrame:
    """Per communicator, the host whose ranks wait least together, where it passes every
    bound."""
    if nodes.is_empty():
        return nodes
    top = nodes.sort("median_short_s", descending=True).group_by("comm_hash").first()
    return _bounds(top, "median_short_s").sort("comm_hash")


def explained_nodes(nodes: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """The (comm_hash, host) of ``nodes`` that a rank of ``ranks`` named in a smaller
    communicator on that host explains: its group left their calls late, so the larger
    communicator sees the whole group (the host) late."""
    return (
        nodes.join(ranks.select("host", pl.col("nranks").alias("sub")), on="host")
        .filter(pl.col("sub") < pl.col("nranks"))
        .select("comm_hash", "host")
        .unique()
    )


def judge(inspector: pl.DataFrame, metric: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every straggler the records name, one row each: ``scope`` (``run``: a rank all
    along; ``window``: a rank over a stretch; ``node``: a host's ranks together),
    ``comm_hash``, ``nranks``, ``comm_rank`` (null for a node), ``host``, ``pid``."""
    schema = pl.Schema({
        "scope": pl.String, "comm_hash": pl.String, "nranks": pl.Int32,
        "comm_rank": pl.Int32, "host": pl.String, "pid": pl.Int32,
    })  # fmt: skip
    if metric is None:
        metric = exec_times_metric(inspector)
    if metric.is_empty():
        return pl.DataFrame(schema=schema)
    size = metric.group_by("comm_hash").agg(pl.col("nranks").max())
    nodes = flagged_nodes(node_metric(inspector))
    ranks = pl.concat(
        [
            flagged(metric).select(pl.lit("run").alias("scope"), "comm_hash", "comm_rank",
                                   "host", "pid"),
            window_flagged(inspector, metric).select(
                pl.lit("window").alias("scope"), "comm_hash", "comm_rank", "host", "pid"
            ),
        ]
    ).join(size, on="comm_hash")  # fmt: skip
    if not nodes.is_empty():
        # A node named in a communicator answers for its ranks there.
        ranks = ranks.join(nodes.select("comm_hash", "host"), on=["comm_hash", "host"], how="anti")
        nodes = nodes.join(size, on="comm_hash")
        nodes = nodes.join(explained_nodes(nodes, ranks), on=["comm_hash", "host"], how="anti")
        node_rows = nodes.select(
            pl.lit("node").alias("scope"), "comm_hash", "nranks",
            pl.lit(None, pl.Int32).alias("comm_rank"), "host", pl.lit(None, pl.Int32).alias("pid"),
        )  # fmt: skip
    else:
        node_rows = pl.DataFrame(schema=schema)
    out = pl.concat([ranks.select(list(schema)).cast(schema), node_rows.cast(schema)])
    return out.sort("comm_hash", "scope", "comm_rank")


@register
class ExecStragglerDetector:
    """Stragglers named from Inspector's execution times (no clocks needed)."""

    name = "exec_straggler"

    def metric(self, ctx: Context) -> pl.DataFrame:
        # The tools describe the job as it ended: an earlier attempt's view skips them.
        if ctx.analysis.followed_by is not None:
            return pl.DataFrame()
        return exec_times_metric(ctx.analysis.tools.inspector)

    def policy(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        if metric.is_empty():
            return []
        ranks = _global_ranks(ctx)
        inspector = ctx.analysis.tools.inspector
        kept = judge(inspector, metric)
        if kept.is_empty():
            return []
        out = []
        run = kept.filter(pl.col("scope") == "run").select("comm_hash", "comm_rank")
        for r in flagged(metric).join(run, on=["comm_hash", "comm_rank"]).iter_rows(named=True):
            rank, who, where = _who(r, ranks)
            out.append(
                Finding(
                    kind="straggler",
                    severity="critical" if r["share"] >= CRITICAL_SHARE else "warning",
                    message=(
                        f"{who}{where} arrives last at the collectives of communicator "
                        f"{r['comm_hash']}: NCCL Inspector times its kernels "
                        f"{duration_text(r['median_short_s'])} shorter than the median "
                        f"({r['share']:.0%} of a collective's "
                        f"{duration_text(r['median_exec_s'])}), the shortest in "
                        f"{r['shortest_share']:.0%} of {r['instances']:,} collectives; the "
                        f"others waited {duration_text(r['lost_s'])} for it (GPU time)"
                    ),
                    ranks=[rank] if rank is not None else [],
                    hosts=[r["host"]] if r["host"] else [],
                    evidence={
                        "source": "inspector",
                        "communicator": r["comm_hash"],
                        "comm_rank": r["comm_rank"],
                        "instances": r["instances"],
                        "median_short_s": round(r["median_short_s"], 6),
                        "median_exec_s": round(r["median_exec_s"], 6),
                        "shortest_share": round(r["shortest_share"], 3),
                        "z": round(r["z"], 1) if math.isfinite(r["z"]) else None,
                    },
                    cost_gpu_s=round(r["lost_s"], 3),
                )
            )
        window = kept.filter(pl.col("scope") == "window").select("comm_hash", "comm_rank")
        if not window.is_empty():
            found = window_flagged(inspector, metric).join(window, on=["comm_hash", "comm_rank"])
            out.extend(_window_finding(r, ranks) for r in found.iter_rows(named=True))
        node = kept.filter(pl.col("scope") == "node").select("comm_hash", "host")
        if not node.is_empty():
            found = flagged_nodes(node_metric(inspector)).join(node, on=["comm_hash", "host"])
            out.extend(_node_finding(r) for r in found.iter_rows(named=True))
        return out


def _who(r: dict[str, Any], ranks: dict[tuple[str, int], int]) -> tuple[int | None, str, str]:
    """A flagged member's job rank (where the logs map it), and its name and place."""
    rank = ranks.get((r["comm_hash"], r["comm_rank"]))
    who = f"rank {rank}" if rank is not None else f"rank {r['comm_rank']} of the communicator"
    where = f" on {r['host']}" + (f" (pid {r['pid']})" if r["pid"] is not None else "")
    return rank, who, where


def _window_finding(r: dict[str, Any], ranks: dict[tuple[str, int], int]) -> Finding:
    rank, who, where = _who(r, ranks)
    share = r["excess_s"] / r["median_exec_s"] if r["median_exec_s"] else 0.0
    return Finding(
        kind="straggler",
        severity="critical" if share >= CRITICAL_SHARE else "warning",
        message=(
            f"{who}{where} arrives last at the collectives of communicator "
            f"{r['comm_hash']} for a stretch of the run: collectives {r['first'] + 1:,} to "
            f"{r['last'] + 1:,} of {r['of']:,} it wrote (in run order), where "
            f"NCCL Inspector times its kernels {duration_text(r['excess_s'])} shorter than "
            f"the median, the shortest in {r['shortest_share']:.0%} of them; the others "
            f"waited {duration_text(r['lost_s'])} for it (GPU time)"
        ),
        ranks=[rank] if rank is not None else [],
        hosts=[r["host"]] if r["host"] else [],
        evidence={
            "source": "inspector",
            "communicator": r["comm_hash"],
            "comm_rank": r["comm_rank"],
            "window_first": r["first"],
            "window_last": r["last"],
            "window_of": r["of"],
            "window_excess_s": round(r["excess_s"], 6),
            "window_z": round(r["z"], 1),
            "shortest_share": round(r["shortest_share"], 3),
        },
        cost_gpu_s=round(r["lost_s"], 3),
    )


def _node_finding(r: dict[str, Any]) -> Finding:
    return Finding(
        kind="straggler",
        severity="critical" if r["share"] >= CRITICAL_SHARE else "warning",
        message=(
            f"node {r['host']} is slow: its {r['ranks']} ranks arrive last together at the "
            f"collectives of communicator {r['comm_hash']}; NCCL Inspector times even its "
            f"longest kernel {duration_text(r['median_short_s'])} shorter than the other "
            f"hosts' median ({r['share']:.0%} of a collective's "
            f"{duration_text(r['median_exec_s'])}), the shortest host in "
            f"{r['shortest_share']:.0%} of {r['instances']:,} collectives; the others "
            f"waited {duration_text(r['lost_s'])} for it (GPU time)"
        ),
        hosts=[r["host"]],
        evidence={
            "source": "inspector",
            "scope": "node",
            "communicator": r["comm_hash"],
            "ranks_on_host": r["ranks"],
            "instances": r["instances"],
            "median_short_s": round(r["median_short_s"], 6),
            "median_exec_s": round(r["median_exec_s"], 6),
            "shortest_share": round(r["shortest_share"], 3),
            "z": round(r["z"], 1) if math.isfinite(r["z"]) else None,
        },
        cost_gpu_s=round(r["lost_s"], 3),
    )


def _global_ranks(ctx: Context) -> dict[tuple[str, int], int]:
    """(communicator hash, rank in it) -> global rank, from the logs' members."""
    members = ctx.analysis.identity.members
    if members.is_empty() or "comm_id" not in members.columns:
        return {}
    rows = (
        members.filter(pl.col("comm_id").is_not_null() & pl.col("rank").is_not_null())
        .select(normalise_hash(pl.col("comm_id")).alias("h"), "comm_rank", "rank")
        .unique()
    )
    return {(h, int(cr)): int(r) for h, cr, r in rows.iter_rows() if cr is not None}
