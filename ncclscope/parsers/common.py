"""What every line parser shares: the timestamp helper and the line cleaner.

Each source cleans its lines with the same steps (NULs and ANSI escapes out, an
overlong line cut, the record picked from a ``\\r``-redrawn progress bar) through one
:class:`LineCleaner`; what differs between sources (which ``\\r`` segment holds a record,
which end of an overlong line to keep) is the policy each parser gives it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import polars as pl

from ncclscope.schema import TS

__all__ = [
    "ANSI_RE",
    "LOG_ZONE",
    "LineCleaner",
    "fit_rows",
    "last_segment",
    "local_to_utc",
    "parse_zone",
    "read_as",
    "strip_ansi",
    "to_dt",
    "wall_time",
    "zone_name",
]

#: ANSI escape sequences (colours, cursor moves) that terminals and loggers add; Ray
#: colours its ``(pid=..)`` prefix.
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escapes: ``strip_ansi("\\x1b[32mok\\x1b[0m") == "ok"``."""
    return ANSI_RE.sub("", text) if "\x1b" in text else text


def last_segment(
    text: str,
    keep: Callable[[str], bool] | None = None,
    *,
    limit: int | None = None,
    cap: int | None = None,
) -> str:
    """The ``\\r`` segment of ``text`` that holds the record (tqdm redraws with ``\\r``).

    The last non-blank segment that ``keep`` accepts wins (a bar redrawn *after* the
    record must not hide it), else the last non-blank one, else ``""``.  ``limit``: at
    most this many non-blank segments, from the end, are tried; ``cap``: each segment is
    cut to its first ``cap`` characters before it is tried.

    >>> last_segment(" 7%|##  | 41/596\\r[rank1]:[E ..] x")
    '[rank1]:[E ..] x'
    >>> last_segment("time (ms) | fwd: 80.20\\r 7%|#  | 41/596", lambda s: "time (ms)" in s)
    'time (ms) | fwd: 80.20'
    """
    last = ""
    seen = 0
    for seg in reversed(text.split("\r")):
        if not seg.strip():
            continue
        head = seg if cap is None else seg[:cap]
        if keep is None:
            return head
        if not last:
            last = head
        if keep(head):
            return head
        seen += 1
        if limit is not None and seen >= limit:
            break
    return last


@dataclass(frozen=True)
class LineCleaner:
    """A parser's policy for turning a physical line into the text its grammar reads.

    The steps, in order: NULs out (``drop_nul``); an overlong line cut to its last
    ``tail_chars`` (where the record ends a line: a DeepSpeed record after a runaway
    bar); ANSI escapes out; of ``\\r`` segments, the last non-blank one that ``keep``
    accepts (``last_segment``: at most ``segments`` tried, each cut to ``head_chars``);
    the line cut to its first ``head_chars``; the launcher tag of the physical line
    (``tag``: only the first segment carries it) put back in front; the newline off.

    >>> LineCleaner()("Epoch 1: 42%|####  | 42/100\\rnode1:1:1 [0] NCCL INFO x\\n")
    'node1:1:1 [0] NCCL INFO x'
    >>> LineCleaner(drop_nul=True, head_chars=8)("\\x1b[31mab\\x00cdefghij\\x1b[0m")
    'abcdefgh'
    """

    keep: Callable[[str], bool] | None = None
    segments: int | None = None
    head_chars: int | None = None
    tail_chars: int | None = None
    drop_nul: bool = False
    tag: Callable[[str], str] | None = None

    def __call__(self, text: str) -> str:
        if self.drop_nul and "\x00" in text:
            text = text.replace("\x00", "")
        if self.tail_chars is not None and len(text) > self.tail_chars:
            text = text[-self.tail_chars :]
        if "\x1b" in text:  # tested here: cheaper than the call on the hot path
            text = strip_ansi(text)
        if "\r" in text:
            last = last_segment(text, self.keep, limit=self.segments, cap=self.head_chars)
            if self.tag is not None and last:
                head = self.tag(text)
                last = last if not head or last.startswith(head) else head + last
            text = last
        if self.head_chars is not None and len(text) > self.head_chars:
            text = text[: self.head_chars]
        return text.rstrip("\n")


