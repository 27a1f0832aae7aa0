"""Python stacks of a stalled process: taking them (real py-spy), reading them, judging them.

The py-spy tests run the real binary against real stuck Python subprocesses.  They skip
where py-spy is missing, and fail instead under CI (set CI), where the test extras
install it.  The parser samples are written in the real formats: py-spy 0.4 dump text
and --json, CPython's faulthandler (as PyTorch's control plane /handler/dump_traceback
returns it) and the traceback module; the faulthandler and traceback cases also read
what the real producers print in this interpreter.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import pytest

from ncclscope.evidence.stacks import (
    STACK_KINDS,
    STACK_RULES,
    Frame,
    StackVerdict,
    ThreadStack,
    classify_stack,
    find_py_spy,
    parse_stacks,
    take_stack,
)

DEADLINE_S = 60.0  # generous: CI has 2 shared cores


def _py_spy() -> str:
    exe = find_py_spy()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("py-spy is not installed; CI installs it with the test extras")
        pytest.skip("py-spy not installed here (pip install py-spy); CI runs this test")
    return exe


def _fake(tmp_path: Path, body: str, name: str = "py-spy") -> str:
    """A stand-in py-spy: a shell script, so it starts in milliseconds even on a busy host."""
    path = tmp_path / "bin" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def _gone(pid: int) -> bool:
    """Exited: no /proc entry, or a zombie its (possibly non-reaping) parent still holds."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


# --- real py-spy against real stuck processes -----------------------------------------

STUCK = {
    "lock": (
        "wait_for_lock",
        """
import threading, time
lock = threading.Lock()
def hold_forever():
    with lock:
        time.sleep(3600)
def wait_for_lock():
    lock.acquire()
threading.Thread(target=hold_forever, name="holder", daemon=True).start()
while not lock.locked():
    time.sleep(0.01)
print("ready", flush=True)
wait_for_lock()
""",
    ),
    "sleep": (
        "nap",
        """
import time
def nap():
    time.sleep(3600)
print("ready", flush=True)
nap()
""",
    ),
    "compute": (
        "spin",
        """
def spin():
    x = 0
    while True: x += 1  # one line: py-spy may catch the loop at its test or its body
print("ready", flush=True)
spin()
""",
    ),
    "io": (
        "read_pipe",
        """
import sys
def read_pipe():
    return sys.stdin.buffer.read(1)
print("ready", flush=True)
read_pipe()
""",
    ),
}


