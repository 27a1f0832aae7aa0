"""What ``follow.Follower`` hands out: each line with where it came from and when it
arrived, and per file what was read, skipped and recovered."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

__all__ = ["Counters", "FileStats", "FollowStats", "FollowedLine"]


class FollowedLine(NamedTuple):
    """One complete line of a followed file (a named tuple: made by the hundred thousand
    a second, at half a frozen dataclass's cost).

    Attributes:
        path: the file's path as a pattern matched it.
        line_no: the line's number in the file, from 1.  It starts again from 1 with
            each incarnation; a file renamed to another matched path keeps its numbers.
        incarnation: which file ``path`` named when the line was read: 0 for the first,
            one more each time the path names another file (rotation, re-creation, a
            file renamed to it) or its file is truncated.
        text: the line without its ``\\n`` (nor a ``\\r`` just before it), decoded as
            UTF-8 with invalid bytes replaced by U+FFFD.
        arrived: when the poll that read it ran (UTC); the same for every line of a poll.
    """

    path: str
    line_no: int
    incarnation: int
    text: str
    arrived: datetime


@dataclass(frozen=True)
class FileStats:
    """Counters of one followed path, from when it was first followed.

    Attributes:
        lines_read: lines returned (cut giant lines count once), recovered ones included.
        bytes_read: bytes read from the file, including a skipped start read only to
            count its lines, and from its rotated copies.
        rotations: times the path came to name another file (one more for each rotation
            between two polls found beside it).
        truncations: times the file was found truncated or rewritten in place (one more
            for each rotation between two polls found beside it).
        giant_lines: lines longer than ``max_line_bytes``, returned cut.
        lines_recovered: lines read from rotated copies beside the file (``log.1``,
            ``log-20261127.gz``, ...) that were never read from the file itself: after a
            copytruncate, what was written after the last read, and the files of
            rotations that came and went between two polls.
        recovered_from: the rotated copy read last for this path, None if none was.
        unrecovered: truncations after which no rotated copy beside the file held what
            had been read of it (or the copy was cut short: a damaged or truncated
            ``.gz``).  What was written between the last read and the truncation, if
            anything, is lost; how much is not known.  A job that truncates its own log
            when it starts again (``> train.log``) counts here too.
    """

    lines_read: int = 0
    bytes_read: int = 0
    rotations: int = 0
    truncations: int = 0
    giant_lines: int = 0
    lines_recovered: int = 0
    recovered_from: str | None = None
    unrecovered: int = 0


@dataclass(frozen=True)
class FollowStats:
    """The follower's counters, for self-observability (a snapshot).

    Attributes:
        lines_read: lines returned, in all.
        bytes_read: bytes read, in all.
        files_followed: files open now (paths followed, and rotated or deleted files
            still read during ``rotate_wait``).
        rotations: rotations noticed, in all.
        truncations: truncations noticed, in all.
        giant_lines: giant lines cut, in all.
        open_errors: matched paths that could not be opened (tried again next poll).
        files: the counters of each path followed now.  A path no longer followed
            drops out; the totals above keep its counts.
        lines_recovered: lines read from rotated copies, in all (see :class:`FileStats`).
        unrecovered: truncations no rotated copy made up for, in all.
    """

    lines_read: int
    bytes_read: int
    files_followed: int
    rotations: int
    truncations: int
    giant_lines: int
    open_errors: int
    files: Mapping[str, FileStats]
    lines_recovered: int = 0
    unrecovered: int = 0


@dataclass
class Counters:
    lines_read: int = 0
    bytes_read: int = 0
    rotations: int = 0
    truncations: int = 0
    giant_lines: int = 0
    lines_recovered: int = 0
    recovered_from: str | None = None
    unrecovered: int = 0

    def add(self, other: Counters) -> None:
        self.lines_read += other.lines_read
        self.bytes_read += other.bytes_read
        self.rotations += other.rotations
        self.truncations += other.truncations
        self.giant_lines += other.giant_lines
        self.lines_recovered += other.lines_recovered
        self.unrecovered += other.unrecovered

    def snapshot(self) -> FileStats:
        return FileStats(
            self.lines_read,
            self.bytes_read,
            self.rotations,
            self.truncations,
            self.giant_lines,
            self.lines_recovered,
            self.recovered_from,
            self.unrecovered,
        )
