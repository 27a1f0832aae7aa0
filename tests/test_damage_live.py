"""The live path with damaged lines: the agent stays up, counts them, /metrics answers.

Lines that would have crashed ``analyze`` (a number no column holds, in the header and
in a record), binary junk, a giant line and two lines spliced are appended to a file the
real CLI's agent follows; every scrape during and after must answer, the detectors'
collector must keep succeeding, and the damaged lines must show in
``ncclscope_log_window_lines_damaged``.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import scrape_metrics

REPO = Path(__file__).resolve().parent.parent
STALLED = REPO / "fixtures" / "stalled-227-ts" / "job.log"
COLL = (
    "[2025-03-14 09:00:09.387136] node-1:{pid}:{pid} [3] NCCL INFO AllGather: opCount {op} "
    "sendbuff 0x7f3a4c000000 recvbuff 0x7f3a4e000000 count {count} datatype 7 op 0 root 0 "
    "comm 0x55d4c8a0 [nranks={nranks}] stream 0x55d4c9b0"
)
BIG = "99999999999999999999"

#: Lines no grammar can read: each counts as damaged (malformed, binary or too long).
DAMAGED = [
    COLL.format(pid=BIG, op="1a", count=4096, nranks=8),
    COLL.format(pid=5381, op="f" * 24, count=4096, nranks=8),
    COLL.format(pid=5381, op="1a", count=BIG, nranks=8),
    COLL.format(pid=5381, op="1a", count=4096, nranks=BIG),
    f"[2025-03-14 09:00:09.4] node-1:5381:5381 [3] NCCL INFO Channel {BIG}/0 : "
    "0[0] -> 1[1] via P2P/IPC",
    f"node-1:5381:5381 [3] NCCL INFO comm 0x55d4c8a0 rank {BIG} nranks 8 cudaDev 3 "
    "busId 1b000 - Init COMPLETE",
    "\x00\x01\x02\xfe binary \x07\x08 junk \x1f",
    # A giant line is cut, and counted as damage (too long: the catalog's definition).
    "x" * 300_000,
]
#: A line that is not damage: two lines spliced, repaired into the record they hold.
OTHER = [
    COLL.format(pid=5381, op="1b", count=4096, nranks=8)[:70]
    + COLL.format(pid=5382, op="1c", count=4096, nranks=8),
]


def test_agent_counts_damaged_lines_and_keeps_answering(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    lines = STALLED.read_text().splitlines(keepends=True)[:300]
    log.write_text("".join(lines))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ncclscope", "agent", "--follow", str(log), "--from-start",
         "--listen", "127.0.0.1:0", "--interval", "0.1", "--analyse-every", "0.2"],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            m = re.search(r"serving http://127\.0\.0\.1:(\d+)/metrics", proc.stderr.readline())
            port = int(m.group(1)) if m else None
        assert port is not None

        def settled(want_lines: int, damaged: float = 0.0) -> dict[str, float]:
            """Once the agent read ``want_lines`` lines and an analysis counted at least
            ``damaged`` damaged lines (the analysis runs in a process of its own: how
            long it takes is the machine's, so the test waits for what it says)."""
            values: dict[str, float] = {}
            limit = time.monotonic() + 60
            while time.monotonic() < limit:
                values = scrape_metrics(port)
                if (
                    values.get("ncclscope_log_lines_read_total") == want_lines
                    and values.get("ncclscope_log_window_lines_damaged", -1.0) >= damaged
                ):
                    return values
                time.sleep(0.1)
            raise AssertionError(
                f"the agent did not read {want_lines} lines and count {damaged} damaged: {values}"
            )

        before = settled(len(lines))
        # The lines that are not damage first: an analysis that counts every damaged
        # line (the last written) has read them too, so the count is exact.
        with log.open("ab") as fh:
            for text in OTHER + DAMAGED:
                fh.write(text.encode("utf-8", "surrogateescape") + b"\n")
                fh.flush()
                time.sleep(0.05)
                scrape_metrics(port)  # answers between appends too
        was = before["ncclscope_log_window_lines_damaged"]
        after = settled(len(lines) + len(DAMAGED) + len(OTHER), was + len(DAMAGED))
        assert proc.poll() is None, "the agent stopped"
        grew = after["ncclscope_log_window_lines_damaged"] - was
        # Each damaged line counted once, and the repaired splice not counted as damage.
        assert grew == len(DAMAGED), after
        assert after['ncclscope_scrape_collector_success{collector="logs"}'] == 1.0
        assert after['ncclscope_scrape_collector_success{collector="detect"}'] == 1.0
        assert after["ncclscope_log_window_lines_unparsed"] >= grew
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
