#!/usr/bin/env python3
"""The agent's costs: /metrics rendering, CPU and memory while it runs.

Modes:

* ``render``: ``/metrics`` with 1,024 ranks' series (each rank on the world and a
  host communicator), 8 GPUs and 16 processes; prints the median render time over
  200 renders (target <= 20 ms) and the number of series.
* ``idle --seconds 60``: ``ncclscope agent --fake-gpus 8`` at 1 s with 16 job processes
  (``sleep``), as a subprocess; prints its CPU share of one core over the run, measured
  on its own pid (target <= 1%), and its peak RSS (target <= 150 MB).
* ``soak --minutes 30``: the agent at 0.1 s following a log that grows by 1 MB/s of
  NCCL COLL lines; prints its RSS every minute and the change from minute 5 to the end
  (target within 10%).
* ``scrapers --seconds 30``: ``/metrics`` of a board of ~300 series (the render board at
  64 ranks) that changes every second, as an agent's does, served in a process of its
  own to 200 scrapers (asyncio HTTP/1.0 GETs in ``--procs`` client processes), each in
  a loop with a 5 s timeout; per server, one after the other in the same run: the
  server before #25 (``baseline``: a thread per connection, listen backlog 5, a render
  per scrape), ncclscope's bounded server, and node_exporter's own /metrics if it is
  installed. Prints requests, 200s, 503s, timeouts, p50/p99 latency and the server's
  CPU (targets: no timeouts, p99 under 1 s, every 503 counted).

Usage:
    .venv/bin/python benchmarks/bench_agent.py render
    .venv/bin/python benchmarks/bench_agent.py idle --seconds 60
    .venv/bin/python benchmarks/bench_agent.py soak --minutes 30
    .venv/bin/python benchmarks/bench_agent.py scrapers --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402
from prometheus_client import generate_latest  # noqa: E402

from ncclscope.agent.exporter import (  # noqa: E402
    CONTENT_TYPE,
    Board,
    MetricsServer,
    _exposition,
    identity_rows,
    new_registry,
    render,
    serve,
)


def _board(n_ranks: int) -> Board:
    """Each rank on the world and a host communicator, 8 GPUs, 16 processes."""
    board = Board()
    board.set("identity", identity_rows("node-0"))
    ranks = range(n_ranks)
    board.set(
        "job",
        {
            "ncclscope_collective_seq": [
                ((comm, str(r)), 123456.0) for r in ranks for comm in ("0xworld", f"0xhost{r // 8}")
            ],
            "ncclscope_collective_lateness_seconds": [((str(r),), 0.001) for r in ranks],
            "ncclscope_straggler_score": [((str(r),), 0.01) for r in ranks],
            "ncclscope_pending_collective_age_seconds": [(("0xworld",), 12.0)],
            "ncclscope_timeout_remaining_seconds": [(("0xworld",), 588.0)],
            "ncclscope_timeout_culprit_info": [(("0xworld", "5", "AllGather"), 1.0)],
        },
    )
    gpus = [(str(g), f"GPU-{g}", f"00000000:{g:02X}:00.0") for g in range(8)]
    board.set(
        "nvml",
        {
            "ncclscope_gpu_memory_used_bytes": [(k, 1e9) for k in gpus],
            "ncclscope_gpu_pcie_tx_bytes_per_second": [(k, 1e9) for k in gpus],
            "ncclscope_gpu_pcie_rx_bytes_per_second": [(k, 1e9) for k in gpus],
        },
    )
    board.set(
        "host",
        {"ncclscope_process_resident_memory_bytes": [((str(p),), 1e9) for p in range(16)]},
    )
    return board


def bench_render() -> None:
    board = _board(1024)
    registry = new_registry(board)

    def timed(fn: Callable[[], bytes], n: int = 200) -> tuple[list[float], bytes]:
        times = []
        body = b""
        for _ in range(n):
            start = time.perf_counter()
            body = fn()
            times.append(time.perf_counter() - start)
        return sorted(times), body

    base, expected = timed(lambda: generate_latest(registry))
    # The render itself, not render()'s cache of it (which answers all but the first)
    fast, body = timed(lambda: _exposition(board.snapshot()))
    assert body == expected, "render() differs from generate_latest()"
    _host, port = serve(board, "127.0.0.1:0")
    url = f"http://127.0.0.1:{port}/metrics"

    def get() -> bytes:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bytes(response.read())

    http, got = timed(get)
    assert got == expected
    series = sum(1 for line in body.decode().splitlines() if line and line[0] != "#")

    def stats(times: list[float]) -> str:
        return f"median {statistics.median(times) * 1000:.2f} ms, p95 {times[189] * 1000:.2f} ms"

    print(f"render: {series} series, 200 renders each")
    print(f"  client_python generate_latest (baseline): {stats(base)}")
    print(f"  ncclscope render:                         {stats(fast)} "
          f"({statistics.median(base) / statistics.median(fast):.1f}x faster)")  # fmt: skip
    print(f"  HTTP GET /metrics over loopback (cached): {stats(http)}")


def _agent(args: list[str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "ncclscope", "agent", "--listen", "127.0.0.1:0", *args]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _idle_once(seconds: float, extra: list[str], pids: list[str]) -> tuple[float, int]:
    """One agent, idle for ``seconds`` after start-up: its CPU share of one core and peak RSS."""
    agent = _agent(["--fake-gpus", "8", "--interval", "1", *extra, *pids])
    proc = psutil.Process(agent.pid)
    try:
        time.sleep(5)  # start-up (imports) is not the steady state
        cpu0, t0 = proc.cpu_times(), time.monotonic()
        peak = 0
        while time.monotonic() - t0 < seconds:
            time.sleep(1)
            peak = max(peak, proc.memory_info().rss)
        cpu1, t1 = proc.cpu_times(), time.monotonic()
    finally:
        agent.terminate()
        agent.wait(10)
    used = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return used / (t1 - t0), peak


def idle(seconds: float, *, topology: bool = False, rounds: int = 1) -> None:
    """The agent idle; with ``topology``, also before (no topology: direct-attached fake
    GPUs, sysfs not read) against after (8 fake GPUs, 4 per switch, a sysfs tree of that
    shape read at start, the uplinks exported and recorded with --out), alternating in
    the same run."""
    sleepers = [subprocess.Popen(["sleep", str((seconds + 30) * 2 * rounds)]) for _ in range(16)]
    try:
        pids = [a for p in sleepers for a in ("--pid", str(p.pid))]
        if not topology:
            share, peak = _idle_once(seconds, [], pids)
            print(f"idle: {share:.2%} of one core over {seconds:.0f} s, "
                  f"peak RSS {peak / 1e6:.0f} MB (8 fake GPUs, 16 processes, 1 s)")  # fmt: skip
            return
        from ncclscope.agent.fake_nvml import FakeNvml
        from ncclscope.agent.fake_sysfs import write_pci_tree

        with tempfile.TemporaryDirectory() as tmp:
            buses = [g.pci_bus_id for g in FakeNvml.with_devices(8).gpus]
            write_pci_tree(Path(tmp) / "sys", [str(b) for b in buses], gpus_per_switch=4)
            runs = {
                "before (no topology)": ["--sysfs-root", "none", "--out", f"{tmp}/before"],
                "after (4 GPUs/switch, sysfs + NVML topology, recorded)": [
                    "--sysfs-root", f"{tmp}/sys", "--fake-gpus-per-switch", "4",
                    "--out", f"{tmp}/after",
                ],
            }  # fmt: skip
            got: dict[str, list[float]] = {k: [] for k in runs}
            for _ in range(rounds):
                for name, extra in runs.items():
                    share, peak = _idle_once(seconds, extra, pids)
                    got[name].append(share)
                    print(f"  {name}: {share:.2%} of one core, peak RSS {peak / 1e6:.0f} MB")
            for name, shares in got.items():
                print(f"idle {name}: median {statistics.median(shares):.2%} of one core "
                      f"over {rounds} x {seconds:.0f} s")  # fmt: skip
            rows = _recorded_uplinks(Path(tmp) / "after")
            print(f"uplink rows recorded in the after run's telemetry: {rows}")
    finally:
        for p in sleepers:
            p.kill()


def _recorded_uplinks(folder: Path) -> int:
    from ncclscope.agent.telemetry import read_telemetry

    tel = read_telemetry([folder])
    return int((tel["metric"] == "ncclscope_gpu_pcie_uplink_info").sum()) if len(tel) else 0


def soak(minutes_total: float, *, rotate_s: float = 0.0, mb_per_s: float = 1.0) -> None:
    """The agent following a log grown at ``mb_per_s`` for ``minutes_total``; with
    ``rotate_s``, logrotate's copytruncate every that many seconds (``job.log.1`` kept,
    the older copy deleted), so that the disk holds two periods of log at most."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "job.log"
        log.write_text("")
        agent = _agent(["--follow", str(log), "--interval", "0.1", "--analyse-every", "5"])
        proc = psutil.Process(agent.pid)
        line = (
            "node-0:{pid}:{pid} [0] NCCL INFO AllGather: opCount {op:x} sendbuff 0x7f00 "
            "recvbuff 0x7f00 count 4096 datatype 9 op 0 root 0 comm 0x55aa [nranks=8] "
            "stream 0x55bb\n"
        )
        op = 0
        # RSS every second; per minute its low, median and peak (the detector runs every
        # 5 s make short peaks that a 1 s sample catches or misses), and the kernel's
        # high-water mark (VmHWM: the largest RSS ever, caught or not).
        minutes: list[tuple[int, int, int, int]] = []
        current: list[int] = []
        start = time.monotonic()
        last_sample = start
        last_rotation = start
        rotations = 0
        with log.open("a") as fh:
            while time.monotonic() - start < minutes_total * 60:
                chunk = []
                size = 0
                while size < mb_per_s * 100_000:  # in 0.1 s steps
                    text = line.format(pid=1000 + op % 8, op=op // 8)
                    chunk.append(text)
                    size += len(text)
                    op += 1
                fh.write("".join(chunk))
                fh.flush()
                time.sleep(0.1)
                now = time.monotonic()
                if rotate_s and now - last_rotation >= rotate_s:
                    last_rotation = now
                    rotations += 1
                    # logrotate's copytruncate (the writer's O_APPEND stream goes on at 0)
                    shutil.copyfile(log, log.with_name(log.name + ".1"))
                    os.truncate(log, 0)
                if now - last_sample >= 1:
                    last_sample = now
                    current.append(proc.memory_info().rss)
                if len(current) >= 60:
                    mid = int(statistics.median(current))
                    m = (min(current), mid, max(current), _hwm(agent.pid))
                    minutes.append(m)
                    low, med, top, hwm = (f"{v / 1e6:.0f} MB" for v in m)
                    print(f"  minute {len(minutes):2d}: RSS low {low}, median {med}, "
                          f"peak {top}; VmHWM {hwm}", flush=True)  # fmt: skip
                    current = []
        agent.terminate()
        agent.wait(10)
        grown = os.path.getsize(log)
    after5 = minutes[4:] or minutes
    for k, name in ((0, "low"), (1, "median"), (2, "peak")):
        vals = [m[k] for m in after5]
        lo, hi = min(vals), max(vals)
        print(f"soak: per-minute RSS {name} from minute 5 to {len(minutes)}: "
              f"{lo / 1e6:.0f}-{hi / 1e6:.0f} MB ({hi / lo - 1:+.1%})")  # fmt: skip
    print(f"soak: VmHWM at minute 5 {after5[0][3] / 1e6:.0f} MB, at minute {len(minutes)} "
          f"{after5[-1][3] / 1e6:.0f} MB ({after5[-1][3] / after5[0][3] - 1:+.1%}); "
          f"log {grown / 1e6:.0f} MB at the end, {rotations} rotations")  # fmt: skip


def _hwm(pid: int) -> int:
    """The process's peak RSS so far (bytes), from /proc."""
    for text in Path(f"/proc/{pid}/status").read_text().splitlines():
        if text.startswith("VmHWM:"):
            return int(text.split()[1]) * 1024
    return 0


# -- scrapers: /metrics under 200 concurrent scrapers ---------------------------------------


class _OldHandler(BaseHTTPRequestHandler):
    """The handler before #25: a render per scrape."""

    board: Board

    def do_GET(self) -> None:
        body = _exposition(self.board.snapshot())
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _server_process(kind: str, n_ranks: int, conn: Connection) -> None:
    """Serve a board that changes every second until told to stop; send back the port,
    then the CPU seconds used and the 503s counted."""
    board = _board(n_ranks)
    if kind == "baseline":  # serve() before #25: ThreadingHTTPServer, backlog 5
        handler = type("Handler", (_OldHandler,), {"board": board})
        old = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        old.daemon_threads = True
        # quiet: it printed a traceback on stderr for every client that gave up waiting
        old.handle_error = lambda *_: None
        threading.Thread(target=old.serve_forever, daemon=True).start()
        port, counted = old.server_address[1], lambda: 0
    else:
        server = MetricsServer(board, "127.0.0.1:0")
        server.start()
        port, counted = server.address[1], lambda: server.rejected
    cpu0 = time.process_time()
    conn.send(port)
    k = 0
    while not conn.poll(1.0):  # the agent's tick: the board changes every second
        k += 1
        board.set("host", {"ncclscope_host_cpu_utilization_ratio": [((), k % 100 / 100)]})
    conn.recv()
    conn.send((time.process_time() - cpu0, counted()))


async def _scrape_once(port: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
        data = await reader.read()  # to the server's close
    finally:
        writer.close()
    status = int(data.split(b" ", 2)[1])
    if status == 200 and b"\r\n\r\n#" not in data:
        return 0  # a 200 without a body is not an answer
    return status


async def _scrapers(port: int, n: int, start: float, seconds: float) -> list[tuple[str, float]]:
    """``n`` scrapers from wall time ``start`` for ``seconds``: (outcome, latency) each."""
    await asyncio.sleep(max(0.0, start - time.time()))
    end = time.monotonic() + seconds
    out: list[tuple[str, float]] = []

    async def one() -> None:
        while time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                outcome = str(await asyncio.wait_for(_scrape_once(port), 5.0))
            except TimeoutError:
                outcome = "timeout"
            except (OSError, IndexError, ValueError):  # refused, reset, a broken answer
                outcome = "error"
            out.append((outcome, time.perf_counter() - t0))

    await asyncio.gather(*(one() for _ in range(n)))
    return out


def _client_process(port: int, n: int, start: float, seconds: float, conn: Connection) -> None:
    conn.send(asyncio.run(_scrapers(port, n, start, seconds)))


def _crowd(port: int, scrapers: int, procs: int, seconds: float) -> list[tuple[str, float]]:
    ctx = mp.get_context("fork")
    start = time.time() + 1.0  # every client process starts at once
    clients = []
    for k in range(procs):
        n = scrapers // procs + (k < scrapers % procs)
        mine, theirs = ctx.Pipe()
        client = ctx.Process(target=_client_process, args=(port, n, start, seconds, theirs))
        client.start()
        clients.append((client, mine))
    results = [r for _client, pipe in clients for r in pipe.recv()]
    for client, _pipe in clients:
        client.join()
    return results


def _node_exporter(port: int) -> subprocess.Popen[bytes] | None:
    """node_exporter on 127.0.0.1:``port`` with its defaults (--web.max-requests 40)."""
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        return None
    proc = subprocess.Popen(
        [binary, f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):  # up in well under 10 s
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            time.sleep(0.1)
        else:
            return proc
    proc.kill()
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrapers(seconds: float, *, n: int, procs: int, n_ranks: int, servers: list[str]) -> None:
    series = sum(1 for x in render(_board(n_ranks)).splitlines() if not x.startswith(b"#"))
    print(f"scrapers: {n} scrapers in {procs} processes for {seconds:.0f} s each, "
          f"5 s timeout; board of {series} series changing every 1 s; "
          f"load average before {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| server | requests | 200 | 503 | 503 counted | timeouts | errors | req/s | "
          "p50 ms | p99 ms | p99 of 200s ms | server CPU |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ctx = mp.get_context("fork")
    for kind in servers:
        if kind == "node_exporter":
            port = _free_port()
            ne = _node_exporter(port)
            if ne is None:
                print("| node_exporter | not installed |")
                continue
            ne_proc = psutil.Process(ne.pid)
            cpu0, t0 = sum(ne_proc.cpu_times()[:2]), time.monotonic()
            results = _crowd(port, n, procs, seconds)
            cpu = (sum(ne_proc.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
            counted = "-"
            ne.terminate()
            ne.wait(10)
        else:
            mine, theirs = ctx.Pipe()
            server = ctx.Process(target=_server_process, args=(kind, n_ranks, theirs))
            server.start()
            port = mine.recv()
            t0 = time.monotonic()
            results = _crowd(port, n, procs, seconds)
            mine.send("stop")
            cpu_s, rejected = mine.recv()
            cpu = cpu_s / (time.monotonic() - t0)
            counted = str(rejected) if kind != "baseline" else "-"
            server.join(10)
        _report(kind, results, seconds, cpu, counted)


def _report(
    kind: str, results: list[tuple[str, float]], seconds: float, cpu: float, counted: str
) -> None:
    """One row of the table; ``cpu``: the server's share of one core."""

    def count(outcome: str) -> int:
        return sum(1 for o, _ in results if o == outcome)

    def pct(times: list[float], q: float) -> str:
        if not times:
            return "-"
        times = sorted(times)
        return f"{times[min(len(times) - 1, int(q * len(times)))] * 1000:.0f}"

    answered = [t for o, t in results if o in ("200", "503")]
    ok = [t for o, t in results if o == "200"]
    name = {"baseline": "before #25 (baseline)", "ncclscope": "ncclscope, bounded"}.get(kind, kind)
    print(f"| {name} | {len(results)} | {count('200')} | {count('503')} | {counted} | "
          f"{count('timeout')} | {count('error') + count('0')} | {len(results) / seconds:.0f} | "
          f"{pct(answered, 0.5)} | {pct(answered, 0.99)} | {pct(ok, 0.99)} | "
          f"{cpu:.0%} |", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["render", "idle", "soak", "scrapers"])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument(
        "--topology",
        action="store_true",
        help="idle: the agent without and with PCIe topology recorded, alternating",
    )
    parser.add_argument("--rounds", type=int, default=1, help="idle --topology: runs of each")
    parser.add_argument(
        "--rotate-every", type=float, default=0.0, help="soak: copytruncate every N s"
    )
    parser.add_argument("--mb-per-s", type=float, default=1.0, help="soak: the log's growth")
    parser.add_argument("--scrapers", type=int, default=200, help="scrapers: how many")
    parser.add_argument("--procs", type=int, default=2, help="scrapers: client processes")
    parser.add_argument("--ranks", type=int, default=64, help="scrapers: ranks on the board")
    parser.add_argument(
        "--servers",
        default="baseline,ncclscope,node_exporter",
        help="scrapers: which, in order (baseline, ncclscope, node_exporter)",
    )
    args = parser.parse_args(argv)
    if args.mode == "render":
        bench_render()
    elif args.mode == "scrapers":
        unknown = set(args.servers.split(",")) - {"baseline", "ncclscope", "node_exporter"}
        if unknown:
            parser.error(f"--servers: no server named {', '.join(sorted(unknown))}")
        scrapers(
            args.seconds,
            n=args.scrapers,
            procs=args.procs,
            n_ranks=args.ranks,
            servers=args.servers.split(","),
        )
    elif args.mode == "idle":
        idle(args.seconds, topology=args.topology, rounds=args.rounds)
    else:
        soak(args.minutes, rotate_s=args.rotate_every, mb_per_s=args.mb_per_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
