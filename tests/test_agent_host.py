"""The host sampler against the real psutil: this test process, and child processes it starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import psutil
import pytest

from ncclscope.agent.host import FULL_SCAN_EVERY, HostCollector, HostSample

Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start sleeping child processes; every one is killed and reaped at the end."""
    children: list[subprocess.Popen[bytes]] = []

    def start(*extra: str) -> subprocess.Popen[bytes]:
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)", *extra],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        children.append(child)
        return child

    yield start
    for child in children:
        child.kill()
        child.wait()


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def wait_for_cmdline(pid: int, marker: str) -> None:
    """Until the child has exec'd python with its arguments (cmdline is set at exec)."""
    wait_until(lambda: marker in " ".join(psutil.Process(pid).cmdline()))


def pids_in(sample: HostSample) -> list[int]:
    return [p.pid for p in sample.processes]


def burn_cpu(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        sum(range(1000))


def test_host_values_are_sane() -> None:
    host = HostCollector()
    burn_cpu(0.05)

    sample = host.sample()

    assert sample.memory_total_bytes > 0
    assert 0 < sample.memory_available_bytes <= sample.memory_total_bytes
    assert sample.swap_used_bytes >= 0
    assert sample.swap_in_bytes_total >= 0
    assert sample.swap_out_bytes_total >= 0
    assert sample.cpu_ratio is not None
    assert 0 < sample.cpu_ratio <= 1  # this process was busy since construction
    assert sample.processes == ()


def test_cpu_ratio_is_per_collector_and_non_blocking() -> None:
    host = HostCollector()
    psutil.cpu_percent(interval=None)  # another caller does not disturb it
    burn_cpu(0.05)

    started = time.perf_counter()
    ratio = host.sample().cpu_ratio
    elapsed = time.perf_counter() - started

    assert ratio is not None
    assert 0 < ratio <= 1
    assert elapsed < 0.05  # no interval sleep


def test_this_process_by_pid() -> None:
    host = HostCollector([os.getpid()])

    first = host.sample().processes
    burn_cpu(0.2)
    second = host.sample().processes

    assert pids_in(host.sample()) == [os.getpid()]
    (before,), (after,) = first, second
    assert before.pid == os.getpid()
    assert before.name == psutil.Process().name()
    assert before.rss_bytes is not None
    assert before.rss_bytes > 0
    assert before.cpu_seconds_total is not None
    assert after.cpu_seconds_total is not None
    assert after.cpu_seconds_total >= before.cpu_seconds_total + 0.15


def test_match_by_command_line_substring(spawn: Spawn) -> None:
    marker = f"ncclscope-test-{uuid.uuid4().hex}"
    children = [spawn(marker), spawn(marker)]
    unrelated = spawn("something-else")
    for child in children:
        wait_for_cmdline(child.pid, marker)
    host = HostCollector(match=marker)

    sample = host.sample()

    assert pids_in(sample) == sorted(c.pid for c in children)
    assert unrelated.pid not in pids_in(sample)
    assert all(p.rss_bytes and p.rss_bytes > 0 for p in sample.processes)
    assert all(p.name and p.name.startswith("python") for p in sample.processes)


def test_match_never_follows_the_agent_itself() -> None:
    own_cmdline = " ".join(psutil.Process().cmdline())
    host = HostCollector(match=own_cmdline)

    assert os.getpid() not in pids_in(host.sample())


def test_match_rescans_only_on_schedule(spawn: Spawn) -> None:
    marker = f"ncclscope-test-{uuid.uuid4().hex}"
    now = [1000.0]
    host = HostCollector(match=marker, rescan_interval_s=5.0, clock=lambda: now[0])
    assert host.sample().processes == ()

    child = spawn(marker)
    wait_for_cmdline(child.pid, marker)
    now[0] += 4.9
    not_yet = host.sample()
    now[0] += 0.2
    found = host.sample()

    assert not_yet.processes == ()
    assert pids_in(found) == [child.pid]


def test_a_process_that_execs_into_a_match_is_found_by_the_next_full_scan() -> None:
    marker = f"ncclscope-test-{uuid.uuid4().hex}"
    script = f'sleep 0.3; exec "{sys.executable}" -c "import time; time.sleep(60)" "$MARK"'
    child = subprocess.Popen(
        ["bash", "-c", script], env={**os.environ, "MARK": marker}, stdin=subprocess.DEVNULL
    )
    try:
        now = [0.0]
        host = HostCollector(match=marker, rescan_interval_s=5.0, clock=lambda: now[0])
        assert host.sample().processes == ()  # scan 1 (full): bash, no marker yet
        wait_for_cmdline(child.pid, marker)
        found = []
        for _ in range(FULL_SCAN_EVERY):
            now[0] += 5.0
            found.append(child.pid in pids_in(host.sample()))
    finally:
        child.kill()
        child.wait()

    assert found == [False] * (FULL_SCAN_EVERY - 1) + [True]


def test_vanished_pid_disappears_without_error(spawn: Spawn) -> None:
    reaped, zombie, stays = spawn(), spawn(), spawn()
    host = HostCollector([reaped.pid, zombie.pid, stays.pid, os.getpid()])
    assert pids_in(host.sample()) == sorted([reaped.pid, zombie.pid, stays.pid, os.getpid()])

    reaped.kill()
    reaped.wait()
    zombie.kill()  # exited but not reaped yet (the fixture reaps it): a zombie
    wait_until(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE)
    sample = host.sample()

    assert pids_in(sample) == sorted([stays.pid, os.getpid()])
    assert host.pids == sorted([stays.pid, os.getpid()])
    assert pids_in(host.sample()) == sorted([stays.pid, os.getpid()])


def test_set_pids_later_and_unknown_pids(spawn: Spawn) -> None:
    gone = spawn()
    gone.kill()
    gone.wait()
    child = spawn()
    host = HostCollector()
    assert host.sample().processes == ()

    host.set_pids([child.pid, child.pid, gone.pid])
    followed = pids_in(host.sample())
    host.set_pids([])
    none_left = host.sample().processes

    assert followed == [child.pid]
    assert none_left == ()


def test_many_ticks_keep_cached_processes(spawn: Spawn) -> None:
    children = [spawn() for _ in range(4)]
    host = HostCollector([c.pid for c in children])

    samples = [host.sample() for _ in range(20)]

    assert all(pids_in(s) == sorted(c.pid for c in children) for s in samples)
    assert all(p.cpu_seconds_total is not None for s in samples for p in s.processes)
