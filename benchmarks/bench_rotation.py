#!/usr/bin/env python3
"""Does the log follower lose or repeat lines when logrotate rotates the log under it?

Three processes, as in production:

* a writer appends numbered lines (``0000001234 node-6:5381:5381 [3] NCCL INFO
  AllGather: opCount 4d2 ...``) at ``--rate`` lines/s, one ``write`` every 10 ms, to
  the log opened with ``O_APPEND`` (as a shell's ``>>`` or Python's logging does); on
  SIGHUP it reopens the path (logrotate's ``postrotate``);
* a rotator does what logrotate does, ``--rotations`` times, every 0.5-1 s (random,
  seeded; ``--spacing``):

  - ``copytruncate``: shift ``log.N[.gz]`` to ``log.N+1``, ``shutil.copyfile`` the log
    to ``log.1``, truncate the log (the writer is not told and writes on, at the
    truncated file's start); lines written between the copy and the truncate are in
    neither file: logrotate itself loses them, and they are counted apart;
  - ``rename`` (``create``): shift, rename the log to ``log.1``, create a new log,
    SIGHUP the writer (it writes to the old file until it reopens);
  - ``delete``: delete the log, SIGHUP the writer, which creates it anew;

  ``--compress now`` gzips ``log.1`` at once (keeping its modification time, as gzip
  does), ``--compress delay`` gzips ``log.2`` (``delaycompress``);
* this process polls a ``Follower`` of the log every ``--poll`` s (the agent's interval,
  1 s) on a fixed monotonic schedule, as the agent does, with the agent's
  ``rotate_wait`` (5 s).

At the end the numbers received are compared with the numbers written: lost (split
into lost by the follower, and lost by the rotation itself: in no file at the end and
never readable: logrotate's copy-truncate window, or a file deleted before any poll
could open it), repeated, out of order, cut (a line whose end the truncate erased);
and which rotated copies the follower read.

Usage:
    .venv/bin/python benchmarks/bench_rotation.py --mode all            # ~2.5 min
    .venv/bin/python benchmarks/bench_rotation.py --mode copytruncate --compress now
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ncclscope.agent.follow import FollowedLine, Follower  # noqa: E402

#: One line; the number first, so that each file starts differently, as a job's do.
LINE = (
    "{seq:010d} node-6:5381:5381 [3] NCCL INFO AllGather: opCount {seq:x} sendbuff "
    "0x7f3a2c000000 recvbuff 0x7f3a2e000000 count 4096 datatype 9 op 0 root 0 comm "
    "0x55aa10c0ffee [nranks=16] stream 0x55aa10d00d00"
)
TICK_S = 0.01
MODES = ("copytruncate", "rename", "delete")


@dataclass
class Result:
    """What one mode's run gave (line counts unless said)."""

    mode: str
    written: int
    seconds: float
    late_ticks: int
    rotations: int
    received: int  # distinct complete lines
    lost: int
    lost_by_follower: int
    lost_by_rotation: int  # in no file and never readable (see the module docstring)
    duplicated: int
    out_of_order: int
    cut: int  # lines returned cut: their end erased by a truncate
    rests_read: int  # copies read from the read position after a truncate
    between_read: int  # files of rotations between two polls, read whole
    nothing_missing: int  # truncations whose copy ended before the read position
    unrecovered: int
    lines_recovered: int
    copies: list[str]  # names of the copies read
    polls: int
    cpu_s: float
    worst_poll_s: float


def writer(path: str, rate: float) -> None:
    """Append numbered lines at ``rate`` a second until SIGTERM, reopening the path on
    SIGHUP; print (JSON) what was written and when each file was opened."""
    state = {"reopen": False, "stop": False}
    signal.signal(signal.SIGHUP, lambda *_: state.update(reopen=True))
    signal.signal(signal.SIGTERM, lambda *_: state.update(stop=True))
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    fd = os.open(path, flags, 0o644)
    files = [{"opened": time.time(), "first": 0}]
    seq = late = 0
    start = time.monotonic()
    next_tick = start
    while not state["stop"]:
        if state["reopen"]:
            state["reopen"] = False
            os.close(fd)
            fd = os.open(path, flags, 0o644)
            files.append({"opened": time.time(), "first": seq})
        due = int(rate * (time.monotonic() - start)) - seq
        if due > 0:
            os.write(fd, "".join(LINE.format(seq=k) + "\n" for k in range(seq, seq + due)).encode())
            seq += due
        next_tick += TICK_S
        pause = next_tick - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        else:
            late += 1
    os.close(fd)
    elapsed = time.monotonic() - start
    print(json.dumps({"lines": seq, "seconds": elapsed, "late_ticks": late, "files": files}))


def _gzip(path: Path) -> None:
    """``gzip PATH``: PATH.gz with PATH's modification time, PATH removed."""
    mtime = path.stat().st_mtime_ns
    target = path.with_name(path.name + ".gz")
    with path.open("rb") as src, gzip.open(target, "wb", compresslevel=1) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.utime(target, ns=(mtime, mtime))
    path.unlink()


