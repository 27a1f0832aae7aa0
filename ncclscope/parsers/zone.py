"""The zone the logs were written in, from a clock in them that names its own.

NCCL, PyTorch and DeepSpeed print the node's local wall time without a zone.  Many
inputs also carry a clock that says its zone: the arrival stamp a collector writes in
front of every line (``kubectl logs --timestamps`` and ``docker logs -t``: RFC 3339 in
UTC), a journal export (``journalctl -o short-iso``: ``2025-03-14T18:00:09+0900``), or a
logger whose format prints ``%z``.  A zoned stamp and a local one on the same line, or
on lines a few lines apart in one file, were written within seconds of each other; their
difference, rounded to the quarter hour every zone's offset is made of, is the offset
of the clock the local stamps were written in.  Sample line::

    2025-03-14T00:00:09.756044123Z [2025-03-14 09:00:09.456044] node-1:725183:725183 [2] ...

gives +09:00.  Only agreeing evidence teaches anything (``ZoneGuess``): a message that
quotes a time, or two clocks in disagreement, leaves the logs read as UTC, said so.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

from ncclscope.parsers.common import parse_zone, wall_time

__all__ = [
    "ZONED_RE",
    "ZoneGuess",
    "decide",
    "guess_zone",
    "local_stamp",
    "offset_votes",
    "quarter_offset",
    "zoned_stamp",
]

#: A stamp that names its zone (``Z``, ``+09:00``, ``+0900``, one space allowed before
#: it): RFC 3339 from a collector, ``journalctl -o short-iso``, ``%z`` in a logger.
#:
#: Sample: ``2025-03-14T00:00:09.756044123Z``
ZONED_RE = re.compile(
    r"(?P<date>\d{4}-\d\d-\d\d)[T ](?P<time>\d\d:\d\d:\d\d)(?:[.,](?P<frac>\d{1,9}))?"
    r" ?(?P<zone>Z|[+-]\d\d:?\d\d)(?![\d:])"
)
#: A stamp without a zone: NCCL's ``[%F %T.%6f]``, DeepSpeed's and Python logging's
#: ``2025-03-14 09:00:09,239`` (a zone after it makes it a ``ZONED_RE`` stamp).
_LOCAL_RE = re.compile(
    r"(?P<date>\d{4}-\d\d-\d\d)[T ](?P<time>\d\d:\d\d:\d\d)(?:[.,](?P<frac>\d{1,9}))?"
    r"(?! ?(?:Z|[+-]\d\d:?\d\d)(?![\d:]))"
)
#: A zoned stamp is a clock of the line only where it leads it (after a launcher tag at
#: most): one in a message is something the message quotes.
_LEAD_CHARS = 48
#: How far into a line a local stamp is looked for (prefixes, then the stamp).
_LOCAL_CHARS = 160
#: Lines apart within which a zoned stamp and a local one are taken as one moment.
_NEAR_LINES = 8
#: Zones differ from UTC by whole quarter hours (Nepal +05:45, Chatham +12:45), from
#: UTC-12 to UTC+14 (Kiribati).
_QUARTER_S = 900
_ZONES_S = 14 * 3600
#: A pair further than this from a quarter hour is two moments, not one (a collector
#: that lagged, a quiet stretch between two lines).
_SLACK_S = 120.0
#: Evidence needed, and the share of it that must agree.
MIN_VOTES = 3
AGREE = 0.9
#: Of each file, this much of its head and of its tail is read; at most this many files.
_SAMPLE_BYTES = 64 << 10
_MAX_FILES = 64
#: Enough agreeing pairs: no more files are read.
_ENOUGH = 200


def zoned_stamp(text: str) -> tuple[datetime, int] | None:
    """The zoned stamp leading ``text`` as a UTC time, and where it ends.

    >>> zoned_stamp("2025-03-14T00:00:09.756044123Z [2025-03-14 09:00:09.456044] x")
    (datetime.datetime(2025, 3, 14, 0, 0, 9, 756044, tzinfo=datetime.timezone.utc), 30)
    >>> zoned_stamp("[2025-03-14 09:00:09.456044] x") is None
    True
    """
    m = ZONED_RE.search(text, 0, _LEAD_CHARS + 40)
    if m is None or m.start() > _LEAD_CHARS:
        return None
    wall = wall_time(m["date"], m["time"], m["frac"])
    if wall is None:
        return None
    try:
        return wall.replace(tzinfo=parse_zone(m["zone"])).astimezone(UTC), m.end()
    except (ValueError, OverflowError):  # past 18 hours, or a year moved out of range
        return None


def local_stamp(text: str, start: int = 0) -> datetime | None:
    """The first stamp without a zone in ``text`` from ``start``, as printed
    (``wall_time``).

    >>> local_stamp("[rank1]:[2025-03-14 09:00:09.456044] node-1:7:7 [2] NCCL INFO x")
    datetime.datetime(2025, 3, 14, 9, 0, 9, 456044, tzinfo=datetime.timezone.utc)
    """
    m = _LOCAL_RE.search(text, start, start + _LOCAL_CHARS)
    return wall_time(m["date"], m["time"], m["frac"]) if m is not None else None


def quarter_offset(ahead_s: float, *, before_s: float, after_s: float) -> int | None:
    """The zone offset (seconds) a clock ``ahead_s`` ahead of UTC shows: the nearest
    quarter hour within the zones' range, where the rest is at most ``before_s`` behind
    it and ``after_s`` beyond it (how far apart the two readings may be); else None.

    >>> quarter_offset(32399.7, before_s=120, after_s=5)
    32400
    >>> quarter_offset(600, before_s=120, after_s=5) is None  # 10 minutes off any zone
    True
    """
    guess = round(ahead_s / _QUARTER_S) * _QUARTER_S
    if abs(guess) > _ZONES_S or not -before_s <= ahead_s - guess <= after_s:
        return None
    return guess


def _vote(local: datetime, utc: datetime) -> int | None:
    """The offset (seconds) a local stamp (as printed) and a UTC stamp of one moment give;
    None when they are not one moment, or no zone's."""
    ahead = (local - utc).total_seconds()
    return quarter_offset(ahead, before_s=_SLACK_S, after_s=_SLACK_S)


