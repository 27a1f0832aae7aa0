"""Stalls and mismatches: the hang detector's evidence from the NCCL side.

Per communicator, the members that stopped at different collectives (``stalls``: the
first collective some member never logged, and who did not), and the instances whose
members logged different ops, counts or datatypes (``mismatches``), read from
``Context.progress`` and ``Context.instances``.  These are candidates: who the job
waited for is judged in ``detect/culprits.py``, on evidence that it stopped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import polars as pl

from ncclscope.detect.base import LineRef
from ncclscope.detect.context import Context

__all__ = [
    "QUOTE",
    "WHO",
    "Mismatched",
    "Stall",
    "UnrankedMismatch",
    "hosts_of",
    "mismatches",
    "quote_lines",
    "stalls",
    "unranked_mismatches",
]

#: At most this many mismatched instances are reported one by one.
_MAX_MISMATCHES = 5
#: Evidence lines quoted per side (culprits, waiters).
QUOTE = 3


@dataclass(frozen=True)
class Stall:
    """A communicator whose members did not all reach the same collective.

    ``seq`` is the first collective some member never logged, and ``culprits`` the
    members that never logged it (global ranks where known): candidates, which the
    policy names only on evidence that the job stopped.  Or, when members ran ahead
    (``ahead``: one collective further, and a different op, count or datatype from
    everyone's at the others' last sequence), the collective at which they made a call
    nobody else made.  ``waiting`` are the other members.
    """

    comm_key: str
    nranks: int
    seq: int
    op: str | None
    culprits: list[int]
    waiting: list[int]
    culprit_rows: pl.DataFrame  # progress rows of the culprits
    waiter_rows: pl.DataFrame  # the waiters' calls at ``seq``
    #: the culprit ran one collective ahead of everyone: an extra call at ``seq``
    ahead: bool = False
    extra_rows: pl.DataFrame | None = None  # its calls at ``seq``
    #: the other members' last sequences: lowest and highest
    others_last: tuple[int, int] | None = None

    @property
    def extra_op(self) -> str | None:
        """What the culprit called at ``seq`` when it ran ahead."""
        rows = self.extra_rows
        return str(rows["op"][0]) if rows is not None and len(rows) else None


#: Who a row is about: its global rank where known, else its communicator rank.
WHO = pl.coalesce("rank", "comm_rank")


#: Where ``stalls`` keeps its list on the context (as ``cached_property`` does): the
#: hang, timeout and countdown detectors and the agent's export all read it.
_STALLS_KEY = "_stalls"
_UNRANKED_KEY = "_unranked_mismatches"


def stalls(ctx: Context) -> list[Stall]:
    """Every communicator whose members stopped at different collectives, the world
    communicator (the largest) first; a culprit set seen on a larger communicator is not
    repeated for a smaller one.  Computed once per context."""
    memo = vars(ctx)
    found = memo.get(_STALLS_KEY)
    if found is None:
        found = memo[_STALLS_KEY] = _stalls(ctx)
    return list(found)


def _stalls(ctx: Context) -> list[Stall]:
    progress = ctx.progress
    if progress.is_empty():
        return []
    members = ctx.members
    # Members known from init lines that never logged a call on a communicator that
    # others used: they are behind everyone (last_seq -1).  Not one named only by its
    # teardown line: its calls may have been cut away with the log's head.
    silent = (
        members.filter("anchored")
        .join(progress.select("comm_key", "comm_rank"), on=["comm_key", "comm_rank"], how="anti")
        .join(progress.select("comm_key").unique(), on="comm_key", how="semi")
    )
    destroyed = members.filter(pl.col("ended") == "Destroy").select("comm_key", "comm_rank")
    table = pl.concat(
        [
            progress,
            silent.select(
                "comm_key",
                pl.col("comm_rank").cast(pl.Int32),
                pl.col("rank").cast(pl.Int32),
                "host",
                pl.lit(0, dtype=pl.UInt32).alias("calls"),
                pl.lit(-1, dtype=pl.Int64).alias("last_seq"),
            ),
        ],
        how="diagonal",
    )
    sizes = (
        table.group_by("comm_key")
        .agg(pl.len().alias("size"))
        .sort(["size", "comm_key"], descending=[True, False])
    )
    out: list[Stall] = []
    seen: set[tuple[int, ...]] = set()
    for comm_key, size in sizes.iter_rows():
        if size < 2:
            continue
        group = table.filter(pl.col("comm_key") == comm_key).with_columns(WHO.alias("who"))
        low, high = group["last_seq"].min(), group["last_seq"].max()
        if not isinstance(low, int) or not isinstance(high, int) or low == high:
            continue
        # The members behind are the ones the others waited for (PyTorch enqueues
        # ahead, so the others' last calls may be several collectives on), unless the
        # members ahead made an extra call: at the others' last sequence they logged a
        # different op, count or datatype.  How many ranks sit on each side says
        # nothing: a log copied mid-run shows any split.
        at_low = group.filter(pl.col("last_seq") == low)
        at_high = group.filter(pl.col("last_seq") == high)
        ahead = high == low + 1 and _called_else(ctx, comm_key, low, at_low, at_high)
        behind = at_high if ahead else at_low
        culprits = sorted(int(x) for x in behind["who"].to_list())
        if tuple(culprits) in seen:
            continue
        seen.add(tuple(culprits))
        # Where the sequences part: the collective the culprit never joined, or the one
        # at which it made its extra call.
        stuck = low if ahead else low + 1
        if _completed(group, destroyed, high if ahead else stuck):
            continue
        # The culprits' last calls (their op) and the others' calls at the stuck one.
        seqs = sorted({int(x) for x in behind["last_seq"].to_list() if x >= 0} | {stuck})
        at_seqs = ctx.rows_at(comm_key, seqs)
        if len(at_seqs):
            last_ops = at_seqs.join(
                behind.select("comm_rank", pl.col("last_seq").alias("seq")),
                on=["comm_rank", "seq"],
                how="semi",
            ).select("comm_rank", "op")
            behind = behind.join(last_ops, on="comm_rank", how="left")
        else:
            behind = behind.with_columns(pl.lit(None, dtype=pl.String).alias("op"))
        at = at_seqs.filter(pl.col("seq") == stuck) if len(at_seqs) else at_seqs
        at = at.with_columns(WHO.alias("who")) if len(at) else at
        waiters = at.filter(~pl.col("who").is_in(culprits)) if len(at) else at
        ops = Counter(waiters["op"].to_list()) if len(waiters) else Counter()
        waiting = sorted(int(x) for x in group["who"].to_list() if int(x) not in culprits)
        extra = at.filter(pl.col("who").is_in(culprits)) if ahead and len(at) else None
        rest = group.filter(~pl.col("who").is_in(culprits))["last_seq"]
        lo, hi = rest.min(), rest.max()
        others = (int(lo), int(hi)) if isinstance(lo, int) and isinstance(hi, int) else None
        out.append(
            Stall(
                comm_key=comm_key,
                nranks=int(size),
                seq=stuck,
                op=ops.most_common(1)[0][0] if ops else None,
                culprits=culprits,
                waiting=waiting,
                culprit_rows=behind,
                waiter_rows=waiters,
                ahead=ahead,
                extra_rows=extra,
                others_last=others,
            )
        )
    return out


def _completed(group: pl.DataFrame, destroyed: pl.DataFrame, stuck: int) -> bool:
    """Did a member that logged ``stuck`` (or a later call) then destroy the
    communicator cleanly?  ``stuck`` is the call the others would wait in: the one the
    members behind never joined, or the extra call of members ahead.

    ``comm 0x55 rank 3 nranks 8 cudaDev 3 busId 4e000 - Destroy COMPLETE`` comes after
    the member's device work on the communicator ended (ncclCommDestroy finalizes and
    frees its buffers; an abort would say ``Abort``): every call it made completed, and
    a collective completes only when every member joined it.  So no member was missing
    from ``stuck``; the lines that say so were lost (a cut, a splice), and the stall is
    the log's, not the job's.  A culprit's own Destroy proves nothing about ``stuck``: it
    left before it.
    """
    if destroyed.is_empty():
        return False
    reached = group.filter(pl.col("last_seq") >= stuck).join(
        destroyed, on=["comm_key", "comm_rank"], how="semi"
    )
    return not reached.is_empty()


def _called_else(
    ctx: Context, comm_key: str, seq: int, low: pl.DataFrame, high: pl.DataFrame
) -> bool:
    """At ``seq``, did every member of ``high`` log another (op, count, datatype) than
    every member of ``low``?"""
    rows = ctx.rows_at(comm_key, [seq])
    if rows.is_empty():
        return False
    shape = pl.struct("op", "count", "dtype")
    lows = rows.join(low.select("comm_rank"), on="comm_rank", how="semi").select(shape)[:, 0]
    highs = rows.join(high.select("comm_rank"), on="comm_rank", how="semi").select(shape)[:, 0]
    if lows.is_empty() or highs.is_empty():
        return False
    return not set(map(str, highs.to_list())) & set(map(str, lows.to_list()))


@dataclass(frozen=True)
class Mismatched:
    """An instance whose members logged different (op, count, datatype)."""

    comm_key: str
    seq: int
    culprits: list[int]
    majority: tuple[str, int, int]
    rows: pl.DataFrame


def mismatches(ctx: Context) -> list[Mismatched]:
    """Instances whose members disagree, with the minority members as culprits.

    Members that reached the same point with the same calls have the same signature;
    only a communicator whose signatures disagree is read again to find where.
    """
    p = ctx.progress
    if p.is_empty():
        return []
    suspects = (
        p.group_by("comm_key", "calls", "last_seq")
        .agg(pl.col("signature").n_unique().alias("signatures"), pl.len().alias("members"))
        .filter(pl.col("signatures") > 1)
        .sort("members", "comm_key", descending=[True, False])
    )
    out: list[Mismatched] = []
    # A communicator with a member whose rank in it no line gives (its init lines cut):
    # ``progress`` leaves that member out, ``unranked_mismatches`` reads the whole.
    ident = ctx.analysis.identity.members
    partial = set(ident.filter(pl.col("comm_rank").is_null())["comm_key"].drop_nulls().to_list())
    for comm_key in dict.fromkeys(suspects["comm_key"].to_list()):
        if comm_key in partial:
            continue
        for seq in ctx.mixed_seqs(comm_key, _MAX_MISMATCHES - len(out)):
            rows = ctx.rows_at(comm_key, [seq])
            rows = rows.with_columns(WHO.alias("who")).filter(pl.col("who").is_not_null())
            if rows.is_empty():
                continue
            shapes = Counter(zip(rows["op"], rows["count"], rows["dtype"], strict=True))
            (majority, _n), *_rest = shapes.most_common()
            minority = rows.filter(
                (pl.col("op") != majority[0])
                | (pl.col("count") != majority[1])
                | (pl.col("dtype") != majority[2])
            )
            out.append(
                Mismatched(
                    comm_key,
                    int(seq),
                    sorted(int(x) for x in minority["who"].to_list()),
                    (str(majority[0]), int(majority[1]), int(majority[2])),
                    rows,
                )
            )
        if len(out) >= _MAX_MISMATCHES:
            break
    return out


@dataclass(frozen=True)
class UnrankedMismatch:
    """An instance of a communicator whose init lines were cut (no member's rank in it
    is known: matched by order, ``n8#0``) at which its members logged different (op,
    count, datatype).  The opCount still numbers each member's calls, so the calls at
    one opCount are one instance; who made them is known by process, and by job rank
    only where another communicator of the same process names it."""

    comm_key: str
    seq: int
    #: (op, count, dtype) -> the members' rows that logged it, largest side first
    sides: list[tuple[tuple[str, int, int], pl.DataFrame]]
    #: the largest side is a strict majority of two or more: the others are the culprits
    clear: bool
    #: the communicator's last instance: no member logged a call after it
    hung: bool


def unranked_mismatches(ctx: Context) -> list[UnrankedMismatch]:
    """Mismatches on communicators a member of which no line ranks (its init lines cut
    at the head): a full pass over each such communicator's calls, made only where its
    members' opCounts count (where opCount is constant, 2.27+ on one node, calls
    counted from a cut head are no sequence)."""
    memo = vars(ctx)
    found = memo.get(_UNRANKED_KEY)
    if found is None:
        found = memo[_UNRANKED_KEY] = _unranked_mismatches(ctx)
    return list(found)


def _unranked_mismatches(ctx: Context) -> list[UnrankedMismatch]:
    ident = ctx.analysis.identity.members
    stats = ctx.analysis.stats
    if ident.is_empty() or stats.is_empty() or ident["comm_rank"].null_count() == 0:
        return []  # every member ranked: ``mismatches`` reads them
    key = ["file_id", "host", "pid", "comm"]
    per = (
        ident.filter(pl.col("comm_key").is_not_null())
        .join(stats.select(*key, "calls", "opcount_min", "opcount_max"), on=key, how="inner")
        .group_by("comm_key")
        .agg(
            pl.col("comm_rank").is_null().any().alias("unranked"),
            pl.len().alias("members"),
            ((pl.col("opcount_min") != pl.col("opcount_max")) | (pl.col("calls") <= 1))
            .all()
            .alias("counts"),
        )
        .filter(pl.col("unranked") & pl.col("counts") & (pl.col("members") >= 2))
        .sort("members", "comm_key", descending=[True, False])
    )
    coll = ctx.collectives()
    if coll is None or per.is_empty():
        return []
    out: list[UnrankedMismatch] = []
    for comm_key in per["comm_key"].to_list():
        seqs = ctx.mixed_seqs(comm_key, _MAX_MISMATCHES - len(out))
        if not seqs:
            continue
        last = coll.filter(pl.col("comm_key") == comm_key).select(pl.col("seq").max())
        top = last.collect(engine="streaming")[0, 0]
        for seq in seqs:
            rows = ctx.rows_at(comm_key, [seq]).sort("host", "pid")
            shapes = Counter(zip(rows["op"], rows["count"], rows["dtype"], strict=True))
            ordered = sorted(shapes.items(), key=lambda kv: (-kv[1], str(kv[0])))
            sides = [
                (
                    (str(op), int(count), int(dtype)),
                    rows.filter(
                        (pl.col("op") == op)
                        & (pl.col("count") == count)
                        & (pl.col("dtype") == dtype)
                    ),
                )
                for (op, count, dtype), _n in ordered
                if op is not None and count is not None and dtype is not None
            ]
            if len(sides) < 2:
                continue
            big = len(sides[0][1])
            clear = big >= 2 and big > sum(len(r) for _s, r in sides[1:])
            out.append(UnrankedMismatch(comm_key, int(seq), sides, clear, top == seq))
        if len(out) >= _MAX_MISMATCHES:
            break
    return out


def quote_lines(rows: pl.DataFrame, limit: int = QUOTE) -> list[LineRef]:
    if rows.is_empty() or "line_no" not in rows.columns:
        return []
    picked = rows.filter(pl.col("line_no").is_not_null()).head(limit)
    return [LineRef(int(f), int(n)) for f, n in picked.select("file_id", "line_no").iter_rows()]


def hosts_of(rows: pl.DataFrame) -> list[str]:
    if rows.is_empty() or "host" not in rows.columns:
        return []
    return sorted({h for h in rows["host"].to_list() if h is not None})
