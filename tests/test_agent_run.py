"""The agent's loop and replay, on the HTTP endpoint, without a GPU."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import scrape_metrics

from ncclscope.agent.replay import ReplaySource
from ncclscope.agent.run import Agent, AgentConfig
from ncclscope.agent.telemetry import read_telemetry

REPO = Path(__file__).resolve().parent.parent
STALLED = REPO / "fixtures" / "stalled-227-ts" / "job.log"


class _Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_replay_of_a_hang_counts_down_to_the_timeout() -> None:
    clock = _Clock()
    source = ReplaySource([STALLED], speed=60.0, clock=clock)
    a = Agent(
        AgentConfig(listen="127.0.0.1:0", analyse_s=0.0, hostname="replay"),
        lines=source,
        wall=source.now,
    )
    a.start()
    assert a.bound is not None
    port = a.bound[1]
    clock.t = 5.0  # 5 s real = 300 s of the job at 60x: every line is out
    a.tick()
    assert source.done
    first = scrape_metrics(port)
    clock.t = 10.0
    a.tick()
    second = scrape_metrics(port)
    left = [k for k in first if k.startswith("ncclscope_timeout_remaining_seconds")]
    assert len(left) == 1
    assert second[left[0]] == pytest.approx(first[left[0]] - 300.0, abs=1.0)
    culprit = [k for k in second if k.startswith("ncclscope_timeout_culprit_info")]
    assert len(culprit) == 1
    assert 'rank="6"' in culprit[0]
    assert 'op="AllGather"' in culprit[0]
    # The collective's sequence number is a value, not a label (it changes with every
    # pending collective): one series per communicator.
    assert 'seq="' not in culprit[0]
    pending = [v for k, v in second.items() if k.startswith("ncclscope_pending_collective_seq{")]
    assert pending == [30.0]
    assert second['ncclscope_scrape_collector_success{collector="detect"}'] == 1.0
    a.finish()


@dataclass
class _Proc:
    pid: int
    name: str = "python"
    rss_bytes: int = 1 << 30
    cpu_seconds_total: float = 12.5


@dataclass
class _HostSample:
    memory_total_bytes: int = 64 << 30
    memory_available_bytes: int = 40 << 30
    swap_used_bytes: int = 0
    swap_in_bytes_total: int = 0
    swap_out_bytes_total: int = 0
    cpu_ratio: float = 0.25
    processes: list[_Proc] = field(default_factory=lambda: [_Proc(4242)])


class _Host:
    def sample(self) -> _HostSample:
        return _HostSample()


class _NoDriver:
    def start(self) -> str:
        return "no NVIDIA driver found: GPU metrics off; host and log metrics on"


def test_agent_without_a_driver_keeps_running(tmp_path: Path) -> None:
    out = tmp_path / "telemetry"
    textfile = tmp_path / "ncclscope.prom"
    a = Agent(
        AgentConfig(listen="127.0.0.1:0", interval_s=0.05, out=out, textfile=textfile),
        nvml=_NoDriver(),
        host=_Host(),
    )
    a.start()
    assert a.nvml_message is not None
    assert "no NVIDIA driver" in a.nvml_message
    stop = threading.Event()
    runner = threading.Thread(target=a.run, args=(stop,))
    runner.start()
    time.sleep(0.4)
    assert a.bound is not None
    values = scrape_metrics(a.bound[1])
    stop.set()
    start = time.monotonic()
    runner.join(timeout=5)
    assert time.monotonic() - start < 1.0  # stops within one wait
    assert values['ncclscope_scrape_collector_success{collector="nvml"}'] == 0.0
    assert values['ncclscope_scrape_collector_success{collector="host"}'] == 1.0
    assert values["ncclscope_host_memory_available_bytes"] == float(40 << 30)
    assert values['ncclscope_process_resident_memory_bytes{pid="4242"}'] == float(1 << 30)
    telemetry = read_telemetry([out])
    assert len(telemetry) > 0
    assert "ncclscope_host_memory_available_bytes" in set(telemetry["metric"].to_list())
    assert "ncclscope_host_memory_available_bytes" in textfile.read_text()


def test_analyze_prom_out_and_telemetry(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from click.testing import CliRunner

    from ncclscope.agent.telemetry import TelemetryWriter
    from ncclscope.cli import cli

    parts = tmp_path / "telemetry"
    writer = TelemetryWriter(parts, "node-1")
    key = ("0", "GPU-aa", "00000000:3B:00.0")
    for k, tx in enumerate([1e9, 20e9, 5e9]):
        writer.add(
            datetime(2025, 3, 14, 9, 0, k, tzinfo=UTC),
            {
                "ncclscope_gpu_memory_used_bytes": [(key, (60 + k) * 2**30)],
                "ncclscope_gpu_memory_total_bytes": [(key, 80 * 2**30)],
                "ncclscope_gpu_pcie_tx_bytes_per_second": [(key, tx)],
                "ncclscope_gpu_pcie_link_max_bytes_per_second": [(key, 31.5e9)],
                "ncclscope_host_memory_available_bytes": [((), (10 - k) * 2**30)],
            },
        )
        writer.flush()
    assert len(list(parts.glob("part-*.parquet"))) == 3
    prom = tmp_path / "job.prom"
    result = CliRunner().invoke(
        cli,
        ["analyze", str(STALLED), "--prom-out", str(prom), "--telemetry", str(parts)],
    )
    assert result.exit_code == 0, result.output
    assert "memory peak 62.0 of 80.0 GiB" in result.output
    assert "PCIe peak 20.0 GB/s (63% of the link)" in result.output
    assert "host memory available at least 8.0 GiB" in result.output
    text = prom.read_text()
    assert 'rank="6"' in text
    assert "ncclscope_timeout_culprit_info" in text


def test_agent_subprocess_follows_a_log_and_stops_on_sigterm(tmp_path: Path) -> None:
    """The real CLI: no driver here, host and log metrics on; SIGTERM stops it within a
    second with exit status 0 and a complete telemetry part on disk."""
    import re
    import signal
    import subprocess
    import sys

    log = tmp_path / "train.log"
    lines = STALLED.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:500]))
    out = tmp_path / "telemetry"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ncclscope", "agent", "--follow", str(log), "--from-start",
         "--listen", "127.0.0.1:0", "--interval", "0.1", "--analyse-every", "0.2",
         "--out", str(out)],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            m = re.search(r"serving http://127\.0\.0\.1:(\d+)/metrics", line)
            port = int(m.group(1)) if m else None
        assert port is not None
        with log.open("a") as fh:
            fh.write("".join(lines[500:]))
        values: dict[str, float] = {}
        while time.monotonic() < deadline:
            values = scrape_metrics(port)
            if any("ncclscope_timeout_culprit_info" in k for k in values):
                break
            time.sleep(0.2)
        assert values["ncclscope_log_lines_read_total"] == len(lines)
        culprit = [k for k in values if k.startswith("ncclscope_timeout_culprit_info")]
        assert culprit
        assert 'rank="6"' in culprit[0]
        assert values['ncclscope_scrape_collector_success{collector="host"}'] == 1.0
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
        assert time.monotonic() - start < 1.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    assert len(read_telemetry([out])) > 0


def test_a_gpu_that_falls_off_the_bus_is_reported_not_fatal() -> None:
    from ncclscope.agent.fake_nvml import FakeNvml
    from ncclscope.agent.nvml import NvmlCollector

    fake = FakeNvml.with_devices(2)
    a = Agent(AgentConfig(listen="127.0.0.1:0"), nvml=NvmlCollector(fake), host=_Host())  # type: ignore[arg-type]
    a.start()
    assert a.bound is not None
    a.tick()
    before = scrape_metrics(a.bound[1])
    assert any('gpu="1"' in k and "memory_used" in k for k in before)
    fake.lose(1)
    a.tick()
    a.tick()
    after = scrape_metrics(a.bound[1])
    assert not any('gpu="1"' in k and "memory_used" in k for k in after)
    assert any('gpu="0"' in k and "memory_used" in k for k in after)
    assert a.nvml.lost == [1]
    a.finish()


def test_parts_survive_sigkill(tmp_path: Path) -> None:
    """Parts are renamed into place whole: after SIGKILL every one on disk reads."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "telemetry"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ncclscope", "agent", "--fake-gpus", "4", "--listen", "none",
         "--interval", "0.1", "--out", str(out), "--part-seconds", "0.3"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(list(out.glob("part-*.parquet"))) < 3:
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    parts = sorted(out.glob("part-*.parquet"))
    assert len(parts) >= 3
    frame = read_telemetry([out])
    assert frame["metric"].n_unique() > 5
    assert (
        frame.filter(frame["metric"] == "ncclscope_gpu_memory_used_bytes")["labels"].n_unique() == 4
    )


