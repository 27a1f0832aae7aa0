"""The job's collective progress, kept up to date as lines arrive: the live side of
``Context.progress`` and of the countdown.

Every poll's COLL lines are read once, where NCCL puts their fields (host, pid, op,
opCount, comm pointer, size; the time only of a member's last line in the poll and of
its marks), and each NCCL member (followed file, host, pid, comm pointer) keeps what
``proc_comm_stats`` computes post-mortem: calls, collective calls, the opCount range,
the last collective's op and time, the arrival at each mark (``MARK_EVERY``), and its
last ``keep_calls`` lines, read again (by the reference parser) only for a stall's
evidence.  A tick with no new line costs nothing.

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

import functools
import math
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from functools import cached_property
from typing import TypeAlias

import polars as pl

from ncclscope.detect.context import Context, progress_table
from ncclscope.model.collectives import P2P_OPS
from ncclscope.model.identity import ANCHORED
from ncclscope.parsers.nccl.lines import Coll, parse_line, parse_ts
from ncclscope.parsers.nccl.patterns import HOST_CHARS
from ncclscope.parsers.torch.lines import logger_time
from ncclscope.parsers.zone import quarter_offset
from ncclscope.schema import LIVE_CALLS_SCHEMA as CALLS_SCHEMA
from ncclscope.schema import TS

__all__ = [
    "MARK_EVERY",
    "LiveContext",
    "LiveProgress",
    "Member",
    "MemberIndex",
    "member_rows",
    "might_stall",
]

#: Sequence numbers at which a member's arrival time is also exported as a mark (every
#: multiple of each): Prometheus compares members of one communicator at the same mark,
#: whatever moment each node's agent last exported.  Two spacings, so that one of them
#: lasts seconds to minutes on jobs whose collectives come every 5 ms or every 0.5 s.
MARK_EVERY = (64, 1024)

#: Lines that are not COLL lines but change what the reference analysis would say: any
#: other NCCL line (a new member's init, a WARN, a teardown; NCCL prints none between
#: collectives of a running job), a watchdog's report, an error: the agent runs it again
#: soon after one.  A COLL line that cannot be read counts too (damage to report).
NOTABLE = (" NCCL ", "Watchdog", "Timeout(ms)", "ERROR", "Traceback")

_NOTABLE_RE = re.compile("|".join(re.escape(x) for x in NOTABLE))

_KEY = ("path", "host", "pid", "comm")

#: A member: followed path, host, pid, comm pointer.
MemberKey = tuple[str, str, int, str]


@dataclass
class Member:
    """One NCCL member's statistics so far (``proc_comm_stats``'s columns; no call
    signature: only the mismatch detector reads it, and it does not run live)."""

    calls: int = 0
    coll_calls: int = 0
    opcount_min: int | None = None
    opcount_max: int | None = None
    coll_opcount_max: int | None = None
    nranks: int | None = None
    #: its last collective call: op and time (None without one)
    op: str | None = None
    ts: datetime | None = None
    #: per mark spacing: (sequence, time) of the last mark reached with a time
    marks: dict[int, tuple[int, datetime]] = field(default_factory=dict)
    #: when its last call arrived (the agent's clock, whatever the log's says)
    seen: datetime | None = None
    #: its last calls: (calls before it, its opCount, collective calls before it or
    #: None for Send/Recv, arrival, the line), read again only for a stall's evidence
    held: deque[tuple[int, int | None, int | None, datetime, str]] = field(default_factory=deque)


#: What the hot path reads of a COLL line: host, pid, op, opCount, comm pointer, size,
#: and where NCCL's header starts (the prefix before it holds the line's time).  A plain
#: tuple: a named one's constructor cost a sixth of a line's reading.
_Call: TypeAlias = tuple[str, int, str, int | None, str, int | None, int]


#: A COLL line's body after ``NCCL INFO `` (``patterns.COLL_RE``, with only the fields
#: the progress keeps captured).
_BODY_RE = re.compile(
    r"([A-Za-z]+): opCount ([0-9a-fA-F]{1,15}) sendbuff \S+ recvbuff \S+ count \d+ "
    r"datatype \d+ op \d+ root -?\d+ comm (\S+) \[nranks=(\d{1,9})\]"
)


def _read_fast(text: str) -> _Call | None:
    """A COLL line's member, op, opCount and size, read where NCCL puts them: the body
    right after ``NCCL INFO ``, the header token (``host:pid:tid``) the last word before
    it or before ``[dev]``.  None where the line is not that plain (a bar's ``\\r``,
    two headers spliced, a number past its column's type, words out of place):
    ``parse_line``, the reference parser, reads those.

    >>> _read_fast("[2025-03-14 09:00:09.387136] node-6:5381:5381 [3] NCCL INFO AllGather: "
    ...            "opCount 1a sendbuff 0x7f recvbuff 0x7e count 4 datatype 9 op 0 root 0 "
    ...            "comm 0x55d1 [nranks=16] stream 0x55")
    ('node-6', 5381, 'AllGather', 26, '0x55d1', 16, 29)
    """
    at = text.find(" NCCL INFO ")
    if at <= 0:
        return None
    m = _BODY_RE.match(text, at + 11)
    if m is None or "\r" in text or text.count(" NCCL ", at + 11):
        return None
    head = text[:at]
    start = head.rfind(" ") + 1
    token = head[start:]
    if token.startswith("[") and token.endswith("]"):  # [dev]
        head = head[: start - 1]
        start = head.rfind(" ") + 1
        token = head[start:]
    member = _token(token)
    if member is None:
        return None
    host, pid, offset = member
    op, opcount, comm, nranks = m.groups()
    return host, pid, op, int(opcount, 16), comm, int(nranks), start + offset


_INT32 = 2**31 - 1
_INT64 = 2**63 - 1
_HOST_RE = re.compile(rf"(?P<host>{HOST_CHARS}+):(?P<pid>\d+):\d+$")


@functools.lru_cache(maxsize=4096)
def _token(token: str) -> tuple[str, int, int] | None:
    """``host:pid:tid`` (after any launcher tag glued to it, ``[rank3]:``) as (host,
    pid, where the host starts); a job has a few tokens, each read once."""
    m = _HOST_RE.search(token)
    if m is None or int(m["pid"]) > _INT32:
        return None
    return m["host"], int(m["pid"]), m.start()


def _fits(call: _Call) -> bool:
    """Numbers the tables' columns hold (pid and size Int32, opCount Int64): a line with
    others is damage, as the reference reader counts it."""
    _host, pid, _op, opcount, _comm, nranks, _at = call
    return (
        pid <= _INT32
        and (nranks is None or nranks <= _INT32)
        and (opcount is None or opcount <= _INT64)
    )


def _read_slow(text: str) -> tuple[_Call, datetime | None] | None:
    """A COLL line as the reference parser reads it (any prefix, ``\\r`` bars, spliced
    lines), with its time."""
    rec = parse_line(text)
    if rec is None or rec.kind != "coll" or rec.header is None:
        return None
    body = rec.body
    if not isinstance(body, Coll):
        return None
    call = (rec.header.host, rec.header.pid, body.op, body.opcount, body.comm, body.nranks, 0)
    return call, rec.ts


def _time(text: str, call: _Call) -> datetime | None:
    """The time NCCL printed before the header (``[%F %T.%Nf] ``; a logger's where NCCL's
    is absent), as the reference parser reads it."""
    return parse_ts(text[: call[6]])[0]


class LiveProgress:
    """Every NCCL member's progress over the lines added so far, updated line by line
    with string operations (no regex, no frame: ~2-3 us a COLL line).

    ``version`` grows with every poll that changed something; ``notable`` counts
    lines that call for a new reference analysis (``NOTABLE``); ``new_members`` the
    members ever seen.
    """

    def __init__(self, *, keep_calls: int = 512, zone: tzinfo | None = None) -> None:
        self.keep_calls = keep_calls
        self.members: dict[MemberKey, Member] = {}
        self.version = 0
        self.notable = 0
        self.new_members = 0
        #: the job's NCCL lines carry their own times (else arrivals are their times)
        self._own = False
        #: the zone the job's times were written in, where the user named it
        self.zone = zone
        #: the job's clock less UTC, in seconds: NCCL prints local time without a zone.
        #: Members keep the times as printed; what leaves (rows, calls) is UTC.  None
        #: until known: named (``zone``) or learned (``_learn``).
        self.offset_s: float | None = None
        #: an offset one poll gave, waiting for a later poll to agree
        self._candidate: float | None = None
        self._paths: set[str] = set()

    def add(
        self,
        lines: Sequence[tuple[str, str, datetime]],
        *,
        own_times: bool | None,
    ) -> int:
        """Read ``(path, text, arrived)`` lines of one poll; returns the COLL lines read.
        ``own_times``: the job's NCCL lines carry their own times (else each line's
        arrival is its time, as the window stamps it)."""
        return self.add_texts(
            [(path, [text], arrived) for path, text, arrived in lines], own_times=own_times
        )

    def add_texts(
        self, batches: Sequence[tuple[str, list[str], datetime]], *, own_times: bool | None
    ) -> int:
        """``add`` for runs of one file's lines read at once (``Follower.poll_texts``)."""
        self._own = bool(own_times)
        read = notable = 0
        last: dict[MemberKey, tuple[Member, str, _Call | None, datetime]] = {}
        members, notable_re, p2p = self.members, _NOTABLE_RE.search, P2P_OPS
        for path, texts, arrived in batches:
            for text in texts:
                if " opCount " not in text:
                    if notable_re(text):
                        notable += 1
                    continue
                call = _read_fast(text)
                ts: datetime | None = None
                if call is None:
                    slow = _read_slow(text)
                    if slow is None or not _fits(slow[0]):
                        notable += 1  # damaged: the reference analysis counts it
                        continue
                    call, ts = slow
                host, pid, op, oc, comm, nranks, _at = call
                key = (path, host, pid, comm)
                m = members.get(key)
                if m is None:
                    m = members[key] = Member(held=deque(maxlen=self.keep_calls))
                    self.new_members += 1
                read += 1
                idx = m.calls
                m.calls = idx + 1
                if oc is not None:
                    if m.opcount_min is None or oc < m.opcount_min:
                        m.opcount_min = oc
                    if m.opcount_max is None or oc > m.opcount_max:
                        m.opcount_max = oc
                if nranks is not None and (m.nranks is None or nranks > m.nranks):
                    m.nranks = nranks
                coll_idx = None
                if op not in p2p:
                    coll_idx = m.coll_calls
                    m.coll_calls = coll_idx + 1
                    if oc is not None and (m.coll_opcount_max is None or oc > m.coll_opcount_max):
                        m.coll_opcount_max = oc
                    m.op, m.seen = op, arrived
                    last[key] = (m, text, None if ts is not None else call, arrived)
                    if ts is not None:
                        m.ts = ts
                    if coll_idx % _MARK_GCD == 0:
                        when = arrived if not own_times else ts or _time(text, call)
                        for every in MARK_EVERY:
                            if coll_idx % every == 0 and when is not None:
                                m.marks[every] = (coll_idx, when)
                m.held.append((idx, oc, coll_idx, arrived, text))
        # A member's time is read off its last collective line of the poll only.
        fresh: list[tuple[datetime, datetime]] = []
        for (path, *_key), (m, text, call, arrived) in last.items():
            if not own_times:
                m.ts = arrived
                continue
            if call is not None:
                m.ts = _time(text, call)
            if m.ts is not None and path in self._paths:
                fresh.append((m.ts, arrived))
        if not own_times:
            # NCCL prints no time (the window stamps arrivals, UTC): the job's clock is
            # read off PyTorch's and DeepSpeed's stamps, which the analysis reads in it.
            fresh = [
                (ts, arrived)
                for path, texts, arrived in batches
                if path in self._paths and (ts := _framework_time(texts, arrived)) is not None
            ]
        self._paths.update(path for path, _texts, _arrived in batches)
        self._learn(fresh, batches[-1][2] if batches else None)
        self.notable += notable
        if read or notable:
            self.version += 1
        return read

    def _learn(self, fresh: list[tuple[datetime, datetime]], now: datetime | None) -> None:
        """The job's clock less UTC: from the zone the user named, else from the newest
        line of a poll against its arrival (lines of a file's first poll may be hours
        old, and are not used).  A zone's offset is a whole quarter hour; a line is
        printed before it arrives, within ``_FRESH_S``; two polls must agree (one line
        that sat in a buffer for minutes is not the clock)."""
        if self.zone is not None:
            if now is not None:
                offset = now.astimezone(self.zone).utcoffset()
                self.offset_s = offset.total_seconds() if offset is not None else 0.0
            return
        if not fresh:
            return
        ts, arrived = max(fresh)
        # Beyond the zones' range the job's clock is no zone of this node's (a replay,
        # a log copied from elsewhere): nothing to learn from it.
        guess = quarter_offset((ts - arrived).total_seconds(), before_s=_FRESH_S, after_s=_SKEW_S)
        if guess is not None:
            if self._candidate == guess:
                self.offset_s = float(guess)
            self._candidate = float(guess)

    def most_calls(self) -> int:
        """The most collectives any member has logged (0 before any)."""
        return max((m.coll_calls for m in self.members.values()), default=0)

    def utc(self, ts: datetime) -> datetime:
        """A time as the job's NCCL printed it, in UTC (unchanged while the offset is
        unknown, and where the times are arrivals: NCCL printed none)."""
        return ts - timedelta(seconds=self.offset_s) if self.offset_s and self._own else ts

    def last_seen(self) -> datetime | None:
        """When a member last logged a collective (the agent's clock); None before any."""
        seen = [m.seen for m in self.members.values() if m.seen is not None]
        return max(seen) if seen else None

    def silent(self, now: datetime, for_s: float) -> bool:
        """Has a member logged no collective for ``for_s`` seconds of the agent's clock?
        Until one has, every collective some members entered and others not is one a
        poll cut through (the others' lines are on their way): no stall to read."""
        return any(
            m.seen is not None and (now - m.seen).total_seconds() >= for_s
            for m in self.members.values()
        )

    def calls(
        self, keys: Iterable[MemberKey] | None = None, seqs: Iterable[int] | None = None
    ) -> pl.DataFrame:
        """The held calls (``LIVE_CALLS_SCHEMA``) of ``keys``' members (all by default),
        only those that may be at ``seqs`` where given (counted in order or by opCount),
        each line read again by the reference parser."""
        wanted = set(seqs) if seqs is not None else None
        rows = []
        for key in keys if keys is not None else list(self.members):
            m = self.members.get(key)
            if m is None:
                continue
            for idx, oc, coll_idx, arrived, text in m.held:
                if wanted is not None and idx not in wanted and oc not in wanted:
                    continue
                rec = parse_line(text)
                if rec is None or not isinstance(rec.body, Coll):
                    continue
                b = rec.body
                rows.append(
                    (*key, b.op, b.opcount, b.count, b.dtype, b.nranks, rec.ts,
                     idx, coll_idx, idx + 1, arrived)
                )  # fmt: skip
        frame = pl.DataFrame(rows, schema={**CALLS_SCHEMA, "arrived": TS}, orient="row")
        if not self._own:
            return frame.drop("ts").rename({"arrived": "ts"}).select(list(CALLS_SCHEMA))
        frame = frame.drop("arrived")
        if self.offset_s:
            frame = frame.with_columns(pl.col("ts") - pl.duration(seconds=self.offset_s))
        return frame

    def stats(self, file_ids: dict[str, int]) -> pl.DataFrame:
        """``proc_comm_stats``' columns for the members of the files in ``file_ids``
        (followed path -> the reference analysis's file id)."""
        rows = [
            (
                file_ids[path], host, pid, comm, m.calls, m.coll_calls, m.opcount_min,
                m.opcount_max, m.coll_opcount_max, m.calls, 0, m.nranks,
            )
            for (path, host, pid, comm), m in self.members.items()
            if path in file_ids
        ]  # fmt: skip
        return pl.DataFrame(rows, schema=_STATS_SCHEMA, orient="row")


