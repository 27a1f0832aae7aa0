#!/usr/bin/env python3
"""What the agent costs a node at rest and under a heavy log rate, against node_exporter.

``idle``: the agent follows a log that received two NCCL lines and then rests, scraped
once a second, beside node_exporter (``prometheus-node-exporter``, Debian) scraped the
same way in the same run; the CPU share of one core of each process and the agent's RSS
over ``--seconds`` after a warm-up.

The agent's CPU counts its analysis processes (``agent.reference``: the kernel's account
of the children it waited for); their peak RSS is the one the agent exports
(``ncclscope_analysis_max_rss_bytes``), printed beside the agent's own.

``rate``: 8 per-rank logs of one node written at ``--rate`` lines a second (a DeepSpeed
ZeRO-3 job's NCCL and DeepSpeed lines written by ``ncclscope synth``, each line's time
rewritten to the moment it is written), the agent following them with ``--interval 1``
and scraped once a second.  After ``--seconds`` rank 3 stops (the job was written with
``--stop-rank``): the other ranks enter the next collective and wait.  Measured: the
agent's CPU share and RSS while the lines flow, and the delay from the stall's start
(the writer's last line) to the first scrape whose ``ncclscope_timeout_culprit_info``
names rank 3.

Usage:
    .venv/bin/python benchmarks/bench_agent_load.py idle --seconds 60
    .venv/bin/python benchmarks/bench_agent_load.py rate --rate 2400 --seconds 60
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
AGENT = [sys.executable, "-m", "ncclscope", "agent"]
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
_HZ = os.sysconf("SC_CLK_TCK")

_NCCL_TS = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6})\] ")
_DS_TS = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and of its children it waited for (the agent's analysis
    processes: their CPU is the agent's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / _HZ


def _analysis_mb(text: str) -> str:
    """The peak RSS of the agent's last analysis process, as it exports it."""
    m = re.search(r"^ncclscope_analysis_max_rss_bytes (\S+)$", text, re.M)
    return f"{float(m[1]) / 2**20:.0f} MB" if m else "none reported"


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _get(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return str(r.read().decode())
    except OSError:
        return ""


def _wait_up(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _get(port):
            return
        time.sleep(0.2)
    raise SystemExit(f"nothing answers on port {port}")


def _agent(follow: str, port: int, log: Path, extra: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*AGENT, "--follow", follow, "--listen", f"127.0.0.1:{port}", "--interval", "1",
         "--sysfs-root", "none", *extra],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=REPO,
    )  # fmt: skip


def idle(seconds: float, warmup: float) -> None:
    work = Path(tempfile.mkdtemp(prefix="ncclscope-idle-"))
    log = work / "rank0.log"
    log.write_text(
        "[2026-11-27 12:00:00.000001] node-0:41:41 [0] NCCL INFO comm 0x55 rank 0 nranks 1 "
        "cudaDev 0 nvmlDev 0 busId 18000 commId 0x1234 - Init COMPLETE\n"
        "[2026-11-27 12:00:00.100001] node-0:41:41 [0] NCCL INFO AllReduce: opCount 0 "
        "sendbuff 0x7f00 recvbuff 0x7f80 count 4 datatype 7 op 0 root 0 comm 0x55 "
        "[nranks=1] stream 0x56\n"
    )
    a_port, n_port = _port(), _port()
    agent = subprocess.Popen(
        [*AGENT, "--follow", str(log), "--from-start", "--listen", f"127.0.0.1:{a_port}",
         "--interval", "1", "--sysfs-root", "none"],
        stdout=(work / "agent.log").open("wb"), stderr=subprocess.STDOUT, cwd=REPO,
    )  # fmt: skip
    ne = None
    if Path(NODE_EXPORTER).exists():
        ne = subprocess.Popen(
            [NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{n_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        _wait_up(a_port)
        if ne is not None:
            _wait_up(n_port)
        end_warm = time.monotonic() + warmup
        while time.monotonic() < end_warm:
            _get(a_port)
            if ne is not None:
                _get(n_port)
            time.sleep(1)
        a0, n0, t0 = _cpu_s(agent.pid), _cpu_s(ne.pid) if ne else 0.0, time.monotonic()
        rss = []
        text = ""
        while time.monotonic() - t0 < seconds:
            text = _get(a_port) or text
            if ne is not None:
                _get(n_port)
            rss.append(_status_kb(agent.pid, "VmRSS"))
            time.sleep(1)
        span = time.monotonic() - t0
        a = 100 * (_cpu_s(agent.pid) - a0) / span
        print(f"idle, {span:.0f} s after a {warmup:.0f} s warm-up, one scrape a second each")
        print(f"  ncclscope agent: {a:.2f}% of a core, RSS {max(rss) / 1024:.0f} MB "
              f"(VmHWM {_status_kb(agent.pid, 'VmHWM') / 1024:.0f} MB); "
              f"its last analysis process's peak RSS {_analysis_mb(text)}")  # fmt: skip
        if ne is not None:
            n = 100 * (_cpu_s(ne.pid) - n0) / span
            print(f"  node_exporter:   {n:.2f}% of a core; agent / node_exporter {a / n:.2f}x")
    finally:
        for p in (agent, ne):
            if p is not None:
                p.terminate()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)


def _job(work: Path, rate: float, seconds: float) -> list[tuple[int, str]]:
    """The job's lines in write order, (file index, text), through the stall."""
    steps = max(20, int(rate * (seconds + 20) / 120))
    out = work / "job"
    subprocess.run(
        [sys.executable, "-m", "ncclscope", "synth", "--out", str(out), "--ranks", "8",
         "--hosts", "1", "--steps", str(steps), "--layers", "8", "--seed", "25",
         "--timestamps", "--era", "2.27", "--layout", "per-rank", "--framework", "deepspeed",
         "--zero-stage", "3", "--steps-per-print", "1",
         "--stop-rank", f"3:{int(steps * 15 * 0.9)}"],
        check=True, capture_output=True, cwd=REPO,
    )  # fmt: skip
    timed: list[tuple[str, int, int, str]] = []
    files = sorted(p for p in out.glob("*.log") if "NCCL" in p.read_text()[:20000])
    for k, path in enumerate(files):
        last = ""
        for n, text in enumerate(path.read_text().splitlines()):
            m = _NCCL_TS.search(text) or _DS_TS.search(text)
            last = m[1] if m else last
            timed.append((last, n, k, text))
    timed.sort()
    # Up to the stall: the watchdog's lines come half an hour later in the job's time.
    lines = [(k, text) for _t, _n, k, text in timed if "Watchdog" not in text]
    cut = next((i for i, (_k, t) in enumerate(lines) if "Timeout(ms)" in t), len(lines))
    return lines[:cut]


def _writer(folder: Path, lines: list[tuple[int, str]], rate: float) -> float:
    """Write ``lines`` at ``rate`` a second, each time rewritten to now; returns the wall
    time of the last line (the stall starts there)."""
    handles = [(folder / f"rank{k}.log").open("a") for k in range(8)]
    start = time.time()
    last = start
    for i, (k, text) in enumerate(lines):
        due = start + i / rate
        if i % 24 == 0:
            for h in handles:
                h.flush()
            pause = due - time.time()
            if pause > 0:
                time.sleep(pause)
        now = time.time()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(now))
        micro = int((now % 1) * 1e6)
        text = _NCCL_TS.sub(f"[{stamp}.{micro:06d}] ", text, count=1)
        text = _DS_TS.sub(f"[{stamp},{micro // 1000:03d}]", text, count=1)
        handles[k].write(text + "\n")
        last = now
    for h in handles:
        h.close()
    return last


def _collector_cpu(text: str) -> dict[str, float]:
    found = re.findall(r'ncclscope_sample_cpu_seconds_total\{collector="(\w+)"\} (\S+)', text)
    return {name: float(value) for name, value in found}


def rate_mode(rate: float, seconds: float, extra: list[str]) -> None:
    work = Path(tempfile.mkdtemp(prefix="ncclscope-rate-"))
    lines = _job(work, rate, seconds)
    logs = work / "logs"
    logs.mkdir()
    for k in range(8):
        (logs / f"rank{k}.log").touch()
    port = _port()
    agent = _agent(str(logs / "*.log"), port, work / "agent.log", extra)
    try:
        _wait_up(port)
        import threading

        scrapes: list[tuple[float, str]] = []
        done = threading.Event()

        def scrape() -> None:
            while not done.is_set():
                t = time.time()
                scrapes.append((t, _get(port)))
                done.wait(max(0.0, 1.0 - (time.time() - t)))

        scraper = threading.Thread(target=scrape, daemon=True)
        scraper.start()
        c0, t0 = _cpu_s(agent.pid), time.monotonic()
        ended: list[float] = []
        writer = threading.Thread(target=lambda: ended.append(_writer(logs, lines, rate)))
        writer.start()
        writer.join()
        span = time.monotonic() - t0
        cpu = 100 * (_cpu_s(agent.pid) - c0) / span
        stall = ended[0]
        time.sleep(5)
        done.set()
        scraper.join()
        named = next(
            (t for t, text in scrapes if t >= stall and re.search(
                r'ncclscope_timeout_culprit_info\{[^}]*rank="3"', text)),
            None,
        )  # fmt: skip
        print(f"rate: {len(lines):,} lines in {span:.1f} s ({len(lines) / span:,.0f} lines/s), "
              "8 per-rank logs, one scrape a second")  # fmt: skip
        last_text = next((text for _t, text in reversed(scrapes) if text), "")
        print(f"  agent CPU {cpu:.2f}% of a core while the lines flowed (its analysis "
              f"processes included); VmHWM {_status_kb(agent.pid, 'VmHWM') / 1024:.0f} MB; "
              f"its last analysis process's peak RSS {_analysis_mb(last_text)}")  # fmt: skip
        flowing = [text for t, text in scrapes if t <= stall and text]
        if len(flowing) >= 2:
            first, last = _collector_cpu(flowing[0]), _collector_cpu(flowing[-1])
            parts = ", ".join(
                f"{name} {100 * (last[name] - first.get(name, 0.0)) / span:.2f}%"
                for name in sorted(last)
            )
            print(f"  by the agent's own account (ncclscope_sample_cpu_seconds_total): {parts}")
        if named is None:
            print("  the stall never named rank 3 in /metrics")
        else:
            print(f"  stall named (rank 3) {named - stall:.2f} s after its start "
                  "(target: --interval + 1 s = 2 s)")  # fmt: skip
    finally:
        agent.terminate()
        agent.wait()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["idle", "rate"])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--warmup", type=float, default=15)
    parser.add_argument("--rate", type=float, default=2400)
    # rate: any other option goes to the agent (e.g. --window-lines 50000)
    args, agent_args = parser.parse_known_args()
    if args.mode == "idle":
        idle(args.seconds, args.warmup)
    else:
        rate_mode(args.rate, args.seconds, agent_args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
