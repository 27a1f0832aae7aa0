"""What PyTorch's Flight Recorder dumps say about a stop, a mismatch and a late rank.

A dump holds, per process group, the collectives its process enqueued
(``collective_seq_id`` from 1) and how far the group got (``pg_status``).  Three
readings, each computed once per context:

* ``flight_stops``: per process group, the first collective that some member never
  enqueued while others did (PyTorch's own analyzer, ``fr_trace``, reads the same:
  "missing ranks").  Its waiters are the members that enqueued it; the culprits are the
  members whose dump ends before it.  ``in_flight``: waiters whose entry there was not
  retired when they dumped (still inside it).  Members come from ``pg_config``: one
  whose whole ring is in its dump and holds no call of a group stands at 0 there (it
  never entered the group's first collective); where every member that dumped entered
  the last one and some wait inside it, the one member with no dump at all is the
  culprit (dead, or stuck where even its watchdog could not dump); several, or one
  whose dump does not reach back, name nobody.
* ``flight_mismatches``: per process group, the first collective whose members
  enqueued different calls (op, element count, dtype); the culprits are the minority
  against a strict majority (with none, nobody is named: ``fr_trace`` takes whichever
  dump it reads first as the reference and may blame the agreeing ranks).
* ``flight_waits``: per collective every member's dump holds, when each enqueued it
  (``time_created_ns``, the CPU's clock): who came last and how long the others had
  been waiting.

A gloo dump never leaves ``scheduled`` and counts a timed-out collective as completed,
so who is behind in the sequence is the evidence that holds for every backend; NCCL's
``started``/``completed`` states add to it where the dumps carry them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

import polars as pl

from ncclscope.detect.context import Context

__all__ = [
    "FlightMismatch",
    "FlightStop",
    "apart_runs",
    "flight_mismatches",
    "flight_stops",
    "flight_waits",
    "pg_desc",
]

_STOPS_KEY = "_flight_stops"
_MISMATCHES_KEY = "_flight_mismatches"
_WAITS_KEY = "_flight_waits"


@dataclass(frozen=True)
class FlightStop:
    """A process group whose members' dumps end at different collectives."""

    pg_name: str
    pg_desc: str | None
    #: the first ``collective_seq_id`` some member never enqueued
    seq: int
    #: the op the waiters enqueued there (None where their ring no longer holds it)
    op: str | None
    #: the members whose dumps were read, their last enqueued collective each
    last: dict[int, int]
    waiting: list[int]
    culprits: list[int]
    #: waiters still inside the collective when they dumped (entry not retired)
    in_flight: list[int]
    #: the dump files of the waiters' entries there, and of the culprits (for the report)
    file_ids: list[int]
    #: when the first waiter enqueued it (None where no waiter's ring holds it)
    entered_ts: datetime | None = None
    #: every member enqueued it, but the culprits' GPUs never started it while the
    #: waiters' did (NCCL's states, with ``TORCH_NCCL_ENABLE_TIMING`` or a start event)
    never_started: bool = False
    #: members with no dump at all (dead, or stuck where not even the watchdog answered):
    #: the culprit where it is the only member unaccounted for
    no_dump: list[int] = field(default_factory=list)
    #: members neither in ``last`` nor known to have no dump (a ring that wrapped, a
    #: file unread) besides ``no_dump``: where the culprit may be, though not named
    unaccounted: list[int] = field(default_factory=list)
    #: why the dumps name nobody although a member is unaccounted for, else None
    withheld: str | None = None


@dataclass(frozen=True)
class FlightMismatch:
    """A collective the members of a process group enqueued differently."""

    pg_name: str
    pg_desc: str | None
    seq: int
    #: (op, elements, dtype) most members called; None without a strict majority
    majority: tuple[str, int, str] | None
    #: rank -> (op, elements, dtype) of every member that enqueued it
    calls: dict[int, tuple[str, int, str]]
    culprits: list[int]
    file_ids: list[int]


def _one_dump_per_rank(ctx: Context) -> pl.DataFrame:
    """(rank, file_id) of the first dump of each rank: a rank dumped twice (its pickle
    and its JSON twin, or two jobs' dumps given together) must not count as two."""
    d = ctx.analysis.flight.dumps.filter(pl.col("rank").is_not_null())
    return d.group_by("rank").agg(pl.col("file_id").min())