#: Lines of a poll searched from its end for a PyTorch or DeepSpeed stamp.
_STAMP_LINES = 16


def _framework_time(texts: list[str], arrived: datetime) -> datetime | None:
    """The newest PyTorch or DeepSpeed logger stamp among a poll's last lines, as
    printed (``torch.lines.logger_time``; glog's, which has no year, in the arrival's).

    >>> from datetime import UTC
    >>> _framework_time(["[2025-03-14 18:00:09,239] [INFO] [engine.py:1960:step] x"],
    ...                 datetime(2025, 3, 14, 9, 0, 10, tzinfo=UTC))
    datetime.datetime(2025, 3, 14, 18, 0, 9, 239000, tzinfo=datetime.timezone.utc)
    """
    for text in texts[: -_STAMP_LINES - 1 : -1]:
        if " NCCL " in text:
            continue  # NCCL's lines carry no time here; a message may quote one
        ts = logger_time(text, arrived.year)
        if ts is not None:
            return ts
    return None


#: A line used to learn the job's clock was printed at most this long before it arrived
#: (the agent polls every interval; NCCL flushes each line) ...
_FRESH_S = 120.0
#: ... and at most this long after, by the node's clocks (NTP keeps them within ms).
_SKEW_S = 5.0

#: the coarsest spacing every mark spacing is a multiple of
_MARK_GCD = math.gcd(*MARK_EVERY)


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
    def _mapping(self) -> pl.DataFrame:
        """Per member of the held calls: its file id, communicator and ranks (by
        ``collectives_frame``'s rules: none where its opCount cannot place it), and
        whether its calls are counted in order (opCount constant)."""
        stats = self._stats
        key = ["file_id", "host", "pid", "comm"]
        unsure = ~ANCHORED & (pl.col("opcount_min") == pl.col("opcount_max")).fill_null(value=True)
        ids = pl.DataFrame(
            {"path": list(self.file_ids), "file_id": list(self.file_ids.values())},
            schema={"path": pl.String, "file_id": pl.UInt32},
        )
        return (
            self.analysis.identity.members.join(
                stats.select(*key, "opcount_min", "opcount_max", "calls"), on=key, how="inner"
            )
            .filter(pl.col("comm_key").is_not_null())
            .select(
                *key,
                "comm_key",
                *(
                    pl.when(unsure).then(None).otherwise(pl.col(c)).alias(c)
                    for c in ("comm_rank", "rank")
                ),
                ((pl.col("opcount_min") == pl.col("opcount_max")) & (pl.col("calls") > 1))
                .fill_null(value=False)
                .alias("counted"),
            )
            .unique(key, keep="first", maintain_order=True)
            .join(ids, on="file_id", how="inner")
        )

    def _rows(self, mapping: pl.DataFrame, seqs: list[int] | None = None) -> pl.DataFrame:
        """The held calls of ``mapping``'s members as ``COLLECTIVES_SCHEMA``-like rows,
        with their sequence (counted in order where opCount is constant); only those
        that may be at ``seqs`` where given."""
        assert self.live is not None
        keys = [
            (str(p), str(h), int(pid), str(c)) for p, h, pid, c in mapping.select(_KEY).iter_rows()
        ]
        return (
            self.live.calls(keys, seqs)
            .join(mapping, on=list(_KEY), how="inner")
            .filter(~pl.col("op").is_in(P2P_OPS))
            .with_columns(
                pl.when(pl.col("counted"))
                .then(pl.col("idx"))
                .otherwise(pl.col("opcount"))
                .alias("seq")
            )
        )

    def collectives(self) -> pl.LazyFrame | None:
        return self._rows(self._mapping).lazy()

    def rows_at(self, comm_key: str, seqs: list[int]) -> pl.DataFrame:
        if not seqs:
            return pl.DataFrame()
        mine = self._mapping.filter(pl.col("comm_key") == comm_key)
        return self._rows(mine, seqs).filter(pl.col("seq").is_in(seqs)).sort("seq", "comm_rank")