@pytest.fixture
def stuck(tmp_path):
    procs: list[subprocess.Popen[bytes]] = []

    def start(kind: str) -> subprocess.Popen[bytes]:
        script = tmp_path / f"stuck_{kind}.py"
        script.write_text(STUCK[kind][1])
        proc = subprocess.Popen(
            [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        procs.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(STUCK))
def test_py_spy_names_what_a_stuck_process_does(kind, stuck, tmp_path):
    exe = _py_spy()
    function = STUCK[kind][0]
    proc = stuck(kind)
    # "ready" is printed just before the call: poll until the stack shows the call.
    deadline = time.monotonic() + DEADLINE_S
    seen: list[StackVerdict] = []
    while time.monotonic() < deadline:
        ask = take_stack(tmp_path, proc.pid, rank=3, timeout_s=20.0, py_spy=exe)
        assert ask.outcome == "answered", ask
        assert (ask.what, ask.via, ask.rank, ask.pid) == ("stack", "py-spy", 3, proc.pid)
        assert ask.file == "stacks/rank3.txt"
        text = (tmp_path / ask.file).read_text()
        assert ask.size_bytes == len(text.encode())
        verdict = classify_stack(parse_stacks(text))
        seen.append(verdict)
        if verdict.frame.endswith(f" in {function}"):
            break
    verdict = seen[-1]
    assert verdict.kind == kind, seen
    assert verdict.frame == f"{tmp_path}/stuck_{kind}.py:{_call_line(kind)} in {function}"
    assert verdict.thread == "MainThread"


def _call_line(kind: str) -> int:
    """The script's line of the call the process is stuck in."""
    call = {
        "lock": "lock.acquire()",
        "sleep": "time.sleep(3600)",
        "compute": "x += 1",
        "io": "sys.stdin.buffer.read(1)",
    }[kind]
    return 1 + next(i for i, line in enumerate(STUCK[kind][1].splitlines()) if call in line)


@pytest.mark.slow
def test_py_spy_without_pid_names_the_file_by_pid(stuck, tmp_path):
    exe = _py_spy()
    proc = stuck("sleep")
    ask = take_stack(tmp_path, proc.pid, timeout_s=20.0, py_spy=exe)
    assert (ask.outcome, ask.file, ask.target) == (
        "answered",
        f"stacks/pid{proc.pid}.txt",
        f"pid {proc.pid}",
    )


@pytest.mark.slow
def test_a_stopped_process_is_read_without_stopping_it(stuck, tmp_path):
    """A frozen node's processes are stopped (SIGSTOP): py-spy cannot suspend them again,
    and reads their memory with --nonblocking instead."""
    exe = _py_spy()
    proc = stuck("sleep")
    # "ready" is printed just before the call: stop it only once it sleeps in ``nap``
    # (a busy machine may stop it before; then its stack is rightly ``<module>``).
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        running = take_stack(tmp_path, proc.pid, rank=2, timeout_s=20.0, py_spy=exe)
        text = (tmp_path / "stacks/rank2.txt").read_text() if running.file else ""
        if classify_stack(parse_stacks(text)).frame.endswith(" in nap"):
            break
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        ask = take_stack(tmp_path, proc.pid, rank=2, timeout_s=20.0, py_spy=exe)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert (ask.outcome, ask.via) == ("answered", "py-spy --nonblocking"), ask
    verdict = classify_stack(parse_stacks((tmp_path / "stacks/rank2.txt").read_text()))
    assert verdict.frame.endswith(" in nap")


@pytest.mark.slow
def test_py_spy_on_a_process_that_exited_is_an_error(tmp_path):
    exe = _py_spy()
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    ask = take_stack(tmp_path, proc.pid, rank=1, timeout_s=20.0, py_spy=exe)
    assert ask.outcome == "error", ask
    assert "is gone" in ask.why
    assert ask.file is None
    assert not (tmp_path / "stacks" / "rank1.txt").exists()


# --- take_stack with stand-in py-spy ---------------------------------------------------


def test_a_hanging_py_spy_is_killed_with_its_group_and_gives_no_answer(tmp_path):
    pids = tmp_path / "pids"
    # each attempt records itself and a helper in its process group, then hangs
    exe = _fake(tmp_path, f"echo $$ >> {pids}\nsleep 3600 &\necho $! >> {pids}\nwait")
    timeout_s = 4.0
    t0 = time.monotonic()
    ask = take_stack(tmp_path, os.getpid(), rank=2, timeout_s=timeout_s, py_spy=exe)
    took = time.monotonic() - t0
    assert ask.outcome == "no_answer", ask
    assert "within 4 s" in ask.why
    assert "py-spy, then py-spy --nonblocking" in ask.why
    assert ask.file is None
    assert took < timeout_s + 3.0  # the bound, plus the kills' own time
    recorded = [int(p) for p in pids.read_text().split()] if pids.exists() else []
    deadline = time.monotonic() + DEADLINE_S
    while not all(_gone(p) for p in recorded) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in recorded if not _gone(p)]
    for p in left:  # a failing run must not leak its helpers either
        os.kill(p, signal.SIGKILL)
    assert left == []


def test_blocking_attempt_past_its_share_falls_back_to_nonblocking(tmp_path):
    sample = tmp_path / "sample.txt"
    sample.write_text(PY_SPY_TEXT)
    exe = _fake(
        tmp_path,
        f'case "$*" in *--nonblocking*) cat {sample} ;; *) exec sleep 3600 ;; esac',
    )
    ask = take_stack(tmp_path, 31178, rank=0, timeout_s=4.0, py_spy=exe)
    assert (ask.outcome, ask.via) == ("answered", "py-spy --nonblocking"), ask
    assert classify_stack(parse_stacks((tmp_path / "stacks/rank0.txt").read_text())).kind == (
        "data_loader"
    )