def _collectives(ctx: Context) -> pl.DataFrame:
    """The dumps' collectives (point-to-point calls left out: they have their own
    sequence) with a known rank and process group."""
    e = ctx.analysis.flight.entries
    return e.join(_one_dump_per_rank(ctx), on=["rank", "file_id"], how="semi").filter(
        ~pl.col("is_p2p").fill_null(False)
        & pl.col("rank").is_not_null()
        & pl.col("pg_name").is_not_null()
        & pl.col("collective_seq_id").is_not_null()
        & (pl.col("collective_seq_id") > 0)
    )


def _last_enqueued(ctx: Context) -> pl.DataFrame:
    """Per (process group, rank with a dump): the last collective it enqueued, from
    ``pg_status`` and its entries (whichever says more: the status survives the ring's
    wrap, the entries a status the dump left out)."""
    f = ctx.analysis.flight
    status = f.pg_status.filter(
        pl.col("pg_name").is_not_null() & pl.col("rank").is_not_null()
    ).join(_one_dump_per_rank(ctx), on=["rank", "file_id"], how="semi")
    from_status = status.group_by("pg_name", "rank").agg(pl.col("last_enqueued").max())
    from_entries = (
        _collectives(ctx)
        .group_by("pg_name", "rank")
        .agg(pl.col("collective_seq_id").max().alias("last_enqueued"))
    )
    both = pl.concat([from_status, from_entries], how="vertical_relaxed")
    seen = {(str(p), int(r)) for p, r in both.select("pg_name", "rank").iter_rows()}
    complete = _complete_rings(ctx)
    # A member whose whole ring is in its dump and holds no call of the group never
    # enqueued one: it stands at 0 (its pg_status row, if any, has no name to join on).
    silent = [
        (pg, r, 0)
        for pg, members in _members(ctx).items()
        for r in members
        if r in complete and (pg, r) not in seen
    ]
    if silent:
        both = pl.concat(
            [both, pl.DataFrame(silent, schema=both.schema, orient="row")], how="vertical_relaxed"
        )
    return (
        both.group_by("pg_name", "rank").agg(pl.col("last_enqueued").max()).sort("pg_name", "rank")
    )


def _members(ctx: Context) -> dict[str, list[int]]:
    """Per process group, its members' global ranks where the dumps' ``pg_config`` lists
    them and every dump that lists the group agrees (an empty list, as PyTorch 2.13 on
    gloo writes, says nothing).  The default group, unlisted, holds at least every rank
    from 0 to the highest that dumped."""
    groups = ctx.analysis.flight.groups.filter(
        pl.col("pg_name").is_not_null() & (pl.col("pg_ranks").list.len() > 0)
    )
    out: dict[str, list[int]] = {}
    for (pg,), g in groups.partition_by("pg_name", as_dict=True).items():
        lists = {tuple(sorted(int(r) for r in ranks)) for ranks in g["pg_ranks"].to_list()}
        if len(lists) == 1:
            out[str(pg)] = list(lists.pop())
    dumped = ctx.analysis.flight.dumps["rank"].drop_nulls()
    e = ctx.analysis.flight.entries
    default = e.filter(pl.col("pg_desc") == "default_pg")["pg_name"].drop_nulls().unique()
    if len(dumped) and len(default) == 1 and str(default[0]) not in out:
        out[str(default[0])] = list(range(int(dumped.max()) + 1))  # type: ignore[arg-type]
    return out


def _complete_rings(ctx: Context) -> set[int]:
    """Ranks whose dump holds every call its process recorded: read whole (no entry
    skipped), the ring never wrapped (its first entry is record 0, or it has none) and no
    ``pg_status`` row it cannot name counts a collective.  Only there does a missing
    entry mean a call never made."""
    f = ctx.analysis.flight
    one = _one_dump_per_rank(ctx)
    dumps = f.dumps.join(one, on=["rank", "file_id"], how="semi").filter(
        pl.col("problem").is_null() & (pl.col("skipped").fill_null(0) == 0)
    )
    wrapped = set(
        f.entries.group_by("file_id")
        .agg(pl.col("record_id").min())
        .filter(pl.col("record_id").is_null() | (pl.col("record_id") > 0))["file_id"]
        .to_list()
    )
    unnamed = set(
        f.pg_status.filter(pl.col("pg_name").is_null() & (pl.col("last_enqueued") > 0))[
            "file_id"
        ].to_list()
    )
    return {
        int(r)
        for r, fid in zip(dumps["rank"], dumps["file_id"], strict=True)
        if fid not in wrapped and fid not in unnamed
    }