Rows = dict[str, list[tuple[tuple[str, ...], float]]]


#: A member in the reference's identity, as the live path reads it: its communicator,
#: its rank in it and its global rank (None where unknown), and whether its lines start
#: with the communicator (``identity.ANCHORED``; None where nothing says).
Known: TypeAlias = tuple[str, int | None, int | None, bool | None]


@dataclass(frozen=True)
class MemberIndex:
    """The reference analysis's identity members, read once into plain Python: the live
    path (``member_rows``, ``might_stall``) reads them every tick without polars.

    ``by_key``: (file id, host, pid, comm pointer) -> the members it is (those with a
    communicator), in the table's order; ``anchored``: per communicator, the comm ranks
    of a member whose lines start with it (``Context.members``' ``anchored``)."""

    by_key: dict[tuple[int, str, int, str], list[Known]]
    anchored: dict[str, frozenset[int]]

    @classmethod
    def of(cls, members: pl.DataFrame) -> MemberIndex:
        """From ``identity.members`` (``MEMBERS_SCHEMA``)."""
        by_key: dict[tuple[int, str, int, str], list[Known]] = {}
        anchored: dict[str, set[int]] = {}
        cols = ["file_id", "host", "pid", "comm", "comm_key", "comm_rank", "rank", "known_from"]
        for fid, host, pid, comm, comm_key, comm_rank, rank, known_from in members.select(
            cols
        ).iter_rows():
            # ANCHORED's three values: null where the row says nothing
            sure = None if known_from is None else known_from not in _UNANCHORED
            if comm_key is None:
                continue
            by_key.setdefault((fid, host, pid, comm), []).append((comm_key, comm_rank, rank, sure))
            if comm_rank is not None and sure:
                anchored.setdefault(comm_key, set()).add(int(comm_rank))
        return cls(by_key, {k: frozenset(v) for k, v in anchored.items()})