#: The zone the logs' wall times were written in: NCCL, PyTorch and DeepSpeed print the
#: host's local time without a zone (NCCL: ``strftime`` of ``localtime``; ``TZ=UTC``
#: changes it).  None: read as UTC.  Set for one analysis by ``read_as`` (``build``'s
#: ``log_zone``), so that every parser, row by row or vectorised, reads the same zone.
LOG_ZONE: ContextVar[tzinfo | None] = ContextVar("LOG_ZONE", default=None)
#: NCCL's own stamps are UTC whatever ``LOG_ZONE`` is: the agent wrote each line's
#: arrival there (NCCL before 2.26 prints no time), while PyTorch's and DeepSpeed's
#: stamps on the same window are still the job's local time.
_NCCL_UTC: ContextVar[bool] = ContextVar("_NCCL_UTC", default=False)


def parse_zone(spec: str) -> tzinfo:
    """A zone as the user names it: ``UTC``, an offset (``+09:00``, ``-0500``) or an
    IANA name (``America/New_York``: its daylight saving time is applied per stamp).

    >>> parse_zone("+09:00"), parse_zone("utc")
    (datetime.timezone(datetime.timedelta(seconds=32400)), datetime.timezone.utc)
    """
    text = spec.strip()
    if text.upper() in ("UTC", "Z", "GMT"):
        return UTC
    m = re.fullmatch(r"([+-])(\d\d):?(\d\d)", text)
    if m:
        minutes = int(m[2]) * 60 + int(m[3])
        if minutes > 18 * 60:
            raise ValueError(f"{spec!r}: an offset is at most 18 hours")
        return timezone(timedelta(minutes=minutes if m[1] == "+" else -minutes))
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise ValueError(
            f"{spec!r} is no time zone: give UTC, an offset such as +09:00, or an IANA "
            "name such as America/New_York"
        ) from e