def test_no_py_spy_is_unavailable(tmp_path, monkeypatch):
    ask = take_stack(tmp_path, os.getpid(), rank=0, py_spy=str(tmp_path / "nope"))
    assert ask.outcome == "unavailable"
    assert "pip install py-spy" in ask.why
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    assert find_py_spy() is None
    ask = take_stack(tmp_path, os.getpid())
    assert (ask.outcome, ask.target) == ("unavailable", f"pid {os.getpid()}")
    assert "pip install py-spy" in ask.why


def test_py_spy_beside_the_interpreter_is_found(tmp_path, monkeypatch):
    exe = _fake(tmp_path, "exit 0")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "executable", str(Path(exe).parent / "python"))
    assert find_py_spy() == exe


@pytest.mark.parametrize(
    "stderr",
    [
        # py-spy as a user without ptrace rights
        "Permission Denied: Try running again with elevated permissions by going "
        "'sudo env \"PATH=$PATH\" !!'",
        # as root in a container without SYS_PTRACE
        "Permission Denied\n\nIt looks like you are running in a docker container. Please make"
        " sure you started your container with the SYS_PTRACE capability.",
        "Error: Operation not permitted (os error 1)",
    ],
)
def test_ptrace_denied_is_refused_with_what_grants_it(tmp_path, stderr):
    exe = _fake(tmp_path, f"cat >&2 <<'EOF'\n{stderr}\nEOF\nexit 1")
    ask = take_stack(tmp_path, os.getpid(), rank=4, py_spy=exe)
    assert ask.outcome == "refused", ask
    for grant in ("ptrace_scope", "CAP_SYS_PTRACE", "kubectl debug --profile=sysadmin"):
        assert grant in ask.why
    assert ask.file is None


def test_other_py_spy_errors_keep_its_message_without_the_backtrace(tmp_path):
    exe = _fake(
        tmp_path,
        "echo 'Error: Failed to find python version from target process' >&2\n"
        "echo 'Stack backtrace:' >&2\necho '   0: anyhow::error' >&2\nexit 1",
    )
    ask = take_stack(tmp_path, os.getpid(), py_spy=exe)
    assert ask.outcome == "error"
    assert ask.why == (
        "py-spy failed (exit 1): Error: Failed to find python version from target process"
    )


def test_py_spy_printing_no_thread_is_garbage_and_the_file_is_kept(tmp_path):
    exe = _fake(tmp_path, "echo 'hello, not a stack'")
    ask = take_stack(tmp_path, os.getpid(), rank=6, py_spy=exe)
    assert (ask.outcome, ask.file) == ("garbage", "stacks/rank6.txt")
    assert (tmp_path / "stacks/rank6.txt").read_text() == "hello, not a stack\n"


def test_source_lines_are_read_through_the_targets_proc_root(tmp_path):
    # /proc/<pid>/root is the target's filesystem; a fake proc root stands in for it
    proc_root = tmp_path / "proc"
    job = proc_root / "77" / "root" / "job"
    job.mkdir(parents=True)
    (job / "train.py").write_text("import time\n\ndef nap():\n    time.sleep(60)\n")
    sample = tmp_path / "dump.txt"
    sample.write_text('Thread 77 (idle): "MainThread"\n    nap (/job/train.py:4)\n')
    exe = _fake(tmp_path, f"cat {sample}")
    ask = take_stack(tmp_path, 77, rank=0, py_spy=exe, proc_root=proc_root)
    text = (tmp_path / "stacks/rank0.txt").read_text()
    assert ask.outcome == "answered"
    assert "# source /job/train.py:4: time.sleep(60)" in text
    assert classify_stack(parse_stacks(text)).kind == "sleep"


# --- parse: py-spy text ----------------------------------------------------------------

