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
  it reopens the path.  The new file is read from its start as a new *incarnation*
  (line numbers restart).  When the old file appears under another matched name
  (``log`` renamed to ``log.1`` and the pattern matches both), it is followed on under
  that name, not read again.
* Truncation (copytruncate): the file is shorter than what was read, or the bytes just
  before the read position changed; it is read again from its start, as a new
  incarnation.  A file truncated and rewritten past the old position with the same last
  bytes cannot be told from one that grew; ``tail -F`` has the same blind spot.
* Deletion: the file is read to its end and dropped after ``rotate_wait``; a file that
  appears at the same path later is a new file, read from its start.

Open files are identified by (device, inode), as the kernel does; a file that two
matched paths name (a hard link, a symlink) is followed once.  Each followed file holds
one file descriptor.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import repeat

from ncclscope.sources import _NOT_LOGS  # the suffixes a directory walk skips in analyze

__all__ = ["FileStats", "FollowStats", "FollowedLine", "Follower"]

#: Bytes read per system call.
_CHUNK = 1 << 20
#: Bytes before the read position remembered to notice a file rewritten in place.
_TAIL = 32
#: Rotated logs compressed by logrotate: never live, and their lines were followed before.
_COMPRESSED = frozenset({".gz", ".xz", ".bz2", ".zst", ".lz4", ".z"})


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class FollowedLine:
    """One complete line of a followed file.

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
        lines_read: lines returned (cut giant lines count once).
        bytes_read: bytes read from the file, including a skipped start read only to
            count its lines.
        rotations: times the path came to name another file.
        truncations: times the file was found truncated or rewritten in place.
        giant_lines: lines longer than ``max_line_bytes``, returned cut.
    """

    lines_read: int = 0
    bytes_read: int = 0
    rotations: int = 0
    truncations: int = 0
    giant_lines: int = 0


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
    """

    lines_read: int
    bytes_read: int
    files_followed: int
    rotations: int
    truncations: int
    giant_lines: int
    open_errors: int
    files: Mapping[str, FileStats]


@dataclass
class _Counters:
    lines_read: int = 0
    bytes_read: int = 0
    rotations: int = 0
    truncations: int = 0
    giant_lines: int = 0

    def add(self, other: _Counters) -> None:
        self.lines_read += other.lines_read
        self.bytes_read += other.bytes_read
        self.rotations += other.rotations
        self.truncations += other.truncations
        self.giant_lines += other.giant_lines

    def snapshot(self) -> FileStats:
        return FileStats(
            self.lines_read, self.bytes_read, self.rotations, self.truncations, self.giant_lines
        )


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


@dataclass
class _Poll:
    """What one poll is doing: its time, its remaining byte budget, its lines."""

    now: datetime
    budget: int
    out: list[FollowedLine] = field(default_factory=list)


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
            stopped naming it.
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
        self._counters: dict[str, _Counters] = {}
        self._total = _Counters()
        self._open_errors = 0

    # -- the public calls ---------------------------------------------------------------

    def poll(self) -> list[FollowedLine]:
        """Read what the files gained since the last poll; the complete lines, in file order.

        Lines of one file are in order; files interleave in no particular order.  Never
        blocks on a file and reads at most ``max_bytes_per_poll`` bytes.
        """
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
        return run.out

    def flush(self) -> list[FollowedLine]:
        """The lines being written (held for their newline), returned as they are now.

        Reads nothing new: what was written since the last poll waits for the next one.

        For shutdown.  Should a line's rest arrive after all, a later poll returns it as
        a line with the same ``line_no``, so numbers stay those of the file.
        """
        run = _Poll(self._now(), 0)
        for f in [*self._retiring, *self._current.values()]:
            self._flush_file(f, run, last=False)
        return run.out

    def close(self) -> list[FollowedLine]:
        """Stop following: :meth:`flush`, then close every file.  Idempotent.

        Like :meth:`flush` it reads nothing: poll first for what was written since.
        """
        if self._closed:
            return []
        out = self.flush()
        for f in [*self._retiring, *self._current.values()]:
            os.close(f.fd)
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
        vacated = {f.path for f in moved.values()}
        followed = {f.key for f in self._current.values()}
        retiring = {f.key: f for f in self._retiring}
        for path, st in matched.items():
            if path in self._current:
                continue
            key = (st.st_dev, st.st_ino)
            if key in followed:
                continue  # another matched path names this file: followed once
            if path in vacated:
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
                new = self._open(path, key, start_at_end=not self._polled and not self._from_start)
                if new is None:
                    continue
                self._current[path] = new
            followed.add(key)
        for f in moved.values():
            f.retired_at = now
            self._retiring.append(f)

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
        if start_at_end:
            f.count_to = st.st_size
        self._count(path)
        return f

    def _next_incarnation(self, path: str) -> int:
        n = self._incarnations.get(path, -1) + 1
        self._incarnations[path] = n
        return n

    def _expired(self, f: _File, now: datetime) -> bool:
        if f.retired_at is None:
            return False
        # A clock that went back would otherwise keep the file open for as long.
        return now - f.retired_at >= self._rotate_wait or now < f.retired_at

    def _retire(self, f: _File, run: _Poll) -> None:
        """Close a rotated or deleted file read to its end; its last line is complete."""
        self._flush_file(f, run, last=True)
        os.close(f.fd)
        self._retiring.remove(f)

    def _count(self, path: str) -> _Counters:
        c = self._counters.get(path)
        if c is None:
            c = self._counters[path] = _Counters()
        return c

    def _prune_counters(self) -> None:
        live = set(self._current) | {f.path for f in self._retiring}
        for path in [p for p in self._counters if p not in live]:
            del self._counters[path]

    # -- reading ------------------------------------------------------------------------

    def _check_truncation(self, f: _File, run: _Poll) -> None:
        """Start the file again if it was truncated or rewritten in place."""
        try:
            size = os.fstat(f.fd).st_size
            rewritten = size < max(f.offset, f.count_to) or (
                size > f.offset
                and bool(f.tail)
                and os.pread(f.fd, len(f.tail), f.offset - len(f.tail)) != f.tail
            )
        except OSError:
            return
        if not rewritten:
            return
        self._flush_file(f, run, last=True)  # what was held ends the old content
        f.incarnation = self._next_incarnation(f.path)
        f.offset = f.line_no = f.count_to = f.counted_nl = 0
        f.pending, f.tail = b"", b""
        f.skipping = False
        self._count(f.path).truncations += 1
        self._total.truncations += 1

    def _read(self, f: _File, run: _Poll) -> bool:
        """Read ``f`` within the poll's budget; True when it was read to its end."""
        counters = _Counters()
        try:
            while run.budget > 0:
                want = min(_CHUNK, run.budget)
                if f.count_to > f.offset:
                    want = min(want, f.count_to - f.offset)
                data = os.pread(f.fd, want, f.offset)
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

    def _lines(self, f: _File, data: bytes, run: _Poll, counters: _Counters) -> None:
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
            run.out.extend(
                map(
                    FollowedLine,
                    repeat(path),
                    range(n + 1, n + 1 + len(texts)),
                    repeat(incarnation),
                    texts,
                    repeat(now),
                )
            )
            n += len(texts)
        if len(rest) > limit and not (len(rest) == limit + 1 and rest[-1:] == b"\r"):
            n += 1
            text = _cut(rest, limit).decode("utf-8", "replace")
            run.out.append(FollowedLine(path, n, incarnation, text, now))
            counters.giant_lines += 1
            f.skipping, rest = True, b""
        counters.lines_read += n - f.line_no
        f.line_no = n
        f.pending = rest

    def _cut_giants(self, lines: list[bytes], counters: _Counters) -> list[str]:
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
        run.out.append(
            FollowedLine(f.path, n, f.incarnation, raw.decode("utf-8", "replace"), run.now)
        )
        f.pending = b""
        if last:
            f.line_no = n
            self._count(f.path).lines_read += 1
            self._total.lines_read += 1


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
