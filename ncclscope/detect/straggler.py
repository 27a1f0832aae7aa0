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
  ``_MIN_Z`` robust standard errors above the noise), with its start, end and cost.

Every threshold is a minimum effect (``MIN_SLOWDOWN`` of the gap between collectives,
``MIN_EXCESS_S``) and a noise bound (robust z from the median absolute deviation).

Sample: rank 5's lines come ~4 ms after the others' at every instance::

    [default0]:[2025-03-14 09:00:31.120001] node-0:41230:41230 [0] NCCL INFO AllGather: ...
    [default5]:[2025-03-14 09:00:31.124310] node-0:41235:41235 [5] NCCL INFO AllGather: ...
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import polars as pl

from ncclscope.detect.base import (
    SEVERITIES,
    Finding,
    LineRef,
    Severity,
    duration_text,
    ranks_text,
    register,
)
from ncclscope.detect.config import subsecond_digits_unreliable
from ncclscope.detect.context import Context
from ncclscope.schema import LATENESS_SCHEMA

__all__ = ["MIN_SLOWDOWN", "StragglerDetector", "Window", "find_window", "lateness"]

#: Excess median lateness, as a share of the median gap between collectives, from which
#: a member is a straggler.
MIN_SLOWDOWN = 0.05
#: ...and at least this much in absolute terms (timestamps are microseconds, but hosts'
#: clocks and the logging path add jitter of that order).
MIN_EXCESS_S = 0.0005
#: A host's own typical lateness is used when it holds at least this many members.
_HOST_BASELINE_MEMBERS = 3
#: Instances a member must have been timed at.
_MIN_INSTANCES = 20
#: Excess lateness must also stand this many robust standard deviations (1.4826 x the
#: median absolute deviation of the members' medians) above the typical member.
_MIN_Z = 4.0
#: Excess, as a share of the gap, from which a straggler is critical.
_CRITICAL_SLOWDOWN = 0.25
#: File order.  In a stream merged as its lines were written (one launcher reading every
#: worker's pipe), a host that truly arrives after the others has its lines after theirs;
#: a host whose clock is ahead has later times on lines that still sit among theirs.
#: Simultaneous arrivals put a host after the reference in about half the instances, so
#: from this share on the host truly came after the others ...
_ORDER_SLOW = 0.9
#: ... and up to this share its timestamps' lateness is not in the order: its clock's.
_ORDER_CLOCK = 0.65
#: A constant shift this large (seconds) is beyond what synchronised clocks drift apart
#: (NTP keeps hosts within milliseconds, tens at worst): either the clock is not
#: synchronised or the node is that slow, and either needs a look.
_UNSYNCED_S = 0.1
#: A clock offset from which the clock is broken (chrony steps a clock that is off by
#: more than a second: it is not being disciplined at all).
_BROKEN_CLOCK_S = 1.0
#: Hosts up to which each is compared with the median of the others (exact, a join of
#: hosts x hosts per collective); beyond, with the median of all.
_LOO_HOSTS = 16
#: Instances a window of slowness must span.
_MIN_WINDOW = 10
#: Instances each side of a comparison of medians must hold (long against short gaps):
#: the fewest whose median survives two wild values and whose MAD says something.  One
#: long gap a step (the optimizer's) leaves few of them on a short or cut log; the
#: ``_MIN_Z`` test on their median does the rest.
_MIN_GROUP = 5
#: A window that covers this share of the run is the whole run.
_WHOLE_RUN = 0.8


def timing_usable(ctx: Context) -> bool:
    """COLL lines carry sub-second times that can be trusted."""
    a = ctx.analysis
    if a.summary is None or a.summary.with_ts == 0:
        return False
    if subsecond_digits_unreliable(a.nccl_versions):
        return False
    inst = ctx.instances.filter(pl.col("with_ts") > 0).head(2000)
    return bool((inst["ts_min"].dt.microsecond() != 0).any())


def _with_lateness(ctx: Context) -> pl.DataFrame:
    """``_lateness_rows``, computed once per context: the metric, the hosts' comparison
    and each finding's per-op breakdown all read it, and on a large job it is a join of
    the whole sample (tens of milliseconds each time)."""
    memo = vars(ctx)
    rows = memo.get(_ROWS_KEY)
    if not isinstance(rows, pl.DataFrame):
        rows = memo[_ROWS_KEY] = _lateness_rows(ctx)
    return rows


#: Where ``_with_lateness`` keeps its table on the context (as ``cached_property`` does).
_ROWS_KEY = "_straggler_lateness_rows"


def _lateness_rows(ctx: Context) -> pl.DataFrame:
    """The sampled calls of complete, fully timed instances, with ``late`` (seconds after
    the instance's first arrival) and ``last`` (it arrived last) and the instance's size.

    Complete: every member the communicator shows anywhere in the logs logged it.  An
    instance some members are missing from (a file cut short, or starting late; ranks
    that went on after a hang) says nothing about who came late: its first arrival is
    that of whoever is left, and a host whose lines stop would move every other host's
    reference."""
    # Members by their comm rank: a rank logged twice at one sequence (two runs in one
    # file, not told apart) makes the instance no measure of anyone's lateness either.
    distinct = ctx.sample.group_by("comm_key", "seq").agg(
        pl.col("comm_rank").n_unique().alias("distinct")
    )
    inst = ctx.instances.join(distinct, on=["comm_key", "seq"]).filter(
        (pl.col("n") >= 2)
        & (pl.col("with_ts") == pl.col("n"))
        & (pl.col("distinct") == pl.col("n"))
        & (pl.col("n") == pl.col("n").max().over("comm_key"))
    )
    return ctx.sample.join(
        inst.select("comm_key", "seq", "ts_min", "ts_max", "n"), on=["comm_key", "seq"]
    ).with_columns(
        ((pl.col("ts") - pl.col("ts_min")).dt.total_microseconds() / 1e6).alias("late"),
        (pl.col("ts") == pl.col("ts_max")).alias("last"),
    )