def pg_desc(ctx: Context, pg: str) -> str | None:
    """The description PyTorch gave process group ``pg`` (``default_pg``), if any."""
    descs = ctx.analysis.flight.entries.filter(pl.col("pg_name") == pg)["pg_desc"].drop_nulls()
    return str(descs[0]) if len(descs) else None


def apart_runs(ctx: Context) -> tuple[int, float] | None:
    """Whether the dumps come from more than one run (two jobs' dumps given together, a
    restart's beside the first run's): members of one process group enter a collective
    within its timeout of each other, or the first would have timed out.  The collective
    and its spread in seconds where they do not, else None."""
    colls = _collectives(ctx).filter(
        pl.col("created_ts").is_not_null() & pl.col("timeout_ms").is_not_null()
    )
    if colls.is_empty():
        return None
    spread = (
        colls.group_by("pg_name", "collective_seq_id")
        .agg(
            ((pl.col("created_ts").max() - pl.col("created_ts").min()).dt.total_microseconds()
             / 1e6).alias("spread_s"),
            (pl.col("timeout_ms").max() / 1e3).alias("timeout_s"),
        )
        .filter(pl.col("spread_s") > pl.col("timeout_s"))
        .sort("spread_s", descending=True)
    )  # fmt: skip
    if spread.is_empty():
        return None
    return int(spread["collective_seq_id"][0]), float(spread["spread_s"][0])


def flight_stops(ctx: Context) -> list[FlightStop]:
    """Per process group whose members' dumps end at different collectives: where, who
    entered it and who never did (computed once per context)."""
    memo = vars(ctx)
    if _STOPS_KEY not in memo:
        memo[_STOPS_KEY] = _stops(ctx)
    out: list[FlightStop] = memo[_STOPS_KEY]
    return out


def _stops(ctx: Context) -> list[FlightStop]:
    if ctx.analysis.flight.entries.is_empty() and ctx.analysis.flight.pg_status.is_empty():
        return []
    last = _last_enqueued(ctx).filter(pl.col("last_enqueued") >= 0)
    colls = _collectives(ctx)
    members = _members(ctx)
    dumps = ctx.analysis.flight.dumps
    dumped = {int(r) for r in dumps["rank"].drop_nulls()}
    # A dump unread, or whose rank is unknown, may be any missing member's.
    unread = bool(dumps.filter(pl.col("problem").is_not_null() | pl.col("rank").is_null()).height)
    out: list[FlightStop] = []
    for (pg,), g in last.partition_by("pg_name", as_dict=True, maintain_order=True).items():
        per = {int(r): int(s) for r, s in zip(g["rank"], g["last_enqueued"], strict=True)}
        if len(per) < 2 and len(members.get(str(pg), [])) < 2:
            continue  # one dump: nothing to compare it with
        lo, hi = min(per.values()), max(per.values())
        never_started = False
        no_dump: list[int] = []
        withheld: str | None = None
        unaccounted: list[int] = []
        if lo == hi:
            # Every member that dumped enqueued the last one: a stop shows in the states,
            # or in a member with no dump.
            seq = hi
            there = colls.filter((pl.col("pg_name") == pg) & (pl.col("collective_seq_id") == seq))
            lag = _not_started(colls, there)
            if lag is not None:
                waiting, culprits = lag
                never_started = True
            else:
                missing = _unaccounted(members.get(str(pg)), per, there, dumped, unread=unread)
                if missing is None:
                    continue
                waiting, culprits, no_dump, withheld = missing
                unaccounted = sorted(set(members.get(str(pg), [])) - set(per))
        else:
            seq = lo + 1
            culprits = sorted(r for r, s in per.items() if s == lo)
            waiting = sorted(r for r, s in per.items() if s >= seq)
            there = colls.filter((pl.col("pg_name") == pg) & (pl.col("collective_seq_id") == seq))
        ops = Counter(str(o) for o in there["op"].drop_nulls())
        in_flight = sorted(
            int(r) for r, retired in zip(there["rank"], there["retired"], strict=True)
            if retired is False
        )  # fmt: skip
        files = sorted(
            set(there["file_id"].to_list())
            | set(
                ctx.analysis.flight.dumps.filter(pl.col("rank").is_in(culprits))[
                    "file_id"
                ].to_list()
            )
        )
        out.append(
            FlightStop(
                pg_name=str(pg),
                pg_desc=pg_desc(ctx, str(pg)),
                seq=seq,
                op=ops.most_common(1)[0][0] if ops else None,
                last=per,
                waiting=waiting,
                culprits=culprits,
                in_flight=in_flight,
                file_ids=[int(f) for f in files],
                entered_ts=there["created_ts"].min(),  # type: ignore[arg-type]
                never_started=never_started,
                no_dump=no_dump,
                unaccounted=unaccounted,
                withheld=withheld,
            )
        )
    # The group that stopped first comes first: the others may wait on its members.
    return sorted(out, key=lambda s: (s.entered_ts is None, s.entered_ts or datetime.min))


