"""How long a job's collectives have ever waited: the bound past which a wait is a stall.

A stalled collective is one that some members entered and another has not, for longer
than the job has ever taken to get there.  Per communicator, over every instance the
logs hold: the median time between consecutive collectives (first arrivals), and the
longest any instance's first member waited for its last (``longest_wait_s``: a
checkpoint that rank 0 writes while the others wait at a barrier, an evaluation on one
rank, recur at the same place and show here).  The bound is the largest of
``EARLY_STALL_S``, ``EARLY_GAP_MULTIPLE`` gaps and ``HISTORY_MARGIN`` times the longest
wait; where the logs hold too few instances to say what is normal, there is none
(``watchdog.stop_evidence`` then keeps its minutes-long bound, as it does post-mortem
without a clock: a log that goes on past a stall, nobody watching, is not the alarm).

A pause nobody has seen before (the job's first checkpoint) is past any history: named
at ``warning`` like a stall, at worst once; ``critical`` needs the job's own evidence.

The agent exports the bound (``ncclscope_collective_wait_bound_seconds``) from each
analysis of its window, so the rules name a stall at the same point ``analyze`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from ncclscope.detect.context import Context

__all__ = [
    "BOUND_METRIC",
    "EARLY_GAP_MULTIPLE",
    "EARLY_STALL_S",
    "HISTORY_MARGIN",
    "MIN_HISTORY",
    "WAIT_BOUNDS_SCHEMA",
    "wait_bounds",
]

#: A stall is named at ``warning`` after the waiters waited at least this long (the
#: issue's 60 s less the agent's and the rules' delay, ~2 s measured, and a margin; above
#: it, fewer of the pauses a job makes once, a first checkpoint, are named) ...
EARLY_STALL_S = 45.0
#: ... and this many of the communicator's median gaps between collectives ...
EARLY_GAP_MULTIPLE = 5.0
#: ... and this many times the longest wait its history shows.
HISTORY_MARGIN = 1.5
#: Instances with times needed before a communicator's history says what is normal.
MIN_HISTORY = 10
#: The series the agent exports the bound as, per communicator.
BOUND_METRIC = "ncclscope_collective_wait_bound_seconds"

WAIT_BOUNDS_SCHEMA = pl.Schema(
    {
        "comm_key": pl.String,
        "instances": pl.UInt32,
        "gap_s": pl.Float64,
        "longest_wait_s": pl.Float64,
        "bound_s": pl.Float64,
    }
)

#: Where ``wait_bounds`` keeps its table on the context (computed once per analysis).
_KEY = "_wait_bounds"


def wait_bounds(ctx: Context) -> pl.DataFrame:
    """Per communicator with history enough: its instances with times, median gap,
    longest wait and the bound (``WAIT_BOUNDS_SCHEMA``).  One pass over the calls."""
    memo = vars(ctx)
    found = memo.get(_KEY)
    if found is None:
        found = memo[_KEY] = _wait_bounds(ctx)
    assert isinstance(found, pl.DataFrame)
    return found


def _wait_bounds(ctx: Context) -> pl.DataFrame:
    coll = ctx.collectives()
    if coll is None:
        return pl.DataFrame(schema=WAIT_BOUNDS_SCHEMA)
    inst = (
        coll.filter(pl.col("ts").is_not_null())
        .group_by("comm_key", "seq")
        .agg(pl.col("ts").min().alias("first"), pl.col("ts").max().alias("last"))
        .sort("comm_key", "seq")
        .with_columns(
            (
                (pl.col("first").diff().over("comm_key").dt.total_microseconds() / 1e6)
                / pl.col("seq").diff().over("comm_key").cast(pl.Float64)
            ).alias("gap_s"),
            ((pl.col("last") - pl.col("first")).dt.total_microseconds() / 1e6).alias("wait_s"),
        )
        .group_by("comm_key")
        .agg(
            pl.len().cast(pl.UInt32).alias("instances"),
            pl.col("gap_s").filter(pl.col("gap_s") >= 0).median().alias("gap_s"),
            pl.col("wait_s").max().alias("longest_wait_s"),
        )
        .filter(pl.col("instances") >= MIN_HISTORY)
        .collect(engine="streaming")
    )
    return (
        inst.with_columns(
            pl.max_horizontal(
                pl.lit(EARLY_STALL_S),
                EARLY_GAP_MULTIPLE * pl.col("gap_s").fill_null(0.0),
                HISTORY_MARGIN * pl.col("longest_wait_s").fill_null(0.0),
            ).alias("bound_s")
        )
        .select(list(WAIT_BOUNDS_SCHEMA))
        .cast(WAIT_BOUNDS_SCHEMA)
        .sort("comm_key")
    )
