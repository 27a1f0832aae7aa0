#!/usr/bin/env python3
"""Can the log follower keep up with a job writing 50 MB/s, within 1 s of each append?

A writer process appends NCCL COLL lines to one file at ``--rate`` MB/s for
``--seconds`` s, in one write every 10 ms; each line starts with the writer's
``time.time()`` at that write (``[1732363200.123456] node-6:5381:5381 [3] NCCL INFO
AllGather: opCount ...``, the shape NCCL 2.26+ prints with
``NCCL_DEBUG_TIMESTAMP_FORMAT=[%s.%6f]``).  Meanwhile this process polls a
``Follower`` every ``--interval`` s on a fixed monotonic schedule and reports:

* throughput: bytes the follower returned as lines per second of the run, and whether
  every line the writer wrote came back, in order;
* CPU share: CPU seconds spent inside ``poll()`` per wall second (one core = 100%),
  and the share of wall time ``poll()`` was busy; rate / busy share is what one core
  could follow;
* lag: from the write that appended a line to the ``poll()`` that returned it (max,
  p99, median over the first line of every poll, the oldest one it returned);
* baseline, measured in the same run on the same file: ``tail -c +1 -F FILE >
  /dev/null`` (GNU tail), its CPU share from ``wait4``.

Then a catch-up pass: a fresh follower reads the whole file from its start with the
default budget (64 MiB a poll), polled back to back: MB/s of one core when behind.

Usage:
    .venv/bin/python benchmarks/bench_follow.py                  # 50 MB/s for 20 s
    .venv/bin/python benchmarks/bench_follow.py --rate 100 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ncclscope.agent.follow import Follower  # noqa: E402
from ncclscope.agent.live import LiveWindow  # noqa: E402

#: One COLL line after the timestamp; ``{seq:x}`` is the opCount, counting every line.
LINE = (
    "node-6:5381:5381 [3] NCCL INFO AllGather: opCount {seq:x} sendbuff 0x7f3a2c000000 "
    "recvbuff 0x7f3a2e000000 count 4096 datatype 9 op 0 root 0 comm 0x55aa10c0ffee "
    "[nranks=16] stream 0x55aa10d00d00\n"
)
TICK_S = 0.01


def writer(path: str, rate_mb: float, seconds: float) -> None:
    """Append lines at ``rate_mb`` MB/s for ``seconds``; print what was written (JSON)."""
    rate = rate_mb * 1e6
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    seq = written = writes = late = 0
    start = time.monotonic()
    next_tick = start
    while (now := time.monotonic()) - start < seconds:
        due = rate * (now - start) - written
        if due > 0:
            stamp = f"[{time.time():.6f}] "
            parts = []
            size = 0
            while size < due:
                line = stamp + LINE.format(seq=seq)
                parts.append(line)
                size += len(line)
                seq += 1
            data = "".join(parts).encode()
            os.write(fd, data)
            written += len(data)
            writes += 1
        next_tick += TICK_S
        pause = next_tick - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        else:
            late += 1
    os.close(fd)
    elapsed = time.monotonic() - start
    print(json.dumps({"lines": seq, "bytes": written, "seconds": elapsed, "late_ticks": late}))


def opcount(text: str) -> int:
    return int(text.split("opCount ", 1)[1].split(" ", 1)[0], 16)


def follow(
    path: str, interval: float, proc: subprocess.Popen[str], window: LiveWindow | None = None
) -> dict[str, float]:
    """Poll a follower until the writer is done and everything it wrote came back; with
    ``window``, each poll's lines also go into the agent's live window (stamped: the
    writer's epoch times are not a form NCCL's INFO timestamps take), as the agent does,
    and the lag runs to the end of that."""
    follower = Follower([path], from_start=True)
    lags: list[float] = []
    expect_seq = 0
    in_order = True
    returned_bytes = 0
    cpu = busy = 0.0
    polls = 0
    start = time.monotonic()
    next_poll = start
    writer_done = False
    while True:
        c0, w0 = time.process_time(), time.monotonic()
        lines = follower.poll()
        if window is not None:
            window.add((x.path, x.text, x.arrived) for x in lines)
        w1 = time.monotonic()
        cpu += time.process_time() - c0
        busy += w1 - w0
        polls += 1
        returned = time.time()
        if lines:
            first = lines[0].text
            lags.append(returned - float(first[1 : first.index("]")]))
            # Every line counted, so the first and last opCount of a poll check the order.
            in_order &= [opcount(lines[0].text), opcount(lines[-1].text)] == [
                expect_seq,
                expect_seq + len(lines) - 1,
            ]
            expect_seq += len(lines)
            returned_bytes += sum(len(x.text) for x in lines) + len(lines)
        if writer_done and not lines:
            break
        writer_done = writer_done or proc.poll() is not None
        next_poll += interval
        time.sleep(max(0.0, next_poll - time.monotonic()))
    wall = time.monotonic() - start
    follower.close()
    lags.sort()
    return {
        "wall_s": wall,
        "polls": polls,
        "lines": expect_seq,
        "in_order": in_order,
        "returned_bytes": returned_bytes,
        "bytes_read": follower.stats.bytes_read,
        "cpu_s": cpu,
        "busy_s": busy,
        "lag_max_s": lags[-1] if lags else float("nan"),
        "lag_p99_s": lags[int(0.99 * (len(lags) - 1))] if lags else float("nan"),
        "lag_median_s": statistics.median(lags) if lags else float("nan"),
    }


def catch_up(path: str) -> dict[str, float]:
    follower = Follower([path], from_start=True)
    c0, w0 = time.process_time(), time.monotonic()
    lines = 0
    while batch := follower.poll():
        lines += len(batch)
    wall, cpu = time.monotonic() - w0, time.process_time() - c0
    size = follower.stats.bytes_read
    follower.close()
    return {"lines": lines, "bytes": size, "wall_s": wall, "cpu_s": cpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=50.0, help="MB/s the writer appends")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between polls")
    parser.add_argument("--dir", default=None, help="where the log is written (a temp dir)")
    parser.add_argument(
        "--window", action="store_true", help="also feed the agent's live window, stamping"
    )
    parser.add_argument("--writer", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.writer:
        writer(args.writer, args.rate, args.seconds)
        return 0

    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        path = str(Path(work) / "rank3.log")
        Path(path).touch()
        tail = subprocess.Popen(
            ["tail", "-c", "+1", "-F", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        cmd = [sys.executable, __file__, "--writer", path, "--rate", str(args.rate)]
        proc = subprocess.Popen(
            [*cmd, "--seconds", str(args.seconds)], stdout=subprocess.PIPE, text=True
        )
        window = LiveWindow(Path(work) / "window") if args.window else None
        got = follow(path, args.interval, proc, window)
        if window is not None:
            window.close()
            print(f"live window: {window.lines:,} lines held, stamped: {window.own_times is False}")
        out, _ = proc.communicate()
        wrote = json.loads(out)
        time.sleep(0.5)  # let tail reach the end too
        tail.send_signal(signal.SIGTERM)
        _, _, usage = os.wait4(tail.pid, 0)
        tail.returncode = 0  # reaped by wait4
        tail_cpu = usage.ru_utime + usage.ru_stime
        catch = catch_up(path)

    run_s = wrote["seconds"]
    mb = 1e6
    print(f"writer: {wrote['bytes'] / mb:.0f} MB, {wrote['lines']:,} lines in {run_s:.1f} s ")
    print(f"  = {wrote['bytes'] / mb / run_s:.1f} MB/s ({wrote['late_ticks']} late 10 ms ticks)")
    complete = got["lines"] == wrote["lines"] and got["bytes_read"] == wrote["bytes"]
    print(
        f"follower: {got['lines']:,} lines, {got['returned_bytes'] / mb:.0f} MB returned, "
        f"all lines back: {complete}, in order: {got['in_order']}"
    )
    print(f"  throughput  {got['returned_bytes'] / mb / run_s:.1f} MB/s over the writer's run")
    cpu_share = got["cpu_s"] / got["wall_s"]
    busy_share = got["busy_s"] / got["wall_s"]
    print(
        f"  CPU share   {cpu_share:.1%} of one core inside poll() "
        f"(busy {busy_share:.1%} of wall time, {got['polls']} polls every {args.interval} s)"
    )
    print(f"  one core    ~{wrote['bytes'] / mb / run_s / busy_share:.0f} MB/s at this busy share")
    print(
        f"  lag         max {got['lag_max_s']:.3f} s, p99 {got['lag_p99_s']:.3f} s, "
        f"median {got['lag_median_s']:.3f} s (append -> poll() returned it)"
    )
    print(
        f"baseline tail -F: CPU share {tail_cpu / got['wall_s']:.1%}; "
        f"follower / tail CPU: {got['cpu_s'] / tail_cpu:.1f}x"
        if tail_cpu > 0
        else "baseline tail -F: no CPU time measured"
    )
    print(
        f"catch-up from the start: {catch['bytes'] / mb:.0f} MB in {catch['wall_s']:.2f} s = "
        f"{catch['bytes'] / mb / catch['wall_s']:.0f} MB/s "
        f"({catch['bytes'] / mb / catch['cpu_s']:.0f} MB per CPU second)"
    )
    targets_met = complete and got["in_order"] and got["lag_max_s"] <= 1.0
    verdict = "met" if targets_met else "NOT met"
    print(f"target (keeps up with {args.rate:g} MB/s, lag <= 1 s): {verdict}")
    return 0 if targets_met else 1


if __name__ == "__main__":
    sys.exit(main())
