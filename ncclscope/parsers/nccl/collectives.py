"""The collectives table: every COLL line with its communicator, rank and sequence.

Instance key = (communicator, sequence).  The sequence is ``opCount`` (hex, per
communicator) except where a process's ``opCount`` never changes on a communicator
that it called more than once — NCCL >= 2.27 prints 0 on single-node communicators —
and there the calls are counted in log order.  The table is written to Parquet and
read lazily: a large job has tens of millions of rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ncclscope.parsers.nccl.identity import CollOnlyComm
from ncclscope.parsers.nccl.records import LineRecords
from ncclscope.schema import COLL_STORE_SCHEMA, COLLECTIVES_SCHEMA
from ncclscope.units import DTYPE_BYTES

__all__ = ["CollSummary", "build_collectives", "coll_lines", "coll_only_comms", "summarise"]

_PROC_COMM = ["file_id", "host", "pid", "comm"]


def coll_lines(coll_stores: list[Path], records: LineRecords) -> pl.LazyFrame:
    """All COLL lines: the field reader's rows plus those the Python parser read."""
    schema = dict(COLL_STORE_SCHEMA) | {"tid": pl.Int32}
    fast = (
        pl.scan_parquet(coll_stores).with_columns(pl.lit(None, dtype=pl.Int32).alias("tid"))
        if coll_stores
        else pl.LazyFrame(schema=schema)
    )
    slow_rows = [
        {
            "file_id": proc[0],
            "i": line_no,
            "host": proc[1],
            "pid": proc[2],
            "op": c.op,
            "opcount": c.opcount,
            "count": c.count,
            "dtype": c.dtype,
            "redop": c.redop,
            "root": c.root,
            "comm": c.comm,
            "nranks": c.nranks,
            "ts": ts,
            "tid": tid,
        }
        for proc, line_no, tid, c, ts in records.colls
    ]
    slow = pl.DataFrame(slow_rows, schema=schema).lazy()
    return pl.concat([fast, slow], how="vertical")


def coll_only_comms(stats: pl.DataFrame) -> list[CollOnlyComm]:
    """Every (process, comm pointer) on COLL lines, as identity fallback candidates."""
    return [
        CollOnlyComm((r["file_id"], r["host"], r["pid"]), r["comm"], r["nranks"], r["first_line"])
        for r in stats.iter_rows(named=True)
    ]


def proc_comm_stats(lines: pl.LazyFrame) -> pl.DataFrame:
    """Per (process, comm pointer): calls, opCount range, first line, nranks."""
    return (
        lines.group_by(_PROC_COMM)
        .agg(
            pl.len().alias("calls"),
            pl.col("opcount").min().alias("opcount_min"),
            pl.col("opcount").max().alias("opcount_max"),
            pl.col("i").min().alias("first_line"),
            pl.col("nranks").max().alias("nranks"),
        )
        .collect(engine="streaming")
    )


def build_collectives(
    lines: pl.LazyFrame, stats: pl.DataFrame, members: pl.DataFrame, out_dir: Path
) -> pl.LazyFrame:
    """Write the collectives table under ``out_dir`` and return a lazy scan of it."""
    counted = stats.filter(
        (pl.col("opcount_min") == pl.col("opcount_max")) & (pl.col("calls") > 1)
    ).select(_PROC_COMM)
    mapping = members.select(*_PROC_COMM, "comm_key", "comm_rank", "rank")
    sizes = pl.DataFrame(
        {"dtype": list(DTYPE_BYTES), "elem_bytes": list(DTYPE_BYTES.values())},
        schema={"dtype": pl.Int16, "elem_bytes": pl.Int64},
    )
    enriched = (
        lines.join(mapping.lazy(), on=_PROC_COMM, how="left")
        .join(sizes.lazy(), on="dtype", how="left")
        .with_columns(
            (pl.col("count") * pl.col("elem_bytes")).alias("size_bytes"),
            pl.when(pl.col("ts").is_not_null()).then(pl.lit("nccl")).otherwise(pl.lit("none"))
            .alias("ts_source"),
            pl.col("i").alias("line_no"),
        )
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    by_opcount = (
        enriched.join(counted.lazy(), on=_PROC_COMM, how="anti")
        .with_columns(pl.col("opcount").alias("seq"))
        .select(list(COLLECTIVES_SCHEMA))
        .cast(dict(COLLECTIVES_SCHEMA))
    )
    by_opcount.sink_parquet(out_dir / "collectives-0.parquet", engine="streaming")
    if counted.height:
        # Only these rows need a window in memory: count each process's calls in order.
        by_count = (
            enriched.join(counted.lazy(), on=_PROC_COMM, how="semi")
            .sort("file_id", "i")
            .with_columns((pl.int_range(pl.len()).over(_PROC_COMM)).cast(pl.Int64).alias("seq"))
            .select(list(COLLECTIVES_SCHEMA))
            .cast(dict(COLLECTIVES_SCHEMA))
        )
        by_count.sink_parquet(out_dir / "collectives-1.parquet", engine="in-memory")
    return pl.scan_parquet(out_dir / "collectives-*.parquet")


@dataclass(frozen=True)
class CollSummary:
    """Aggregates of the collectives table for reports."""

    calls: int
    instances: int
    with_ts: int
    by_op: dict[str, int]
    by_op_size: pl.DataFrame  # op, size_bytes_min, calls, total_bytes
    per_comm: pl.DataFrame  # comm_key, calls, last_seq


def summarise(collectives: pl.LazyFrame) -> CollSummary:
    """Calls, instances and size histograms, each as a streaming aggregation."""
    totals = collectives.select(
        pl.len().alias("calls"), pl.col("ts").is_not_null().sum().alias("with_ts")
    ).collect(engine="streaming")
    instances = (
        collectives.group_by("comm_key", "seq").agg(pl.len()).select(pl.len())
        .collect(engine="streaming").item()
    )
    by_op = collectives.group_by("op").agg(pl.len().alias("calls")).collect(engine="streaming")
    bucket = (
        pl.when(pl.col("size_bytes").fill_null(0) <= 0)
        .then(pl.lit(0, dtype=pl.Int64))
        .otherwise(
            pl.lit(4, dtype=pl.Int64).pow(
                pl.col("size_bytes").cast(pl.Float64).log(4).floor().cast(pl.Int64)
            )
        )
    )
    by_op_size = (
        collectives.with_columns(bucket.alias("size_bytes_min"))
        .group_by("op", "size_bytes_min")
        .agg(pl.len().alias("calls"), pl.col("size_bytes").sum().alias("total_bytes"))
        .sort("op", "size_bytes_min")
        .collect(engine="streaming")
    )
    per_comm = (
        collectives.group_by("comm_key")
        .agg(pl.len().alias("calls"), pl.col("seq").max().alias("last_seq"))
        .collect(engine="streaming")
    )
    return CollSummary(
        calls=int(totals["calls"][0]),
        instances=int(instances),
        with_ts=int(totals["with_ts"][0]),
        by_op={r["op"]: int(r["calls"]) for r in by_op.sort("op").iter_rows(named=True)},
        by_op_size=by_op_size,
        per_comm=per_comm,
    )
