"""Tables several detectors share, computed once per run from the collectives table.

The collectives table of a 1 GiB log has millions of rows and lives in Parquet; each
table here is one streaming pass over it, kept only as aggregates (per rank, per
collective instance), so memory does not grow with the log.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING

import polars as pl

from ncclscope.schema import INSTANCES_SCHEMA, PROGRESS_SCHEMA

if TYPE_CHECKING:
    from ncclscope.analysis import Analysis

__all__ = ["P2P_OPS", "Context"]

#: Point-to-point calls involve two ranks, not the whole communicator: they are left out
#: of progress and lateness, which compare every member of a collective.
P2P_OPS = ("Send", "Recv")


@dataclass
class Context:
    """One analysis and the shared tables the detectors read."""

    analysis: Analysis

    def _collectives(self) -> pl.LazyFrame | None:
        coll = self.analysis.collectives
        if coll is None:
            return None
        return coll.filter(~pl.col("op").is_in(P2P_OPS) & pl.col("comm_key").is_not_null())

    @cached_property
    def progress(self) -> pl.DataFrame:
        """Per (communicator, member): calls, the last sequence reached and that call's
        op, count, datatype, line and time."""
        coll = self._collectives()
        if coll is None:
            return pl.DataFrame(schema=PROGRESS_SCHEMA)
        key = ["comm_key", "comm_rank"]
        last = (
            coll.group_by(key)
            .agg(pl.len().alias("calls"), pl.col("seq").max().alias("last_seq"))
            .collect(engine="streaming")
        )
        rows = (
            coll.join(
                last.lazy(),
                left_on=[*key, "seq"],
                right_on=[*key, "last_seq"],
                how="inner",
            )
            .group_by(key)
            .agg(pl.all().sort_by("line_no").last())
            .collect(engine="streaming")
        )
        return (
            last.join(rows, on=key, how="left")
            .select(list(PROGRESS_SCHEMA))
            .cast(PROGRESS_SCHEMA)
            .sort(key)
        )

    @cached_property
    def instances(self) -> pl.DataFrame:
        """Per collective instance (communicator, sequence): members that logged it, how
        many distinct ops, counts and datatypes they logged, and their first and last
        arrival times."""
        coll = self._collectives()
        if coll is None:
            return pl.DataFrame(schema=INSTANCES_SCHEMA)
        return (
            coll.group_by("comm_key", "seq")
            .agg(
                pl.len().alias("n"),
                pl.col("op").n_unique().alias("ops"),
                pl.col("count").n_unique().alias("counts"),
                pl.col("dtype").n_unique().alias("dtypes"),
                pl.col("ts").min().alias("ts_min"),
                pl.col("ts").max().alias("ts_max"),
                pl.col("ts").is_not_null().sum().alias("with_ts"),
            )
            .collect(engine="streaming")
            .cast(INSTANCES_SCHEMA)
            .sort("comm_key", "seq")
        )

    def rows_at(self, comm_key: str, seqs: list[int]) -> pl.DataFrame:
        """Every member's call at these sequences of one communicator."""
        coll = self._collectives()
        if coll is None or not seqs:
            return pl.DataFrame()
        return (
            coll.filter(
                (pl.col("comm_key") == comm_key)
                & pl.col("seq").is_in(pl.Series(seqs, dtype=pl.Int64).implode())
            )
            .collect(engine="streaming")
            .sort("seq", "comm_rank")
        )

    @cached_property
    def members(self) -> pl.DataFrame:
        """Per communicator: every member known from init lines or calls, by comm rank."""
        m = self.analysis.identity.members
        return (
            m.filter(pl.col("comm_rank").is_not_null())
            .group_by("comm_key", "comm_rank")
            .agg(pl.col("rank", "host", "file_id", "line_no").first())
            .sort("comm_key", "comm_rank")
        )

    @cached_property
    def world_key(self) -> str | None:
        return self.analysis.identity.world_key

    @cached_property
    def last_ts(self) -> datetime | None:
        """The latest time any line of the logs carries ("the end of the logs")."""
        a = self.analysis
        fw = a.frameworks
        candidates = [
            self.instances["ts_max"].max(),
            a.errors["ts"].max(),
            fw.timeouts["ts"].max(),
            fw.failures["ts"].max(),
            fw.torch_events["ts"].max(),
            fw.timers["ts"].max(),
        ]
        times = [t for t in candidates if isinstance(t, datetime)]
        return max(times) if times else None
