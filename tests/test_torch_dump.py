"""Asking a PyTorch process for its Flight Recorder dump and Python stacks (issue #27).

Without torch: a fake control-plane worker server on a Unix socket in this process
(answering as PyTorch's cpp-httplib server does: ``GET /handler/`` lists names,
``POST /handler/<name>`` runs one) that is silent, drips, cuts its answer, fails with
HTTP 500, speaks no HTTP, or answers with a small valid dump; a fake debug-info pipe
reader that writes a dump file in place when poked, as ProcessGroupNCCL's heartbeat
monitor does; a child process with a rank's environment for the discovery.  Each
outcome must come within its bound, with no assumption that the machine is idle.

With torch (``NCCLSCOPE_TORCH_PYTHON``, default ``/work/torchvenv/bin/python``; skipped
where none): ``benchmarks/torch_hang_job.py`` with 2 gloo ranks, rank 1 stuck in Python;
each rank is asked for its dump and its stacks through the control plane.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ncclscope.evidence.torch_dump import (
    TorchProcess,
    find_torch_processes,
    request_dump,
    request_py_stack,
)
from ncclscope.parsers.torch.flight import read_dump

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "benchmarks" / "torch_hang_job.py"

#: A small JSON dump in the 2.x shape (what fr_trace_json answers on 2.13, trimmed).
DUMP = {
    "version": "2.10",
    "comm_lib_version": "",
    "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
    "pg_status": {
        "0": {
            "last_enqueued_collective": "4",
            "last_started_collective": "-1",
            "last_completed_collective": "3",
        }
    },
    "entries": [
        {
            "record_id": k,
            "pg_id": 0,
            "process_group": ["0", "default_pg"],
            "collective_seq_id": k + 1,
            "p2p_seq_id": 0,
            "op_id": k + 1,
            "profiling_name": "gloo:all_reduce",
            "time_created_ns": 1795840164763025190 + k,
            "input_sizes": [[256]],
            "input_dtypes": ["Float"],
            "output_sizes": [[256]],
            "output_dtypes": ["Float"],
            "state": "scheduled",
            "time_discovered_started_ns": 0,
            "time_discovered_completed_ns": 0,
            "retired": k < 3,
            "timeout_ms": 600000,
            "is_p2p": False,
        }
        for k in range(4)
    ],
}
DUMP_BYTES = json.dumps(DUMP).encode()
TRACEBACK = (
    b"Thread 0x00007f5654dc0b80 (most recent call first):\n"
    b'  File "/job/train.py", line 56 in stuck_in_python\n'
    b'  File "/job/train.py", line 83 in run_rank\n'
)
HANDLERS = b'["dump_traceback","pyspy_dump","wait_counter_values","fr_trace_json","ping"]'
#: Generous: the bound is checked, not the speed of a shared machine.
SLACK_S = 10.0


def http(status: int, body: bytes, reason: str = "OK", length: int | None = None) -> bytes:
    n = len(body) if length is None else length
    return (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Length: {n}\r\n"
        "Content-Type: application/json\r\n\r\n"
    ).encode() + body


Behaviour = Callable[[socket.socket, str, threading.Event], None]


def answer(raw: bytes) -> Behaviour:
    def act(conn: socket.socket, _target: str, _stop: threading.Event) -> None:
        conn.sendall(raw)

    return act


def silent(_conn: socket.socket, _target: str, stop: threading.Event) -> None:
    stop.wait(60)


def drip(conn: socket.socket, _target: str, stop: threading.Event) -> None:
    """A valid header, then one body byte every 0.1 s: every read is quick, the whole never."""
    conn.sendall(http(200, b"", length=len(DUMP_BYTES)))
    for b in DUMP_BYTES:
        if stop.wait(0.1):
            return
        conn.sendall(bytes([b]))


class FakeWorkerServer:
    """A Unix-socket HTTP server: ``GET /handler/`` lists ``names``; a POST to a name in
    ``posts`` runs its behaviour; any other POST is PyTorch's 404."""

    def __init__(self, path: Path, names: bytes, posts: dict[str, Behaviour]) -> None:
        self.path, self.names, self.posts = path, names, posts
        self.seen: list[str] = []
        self.stop = threading.Event()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            ready, _, _ = select.select([self.sock], [], [], 0.05)
            if ready:
                conn, _ = self.sock.accept()
                threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            method, target = head.split(b" ")[:2]
            t = target.decode()
            self.seen.append(f"{method.decode()} {t}")
            try:
                if method == b"GET":
                    conn.sendall(http(200, self.names))
                elif t.removeprefix("/handler/") in self.posts:
                    self.posts[t.removeprefix("/handler/")](conn, t, self.stop)
                else:
                    conn.sendall(http(404, b"Handler not found", "Not Found"))
            except OSError:
                pass  # the asker gave up and closed: as a real server sees it

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # A Unix socket path must fit in 108 bytes: pytest's tmp_path may not.
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ncs-") as d:
        yield Path(d)