def rotator(
    path: str,
    mode: str,
    rotations: int,
    compress: str,
    pid: int,
    seed: int,
    spacing: tuple[float, float] = (0.5, 1.0),
) -> None:
    """Rotate ``path`` as logrotate does; print (JSON) when each file left the path."""
    log = Path(path)
    rng = random.Random(seed)
    shape = re.compile(re.escape(log.name) + r"\.(\d+)(\.gz)?")
    first, second = log.with_name(log.name + ".1"), log.with_name(log.name + ".2")
    events = []
    for _ in range(rotations):
        time.sleep(rng.uniform(*spacing))
        start = time.time()
        if mode != "delete":
            rotated = [
                (int(m[1]), m[2] or "", p)
                for p in log.parent.iterdir()
                if (m := shape.fullmatch(p.name))
            ]
            for n, gz, p in sorted(rotated, reverse=True):
                p.rename(log.with_name(f"{log.name}.{n + 1}{gz}"))
        if mode == "copytruncate":
            shutil.copyfile(log, first)
            os.truncate(log, 0)
            gone = time.time()
        elif mode == "rename":
            os.rename(log, first)
            gone = time.time()
            os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            os.kill(pid, signal.SIGHUP)
        else:
            os.unlink(log)
            gone = time.time()
            os.kill(pid, signal.SIGHUP)
        created = time.time()
        if mode != "delete" and compress == "now":
            _gzip(first)
        elif mode != "delete" and compress == "delay" and second.exists():
            _gzip(second)
        events.append({"start": start, "gone": gone, "created": created, "end": time.time()})
    print(json.dumps(events))