def _within_host_rows(ctx: Context) -> pl.DataFrame:
    """The sampled calls of hosts' members (hosts of at least two) at the instances every
    member of their host logged with a time, with ``hlate``: seconds after the host's
    first member (one clock: the host's offset cancels, and no other host's cut or late
    start enters), ``k`` the host's members, ``ts_first`` the host's first arrival."""
    s = ctx.sample
    if s.is_empty():
        return pl.DataFrame()
    key = ["comm_key", "seq", "host"]
    rows = s.filter(pl.col("ts").is_not_null() & pl.col("host").is_not_null()).with_columns(
        pl.len().over(key).alias("k"),
        pl.col("ts").min().over(key).alias("ts_first"),
        # In the same context as the two above: polars groups the rows by ``key`` once.
        pl.col("comm_rank").n_unique().over(key).alias("distinct"),
    )
    rows = rows.filter(
        (pl.col("k") >= 2)
        & (pl.col("k") == pl.col("k").max().over("comm_key", "host"))
        & (pl.col("distinct") == pl.col("k"))
    ).drop("distinct")
    return rows.with_columns(
        ((pl.col("ts") - pl.col("ts_first")).dt.total_microseconds() / 1e6).alias("hlate")
    )


def lateness(ctx: Context) -> pl.DataFrame:
    """Per communicator member: lateness statistics over the sampled instances every
    member of which was timed (``LATENESS_SCHEMA``), and the communicator's median gap
    between collectives."""
    if ctx.analysis.collectives is None or not timing_usable(ctx):
        return pl.DataFrame(schema=LATENESS_SCHEMA)
    rows = _with_lateness(ctx)
    if rows.is_empty():
        return pl.DataFrame(schema=LATENESS_SCHEMA)
    # The median gap between consecutive instances: from consecutive sampled ones, over
    # the stride between them.
    gaps = (
        ctx.instances.sort("comm_key", "seq")
        .select(
            "comm_key",
            (
                pl.col("ts_min").diff().over("comm_key").dt.total_microseconds()
                / pl.col("seq").diff().over("comm_key")
            ).alias("gap"),
        )
        .group_by("comm_key")
        .agg((pl.col("gap").median() / 1e6).alias("gap_s"))
    )
    per_member = rows.group_by("comm_key", "comm_rank").agg(
        pl.col("rank").first(),
        pl.col("host").first(),
        pl.len().alias("instances"),
        pl.col("last").sum(),
        pl.col("late").median().alias("median_s"),
        pl.col("late").quantile(0.95).alias("p95_s"),
        pl.col("late").mean().alias("mean_s"),
        pl.col("n").max().alias("members"),
        pl.col("file_id").first(),
        pl.col("line_no").min(),
    )
    return (
        per_member.join(gaps, on="comm_key", how="left")
        .select(list(LATENESS_SCHEMA))
        .cast(LATENESS_SCHEMA)
        .sort("comm_key", "comm_rank")
    )


@dataclass(frozen=True)
class Window:
    """A stretch of instances (indices into a unit's series, inclusive) over which a
    unit's lateness stood ``excess_s`` above its baseline, ``z`` robust standard errors."""

    first: int
    last: int
    excess_s: float
    z: float


def _mad(xs: list[float], centre: float) -> float:
    return statistics.median(abs(x - centre) for x in xs) * 1.4826 if xs else 0.0