@pytest.fixture
def server(short_dir: Path) -> Iterator[Callable[..., FakeWorkerServer]]:
    made: list[FakeWorkerServer] = []

    def make(posts: dict[str, Behaviour], names: bytes = HANDLERS) -> FakeWorkerServer:
        s = FakeWorkerServer(short_dir / f"ws{len(made)}.sock", names, posts)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def proc_for(sock: Path | None = None, pipe: str | None = None, dump: str = "") -> TorchProcess:
    return TorchProcess(
        pid=os.getpid(),
        rank=1,
        local_rank=1,
        world_size=2,
        host="node-a",
        socket_path=None if sock is None else str(sock),
        pipe_path=pipe,
        dump_prefix=dump or None,
        dump_paths=(f"{dump}1",) if dump else (),
    )


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.monotonic()
    out = fn()
    return out, time.monotonic() - t0


# -- control plane --------------------------------------------------------------------


def test_dump_answered_from_control_plane(server, tmp_path):
    s = server({"fr_trace_json": answer(http(200, DUMP_BYTES))})
    ask = request_dump(tmp_path, proc_for(s.path), timeout_s=5.0)
    assert (ask.outcome, ask.file, ask.rank, ask.size_bytes) == (
        "answered",
        "dumps/rank1.json",
        1,
        len(DUMP_BYTES),
    )
    assert ask.via == "control_plane /handler/fr_trace_json"
    assert ask.target == f"rank 1 (pid {os.getpid()})"
    read = read_dump(tmp_path / "dumps" / "rank1.json", "rank1.json", "flight_json")
    assert read.problem is None
    assert read.n_entries == 4
    assert s.seen == ["GET /handler/", "POST /handler/fr_trace_json"]


def test_empty_nccl_dump_gives_way_to_the_generic_recorder(server, tmp_path):
    """A CUDA build running a gloo job: the NCCL recorder answers with no entries, the
    generic one (which gloo records into) with the job's collectives."""
    empty = json.dumps({**DUMP, "entries": []}).encode()
    names = b'["dump_nccl_trace_json","fr_trace_json","dump_traceback"]'
    s = server(
        {
            "dump_nccl_trace_json": answer(http(200, empty)),
            "fr_trace_json": answer(http(200, DUMP_BYTES)),
        },
        names,
    )
    ask = request_dump(tmp_path, proc_for(s.path), timeout_s=5.0)
    assert ask.outcome == "answered"
    assert ask.via.endswith("fr_trace_json")
    assert ask.size_bytes == len(DUMP_BYTES)


def test_pickle_handler_asked_first(server, tmp_path):
    import pickle

    names = b'["dump_nccl_trace_pickle","dump_nccl_trace_json","fr_trace_json"]'
    s = server(
        {
            "dump_nccl_trace_pickle": answer(http(200, pickle.dumps(DUMP, protocol=2))),
            "fr_trace_json": answer(http(200, DUMP_BYTES)),
        },
        names,
    )
    ask = request_dump(tmp_path, proc_for(s.path), timeout_s=5.0)
    assert (ask.outcome, ask.file) == ("answered", "dumps/rank1.pickle")
    assert s.seen[1] == "POST /handler/dump_nccl_trace_pickle"