def _not_started(colls: pl.DataFrame, there: pl.DataFrame) -> tuple[list[int], list[int]] | None:
    """(waiting, culprits) where every member enqueued the collective ``there`` holds,
    some started it and the others' GPUs had not, every collective they enqueued before
    it done (their stream busy elsewhere); None where nothing says so.  A member with an
    earlier collective still running is only behind by a completion (the watchdog has
    yet to see it, or its GPU is a little behind)."""
    states = dict(zip(there["rank"].to_list(), there["state"].to_list(), strict=True))
    waiting = sorted(r for r, s in states.items() if s == "started")
    culprits = sorted(r for r, s in states.items() if s == "scheduled")
    if not waiting or not culprits or "completed" in states.values():
        return None
    mine = there.filter(pl.col("rank").is_in(culprits)).select("rank", "file_id", "record_id")
    before = (
        colls.join(mine, on=["rank", "file_id"], suffix="_there")
        .filter(pl.col("record_id") < pl.col("record_id_there"))
        .filter(~pl.col("completed").fill_null(False))
    )
    if not before.is_empty():
        return None
    return waiting, culprits


def _unaccounted(
    members: list[int] | None,
    per: dict[int, int],
    there: pl.DataFrame,
    dumped: set[int],
    *,
    unread: bool,
) -> tuple[list[int], list[int], list[int], str | None] | None:
    """(waiting, culprits, no_dump, withheld) where the members that dumped all entered
    the group's last collective, some still inside it, and members are unaccounted for:
    the one member with no dump is the culprit (it died, or hung where its watchdog
    could not dump).  Several, or a member whose dump does not reach back, name nobody:
    any of them may be the one.  None where every member is accounted for or nobody
    waits.  ``unread``: a dump could not be read or has no rank (it may be theirs)."""
    if members is None:
        return None
    unaccounted = sorted(set(members) - set(per))
    waiting = sorted(
        int(r)
        for r, done in zip(there["rank"], there["completed"], strict=True)
        if done is False and int(r) in per
    )
    if not unaccounted or not waiting:
        return None
    no_dump = [r for r in unaccounted if r not in dumped]
    if len(no_dump) == 1 and unaccounted == no_dump and not unread:
        return waiting, no_dump, no_dump, None
    reason = (
        f"{len(no_dump)} members left no dump: any of them may be the one"
        if len(no_dump) > 1
        else "a dump could not be read, or its rank is unknown: it may be theirs"
        if unread
        else "a member's dump does not hold its whole history (its ring wrapped, or "
        "entries were skipped)"
    )
    return waiting, [], no_dump, reason


def flight_mismatches(ctx: Context) -> list[FlightMismatch]:
    """Per process group, its first collective that members enqueued differently
    (computed once per context): later ones follow from it (the members are out of
    step from there on)."""
    memo = vars(ctx)
    if _MISMATCHES_KEY not in memo:
        memo[_MISMATCHES_KEY] = _mismatches(ctx)
    out: list[FlightMismatch] = memo[_MISMATCHES_KEY]
    return out


