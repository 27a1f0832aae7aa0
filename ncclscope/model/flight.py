"""The Flight Recorder's tables, and each process group mapped to the logs' communicator.

PyTorch numbers a process group's collectives per rank (``collective_seq_id``, from 1,
one per kernel launch: a coalesced group is one); NCCL numbers a communicator's calls
(``opCount``, from 0, the COLL lines' ``seq`` here).  They are different counters: a
process group's NCCL communicator is created at its first collective, NCCL calls that
PyTorch makes outside the recorder (and point-to-point calls on the same communicator)
move one against the other.  Where the calls map one to one, ``seq = collective_seq_id +
offset`` with one offset per (group, communicator); here it is found, not assumed:

1. membership: the communicators whose members' global ranks are the group's ranks
   (``pg_config``) and whose size is the group's;
2. candidate offsets: per rank in both, the last COLL sequence minus the dump's last
   ``collective_seq_id`` (a dump is written when the job stops, and the log ends there
   too), plus the offset that pairs the dump's first entry with the same sequence;
3. each candidate is checked on every entry: the COLL line at ``collective_seq_id +
   offset`` of the same rank must have the entry's op and count.  The offset with the
   most agreeing entries wins if at least half the entries that have a line agree.

When no communicator has the group's members, or no offset makes the calls agree, the
group is not joined and ``FLIGHT_PG_COMMS_SCHEMA.reason`` says which.  Send and Recv are
left out: PyTorch runs a lone point-to-point pair on a communicator of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import polars as pl

from ncclscope.parsers.torch.flight import DumpRead, dump_frames, read_dump
from ncclscope.schema import (
    FLIGHT_DUMPS_SCHEMA,
    FLIGHT_GROUPS_SCHEMA,
    FLIGHT_JOIN_SCHEMA,
    FLIGHT_PG_COMMS_SCHEMA,
    FLIGHT_PG_STATUS_SCHEMA,
    FLIGHT_SCHEMA,
    validate,
)
from ncclscope.sources import Problem

__all__ = ["FlightTables", "join_flight", "read_flight"]

#: Share of the entries with a COLL line that must agree (op and count) for a join.
MIN_AGREEMENT = 0.5
_P2P = ("Send", "Recv")


@dataclass(frozen=True)
class FlightTables:
    """What the Flight Recorder dumps held, and how they join the logs.

    ``dumps``: one row per dump file (FLIGHT_DUMPS_SCHEMA); ``entries``: one row per
    entry (FLIGHT_SCHEMA); ``groups``: each dump's process groups
    (FLIGHT_GROUPS_SCHEMA); ``pg_status``: each dump's last enqueued/started/completed
    per group (FLIGHT_PG_STATUS_SCHEMA); ``pg_comms``: per group, the communicator it
    joined or why not (FLIGHT_PG_COMMS_SCHEMA); ``joined``: per (group, rank,
    collective_seq_id) of the joined groups, the dump's state and times beside the COLL
    line (FLIGHT_JOIN_SCHEMA).  ``skipped``: per dump path, entries skipped by reason;
    ``notes``: per dump path, what the user should know.
    """

    dumps: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=FLIGHT_DUMPS_SCHEMA))
    entries: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=FLIGHT_SCHEMA))
    groups: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=FLIGHT_GROUPS_SCHEMA))
    pg_status: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(schema=FLIGHT_PG_STATUS_SCHEMA)
    )
    pg_comms: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(schema=FLIGHT_PG_COMMS_SCHEMA)
    )
    joined: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=FLIGHT_JOIN_SCHEMA))
    skipped: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)


def read_flight(
    dumps: Sequence[tuple[str, Path, str]], first_file_id: int
) -> tuple[FlightTables, list[Problem]]:
    """Read the dumps (display name, path, input kind); their file_ids start at
    ``first_file_id``.  A refused or unreadable file is a problem (and a row of
    ``dumps`` with its ``problem``)."""
    reads = [read_dump(path, display, kind) for display, path, kind in dumps]
    notes = {d.path: list(d.notes) for d in reads if d.notes}
    for rank, paths in _duplicate_ranks(reads).items():
        for path in paths:
            others = ", ".join(p for p in paths if p != path)
            notes.setdefault(path, []).append(
                f"rank {rank} has other dumps too ({others}): the entries of each are kept"
            )
    tables = FlightTables(
        *dump_frames(reads, first_file_id),
        skipped={d.path: dict(sorted(d.skipped.items())) for d in reads if d.skipped},
        notes=notes,
    )
    return tables, [Problem(d.path, d.problem) for d in reads if d.problem is not None]


def _duplicate_ranks(reads: list[DumpRead]) -> dict[int, list[str]]:
    by_rank: dict[int, list[str]] = {}
    for d in reads:
        if d.rank is not None and d.problem is None:
            by_rank.setdefault(d.rank, []).append(d.path)
    return {r: p for r, p in by_rank.items() if len(p) > 1}


def _pg_members(flight: FlightTables) -> pl.DataFrame:
    """Per process group name: its description and members (the first dump's)."""
    return (
        flight.groups.sort("file_id")
        .group_by("pg_name", maintain_order=True)
        .agg(
            pl.col("pg_desc").drop_nulls().first(),
            pl.col("pg_ranks").first().list.sort(),
        )
    )


def _entry_pgs(flight: FlightTables) -> pl.DataFrame:
    """Every process group the entries name, with members where pg_config has them."""
    named = (
        flight.entries.filter(pl.col("pg_name").is_not_null())
        .group_by("pg_name", maintain_order=True)
        .agg(
            pl.col("pg_desc").drop_nulls().first(),
            pl.col("rank").drop_nulls().unique().sort().alias("ranks_with_entries"),
        )
    )
    members = _pg_members(flight)
    return (
        named.join(members, on="pg_name", how="full", coalesce=True)
        .select(
            "pg_name",
            pl.coalesce("pg_desc_right", "pg_desc").alias("pg_desc"),
            pl.col("pg_ranks").cast(pl.List(pl.Int32)),
            pl.col("ranks_with_entries").fill_null([]).cast(pl.List(pl.Int32)),
        )
        .sort("pg_name")
    )


def join_flight(
    flight: FlightTables,
    communicators: pl.DataFrame,
    collectives: pl.LazyFrame | None,
) -> FlightTables:
    """Map each process group of the dumps to the logs' communicator and join the
    entries to its COLL lines (module docstring): ``flight`` with ``pg_comms`` and
    ``joined`` filled."""
    pgs = _entry_pgs(flight)
    if pgs.is_empty():
        return flight
    rows: list[dict[str, object]] = []
    joined: list[pl.DataFrame] = []
    coll_entries = flight.entries.filter(
        ~pl.col("op").is_in([*_P2P, "Coalesced"]) & pl.col("rank").is_not_null()
    )
    for pg in pgs.iter_rows(named=True):
        base: dict[str, object] = {**pg, "comm_key": None, "offset": None, "checked": 0,
                                   "matched": 0}  # fmt: skip
        mine = coll_entries.filter(pl.col("pg_name") == pg["pg_name"])
        if collectives is None:
            rows.append({**base, "reason": "no_logs"})
            continue
        if pg["pg_ranks"] is None:
            rows.append({**base, "reason": "no_members"})
            continue
        cands = _candidates(communicators, list(pg["pg_ranks"]))
        if not cands or mine.is_empty():
            rows.append({**base, "reason": "no_communicator" if not cands else "no_entries"})
            continue
        best = _align(mine, cands, collectives)
        if best is None:
            rows.append({**base, "reason": "no_alignment"})
            continue
        comm_key, offset, checked, matched, frame = best
        rows.append({**base, "comm_key": comm_key, "offset": offset, "checked": checked,
                     "matched": matched, "reason": "joined"})  # fmt: skip
        joined.append(frame)
    pg_comms = validate(
        pl.DataFrame(rows, schema=FLIGHT_PG_COMMS_SCHEMA), FLIGHT_PG_COMMS_SCHEMA, "flight_pg_comms"
    )
    if not joined:
        return replace(flight, pg_comms=pg_comms)
    frame = validate(
        pl.concat(joined).sort("pg_name", "rank", "collective_seq_id"),
        FLIGHT_JOIN_SCHEMA,
        "flight_join",
    )
    return replace(flight, pg_comms=pg_comms, joined=frame)


def _candidates(communicators: pl.DataFrame, pg_ranks: list[int]) -> list[str]:
    """Communicators of the group's size whose members seen are among its ranks."""
    want = set(pg_ranks)
    out = []
    for r in communicators.iter_rows(named=True):
        seen = set(r["ranks_seen"] or [])
        if r["nranks"] == len(want) and seen and seen <= want:
            out.append(str(r["comm_key"]))
    return out


def _align(
    mine: pl.DataFrame, cands: list[str], collectives: pl.LazyFrame
) -> tuple[str, int, int, int, pl.DataFrame] | None:
    """The (communicator, offset) under which most entries agree with a COLL line."""
    coll = collectives.filter(
        pl.col("comm_key").is_in(cands) & ~pl.col("op").is_in(_P2P) & pl.col("rank").is_not_null()
    )
    ranks = mine["rank"].unique().to_list()
    last_coll = (
        coll.filter(pl.col("rank").is_in(ranks))
        .group_by("comm_key", "rank")
        .agg(pl.col("seq").max().alias("last"), pl.col("seq").min().alias("first"))
        .collect(engine="streaming")
    )
    per_rank = mine.group_by("rank").agg(
        pl.col("collective_seq_id").max().alias("fr_last"),
        pl.col("collective_seq_id").min().alias("fr_first"),
    )
    offsets = (
        last_coll.join(per_rank, on="rank")
        .select(
            "comm_key",
            pl.concat_list(
                pl.col("last") - pl.col("fr_last"), pl.col("first") - pl.col("fr_first")
            ).alias("offset"),
        )
        .explode("offset")
        .unique()
    )
    if offsets.is_empty():
        return None
    targets = (
        mine.select(
            "pg_name",
            "rank",
            "collective_seq_id",
            "record_id",
            "op",
            "state",
            "created_ts",
            "started_ts",
            "completed_ts",
            "coll_count",
        )
        .join(offsets, how="cross")
        .with_columns((pl.col("collective_seq_id") + pl.col("offset")).alias("seq"))
    )
    lines = (
        coll.select(
            "comm_key",
            "rank",
            "seq",
            pl.col("op").alias("coll_op"),
            "count",
            "file_id",
            "line_no",
            "size_bytes",
            "ts",
        )
        .join(
            targets.select("comm_key", "rank", "seq").unique().lazy(),
            on=["comm_key", "rank", "seq"],
            how="semi",
        )
        .unique(["comm_key", "rank", "seq"], keep="first")
        .collect(engine="streaming")
    )
    both = targets.join(lines, on=["comm_key", "rank", "seq"], how="left").with_columns(
        pl.when(pl.col("coll_op").is_null())
        .then(None)
        .otherwise((pl.col("coll_op") == pl.col("op")) & (pl.col("count") == pl.col("coll_count")))
        .alias("agrees")
    )
    scores = (
        both.group_by("comm_key", "offset")
        .agg(
            pl.col("coll_op").is_not_null().sum().alias("checked"),
            pl.col("agrees").fill_null(False).sum().alias("matched"),
        )
        .sort(["matched", "checked", "comm_key", "offset"], descending=[True, False, False, False])
    )
    top = scores.row(0, named=True)
    if top["matched"] == 0 or top["matched"] < MIN_AGREEMENT * top["checked"]:
        return None
    frame = (
        both.filter((pl.col("comm_key") == top["comm_key"]) & (pl.col("offset") == top["offset"]))
        .with_columns(
            pl.when(pl.col("coll_op").is_null()).then(None).otherwise(pl.col("seq")).alias("seq")
        )
        .select(list(FLIGHT_JOIN_SCHEMA))
        .cast(FLIGHT_JOIN_SCHEMA)
    )
    return (
        str(top["comm_key"]),
        int(top["offset"]),
        int(top["checked"]),
        int(top["matched"]),
        frame,
    )
