"""The rows one pass over a file collects, and the parser state that merges them.

The same timeout or process failure is printed several times (the watchdog line, its
``what():``, the traceback; the agent line and the summary entry): :class:`_Parser`
merges these into one row each and matches companion lines to their timeout.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum

import polars as pl

from ncclscope.parsers.common import to_dt
from ncclscope.parsers.torch.patterns import (
    _NO_OTHER,
    _SUM_ENTRY_RE,
    _SUM_EXIT_RE,
    _SUM_FIELD_RE,
    _SUM_RANK_RE,
    _SUM_RULE_RE,
    _SUM_SECTION_RE,
    _SUM_SIGNAL_RE,
    _SUM_TIME_RE,
    _SUM_TITLE_RE,
    _SUM_TOP_RULE_RE,
    _VERSION_RES,
)
from ncclscope.parsers.torch.prefixes import (
    _COMPANION_REACH,
    _MAX_CHARS,
    _MAX_JOIN,
    _compat,
    _Ctx,
    _first,
    _int,
    _launcher_prefix,
    _other_host,
    _same_host,
    _signal_name,
    _strip_prefixes,
)

__all__ = ["TorchResult"]

# --------------------------------------------------------------------------------------
# Rows


@dataclass(slots=True)
class _Timeout:
    line_no: int
    host: str | None
    global_rank: int | None
    rank: int | None
    pg: str | None
    pg_desc: str | None
    seq: int | None
    op: str | None
    numel_in: int | None = None
    numel_out: int | None = None
    timeout_s: float | None = None
    ran_for_s: float | None = None
    last_enqueued: int | None = None
    last_completed: int | None = None
    ts: datetime | None = None
    ts_source: str = "none"


@dataclass(slots=True)
class _Failure:
    line_no: int
    host: str | None
    rank: int | None
    local_rank: int | None
    pid: int | None
    exitcode: int | None
    signal: str | None
    root_cause: bool
    source: str  # summary | agent
    ts: datetime | None = None
    ts_source: str = "none"


@dataclass(slots=True)
class _Event:
    line_no: int
    host: str | None
    global_rank: int | None
    rank: int | None
    pg: str | None
    kind: str
    seq: int | None = None
    op: str | None = None
    ranks: list[int] | None = None
    value: int | None = None
    message: str | None = None
    ts: datetime | None = None
    ts_source: str = "none"


@dataclass(slots=True)
class _Companion:
    """A companion line (EXC_DET / TO_AT / FAIL_DET), matched to its timeout at the end."""

    line_no: int
    variant: str
    ctx: _Ctx
    seq: int
    enqueued: int | None
    completed: int | None


@dataclass(slots=True)
class _Entry:
    """One ``[k]:`` entry of a ChildFailedError summary, filled field by field."""

    line_no: int
    host: str | None
    root_cause: bool
    fields: dict[str, str] = field(default_factory=dict)


_TS_RANK = {"none": 0, "logger_no_year": 1, "logger": 2}


@dataclass(frozen=True, slots=True)
class TorchResult:
    """What :func:`parse_torch` read from one file."""

    timeouts: pl.DataFrame  # TIMEOUTS_SCHEMA
    failures: pl.DataFrame  # FAILURES_SCHEMA
    events: pl.DataFrame  # TORCH_EVENTS_SCHEMA
    version: str | None  # a torch version if some line printed one, else None
    seen: bool  # at least one PyTorch-distributed / torchelastic line recognised
    parsed: int  # lines that contributed to a record (continuation lines included)
    malformed: int  # lines that began like a family but could not be parsed
    first_malformed: int | None  # line_no of the first of those


# --------------------------------------------------------------------------------------
# The parser


class _Outcome(Enum):
    """What a family made of a line.

    NONE: not this family after all (its needle matched, its trigger did not).
    PARSED: the line (and any lines glued to it) gave a record.
    MALFORMED: the line began like the family but its pattern failed, even after
    gluing the following lines.
    """

    NONE = 0
    PARSED = 1
    MALFORMED = 2


_Handler = Callable[["_Parser", int, _Ctx, str], tuple[_Outcome, str]]


class _Parser:
    """State of one pass over one file's delivered lines."""

    def __init__(self, items: list[tuple[int, str]], *, year: int | None) -> None:
        self.items = items  # (line_no, text) of the delivered lines, cleaned
        self.year = year
        self._stripped: list[tuple[_Ctx, str] | None] = [None] * len(self.items)
        self.consumed = [False] * len(self.items)
        self.parsed: set[int] = set()
        self.malformed: set[int] = set()  # disjoint from parsed
        self.version: str | None = None
        self.timeouts: list[_Timeout] = []
        self._timeout_index: dict[tuple[str | None, int | None, int | None], list[_Timeout]] = {}
        self.companions: list[_Companion] = []
        self.failures: list[_Failure] = []
        self._failures_by_pid: dict[int, list[_Failure]] = {}
        self.events: list[_Event] = []
        # the header line of the record that unprefixed lines continue (desync report)
        self.head: _Ctx | None = None
        self.head_index: int | None = None
        self.desync_rank: int | None = None
        # the ChildFailedError summary being read
        self.summary_active = False
        self.section_root = False
        self.entry: _Entry | None = None

    # ---- line access ------------------------------------------------------------

    def stripped(self, i: int) -> tuple[_Ctx, str]:
        cached = self._stripped[i]
        if cached is None:
            cached = _strip_prefixes(self.items[i][1], self.year)
            self._stripped[i] = cached
        return cached

    def follows(self, j: int) -> bool:
        """Line ``j`` was delivered right after line ``j - 1`` (no gap) and is unread."""
        return (
            0 < j < len(self.items)
            and not self.consumed[j]
            and self.items[j][0] == self.items[j - 1][0] + 1
        )

    def take(self, first: int, last: int) -> None:
        """Mark lines ``first..last`` as part of a record and not to be read again."""
        for j in range(first, last + 1):
            self.consumed[j] = True
            self.parsed.add(j)

    def detail_text(self, j: int, head: _Ctx) -> str | None:
        """Line ``j`` as a continuation of the record ``head`` printed, or ``None``.

        A line with its own logger header, or from another host or rank, is not one.
        A lone ``word: `` taken for a pdsh host where ``head`` had none is the text's own
        (``socketStartConnect: Connect to ... failed``), so the whole line is kept.
        """
        ctx, text = self.stripped(j)
        if ctx.header or not (
            _same_host(ctx.host, head.host) and _compat(ctx.global_rank, head.global_rank)
        ):
            return None
        if ctx.host is not None and head.host is None and not ctx.prefixed:
            return self.items[j][1]
        return text

    def match(self, i: int, text: str, regex: re.Pattern[str]) -> tuple[re.Match[str] | None, str]:
        """``regex`` in ``text``, gluing hard-wrapped continuation lines when needed.

        A terminal or a pasting user cuts long lines anywhere (``Nume`` / ``lOut=1``,
        ``ran for 600052 `` / ``milliseconds``); the cut may have kept or dropped the
        space, so both joins are tried.  Only lines with no prefix of their own, right
        after this one, are glued.
        """
        m = regex.search(text)
        if m is not None:
            return m, text
        variants = [text]
        # A job runner that wraps long lines forwards each piece with its own tags
        # (``srun -l``'s ``3: ``, ``[default3]:``): a piece that starts with (the outer
        # part of) this line's tags, and holds no logger prefix after them, is glued
        # without them.
        tags = _launcher_prefix(self.items[i][1])
        for k in range(1, _MAX_JOIN + 1):
            j = i + k
            if not self.follows(j):
                break
            ctx, _ = self.stripped(j)
            nxt = self.items[j][1]
            shared = _launcher_prefix(nxt, within=tags) if tags else ""
            if shared:
                nxt = nxt[len(shared) :]
                ctx, _ = _strip_prefixes(nxt, self.year)
            elif _other_host(ctx.host, self.stripped(i)[0].host):
                break  # another host's line, not a piece of this one
            if ctx.prefixed or not nxt.strip():
                break
            variants = [v + sep + nxt for v in variants for sep in ("", " ")]
            variants = [v for v in variants if len(v) <= 2 * _MAX_CHARS]
            for joined in variants:
                m = regex.search(joined)
                if m is not None:
                    self.take(i + 1, j)
                    return m, joined
        return None, text

    # ---- the pass -----------------------------------------------------------------

    def run(
        self,
        families: tuple[_Family, ...],
        raw_families: tuple[_Family, ...],
        needles: tuple[str, ...],
    ) -> None:
        """Read every line with the families whose needles it holds (``raw_families``
        when it holds none); ``needles`` are all the families' needles."""
        for i, (line_no, raw) in enumerate(self.items):
            if i > 0 and self.items[i - 1][0] + 1 != line_no:
                self.head, self.head_index, self.desync_rank = None, None, None
            if self.consumed[i]:
                continue
            ctx, text = self.stripped(i)
            if ctx.header:
                self.head, self.head_index, self.desync_rank = ctx, i, None
            if self.version is None:
                self._version(text)
            outcomes: set[_Outcome] = set()
            present = {n for n in needles if n in text}
            for family in families if present else raw_families:
                if family.needles and present.isdisjoint(family.needles):
                    continue
                if not family.trigger_re.search(raw if family.on_raw else text):
                    continue
                outcome, text = family.handler(self, i, ctx, text)
                outcomes.add(outcome)
            if _Outcome.PARSED in outcomes:
                self.parsed.add(i)
            elif _Outcome.MALFORMED in outcomes:
                self.malformed.add(i)
            elif self.summary_active:  # host/error_file/[k]:/rules inside a summary
                if self.summary_line(i, ctx, text, implicit=False) is _Outcome.PARSED:
                    self.parsed.add(i)
        self._flush_entry()
        self._resolve_companions()

    def _version(self, text: str) -> None:
        if "version" not in text and "torch==" not in text:
            return
        for regex in _VERSION_RES:
            m = regex.search(text)
            if m is not None:
                self.version = m["v"].rstrip(".,;)-")
                return

    # ---- records ------------------------------------------------------------------

    def line_no(self, i: int) -> int:
        return self.items[i][0]

    def event(self, i: int, ctx: _Ctx, kind: str, **values: object) -> None:
        ev = _Event(
            line_no=self.line_no(i),
            host=ctx.host,
            global_rank=ctx.global_rank,
            rank=ctx.rank(),
            pg=ctx.pg,
            kind=kind,
            ts=ctx.ts,
            ts_source=ctx.ts_source,
        )
        for name, value in values.items():
            setattr(ev, name, value)
        self.events.append(ev)

    def add_timeout(self, row: _Timeout) -> None:
        """Add a watchdog timeout, or fill the row of the same work seen earlier.

        The same work is printed again in ``what():``, in "watchdog thread terminated
        with exception: ..." and in the Python traceback; those lines may lack the PG
        prefix or the ``[rankG]:`` prefix, so a missing value matches any.
        """
        key = (row.host, row.rank, row.seq)
        for old in self._timeout_index.get(key, ()):
            if _compat(old.pg, row.pg) and _compat(old.global_rank, row.global_rank):
                if _compat(old.op, row.op):
                    _fill(old, row)
                    return
        self._timeout_index.setdefault(key, []).append(row)
        self.timeouts.append(row)

    def add_failure(self, row: _Failure) -> None:
        """Add a process failure, or merge it with the same process seen before.

        The agent line (local rank, pid) and the summary entry (rank, local rank, pid)
        describe the same exit: they merge on pid, host and local rank.
        """
        same_pid = self._failures_by_pid.get(row.pid, []) if row.pid is not None else []
        for old in same_pid:
            if (
                _same_host(old.host, row.host)
                and _compat(old.local_rank, row.local_rank)
                and _compat(old.rank, row.rank)
            ):
                old.host = old.host or row.host
                old.rank = _first(old.rank, row.rank)
                old.local_rank = _first(old.local_rank, row.local_rank)
                old.exitcode = _first(old.exitcode, row.exitcode)
                old.signal = old.signal or row.signal
                old.root_cause = old.root_cause or row.root_cause
                if row.source == "summary" and old.source != "summary":
                    # The summary entry is the report of record (JSON first_line).
                    old.source = "summary"
                    old.line_no = row.line_no
                if _TS_RANK[row.ts_source] > _TS_RANK[old.ts_source]:
                    old.ts, old.ts_source = row.ts, row.ts_source
                return
        self.failures.append(row)
        if row.pid is not None:
            self._failures_by_pid.setdefault(row.pid, []).append(row)

    def _resolve_companions(self) -> None:
        """Fill last enqueued/completed from the companion lines; lone TO_AT -> a row."""
        by_ident: dict[tuple[str | None, int | None], list[_Timeout]] = {}
        for row in self.timeouts:
            by_ident.setdefault((row.host, row.rank), []).append(row)
        for comp in self.companions:
            ctx = comp.ctx
            target = self._companion_target(comp, by_ident.get((ctx.host, ctx.rank()), []))
            if target is not None:
                if target.last_completed is None and target.last_enqueued is None:
                    target.last_enqueued, target.last_completed = comp.enqueued, comp.completed
                target.pg = target.pg or ctx.pg
                target.pg_desc = target.pg_desc or ctx.pg_desc
                target.global_rank = _first(target.global_rank, ctx.global_rank)
                continue
            if comp.variant != "timeout_at":
                continue  # an error, not necessarily a timeout: an event only
            row = _Timeout(
                line_no=comp.line_no,
                host=ctx.host,
                global_rank=ctx.global_rank,
                rank=ctx.rank(),
                pg=ctx.pg,
                pg_desc=ctx.pg_desc,
                seq=comp.seq,
                op=None,
                last_enqueued=comp.enqueued,
                last_completed=comp.completed,
                ts=ctx.ts,
                ts_source=ctx.ts_source,
            )
            self.timeouts.append(row)
            by_ident.setdefault((row.host, row.rank), []).append(row)
        self.timeouts.sort(key=lambda r: r.line_no)

    def _companion_target(self, comp: _Companion, rows: list[_Timeout]) -> _Timeout | None:
        ctx = comp.ctx
        fits = [
            r for r in rows if _compat(r.pg, ctx.pg) and _compat(r.global_rank, ctx.global_rank)
        ]
        for row in fits:
            if row.seq == comp.seq:
                return row
        if comp.variant == "timeout_at":
            return None
        # The counters can differ (an observed 2.8 nightly): take the nearest timeout of
        # the same rank and PG that has no companion yet.
        near = [
            r
            for r in fits
            if r.last_completed is None
            and r.last_enqueued is None
            and abs(r.line_no - comp.line_no) <= _COMPANION_REACH
        ]
        return min(near, key=lambda r: abs(r.line_no - comp.line_no), default=None)

    # ---- ChildFailedError summary ------------------------------------------------

    def end_summary(self) -> None:
        if self.summary_active:
            self._flush_entry()
            self.summary_active = False
            self.section_root = False

    def _flush_entry(self) -> None:
        entry, self.entry = self.entry, None
        if entry is None:
            return
        f = entry.fields
        rank_m = _SUM_RANK_RE.match(f.get("rank", ""))
        exit_m = _SUM_EXIT_RE.match(f.get("exitcode", ""))
        if rank_m is None and exit_m is None:
            return
        exitcode = _int(exit_m["code"], 32) if exit_m else None
        text = f.get("traceback", "") + " " + f.get("msg", "")
        sig_m = _SUM_SIGNAL_RE.search(text)
        time_m = _SUM_TIME_RE.search(f.get("time", ""))
        ts = to_dt(time_m["date"], time_m["time"], None) if time_m else None
        host = f.get("host", "").strip()
        self.add_failure(
            _Failure(
                line_no=entry.line_no,
                host=host if host and host != "<N/A>" else entry.host,
                rank=_int(rank_m["rank"], 32) if rank_m else None,
                local_rank=_int(rank_m["lr"], 32) if rank_m else None,
                pid=_int(exit_m["pid"], 32) if exit_m else None,
                exitcode=exitcode,
                signal=sig_m["sig"] if sig_m else _signal_name(exitcode),
                root_cause=entry.root_cause,
                source="summary",
                ts=ts,
                ts_source="logger" if ts is not None else "none",
            )
        )

    def _titled(self, i: int, text: str) -> bool:
        """Is line ``i`` a summary's title (``train.py FAILED``) right under its ``====``
        rule (the line before it in the file, delivered with it)?"""
        if i == 0 or not _SUM_TITLE_RE.match(text):
            return False
        if self.items[i - 1][0] + 1 != self.items[i][0]:
            return False
        _ctx, prev = self.stripped(i - 1)
        return _SUM_TOP_RULE_RE.match(prev) is not None

    def summary_line(self, i: int, ctx: _Ctx, text: str, *, implicit: bool) -> _Outcome:
        """Read one line of a ChildFailedError summary.

        With ``implicit`` a section header or an entry field opens a summary whose head
        was not delivered (a long summary seen through CANDIDATES only).
        """
        if "ChildFailedError:" in text:  # not "raise ChildFailedError(" in the traceback
            self.end_summary()
            self.summary_active = True
            return _Outcome.PARSED
        section = _SUM_SECTION_RE.match(text)
        fld = _SUM_FIELD_RE.match(text) if section is None else None
        if not self.summary_active:
            if implicit and section is None and fld is None and self._titled(i, text):
                # ``====`` / ``train.py FAILED``: the summary's own frame, its head line
                # lost (cut, damaged): the frame opens it, the rule above included.
                self.parsed.add(i - 1)
                self.summary_active = True
                return _Outcome.PARSED
            if not (implicit and (section is not None or fld is not None)):
                return _Outcome.NONE
            self.summary_active = True
        if section is not None:
            self._flush_entry()
            self.section_root = section["root"] is not None
            return _Outcome.PARSED
        if fld is not None:
            key = fld["key"]
            if self.entry is not None and key in self.entry.fields:
                self._flush_entry()  # the next entry, its "[k]:" line not delivered
            if self.entry is None:
                self.entry = _Entry(self.line_no(i), ctx.host, self.section_root)
            self.entry.fields[key] = fld["val"].strip()
            return _Outcome.PARSED
        if _NO_OTHER in text or _SUM_RULE_RE.match(text) or _SUM_TITLE_RE.match(text):
            self._flush_entry()
            return _Outcome.PARSED
        if _SUM_ENTRY_RE.match(text):
            self._flush_entry()
            self.entry = _Entry(self.line_no(i), ctx.host, self.section_root)
            return _Outcome.PARSED
        return _Outcome.NONE