@pytest.mark.parametrize(
    ("behaviour", "outcome", "why"),
    [
        (silent, "no_answer", "no answer in time"),
        (drip, "truncated", "body bytes in time"),
        (answer(http(200, DUMP_BYTES[:100], length=len(DUMP_BYTES))), "truncated", "closed after"),
        (answer(http(500, b"Handler fr_trace_json failed: boom", "Error")), "error", "HTTP 500"),
        (answer(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"), "garbage", "not an HTTP answer"),
        (answer(http(200, b"<html>hello</html>")), "garbage", "not a Flight Recorder dump"),
        (answer(http(200, DUMP_BYTES[: len(DUMP_BYTES) // 2])), "truncated", "was the file cut"),
    ],
    ids=["silent", "drip", "closed-mid-body", "http-500", "not-http", "not-a-dump", "cut-json"],
)
def test_dump_bad_peer_is_bounded(server, tmp_path, behaviour, outcome, why):
    s = server({"fr_trace_json": behaviour})
    ask, took = timed(lambda: request_dump(tmp_path, proc_for(s.path), timeout_s=1.0))
    assert ask.outcome == outcome, ask
    assert why in ask.why
    assert ask.file is None
    assert took < 1.0 + SLACK_S
    assert not (tmp_path / "dumps").exists() or not any((tmp_path / "dumps").iterdir())


def test_missing_socket_is_unavailable_and_says_why(short_dir, tmp_path):
    ask, _took = timed(
        lambda: request_dump(tmp_path, proc_for(short_dir / "none.sock"), timeout_s=1.0)
    )
    assert ask.outcome == "unavailable"
    assert "worker_main" in ask.why
    stack = request_py_stack(tmp_path, proc_for(short_dir / "none.sock"), timeout_s=1.0)
    assert stack.outcome == "unavailable"


def test_no_way_to_ask_names_the_setting(tmp_path):
    ask = request_dump(tmp_path, proc_for(), timeout_s=1.0)
    assert ask.outcome == "unavailable"
    assert "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" in ask.why
    assert "ncclscope run" in ask.why
    stack = request_py_stack(tmp_path, proc_for(), timeout_s=1.0)
    assert stack.outcome == "unavailable"
    assert "py-spy" in stack.why


def test_server_without_dump_handler(server, tmp_path):
    s = server({}, b'["dump_traceback","ping"]')
    ask = request_dump(tmp_path, proc_for(s.path), timeout_s=1.0)
    assert ask.outcome == "unavailable"
    assert "no dump handler" in ask.why


def test_stack_answered(server, tmp_path):
    s = server({"dump_traceback": answer(http(200, TRACEBACK))})
    ask = request_py_stack(tmp_path, proc_for(s.path), timeout_s=5.0)
    assert (ask.outcome, ask.file, ask.what) == ("answered", "stacks/rank1.txt", "stack")
    assert (tmp_path / "stacks" / "rank1.txt").read_bytes() == TRACEBACK


@pytest.mark.parametrize(
    ("behaviour", "outcome"),
    [
        (silent, "no_answer"),
        (answer(http(200, b"\x00\x01 binary")), "garbage"),
        (answer(http(500, b"Handler dump_traceback failed: x")), "error"),
    ],
    ids=["silent", "garbage", "http-500"],
)
def test_stack_bad_peer(server, tmp_path, behaviour, outcome):
    s = server({"dump_traceback": behaviour})
    ask, took = timed(lambda: request_py_stack(tmp_path, proc_for(s.path), timeout_s=1.0))
    assert ask.outcome == outcome
    assert took < 1.0 + SLACK_S


def test_stack_handler_missing_is_unavailable(server, tmp_path):
    s = server({}, b'["ping"]')
    ask = request_py_stack(tmp_path, proc_for(s.path), timeout_s=1.0)
    assert ask.outcome == "unavailable"
    assert "dump_traceback" in ask.why


# -- the debug-info pipe --------------------------------------------------------------


class FakePipeReader:
    """ProcessGroupNCCL's heartbeat monitor, as far as the pipe goes: a FIFO opened
    O_RDONLY|O_NONBLOCK, read every poll; a byte read writes the dump file in place
    (ofstream: truncate, then the bytes, here in two writes with a pause between)."""

    def __init__(
        self, pipe: Path, dump: Path, content: bytes, delay_s: float = 0.0, pause_s: float = 0.1
    ) -> None:
        os.mkfifo(pipe)
        self.fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
        self.dump, self.content = dump, content
        self.delay_s, self.pause_s = delay_s, pause_s
        self.pokes = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                got = os.read(self.fd, 4096)
            except BlockingIOError:
                continue
            if got:
                self.pokes += 1
                self.stop.wait(self.delay_s)
                with self.dump.open("wb") as f:
                    half = len(self.content) // 2
                    f.write(self.content[:half])
                    f.flush()
                    self.stop.wait(self.pause_s)
                    f.write(self.content[half:])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        os.close(self.fd)


def test_dump_through_the_pipe(tmp_path):
    prefix = tmp_path / "debug_pipe_rank_"
    old = tmp_path / "nccl_trace_rank_1"
    # An older dump, whole and readable: the answer must be the one the poke asked for.
    old.write_bytes(json.dumps({**DUMP, "entries": []}).encode())
    # The monitor thread reads the pipe up to a second after the poke.
    reader = FakePipeReader(Path(f"{prefix}1.pipe"), old, DUMP_BYTES, delay_s=0.8)
    try:
        proc = proc_for(pipe=f"{prefix}1.pipe", dump=str(tmp_path / "nccl_trace_rank_"))
        ask = request_dump(tmp_path / "ev", proc, timeout_s=10.0)
    finally:
        reader.close()
    assert (ask.outcome, ask.via, ask.file) == ("answered", "debug_pipe", "dumps/rank1.json")
    assert reader.pokes == 1
    assert (tmp_path / "ev" / "dumps" / "rank1.json").read_bytes() == DUMP_BYTES


def test_growing_dump_is_not_read_at_every_poll(tmp_path, monkeypatch):
    """A dump being written (a big one takes seconds) is read once its size holds, not
    re-read and re-parsed every 50 ms poll."""
    reads: list[str] = []
    real = Path.read_bytes

    def counting(self: Path) -> bytes:
        reads.append(self.name)
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", counting)
    prefix = tmp_path / "debug_pipe_rank_"
    dump = tmp_path / "nccl_trace_rank_1"
    reader = FakePipeReader(Path(f"{prefix}1.pipe"), dump, DUMP_BYTES, pause_s=0.6)
    try:
        proc = proc_for(pipe=f"{prefix}1.pipe", dump=str(tmp_path / "nccl_trace_rank_"))
        ask = request_dump(tmp_path / "ev", proc, timeout_s=10.0)
    finally:
        reader.close()
    assert ask.outcome == "answered"
    assert reads.count(dump.name) <= 3


def test_pipe_nobody_reads(tmp_path):
    pipe = tmp_path / "p1.pipe"
    os.mkfifo(pipe)  # made, never opened: a process whose monitor thread is gone
    ask, took = timed(
        lambda: request_dump(
            tmp_path, proc_for(pipe=str(pipe), dump=str(tmp_path / "d")), timeout_s=1.0
        )
    )
    assert ask.outcome == "unavailable"
    assert "nobody reads" in ask.why
    assert took < 1.0 + SLACK_S


def test_pipe_read_but_no_dump_is_no_answer(tmp_path):
    """A reader that swallows the byte and writes nothing: no_answer at the bound."""
    pipe = tmp_path / "p1.pipe"
    os.mkfifo(pipe)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    try:
        ask, took = timed(
            lambda: request_dump(
                tmp_path, proc_for(pipe=str(pipe), dump=str(tmp_path / "d")), timeout_s=1.0
            )
        )
    finally:
        os.close(fd)
    assert ask.outcome == "no_answer"
    assert 1.0 <= took < 1.0 + SLACK_S


def test_pipe_path_that_is_a_regular_file_is_not_written(tmp_path):
    victim = tmp_path / "p1.pipe"
    victim.write_bytes(b"user data\n")
    ask = request_dump(
        tmp_path, proc_for(pipe=str(victim), dump=str(tmp_path / "d")), timeout_s=1.0
    )
    assert ask.outcome == "unavailable"
    assert "not a named pipe" in ask.why
    assert victim.read_bytes() == b"user data\n"


def test_pipe_dump_garbage(tmp_path):
    prefix = tmp_path / "debug_pipe_rank_"
    reader = FakePipeReader(Path(f"{prefix}1.pipe"), tmp_path / "nccl_trace_rank_1", b"\x00" * 64)
    try:
        proc = proc_for(pipe=f"{prefix}1.pipe", dump=str(tmp_path / "nccl_trace_rank_"))
        ask = request_dump(tmp_path / "ev", proc, timeout_s=1.5)
    finally:
        reader.close()
    assert ask.outcome == "garbage"
    assert ask.file is None


# -- discovery ------------------------------------------------------------------------


def test_find_torch_processes_reads_a_child_environment(tmp_path):
    token = f"ncclscope-find-{os.getpid()}-{time.monotonic_ns()}"
    env = {
        **os.environ,
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "TORCH_WORKER_SERVER_SOCKET": str(tmp_path / "rank3.sock"),
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "debug_pipe_rank_"),
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "nccl_trace_rank_"),
        "NCCL_RAS_ADDR": "127.0.0.1:29000",
        "SECRET_TOKEN": "not kept",
    }
    # A child of the rank with the same environment (a forked DataLoader worker) is not
    # a rank of its own.
    code = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', "
        f"'{token}']); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code, token], env=env)
    try:
        deadline = time.monotonic() + 60
        procs: list[TorchProcess] = []
        while time.monotonic() < deadline:
            procs, _unreadable = find_torch_processes(match=token, host="node-z")
            grandchildren = [p for p in child_pids(child.pid)]
            if procs and grandchildren:
                procs, _unreadable = find_torch_processes(match=token, host="node-z")
                break
            time.sleep(0.05)
        assert [p.pid for p in procs] == [child.pid]
        (p,) = procs
        assert (p.rank, p.local_rank, p.world_size, p.host) == (3, 1, 4, "node-z")
        assert p.socket_path == str(tmp_path / "rank3.sock")
        assert p.pipe_path == f"{tmp_path}/debug_pipe_rank_3.pipe"
        assert p.dump_paths == (f"{tmp_path}/nccl_trace_rank_3",)
        assert "TORCH_WORKER_SERVER_SOCKET" in p.env
        assert "RANK" in p.env
        assert p.environ["NCCL_RAS_ADDR"] == "127.0.0.1:29000"
        assert "SECRET_TOKEN" not in p.environ
    finally:
        for pid in child_pids(child.pid):
            os.kill(pid, 9)
        child.kill()
        child.wait()


def child_pids(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def test_find_torch_processes_finds_a_listening_socket_not_in_environ(short_dir):
    """A script that sets TORCH_WORKER_SERVER_SOCKET itself before worker_main(): /proc's
    environ does not show it, the listening socket does."""
    token = f"ncclscope-listen-{os.getpid()}-{time.monotonic_ns()}"
    path = short_dir / "late.sock"
    code = (
        "import socket, sys, time; s = socket.socket(socket.AF_UNIX); "
        f"s.bind({str(path)!r}); s.listen(1); print('up', flush=True); time.sleep(60)"
    )
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0"}
    env.pop("TORCH_WORKER_SERVER_SOCKET", None)
    child = subprocess.Popen([sys.executable, "-c", code, token], env=env, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"up\n"
        procs, _ = find_torch_processes(match=token)
        assert [(p.pid, p.socket_path) for p in procs] == [(child.pid, str(path))]
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


# -- a real PyTorch job ---------------------------------------------------------------


def torch_python() -> str | None:
    path = os.environ.get("NCCLSCOPE_TORCH_PYTHON", "/work/torchvenv/bin/python")
    if not path or not Path(path).exists():
        return None
    ok = subprocess.run([path, "-c", "import torch.distributed"], capture_output=True, timeout=120)
    return path if ok.returncode == 0 else None


def read_events(
    stream: object, want: Callable[[list[dict[str, object]]], bool], limit_s: float
) -> list[dict[str, object]]:
    """JSON lines from the job until ``want(events)`` holds (or the limit passes)."""
    events: list[dict[str, object]] = []
    fd = stream.fileno()
    deadline = time.monotonic() + limit_s
    buf = b""
    while not want(events) and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        events += [json.loads(x) for x in lines if x.startswith(b"{")]
    return events


@pytest.mark.skipif(torch_python() is None, reason="no Python with torch (NCCLSCOPE_TORCH_PYTHON)")
def test_real_job_answers_with_dump_and_stacks(short_dir, tmp_path):
    python = torch_python()
    assert python is not None
    job = subprocess.Popen(
        [
            python,
            str(JOB),
            "--world-size",
            "2",
            "--fault",
            "python",
            "--fault-rank",
            "1",
            "--fault-step",
            "3",
            "--socket-dir",
            str(short_dir),
            "--host-name",
            "node-a",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        events = read_events(
            job.stdout,
            lambda ev: (
                sum(e["event"] == "ready" for e in ev) == 2
                and any(e["event"] == "fault" for e in ev)
            ),
            limit_s=180,
        )
        ready = {e["rank"]: e for e in events if e["event"] == "ready"}
        assert sorted(ready) == [0, 1], events
        assert all(e["host"] == "node-a" for e in ready.values())
        procs, _ = find_torch_processes(match=str(JOB))
        procs = [p for p in procs if p.socket_path and p.socket_path.startswith(str(short_dir))]
        assert [(p.rank, p.pid) for p in procs] == [(r, ready[r]["pid"]) for r in (0, 1)]
        by_rank = {p.rank: p for p in procs}
        # Rank 1 is stuck in Python before its 4th all_reduce; rank 0 waits in it.
        stack1 = request_py_stack(tmp_path, by_rank[1], timeout_s=30)
        assert stack1.outcome == "answered", stack1
        assert "stuck_in_python" in (tmp_path / "stacks" / "rank1.txt").read_text()
        deadline = time.monotonic() + 120
        while True:  # rank 0 may still be between steps: ask until it waits in all_reduce
            stack0 = request_py_stack(tmp_path, by_rank[0], timeout_s=30)
            text = (tmp_path / "stacks" / "rank0.txt").read_text()
            if " in all_reduce" in text or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert stack0.outcome == "answered"
        assert " in all_reduce" in text, text
        for rank, seqs in ((0, {1, 2, 3, 4}), (1, {1, 2, 3})):
            ask = request_dump(tmp_path, by_rank[rank], timeout_s=30)
            assert (ask.outcome, ask.via) == ("answered", "control_plane /handler/fr_trace_json")
            read = read_dump(tmp_path / str(ask.file), str(ask.file), "flight_json")
            assert read.problem is None, read
            rows = read.rows.filter(read.rows["profiling_name"].str.contains("all_reduce"))
            assert set(rows["collective_seq_id"].to_list()) >= seqs
            assert max(rows["collective_seq_id"].to_list()) == max(seqs)
    finally:
        os.killpg(job.pid, 9)
        job.wait()
        if job.stdout is not None:
            job.stdout.close()