class _Messages(logging.Handler):
    """The follower's log messages (which rotated copies it read)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _seqs_in_files(folder: Path) -> set[int]:
    """Numbers of the complete lines in every file left in ``folder``."""
    found: set[int] = set()
    for path in folder.iterdir():
        data = (gzip.decompress if path.suffix == ".gz" else bytes)(path.read_bytes())
        for raw in data.split(b"\n"):
            text = raw.decode("utf-8", "replace")
            if text[:10].isdigit() and text == LINE.format(seq=int(text[:10])):
                found.add(int(text[:10]))
    return found


def _take(lines: Iterable[FollowedLine], received: list[int]) -> int:
    """Add the numbers of complete lines to ``received``; the count of cut ones."""
    cut = 0
    for x in lines:
        text = x.text
        if text[:10].isdigit() and text == LINE.format(seq=int(text[:10])):
            received.append(int(text[:10]))
        else:
            cut += 1
    return cut


def run_mode(mode: str, args: argparse.Namespace) -> Result:
    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        folder = Path(work) / "logs"
        folder.mkdir()
        path = str(folder / "rank3.log")
        Path(path).touch()
        follower = Follower([path], rotate_wait=args.rotate_wait)
        follower.poll()
        messages = _Messages()
        logger = logging.getLogger("ncclscope.agent.follow")
        logger.addHandler(messages)
        logger.setLevel(logging.INFO)
        me = [sys.executable, __file__]
        wproc = subprocess.Popen(
            [*me, "--writer", path, "--rate", str(args.rate)], stdout=subprocess.PIPE, text=True
        )
        how = ["--mode", mode, "--rotations", str(args.rotations), "--compress", args.compress,
               "--spacing", args.spacing]  # fmt: skip
        rproc = subprocess.Popen(
            [*me, "--rotator", path, *how, "--pid", str(wproc.pid), "--seed", str(args.seed)],
            stdout=subprocess.PIPE,
            text=True,
        )
        received: list[int] = []
        cut = 0
        polls: list[tuple[float, float]] = []
        cpu = worst = 0.0
        stopped_at: float | None = None
        quiet = 0
        next_poll = time.monotonic()
        while True:
            c0, w0, t0 = time.process_time(), time.monotonic(), time.time()
            lines = follower.poll()
            worst = max(worst, time.monotonic() - w0)
            cpu += time.process_time() - c0
            polls.append((t0, time.time()))
            cut += _take(lines, received)
            if stopped_at is None and rproc.poll() is not None:
                time.sleep(0.5)
                wproc.send_signal(signal.SIGTERM)
                wproc.wait()
                stopped_at = time.monotonic()
            quiet = 0 if lines else quiet + 1
            if stopped_at is not None and time.monotonic() - stopped_at > args.rotate_wait + 1:
                if quiet >= 2:
                    break
            next_poll += args.poll
            time.sleep(max(0.0, next_poll - time.monotonic()))
        cut += _take(follower.close(), received)
        logger.removeHandler(messages)
        wrote = json.loads(wproc.stdout.read() if wproc.stdout else "{}")
        events = json.loads(rproc.stdout.read() if rproc.stdout else "[]")
        in_files = _seqs_in_files(folder)
        stats = follower.stats

    n = wrote["lines"]
    counts = Counter(received)
    lost = set(range(n)) - counts.keys()
    nowhere = lost - in_files
    if mode == "copytruncate":
        # Everything the log held went into a copy, but for what was written between
        # logrotate's copy and its truncate.
        by_rotation = nowhere
    else:
        # Lines of files that were gone before any poll could open them, and are in no
        # file at the end (deleted, or compressed before the job had reopened the path).
        starts = [f["first"] for f in wrote["files"]] + [n]
        unseen: set[int] = set()
        for k, opened in enumerate(wrote["files"]):
            # rename: logrotate creates the new log; delete: the job does, reopening.
            created = (
                (events[k - 1]["created"] if mode == "rename" else opened["opened"]) if k else 0.0
            )
            gone = events[k]["gone"] if k < len(events) else float("inf")
            if not any(created <= t0 <= gone for t0, _ in polls):
                unseen.update(range(starts[k], starts[k + 1]))
        by_rotation = nowhere & unseen
    rests = [m for m in messages.messages if "reading the rest from its rotated copy" in m]
    between = [m for m in messages.messages if "more than once between two polls" in m]
    return Result(
        mode=mode,
        written=n,
        seconds=wrote["seconds"],
        late_ticks=wrote["late_ticks"],
        rotations=len(events),
        received=len(counts),
        lost=len(lost),
        lost_by_follower=len(lost - by_rotation),
        lost_by_rotation=len(by_rotation),
        duplicated=sum(c - 1 for c in counts.values()),
        out_of_order=sum(b < a for a, b in itertools.pairwise(received)),
        cut=cut,
        rests_read=len(rests),
        between_read=len(between),
        nothing_missing=sum("nothing is missing" in m for m in messages.messages),
        unrecovered=stats.unrecovered,
        lines_recovered=stats.lines_recovered,
        copies=sorted(
            {Path(m.rsplit(" ", 1)[-1]).name for m in rests}
            | {Path(m.split("reading ", 1)[1].split(",", 1)[0]).name for m in between}
        ),
        polls=len(polls),
        cpu_s=cpu,
        worst_poll_s=worst,
    )


def report(r: Result, args: argparse.Namespace) -> bool:
    met = r.lost_by_follower == 0 and r.duplicated == 0 and r.out_of_order == 0
    print(
        f"{r.mode} (compress {args.compress}): {r.written:,} lines written in "
        f"{r.seconds:.1f} s ({r.late_ticks} late 10 ms ticks), {r.rotations} rotations"
    )
    print(
        f"  received {r.received:,}; lost {r.lost:,} = by the follower {r.lost_by_follower:,}"
        f" + by the rotation itself {r.lost_by_rotation:,}; duplicated {r.duplicated:,}; "
        f"out of order {r.out_of_order:,}; cut {r.cut}"
    )
    shown = ", ".join(r.copies[:4]) + (
        f", ... ({len(r.copies)} names)" if len(r.copies) > 4 else ""
    )
    print(
        f"  copies read: {r.rests_read} rests after a truncate, {r.between_read} whole files "
        f"rotated between two polls; {r.nothing_missing} truncations with nothing missing, "
        f"{r.unrecovered} unrecovered; {r.lines_recovered:,} lines recovered "
        f"({shown or 'none'})"
    )
    print(
        f"  {r.polls} polls every {args.poll} s: {r.cpu_s:.2f} s CPU in poll(), "
        f"slowest poll {r.worst_poll_s * 1e3:.0f} ms"
    )
    verdict = "met" if met else "NOT met"
    print(f"  target (0 lost by the follower, 0 duplicated, in order): {verdict}")
    return met


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=10_000.0, help="lines/s the writer appends")
    parser.add_argument("--rotations", type=int, default=50)
    parser.add_argument(
        "--spacing", default="0.5,1.0", metavar="LO,HI",
        help="seconds between two rotations, drawn from LO to HI (default 0.5,1.0)",
    )  # fmt: skip
    parser.add_argument("--mode", choices=[*MODES, "all"], default="all")
    parser.add_argument("--compress", choices=["none", "now", "delay"], default="none")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between polls")
    parser.add_argument("--rotate-wait", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--dir", default=None, help="where the logs are written (a temp dir)")
    parser.add_argument("--writer", metavar="PATH", help=argparse.SUPPRESS)
    parser.add_argument("--rotator", metavar="PATH", help=argparse.SUPPRESS)
    parser.add_argument("--pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.writer:
        writer(args.writer, args.rate)
        return 0
    if args.rotator:
        lo, hi = (float(x) for x in args.spacing.split(","))
        rotator(
            args.rotator, args.mode, args.rotations, args.compress, args.pid, args.seed, (lo, hi)
        )
        return 0
    modes = MODES if args.mode == "all" else (args.mode,)
    results = [report(run_mode(mode, args), args) for mode in modes]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
