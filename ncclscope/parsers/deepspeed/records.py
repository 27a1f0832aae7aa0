"""The rows, the line record and the value conversions of the DeepSpeed parser.

Rows are tuples in schema order with ``ts`` in epoch microseconds: frames are built from
integers, not ``datetime`` objects (see :func:`_header_us`).
"""

from __future__ import annotations

import enum
import functools
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import polars as pl

from ncclscope.parsers.common import to_dt
from ncclscope.parsers.deepspeed.patterns import _SIZE_UNITS
from ncclscope.parsers.deepspeed.zero import (
    _I64,
    ZeroConfig,
)
from ncclscope.schema import validate

__all__ = [
    "DeepSpeedResult",
]


@dataclass
class DeepSpeedResult:
    """Everything :func:`parse_deepspeed` read from one file."""

    timers: pl.DataFrame
    throughput: pl.DataFrame
    memory: pl.DataFrame
    comms: pl.DataFrame
    zero: ZeroConfig | None
    config: dict[str, str]
    version: str | None
    world_size: int | None
    trace_cache_warnings: int
    year: int | None
    seen: bool
    parsed: int
    malformed: int
    first_malformed: int | None
    #: ``zero.Init``'s count of model elements (parameters), rounded to 10 million as
    #: printed, and the line that printed it
    model_elems: int | None = None
    model_elems_line: int | None = None
    #: the ZeRO optimizer's dtype as its ``Creating`` line names it (``bfloat16``)
    train_dtype: str | None = None
    #: ``(line_no, step)`` each time a line set the current global step (throughput,
    #: progress, pipeline lines): a timer line read elsewhere takes the last one before it
    step_marks: list[tuple[int, int]] = field(default_factory=list)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@functools.lru_cache(maxsize=4096)
def _epoch_seconds(date: str, time: str) -> int | None:
    """Seconds since the epoch of a header's date and time (a log repeats each second)."""
    stamp = to_dt(date, time, None)
    return None if stamp is None else (stamp - _EPOCH) // timedelta(seconds=1)


def _header_us(m: re.Match[str]) -> int | None:
    """The header's time in microseconds since the epoch (polars casts them to ``TS``).

    Frames are built from these integers, not from ``datetime`` objects: ~100x cheaper
    per row, and a timer-heavy log has hundreds of thousands of rows.
    """
    seconds = _epoch_seconds(m["date"], m["time"])
    return None if seconds is None else seconds * 1_000_000 + int(m["ms"]) * 1000


def _finite(text: str | None) -> float | None:
    """A printed float; ``None`` when absent or not finite (``-inf`` before start_step)."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _i64(value: float | None) -> int | None:
    if value is None or not math.isfinite(value):
        return None
    out = round(value)
    return out if -_I64 <= out <= _I64 else None


def _gib(text: str | None) -> int | None:
    """DeepSpeed's ``GB`` (it divides by 1024**3) in bytes."""
    value = _finite(text)
    return _i64(value * 2**30) if value is not None else None


def _size_bytes(text: str) -> int | None:
    """``convert_size`` output in bytes: ``0B`` -> 0, ``4.0 MB`` -> 4194304, ``2.0 KB`` -> 2048."""
    unit = text.lstrip("0123456789. ")
    number = _finite(text[: len(text) - len(unit)].strip())
    power = _SIZE_UNITS.get(unit)
    if number is None or power is None:
        return None
    return _i64(number * 1024**power)


def _rank(text: str | None) -> int | None:
    if text is None:
        return None
    value = int(text)
    return value if 0 <= value < 2**31 else None  # -1: logged before dist init


# --------------------------------------------------------------------------------------
# Outcomes and what one line holds


class _Outcome(enum.Enum):
    """What a family handler made of a line.

    PARSED: the line contributed to a record.  SEEN: a DeepSpeed line, no record (yet).
    MALFORMED: it began like the family but could not be parsed.
    """

    PARSED = "parsed"
    SEEN = "seen"
    MALFORMED = "malformed"


class _Verdict(enum.Enum):
    """What an open block made of a line.

    TAKEN: part of the block.  SKIPPED: not the block's (another process's line), read
    on its own and the block stays open.  ENDED: the block is over; read on its own.
    """

    TAKEN = "taken"
    SKIPPED = "skipped"
    ENDED = "ended"


@dataclass(slots=True)
class _Line:
    """One physical line, read."""

    line_no: int
    text: str  # cleaned
    prefix: str  # launcher tags at the start
    body: str  # text after the launcher tags
    msg: str  # message after the logger header and ``[Rank N]``; the text when no header
    header: bool
    func: str | None
    ts: int | None  # microseconds since the epoch
    rank: int | None

    @property
    def ts_source(self) -> str:
        return "logger" if self.ts is not None else "none"


@dataclass(slots=True)
class _Block:
    """A multi-line record being read: the configuration dump, its JSON, a comms table."""

    kind: str  # config | json | comms
    prefix: str  # the launcher tags of the line that opened it
    start: int
    keep: bool = True  # config: the first dump of the file (later ones are not stored)
    misses: int = 0
    key: str | None = None  # config: the key of a multi-line value being read
    parts: list[str] = field(default_factory=list)
    chars: int = 0
    depth: int = 0
    table: str = "summary"  # comms: summary | straggler
    op: str | None = None
    #: json: a line of the object was damaged (skipped), so its braces may not balance
    damaged: bool = False
    #: json, damaged: the braces balanced once; the object ends at the next other line
    balanced: bool = False


Row = tuple[object, ...]


def _gbps(text: str) -> float | None:
    """The comms logger's Gbps (1e9 bits/s) in bytes per second."""
    value = _finite(text)
    return value * 1e9 / 8 if value is not None else None


def _frame(rows: list[Row], schema: pl.Schema, name: str) -> pl.DataFrame:
    """The frame of ``rows`` (tuples in schema order; ``ts`` in epoch microseconds)."""
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    series = []
    for (col, dtype), values in zip(schema.items(), columns, strict=True):
        if isinstance(dtype, pl.Datetime):
            series.append(pl.Series(col, values, dtype=pl.Int64).cast(dtype))
        else:
            series.append(pl.Series(col, values, dtype=dtype))
    return validate(pl.DataFrame(series), schema, name)


def _ms_to_s(value: float | None) -> float | None:
    return value / 1000 if value is not None else None