#: ``identity.ANCHORED``'s values that say a member's lines may not start with it
_UNANCHORED = ("teardown", "elimination")


def _joined(
    live: LiveProgress, members: MemberIndex, file_ids: dict[str, int]
) -> list[tuple[Member, str, Known]]:
    """``live.stats`` joined to the members (inner, on file id, host, pid and comm
    pointer), by file id, then in the order members arrived."""
    out: list[tuple[int, Member, str, Known]] = []
    for (path, host, pid, comm), m in live.members.items():
        fid = file_ids.get(path)
        if fid is None:
            continue
        out.extend(
            (fid, m, host, known) for known in members.by_key.get((fid, host, pid, comm), ())
        )
    out.sort(key=lambda r: r[0])  # stable: arrival order within a file
    return [(m, host, known) for _fid, m, host, known in out]


def _same_opcount(m: Member) -> bool | None:
    """opCount never changed (None where the member logged none)."""
    if m.opcount_min is None or m.opcount_max is None:
        return None
    return m.opcount_min == m.opcount_max


def might_stall(live: LiveProgress, members: MemberIndex, file_ids: dict[str, int]) -> bool:
    """Could ``stalls`` find one on the live state?  False only where it cannot: in
    every communicator, every member that ``progress_table`` keeps is at the same last
    sequence and every anchored member has a row (else it counts as behind, at -1).  A
    healthy job at rest answers False without a frame built: the agent reads a stall
    (``LiveContext``, polars) only when this says True."""
    seqs: dict[str, set[int]] = {}
    covered: dict[str, set[int]] = {}
    for m, _host, (comm_key, comm_rank, _rank, sure) in _joined(live, members, file_ids):
        if m.coll_calls <= 0 or comm_rank is None:
            continue
        same = _same_opcount(m)
        if not (sure is True or same is False):  # progress_table's filter
            continue
        last = m.calls - 1 if same and m.calls > 1 else m.coll_opcount_max
        if last is None:
            return True  # a null sequence: let the reference rules decide
        seqs.setdefault(comm_key, set()).add(last)
        covered.setdefault(comm_key, set()).add(int(comm_rank))
    for comm_key, found in seqs.items():
        if len(found) > 1 or members.anchored.get(comm_key, frozenset()) - covered[comm_key]:
            return True
    return False


