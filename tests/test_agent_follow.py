"""The log follower (``ncclscope.agent.follow``) on real files in ``tmp_path``.

Each test writes files as a job and logrotate would (append, rename, truncate, delete)
and polls between the writes; the clock is injected, so arrival stamps and
``rotate_wait`` are exact.
"""

from __future__ import annotations

import errno
import gzip
import itertools
import logging
import os
import re
import shutil
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ncclscope.agent import follow
from ncclscope.agent.follow import FollowedLine, Follower
from ncclscope.sources import expand_inputs, read_lines

T0 = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def append(path: Path, data: bytes | str) -> None:
    with path.open("ab") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)


def started(
    tmp_path: Path, name: str = "train.log", pattern: str | None = None, **options: Any
) -> tuple[Path, Follower]:
    """An empty log and a follower of it (or of ``pattern``) past its first poll."""
    log = tmp_path / name
    log.write_text("")
    follower = Follower([pattern or str(log)], **options)
    assert follower.poll() == []
    return log, follower


def texts(lines: list[FollowedLine]) -> list[str]:
    return [x.text for x in lines]


def numbered(lines: list[FollowedLine]) -> list[tuple[str, int, int, str]]:
    """(file name, incarnation, line_no, text) of each line."""
    return [(Path(x.path).name, x.incarnation, x.line_no, x.text) for x in lines]


def nccl(k: int) -> str:
    return (
        f"node-1:4242:4242 [0] NCCL INFO AllReduce: opCount {k:x} sendbuff 0x7f0 "
        f"recvbuff 0x7f0 count 1024 datatype 7 op 0 root 0 comm 0x55a [nranks=2] stream 0x55b"
    )


# -- appending and where following starts ---------------------------------------------


def test_append_and_poll(tmp_path: Path) -> None:
    log, follower = started(tmp_path, "rank0.log", clock=Clock())
    append(log, nccl(1) + "\n" + nccl(2) + "\n")
    got = follower.poll()
    assert got == [
        FollowedLine(str(log), 1, 0, nccl(1), T0),
        FollowedLine(str(log), 2, 0, nccl(2), T0),
    ]
    assert follower.poll() == []
    append(log, "third\n")
    assert numbered(follower.poll()) == [("rank0.log", 0, 3, "third")]
    stats = follower.stats
    assert (stats.lines_read, stats.files_followed) == (3, 1)
    assert stats.bytes_read == log.stat().st_size
    assert stats.files[str(log)].lines_read == 3


def test_tail_semantics_start_at_end(tmp_path: Path) -> None:
    """Like ``tail -F``: what exists at the first poll is skipped, but counted, so line
    numbers stay those of the file; a line still being written is returned whole."""
    log = tmp_path / "rank0.log"
    log.write_text("one\ntwo\nthr")
    follower = Follower([str(log)])
    assert follower.poll() == []
    append(log, "ee\nfour\n")
    assert numbered(follower.poll()) == [("rank0.log", 0, 3, "three"), ("rank0.log", 0, 4, "four")]


