"""Rotated copies of a followed log: the files logrotate leaves beside it (``log.1``,
dated, ``.gz``), found by name and read forward, for ``follow.Follower`` to take back what
a rotation moved away since its last poll.

A copy is one of the followed file when it starts with the file's first bytes (``HEAD``)
and holds the bytes the follower read before its position; ``follow`` decides that, this
module finds the candidates and opens them (a ``.gz`` through ``Gunzip``, which keeps
every byte before damage).
"""

from __future__ import annotations

import os
import re
import stat
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

__all__ = [
    "HEAD",
    "OLD_HEADS",
    "Candidate",
    "Gunzip",
    "close_copy",
    "is_rotation",
    "open_copy",
    "rotated_copies",
    "seen",
]

#: Bytes read per call while skipping to a position in a ``.gz`` copy.
_CHUNK = 1 << 20
#: Bytes from a file's start remembered to recognise its rotated copy (and to tell the
#: copies of one log apart: each starts where the previous rotation cut).
HEAD = 256
#: Rotated copies looked at, at most, on a rotation (the newest by modification time):
#: years of dated copies must not make one poll slow.
_CANDIDATES = 32
#: Heads of a path's finished files remembered, so that a copy compressed later (a new
#: modification time, when the compressor does not keep it) is not read again.
OLD_HEADS = 8
#: Compressed bytes fed to zlib at once when reading a ``.gz`` copy.
_GZ_CHUNK = 1 << 16
#: What logrotate (``log.1``, ``dateext``: ``log-20261127``, ``log-20261127-1732712345``,
#: ``log.2026-11-27``) and Python's rotating handlers append to a log's name.
_ROTATED = re.compile(r"[-._]\d[-_.\d]*")


@dataclass(frozen=True)
class Candidate:
    """A file beside a followed one, named as a rotation of it."""

    path: str
    key: tuple[int, int]
    mtime_ns: int
    compressed: bool


class Gunzip:
    """A ``.gz`` rotated copy, read forward (member after member), keeping every byte
    before damage.

    ``gzip.GzipFile`` drops what it had decoded in a read that meets a cut stream (see
    ``sources._gunzip``); a rotated copy may be the last place some lines exist.  Output
    is bounded per call (zlib's ``max_length``), so a copy is read within the budget.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.pos = 0  # decompressed bytes returned so far
        self.problem: str | None = None  # why it ended early (damaged, truncated)
        self._fh: BinaryIO = open(path, "rb")  # closed by close()
        self._start()

    def _start(self) -> None:
        self._dec = zlib.decompressobj(wbits=31)
        self._input = b""
        self._fed = False  # the current member got input and has not ended
        self._at_eof = False  # the compressed file is read to its end
        self._over = False

    def read(self, size: int) -> bytes:
        """Up to ``size`` decompressed bytes; fewer only at the end (or at damage)."""
        parts: list[bytes] = []
        want = size
        while want > 0 and not self._over:
            if not self._input and not self._at_eof:
                self._input = self._fh.read(_GZ_CHUNK)
                self._at_eof = not self._input
            fed = bool(self._input)
            try:
                data = self._dec.decompress(self._input, want)
            except zlib.error as err:
                if self._fed or self.pos == 0:
                    self.problem = f"damaged ({err})"
                # else: bytes after the last member (padding), which gzip -d ignores too
                self._over = True
                break
            if self._dec.eof:
                self._input = self._dec.unused_data
                self._dec = zlib.decompressobj(wbits=31)
                self._fed = False
            else:
                self._input = self._dec.unconsumed_tail
                self._fed = self._fed or fed
            if data:
                parts.append(data)
                want -= len(data)
            elif not self._input and self._at_eof:
                if self._fed:
                    self.problem = "truncated (no end-of-stream marker)"
                self._over = True
        out = b"".join(parts)
        self.pos += len(out)
        return out

    def seek(self, pos: int) -> None:
        """Go to ``pos`` of the decompressed bytes (backwards: from the start again)."""
        if pos < self.pos:
            self._fh.seek(0)
            self.pos = 0
            self.problem = None
            self._start()
        while self.pos < pos and self.read(min(_CHUNK, pos - self.pos)):
            pass

    def close(self) -> None:
        self._fh.close()


def close_copy(fd: int, stream: Gunzip | None) -> None:
    if stream is not None:
        stream.close()
    else:
        os.close(fd)


def seen(head: bytes, heads: Iterable[bytes]) -> bool:
    """Whether ``head`` starts a file that one of ``heads`` starts: a head shorter than
    ``HEAD`` was all the file had when it was read or copied, so one head being the
    start of the other is alike."""
    return any(head.startswith(h) or h.startswith(head) for h in heads)


def is_rotation(name: str, base: str) -> bool:
    """Whether ``name`` is what logrotate names a rotation of ``base``.

    >>> [is_rotation(n, "train.log") for n in ("train.log.1", "train.log-20261127.gz",
    ...  "train.log.2026-11-27", "train.log.err", "train.log", "rank1.log.1")]
    [True, True, True, False, False, False]
    """
    if len(name) <= len(base) or not name.startswith(base):
        return False
    suffix = name[len(base) :]
    if suffix[-3:].lower() == ".gz":
        suffix = suffix[:-3]
    return _ROTATED.fullmatch(suffix) is not None


def rotated_copies(path: str) -> list[Candidate]:
    """The regular files beside ``path`` named as its rotations (at most
    ``_CANDIDATES``, the newest); plain ones first, each newest first."""
    folder, base = os.path.split(path)
    try:
        with os.scandir(folder or ".") as entries:
            names = [e.name for e in entries if is_rotation(e.name, base)]
    except OSError:
        return []
    found: list[Candidate] = []
    for name in names:
        copy = os.path.join(folder, name)
        try:
            st = os.stat(copy)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            compressed = name[-3:].lower() == ".gz"
            found.append(Candidate(copy, (st.st_dev, st.st_ino), st.st_mtime_ns, compressed))
    found.sort(key=lambda c: c.mtime_ns, reverse=True)
    del found[_CANDIDATES:]
    found.sort(key=lambda c: c.compressed)  # stable: each kind stays newest first
    return found


def open_copy(c: Candidate) -> tuple[int, Gunzip | None] | None:
    try:
        if c.compressed:
            return -1, Gunzip(c.path)
        return os.open(c.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), None
    except OSError:
        return None