def offset_votes(lines: Sequence[str]) -> Counter[int]:
    """The offsets (seconds, local less UTC) that the clocks of ``lines`` (consecutive
    lines of one file) give, one vote per zoned stamp paired with a local stamp: on its
    own line after it, else on the nearest line within ``_NEAR_LINES``.

    >>> offset_votes(["2025-03-14T00:00:09Z [2025-03-14 09:00:08.9] x"])
    Counter({32400: 1})
    """
    votes: Counter[int] = Counter()
    zoned: list[tuple[int, datetime]] = []
    local: dict[int, datetime] = {}
    for k, text in enumerate(lines):
        z = zoned_stamp(text)
        if z is not None:
            own = local_stamp(text, z[1])
            if own is not None:
                if (v := _vote(own, z[0])) is not None:
                    votes[v] += 1
                continue
            zoned.append((k, z[0]))
        elif (ts := local_stamp(text)) is not None:
            local[k] = ts
    for k, utc in zoned:
        for d in range(1, _NEAR_LINES + 1):
            near = local.get(k - d) or local.get(k + d)
            if near is not None:
                if (v := _vote(near, utc)) is not None:
                    votes[v] += 1
                break
    return votes


@dataclass(frozen=True)
class ZoneGuess:
    """What the logs' own clocks say of the zone their local stamps were written in."""

    #: local less UTC, in seconds; None where nothing agreeing was found
    offset_s: int | None
    #: pairs of stamps that agree with ``offset_s`` (or the largest group, when none)
    agreeing: int
    #: pairs of stamps found in all
    pairs: int

    @property
    def zone(self) -> timezone | None:
        """The learned zone as a fixed offset (UTC for 0)."""
        if self.offset_s is None:
            return None
        return UTC if self.offset_s == 0 else timezone(timedelta(seconds=self.offset_s))

    @property
    def evidence(self) -> str:
        """How the report says where the zone came from, or why none was learned."""
        if self.offset_s is not None:
            return (
                f"learned from {self.agreeing} stamp{'s' if self.agreeing != 1 else ''} "
                "that name their zone (a collector's or a logger's), each beside a local one"
            )
        if self.pairs:
            return (
                f"the logs' {self.pairs} stamps that name a zone do not agree on one "
                f"({self.agreeing} at most)"
            )
        return ""


def decide(votes: Counter[int]) -> ZoneGuess:
    """The offset most votes give, where at least ``MIN_VOTES`` and ``AGREE`` of them do."""
    total = sum(votes.values())
    if not total:
        return ZoneGuess(None, 0, 0)
    offset, top = votes.most_common(1)[0]
    if total >= MIN_VOTES and top >= AGREE * total:
        return ZoneGuess(offset, top, total)
    return ZoneGuess(None, top, total)


def _sample(path: Path) -> Iterable[list[str]]:
    """A file's head and tail, as whole lines (the whole file when small)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(0)
            if size <= 2 * _SAMPLE_BYTES:
                yield fh.read().decode("utf-8", "replace").splitlines()
                return
            yield fh.read(_SAMPLE_BYTES).decode("utf-8", "replace").splitlines()[:-1]
            fh.seek(size - _SAMPLE_BYTES)
            yield fh.read().decode("utf-8", "replace").splitlines()[1:]
    except OSError:
        return


def guess_zone(paths: Sequence[Path]) -> ZoneGuess:
    """The zone the logs in ``paths`` were written in, from their zoned clocks (heads and
    tails of at most ``_MAX_FILES`` files, spread over them)."""
    step = max(1, -(-len(paths) // _MAX_FILES))
    votes: Counter[int] = Counter()
    for path in paths[::step]:
        for lines in _sample(path):
            votes.update(offset_votes(lines))
        if votes and votes.most_common(1)[0][1] >= _ENOUGH:
            break
    return decide(votes)
