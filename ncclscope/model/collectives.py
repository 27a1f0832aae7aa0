"""The collectives table: every COLL line with its communicator, rank and sequence.

Instance key = (communicator, sequence).  The sequence is ``opCount`` (hex, per
communicator) except where a process's ``opCount`` never changes on a communicator
that it called more than once — NCCL >= 2.27 prints 0 on single-node communicators —
and there the calls are counted in log order.  The table is written to Parquet and
read lazily: a large job has tens of millions of rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ncclscope.model.identity import ANCHORED, CollOnlyComm
from ncclscope.parsers.nccl.procs import decode_proc
from ncclscope.parsers.nccl.records import LineRecords
from ncclscope.schema import COLL_STORE_SCHEMA, COLLECTIVES_SCHEMA
from ncclscope.units import DTYPE_BYTES

__all__ = [
    "P2P_OPS",
    "P2P_TOKENS",
    "CollSummary",
    "apply_host_repairs",
    "build_collectives",
    "coll_lines",
    "coll_only_comms",
    "proc_table",
    "repair_spliced_hosts",
    "summarise",
]

_PROC_COMM = ["file_id", "host", "pid", "comm"]
#: COLL rows are keyed by the raw ``host:pid:tid`` token until identity is applied: a
#: job has a few thousand distinct tokens, so splitting them once beats splitting
#: every one of tens of millions of lines.
_TOKEN_COMM = ["file_id", "proc", "comm"]
_PROCS_SCHEMA = {"proc": pl.String, "host": pl.String, "pid": pl.Int32, "tid": pl.Int32}


def coll_lines(fast: pl.LazyFrame, records: LineRecords) -> pl.LazyFrame:
    """All COLL lines, raw: the field reader's rows plus those the Python parser read.

    Columns are those of ``COLL_STORE_SCHEMA`` (``proc``, ``op_tok``, ``nranks_tok`` as
    printed); ``decode`` and the aggregations turn tokens into values.
    """
    slow_rows = [
        {
            "file_id": proc[0],
            "i": line_no,
            "proc": f"{proc[1]}:{proc[2]}:{tid}",
            "op_tok": f"{c.op}:",
            "opcount": c.opcount,
            "count": c.count,
            "dtype": c.dtype,
            "redop": c.redop,
            "root": c.root,
            "comm": c.comm,
            "nranks_tok": f"[nranks={c.nranks}]",
            "ts": ts,
        }
        for proc, line_no, tid, c, ts in records.colls
    ]
    slow = pl.DataFrame(slow_rows, schema=COLL_STORE_SCHEMA).lazy()
    return pl.concat([fast, slow], how="vertical")


def proc_table(tokens: Iterable[str]) -> pl.DataFrame:
    """Every distinct ``host:pid:tid`` token with its host, pid and tid."""
    rows = []
    for token in sorted(set(tokens)):
        decoded = decode_proc(token)
        if decoded is not None:
            rows.append({"proc": token, "host": decoded[0], "pid": decoded[1], "tid": decoded[2]})
    return pl.DataFrame(rows, schema=_PROCS_SCHEMA)


def _nranks() -> pl.Expr:
    return (
        pl.col("nranks_tok")
        .str.strip_prefix("[nranks=")
        .str.strip_suffix("]")
        .cast(pl.Int32, strict=False)
    )


#: Point-to-point ops: they involve two ranks, not every member, so per-member progress
#: and lateness leave them out.  As NCCL names them, and as the COLL line prints them.
P2P_OPS = ("Send", "Recv")
P2P_TOKENS = tuple(f"{op}:" for op in P2P_OPS)


def proc_comm_stats(lines: pl.LazyFrame, procs: pl.DataFrame) -> pl.DataFrame:
    """Per (process, comm pointer): calls, opCount range, first line, nranks; and for
    its collective calls (Send/Recv left out): how many, the last opCount, the last
    line, and a signature of what was called (a wrapping sum of a hash of op, count and
    datatype: members that made the same calls have the same one); and the first and
    last time its lines carry (``ts_min``, ``ts_max``; null without times)."""
    coll = ~pl.col("op_tok").is_in(P2P_TOKENS)
    call = pl.struct("op_tok", "count", "dtype").hash(seed=0)
    per_token = (
        lines.group_by(_TOKEN_COMM)
        .agg(
            pl.len().alias("calls"),
            pl.col("opcount").min().alias("opcount_min"),
            pl.col("opcount").max().alias("opcount_max"),
            pl.col("i").min().alias("first_line"),
            pl.col("nranks_tok").first(),
            coll.sum().alias("coll_calls"),
            pl.col("opcount").filter(coll).max().alias("coll_opcount_max"),
            pl.col("i").filter(coll).max().alias("last_line"),
            pl.when(coll).then(call).otherwise(0).sum().alias("signature"),
            pl.col("ts").min().alias("ts_min"),
            pl.col("ts").max().alias("ts_max"),
        )
        .collect(engine="streaming")
    )
    # A process logs from several threads (several tokens): merge them.
    return (
        per_token.join(procs, on="proc", how="inner")
        .with_columns(_nranks().alias("nranks"))
        .group_by(_PROC_COMM)
        .agg(
            pl.col("calls").sum(),
            pl.col("opcount_min").min(),
            pl.col("opcount_max").max(),
            pl.col("first_line").min(),
            pl.col("nranks").max(),
            pl.col("coll_calls").sum(),
            pl.col("coll_opcount_max").max(),
            pl.col("last_line").max(),
            pl.col("signature").sum(),
            pl.col("ts_min").min(),
            pl.col("ts_max").max(),
        )
    )


def repair_spliced_hosts(stats: pl.DataFrame, records: LineRecords) -> pl.DataFrame:
    """Processes on COLL lines whose host is another write's tail glued to a real host.

    ``node-a:41node-b:5202:5202 [0] NCCL INFO AllReduce: ...`` is node-b's line with
    the end of node-a's cut write in front of it.  A process the intact lines never
    mention, whose host ends with the host of a known process with the same pid, is that
    process.  Returns (file_id, host, pid, fixed_host, calls, first_line) per repair.
    """
    known: dict[tuple[int, int], list[str]] = {}
    for file_id, host, pid in records.procs:
        known.setdefault((file_id, pid), []).append(host)
    rows = []
    seen = stats.group_by("file_id", "host", "pid").agg(
        pl.col("calls").sum(), pl.col("first_line").min()
    )
    for r in seen.iter_rows(named=True):
        if (r["file_id"], r["host"], r["pid"]) in records.procs:
            continue
        hosts = known.get((r["file_id"], r["pid"]), [])
        match = max((h for h in hosts if r["host"].endswith(h)), key=len, default=None)
        if match is not None and match != r["host"]:
            rows.append({**r, "fixed_host": match})
    return pl.DataFrame(
        rows,
        schema={
            "file_id": pl.UInt32,
            "host": pl.String,
            "pid": pl.Int32,
            "calls": pl.UInt32,
            "first_line": pl.UInt32,
            "fixed_host": pl.String,
        },
    )


def apply_host_repairs(procs: pl.DataFrame, repairs: pl.DataFrame) -> pl.DataFrame:
    """The token table with the hosts ``repair_spliced_hosts`` found rewritten."""
    if repairs.is_empty():
        return procs
    fix = repairs.select("host", "pid", "fixed_host").unique(["host", "pid"])
    return (
        procs.join(fix, on=["host", "pid"], how="left")
        .with_columns(pl.coalesce("fixed_host", "host").alias("host"))
        .select(list(_PROCS_SCHEMA))
    )


def coll_only_comms(stats: pl.DataFrame) -> list[CollOnlyComm]:
    """Every (process, comm pointer) on COLL lines, as identity fallback candidates."""
    return [
        CollOnlyComm((r["file_id"], r["host"], r["pid"]), r["comm"], r["nranks"], r["first_line"])
        for r in stats.iter_rows(named=True)
    ]


def build_collectives(
    lines: pl.LazyFrame,
    stats: pl.DataFrame,
    members: pl.DataFrame,
    procs: pl.DataFrame,
    out_dir: Path,
    *,
    ts_source: str = "nccl",
) -> pl.LazyFrame:
    """The collectives table (``COLLECTIVES_SCHEMA``) as a lazy query over the stores.

    ``ts_source`` names where the lines' times came from (``nccl``, or ``stamped`` by
    the agent on arrival).

    Nothing is materialised here: a large job has tens of millions of rows, and each
    consumer aggregates them in one streaming pass.  Only the calls of communicators
    whose ``opCount`` is constant need counting in order; those few rows are written
    to ``out_dir``.
    """
    # (file_id, token, comm) -> identity; every row's host and pid come with it.  A
    # member named only by its teardown line (``identity.ANCHORED``) may have lost its
    # first calls with the log's head: where its own opCount does not count (0 on 2.27+
    # single node, or one call), its calls are counted from wherever the log starts, no
    # sequence to set beside the others'.  Its rows keep no rank, as without it.
    unsure = ~ANCHORED & (pl.col("opcount_min") == pl.col("opcount_max")).fill_null(value=True)
    mapping = (
        members.join(
            stats.select(*_PROC_COMM, "opcount_min", "opcount_max"), on=_PROC_COMM, how="left"
        )
        .select(
            *_PROC_COMM,
            "comm_key",
            *(
                pl.when(unsure).then(None).otherwise(pl.col(c)).alias(c)
                for c in ("comm_rank", "rank")
            ),
        )
        .join(procs, on=["host", "pid"], how="inner")
        .select(*_TOKEN_COMM, "host", "pid", "tid", "comm_key", "comm_rank", "rank")
    )
    counted = (
        stats.filter((pl.col("opcount_min") == pl.col("opcount_max")) & (pl.col("calls") > 1))
        .select(_PROC_COMM)
        .join(mapping.select(*_TOKEN_COMM, "host", "pid"), on=_PROC_COMM, how="inner")
        .select(_TOKEN_COMM)
    )
    enriched = lines.join(mapping.lazy(), on=_TOKEN_COMM, how="left").with_columns(
        pl.col("op_tok").str.strip_suffix(":").alias("op"),
        _nranks().alias("nranks"),
        _size_bytes().alias("size_bytes"),
        pl.when(pl.col("ts").is_not_null())
        .then(pl.lit(ts_source))
        .otherwise(pl.lit("none"))
        .alias("ts_source"),
        pl.col("i").alias("line_no"),
    )
    by_opcount = (
        enriched.join(counted.lazy(), on=_TOKEN_COMM, how="anti")
        .with_columns(pl.col("opcount").alias("seq"))
        .select(list(COLLECTIVES_SCHEMA))
        .cast(COLLECTIVES_SCHEMA)
    )
    if not counted.height:
        return by_opcount
    out_dir.mkdir(parents=True, exist_ok=True)
    part = out_dir / "counted.parquet"
    # Only these rows need a window in memory: count each process's calls in order.
    (
        enriched.join(counted.lazy(), on=_TOKEN_COMM, how="semi")
        .sort("file_id", "i")
        .with_columns(pl.int_range(pl.len()).over(_PROC_COMM).cast(pl.Int64).alias("seq"))
        .select(list(COLLECTIVES_SCHEMA))
        .cast(COLLECTIVES_SCHEMA)
        .sink_parquet(part, engine="in-memory")
    )
    return pl.concat([by_opcount, pl.scan_parquet(part)])


@dataclass(frozen=True)
class CollSummary:
    """Aggregates of the collectives table for reports."""

    calls: int
    instances: int
    with_ts: int
    by_op: dict[str, int]
    by_op_size: pl.DataFrame  # op, size_bytes_min, calls, total_bytes
    per_comm: pl.DataFrame  # comm_key, calls, instances, last_seq


def _size_bytes() -> pl.Expr:
    elem = pl.col("dtype").replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64)
    return pl.col("count") * elem


def _merged_length(intervals: list[tuple[int, int]]) -> int:
    """Integers covered by the union of closed intervals: ``[(0, 4), (3, 9)] -> 10``."""
    total = 0
    end = None
    for lo, hi in sorted(intervals):
        if end is None or lo > end:
            total += hi - lo + 1
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


def summarise(
    lines: pl.LazyFrame, collectives: pl.LazyFrame, stats: pl.DataFrame, members: pl.DataFrame
) -> CollSummary:
    """Calls, instances and size histograms with memory that does not grow with the log.

    The size histogram groups by (op, datatype, count), a few thousand groups, and
    computes sizes on the result.  Instances (distinct (communicator, sequence)) come
    from each member's sequence range: a process's calls on one communicator are
    ``calls`` consecutive sequence numbers in every normal log, so the union of the
    members' ranges counts them exactly; a member with gaps sends its communicator
    through an exact distinct count instead.
    """
    per_count = (
        lines.group_by("op_tok", "dtype", "count")
        .agg(pl.len().alias("calls"), pl.col("ts").is_not_null().sum().alias("with_ts"))
        .collect(engine="streaming")
        .with_columns(_size_bytes().alias("size_bytes"))
    )
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
        per_count.group_by(
            pl.col("op_tok").str.strip_suffix(":").alias("op"), bucket.alias("size_bytes_min")
        )
        .agg(
            pl.col("calls").sum().cast(pl.Int64),
            (pl.col("size_bytes") * pl.col("calls")).sum().alias("total_bytes"),
            pl.col("with_ts").sum(),
        )
        .sort("op", "size_bytes_min")
    )
    per_comm = _instances(collectives, stats, members)
    by_op = by_op_size.group_by("op").agg(pl.col("calls").sum()).sort("op")
    return CollSummary(
        calls=int(by_op_size["calls"].sum()),
        instances=int(per_comm["instances"].sum()),
        with_ts=int(by_op_size["with_ts"].sum()),
        by_op={r["op"]: int(r["calls"]) for r in by_op.iter_rows(named=True)},
        by_op_size=by_op_size.drop("with_ts"),
        per_comm=per_comm,
    )


def _instances(
    collectives: pl.LazyFrame, stats: pl.DataFrame, members: pl.DataFrame
) -> pl.DataFrame:
    """Per communicator: calls, distinct sequences (instances) and the last sequence."""
    counted = (pl.col("opcount_min") == pl.col("opcount_max")) & (pl.col("calls") > 1)
    ranges = stats.join(members.select(*_PROC_COMM, "comm_key"), on=_PROC_COMM, how="left").select(
        "comm_key",
        pl.col("calls").cast(pl.Int64),
        pl.when(counted).then(0).otherwise(pl.col("opcount_min")).alias("lo"),
        pl.when(counted).then(pl.col("calls") - 1).otherwise(pl.col("opcount_max")).alias("hi"),
    )
    gapped = set(
        ranges.filter(pl.col("hi") - pl.col("lo") + 1 != pl.col("calls"))["comm_key"].to_list()
    )
    rows = []
    for (key,), group in ranges.filter(~pl.col("comm_key").is_in(list(gapped))).group_by(
        "comm_key"
    ):
        intervals = list(zip(group["lo"].to_list(), group["hi"].to_list(), strict=True))
        rows.append(
            {
                "comm_key": key,
                "calls": int(group["calls"].sum()),
                "instances": _merged_length(intervals),
                "last_seq": max(hi for _lo, hi in intervals),
            }
        )
    schema = pl.Schema(
        {"comm_key": pl.String, "calls": pl.Int64, "instances": pl.Int64, "last_seq": pl.Int64}
    )
    exact = pl.DataFrame(rows, schema=schema)
    if not gapped:
        return exact
    slow = (
        collectives.filter(pl.col("comm_key").is_in(list(gapped)))
        .group_by("comm_key", "seq")
        .agg(pl.len().alias("calls"))
        .group_by("comm_key")
        .agg(
            pl.col("calls").sum().cast(pl.Int64),
            pl.len().cast(pl.Int64).alias("instances"),
            pl.col("seq").max().alias("last_seq"),
        )
        .collect(engine="streaming")
    )
    return pl.concat([exact, slow.cast(schema)])