def _fill(old: _Timeout, new: _Timeout) -> None:
    """Complete ``old`` with what ``new`` (a later print of the same work) adds."""
    old.pg = old.pg or new.pg
    old.pg_desc = old.pg_desc or new.pg_desc
    old.global_rank = _first(old.global_rank, new.global_rank)
    old.op = old.op or new.op
    old.numel_in = _first(old.numel_in, new.numel_in)
    old.numel_out = _first(old.numel_out, new.numel_out)
    if old.timeout_s is None:
        old.timeout_s = new.timeout_s
    if old.ran_for_s is None:
        old.ran_for_s = new.ran_for_s
    if old.ts is None and new.ts is not None:
        old.ts, old.ts_source = new.ts, new.ts_source


# --------------------------------------------------------------------------------------
# The registry


@dataclass(frozen=True, slots=True)
class _Family:
    """One message family.

    ``trigger`` (regex syntax common to Python ``re`` and Rust ``regex``) says a line
    begins like the family; it goes into :data:`CANDIDATES`.  ``needles`` are literal
    substrings of every trigger match, checked first because ``in`` is far cheaper than
    a regex.  ``on_raw`` families look at the whole line, not the text after the prefixes.
    """

    name: str
    trigger: str
    needles: tuple[str, ...]
    handler: _Handler
    on_raw: bool = False
    trigger_re: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "trigger_re", re.compile(self.trigger, re.ASCII))
