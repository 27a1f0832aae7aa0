"""Inspector records joined to the logs' COLL lines: sizes from the logs, times from
Inspector.

Inspector names a collective by (communicator hash, rank in it, op, ``coll_sn``), where
``coll_sn`` counts that op's calls on that communicator from 0; a COLL line by
(communicator, rank, ``seq``), where ``seq`` counts every call.  The communicator hash
is the ``commId`` of NCCL's Init lines (the logs' ``comm_key`` where it was printed), so
the k-th COLL line of op X of a member is Inspector's record ``sn = k`` of op X.  The
join checks itself: ``agree`` is set where the COLL line's size is the record's
``coll_msg_size_bytes`` (both are count x type size).
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from ncclscope.model.tools import ToolTables
from ncclscope.parsers.tools.inspector import normalise_hash
from ncclscope.schema import INSPECTOR_JOIN_SCHEMA, validate

__all__ = ["INSPECTOR_UNJOINED", "join_inspector"]

#: Why Inspector records joined no COLL line (``ToolTables.inspector_unjoined``).
INSPECTOR_UNJOINED = {
    "no_coll_lines": "no COLL lines among the logs",
    "no_comm_ids": (
        "the logs name no communicator by its commId (the Init lines that print it are "
        "not there: log head cut, or NCCL_DEBUG_SUBSYS without INIT)"
    ),
    "other_communicators": "the logs' communicators are not the ones Inspector measured",
    "no_matching_calls": "no call of the logs lines up with a record (rank, op, order)",
}


def join_inspector(tools: ToolTables, collectives: pl.LazyFrame | None) -> ToolTables:
    """``tools`` with ``inspector_joined`` filled from the COLL lines."""
    if tools.inspector.is_empty():
        return tools
    if collectives is None:
        return replace(tools, inspector_unjoined="no_coll_lines")
    lines = (
        collectives.select("comm_key", "comm_rank", "rank", "op", "seq", "size_bytes")
        .filter(pl.col("comm_key").str.starts_with("0x"))
        .unique(["comm_key", "comm_rank", "seq"])
        .sort("comm_key", "comm_rank", "op", "seq")
        .with_columns(
            normalise_hash(pl.col("comm_key")).alias("comm_hash"),
            (pl.col("seq").rank("ordinal").over("comm_key", "comm_rank", "op") - 1)
            .cast(pl.Int64)
            .alias("sn"),
        )
    )
    joined = (
        tools.inspector.lazy()
        .join(lines, on=["comm_hash", "comm_rank", "op", "sn"], how="inner")
        .with_columns((pl.col("size_bytes") == pl.col("msg_size_bytes")).alias("agree"))
        .select(list(INSPECTOR_JOIN_SCHEMA))
        .sort("comm_key", "op", "sn", "comm_rank")
        .collect()
    )
    why = None
    if joined.is_empty():
        keys = lines.select("comm_hash").unique().collect()["comm_hash"]
        why = (
            "no_comm_ids"
            if keys.is_empty()
            else "other_communicators"
            if not tools.inspector["comm_hash"].is_in(keys.implode()).any()
            else "no_matching_calls"
        )
    return replace(
        tools,
        inspector_joined=validate(joined, INSPECTOR_JOIN_SCHEMA, "inspector_joined"),
        inspector_unjoined=why,
    )
