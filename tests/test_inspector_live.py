"""The agent following NCCL Inspector output (issue #18): the measured bus bandwidth per op
and size bucket is exported from the window, bounded; none without Inspector records."""

from __future__ import annotations

import shutil
import statistics
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ncclscope.agent.live import LiveWindow, job_rows

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "inspector"
METRIC = "ncclscope_collective_bus_bandwidth_bytes_per_second"


def _rows(job: Path, tmp: Path) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    window = LiveWindow(tmp / "window")
    t = datetime(2026, 1, 1, tzinfo=UTC)
    try:
        for path in sorted(job.glob("*.log")):
            for text in path.read_text().splitlines():
                window.add([(str(path), text, t)])
                t += timedelta(microseconds=100)
        d = window.analyse(tmp / "live", now=t)
        assert d is not None
        return job_rows(d, t)
    finally:
        window.close()


def test_the_window_exports_inspector_bus_bandwidth(tmp_path: Path) -> None:
    rows = dict(_rows(FIXTURE, tmp_path)[METRIC])
    assert rows  # every Inspector record has an op, a size and a bus bandwidth
    ops = {op for op, _bucket in rows}
    assert "AllGather" in ops
    assert all(int(b) & (int(b) - 1) == 0 for _op, b in rows)  # powers of two
    assert len(rows) <= len(ops) * 41
    # The 4 MiB all-gathers of the fixture: the median of what Inspector measured.
    import json

    measured = [
        json.loads(line)["coll_perf"]["coll_busbw_gbs"] * 1e9
        for path in FIXTURE.glob("gpu-*.log")
        for line in path.read_text().splitlines()
        if '"coll":"AllGather"' in line and '"coll_msg_size_bytes":4194304' in line
    ]
    assert measured
    assert rows[("AllGather", str(4194304))] == statistics.median(measured)


def test_no_inspector_output_no_bandwidth(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(FIXTURE / "train.log", job / "train.log")
    assert METRIC not in _rows(job, tmp_path)