def test_skipped_start_is_counted_within_the_budget(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_text("".join(f"line {k}\n" for k in range(1, 1001)))  # 9,893 bytes
    follower = Follower([str(log)], max_bytes_per_poll=1000)
    got = follower.poll()  # where following starts: the end now
    append(log, "appended\n")
    for _ in range(11):
        got += follower.poll()
        assert follower.stats.bytes_read <= 1000 * 12
    assert numbered(got) == [("rank0.log", 0, 1001, "appended")]


def test_tail_semantics_from_start(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_text("one\ntwo\n")
    follower = Follower([str(log)], from_start=True)
    assert numbered(follower.poll()) == [("rank0.log", 0, 1, "one"), ("rank0.log", 0, 2, "two")]
    append(log, "three\n")
    assert numbered(follower.poll()) == [("rank0.log", 0, 3, "three")]


def test_file_created_later_matched_by_glob_is_read_from_its_start(tmp_path: Path) -> None:
    first = tmp_path / "rank0.log"
    first.write_text("old\n")
    follower = Follower([str(tmp_path / "rank*.log")])
    assert follower.poll() == []
    later = tmp_path / "rank1.log"
    later.write_text("a\nb\n")
    (tmp_path / "rank1.log.gz").write_bytes(b"\x1f\x8b\x08junk\n")  # a rotated archive
    append(first, "new\n")
    got = follower.poll()
    assert sorted(numbered(got)) == [
        ("rank0.log", 0, 2, "new"),
        ("rank1.log", 0, 1, "a"),
        ("rank1.log", 0, 2, "b"),
    ]
    assert follower.stats.files_followed == 2


def test_named_file_that_does_not_exist_yet(tmp_path: Path) -> None:
    log = tmp_path / "later.log"
    follower = Follower([str(log)])
    assert follower.poll() == []
    log.write_text("hello\n")
    assert texts(follower.poll()) == ["hello"]


def test_directory_means_its_direct_regular_files(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text("a\n")
    (tmp_path / "b.txt").write_text("b\n")
    (tmp_path / ".hidden").write_text("hidden\n")
    (tmp_path / "ds_config.json").write_text("{}\n")
    (tmp_path / "old.log.1.gz").write_bytes(b"\x1f\x8b")
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "deep.log").write_text("deep\n")
    os.mkfifo(tmp_path / "pipe")  # must be left alone: opening it could block
    follower = Follower([str(tmp_path)], from_start=True)
    assert sorted(texts(follower.poll())) == ["a", "b"]
    assert follower.stats.files_followed == 2


def test_one_file_under_two_patterns_is_followed_once(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_text("x\n")
    os.symlink(log, tmp_path / "link.log")
    follower = Follower([str(log), str(tmp_path / "*.log"), str(tmp_path)], from_start=True)
    assert numbered(follower.poll()) == [("rank0.log", 0, 1, "x")]


# -- rotation, truncation, deletion ------------------------------------------------------


def test_rename_rotation_loses_nothing(tmp_path: Path) -> None:
    """logrotate ``create``: rename log -> log.1, create a new log."""
    clock = Clock()
    log, follower = started(tmp_path, clock=clock, rotate_wait=5)
    append(log, "a1\na2\n")
    assert texts(follower.poll()) == ["a1", "a2"]
    append(log, "a3\na4\n")  # written just before the rotation, not polled yet
    with log.open("ab") as writer:  # the job still holds the old file open
        log.rename(tmp_path / "train.log.1")
        append(log, "b1\nb2\n")
        clock.tick(1)
        assert numbered(follower.poll()) == [
            ("train.log", 0, 3, "a3"),
            ("train.log", 0, 4, "a4"),
            ("train.log", 1, 1, "b1"),
            ("train.log", 1, 2, "b2"),
        ]
        writer.write(b"a5 late\n")  # the job has not reopened the path yet
    append(log, "b3\n")
    clock.tick(1)
    assert numbered(follower.poll()) == [("train.log", 0, 5, "a5 late"), ("train.log", 1, 3, "b3")]
    assert follower.stats.files_followed == 2  # the old file, during rotate_wait
    clock.tick(5)
    assert follower.poll() == []
    stats = follower.stats
    assert (stats.files_followed, stats.rotations, stats.lines_read) == (1, 1, 8)
    assert stats.files[str(log)].rotations == 1


def test_rotation_old_file_is_read_to_its_end_before_the_new_one(tmp_path: Path) -> None:
    """A small budget: the old file's rest comes first, over several polls."""
    log, follower = started(tmp_path, max_bytes_per_poll=8)
    append(log, "".join(f"old{k}\n" for k in range(6)))  # 5 bytes a line
    log.rename(tmp_path / "train.log.1")
    log.write_text("new0\nnew1\n")
    got: list[FollowedLine] = []
    for _ in range(20):
        got += follower.poll()
    assert texts(got) == [f"old{k}" for k in range(6)] + ["new0", "new1"]


def test_rotation_to_a_name_the_pattern_also_matches(tmp_path: Path) -> None:
    """With ``train.log*`` the renamed file shows up as train.log.1: followed on there,
    not read again from its start."""
    log, follower = started(tmp_path, pattern=str(tmp_path / "train.log*"))
    append(log, "a1\n")
    assert numbered(follower.poll()) == [("train.log", 0, 1, "a1")]
    with log.open("ab") as writer:
        append(log, "a2\n")
        log.rename(tmp_path / "train.log.1")
        log.write_text("b1\n")
        got = follower.poll()
        assert sorted(numbered(got)) == [("train.log", 1, 1, "b1"), ("train.log.1", 0, 2, "a2")]
        writer.write(b"a3\n")
    assert numbered(follower.poll()) == [("train.log.1", 0, 3, "a3")]
    stats = follower.stats
    assert (stats.files_followed, stats.rotations, stats.lines_read) == (2, 1, 4)


def test_copytruncate(tmp_path: Path) -> None:
    clock = Clock()
    log, follower = started(tmp_path, clock=clock)
    append(log, "a1\na2\na3\n")
    assert len(follower.poll()) == 3
    with log.open("r+b") as fh:  # what logrotate's copytruncate does after its copy
        fh.truncate(0)
    append(log, "b1\n")
    assert numbered(follower.poll()) == [("train.log", 1, 1, "b1")]
    append(log, "b2\n")
    assert numbered(follower.poll()) == [("train.log", 1, 2, "b2")]
    stats = follower.stats
    assert (stats.truncations, stats.rotations) == (1, 0)


def test_truncated_and_rewritten_past_the_old_end(tmp_path: Path) -> None:
    """The new content is already longer than what was read: the bytes before the read
    position changed, so it is a new incarnation all the same."""
    log, follower = started(tmp_path)
    append(log, "a1\n")
    assert texts(follower.poll()) == ["a1"]
    log.write_text("b1 longer\nb2\n")  # truncate and write, between two polls
    assert numbered(follower.poll()) == [
        ("train.log", 1, 1, "b1 longer"),
        ("train.log", 1, 2, "b2"),
    ]
    assert follower.stats.truncations == 1


def test_deleted_file_is_dropped_and_a_new_one_at_its_path_is_new(tmp_path: Path) -> None:
    clock = Clock()
    log, follower = started(tmp_path, clock=clock, rotate_wait=2)
    append(log, "a1\na2 without newline")
    log.unlink()
    assert texts(follower.poll()) == ["a1"]
    clock.tick(3)
    # Closed after rotate_wait; its last line is complete now that it cannot grow.
    assert numbered(follower.poll()) == [("train.log", 0, 2, "a2 without newline")]
    assert (follower.stats.files_followed, follower.stats.files) == (0, {})
    log.write_text("b1\n")
    assert numbered(follower.poll()) == [("train.log", 1, 1, "b1")]
    assert follower.stats.rotations == 0


# -- rotated copies: copytruncate, and rotations between two polls ----------------------


class FileTimes:
    """Modification times set by hand, a second apart and later than any the kernel gave
    so far.  The files of a test are all written within one tick of the kernel's coarse
    clock (a few ms); rotations are seconds apart at least, and which file was written
    after which is what the follower goes by."""

    def __init__(self) -> None:
        self.ns = time.time_ns() + 10**9

    def stamp(self, *paths: Path) -> None:
        for path in paths:
            self.ns += 10**9
            os.utime(path, ns=(self.ns, self.ns))


def gzip_like_gzip(path: Path, *, keep_mtime: bool = True) -> Path:
    """``gzip PATH``: PATH.gz, with PATH's modification time (as gzip(1) keeps it), and
    PATH removed."""
    target = path.with_name(path.name + ".gz")
    mtime = path.stat().st_mtime_ns
    target.write_bytes(gzip.compress(path.read_bytes()))
    if keep_mtime:
        os.utime(target, ns=(mtime, mtime))
    path.unlink()
    return target


def copytruncate(log: Path, copy: str) -> None:
    """logrotate's ``copytruncate``: copy the log (gzip'd when the name ends in .gz),
    then truncate it in place."""
    data = log.read_bytes()
    (log.parent / copy).write_bytes(gzip.compress(data) if copy.endswith(".gz") else data)
    with log.open("r+b") as fh:
        fh.truncate(0)


def logrotate(
    log: Path, times: FileTimes, *, copy: bool, compress: bool = False, delay: bool = False
) -> None:
    """One logrotate run (``rotate`` large): train.log.N[.gz] -> N+1, then the log to
    train.log.1, copied and truncated (``copytruncate``) or renamed and created anew
    (``create``); gzip'd at once with ``compress``, or a run later with ``delay``
    (``delaycompress``: train.log.2 is compressed now)."""
    shape = re.compile(re.escape(log.name) + r"\.(\d+)(\.gz)?")
    rotated = [
        (int(m[1]), m[2] or "", p) for p in log.parent.iterdir() if (m := shape.fullmatch(p.name))
    ]
    for n, gz, path in sorted(rotated, reverse=True):
        path.rename(log.with_name(f"{log.name}.{n + 1}{gz}"))
    first = log.with_name(log.name + ".1")
    if copy:
        shutil.copyfile(log, first)
        times.stamp(first)
        with log.open("r+b") as fh:
            fh.truncate(0)
    else:
        log.rename(first)
        log.write_bytes(b"")
    times.stamp(log)
    if compress:
        gzip_like_gzip(first)
    second = log.with_name(log.name + ".2")
    if delay and second.exists():
        gzip_like_gzip(second)


@pytest.mark.parametrize(
    "copy",
    [
        "train.log.1",
        "train.log-20261127",
        "train.log-20261127-1732712345",
        "train.log.2026-11-27",
        "train.log.1.gz",
        "train.log-20261127.gz",
    ],
)
def test_copytruncate_reads_what_came_after_the_last_poll_from_the_copy(
    tmp_path: Path, copy: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The lines written after the last poll are only in the copy once the log is
    truncated: read from it, as the old file's (incarnation 0, numbers going on), before
    the truncated log's new lines (incarnation 1, from 1)."""
    clock = Clock()
    log, follower = started(tmp_path, clock=clock)
    append(log, "a1\na2 hal")
    assert numbered(follower.poll()) == [("train.log", 0, 1, "a1")]
    append(log, "f\na3\na4\n")
    copytruncate(log, copy)
    append(log, "b1\n")  # the job goes on (O_APPEND): at the truncated log's start
    clock.tick(1)
    with caplog.at_level(logging.INFO, logger="ncclscope.agent.follow"):
        assert numbered(follower.poll()) == [
            ("train.log", 0, 2, "a2 half"),
            ("train.log", 0, 3, "a3"),
            ("train.log", 0, 4, "a4"),
            ("train.log", 1, 1, "b1"),
        ]
    assert str(tmp_path / copy) in caplog.text
    append(log, "b2\n")
    assert numbered(follower.poll()) == [("train.log", 1, 2, "b2")]
    stats = follower.stats
    assert (stats.truncations, stats.unrecovered, stats.lines_read) == (1, 0, 6)
    assert (stats.lines_recovered, stats.files[str(log)].lines_recovered) == (3, 3)
    assert stats.files[str(log)].recovered_from == str(tmp_path / copy)
    assert stats.files_followed == 1  # the copy is closed once read
    follower.close()


def test_copytruncate_rewritten_past_the_read_position_with_lines_alike(tmp_path: Path) -> None:
    """NCCL's lines are often as long as each other and end alike (``... stream 0x55b``):
    truncated and rewritten past the read position, the log has the bytes it had before
    that position; its first bytes differ, so the truncation is noticed all the same."""
    log, follower = started(tmp_path)
    append(log, nccl(1) + "\n")
    assert texts(follower.poll()) == [nccl(1)]
    append(log, nccl(2) + "\n")
    copytruncate(log, "train.log.1")
    append(log, nccl(3) + "\n" + nccl(4) + "\n")
    assert numbered(follower.poll()) == [
        ("train.log", 0, 2, nccl(2)),
        ("train.log", 1, 1, nccl(3)),
        ("train.log", 1, 2, nccl(4)),
    ]
    assert follower.stats.truncations == 1
    follower.close()


@pytest.mark.parametrize("keep_mtime", [True, False])
def test_copytruncate_with_delaycompress(tmp_path: Path, keep_mtime: bool) -> None:
    """``delaycompress``: the newest copy stays plain (train.log.1) while the one before
    is compressed (train.log.2.gz) in the same run.  The plain one is read; the .gz
    holds lines read already and is not read again, even when the compressor gave it a
    new modification time (``keep_mtime=False``)."""
    times = FileTimes()
    log, follower = started(tmp_path)
    append(log, "a1\n")
    assert texts(follower.poll()) == ["a1"]
    append(log, "a2\n")
    times.stamp(log)
    logrotate(log, times, copy=True, delay=True)
    append(log, "b1\n")
    times.stamp(log)
    assert numbered(follower.poll()) == [("train.log", 0, 2, "a2"), ("train.log", 1, 1, "b1")]
    append(log, "b2\n")
    times.stamp(log)
    logrotate(log, times, copy=True)  # train.log.1 -> .2, a new copy in train.log.1
    gzip_like_gzip(tmp_path / "train.log.2", keep_mtime=keep_mtime)
    append(log, "c1\n")
    assert numbered(follower.poll()) == [("train.log", 1, 2, "b2"), ("train.log", 2, 1, "c1")]
    stats = follower.stats
    assert (stats.truncations, stats.lines_recovered) == (2, 2)
    assert stats.files[str(log)].recovered_from == str(tmp_path / "train.log.1")
    follower.close()


def test_a_copy_that_does_not_hold_what_was_read_is_not_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """rank0.log is truncated with no copy of it beside it (``olddir``).  Beside it:
    rank1.log's copy with the same lines (another log's name), a rank0.log.1 with other
    lines, and one that starts with what was read but is a day older than it (an
    earlier run's).  None is read; the truncation is counted as unrecovered."""
    log, follower = started(tmp_path, "rank0.log")
    append(log, "a1\n")
    assert texts(follower.poll()) == ["a1"]
    append(log, "a2\na3\n")
    (tmp_path / "rank1.log.1").write_text("a1\na2\na3\n")
    (tmp_path / "rank0.log.1").write_text("x1\nx2\nx3\n")
    earlier = tmp_path / "rank0.log-20261126"
    earlier.write_text("a1\nold\n")
    day_ago = time.time_ns() - 86_400 * 10**9
    os.utime(earlier, ns=(day_ago, day_ago))
    with log.open("r+b") as fh:
        fh.truncate(0)
    append(log, "b1\n")
    with caplog.at_level(logging.INFO, logger="ncclscope.agent.follow"):
        assert numbered(follower.poll()) == [("rank0.log", 1, 1, "b1")]
    assert "no rotated copy" in caplog.text
    stats = follower.stats
    assert (stats.truncations, stats.unrecovered, stats.lines_recovered) == (1, 1, 0)
    assert stats.files[str(log)].recovered_from is None
    follower.close()


@pytest.mark.parametrize("compress", [False, True])
def test_copytruncate_twice_between_two_polls(tmp_path: Path, compress: bool) -> None:
    """Two runs between two polls: the rest of the old file comes from its copy (now
    train.log.2), the whole file in between from the newer copy (train.log.1), then
    the log's new lines; each file its own incarnation."""
    times = FileTimes()
    log, follower = started(tmp_path)
    append(log, "a1\n")
    times.stamp(log)
    assert texts(follower.poll()) == ["a1"]
    append(log, "a2\n")
    times.stamp(log)
    logrotate(log, times, copy=True, compress=compress)
    append(log, "b1\nb2\n")
    times.stamp(log)
    logrotate(log, times, copy=True, compress=compress)
    append(log, "c1\n")
    times.stamp(log)
    assert numbered(follower.poll()) == [
        ("train.log", 0, 2, "a2"),
        ("train.log", 1, 1, "b1"),
        ("train.log", 1, 2, "b2"),
        ("train.log", 2, 1, "c1"),
    ]
    stats = follower.stats
    assert (stats.truncations, stats.lines_recovered, stats.unrecovered) == (2, 3, 0)
    first = "train.log.1.gz" if compress else "train.log.1"
    assert stats.files[str(log)].recovered_from == str(tmp_path / first)
    follower.close()


def test_copytruncate_again_while_the_copy_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rotations a second apart and a big copy: logrotate runs again while the poll
    reads the last run's copy (train.log.1.gz), before the log's new lines are read.
    What the log had in between is in the newer copy, read before them."""
    times = FileTimes()
    log, follower = started(tmp_path)
    append(log, "a1\n")
    times.stamp(log)
    assert texts(follower.poll()) == ["a1"]
    append(log, "a2\n")
    times.stamp(log)
    logrotate(log, times, copy=True, compress=True)
    append(log, "b1\n")
    times.stamp(log)
    reading = follow.Gunzip.read
    runs = []

    def read_then_rotate(self: Any, size: int) -> bytes:
        data = reading(self, size)
        if size == 1 << 20 and not runs:  # reading the copy's rest: logrotate runs again
            runs.append(size)
            append(log, "b2\n")
            times.stamp(log)
            logrotate(log, times, copy=True, compress=True)
            append(log, "c1\n")
            times.stamp(log)
        return data

    monkeypatch.setattr(follow.Gunzip, "read", read_then_rotate)
    assert numbered(follower.poll()) == [
        ("train.log", 0, 2, "a2"),
        ("train.log", 1, 1, "b1"),
        ("train.log", 1, 2, "b2"),
        ("train.log", 2, 1, "c1"),
    ]
    assert runs
    follower.close()


def test_copytruncate_of_a_log_that_was_empty_at_the_last_poll(tmp_path: Path) -> None:
    """Nothing was read of the log to compare with (it was empty at the last poll), and
    it was written, copied and truncated before the next: the newer copy is read."""
    times = FileTimes()
    log, follower = started(tmp_path)
    times.stamp(log)
    append(log, "a1\na2\n")
    times.stamp(log)
    logrotate(log, times, copy=True)
    assert numbered(follower.poll()) == [("train.log", 0, 1, "a1"), ("train.log", 0, 2, "a2")]
    append(log, "b1\n")
    assert numbered(follower.poll()) == [("train.log", 1, 1, "b1")]
    follower.close()


def test_copytruncate_with_the_copies_matched_too(tmp_path: Path) -> None:
    """A directory (or ``train.log*``) matches the copies as well.  A copy made since the
    last poll is held, not read from its start: its lines are the log's, read from it
    (and the rest from the copy, under the log's name, as when it is not matched)."""
    log = tmp_path / "train.log"
    log.write_text("")
    follower = Follower([str(tmp_path)], clock=Clock())
    assert follower.poll() == []
    append(log, "a1\n")
    assert numbered(follower.poll()) == [("train.log", 0, 1, "a1")]
    append(log, "a2\n")
    shutil.copyfile(log, tmp_path / "train.log.1")  # logrotate's copy, and a poll ...
    assert numbered(follower.poll()) == [("train.log", 0, 2, "a2")]
    with log.open("r+b") as fh:  # ... before its truncate
        fh.truncate(0)
    append(log, "b1\n")
    assert numbered(follower.poll()) == [("train.log", 1, 1, "b1")]
    append(log, "b2\n")
    (tmp_path / "train.log.1").rename(tmp_path / "train.log.2")  # followed on there
    copytruncate(log, "train.log.1")  # all between two polls this time
    append(log, "c1\n")
    assert numbered(follower.poll()) == [("train.log", 1, 2, "b2"), ("train.log", 2, 1, "c1")]
    assert follower.poll() == []
    stats = follower.stats
    assert (stats.files_followed, stats.lines_read, stats.lines_recovered) == (3, 5, 1)
    follower.close()


def test_a_cut_gz_copy_gives_what_decompresses_and_counts_the_loss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log, follower = started(tmp_path)
    append(log, "a0\n")
    assert texts(follower.poll()) == ["a0"]
    lines = [f"a{k} {k * 7919 % 10007:05d} {k**3:x}" for k in range(1, 3001)]
    append(log, "".join(line + "\n" for line in lines))
    packed = gzip.compress(log.read_bytes())
    (tmp_path / "train.log.1.gz").write_bytes(packed[: len(packed) // 2])  # disk full
    with log.open("r+b") as fh:
        fh.truncate(0)
    append(log, "b1\n")
    with caplog.at_level(logging.INFO, logger="ncclscope.agent.follow"):
        got = follower.poll()
    old = [x for x in got if x.incarnation == 0]
    assert 0 < len(old) < len(lines)
    assert texts(old[:-1]) == lines[: len(old) - 1]
    assert lines[len(old) - 1].startswith(old[-1].text)  # the last one may be cut
    assert numbered(got[-1:]) == [("train.log", 1, 1, "b1")]
    assert follower.stats.unrecovered == 1
    assert "truncated" in caplog.text
    follower.close()


@pytest.mark.parametrize("compress", [False, True])
def test_rename_rotation_twice_between_two_polls(tmp_path: Path, compress: bool) -> None:
    """logrotate ``create`` twice before the follower polls: the file in between was
    never opened; it is found renamed beside the log (train.log.1, or train.log.1.gz
    when compressed at once) and read whole, in its place.  The old file's copy
    (train.log.2[.gz]) is not: its end is read from the file itself."""
    clock = Clock()
    times = FileTimes()
    log, follower = started(tmp_path, clock=clock, rotate_wait=5)
    append(log, "a1\n")
    times.stamp(log)
    assert texts(follower.poll()) == ["a1"]
    append(log, "a2\n")
    times.stamp(log)
    logrotate(log, times, copy=False, compress=compress)
    append(log, "b1\nb2\n")
    times.stamp(log)
    logrotate(log, times, copy=False, compress=compress)
    append(log, "c1\n")
    times.stamp(log)
    clock.tick(1)
    assert numbered(follower.poll()) == [
        ("train.log", 0, 2, "a2"),
        ("train.log", 1, 1, "b1"),
        ("train.log", 1, 2, "b2"),
        ("train.log", 2, 1, "c1"),
    ]
    clock.tick(5)
    assert follower.poll() == []
    stats = follower.stats
    assert (stats.rotations, stats.lines_recovered, stats.files_followed) == (2, 2, 1)
    follower.close()


def test_rename_rotation_compressed_at_once(tmp_path: Path) -> None:
    """``compress`` without ``delaycompress``: train.log.1 is gzip'd and removed before
    the follower polls.  The old file's end is read from it all the same (its
    descriptor is held), and the .gz, a copy of it, is not read."""
    clock = Clock()
    log, follower = started(tmp_path, clock=clock)
    append(log, "a1\n")
    assert texts(follower.poll()) == ["a1"]
    with log.open("ab", buffering=0) as writer:
        writer.write(b"a2\n")
        log.rename(tmp_path / "train.log.1")
        log.write_text("b1\n")
        writer.write(b"a3\n")  # before the job reopens the log
        gzip_like_gzip(tmp_path / "train.log.1")
    clock.tick(1)
    assert numbered(follower.poll()) == [
        ("train.log", 0, 2, "a2"),
        ("train.log", 0, 3, "a3"),
        ("train.log", 1, 1, "b1"),
    ]
    clock.tick(5)
    assert follower.poll() == []
    assert (follower.stats.rotations, follower.stats.lines_recovered) == (1, 0)
    follower.close()


def test_rename_twice_to_names_the_pattern_matches(tmp_path: Path) -> None:
    """With ``train.log*`` the old file is followed on as train.log.2 and the one in
    between is read as train.log.1, from its start, under its own name."""
    times = FileTimes()
    log, follower = started(tmp_path, pattern=str(tmp_path / "train.log*"))
    append(log, "a1\n")
    times.stamp(log)
    assert texts(follower.poll()) == ["a1"]
    append(log, "a2\n")
    times.stamp(log)
    logrotate(log, times, copy=False)
    append(log, "b1\n")
    times.stamp(log)
    logrotate(log, times, copy=False)
    append(log, "c1\n")
    times.stamp(log)
    assert sorted(numbered(follower.poll())) == [
        ("train.log", 1, 1, "c1"),
        ("train.log.1", 0, 1, "b1"),
        ("train.log.2", 0, 2, "a2"),
    ]
    assert follower.poll() == []
    assert follower.stats.lines_recovered == 0
    follower.close()


def test_delete_and_recreate_loses_and_repeats_nothing(tmp_path: Path) -> None:
    """The log is deleted and created anew while the job writes on to the deleted file
    until it reopens the path: both are read to their end, in order."""
    clock = Clock()
    log, follower = started(tmp_path, clock=clock, rotate_wait=2)
    with log.open("ab", buffering=0) as writer:
        writer.write(b"a1\n")
        assert texts(follower.poll()) == ["a1"]
        writer.write(b"a2\n")
        log.unlink()
        writer.write(b"a3\n")
        append(log, "b1\n")  # another writer (or the job, reopened) at the path
        clock.tick(1)
        assert numbered(follower.poll()) == [
            ("train.log", 0, 2, "a2"),
            ("train.log", 0, 3, "a3"),
            ("train.log", 1, 1, "b1"),
        ]
        writer.write(b"a4\n")
    append(log, "b2\n")
    clock.tick(1)
    assert numbered(follower.poll()) == [("train.log", 0, 4, "a4"), ("train.log", 1, 2, "b2")]
    clock.tick(2)
    assert follower.poll() == []
    stats = follower.stats
    assert (stats.files_followed, stats.rotations, stats.lines_read) == (1, 1, 6)
    follower.close()


LOGROTATE_OPS = st.lists(
    st.sampled_from(["append"] * 4 + ["poll", "rotate", "rotate gz", "rotate delay"]),
    max_size=40,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(copy=st.booleans(), ops=LOGROTATE_OPS, budget=st.sampled_from([40, 1 << 20]))
def test_logrotate_at_any_time_loses_and_repeats_nothing(
    tmp_path_factory: pytest.TempPathFactory, copy: bool, ops: list[str], budget: int
) -> None:
    """logrotate runs (copytruncate or create, as the log's configuration says;
    compressed at once, a run later, or not) at any point between appends and polls,
    several between two polls too, with a poll budget of a line or two: every line
    comes back once, in the order written, numbered from 1 in each file.

    Each line starts with a character of its own and is shorter than the 32 bytes kept
    before the read position, as a job's lines differ (times, steps): a file rewritten
    since the last poll is told from one that grew by those bytes, and copies apart by
    their first bytes (module docstring).
    """
    log = tmp_path_factory.mktemp("logrotate") / "train.log"
    log.write_bytes(b"")
    times = FileTimes()
    times.stamp(log)
    follower = Follower([str(log)], rotate_wait=0, clock=Clock(), max_bytes_per_poll=budget)
    follower.poll()
    written: list[str] = []
    got: list[FollowedLine] = []
    for op in ops:
        if op == "append":
            written.append(f"{chr(0x41 + len(written))} line {len(written)} of the job")
            append(log, written[-1] + "\n")
            times.stamp(log)
        elif op == "poll":
            got += follower.poll()
        else:
            logrotate(log, times, copy=copy, compress=op.endswith("gz"), delay=op.endswith("delay"))
    quiet = 0
    while quiet < 3:
        batch = follower.poll()
        got += batch
        quiet = 0 if batch else quiet + 1
    got += follower.close()
    assert texts(got) == written
    incarnations = [x.incarnation for x in got]
    assert incarnations == sorted(incarnations)
    for _, group in itertools.groupby(got, key=lambda x: x.incarnation):
        numbers = [x.line_no for x in group]
        assert numbers == list(range(1, len(numbers) + 1))


# -- line handling -------------------------------------------------------------------


def test_partial_line_is_held_until_its_newline(tmp_path: Path) -> None:
    clock = Clock()
    log, follower = started(tmp_path, clock=clock)
    append(log, "node-1:4242:4242 [0] NCCL INFO All")
    assert follower.poll() == []
    clock.tick(60)  # however long the writer takes
    append(log, "Reduce: opCount 1")
    assert follower.poll() == []
    clock.tick(1)
    append(log, "\r\nnext\n")
    got = follower.poll()
    assert numbered(got) == [
        ("train.log", 0, 1, "node-1:4242:4242 [0] NCCL INFO AllReduce: opCount 1"),
        ("train.log", 0, 2, "next"),
    ]
    assert {x.arrived for x in got} == {T0 + timedelta(seconds=61)}


def test_flush_returns_the_partial_line(tmp_path: Path) -> None:
    log, follower = started(tmp_path)
    append(log, "done\nhalf")
    assert texts(follower.poll()) == ["done"]
    assert numbered(follower.flush()) == [("train.log", 0, 2, "half")]
    assert follower.flush() == []
    # The line's rest, should it come: the same line number, the rest of its text.
    append(log, " and rest\nnext\n")
    assert numbered(follower.poll()) == [
        ("train.log", 0, 2, " and rest"),
        ("train.log", 0, 3, "next"),
    ]
    append(log, "last")
    assert follower.poll() == []
    assert texts(follower.close()) == ["last"]
    assert follower.close() == []
    with pytest.raises(ValueError, match="closed"):
        follower.poll()


def test_crlf_endings_and_a_split_crlf(tmp_path: Path) -> None:
    log, follower = started(tmp_path, "win.log")
    append(log, b"a\r\nb\rc\r")
    assert texts(follower.poll()) == ["a"]
    append(log, b"\n\r\n")
    assert texts(follower.poll()) == ["b\rc", ""]  # an inner \r stays, as in analyze


def test_invalid_utf8_is_replaced_and_neighbours_are_intact(tmp_path: Path) -> None:
    log, follower = started(tmp_path)
    append(log, nccl(1).encode() + b"\n\xff\xfe bad \xe2\x82 cut\n" + nccl(2).encode() + b"\n")
    assert texts(follower.poll()) == [nccl(1), "\ufffd\ufffd bad \ufffd cut", nccl(2)]


def test_lines_agree_with_the_post_mortem_reader(tmp_path: Path) -> None:
    """The same bytes give the same lines live and in ``analyze``."""
    log = tmp_path / "mixed.log"
    content = (
        b"plain\r\n\r\n"
        b"tqdm 7%|#  | 41/596\rnode-1:1:1 [0] NCCL INFO x\n"
        b"\x00\x01binary\x7f junk\n"
        b"\xc3\x28 \xf0\x9f\x98 bad utf-8 \xe2\x82\xac ok\n"
        b"caf\xc3\xa9 \xf0\x9f\x9a\x80\n"
        b"last line without newline"
    )
    log.write_bytes(content)
    follower = Follower([str(log)], from_start=True)
    live = follower.poll() + follower.close()
    inputs, problems = expand_inputs([str(log)], workdir=tmp_path / "work")
    assert not problems
    post_mortem = read_lines(inputs[0], range(1, 20))
    assert {x.line_no: x.text for x in live} == post_mortem


def test_binary_file_is_read_like_text(tmp_path: Path) -> None:
    core = tmp_path / "core.log"
    core.write_bytes(bytes(range(256)) * 4)
    follower = Follower([str(core)], from_start=True)
    got = follower.poll() + follower.close()
    assert texts(got) == expected_lines(bytes(range(256)) * 4)
    assert [x.line_no for x in got] == list(range(1, 6))


def test_giant_line_is_cut_and_the_next_line_is_intact(tmp_path: Path) -> None:
    limit = 1 << 20
    log, follower = started(tmp_path, max_line_bytes=limit)
    giant = b"G" * (3 << 20)
    append(log, b"before\n" + giant + b"\n" + nccl(7).encode() + b"\n")
    got = follower.poll()
    assert [len(x.text) for x in got] == [6, limit, len(nccl(7))]
    assert numbered(got)[0] == ("train.log", 0, 1, "before")
    assert got[1].text == "G" * limit
    assert numbered(got)[2] == ("train.log", 0, 3, nccl(7))
    assert follower.stats.giant_lines == 1


def test_giant_line_arriving_in_pieces_is_never_buffered_whole(tmp_path: Path) -> None:
    log, follower = started(tmp_path, max_line_bytes=1000)
    got: list[FollowedLine] = []
    for _ in range(50):
        append(log, b"x" * 300)
        got += follower.poll()
    append(log, b"\nafter\n")
    got += follower.poll()
    assert [(x.line_no, len(x.text)) for x in got] == [(1, 1000), (2, 5)]
    assert follower.stats.giant_lines == 1


def test_giant_line_is_cut_on_a_character_boundary(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes("é".encode() * 10 + b"\n")  # 2 bytes a character
    follower = Follower([str(log)], from_start=True, max_line_bytes=5)
    assert texts(follower.poll()) == ["éé"]


def test_max_bytes_per_poll_is_respected(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    lines = [f"{k:08d} " + nccl(k) for k in range(70_000)]
    data = "".join(line + "\n" for line in lines).encode()
    assert len(data) > 10_000_000
    log.write_bytes(data)
    budget = 1 << 20
    follower = Follower([str(log)], from_start=True, max_bytes_per_poll=budget)
    got: list[str] = []
    polls = 0
    before = 0
    while len(got) < len(lines):
        got += texts(follower.poll())
        polls += 1
        read = follower.stats.bytes_read
        assert read - before <= budget
        before = read
        assert polls < 100
    assert got == lines
    assert polls >= len(data) // budget
    assert follower.poll() == []


def test_budget_is_shared_fairly_between_files(tmp_path: Path) -> None:
    """A file with more than a poll's budget does not starve the others."""
    big, small = tmp_path / "a.log", tmp_path / "b.log"
    big.write_text("")
    small.write_text("")
    follower = Follower([str(tmp_path)], max_bytes_per_poll=1000)
    follower.poll()
    append(big, (b"y" * 99 + b"\n") * 1000)
    append(small, "small\n")
    seen = texts(follower.poll()) + texts(follower.poll())
    assert "small" in seen


def test_arrival_stamps_come_from_the_clock(tmp_path: Path) -> None:
    clock = Clock()
    log, follower = started(tmp_path, clock=clock)
    append(log, "a\nb\n")
    clock.tick(2.5)
    got = follower.poll()
    assert [x.arrived for x in got] == [T0 + timedelta(seconds=2.5)] * 2
    append(log, "c")
    assert follower.poll() == []
    clock.now = datetime(2026, 11, 23, 14, 0, 3, tzinfo=timezone(timedelta(hours=2)))
    (line,) = follower.flush()
    assert line.arrived == datetime(2026, 11, 23, 12, 0, 3, tzinfo=UTC)
    assert line.arrived.tzinfo is UTC


def test_naive_clock_is_refused(tmp_path: Path) -> None:
    follower = Follower([str(tmp_path)], clock=lambda: datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="naive"):
        follower.poll()


def test_bad_arguments() -> None:
    with pytest.raises(TypeError):
        Follower("train.log")
    with pytest.raises(ValueError, match="max_line_bytes"):
        Follower(["x"], max_line_bytes=0)
    with pytest.raises(ValueError, match="max_bytes_per_poll"):
        Follower(["x"], max_bytes_per_poll=0)


def test_many_files(tmp_path: Path) -> None:
    paths = [tmp_path / f"rank{r:04d}.log" for r in range(300)]
    for p in paths:
        p.write_text("before\n")
    follower = Follower([str(tmp_path / "rank*.log")])
    assert follower.poll() == []
    for round_ in range(3):
        for r, p in enumerate(paths):
            append(p, f"rank {r} round {round_}\n")
        got = follower.poll()
        assert sorted((x.path, x.line_no, x.text) for x in got) == sorted(
            (str(p), round_ + 2, f"rank {r} round {round_}") for r, p in enumerate(paths)
        )
    assert follower.stats.files_followed == 300
    assert follower.close() == []


def test_unreadable_file_is_counted_and_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file listed but refused when opened (mode 0, for anyone but root, who runs
    CI): opening it fails as it does for a user without the permission, whoever runs
    the test; it is counted and opened at a later poll once it can be."""
    log = tmp_path / "train.log"
    log.write_text("x\n")
    real_open = os.open
    refused: list[str] = []
    readable = False

    def refuse(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path) == str(log) and not readable:
            refused.append(os.fspath(path))
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)  # the module follow.py opens with
    follower = Follower([str(log)], from_start=True)
    assert follower.poll() == []
    assert refused == [str(log)]
    assert follower.stats.open_errors == 1
    assert follower.stats.files_followed == 0
    readable = True
    assert texts(follower.poll()) == ["x"]
    assert follower.stats.open_errors == 1
    follower.close()


# -- property: any appends, polled in between, give the lines of the final content -----

#: Bytes that make the cases: newlines, \r, multi-byte UTF-8 and bytes that are not.
PIECES = st.sampled_from(
    [b"\n", b"\r", b"\r\n", b"a", b"NCCL INFO ", b"\xff", b"\xe2\x82", b"\x00"]
    + [c.encode() for c in "é€🚀"]
)


def expected_lines(content: bytes) -> list[str]:
    lines = content.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the content ends with a newline: no partial line
    return [(x[:-1] if x.endswith(b"\r") else x).decode("utf-8", "replace") for x in lines]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    content=st.lists(PIECES, max_size=60).map(b"".join),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
    budget=st.integers(min_value=1, max_value=64),
    tight=st.booleans(),
)
def test_any_appends_give_the_lines_of_the_final_content(
    tmp_path_factory: pytest.TempPathFactory,
    content: bytes,
    cuts: list[int],
    budget: int,
    tight: bool,
) -> None:
    log = tmp_path_factory.mktemp("prop") / "train.log"
    log.write_bytes(b"")
    # tight: no line is giant, but some are long enough to take the byte-wise path.
    limit = len(content) + 1 if tight else 1 << 20
    follower = Follower([str(log)], max_bytes_per_poll=budget, max_line_bytes=limit)
    follower.poll()
    got: list[FollowedLine] = []
    bounds = sorted({min(c, len(content)) for c in cuts} | {0, len(content)})
    for start, end in itertools.pairwise(bounds):
        append(log, content[start:end])  # may split a character or a \r\n
        got += follower.poll()
    while follower.stats.bytes_read < len(content):
        got += follower.poll()
    got += follower.close()
    assert texts(got) == expected_lines(content)
    assert [x.line_no for x in got] == list(range(1, len(got) + 1))


CHUNKS = st.lists(PIECES, min_size=1, max_size=8).map(b"".join)
OPS = st.lists(
    st.one_of(
        CHUNKS.map(lambda data: ("append", data)),
        st.sampled_from([("poll", b""), ("rotate", b""), ("truncate", b"")]),
    ),
    max_size=40,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_rotations_and_truncations_lose_and_repeat_nothing(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, bytes]]
) -> None:
    """Appends, renames (logrotate ``create``) and truncations in any order give every
    line of every incarnation once, in order, numbered as in its file.  The follower
    polls just before a rotation or truncation (the truncation keeps no copy here, so
    what is written after that poll would be lost: no claim there; with copies, see
    test_logrotate_at_any_time_loses_and_repeats_nothing).  Modification times are set
    by hand (``FileTimes``): the renamed train.log.1 is older than the log's last
    write, so it is not taken for a copy of the truncated log."""
    log = tmp_path_factory.mktemp("rot") / "train.log"
    log.write_bytes(b"")
    times = FileTimes()
    times.stamp(log)
    follower = Follower([str(log)], rotate_wait=0, clock=Clock())
    follower.poll()
    got: list[FollowedLine] = []
    contents = [b""]  # of each incarnation
    for op, data in ops:
        if op == "append":
            append(log, data)
            contents[-1] += data
        elif op == "poll":
            got += follower.poll()
        elif op == "rotate":
            got += follower.poll()
            log.rename(log.with_name("train.log.1"))
            log.write_bytes(b"")
            contents.append(b"")
        else:
            got += follower.poll()
            with log.open("r+b") as fh:
                fh.truncate(0)
            if contents[-1]:  # nothing was read of an empty file: no new incarnation
                contents.append(b"")
            times.stamp(log)
            got += follower.poll()
        times.stamp(log)
    got += follower.poll()
    got += follower.close()
    want = [
        (incarnation, n, text)
        for incarnation, content in enumerate(contents)
        for n, text in enumerate(expected_lines(content), 1)
    ]
    assert [(x.incarnation, x.line_no, x.text) for x in got] == want