#: py-spy 0.4.3 ``dump`` of a rank waiting for its DataLoader worker (short filenames)
PY_SPY_TEXT = """\
Process 31178: /venv/bin/python /job/dl.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 31178 (idle): "MainThread"
    _PollLikeSelector.select (selectors.py:415)
    wait (multiprocessing/connection.py:947)
    Connection._poll (multiprocessing/connection.py:440)
    _ConnectionBase.poll (multiprocessing/connection.py:257)
    Queue.get (multiprocessing/queues.py:113)
    _MultiProcessingDataLoaderIter._try_get_data (torch/utils/data/dataloader.py:1291)
    _MultiProcessingDataLoaderIter._get_data (torch/utils/data/dataloader.py:1464)
    _MultiProcessingDataLoaderIter._next_data (torch/utils/data/dataloader.py:1505)
    _BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:725)
    train_step (dl.py:8)
    <module> (dl.py:11)
Thread 31182 (idle): "QueueFeederThread"
    Condition.wait (threading.py:327)
    Queue._feed (multiprocessing/queues.py:231)
    Thread.run (threading.py:982)
    Thread._bootstrap_inner (threading.py:1045)
    Thread._bootstrap (threading.py:1002)
"""


def test_py_spy_text():
    main, feeder = parse_stacks(PY_SPY_TEXT)
    assert (main.thread_id, main.name, main.active, main.gil, main.pid) == (
        31178,
        "MainThread",
        False,
        False,
        31178,
    )
    assert main.frames[0] == Frame("_PollLikeSelector.select", "selectors.py", 415)
    assert main.frames[-1] == Frame("<module>", "dl.py", 11)
    assert len(main.frames) == 11
    assert (feeder.name, [f.function for f in feeder.frames][:2]) == (
        "QueueFeederThread",
        ["Condition.wait", "Queue._feed"],
    )


def test_py_spy_text_active_gil_locals_and_native_frames():
    text = """\
Thread 0x7F3A12345700 (active+gil): "worker"
    spin (/job/busy.py:5)
        Arguments:
            n: 10
        Locals:
            x: 1234
    ncclAllReduce (libnccl.so.2)
Thread 2037 (idle)
    nap (loc.py:4)
    <module> (loc.py:6)
"""
    worker, unnamed = parse_stacks(text)
    assert (worker.thread_id, worker.active, worker.gil) == (0x7F3A12345700, True, True)
    assert worker.frames == (
        Frame("spin", "/job/busy.py", 5),
        Frame("ncclAllReduce", "libnccl.so.2", None),
    )
    # --locals drops the thread name; the frames still say it is the main thread
    assert unnamed.name is None
    assert unnamed.is_main


# --- parse: py-spy --json ---------------------------------------------------------------

PY_SPY_JSON = [
    {
        "pid": 29461,
        "thread_id": 140588064298688,
        "thread_name": "holder",
        "os_thread_id": 29463,
        "active": False,
        "owns_gil": False,
        "frames": [
            {
                "name": "hold_forever",
                "filename": "/tmp/tgt.py",
                "module": None,
                "short_filename": "tgt.py",
                "line": 5,
                "locals": None,
                "is_entry": True,
                "is_shim_entry": False,
            },
            {
                "name": "Thread.run",
                "filename": "/usr/lib/python3.11/threading.py",
                "module": None,
                "short_filename": "threading.py",
                "line": 982,
                "locals": None,
                "is_entry": False,
                "is_shim_entry": False,
            },
        ],
        "process_info": None,
    },
    {
        "pid": 29461,
        "thread_id": 140588075371392,
        "thread_name": "MainThread",
        "os_thread_id": 29461,
        "active": True,
        "owns_gil": True,
        "frames": [
            {
                "name": "wait_for_lock",
                "filename": "/tmp/tgt.py",
                "module": None,
                "short_filename": "tgt.py",
                "line": 7,
                "locals": None,
                "is_entry": False,
                "is_shim_entry": False,
            }
        ],
        "process_info": None,
    },
]