def zone_name(zone: tzinfo | None) -> str:
    """How a report names a zone: ``UTC``, ``+09:00``, ``America/New_York``."""
    if zone is None or zone is UTC:
        return "UTC"
    if isinstance(zone, ZoneInfo):
        return zone.key
    offset = zone.utcoffset(None)
    if offset is None:
        return str(zone)
    minutes = int(offset.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


@contextmanager
def read_as(zone: tzinfo | None, *, nccl_utc: bool = False) -> Iterator[None]:
    """Within the block, the logs' wall times are read in ``zone`` (``LOG_ZONE``);
    NCCL's stamps in UTC where ``nccl_utc`` (the agent's arrival stamps)."""
    token = LOG_ZONE.set(None if zone is UTC else zone)
    nccl = _NCCL_UTC.set(nccl_utc)
    try:
        yield
    finally:
        _NCCL_UTC.reset(nccl)
        LOG_ZONE.reset(token)


def _zone(nccl: bool) -> tzinfo | None:
    return None if nccl and _NCCL_UTC.get() else LOG_ZONE.get()


def local_to_utc(micros: pl.Expr, *, nccl: bool = False) -> pl.Expr:
    """Wall-time microseconds since 1970 as written in the logs (``LOG_ZONE``) -> a UTC
    ``TS`` column: the vectorised parsers' ``to_dt``.  ``nccl``: NCCL's own stamps."""
    zone = _zone(nccl)
    if zone is None:
        return micros.cast(TS)
    if isinstance(zone, ZoneInfo):
        utc = (
            micros.cast(pl.Datetime("us"))
            # a wall time that occurs twice (the hour DST ends) is read as the first;
            # one that never occurs (the hour it starts) is no time
            .dt.replace_time_zone(zone.key, ambiguous="earliest", non_existent="null")
            .dt.epoch("us")
        )
    else:
        offset = zone.utcoffset(None)
        utc = micros - (int(offset.total_seconds() * 1_000_000) if offset is not None else 0)
    # A damaged stamp at datetime's edge, moved past it, is no time (as in to_dt): a
    # year 0 would fail wherever the column meets Python.
    return pl.when(utc.is_between(_FIRST_US, _LAST_US)).then(utc).cast(TS)


#: datetime's range, 0001-01-01 to 9999-12-31 23:59:59.999999, in microseconds since 1970
_FIRST_US = -62_135_596_800_000_000
_LAST_US = 253_402_300_799_999_999


def wall_time(date: str, time: str, frac: str | None) -> datetime | None:
    """A logged ``YYYY-MM-DD`` date, ``HH:MM:SS`` time and fraction as printed, whatever
    zone it was printed in (``tzinfo`` UTC: compared with other stamps as printed).  The
    regexes fixed the digit positions, so ``int()`` on slices (~10x faster than
    ``strptime``) reads them; ``None`` for digits in the right places that are not a
    date (``2024-13-45``).

    >>> wall_time("2025-03-14", "09:05:37", "123456789")
    datetime.datetime(2025, 3, 14, 9, 5, 37, 123456, tzinfo=datetime.timezone.utc)
    """
    try:
        return datetime(
            int(date[0:4]), int(date[5:7]), int(date[8:10]),
            int(time[0:2]), int(time[3:5]), int(time[6:8]),
            int((frac or "0")[:6].ljust(6, "0")),
            tzinfo=UTC,
        )  # fmt: skip
    except ValueError:
        return None


def to_dt(date: str, time: str, frac: str | None, *, nccl: bool = False) -> datetime | None:
    """A logged ``YYYY-MM-DD`` date, ``HH:MM:SS`` time and fraction as a UTC datetime.

    Loggers (NCCL, PyTorch, DeepSpeed) print the host's local wall time without a zone:
    it is read (``wall_time``) in ``LOG_ZONE`` (UTC unless an analysis says otherwise).
    ``nccl``: NCCL's own stamp (UTC where the agent wrote it).

    >>> to_dt("2025-03-14", "09:05:37", "123456789")
    datetime.datetime(2025, 3, 14, 9, 5, 37, 123456, tzinfo=datetime.timezone.utc)
    >>> with read_as(parse_zone("+09:00")):
    ...     to_dt("2025-03-14", "09:05:37", None)
    datetime.datetime(2025, 3, 14, 0, 5, 37, tzinfo=datetime.timezone.utc)
    """
    stamp = wall_time(date, time, frac)
    zone = _zone(nccl)
    if stamp is None or zone is None:
        return stamp
    try:
        return stamp.replace(tzinfo=zone).astimezone(UTC)
    except OverflowError:  # year 1 or 9999 moved past datetime's range: a damaged stamp
        return None


def _int_bounds(dtype: Any) -> tuple[int, int] | None:
    """The range of an integer column's dtype, None for other dtypes."""
    if not dtype.is_integer():
        return None
    bits = {
        pl.Int8: 8, pl.Int16: 16, pl.Int32: 32, pl.Int64: 64,
        pl.UInt8: 8, pl.UInt16: 16, pl.UInt32: 32, pl.UInt64: 64,
    }.get(dtype.base_type())  # fmt: skip
    if bits is None:
        return None
    if dtype.is_unsigned_integer():
        return 0, 2**bits - 1
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def fit_rows(
    rows: list[tuple[Any, ...]], schema: Mapping[str, Any]
) -> tuple[list[tuple[Any, ...]], int]:
    """``rows`` (tuples in ``schema``'s column order) with every int past its integer
    column's range set to None (a damaged number, not data), and how many were: a
    row-oriented frame built from them then never fails on one number."""
    bounds = [(k, b) for k, dtype in enumerate(schema.values()) if (b := _int_bounds(dtype))]
    bad = 0
    out = rows
    for r, row in enumerate(rows):
        fixed = None
        for k, (lo, hi) in bounds:
            v = row[k]
            if type(v) is int and not lo <= v <= hi:
                fixed = fixed or list(row)
                fixed[k] = None
                bad += 1
        if fixed is not None:
            if out is rows:
                out = list(rows)
            out[r] = tuple(fixed)
    return out, bad