def test_replay_serves_recorded_telemetry_as_its_clock_reaches_it(tmp_path: Path) -> None:
    from datetime import timedelta

    from ncclscope.agent.replay import TelemetryReplay, line_time
    from ncclscope.agent.telemetry import TelemetryWriter

    first = next(t for t in map(line_time, STALLED.read_text().splitlines()) if t is not None)
    parts = tmp_path / "telemetry"
    writer = TelemetryWriter(parts, "node-1")
    key = ("0", "GPU-aa", "00000000:3B:00.0")
    for k in range(4):
        writer.add(
            first + timedelta(seconds=60 * k),
            {"ncclscope_gpu_memory_used_bytes": [(key, float(k))],
             "ncclscope_host_memory_available_bytes": [((), 100.0 - k)]},
        )  # fmt: skip
    writer.flush()
    recorded = TelemetryReplay(read_telemetry([parts]))
    clock = _Clock()
    source = ReplaySource([STALLED], speed=60.0, clock=clock, start=recorded.first)
    a = Agent(AgentConfig(listen="127.0.0.1:0"), lines=source, wall=source.now, recorded=recorded)
    a.start()
    assert a.bound is not None
    clock.t = 1.5  # 90 s of the job: the first two samples
    a.tick()
    values = scrape_metrics(a.bound[1])
    used = 'ncclscope_gpu_memory_used_bytes{UUID="GPU-aa",gpu="0",pci_bus_id="00000000:3B:00.0"}'
    assert values[used] == 1.0
    assert values["ncclscope_host_memory_available_bytes"] == 99.0
    clock.t = 10.0
    a.tick()
    assert scrape_metrics(a.bound[1])[used] == 3.0
    a.finish()