def test_py_spy_json():
    holder, main = parse_stacks(json.dumps(PY_SPY_JSON, indent=2))
    assert (holder.thread_id, holder.name, holder.active, holder.pid) == (
        29463,
        "holder",
        False,
        29461,
    )
    assert holder.frames == (
        Frame("hold_forever", "/tmp/tgt.py", 5),
        Frame("Thread.run", "/usr/lib/python3.11/threading.py", 982),
    )
    assert (main.name, main.active, main.gil) == ("MainThread", True, True)


def test_truncated_py_spy_json_gives_the_whole_threads_it_holds():
    text = json.dumps(PY_SPY_JSON, indent=2)
    cut = text[: text.index('"MainThread"')]
    [holder] = parse_stacks(cut)
    assert holder.name == "holder"


# --- parse: faulthandler / torch control plane --------------------------------------------

#: torch 2.13's control plane ``POST /handler/dump_traceback`` body (faulthandler, all
#: threads, written by the handler's own thread), as answered by a worker here
CONTROL_PLANE_DUMP = """\
Current thread 0x00007f74968266c0 (most recent call first):
  <no Python frame>

Thread 0x00007f74980296c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/usr/lib/python3.11/threading.py", line 629 in wait
  File "/job/train.py", line 11 in waiter
  File "/usr/lib/python3.11/threading.py", line 982 in run
  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap_inner
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Thread 0x00007f74b9dbbb80 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 725 in __next__
  File "/job/train.py", line 20 in train_step
  File "/job/train.py", line 31 in <module>
"""


def test_control_plane_dump_traceback():
    handler, waiter, main = parse_stacks(CONTROL_PLANE_DUMP)
    assert (handler.thread_id, handler.dumping, handler.frames) == (0x7F74968266C0, True, ())
    assert waiter.frames[0] == Frame("wait", "/usr/lib/python3.11/threading.py", 327)
    assert waiter.frames[2] == Frame("waiter", "/job/train.py", 11)
    assert not waiter.is_main
    assert main.is_main
    assert classify_stack([handler, waiter, main]) == StackVerdict(
        kind="data_loader",
        frame="/job/train.py:20 in train_step",
        thread="MainThread",
        rule="torch.utils.data",
        inner="/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py:725 in __next__",
    )


def test_torch_debug_server_stacks_dump_sets_each_threads_rank():
    # torch.distributed.debug's "stacks" dump: one "=== Rank i: addr ===" per rank
    text = (
        "=== Rank 0: node-1:29510 ===\n"
        + CONTROL_PLANE_DUMP
        + "=== Rank 1: node-2:29510 ===\n"
        + "Thread 0x00007f0000000001 (most recent call first):\n"
        + '  File "/job/train.py", line 40 in <module>\n'
    )
    threads = parse_stacks(text)
    assert [t.rank for t in threads] == [0, 0, 0, 1]


def test_python_314_faulthandler_thread_names():
    # 3.14 adds the OS thread name; the main thread's is the program's, not MainThread
    text = (
        "Thread 0x00007f0000000002 [pt_data_worker] (most recent call first):\n"
        '  File "/usr/lib/python3.14/threading.py", line 373 in wait\n'
        "\n"
        "Current thread 0x00007f0000000001 [python3] (most recent call first):\n"
        "  Garbage-collecting\n"
        '  File "/job/train.py", line 12 in step\n'
        '  File "/job/train.py", line 30 in <module>\n'
    )
    worker, main = parse_stacks(text)
    assert worker.name == "pt_data_worker"
    assert (main.name, main.is_main, len(main.frames)) == ("python3", True, 2)


def test_real_faulthandler_output_of_this_interpreter(tmp_path):
    started = threading.Event()
    release = threading.Event()

    def parked_here() -> None:
        started.set()
        release.wait()

    t = threading.Thread(target=parked_here, name="parked", daemon=True)
    t.start()
    try:
        assert started.wait(DEADLINE_S)
        with tempfile.TemporaryFile("w+") as f:
            faulthandler.dump_traceback(f, all_threads=True)
            f.seek(0)
            text = f.read()
    finally:
        release.set()
        t.join(DEADLINE_S)
    threads = parse_stacks(text)
    [parked] = [t for t in threads if any(f.function == "parked_here" for f in t.frames)]
    assert parked.frames[0].file.endswith("threading.py")
    [current] = [t for t in threads if t.dumping]
    assert current.frames[0].function == "test_real_faulthandler_output_of_this_interpreter"
    assert classify_stack([parked]).kind == "lock"
    assert classify_stack([parked]).frame.endswith(" in parked_here")


