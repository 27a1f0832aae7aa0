"""Lateness: how long after a collective instance's first arrival each member arrived,
and the stretch of instances over which a unit (a rank, a host) stood late.

The metric of the straggler detector (``detect/straggler.py``) and of the agent's live
lateness.  NCCL logs a COLL line when the call is enqueued, so with sub-second
timestamps on those lines a rank's arrival at each collective instance is known.

* ``lateness``: per communicator member, its lateness over the instances every member
  logged with a time (``LATENESS_SCHEMA``), and the communicator's median gap between
  collectives.
* ``within_host_rows``: each member's lateness after its own host's first member (one
  clock: a host's offset cancels).
* ``find_window``: the stretch of a unit's series that stood highest above its baseline
  (a CUSUM-like search with half the minimum effect as allowance, kept when its median
  exceeds the rest's by the minimum effect and stands ``MIN_Z`` robust standard errors
  above the noise), and ``window_evidence``: its start, end and cost.

Every threshold is a minimum effect (``MIN_SLOWDOWN`` of the gap between collectives,
``MIN_EXCESS_S``) and a noise bound (robust z from the median absolute deviation).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import polars as pl

from ncclscope.detect.config import subsecond_digits_unreliable
from ncclscope.detect.context import Context
from ncclscope.schema import LATENESS_SCHEMA

__all__ = [
    "CRITICAL_SLOWDOWN",
    "MIN_EXCESS_S",
    "MIN_INSTANCES",
    "MIN_SLOWDOWN",
    "MIN_WINDOW",
    "MIN_Z",
    "WHOLE_RUN",
    "Window",
    "find_window",
    "iso",
    "lateness",
    "mad",
    "may_hold_spell",
    "quantile",
    "sorted_median",
    "timing_usable",
    "window_evidence",
    "with_lateness",
    "within_host_rows",
]

#: Excess median lateness, as a share of the median gap between collectives, from which
#: a member is a straggler.
MIN_SLOWDOWN = 0.05
#: ...and at least this much in absolute terms (timestamps are microseconds, but hosts'
#: clocks and the logging path add jitter of that order).
MIN_EXCESS_S = 0.0005
#: Instances a member must have been timed at.
MIN_INSTANCES = 20
#: Excess lateness must also stand this many robust standard deviations (1.4826 x the
#: median absolute deviation of the members' medians) above the typical member.
MIN_Z = 4.0
#: Excess, as a share of the gap, from which a straggler is critical.
CRITICAL_SLOWDOWN = 0.25
#: File order.  In a stream merged as its lines were written (one launcher reading every
#: Instances a window of slowness must span.
MIN_WINDOW = 10
#: Instances each side of a comparison of medians must hold (long against short gaps):
#: A window that covers this share of the run is the whole run.
WHOLE_RUN = 0.8


def timing_usable(ctx: Context) -> bool:
    """COLL lines carry sub-second times that can be trusted."""
    a = ctx.analysis
    if a.summary is None or a.summary.with_ts == 0:
        return False
    if subsecond_digits_unreliable(a.nccl_versions):
        return False
    inst = ctx.instances.filter(pl.col("with_ts") > 0).head(2000)
    return bool((inst["ts_min"].dt.microsecond() != 0).any())


def with_lateness(ctx: Context) -> pl.DataFrame:
    """``_lateness_rows``, computed once per context: the metric, the hosts' comparison
    and each finding's per-op breakdown all read it, and on a large job it is a join of
    the whole sample (tens of milliseconds each time)."""
    memo = vars(ctx)
    rows = memo.get(_ROWS_KEY)
    if not isinstance(rows, pl.DataFrame):
        rows = memo[_ROWS_KEY] = _lateness_rows(ctx)
    return rows


#: Where ``with_lateness`` keeps its table on the context (as ``cached_property`` does).
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


def within_host_rows(ctx: Context) -> pl.DataFrame:
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
    rows = with_lateness(ctx)
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


def mad(xs: list[float], centre: float) -> float:
    return statistics.median(abs(x - centre) for x in xs) * 1.4826 if xs else 0.0


def sorted_median(ordered: pl.Series) -> float:
    """``statistics.median`` of an already sorted series (the mean of the two middle
    values of an even count, as it computes it).

    >>> sorted_median(pl.Series([1.0, 2.0, 4.0, 8.0])), sorted_median(pl.Series([3.0]))
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
    spans ``MIN_WINDOW`` instances, its median is at least ``effect_s`` above the median
    outside it (or the baseline, when it is the whole series) and that difference stands
    ``MIN_Z`` robust standard errors above the noise.

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
    if span is None or span[1] - span[0] + 1 < MIN_WINDOW:
        return None
    inside = xs[span[0] : span[1] + 1]
    outside = xs[: span[0]] + xs[span[1] + 1 :]
    level = statistics.median(inside)
    if len(outside) >= MIN_WINDOW:
        ref = statistics.median(outside)
        noise = mad(outside, ref)
    else:
        ref = baseline
        noise = mad(inside, level)
    excess = level - ref
    # The median's standard error is about 1.25 sigma / sqrt(n); the floor keeps a
    # noiseless series (synthetic, or rounded times) from dividing by zero.
    se = 1.253 * max(noise, 1e-6) / math.sqrt(len(inside))
    if excess < effect_s or excess / se < MIN_Z:
        return None
    return Window(span[0], span[1], excess, excess / se)


def may_hold_spell(x: pl.Expr, effect: float) -> pl.Expr:
    """Aggregated over one rank's lateness ``x`` in instance order: whether a spell
    (``_rank_spells``) can be found at all, tested on the whole series at once instead of
    a search per rank, which on a large job is most of the detector's time.

    A spell is a window of at least ``MIN_WINDOW`` instances, under ``WHOLE_RUN`` of
    the series, whose median is ``effect`` above the median of the rest (or of the whole
    series).  The rest holds over a fifth of the instances, so its median is at least the
    series' ``n / 10 - 2``-th smallest value (``floor``); the window's median reaches
    ``effect`` above that only if at least half its instances do.  So some stretch of
    ``MIN_WINDOW`` or more instances must have as many at that level as below it: with
    ``+1``/``-1`` per instance, a stretch whose sum is not negative (integer prefix sums,
    exact).  The tolerance keeps a value a rounding away from the level in.

    >>> import polars as pl
    >>> def may(xs: list[float]) -> bool:
    ...     return pl.DataFrame({"x": xs}).select(may_hold_spell(pl.col("x"), 0.002)).item()
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
    lowest = total.shift(MIN_WINDOW).fill_null(0).cum_min()
    row = pl.int_range(pl.len())
    return ((total - lowest >= 0) & (row >= MIN_WINDOW - 1)).any()


def iso(t: datetime) -> str:
    return t.isoformat(timespec="microseconds")


def window_evidence(
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
        "window_start": iso(times[first]),
        "window_end": iso(times[last]),
        "window_instances": last - first + 1,
        "window_whole_run": w is None or (last - first + 1) >= WHOLE_RUN * len(xs),
        "window_cost_s": round(lost, 6),
    }
    if others is not None:
        out["window_cost_gpu_s"] = round(lost * others, 3)
    return out


def quantile(xs: list[float], q: float) -> float:
    """``q``-quantile (nearest rank) of ``xs``.

    >>> quantile([3.0, 1.0, 2.0, 4.0], 0.1), quantile([3.0, 1.0, 2.0], 0.5)
    (1.0, 2.0)
    """
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]
