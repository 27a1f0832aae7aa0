"""The job's collective progress, kept up to date as lines arrive: the live side of
``Context.progress`` and of the countdown.

Every poll's lines go through one polars pass here: the COLL lines are read (host, pid,
op, opCount, count, datatype, comm pointer, time) and each NCCL member (followed file,
host, pid, comm pointer) keeps what ``proc_comm_stats`` computes post-mortem: calls,
collective calls, the opCount range, the last collective's op and time, the arrival at
each mark (``MARK_EVERY``), and its last ``keep_calls`` calls for the stall's evidence.
Nothing here re-reads a line; a tick with no new line costs nothing.

Who is who (ranks, communicators, the members known from init lines) is the reference
analysis's: ``LiveContext`` puts the live statistics beside the identity of the last
``analyze`` run over the agent's window and answers ``progress`` and ``rows_at`` from
them, so ``stalls`` and ``countdown`` (``detect/``) read the live state by the rules
they apply post-mortem.

A line read (2.27, NCCL's own timestamp)::

    [2025-03-14 09:00:09.387136] node-6:5381:5381 [3] NCCL INFO AllGather: opCount 1a
    sendbuff 0x7f2c4a000000 recvbuff 0x7f2c4c000000 count 262144 datatype 9 op 0 root 0
    comm 0x55d1c2a4b2e0 [nranks=16] stream 0x55d1c29f7a10
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property

import polars as pl

from ncclscope.detect.context import Context, progress_table
from ncclscope.model.collectives import P2P_OPS
from ncclscope.model.identity import ANCHORED
from ncclscope.parsers.nccl.patterns import HOST_CHARS
from ncclscope.schema import LIVE_CALLS_SCHEMA as CALLS_SCHEMA
from ncclscope.schema import TS

__all__ = ["MARK_EVERY", "LiveContext", "LiveProgress", "Member"]

#: Sequence numbers at which a member's arrival time is also exported as a mark (every
#: multiple of each): Prometheus compares members of one communicator at the same mark,
#: whatever moment each node's agent last exported.  Two spacings, so that one of them
#: lasts seconds to minutes on jobs whose collectives come every 5 ms or every 0.5 s.
MARK_EVERY = (64, 1024)

#: A COLL line from the NCCL header on, with the timestamp NCCL may print before it
#: (``NCCL_DEBUG_TIMESTAMP_FORMAT``'s default ``[%F %T.%Nf] ``).  The header and body
#: are those of ``patterns.HEADER_RE`` and ``patterns.COLL_RE``.
_COLL = (
    r"(?:\[?(?P<date>\d{4}-\d{2}-\d{2})[ T_](?P<clock>\d{2}:\d{2}:\d{2})"
    r"(?:[.,](?P<frac>\d{1,9}))?\]?\s*)?"
    rf"(?P<host>{HOST_CHARS}+):(?P<pid>\d+):\d+ (?:\[-?\d+\] )?NCCL INFO "
    r"(?P<op>[A-Za-z]+): opCount (?P<opcount>[0-9a-fA-F]+) sendbuff \S+ recvbuff \S+ "
    r"count (?P<count>\d+) datatype (?P<dtype>\d+) op \d+ root -?\d+ "
    r"comm (?P<comm>\S+) \[nranks=(?P<nranks>\d+)\]"
)

#: Lines that are not COLL lines but change what the reference analysis would say (a
#: new member, an error, a watchdog's report): the agent runs it again soon after one.
NOTABLE = (
    " Init COMPLETE",
    " Init START",
    " Destroy COMPLETE",
    " Abort COMPLETE",
    " NCCL WARN ",
    "Watchdog",
    "Timeout(ms)",
    "ERROR",
    "Traceback",
)

_KEY = ("path", "host", "pid", "comm")


@dataclass
class Member:
    """One NCCL member's statistics so far (``proc_comm_stats``'s columns)."""

    calls: int = 0
    coll_calls: int = 0
    opcount_min: int | None = None
    opcount_max: int | None = None
    coll_opcount_max: int | None = None
    nranks: int | None = None
    signature: int = 0
    #: its last collective call: op and time (None without one)
    op: str | None = None
    ts: datetime | None = None
    #: per mark spacing: (sequence, time) of the last mark reached with a time
    marks: dict[int, tuple[int, datetime]] = field(default_factory=dict)


def _ts(own: bool) -> pl.Expr:
    """A COLL line's time: NCCL's own (``[%F %T.%Nf]``, read as UTC like the reference
    parser's ``to_dt``: microseconds, more digits cut), else the arrival time."""
    if not own:
        return pl.col("arrived")
    frac = pl.col("frac").fill_null("").str.slice(0, 6).str.pad_end(6, "0")
    text = pl.concat_str(pl.col("date"), pl.lit(" "), pl.col("clock"), pl.lit("."), frac)
    return text.str.to_datetime(
        "%Y-%m-%d %H:%M:%S%.f", time_unit="us", time_zone="UTC", strict=False
    )


class LiveProgress:
    """Every NCCL member's progress over the lines added so far.

    ``version`` grows with every poll that changed something; ``notable`` counts
    lines that call for a new reference analysis (``NOTABLE``), ``new_members`` the
    members first seen since ``mark_analysed``.
    """

    def __init__(self, *, keep_calls: int = 2048) -> None:
        self.keep_calls = keep_calls
        self.members: dict[tuple[str, str, int, str], Member] = {}
        self.version = 0
        self.notable = 0
        self.new_members = 0
        self._parts: list[pl.DataFrame] = []
        self._held = 0

    def add(
        self,
        lines: Sequence[tuple[str, str, datetime]],
        *,
        own_times: bool | None,
    ) -> int:
        """Read ``(path, text, arrived)`` lines of one poll; returns the COLL lines read.
        ``own_times``: the job's NCCL lines carry their own times (else each line's
        arrival is its time, as the window stamps it)."""
        if not lines:
            return 0
        paths, texts, arrived = zip(*lines, strict=True)
        frame = pl.DataFrame(
            {"path": paths, "text": texts, "arrived": arrived},
            schema={"path": pl.String, "text": pl.String, "arrived": TS},
        )
        is_coll = pl.col("text").str.contains(" opCount ", literal=True)
        notable = frame.select(
            (~is_coll & pl.col("text").str.contains_any(list(NOTABLE))).sum()
        ).item()
        self.notable += int(notable)
        coll = frame.filter(is_coll)
        if coll.is_empty():
            if notable:
                self.version += 1
            return 0
        calls = self._read(coll, own=bool(own_times))
        if calls.is_empty():
            return 0
        self._update(calls)
        self.version += 1
        return calls.height

    def _read(self, coll: pl.DataFrame, *, own: bool) -> pl.DataFrame:
        """The COLL lines' fields, each call numbered within its member after the calls
        its member made before."""
        parts = (
            coll.select("path", "arrived", pl.col("text").str.extract_groups(_COLL).alias("m"))
            .unnest("m")
            .filter(pl.col("comm").is_not_null())
        )
        if parts.is_empty():
            return pl.DataFrame(schema=CALLS_SCHEMA)
        fields = parts.select(
            "path",
            "host",
            pl.col("pid").cast(pl.Int32, strict=False),
            "comm",
            "op",
            pl.col("opcount").str.to_integer(base=16, strict=False).cast(pl.Int64),
            pl.col("count").cast(pl.Int64, strict=False),
            pl.col("dtype").cast(pl.Int16, strict=False),
            pl.col("nranks").cast(pl.Int32, strict=False),
            _ts(own).alias("ts"),
        ).drop_nulls(["pid"])
        before = pl.DataFrame(
            [(p, h, pid, c, m.calls, m.coll_calls) for (p, h, pid, c), m in self.members.items()],
            schema={**{k: CALLS_SCHEMA[k] for k in _KEY}, "calls0": pl.Int64, "coll0": pl.Int64},
            orient="row",
        )
        coll_call = ~pl.col("op").is_in(P2P_OPS)
        return (
            fields.join(before, on=list(_KEY), how="left", maintain_order="left")
            .with_columns(
                (pl.col("calls0").fill_null(0) + pl.int_range(pl.len()).over(_KEY)).alias("idx"),
                pl.when(coll_call)
                .then(pl.col("coll0").fill_null(0) + coll_call.cum_sum().over(_KEY) - 1)
                .alias("coll_idx"),
            )
            .with_columns((pl.col("idx") + 1).cast(pl.UInt32).alias("line_no"))
            .select(list(CALLS_SCHEMA))
            .cast(CALLS_SCHEMA)
        )

    def _update(self, calls: pl.DataFrame) -> None:
        coll_call = ~pl.col("op").is_in(P2P_OPS)
        # proc_comm_stats' signature: a hash of (op token, count, datatype) per call
        call = pl.struct(
            pl.concat_str(pl.col("op"), pl.lit(":")).alias("op_tok"), "count", "dtype"
        ).hash(seed=0)
        per = calls.group_by(_KEY, maintain_order=True).agg(
            pl.len().alias("n"),
            coll_call.sum().alias("coll"),
            pl.col("opcount").min().alias("oc_min"),
            pl.col("opcount").max().alias("oc_max"),
            pl.col("opcount").filter(coll_call).max().alias("coll_oc_max"),
            pl.col("nranks").max(),
            pl.when(coll_call).then(call).otherwise(0).sum().alias("signature"),
            pl.col("op").filter(coll_call).last().alias("op"),
            pl.col("ts").filter(coll_call).last().alias("ts"),
            pl.col("coll_idx").filter(coll_call).last().alias("last"),
        )
        for path, host, pid, comm, n, nc, lo, hi, chi, nranks, sig, op, ts, last in per.iter_rows():
            key = (path, host, pid, comm)
            m = self.members.get(key)
            if m is None:
                m = self.members[key] = Member()
                self.new_members += 1
            m.calls += n
            m.coll_calls += nc
            m.opcount_min = _least(m.opcount_min, lo)
            m.opcount_max = _most(m.opcount_max, hi)
            m.coll_opcount_max = _most(m.coll_opcount_max, chi)
            m.nranks = _most(m.nranks, nranks)
            m.signature = (m.signature + int(sig)) % (1 << 64)
            if nc and last is not None:
                m.op, m.ts = op, ts
        for every in MARK_EVERY:
            marks = (
                calls.filter(
                    pl.col("coll_idx").is_not_null()
                    & (pl.col("coll_idx") % every == 0)
                    & pl.col("ts").is_not_null()
                )
                .group_by(_KEY, maintain_order=True)
                .agg(pl.col("coll_idx", "ts").last())
            )
            for path, host, pid, comm, seq, ts in marks.iter_rows():
                self.members[(path, host, pid, comm)].marks[every] = (int(seq), ts)
        self._keep(calls)

    def _keep(self, calls: pl.DataFrame) -> None:
        """Hold the new calls; past twice the bound, keep each member's last
        ``keep_calls`` (a member that stopped keeps its last calls however long the
        others go on)."""
        self._parts.append(calls)
        self._held += calls.height
        bound = 2 * self.keep_calls * max(1, len(self.members))
        if self._held <= bound:
            return
        held = pl.concat(self._parts)
        kept = held.filter(pl.col("idx") >= pl.col("idx").max().over(_KEY) - (self.keep_calls - 1))
        self._parts, self._held = [kept], kept.height

    def calls(self) -> pl.DataFrame:
        """The calls held (each member's last ``keep_calls`` at least), in order."""
        if not self._parts:
            return pl.DataFrame(schema=CALLS_SCHEMA)
        if len(self._parts) > 1:
            self._parts = [pl.concat(self._parts)]
        return self._parts[0]

    def stats(self, file_ids: dict[str, int]) -> pl.DataFrame:
        """``proc_comm_stats``' columns for the members of the files in ``file_ids``
        (followed path -> the reference analysis's file id)."""
        rows = [
            (
                file_ids[path], host, pid, comm, m.calls, m.coll_calls, m.opcount_min,
                m.opcount_max, m.coll_opcount_max, m.calls, m.signature, m.nranks,
            )
            for (path, host, pid, comm), m in self.members.items()
            if path in file_ids
        ]  # fmt: skip
        return pl.DataFrame(rows, schema=_STATS_SCHEMA, orient="row")


_STATS_SCHEMA = pl.Schema(
    {
        "file_id": pl.UInt32,
        "host": pl.String,
        "pid": pl.Int32,
        "comm": pl.String,
        "calls": pl.UInt32,
        "coll_calls": pl.UInt32,
        "opcount_min": pl.Int64,
        "opcount_max": pl.Int64,
        "coll_opcount_max": pl.Int64,
        "last_line": pl.UInt32,
        "signature": pl.UInt64,
        "nranks": pl.Int32,
    }
)


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _most(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


@dataclass
class LiveContext(Context):
    """A reference analysis's context (its identity, its framework tables) whose
    progress and calls are the live ones: ``stalls`` and ``countdown`` run on it as
    they do post-mortem.  ``file_ids``: followed path -> the analysis's file id."""

    live: LiveProgress | None = field(default=None, kw_only=True)
    file_ids: dict[str, int] = field(default_factory=dict, kw_only=True)

    @cached_property
    def _stats(self) -> pl.DataFrame:
        assert self.live is not None
        return self.live.stats(self.file_ids)

    @cached_property
    def progress(self) -> pl.DataFrame:
        return progress_table(self._stats, self.analysis.identity.members)

    @cached_property
    def _calls(self) -> pl.DataFrame:
        """The held calls as ``COLLECTIVES_SCHEMA`` rows (by ``collectives_frame``'s
        rules: identity, and the sequence counted in order where opCount is constant)."""
        assert self.live is not None
        held = self.live.calls()
        ids = pl.DataFrame(
            {"path": list(self.file_ids), "file_id": list(self.file_ids.values())},
            schema={"path": pl.String, "file_id": pl.UInt32},
        )
        stats = self._stats
        key = ["file_id", "host", "pid", "comm"]
        unsure = ~ANCHORED & (pl.col("opcount_min") == pl.col("opcount_max")).fill_null(value=True)
        mapping = (
            self.analysis.identity.members.join(
                stats.select(*key, "opcount_min", "opcount_max"), on=key, how="left"
            )
            .select(
                *key,
                "comm_key",
                *(
                    pl.when(unsure).then(None).otherwise(pl.col(c)).alias(c)
                    for c in ("comm_rank", "rank")
                ),
            )
            .unique(key, keep="first")
        )
        counted = stats.filter(
            (pl.col("opcount_min") == pl.col("opcount_max")) & (pl.col("calls") > 1)
        ).select(*key, pl.lit(value=True).alias("counted"))
        return (
            held.join(ids, on="path", how="inner")
            .join(mapping, on=key, how="left")
            .join(counted, on=key, how="left")
            .filter(~pl.col("op").is_in(P2P_OPS) & pl.col("comm_key").is_not_null())
            .with_columns(
                pl.when(pl.col("counted").fill_null(value=False))
                .then(pl.col("idx"))
                .otherwise(pl.col("opcount"))
                .alias("seq")
            )
        )

    def collectives(self) -> pl.LazyFrame | None:
        return self._calls.lazy()

    def rows_at(self, comm_key: str, seqs: list[int]) -> pl.DataFrame:
        if not seqs:
            return pl.DataFrame()
        return self._calls.filter(
            (pl.col("comm_key") == comm_key) & pl.col("seq").is_in(seqs)
        ).sort("seq", "comm_rank")


def live_context(
    reference: Context, live: LiveProgress, file_ids: dict[str, int], now: datetime
) -> LiveContext:
    """``reference`` (the last analysis of the window) with ``live``'s progress."""
    return LiveContext(reference.analysis, now=now, live=live, file_ids=file_ids)


Rows = dict[str, list[tuple[tuple[str, ...], float]]]


def member_rows(live: LiveProgress, members: pl.DataFrame, file_ids: dict[str, int]) -> Rows:
    """The members' metric rows, as ``live.job_rows`` reads them post-mortem from the
    tables: per (communicator, rank) the sequence of its last collective counted since
    the agent started (``ncclscope_collective_seq``; by communicator rank where the
    global one is unknown), when it entered it and its op, the last marks; per
    communicator its size; per rank its host.  ``members``: the reference analysis's
    identity members."""
    rows: Rows = {}
    if members.is_empty():
        return rows
    stats = live.stats(file_ids)
    if stats.is_empty():
        return rows
    key = ["file_id", "host", "pid", "comm"]
    ids = {v: k for k, v in file_ids.items()}
    unsure = ~ANCHORED & (pl.col("opcount_min") == pl.col("opcount_max")).fill_null(value=True)
    joined = (
        stats.join(
            members.select(*key, "comm_key", "comm_rank", "rank", "known_from"),
            on=key,
            how="inner",
        )
        .filter(pl.col("comm_key").is_not_null())
        # collectives_frame's rank: none for a member its opCount cannot place
        .with_columns(pl.when(unsure).then(None).otherwise(pl.col("rank")).alias("placed"))
        .sort("file_id")
    )
    seqs: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, int], tuple[str | None, datetime | None, str, int | None]] = {}
    marks: dict[tuple[str, int, int], tuple[int, datetime]] = {}
    for fid, host, pid, comm, comm_key, comm_rank, rank, placed in joined.select(
        *key, "comm_key", "comm_rank", "rank", "placed"
    ).iter_rows():
        m = live.members[(ids[fid], host, pid, comm)]
        if not m.coll_calls:
            continue
        if comm_rank is not None:
            who = rank if rank is not None else comm_rank
            k = (comm_key, int(who))
            seqs[k] = max(seqs.get(k, -1), m.coll_calls - 1)
        if placed is None:
            continue
        k = (comm_key, int(placed))
        was = last.get(k)
        nranks = _most(was[3] if was else None, m.nranks)
        last[k] = (m.op, m.ts, host, nranks)
        for every, (seq, ts) in m.marks.items():
            mk = (comm_key, int(placed), every)
            if mk not in marks or marks[mk][0] <= seq:
                marks[mk] = (seq, ts)
    rows["ncclscope_collective_seq"] = [
        ((c, str(w)), float(s)) for (c, w), s in sorted(seqs.items())
    ]
    if not last:
        return rows
    order = sorted(last)
    for comm_key, who in order:
        op, entered, _host, _n = last[(comm_key, who)]
        if entered is not None:
            rows.setdefault("ncclscope_collective_entered_timestamp_seconds", []).append(
                ((comm_key, str(who)), entered.timestamp())
            )
        rows.setdefault("ncclscope_collective_op_info", []).append(
            ((comm_key, str(who), str(op)), 1.0)
        )
    sizes: dict[str, int] = {}
    for (comm_key, _who), (_op, _ts, _host, n) in last.items():
        if n is not None:
            sizes[comm_key] = max(sizes.get(comm_key, n), n)
    rows["ncclscope_communicator_ranks"] = [((c,), float(n)) for c, n in sorted(sizes.items())]
    hosts: dict[int, str] = {}
    for comm_key, who in order:
        host = last[(comm_key, who)][2]
        if who not in hosts and host is not None:
            hosts[who] = host
    rows["ncclscope_rank_info"] = [((str(w), h), 1.0) for w, h in hosts.items()]
    for every in MARK_EVERY:
        for comm_key, who in order:
            got = marks.get((comm_key, who, every))
            if got is None:
                continue
            labels = (comm_key, str(who), str(every))
            rows.setdefault("ncclscope_collective_mark_seq", []).append((labels, float(got[0])))
            rows.setdefault("ncclscope_collective_mark_timestamp_seconds", []).append(
                (labels, got[1].timestamp())
            )
    return rows