def member_rows(live: LiveProgress, members: MemberIndex, file_ids: dict[str, int]) -> Rows:
    """The members' metric rows, as ``live.job_rows`` reads them post-mortem from the
    tables: per (communicator, rank) the sequence of its last collective counted since
    the agent started (``ncclscope_collective_seq``; by communicator rank where the
    global one is unknown), when it entered it and its op, the last marks; per
    communicator its size; per rank its host.  ``members``: the reference analysis's
    identity members (``MemberIndex``).  Plain Python: it runs whenever a line came."""
    rows: Rows = {}
    joined = _joined(live, members, file_ids)
    if not joined:
        return rows
    seqs: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, int], tuple[str | None, datetime | None, str, int | None]] = {}
    marks: dict[tuple[str, int, int], tuple[int, datetime]] = {}
    for m, host, (comm_key, comm_rank, rank, sure) in joined:
        if not m.coll_calls:
            continue
        # collectives_frame's rank: none for a member its opCount cannot place
        same = _same_opcount(m)
        unsure = sure is False and same is not False
        placed = None if unsure else rank
        if comm_rank is not None:
            who = rank if rank is not None else comm_rank
            k = (comm_key, int(who))
            seqs[k] = max(seqs.get(k, -1), m.coll_calls - 1)
        if placed is None:
            continue
        k = (comm_key, int(placed))
        was = last.get(k)
        nranks = _most(was[3] if was else None, m.nranks)
        last[k] = (m.op, live.utc(m.ts) if m.ts is not None else None, host, nranks)
        for every, (seq, ts) in m.marks.items():
            mk = (comm_key, int(placed), every)
            if mk not in marks or marks[mk][0] <= seq:
                marks[mk] = (seq, live.utc(ts))
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