def _mismatches(ctx: Context) -> list[FlightMismatch]:
    colls = _collectives(ctx).filter(pl.col("op").is_not_null())
    if colls.is_empty():
        return []
    shaped = colls.with_columns(
        pl.col("input_numel").fill_null(-1).alias("numel"),
        pl.col("input_dtype").fill_null("?").alias("dtype"),
    )
    per_seq = (
        shaped.group_by("pg_name", "collective_seq_id")
        .agg(
            pl.len().alias("n"),
            pl.struct("op", "numel", "dtype").n_unique().alias("shapes"),
        )
        .filter((pl.col("n") >= 2) & (pl.col("shapes") > 1))
        .sort("pg_name", "collective_seq_id")
    )
    out: list[FlightMismatch] = []
    for (pg,), g in per_seq.partition_by("pg_name", as_dict=True, maintain_order=True).items():
        seq = int(g["collective_seq_id"][0])
        rows = shaped.filter((pl.col("pg_name") == pg) & (pl.col("collective_seq_id") == seq))
        calls: dict[int, tuple[str, int, str]] = {}
        for r in rows.unique("rank", keep="first").iter_rows(named=True):
            calls[int(r["rank"])] = (str(r["op"]), int(r["numel"]), str(r["dtype"]))
        counts = Counter(calls.values())
        (top, n), *rest = counts.most_common()
        strict = n * 2 > len(calls) and (not rest or rest[0][1] < n)
        majority = top if strict else None
        culprits = sorted(r for r, c in calls.items() if c != top) if strict else []
        if len(counts) < 2:
            continue  # the rows that differed were one rank's twice
        out.append(
            FlightMismatch(
                pg_name=str(pg),
                pg_desc=pg_desc(ctx, str(pg)),
                seq=seq,
                majority=majority,
                calls=calls,
                culprits=culprits,
                file_ids=sorted({int(f) for f in rows["file_id"]}),
            )
        )
    return out


def flight_waits(ctx: Context) -> pl.DataFrame:
    """Per (process group, collective) every member's dump holds with a creation time:
    ``last_rank`` (the member that enqueued it last), ``wait_s`` (how long after the
    next-to-last member it came: the least every other member waited), ``late_s`` per
    member in ``lates`` (seconds after the first), and ``ts_first``.  Computed once."""
    memo = vars(ctx)
    if _WAITS_KEY not in memo:
        memo[_WAITS_KEY] = _waits(ctx)
    out: pl.DataFrame = memo[_WAITS_KEY]
    return out


_WAITS_SCHEMA = pl.Schema(
    {
        "pg_name": pl.String(),
        "collective_seq_id": pl.Int64(),
        "op": pl.String(),
        "members": pl.UInt32(),
        "last_rank": pl.Int32(),
        "wait_s": pl.Float64(),
        "ts_first": pl.Datetime("us", "UTC"),
    }
)


def _waits(ctx: Context) -> pl.DataFrame:
    colls = _collectives(ctx).filter(pl.col("created_ts").is_not_null())
    if colls.is_empty():
        return pl.DataFrame(schema=_WAITS_SCHEMA)
    # Members of a group: the ranks whose dumps hold any of its collectives; only the
    # collectives all of them hold say who came last.
    members = colls.group_by("pg_name").agg(pl.col("rank").n_unique().alias("members"))
    per = (
        colls.unique(["pg_name", "collective_seq_id", "rank"], keep="first")
        .sort("created_ts")
        .group_by("pg_name", "collective_seq_id")
        .agg(
            pl.col("op").first(),
            pl.len().alias("n"),
            pl.col("rank").last().alias("last_rank"),
            pl.col("created_ts").first().alias("ts_first"),
            (
                (
                    pl.col("created_ts").last() - pl.col("created_ts").slice(-2, 1).first()
                ).dt.total_microseconds()
                / 1e6
            ).alias("wait_s"),
        )
        .join(members, on="pg_name")
        .filter((pl.col("n") == pl.col("members")) & (pl.col("members") >= 2))
    )
    return per.select(list(_WAITS_SCHEMA)).cast(_WAITS_SCHEMA).sort("pg_name", "collective_seq_id")