def test_faulthandler_single_thread_and_unknown_frames():
    text = 'Stack (most recent call first):\n  File "???", line ??? in ???\n'
    [t] = parse_stacks(text)
    assert t.frames == (Frame("???", "???", None),)


# --- parse: traceback module ----------------------------------------------------------------


def test_traceback_style_is_read_outermost_last_with_source_lines():
    text = """\
# Thread: MainThread(140000000000001)
  File "/job/train.py", line 31, in <module>
    main()
  File "/job/train.py", line 20, in main
    lock.acquire()

# Thread: saver(140000000000002)
  File "/usr/lib/python3.11/threading.py", line 1002, in _bootstrap
    self._bootstrap_inner()
"""
    main, saver = parse_stacks(text)
    assert (main.name, main.thread_id) == ("MainThread", 140000000000001)
    assert main.frames == (
        Frame("main", "/job/train.py", 20, "lock.acquire()"),
        Frame("<module>", "/job/train.py", 31, "main()"),
    )
    assert saver.name == "saver"
    assert classify_stack([main, saver]).kind == "lock"


def test_real_traceback_module_output():
    def inner() -> str:
        return "".join(traceback.format_stack())

    [t] = parse_stacks(inner())
    assert (t.frames[0].function, t.frames[0].source) == (
        "inner",
        'return "".join(traceback.format_stack())',
    )
    assert t.frames[1].function == "test_real_traceback_module_output"

    # an exception's traceback ends at its exception line
    def fail() -> None:
        raise ValueError("boom")

    try:
        fail()
    except ValueError as e:
        text = "".join(traceback.format_exception(e)) + "after the error\n"
    [t] = parse_stacks(text)
    assert t.frames[0].source == 'raise ValueError("boom")'


# --- parse: damaged input -----------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\x00\xff garbage \n\n ))) (((",
        "Thread abc (idle): nothing\n    (:)\n",
        '  File "x.py", line',
        "[1, 2, {",
        '{"frames": 3}',
        "Thread 12 (idle)",
    ],
)
def test_garbage_never_raises(text):
    threads = parse_stacks(text)
    assert all(isinstance(t, ThreadStack) for t in threads)
    assert classify_stack(threads).kind in STACK_KINDS


def test_truncated_py_spy_text_keeps_what_came_before_the_cut():
    cut = PY_SPY_TEXT[: PY_SPY_TEXT.index("Queue._feed") + 8]
    main, feeder = parse_stacks(cut)
    assert len(main.frames) == 11
    assert [f.function for f in feeder.frames] == ["Condition.wait"]


# --- classify ---------------------------------------------------------------------------------


def _stack(*frames: str, name: str = "MainThread", status: str = "idle") -> str:
    return f'Thread 1 ({status}): "{name}"\n' + "".join(f"    {f}\n" for f in frames)


