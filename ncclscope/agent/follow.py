"""Follow a training job's log files live, as ``tail -F`` does, for the agent to poll.

The agent calls :meth:`Follower.poll` on its own schedule; there is no thread here.  A
poll expands the patterns again (a file that appears later is picked up), notices
rotation, truncation and deletion, reads what was appended since the last poll (at most
``max_bytes_per_poll`` bytes, in chunks, never a whole file at once) and returns the
complete lines, each stamped with the time of the poll (``ts_source = "stamped"``,
DESIGN §4).

Lines are what the post-mortem reader (``sources`` and the polars scans) makes of the
same bytes, so a line followed live and the same line read by ``analyze`` agree:

* a line ends at ``\\n``; one ``\\r`` before it is dropped, any other ``\\r`` stays
  (tqdm bars);
* invalid UTF-8 is decoded with U+FFFD replacement and the line is kept;
* binary files are read like text (the parsers classify the lines);
* ``line_no`` is the line's number in the file, so ``{path, line_no}`` points into the
  user's log even when following started at the end of an existing file (the skipped
  part is read once, in budgeted chunks, to count its lines).

And for the live case:

* A line without its newline (the writer is mid-line) is held until the newline comes,
  however long that takes; :meth:`Follower.flush` hands it over (at shutdown).
* A line longer than ``max_line_bytes`` is cut: its first ``max_line_bytes`` (at most;
  the cut falls on a UTF-8 character boundary) are returned and the rest is skipped as
  it is read, never buffered.
* Rotation (the path names another file now): the old file is read to its end first;
  it stays open for ``rotate_wait`` seconds, because a writer keeps writing to it until
  it reopens the path.  Its descriptor is held, so a file renamed, compressed and
  removed at once (``compress`` without ``delaycompress``) is read to its end all the
  same.  The new file is read from its start as a new *incarnation* (line numbers
  restart).  When the old file appears under another matched name (``log`` renamed to
  ``log.1`` and the pattern matches both), it is followed on under that name, not read
  again.
* Truncation (copytruncate): the file is shorter than what was read, or its first bytes
  or the bytes just before the read position changed (checked when it grew or was
  written since).  What
  was written to it after the last read is in logrotate's copy: the follower looks
  beside the file for a *rotated copy* (below) that starts with the file's first 256
  bytes, has the 32 bytes the file had before the read position, and is not older than
  the file was at the last poll; it reads the copy from the read position to its end,
  as the old incarnation (numbers going on, under the file's path), then the file from
  its start as a new incarnation.  ``FileStats`` says which copy was read
  (``recovered_from``) and how many lines came from copies (``lines_recovered``); when
  no copy holds what was read (a job that truncated its own log, a copy in logrotate's
  ``olddir``), the lines written since the last read, if any, are lost and the
  truncation is counted in ``unrecovered``.  Lines the job wrote between logrotate's
  copy and its truncate are in neither file: logrotate loses them, no reader gets them.
  A file truncated and rewritten past the old position with the same first and last
  bytes cannot be told from one that grew; ``tail -F`` has this blind spot with any
  first bytes.
* Rotated more than once between two polls: the files in between were never opened.
  They are looked for beside the path as rotated copies written after the last one
  read (by modification time, which logrotate's renames and gzip keep) that do not
  start like a file read already (a ``.gz`` beside its plain copy, or one compressed
  later), and read whole, oldest first, each as an incarnation of the path, before the
  new file.  A file deleted before any poll saw it is gone for every reader.
* Rotated copies are the regular files beside the path named as logrotate and Python's
  rotating handlers name rotations: the name, then ``.1``, ``-20261127``,
  ``-20261127-1732712345``, ``.2026-11-27`` (``dateext``, ``dateformat``), then maybe
  ``.gz``; plain ones are tried first, newest first (at most the 32 newest).  A ``.gz``
  is read through zlib, a cut one as far as it decompresses (the rest counted in
  ``unrecovered``).  Not found: copies elsewhere (``olddir``), the date before the
  extension (``extension .log``), other compressions (``.xz``, ``.zst``).  A copy the
  patterns match too (a directory, ``log*``) that appears while its log is followed is
  held, not read from its start: its lines are the log's, so once the log is
  truncated (or after ``rotate_wait``, when it agrees with the log) it is followed from
  its end.
* Deletion: the file is read to its end and dropped after ``rotate_wait``; a file that
  appears at the same path later is a new file, read from its start.

The work on rotated copies (listing the directory, opening candidates) is done only when
a rotation or truncation is noticed, or when a file empty at the last poll changed;
reading lines costs what it did.

Open files are identified by (device, inode), as the kernel does; a file that two
matched paths name (a hard link, a symlink) is followed once.  Each followed file holds
one file descriptor.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import stat
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from ncclscope.agent.followed import Counters, FileStats, FollowedLine, FollowStats
from ncclscope.agent.rotated import (
    HEAD,
    OLD_HEADS,
    Candidate,
    Gunzip,
    close_copy,
    is_rotation,
    open_copy,
    rotated_copies,
    seen,
)
from ncclscope.sources import _NOT_LOGS  # the suffixes a directory walk skips in analyze

__all__ = ["FileStats", "FollowStats", "FollowedLine", "Follower"]

_log = logging.getLogger(__name__)

#: Bytes read per system call.
_CHUNK = 1 << 20
#: Bytes before the read position remembered to notice a file rewritten in place.
_TAIL = 32
#: Rotated logs compressed by logrotate: never live, and their lines were followed before.
_COMPRESSED = frozenset({".gz", ".xz", ".bz2", ".zst", ".lz4", ".z"})


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(eq=False)
class _File:
    """One open file and where reading it stands."""

    path: str
    incarnation: int
    fd: int
    key: tuple[int, int]  # (st_dev, st_ino)
    offset: int = 0  # next byte to read
    line_no: int = 0  # number of the last line returned (or counted)
    pending: bytes = b""  # the line being written, without its newline yet
    skipping: bool = False  # inside a giant line whose head was returned
    tail: bytes = b""  # the last bytes before ``offset``
    count_to: int = 0  # > offset: bytes up to here are counted, not returned
    counted_nl: int = 0  # while counting: the position after the last newline seen
    retired_at: datetime | None = None  # when its path stopped naming it
    head: bytes = b""  # its first bytes (up to HEAD), to recognise its rotated copy
    mtime_ns: int = 0  # its modification time at the last poll ...
    prev_mtime_ns: int = 0  # ... and at the one before
    # A rotated copy read for ``path`` (``source`` is the copy's own path); a compressed
    # one is read through ``stream`` (``fd`` is then -1).  ``final``: nobody writes to
    # it, so it is closed as soon as it is read to its end.
    source: str | None = None
    stream: Gunzip | None = None
    final: bool = False
    # Held, not read: it looks like a rotated copy of this followed file, made just now
    # (copytruncate), whose lines come from that file; see Follower._unhold.
    copy_of: _File | None = None
    held_at: datetime | None = None


#: A run of one file's lines read in one poll: path, the first's number, incarnation,
#: the texts, the poll's time (``FollowedLine``'s fields, the texts kept together).
Batch = tuple[str, int, int, list[str], datetime]


@dataclass
class _Poll:
    """What one poll is doing: its time, its remaining byte budget, its lines."""

    now: datetime
    budget: int
    out: list[Batch] = field(default_factory=list)

    def lines(self) -> list[FollowedLine]:
        return [
            FollowedLine(path, first + i, incarnation, text, arrived)
            for path, first, incarnation, texts, arrived in self.out
            for i, text in enumerate(texts)
        ]


class Follower:
    """Follows log files named by paths, directories and globs; poll it for new lines.

    Args:
        patterns: files, directories (their direct regular files) and globs (quoted, so
            they are expanded on every poll).  A file named here that does not exist yet
            is followed once it appears.  Globs and directories leave out compressed
            files (rotated logs); directories also leave out hidden files and what
            ``analyze`` never reads in a directory (``.json``, ``.parquet``, ...).
        from_start: read files that exist at the first poll from their start; by default
            following starts at their end, as ``tail -F`` does (at the start of a line
            still being written, so it is returned whole).  Files that appear later are
            always read from their start.
        max_line_bytes: longer lines are returned cut to this many bytes.
        max_bytes_per_poll: bytes one poll reads at most, over all files; the rest is
            read by the next polls.
        rotate_wait: seconds a rotated or deleted file is still read after its path
            stopped naming it, and a fresh copy of a followed file (matched too) is held
            at most while its log is not truncated.
        clock: the time lines are stamped with; must return aware datetimes.

    Example:
        >>> import pathlib, tempfile
        >>> log = pathlib.Path(tempfile.mkdtemp()) / "rank0.log"
        >>> _ = log.write_text("old line\\n")
        >>> follower = Follower([str(log)])
        >>> follower.poll()
        []
        >>> with log.open("a") as fh:
        ...     _ = fh.write("node-1:4242:4242 [0] NCCL INFO Init COMPLETE\\nhalf a li")
        >>> [(x.line_no, x.text) for x in follower.poll()]
        [(2, 'node-1:4242:4242 [0] NCCL INFO Init COMPLETE')]
        >>> [(x.line_no, x.text) for x in follower.close()]
        [(3, 'half a li')]
    """

    def __init__(
        self,
        patterns: Sequence[str],
        *,
        from_start: bool = False,
        max_line_bytes: int = 1 << 20,
        max_bytes_per_poll: int = 64 << 20,
        rotate_wait: float = 5.0,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        if isinstance(patterns, str):
            raise TypeError("patterns is a sequence of strings, not one string")
        if max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be at least 1, not {max_line_bytes}")
        if max_bytes_per_poll < 1:
            raise ValueError(f"max_bytes_per_poll must be at least 1, not {max_bytes_per_poll}")
        if rotate_wait < 0:
            raise ValueError(f"rotate_wait must not be negative, not {rotate_wait}")
        self._patterns = tuple(patterns)
        self._from_start = from_start
        self._max_line = max_line_bytes
        self._max_poll = max_bytes_per_poll
        self._rotate_wait = timedelta(seconds=rotate_wait)
        self._clock = clock
        self._polled = False
        self._closed = False
        self._turn = 0  # which current file reads first (so none starves on a small budget)
        self._current: dict[str, _File] = {}  # path -> the file it names now
        self._retiring: list[_File] = []  # files their path no longer names, still read
        self._incarnations: dict[str, int] = {}  # path -> its last incarnation
        self._counters: dict[str, Counters] = {}
        self._total = Counters()
        self._open_errors = 0
        self._old_heads: dict[str, deque[bytes]] = {}  # path -> heads of its past files

    # -- the public calls ---------------------------------------------------------------

    def poll(self) -> list[FollowedLine]:
        """Read what the files gained since the last poll; the complete lines, in file order.

        Lines of one file are in order; files interleave in no particular order.  Never
        blocks on a file and reads at most ``max_bytes_per_poll`` bytes.
        """
        return self._poll().lines()

    def poll_texts(self) -> list[tuple[str, list[str], datetime]]:
        """``poll``'s lines as runs of one file's texts: (path, texts, the poll's time).
        The agent's hot path: no object per line."""
        return [(path, texts, arrived) for path, _n, _inc, texts, arrived in self._poll().out]

    def _poll(self) -> _Poll:
        if self._closed:
            raise ValueError("poll() on a closed Follower")
        run = _Poll(self._now(), self._max_poll)
        self._reconcile(self._match(), run.now)
        self._polled = True
        # Rotated files first: a new file is read only once the old one is read to its
        # end (short of that, the budget is spent).
        for old in list(self._retiring):
            if self._read(old, run) and self._expired(old, run.now):
                self._retire(old, run)
        files = list(self._current.values())
        if files:
            start = self._turn % len(files)
            self._turn += 1
            for f in files[start:] + files[:start]:
                self._check_truncation(f, run)
                self._read(f, run)
        self._prune_counters()
        return run

    def flush(self) -> list[FollowedLine]:
        """The lines being written (held for their newline), returned as they are now.

        Reads nothing new: what was written since the last poll waits for the next one.

        For shutdown.  Should a line's rest arrive after all, a later poll returns it as
        a line with the same ``line_no``, so numbers stay those of the file.
        """
        run = _Poll(self._now(), 0)
        for f in [*self._retiring, *self._current.values()]:
            self._flush_file(f, run, last=False)
        return run.lines()

    def close(self) -> list[FollowedLine]:
        """Stop following: :meth:`flush`, then close every file.  Idempotent.

        Like :meth:`flush` it reads nothing: poll first for what was written since.
        """
        if self._closed:
            return []
        out = self.flush()
        for f in [*self._retiring, *self._current.values()]:
            _close(f)
        self._retiring.clear()
        self._current.clear()
        self._prune_counters()
        self._closed = True
        return out

    @property
    def stats(self) -> FollowStats:
        """A snapshot of the counters."""
        t = self._total
        return FollowStats(
            lines_read=t.lines_read,
            bytes_read=t.bytes_read,
            files_followed=len(self._current) + len(self._retiring),
            rotations=t.rotations,
            truncations=t.truncations,
            giant_lines=t.giant_lines,
            open_errors=self._open_errors,
            files={path: c.snapshot() for path, c in self._counters.items()},
            lines_recovered=t.lines_recovered,
            unrecovered=t.unrecovered,
        )

    # -- which files --------------------------------------------------------------------

    def _now(self) -> datetime:
        now = self._clock()
        if now.tzinfo is None:
            raise ValueError("the clock returned a naive datetime; it must return UTC")
        return now.astimezone(UTC)

    def _match(self) -> dict[str, os.stat_result]:
        """The regular files the patterns name now, each with its ``stat``, in order."""
        found: dict[str, os.stat_result] = {}
        for pattern in self._patterns:
            for path in _expand(pattern):
                if path in found:
                    continue
                try:
                    st = os.stat(path)
                except OSError:
                    continue  # gone since the listing, or unreadable: next poll
                if stat.S_ISREG(st.st_mode):
                    found[path] = st
        return found

    def _reconcile(self, matched: dict[str, os.stat_result], now: datetime) -> None:
        """Bring the open files in line with what the paths name now."""
        moved: dict[tuple[int, int], _File] = {}  # files their path no longer names
        for path, f in list(self._current.items()):
            st = matched.get(path)
            if st is None or (st.st_dev, st.st_ino) != f.key:
                del self._current[path]
                moved[f.key] = f
        vacated = {f.path: f for f in moved.values()}
        followed = {f.key for f in self._current.values()}
        retiring = {f.key: f for f in self._retiring if f.source is None}
        # Files a rotation in between must not be taken for: read already, or read
        # under a name of their own.
        taken = followed | moved.keys() | {f.key for f in self._retiring}
        taken.update((st.st_dev, st.st_ino) for st in matched.values())
        between: list[_File] = []
        for path, st in matched.items():
            if path in self._current:
                continue
            key = (st.st_dev, st.st_ino)
            if key in followed:
                continue  # another matched path names this file: followed once
            prev = vacated.get(path)
            if prev is not None:
                self._count(path).rotations += 1
                self._total.rotations += 1
            old = moved.pop(key, None) or retiring.pop(key, None)
            if old is not None:
                # Renamed (``log`` -> ``log.1``) to a path the patterns match: go on
                # reading it there, after what was read of it.
                if old.retired_at is not None:
                    self._retiring.remove(old)
                    old.retired_at = None
                old.path, old.incarnation = path, self._next_incarnation(path)
                self._current[path] = old
            else:
                if prev is None and self._polled:
                    # Its file was deleted or renamed at an earlier poll (still read).
                    prev = next(
                        (r for r in self._retiring if r.path == path and r.source is None),
                        None,
                    )
                if prev is not None:
                    # Rotated more than once since the last poll: the files in between
                    # come before the new one (their incarnations too).
                    between += self._rotations_between(path, prev, taken, now)
                new = self._open(path, key, start_at_end=not self._polled and not self._from_start)
                if new is None:
                    continue
                if self._polled:
                    new.copy_of = self._original_of(path, new)
                    new.held_at = now if new.copy_of is not None else None
                self._current[path] = new
            followed.add(key)
        for f in moved.values():
            f.retired_at = now
            self._retiring.append(f)
        self._retiring += between

    def _rotations_between(
        self, path: str, prev: _File, taken: set[tuple[int, int]], now: datetime
    ) -> list[_File]:
        """The files ``path`` named between ``prev`` and the one it names now, found
        renamed beside it (``log.1``, or ``log.1.gz`` when compressed at once): written
        after ``prev``'s last write.  (``prev`` may be followed on under another name.)"""
        try:
            since = os.fstat(prev.fd).st_mtime_ns
            head = os.pread(prev.fd, HEAD, 0)  # more than was read of it, maybe
        except OSError:
            return []
        self._remember_head(path, head)
        return self._newer_copies(path, since, taken, now, copies=False)

    def _open(self, path: str, key: tuple[int, int], *, start_at_end: bool) -> _File | None:
        try:
            # O_NONBLOCK: a path swapped for a FIFO since the stat must not block the poll.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            self._open_errors += 1
            return None
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            self._open_errors += 1
            return None
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None
        f = _File(path, self._next_incarnation(path), fd, (st.st_dev, st.st_ino))
        f.mtime_ns = f.prev_mtime_ns = st.st_mtime_ns
        if start_at_end:
            f.count_to = st.st_size
        self._count(path)
        return f

    def _next_incarnation(self, path: str) -> int:
        n = self._incarnations.get(path, -1) + 1
        self._incarnations[path] = n
        return n

    def _expired(self, f: _File, now: datetime) -> bool:
        if f.final:
            return True
        if f.retired_at is None:
            return False
        # A clock that went back would otherwise keep the file open for as long.
        return now - f.retired_at >= self._rotate_wait or now < f.retired_at

    def _retire(self, f: _File, run: _Poll) -> None:
        """Close a rotated or deleted file read to its end; its last line is complete."""
        self._flush_file(f, run, last=True)
        _close(f)
        self._retiring.remove(f)
        if f.stream is not None and f.stream.problem is not None:
            _log.warning(
                "%s is %s after %d bytes: the rest of what %s held is lost",
                f.source,
                f.stream.problem,
                f.stream.pos,
                f.path,
            )
            self._count(f.path).unrecovered += 1
            self._total.unrecovered += 1

    def _count(self, path: str) -> Counters:
        c = self._counters.get(path)
        if c is None:
            c = self._counters[path] = Counters()
        return c

    def _prune_counters(self) -> None:
        live = set(self._current) | {f.path for f in self._retiring}
        for path in [p for p in self._counters if p not in live]:
            del self._counters[path]
        for path in [p for p in self._old_heads if p not in live]:
            del self._old_heads[path]

    # -- rotated copies -----------------------------------------------------------------

    def _truncated(self, f: _File, run: _Poll, seen_ns: int, before_ns: int) -> None:
        """``f`` was truncated (copytruncate) or rewritten in place: read what was written
        to it after the last read from its rotated copy, then the copies of the
        rotations since (rotated more than once between two polls), then ``f`` again
        from its start, as a new incarnation.

        ``seen_ns`` and ``before_ns``: ``f``'s modification time at the last poll and at
        the one before, which its copy cannot be older than.
        """
        counters = self._count(f.path)
        counters.truncations += 1
        self._total.truncations += 1
        link, copy = self._find_copy(f, seen_ns, before_ns, run.now)
        queue = [] if link is None else [link]
        if link is not None:  # it takes over what was held: its end ends the old content
            counters.recovered_from = link.source
            _log.info(
                "%s was truncated after %d bytes were read: reading the rest from its "
                "rotated copy %s",
                f.path,
                f.offset,
                link.source,
            )
        else:
            self._flush_file(f, run, last=True)  # what was held ends the old content
            if copy is not None:
                _log.info(
                    "%s was truncated; its rotated copy %s ends before byte %d, read from "
                    "the file itself already: nothing is missing",
                    f.path,
                    copy.path,
                    f.offset,
                )
            elif f.offset or f.count_to:
                counters.unrecovered += 1
                self._total.unrecovered += 1
                _log.info(
                    "%s was truncated after %d bytes were read and no rotated copy beside "
                    "it holds them: what was written to it since the last read, if "
                    "anything, is lost",
                    f.path,
                    f.offset,
                )
        self._remember_head(f.path, f.head)
        if copy is not None:
            taken = {x.key for x in (*self._current.values(), *self._retiring)}
            taken.add(copy.key)
            queue += self._newer_copies(f.path, copy.mtime_ns, taken, run.now, copies=True)
        for held in [*self._current.values(), *self._retiring]:
            if held.copy_of is f:
                # A copy of f matched by the patterns: its lines came from f (and from
                # the copy read above), so it is followed from its end.
                held.copy_of = held.held_at = None
                try:
                    held.count_to = os.fstat(held.fd).st_size
                except OSError:
                    pass
        f.incarnation = self._next_incarnation(f.path)
        f.offset = f.line_no = f.count_to = f.counted_nl = 0
        f.pending, f.tail, f.head = b"", b"", b""
        f.skipping = False
        self._read_first(queue, run)
        # Rotated again while the copies were read (a copy of hundreds of MB, rotations
        # a second apart): what the log had in between is in a newer copy.
        self._filled(f, run, f.mtime_ns)

    def _filled(self, f: _File, run: _Poll, seen_ns: int) -> None:
        """``f`` was empty at the last poll and changed since: the copies of rotations
        made since, if any, hold what it had in between and come first (the first one
        takes the incarnation ``f`` had, as nothing was read of it)."""
        if f.copy_of is not None:
            return  # a held copy being written
        taken = {x.key for x in (*self._current.values(), *self._retiring)}
        self._incarnations[f.path] = f.incarnation - 1
        queue = self._newer_copies(f.path, seen_ns, taken, run.now, copies=True)
        f.incarnation = self._next_incarnation(f.path)
        self._read_first(queue, run)

    def _read_first(self, queue: list[_File], run: _Poll) -> None:
        """Rotated copies to read before the file they were copies of: read now, and
        by the next polls first if the budget runs out (so the order holds)."""
        self._retiring += queue
        for x in queue:
            if self._read(x, run) and x.final:
                self._retire(x, run)

    def _find_copy(
        self, f: _File, seen_ns: int, before_ns: int, now: datetime
    ) -> tuple[_File | None, Candidate | None]:
        """The rotated copy of the content ``f`` had: as a file to read on from where
        ``f`` was read to (None when the copy ends before that, read from ``f``
        already), and the copy.

        A copy starts with ``f``'s head, holds the bytes before the read position that
        ``f`` held, and is not older than ``f`` was at the last poll (at the one before
        when it ends before the read position: copied before the last poll, truncated
        after it).  Plain copies come first (a ``.gz`` may still be being written beside
        its plain copy), newest first.
        """
        if not f.head:
            return None, None  # nothing was read to recognise it by
        taken = {x.key for x in (*self._current.values(), *self._retiring) if x.copy_of is None}
        short: Candidate | None = None
        for c in rotated_copies(f.path):
            if c.key in taken or c.mtime_ns < before_ns:
                continue
            opened = open_copy(c)
            if opened is None:
                continue
            fd, stream = opened
            try:
                verdict = _verdict(f, fd, stream)
            except OSError:
                verdict = None
            if verdict == "whole" and c.mtime_ns >= seen_ns:
                link = dataclasses.replace(
                    f,
                    fd=fd,
                    key=c.key,
                    source=c.path,
                    stream=stream,
                    final=True,
                    retired_at=now,
                    copy_of=None,
                    held_at=None,
                )
                return link, c
            close_copy(fd, stream)
            if verdict == "short" and short is None:
                short = c
        return None, short

    def _newer_copies(
        self,
        path: str,
        since_ns: int,
        taken: set[tuple[int, int]],
        now: datetime,
        *,
        copies: bool,
    ) -> list[_File]:
        """Rotated copies of ``path`` modified at ``since_ns`` or later that were never
        read: the files of rotations between two polls, oldest first, each a new
        incarnation of ``path`` read whole.

        A file that starts like one of ``path``'s past files is a copy of it (a ``.gz``
        beside its plain copy, or one compressed later) and is left out.  ``copies``:
        these are copies nobody writes to (copytruncate); otherwise renamed files, which
        the job may still be writing (a ``.gz`` is always finished).
        """
        old = self._old_heads.get(path, ())
        found: dict[bytes, tuple[Candidate, int, Gunzip | None]] = {}
        for c in rotated_copies(path):
            if c.mtime_ns < since_ns or c.key in taken:
                continue
            opened = open_copy(c)
            if opened is None:
                continue
            fd, stream = opened
            try:
                head = os.pread(fd, HEAD, 0) if stream is None else stream.read(HEAD)
            except OSError:
                head = b""
            if not head or seen(head, old) or seen(head, found):
                close_copy(fd, stream)
                continue
            found[head] = (c, fd, stream)
        out: list[_File] = []
        counters = self._count(path)
        for head, (c, fd, stream) in sorted(
            found.items(), key=lambda item: (item[1][0].mtime_ns, item[1][0].path)
        ):
            x = _File(path, self._next_incarnation(path), fd, c.key, head=head)
            x.source, x.stream, x.final, x.retired_at = c.path, stream, copies or bool(stream), now
            out.append(x)
            self._remember_head(path, head)
            counters.recovered_from = c.path
            if copies:
                counters.truncations += 1
                self._total.truncations += 1
            else:
                counters.rotations += 1
                self._total.rotations += 1
            _log.info(
                "%s was rotated more than once between two polls: reading %s, the file it "
                "named in between, whole (incarnation %d)",
                path,
                c.path,
                x.incarnation,
            )
        return out

    def _remember_head(self, path: str, head: bytes) -> None:
        if not head:
            return
        heads = self._old_heads.get(path)
        if heads is None:
            heads = self._old_heads[path] = deque(maxlen=OLD_HEADS)
        if head not in heads:
            heads.append(head)

    def _original_of(self, path: str, new: _File) -> _File | None:
        """The followed file a file that just appeared looks like a fresh copy of: named
        as one of its rotations, beside it, and starting with the bytes it started with
        (a copy still being written may have only some of them yet)."""
        folder, name = os.path.split(path)
        for f in self._current.values():
            if not f.head or f.copy_of is not None:
                continue
            f_folder, f_name = os.path.split(f.path)
            if f_folder != folder or not is_rotation(name, f_name):
                continue
            try:
                start = os.pread(new.fd, len(f.head), 0)
            except OSError:
                return None
            if f.head.startswith(start):
                return f
        return None

    def _unhold(self, f: _File, now: datetime) -> bool:
        """Whether a held file is to be read now: once ``rotate_wait`` passed without
        its original being truncated (which releases it at once, see
        :meth:`_truncated`).  A copy of the original that agrees with it (logrotate's
        ``copy``, a ``cp``) is then followed from its end, its lines having been read
        from the original; anything else from its start, as any new file."""
        held_at = f.held_at
        if held_at is not None and held_at <= now < held_at + self._rotate_wait:
            return False
        orig = f.copy_of
        f.copy_of = f.held_at = None
        if orig is None or not any(x is orig for x in (*self._current.values(), *self._retiring)):
            return True  # its original is closed: nothing to compare with
        try:
            size = os.fstat(f.fd).st_size
            n, m = min(HEAD, size), min(_TAIL, size)
            same = (
                os.fstat(orig.fd).st_size >= size
                and os.pread(f.fd, n, 0) == os.pread(orig.fd, n, 0)
                and os.pread(f.fd, m, size - m) == os.pread(orig.fd, m, size - m)
            )
        except OSError:
            return True
        if same:
            f.count_to = size
        return True

    # -- reading ------------------------------------------------------------------------

    def _check_truncation(self, f: _File, run: _Poll) -> None:
        """Start the file again if it was truncated or rewritten in place."""
        try:
            st = os.fstat(f.fd)
            size = st.st_size
            # Grown, or written to the same size: truncated and rewritten as far?  The
            # bytes before the read position alone do not tell when the lines end alike
            # and are as long (an NCCL log's often are); the first bytes do.
            grown = size > f.offset or (size == f.offset and st.st_mtime_ns != f.mtime_ns)
            rewritten = size < max(f.offset, f.count_to) or (
                grown
                and (_changed(f.fd, f.tail, f.offset - len(f.tail)) or _changed(f.fd, f.head, 0))
            )
        except OSError:
            return
        seen_ns, before_ns = f.mtime_ns, f.prev_mtime_ns
        f.prev_mtime_ns, f.mtime_ns = seen_ns, st.st_mtime_ns
        if rewritten:
            self._truncated(f, run, seen_ns, before_ns)
        elif not f.offset and not f.count_to and st.st_mtime_ns != seen_ns:
            # Empty at the last poll (nothing to compare), changed since: it may have
            # been written, copied away and truncated in between, more than once.
            self._filled(f, run, seen_ns)

    def _read(self, f: _File, run: _Poll) -> bool:
        """Read ``f`` within the poll's budget; True when it was read to its end."""
        if f.copy_of is not None and not self._unhold(f, run.now):
            return True  # held: nothing to read for now
        counters = Counters()
        try:
            while run.budget > 0:
                want = min(_CHUNK, run.budget)
                if f.count_to > f.offset:
                    want = min(want, f.count_to - f.offset)
                if f.stream is None:
                    data = os.pread(f.fd, want, f.offset)
                else:
                    if f.stream.pos != f.offset:
                        f.stream.seek(f.offset)
                    data = f.stream.read(want)
                if f.offset < HEAD and f.offset == len(f.head):
                    f.head += data[: HEAD - f.offset]
                run.budget -= len(data)
                counters.bytes_read += len(data)
                if f.count_to > f.offset:
                    self._count_lines(f, data)
                else:
                    self._lines(f, data, run, counters)
                    if len(data) < want:
                        return True  # a short read of a regular file: its end, for now
        except OSError:
            return True  # an I/O error: give up on this file for this poll
        finally:
            if f.source is not None:
                counters.lines_recovered = counters.lines_read
            self._count(f.path).add(counters)
            self._total.add(counters)
        return False

    def _count_lines(self, f: _File, data: bytes) -> None:
        """Count the lines of a start that is skipped (``from_start=False``)."""
        nl = data.rfind(b"\n")
        if nl >= 0:
            f.line_no += data.count(b"\n")
            f.counted_nl = f.offset + nl + 1
        f.offset += len(data)
        if not data or f.offset >= f.count_to:
            # Done: go back to the start of a line still being written, to return it whole.
            f.offset, f.count_to = f.counted_nl, 0
            f.tail = b""
            if f.stream is None and f.offset:
                # What the truncation check and a rotated copy are compared with.
                n = min(_TAIL, f.offset)
                f.tail = os.pread(f.fd, n, f.offset - n)

    def _lines(self, f: _File, data: bytes, run: _Poll, counters: Counters) -> None:
        """Cut the bytes read into lines; keep an unfinished one for later."""
        f.offset += len(data)
        f.tail = (f.tail + data)[-_TAIL:] if len(data) < _TAIL else data[-_TAIL:]
        if f.skipping:
            nl = data.find(b"\n")
            if nl < 0:
                return
            f.skipping = False
            data = data[nl + 1 :]
        if f.pending:
            data = f.pending + data
        end = data.rfind(b"\n")
        rest = data[end + 1 :]
        limit = self._max_line
        path, incarnation, now = f.path, f.incarnation, run.now
        n = f.line_no
        if end >= 0:
            # Decoding the complete lines at once and splitting the text gives what line
            # by line decoding gives ("\n" is never inside a UTF-8 sequence) in 2/3 of
            # the time.  A character is at most 4 bytes (a U+FFFD stands for 1 to 3), so
            # lines of at most limit/4 characters are not giant.
            texts = str(memoryview(data)[:end], "utf-8", "replace").split("\n")
            if data.find(b"\r", 0, end) >= 0:
                texts = [t[:-1] if t[-1:] == "\r" else t for t in texts]
            if max(map(len, texts)) * 4 > limit:
                texts = self._cut_giants(data[:end].split(b"\n"), counters)
            run.out.append((path, n + 1, incarnation, texts, now))
            n += len(texts)
        if len(rest) > limit and not (len(rest) == limit + 1 and rest[-1:] == b"\r"):
            n += 1
            text = _cut(rest, limit).decode("utf-8", "replace")
            run.out.append((path, n, incarnation, [text], now))
            counters.giant_lines += 1
            f.skipping, rest = True, b""
        counters.lines_read += n - f.line_no
        f.line_no = n
        f.pending = rest

    def _cut_giants(self, lines: list[bytes], counters: Counters) -> list[str]:
        """The texts of complete lines, the giant ones cut."""
        limit = self._max_line
        texts = []
        for raw in lines:
            if raw[-1:] == b"\r":
                raw = raw[:-1]
            if len(raw) > limit:
                raw = _cut(raw, limit)
                counters.giant_lines += 1
            texts.append(raw.decode("utf-8", "replace"))
        return texts

    def _flush_file(self, f: _File, run: _Poll, *, last: bool) -> None:
        """Return the line being written as it is; ``last``: the file will not go on.

        When the file goes on, the line keeps its number: its rest, when it comes, is
        returned as a line with the same ``line_no``.
        """
        if not f.pending:
            return
        raw = f.pending[:-1] if f.pending[-1:] == b"\r" else f.pending
        n = f.line_no + 1
        run.out.append((f.path, n, f.incarnation, [raw.decode("utf-8", "replace")], run.now))
        f.pending = b""
        if last:
            f.line_no = n
            counters = self._count(f.path)
            counters.lines_read += 1
            self._total.lines_read += 1
            if f.source is not None:
                counters.lines_recovered += 1
                self._total.lines_recovered += 1


def _close(f: _File) -> None:
    close_copy(f.fd, f.stream)


def _changed(fd: int, known: bytes, at: int) -> bool:
    """Whether the file no longer has the bytes ``known`` at ``at`` (none known: no)."""
    return bool(known) and os.pread(fd, len(known), at) != known


def _verdict(f: _File, fd: int, stream: Gunzip | None) -> Literal["whole", "short"] | None:
    """Whether a file holds what was read of ``f``: ``"whole"`` when it starts with
    ``f``'s head and has the bytes ``f`` had before its read position (a stream is left
    at that position), ``"short"`` when it starts with the head but ends before that
    position, None when it is another file."""
    head, tail, end = f.head, f.tail, f.offset
    if stream is None:
        if os.pread(fd, len(head), 0) != head:
            return None
        if os.fstat(fd).st_size < end:
            return "short"
        got = os.pread(fd, len(tail), end - len(tail))
    else:
        if stream.read(len(head)) != head:
            return None
        stream.seek(end - len(tail))
        got = stream.read(len(tail))
        if stream.pos < end:
            return None if stream.problem else "short"
    return "whole" if got == tail else None


def _cut(raw: bytes, limit: int) -> bytes:
    """The first ``limit`` bytes of ``raw``, less a UTF-8 character the cut would split.

    >>> _cut("añb".encode(), 2)
    b'a'
    """
    start = limit
    while start > max(0, limit - 3) and raw[start] & 0xC0 == 0x80:  # a continuation byte
        start -= 1
    lead = raw[start]
    size = (
        2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 1
    )
    return raw[:start] if start < limit < start + size else raw[:limit]


def _expand(pattern: str) -> Iterable[str]:
    """The paths a pattern names now (not yet checked to be regular files)."""
    if os.path.isdir(pattern):
        return _directory(pattern)
    if not os.path.exists(pattern) and glob.has_magic(pattern):
        paths: list[str] = []
        for match in sorted(glob.glob(pattern)):
            if os.path.isdir(match):
                paths.extend(_directory(match))
            elif not _compressed(match):
                paths.append(match)
        return paths
    return [pattern]


def _directory(path: str) -> list[str]:
    """The direct files of a directory that could be logs, sorted."""
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return []
    return [
        os.path.join(path, name)
        for name in names
        if not name.startswith(".")
        and not _compressed(name)
        and os.path.splitext(name)[1].lower() not in _NOT_LOGS
    ]


def _compressed(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in _COMPRESSED