def test_xid_errors_are_exported() -> None:
    from ncclscope.agent.fake_nvml import FakeNvml
    from ncclscope.agent.nvml import NvmlCollector

    fake = FakeNvml.with_devices(2)
    a = Agent(AgentConfig(listen="127.0.0.1:0"), nvml=NvmlCollector(fake))  # type: ignore[arg-type]
    a.start()
    assert a.bound is not None
    fake.inject_xid(1, 79)
    a.tick()
    values = scrape_metrics(a.bound[1])
    xid = [k for k in values if k.startswith("ncclscope_gpu_xid_errors_total")]
    assert len(xid) == 1
    assert 'gpu="1"' in xid[0]
    assert 'xid="79"' in xid[0]
    assert values[xid[0]] == 1.0
    a.finish()


def test_a_slow_detector_run_delays_neither_samples_nor_the_stop() -> None:
    """With the detectors in their own thread (the CLI's mode) a run that takes 3 s
    neither holds up the 50 ms sampling ticks nor a stop."""
    import threading

    class _Counting(_Host):
        def __init__(self) -> None:
            self.samples = 0

        def sample(self) -> _HostSample:
            self.samples += 1
            return super().sample()

    class _OneLine:
        """One line at the first poll: a window that changed once."""

        def __init__(self) -> None:
            self.given = False

        def poll(self) -> list[object]:
            if self.given:
                return []
            self.given = True
            return [SimpleNamespace(path="job.log", text="hello", arrived=datetime.now(UTC))]

    host = _Counting()
    a = Agent(
        AgentConfig(interval_s=0.05, analyse_s=0.0, detect_in_thread=True),
        host=host,
        lines=_OneLine(),  # type: ignore[arg-type]
    )
    started = threading.Event()

    def slow() -> bool:
        started.set()
        time.sleep(3.0)
        return True

    a._reference_once = slow  # type: ignore[method-assign]
    stop = threading.Event()
    runner = threading.Thread(target=a.run, args=(stop,))
    runner.start()
    assert started.wait(5)
    time.sleep(1.0)
    stop.set()
    t = time.monotonic()
    runner.join(5)
    assert not runner.is_alive()
    assert time.monotonic() - t < 0.5  # the stop did not wait for the 3 s run
    assert host.samples >= 12  # ~20 ticks of 50 ms in that second, not one
    assert a._detector is not None
    a._detector.join(5)  # the run ends by itself and removes the agent's folder
    assert not Path(a._workdir.name).exists()