@pytest.mark.parametrize(
    ("text", "kind", "frame"),
    [
        (
            _stack(
                "all_reduce (torch/distributed/distributed_c10d.py:2950)",
                "wrapper (torch/distributed/c10d_logger.py:81)",
                "sync_grads (train.py:40)",
                "<module> (train.py:90)",
            ),
            "in_collective",
            "train.py:40 in sync_grads",
        ),
        (
            # DCP's save calls a collective: waiting for peers outranks the checkpoint
            _stack(
                "barrier (torch/distributed/distributed_c10d.py:4800)",
                "_DistWrapper.broadcast_object (torch/distributed/checkpoint/utils.py:120)",
                "save (torch/distributed/checkpoint/state_dict_saver.py:160)",
                "save_ckpt (train.py:60)",
            ),
            "in_collective",
            "train.py:60 in save_ckpt",
        ),
        (
            _stack(
                "all_reduce (deepspeed/comm/torch.py:190)",
                "all_reduce (deepspeed/comm/comm.py:520)",
                "step (train.py:33)",
            ),
            "in_collective",
            "train.py:33 in step",
        ),
        (
            _stack(
                "_save (torch/serialization.py:1180)",
                "save (torch/serialization.py:965)",
                "save_ckpt (train.py:61)",
                "<module> (train.py:90)",
            ),
            "checkpoint",
            "train.py:61 in save_ckpt",
        ),
        (
            _stack(
                "DeepSpeedEngine._save_checkpoint (deepspeed/runtime/engine.py:3400)",
                "DeepSpeedEngine.save_checkpoint (deepspeed/runtime/engine.py:3300)",
                "maybe_save (train.py:70)",
            ),
            "checkpoint",
            "train.py:70 in maybe_save",
        ),
        (PY_SPY_TEXT, "data_loader", "dl.py:8 in train_step"),
        (
            _stack(
                "Condition.wait (threading.py:327)",
                "Queue.get (queue.py:171)",
                "next_job (train.py:12)",
            ),
            "lock",
            "train.py:12 in next_job",
        ),
        (
            _stack(
                "Popen._try_wait (subprocess.py:1959)",
                "Popen._wait (subprocess.py:2001)",
                "Popen.wait (subprocess.py:1264)",
                "upload (train.py:80)",
            ),
            "io",
            "train.py:80 in upload",
        ),
        (
            _stack("socket.accept (socket.py:294)", "serve (train.py:5)"),
            "io",
            "train.py:5 in serve",
        ),
        (
            # an idle thread in a C call whose line the dump did not carry
            _stack("step (train.py:14)", "<module> (train.py:90)"),
            "unknown",
            "train.py:14 in step",
        ),
        (
            _stack("forward (model.py:14)", "<module> (train.py:90)", status="active+gil"),
            "compute",
            "model.py:14 in forward",
        ),
        (
            _stack("step (train.py:14)") + "\n# source train.py:14: handle.wait()\n",
            "in_collective",
            "train.py:14 in step",
        ),
    ],
)
def test_classify(text, kind, frame):
    verdict = classify_stack(parse_stacks(text))
    assert (verdict.kind, verdict.frame) == (kind, frame), verdict


def test_the_main_thread_is_judged_over_a_busier_worker():
    text = _stack("spin (work.py:3)", name="worker", status="active+gil") + _stack(
        "Condition.wait (threading.py:327)", "Thread.join (threading.py:1112)", "main (train.py:9)"
    )
    verdict = classify_stack(parse_stacks(text))
    assert (verdict.thread, verdict.kind, verdict.frame) == (
        "MainThread",
        "lock",
        "train.py:9 in main",
    )
    # without a main thread, the running one
    worker_only = classify_stack(parse_stacks(text)[:1])
    assert (worker_only.thread, worker_only.kind) == ("worker", "compute")


def test_nothing_to_judge_is_unknown():
    assert classify_stack([]).kind == "unknown"
    assert classify_stack(parse_stacks(CONTROL_PLANE_DUMP)[:1]).kind == "unknown"


def test_every_kind_but_unknown_has_a_rule_and_rules_are_ordered_by_priority():
    kinds = [r.kind for r in STACK_RULES]
    assert set(kinds) == set(STACK_KINDS) - {"unknown"}
    # a kind's rules sit together, in the documented priority order
    order = list(dict.fromkeys(kinds))
    assert order == [
        "in_collective",
        "checkpoint",
        "data_loader",
        "lock",
        "sleep",
        "io",
        "compute",
    ]
    assert kinds == sorted(kinds, key=order.index)


def test_frames_print_as_file_line_function():
    assert str(Frame("f", "x.py", 3)) == "x.py:3 in f"
    assert str(Frame("ncclAllReduce", "libnccl.so.2", None)) == "libnccl.so.2 in ncclAllReduce"