def _sorted_median(ordered: pl.Series) -> float:
    """``statistics.median`` of an already sorted series (the mean of the two middle
    values of an even count, as it computes it).

    >>> _sorted_median(pl.Series([1.0, 2.0, 4.0, 8.0])), _sorted_median(pl.Series([3.0]))
    (3.0, 3.0)
    """
    n = len(ordered)
    if n % 2:
        return float(ordered[n // 2])
    return (float(ordered[n // 2 - 1]) + float(ordered[n // 2])) / 2


def find_window(xs: list[float], baseline: float, effect_s: float) -> Window | None:
    """The stretch of ``xs`` (a unit's lateness, instance after instance) that stands
    highest above ``baseline``: the largest sum of ``x - baseline - effect_s / 2`` over a
    contiguous stretch (a CUSUM with half the effect as allowance, as for a change in
    mean that starts and ends; each term clipped to twice the effect), kept only when it
    spans ``_MIN_WINDOW`` instances, its median is at least ``effect_s`` above the median
    outside it (or the baseline, when it is the whole series) and that difference stands
    ``_MIN_Z`` robust standard errors above the noise.

    >>> w = find_window([0.0] * 40 + [0.01] * 20 + [0.0] * 40, 0.0, 0.002)
    >>> (w.first, w.last, round(w.excess_s, 3))
    (40, 59, 0.01)
    >>> find_window([0.0005, -0.0005] * 50, 0.0, 0.002) is None
    True
    """
    best = run = 0.0
    start = 0
    span: tuple[int, int] | None = None
    half, lo, hi = effect_s / 2, -2 * effect_s, 2 * effect_s
    # A plain loop with comparisons, not min()/max() calls: it runs over every sampled
    # instance of every unit (hundreds of thousands on a large job).
    for i, x in enumerate(xs):
        if run <= 0.0:
            run, start = 0.0, i
        # Each instance counts at most twice the effect either way: one large one-off
        # delay must not stretch a window over the quiet instances around it.
        c = x - baseline - half
        if c > hi:
            c = hi
        elif c < lo:
            c = lo
        run += c
        if run > best:
            best, span = run, (start, i)
    if span is None or span[1] - span[0] + 1 < _MIN_WINDOW:
        return None
    inside = xs[span[0] : span[1] + 1]
    outside = xs[: span[0]] + xs[span[1] + 1 :]
    level = statistics.median(inside)
    if len(outside) >= _MIN_WINDOW:
        ref = statistics.median(outside)
        noise = _mad(outside, ref)
    else:
        ref = baseline
        noise = _mad(inside, level)
    excess = level - ref
    # The median's standard error is about 1.25 sigma / sqrt(n); the floor keeps a
    # noiseless series (synthetic, or rounded times) from dividing by zero.
    se = 1.253 * max(noise, 1e-6) / math.sqrt(len(inside))
    if excess < effect_s or excess / se < _MIN_Z:
        return None
    return Window(span[0], span[1], excess, excess / se)


def _may_hold_spell(x: pl.Expr, effect: float) -> pl.Expr:
    """Aggregated over one rank's lateness ``x`` in instance order: whether a spell
    (``_rank_spells``) can be found at all, tested on the whole series at once instead of
    a search per rank, which on a large job is most of the detector's time.

    A spell is a window of at least ``_MIN_WINDOW`` instances, under ``_WHOLE_RUN`` of
    the series, whose median is ``effect`` above the median of the rest (or of the whole
    series).  The rest holds over a fifth of the instances, so its median is at least the
    series' ``n / 10 - 2``-th smallest value (``floor``); the window's median reaches
    ``effect`` above that only if at least half its instances do.  So some stretch of
    ``_MIN_WINDOW`` or more instances must have as many at that level as below it: with
    ``+1``/``-1`` per instance, a stretch whose sum is not negative (integer prefix sums,
    exact).  The tolerance keeps a value a rounding away from the level in.

    >>> import polars as pl
    >>> def may(xs: list[float]) -> bool:
    ...     return pl.DataFrame({"x": xs}).select(_may_hold_spell(pl.col("x"), 0.002)).item()
    >>> may([0.0] * 40 + [0.01] * 10 + [0.0] * 40), may([0.0, 0.01] * 40 + [0.0] * 20)
    (True, True)
    >>> may([0.0] * 40 + [0.01] * 4 + [0.0] * 40), may([0.0, 0.0, 0.01] * 40)
    (False, False)
    """
    k = ((pl.len() // 10).cast(pl.Int64) - 2).clip(lower_bound=0)
    floor = x.sort().gather(k).first()
    y = pl.when(x >= floor + effect * (1 - 1e-9)).then(1).otherwise(-1).cast(pl.Int64)
    total = y.cum_sum()
    # The lowest prefix sum a stretch ending here may start from (0: the series' start).
    lowest = total.shift(_MIN_WINDOW).fill_null(0).cum_min()
    row = pl.int_range(pl.len())
    return ((total - lowest >= 0) & (row >= _MIN_WINDOW - 1)).any()


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="microseconds")


def _host_instances(ctx: Context) -> pl.DataFrame:
    """Per (communicator spanning >= 2 hosts, sampled instance, host): the host's median
    arrival (``t_us``, its own clock), its members' median line (``pos``), the file its
    lines are in, and the instance's reference arrival (``ref_us``: the median of the
    other hosts' arrivals; of all hosts' from ``_LOO_HOSTS`` hosts on, where one host
    moves the median little) and ``delta_s`` = the host's arrival minus it.  ``merged``:
    all the instance's lines are in one file (a merged stream)."""
    rows = _with_lateness(ctx)
    if rows.is_empty():
        return pl.DataFrame()
    rows = rows.filter(pl.col("host").n_unique().over("comm_key") >= 2)
    if rows.is_empty():
        return pl.DataFrame()
    per = rows.group_by("comm_key", "seq", "host").agg(
        pl.col("ts").dt.epoch("us").median().alias("t_us"),
        pl.col("ts").dt.epoch("us").min().alias("t_first_us"),
        pl.col("line_no").median().alias("pos"),
        pl.col("line_no").min().alias("pos_first"),
        pl.col("file_id").min().alias("f0"),
        pl.col("file_id").max().alias("f1"),
        pl.col("ts").min().alias("ts_first"),
        pl.len().alias("k"),
    )
    inst = ["comm_key", "seq"]
    hosts = pl.len().over(inst)
    # A host's own time from the previous collective to this one (its clock cancels);
    # only between consecutive ones (every collective sampled).
    step = pl.col("seq").diff().over("comm_key", "host")
    own_gap = (
        pl.when(step == 1)
        .then(pl.col("t_us").diff().over("comm_key", "host") / 1e6)
        .otherwise(None)
        .alias("own_gap_s")
    )
    per = per.with_columns(
        hosts.alias("hosts"),
        # How far the host's typical member came after its first (one clock): small
        # when its ranks arrive together, half a lone late rank's delay on a host of two.
        ((pl.col("t_us") - pl.col("t_first_us")) / 1e6).alias("inner_s"),
    ).drop("t_first_us")
    # Leave-one-out: a host is compared with the others only (with two hosts, each with
    # the other: a signed difference), so that it is never its own reference.
    few = (
        per.filter(pl.col("hosts") <= _LOO_HOSTS)
        .select(*inst, "host", "t_us", "pos", "hosts")
        .with_columns(
            pl.col("t_us").sort().implode().over(inst).alias("_ts"),
            pl.col("pos").sort().implode().over(inst).alias("_ps"),
        )
    )
    others = few.select(
        *inst,
        "host",
        _others_median("_ts", "t_us", inst).alias("loo_t"),
        _others_median("_ps", "pos", inst).alias("loo_pos"),
    )
    per = per.join(others, on=[*inst, "host"], how="left")
    return (
        per.with_columns(
            pl.coalesce("loo_t", pl.col("t_us").median().over(inst)).alias("ref_us"),
            pl.coalesce("loo_pos", pl.col("pos").median().over(inst)).alias("ref_pos"),
            (pl.col("f0").min().over(inst) == pl.col("f1").max().over(inst)).alias("merged"),
            pl.col("ts_first").min().over(inst).alias("at"),
        )
        .with_columns(((pl.col("t_us") - pl.col("ref_us")) / 1e6).alias("delta_s"))
        .sort("comm_key", "host", "seq")
        .with_columns(own_gap)
    )


def _others_median(sorted_col: str, value: str, inst: list[str]) -> pl.Expr:
    """The median of the instance's other hosts' ``value``: read off the instance's
    values in order (``sorted_col``) with the host's own place skipped.  The same numbers
    as a join of hosts x hosts and a median per host, without the rows of that join (the
    largest table of the detector on a big job); polars' median of an even count is
    ``a + (b - a) * 0.5``, computed the same way here.  None for a host alone at the
    instance."""
    others = pl.col("hosts").cast(pl.Int64) - 1
    own = pl.col(value).rank("ordinal").over(inst).cast(pl.Int64) - 1

    def nth(j: pl.Expr) -> pl.Expr:
        return pl.col(sorted_col).list.get(pl.when(j < own).then(j).otherwise(j + 1))

    a, b = nth((others - 1) // 2), nth(others // 2)
    return pl.when(others >= 1).then(a + (b - a) * 0.5)


def _cause(order_after: float | None, spell: bool, grows: bool) -> str:
    """What a host's lateness is, from the signals that do not read its clock.

    ``order_after``: the share of instances whose lines (in a stream merged as they were
    written) show the host after the others.  A real delay puts its lines after the
    others'; a clock offset only changes the times printed on them.  ``spell``: the
    lateness held for part of the run; ``grows``: it is larger after a longer compute
    phase.  A clock offset does neither.

    >>> _cause(0.98, False, False), _cause(0.5, False, False), _cause(None, False, True)
    ('slow', 'clock', 'slow')
    >>> _cause(None, False, False)
    'clock_or_constant_delay'
    """
    if order_after is not None and order_after >= _ORDER_SLOW:
        return "slow"
    if order_after is not None and order_after <= _ORDER_CLOCK:
        return "clock"
    if spell or grows:
        return "slow"
    return "clock_or_constant_delay"


_CLOCK_CHECK = (
    "compare the hosts' clocks: `chronyc tracking` (System time, Last offset) or "
    "`timedatectl timesync-status` on each host, or the PTP daemon's offset (`pmc -u -b 0 "
    "'GET CURRENT_DATA_SET'`)"
)


@register
class StragglerDetector:
    """Ranks and nodes that arrive late at collective after collective, or for a while."""

    name = "straggler"

    def metric(self, ctx: Context) -> pl.DataFrame:
        return lateness(ctx)

    def policy(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        if metric.is_empty():
            return []
        return self._ranks(metric, ctx) + self._hosts(metric, ctx)

    # ---- ranks within their host (one clock: offsets cancel) -------------------------

    def _ranks(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        rows = _within_host_rows(ctx)
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
            per.filter(pl.col("instances") >= _MIN_INSTANCES)
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
            & (pl.col("excess_s") >= _MIN_Z * pl.col("spread_s"))
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
                    ((x >= x.quantile(0.1) + effect).sum() >= _MIN_WINDOW // 2)
                    & _may_hold_spell(x.sort_by("seq"), effect)
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
            base = _quantile(xs, 0.1)
            w = find_window(xs, base, effect)
            evidence.update(self._window_evidence(ctx, w, xs, times, base, None))
        return Finding(
            kind="straggler",
            severity="critical"
            if slowdown is not None and slowdown >= _CRITICAL_SLOWDOWN
            else "warning",
            message=msg,
            ranks=[int(who)],
            hosts=[r["host"]] if r["host"] else [],
            op=str(ops[0]["op"]) if ops else None,
            evidence=evidence,
            lines=[LineRef(int(r["file_id"]), int(r["line_no"]))],
            cost_gpu_s=round(cost, 3),
        )

    def _window_evidence(
        self,
        ctx: Context,
        w: Window | None,
        xs: list[float],
        times: pl.Series,
        base: float,
        others: int | None,
    ) -> dict[str, Any]:
        """``window_start``/``window_end`` (the first and last late instance's time),
        the instances in it, and ``window_cost_s``: the time the job lost in it (each
        instance's lateness over the baseline, times the sampling stride)."""
        if not xs:
            return {}
        first, last = (w.first, w.last) if w is not None else (0, len(xs) - 1)
        lost = sum(max(0.0, x - base) for x in xs[first : last + 1]) * ctx.stride
        out: dict[str, Any] = {
            "window_start": _iso(times[first]),
            "window_end": _iso(times[last]),
            "window_instances": last - first + 1,
            "window_whole_run": w is None or (last - first + 1) >= _WHOLE_RUN * len(xs),
            "window_cost_s": round(lost, 6),
        }
        if others is not None:
            out["window_cost_gpu_s"] = round(lost * others, 3)
        return out

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
            if r is None or rank in seen or len(xs) < 2 * _MIN_WINDOW:
                continue
            gap = r["gap_s"] or 0.0
            effect = max(MIN_SLOWDOWN * gap, MIN_EXCESS_S)
            base = statistics.median(xs)
            w = find_window(xs, base, effect)
            if w is None or w.last - w.first + 1 >= _WHOLE_RUN * len(xs):
                continue
            ev = self._window_evidence(ctx, w, xs, times, base, int(r["members"]) - 1)
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

    # ---- hosts against each other (clocks differ) ------------------------------------

    def _hosts(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        per = _host_instances(ctx)
        if per.is_empty():
            return []
        gaps = metric.group_by("comm_key").agg(pl.col("gap_s").first(), pl.col("members").max())
        # The communicator with the most members first; each host is reported once.
        comms = gaps.sort("members", descending=True).iter_rows(named=True)
        out: list[Finding] = []
        done: set[str] = set()
        for c in comms:
            sub = per.filter(pl.col("comm_key") == c["comm_key"])
            if sub.is_empty():
                continue
            for (host,), g in sub.group_by(["host"], maintain_order=True):
                if host in done or g.height < _MIN_INSTANCES:
                    continue
                f = self._host_finding(ctx, c, str(host), g, metric)
                if f is not None:
                    out.append(f)
                    done.add(str(host))
        out = self._mirrored_spells(out)
        slow = [f for f in out if f.evidence["cause"] == "slow"]
        by_cause: dict[str, list[Finding]] = {}
        for f in out:
            if f.evidence["cause"] != "slow":
                by_cause.setdefault(f.evidence["cause"], []).append(f)
        return slow + [fs[0] if len(fs) == 1 else _merged(fs) for fs in by_cause.values()]

    def _mirrored_spells(self, found: list[Finding]) -> list[Finding]:
        """Spells of slowness on several hosts of one communicator, kept where the
        lateness inside the window grows with the compute gap.

        Hosts are compared with each other, so one host's spell is the others' dip: with
        two hosts, A late over a stretch reads exactly as B late over the rest (plus a
        clock offset), and either shows as a spell when the stretch holds most of the
        kept log.  A slow node's lateness inside its window grows with the compute before
        each collective; the mirror's "window" is the other host's normal stretch, where
        its lateness is its clock, flat.  Where no spell (or every one) grows, the logs
        cannot say which host was slow: one ``info`` finding names the hosts, blaming
        none."""
        spells: dict[str, list[Finding]] = {}
        for f in found:
            if f.evidence.get("cause") == "slow" and f.evidence.get("intermittent"):
                spells.setdefault(str(f.evidence["communicator"]), []).append(f)
        drop: set[int] = set()
        add: list[Finding] = []
        for fs in spells.values():
            if len(fs) < 2:
                continue
            grown = [f for f in fs if f.evidence.get("window_grows_with_gap")]
            drop |= {id(f) for f in fs if len(grown) != 1 or f is not grown[0]}
            if len(grown) != 1:
                add.append(_ambiguous_spell(fs))
        return [f for f in found if id(f) not in drop] + add

    def _host_finding(
        self,
        ctx: Context,
        comm: dict[str, Any],
        host: str,
        g: pl.DataFrame,
        metric: pl.DataFrame,
    ) -> Finding | None:
        xs: list[float] = g["delta_s"].to_list()
        times = g["at"]
        gap = float(comm["gap_s"] or 0.0)
        effect = max(MIN_SLOWDOWN * gap, MIN_EXCESS_S)
        # Sorted by polars, not Python: the same values as ``statistics.median``,
        # ``_mad`` and ``_quantile`` of ``xs``, at a fraction of the cost per host.
        ordered = g["delta_s"].sort()
        shift = _sorted_median(ordered)
        noise = _sorted_median((ordered - shift).abs().sort()) * 1.4826
        se = 1.253 * max(noise, 1e-6) / math.sqrt(len(xs))
        whole = shift >= effect and shift / se >= _MIN_Z
        # The level where the host was not late: its lower decile.  Lateness only adds,
        # and a spell that holds most of the log puts the median inside the spell.
        base = float(ordered[min(len(xs) - 1, int(0.1 * len(xs)))])
        w = find_window(xs, base, effect)
        spell = w is not None and (w.last - w.first + 1) < _WHOLE_RUN * len(xs)
        merged = g.filter(pl.col("merged"))
        behind = self._clock_behind(merged, shift, effect)
        grows = self._grows_with_gap(g, effect)
        if not whole and not spell and not behind and grows is None:
            return None
        order_after: float | None = None
        first_after = 0.0
        if merged.height >= _MIN_INSTANCES:
            sel = (
                merged
                if not spell or w is None
                else merged.filter(pl.col("seq").is_between(g["seq"][w.first], g["seq"][w.last]))
            )
            if sel.height >= _MIN_INSTANCES or (spell and sel.height >= _MIN_WINDOW):
                after = (sel["pos"] > sel["ref_pos"]).sum()
                order_after = int(after) / sel.height
                first_after = int((sel["pos_first"] > sel["ref_pos"]).sum()) / sel.height
        cause = _cause(order_after, spell, grows is not None)
        if behind and not whole and not spell:
            return self._behind_finding(ctx, comm, host, g, metric, shift, order_after or 0.0)
        if not whole and not spell and cause != "slow":
            return None
        by_order = order_after is not None and order_after >= _ORDER_SLOW
        if cause == "slow" and (
            # Its ranks are not late together: one of them is (named on its own against
            # its host's others, one clock); a node is not slow for one bad rank.  Where
            # the order said "slow", its times carry its clock: the order says it, by
            # the host's first line coming after the others' too.
            (by_order and first_after < _ORDER_SLOW)
            or (not by_order and not self._together(g, w if spell else None, shift, grows, gap))
        ):
            return None
        members = metric.filter((pl.col("comm_key") == comm["comm_key"]) & (pl.col("host") == host))
        ranks = sorted(int(r) for r in members["rank"].drop_nulls().to_list())
        everyone = int(comm["members"] or 0)
        ev = self._window_evidence(ctx, w if spell else None, xs, times, base, None)
        lost = ev.get("window_cost_s", 0.0) if cause == "slow" else 0.0
        if spell and w is not None:
            excess = w.excess_s
        elif grows is not None and gap:
            # The growth with the gap is the node's own slowdown, whatever its clock:
            # its lateness at a typical collective, and the rest of the shift is the clock.
            excess = grows[2] * gap
        else:
            excess = shift
        slowdown = excess / gap if gap else None
        first = members.sort("line_no").row(0, named=True) if members.height else None
        evidence: dict[str, Any] = {
            "communicator": comm["comm_key"],
            "cause": cause,
            "compared_with": "hosts",
            "unit": "host",
            "ranks": ranks,
            "instances": len(xs),
            "sampled_every": ctx.stride,
            "median_lateness_s": round(shift, 6),
            "lateness_noise_s": round(noise, 6),
            "median_gap_s": round(gap, 6) if gap else None,
            "slowdown": round(slowdown, 4) if slowdown is not None else None,
            "order_after": round(order_after, 4) if order_after is not None else None,
            "intermittent": spell,
            **ev,
        }
        if grows is not None:
            evidence["lateness_after_long_gaps_s"] = round(grows[0], 6)
            evidence["lateness_after_short_gaps_s"] = round(grows[1], 6)
            if not spell:
                evidence["clock_offset_estimate_s"] = round(shift - excess, 6)
        if spell and w is not None:
            evidence["window_excess_s"] = round(w.excess_s, 6)
            evidence["window_z"] = round(w.z, 1)
            inside = self._grows_with_gap(g.slice(w.first, w.last - w.first + 1), effect)
            evidence["window_grows_with_gap"] = inside is not None
        severity, msg = self._host_verdict(host, ranks, cause, excess, slowdown, evidence)
        if cause == "slow":
            evidence["window_cost_gpu_s"] = round(lost * max(0, everyone - len(ranks)), 3)
        else:
            evidence["check"] = _CLOCK_CHECK
        return Finding(
            kind="straggler",
            severity=severity,
            message=msg,
            ranks=ranks if cause == "slow" else [],
            hosts=[host],
            evidence=evidence,
            lines=[LineRef(int(first["file_id"]), int(first["line_no"]))] if first else [],
            cost_gpu_s=evidence.get("window_cost_gpu_s") if cause == "slow" else None,
        )

    def _together(
        self,
        g: pl.DataFrame,
        w: Window | None,
        shift: float,
        grows: tuple[float, float, float] | None,
        gap: float,
    ) -> bool:
        """The host's ranks are late together: its first member is late too.  The
        host's typical member came ``inner_s`` after its first (one clock); that must be
        under half of the host's lateness (the lateness of its window, of its growth with
        the gap at a typical collective, or its shift), else most of it is one or a few
        of its ranks, not the node.

        >>> import polars as pl
        >>> d = StragglerDetector()
        >>> d._together(pl.DataFrame({"inner_s": [0.0002] * 30}), None, 0.01, None, 0.1)
        True
        >>> d._together(pl.DataFrame({"inner_s": [0.005] * 30}), None, 0.01, None, 0.1)
        False
        """
        inner = g["inner_s"].to_list()
        if w is not None:
            inner = inner[w.first : w.last + 1]
            late = w.excess_s
        elif grows is not None and gap:
            # Both grow with the gap for a lone late rank: compare at a typical one.
            late = grows[2] * gap
        else:
            late = shift
        return bool(inner) and statistics.median(inner) < late / 2

    def _grows_with_gap(self, g: pl.DataFrame, effect: float) -> tuple[float, float, float] | None:
        """The host's median lateness after its longest gaps between collectives (the
        instances whose gap from its previous one, by its own clock, is at least 1.5 times
        its median: a step boundary, an optimizer step) and after the others, where the
        first exceeds the second by ``effect`` and ``_MIN_Z`` robust standard errors: a
        slower node loses more time in a longer compute phase, a clock the same
        everywhere (a slow node arrives last, so its own gap is its compute).  The
        third value is the growth per second of gap (long minus short, by the host's own
        clock): the node's slowdown as a share of the time between collectives, which no
        clock offset enters."""
        sub = g.filter(pl.col("own_gap_s").is_not_null())
        if sub.height < 2 * _MIN_WINDOW:
            return None
        typical = sub["own_gap_s"].median()
        if not isinstance(typical, float) or typical <= 0:
            return None
        is_long = pl.col("own_gap_s") >= 1.5 * typical
        long = sub.filter(is_long)["delta_s"].to_list()
        short = sub.filter(~is_long)["delta_s"].to_list()
        if len(long) < _MIN_GROUP or len(short) < _MIN_GROUP:
            return None
        hi, lo = statistics.median(long), statistics.median(short)
        se = 1.253 * max(_mad(short, lo), _mad(long, hi), 1e-6) / math.sqrt(len(long))
        if hi - lo < effect or (hi - lo) / se < _MIN_Z:
            return None
        g_long = sub.filter(is_long)["own_gap_s"].median()
        g_short = sub.filter(~is_long)["own_gap_s"].median()
        if not isinstance(g_long, float) or not isinstance(g_short, float):
            return None
        return hi, lo, (hi - lo) / (g_long - g_short)

    def _clock_behind(self, merged: pl.DataFrame, shift: float, effect: float) -> bool:
        """The merged log shows the host after the others at collective after collective
        (binomial z of at least ``_MIN_Z`` against the half that simultaneous arrivals
        give), while its times do not say it came ``effect`` after them: the node is late
        and its clock behind by about as much, amounts these logs cannot separate."""
        n = merged.height
        if n < _MIN_INSTANCES or shift >= effect:
            return False
        after = int((merged["pos"] > merged["ref_pos"]).sum())
        # Its ranks late together: even its first line comes after the others' (one late
        # rank of a host of two puts the host's median line after theirs on its own).
        first = int((merged["pos_first"] > merged["ref_pos"]).sum())
        return min(after, first) / n >= _ORDER_SLOW and (after - n / 2) / math.sqrt(n / 4) >= _MIN_Z

    def _behind_finding(
        self,
        ctx: Context,
        comm: dict[str, Any],
        host: str,
        g: pl.DataFrame,
        metric: pl.DataFrame,
        shift: float,
        order_after: float,
    ) -> Finding:
        members = metric.filter((pl.col("comm_key") == comm["comm_key"]) & (pl.col("host") == host))
        ranks = sorted(int(r) for r in members["rank"].drop_nulls().to_list())
        first = members.sort("line_no").row(0, named=True) if members.height else None
        times = g["at"]
        return Finding(
            kind="straggler",
            severity="warning",
            message=(
                f"host {host} (ranks {ranks_text(ranks)}) is slow: its lines come after the "
                f"other hosts' in the merged log at {order_after:.0%} of collectives, yet its "
                f"clock stamps them {duration_text(abs(shift))} "
                f"{'before' if shift < 0 else 'after'} theirs: its clock is behind theirs, "
                f"and how late the node is cannot be read from the times; {_CLOCK_CHECK}"
            ),
            ranks=ranks,
            hosts=[host],
            evidence={
                "communicator": comm["comm_key"],
                "cause": "slow",
                "clock_behind": True,
                "compared_with": "hosts",
                "unit": "host",
                "ranks": ranks,
                "instances": g.height,
                "sampled_every": ctx.stride,
                "median_lateness_s": round(shift, 6),
                "order_after": round(order_after, 4),
                "slowdown": None,
                "intermittent": False,
                "window_start": _iso(times[0]),
                "window_end": _iso(times[-1]),
                "window_whole_run": True,
                "check": _CLOCK_CHECK,
            },
            lines=[LineRef(int(first["file_id"]), int(first["line_no"]))] if first else [],
        )

    def _host_verdict(
        self,
        host: str,
        ranks: list[int],
        cause: str,
        excess: float,
        slowdown: float | None,
        ev: dict[str, Any],
    ) -> tuple[Severity, str]:
        who = f"host {host} (ranks {ranks_text(ranks)})" if ranks else f"host {host}"
        share = f", {slowdown:.0%} of the gap between collectives" if slowdown else ""
        if cause == "slow":
            when = (
                f" from {ev['window_start']} to {ev['window_end']}"
                if ev.get("intermittent")
                else ""
            )
            if (ev.get("order_after") or 0.0) >= _ORDER_SLOW:
                why = (
                    "its lines come after the other hosts' in the merged log; the times "
                    "include any offset of its clock"
                )
            elif ev.get("intermittent"):
                why = "its lateness comes and goes, which a clock offset does not"
            else:
                why = (
                    f"its lateness grows with the compute before the collective: "
                    f"{duration_text(ev['lateness_after_long_gaps_s'])} after the longest "
                    f"gaps, {duration_text(ev['lateness_after_short_gaps_s'])} after the "
                    f"others, which a clock offset does not do"
                )
                clock = ev.get("clock_offset_estimate_s") or 0.0
                if abs(clock) >= MIN_EXCESS_S:
                    why += (
                        f"; the rest of what its times show, {duration_text(abs(clock))} "
                        f"{'ahead' if clock > 0 else 'behind'}, is its clock"
                    )
            critical = slowdown is not None and slowdown >= _CRITICAL_SLOWDOWN
            sev: Severity = "critical" if critical and not ev.get("intermittent") else "warning"
            return sev, (
                f"{who} is slow: its ranks arrive {duration_text(excess)} after the other "
                f"hosts' at collectives{when}{share} ({why})"
            )
        if cause == "clock":
            sev = "warning" if abs(excess) >= _BROKEN_CLOCK_S else "info"
            return sev, (
                f"host clocks differ by {duration_text(abs(excess))}: {who}'s times run "
                f"ahead of the other hosts', but its lines do not come after theirs in the "
                f"merged log (a clock offset, not a slow node); {_CLOCK_CHECK}"
            )
        sev = "warning" if abs(excess) >= _UNSYNCED_S else "info"
        return sev, (
            f"{who}'s collectives are stamped {duration_text(excess)} after the other "
            f"hosts'{share}, the same at every collective: either its clock is "
            f"{duration_text(excess)} ahead or the node is slow by a constant delay; these "
            f"logs cannot tell them apart (no merged log, no change over time); "
            f"{_CLOCK_CHECK}"
        )

    def _per_op(self, ctx: Context, comm_key: str, comm_rank: int) -> list[dict[str, object]]:
        """The straggler's lateness per collective type, AllGather first."""
        rows = (
            _with_lateness(ctx)
            .filter((pl.col("comm_key") == comm_key) & (pl.col("comm_rank") == comm_rank))
            .group_by("op")
            .agg(pl.len().alias("calls"), pl.col("late").median().alias("median_s"))
            .sort(pl.col("op") != "AllGather", "op")
        )
        return [
            {"op": r["op"], "calls": r["calls"], "median_lateness_s": round(r["median_s"], 6)}
            for r in rows.iter_rows(named=True)
        ]


def _merged(findings: list[Finding]) -> Finding:
    """One finding for several hosts whose shift has the same cause (a clock, or a clock
    or a constant delay): a job whose clocks all differ a little says it once."""
    fs = sorted(findings, key=lambda f: -abs(f.evidence["median_lateness_s"]))
    cause = fs[0].evidence["cause"]
    worst = max((f.severity for f in fs), key=SEVERITIES.index)
    shifts = ", ".join(f"{f.hosts[0]} {f.evidence['median_lateness_s'] * 1000:+.1f} ms" for f in fs)
    what = (
        "a clock offset (their lines do not come after the others' in the merged log)"
        if cause == "clock"
        else "either a clock offset or a constant delay (these logs cannot tell them apart)"
    )
    return Finding(
        kind="straggler",
        severity=worst,
        message=(
            f"{len(fs)} hosts' collectives are stamped after the other hosts' ({shifts}), "
            f"the same at every collective: {what}; {_CLOCK_CHECK}"
        ),
        ranks=[],
        hosts=sorted(f.hosts[0] for f in fs),
        evidence={
            "communicator": fs[0].evidence["communicator"],
            "cause": cause,
            "compared_with": "hosts",
            "unit": "host",
            "check": _CLOCK_CHECK,
            "by_host": [
                {
                    "host": f.hosts[0],
                    "ranks": f.evidence["ranks"],
                    "median_lateness_s": f.evidence["median_lateness_s"],
                    "order_after": f.evidence["order_after"],
                }
                for f in fs
            ],
        },
        lines=[ln for f in fs for ln in f.lines[:1]],
    )


def _ambiguous_spell(findings: list[Finding]) -> Finding:
    """Spells on several hosts that mirror each other, none told from the others."""
    hosts = sorted(f.hosts[0] for f in findings)
    windows = "; ".join(
        f"{f.hosts[0]} from {f.evidence['window_start']} to {f.evidence['window_end']}"
        for f in findings
    )
    return Finding(
        kind="straggler",
        severity="info",
        message=(
            f"hosts {', '.join(hosts)} arrived late against each other for a while "
            f"({windows}): one of them was slow then, but as each is measured against the "
            f"others (their clocks differ), a stretch of one host's lateness reads as the "
            f"rest of the run's on the other, and its lateness did not grow with the "
            f"compute before each collective as a slow node's does; look at the hosts' "
            f"step times or GPU clocks over those windows"
        ),
        ranks=[],
        hosts=hosts,
        evidence={
            "communicator": findings[0].evidence["communicator"],
            "cause": "slow_unattributed",
            "compared_with": "hosts",
            "unit": "host",
            "intermittent": True,
            "by_host": [
                {
                    "host": f.hosts[0],
                    "ranks": f.evidence["ranks"],
                    "window_start": f.evidence["window_start"],
                    "window_end": f.evidence["window_end"],
                    "window_excess_s": f.evidence.get("window_excess_s"),
                }
                for f in findings
            ],
        },
        lines=[ln for f in findings for ln in f.lines[:1]],
    )


def _quantile(xs: list[float], q: float) -> float:
    """``q``-quantile (nearest rank) of ``xs``.

    >>> _quantile([3.0, 1.0, 2.0, 4.0], 0.1), _quantile([3.0, 1.0, 2.0], 0.5)
    (1.0, 2.0)
    """
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]
