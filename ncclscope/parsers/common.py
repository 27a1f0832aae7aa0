"""What every line parser shares: the timestamp helper and the line-cleaning steps.

Each source cleans its lines with the same steps (ANSI escapes out, the record picked
from a ``\\r``-redrawn progress bar) but its own policy for which ``\\r`` segment holds a
record; the steps live here once, the policy stays with its parser.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime

__all__ = ["ANSI_RE", "last_segment", "strip_ansi", "to_dt"]

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


def to_dt(date: str, time: str, frac: str | None) -> datetime | None:
    """A logged ``YYYY-MM-DD`` date, ``HH:MM:SS`` time and fraction as a UTC datetime.

    Loggers (NCCL, PyTorch, DeepSpeed) print the host's local wall time without a zone:
    it is kept as UTC.  The regexes fixed the digit positions, so ``int()`` on slices
    (~10x faster than ``strptime``) reads them; ``None`` for digits in the right places
    that are not a date (``2024-13-45``).

    >>> to_dt("2025-03-14", "09:05:37", "123456789")
    datetime.datetime(2025, 3, 14, 9, 5, 37, 123456, tzinfo=datetime.timezone.utc)
    """
    micro = int((frac or "0")[:6].ljust(6, "0"))
    try:
        return datetime(
            int(date[0:4]),
            int(date[5:7]),
            int(date[8:10]),
            int(time[0:2]),
            int(time[3:5]),
            int(time[6:8]),
            micro,
            tzinfo=UTC,
        )
    except ValueError:
        return None
