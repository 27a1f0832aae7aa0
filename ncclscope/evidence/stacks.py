"""Python stacks of a stalled training process, and what they say.

Most NCCL watchdog timeouts have a CPU-side cause that no NCCL log shows: one rank is
stuck in Python (the data loader, a checkpoint write, a lock, a sleep, a socket) while
its peers wait in the collective.  This module takes that rank's stack from outside
(:func:`take_stack`, with py-spy), reads stacks in the formats a job can leave behind
(:func:`parse_stacks`), and says what the stack means (:func:`classify_stack`).

A stack as ``py-spy dump --full-filenames`` prints it, which is what
``stacks/rank<R>.txt`` holds, with the source lines :func:`take_stack` adds::

    Process 4321: python /job/train.py
    Python v3.11.7 (/usr/bin/python3.11)

    Thread 4321 (idle): "MainThread"
        save_shard (/job/train.py:52)
        train (/job/train.py:80)
        <module> (/job/train.py:97)

    # ncclscope: source lines read from /proc/4321/root when the stack was taken
    # source /job/train.py:52: with self.shard_lock:

reads as ``StackVerdict(kind="lock", frame="/job/train.py:52 in save_shard", ...)``: a
rank stuck outside NCCL, a CPU-side hang.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

from ncclscope.evidence.manifest import Ask, Outcome

__all__ = [
    "STACK_KINDS",
    "STACK_RULES",
    "Frame",
    "StackKind",
    "StackRule",
    "StackVerdict",
    "ThreadStack",
    "classify_stack",
    "find_py_spy",
    "is_user_file",
    "parse_stacks",
    "take_stack",
]

StackKind = Literal[
    "in_collective", "checkpoint", "data_loader", "lock", "sleep", "io", "compute", "unknown"
]
#: in_collective: waiting in a torch.distributed / DeepSpeed collective (the peers are to
#: blame, not this rank); checkpoint: saving or loading a checkpoint; data_loader: waiting
#: for the next batch; lock: waiting on a lock, condition, event, queue or join; sleep:
#: in time.sleep; io: waiting on a socket, pipe, file or child process; compute: running
#: the user's own code; unknown: none of these could be told from the stack.
STACK_KINDS: tuple[StackKind, ...] = get_args(StackKind)


@dataclass(frozen=True)
class Frame:
    """One Python frame.

    ``file`` is as the dump wrote it: absolute with ``--full-filenames`` and in
    faulthandler output, package-relative (``torch/utils/data/dataloader.py``) in plain
    py-spy output.  ``line`` is None where the dump gave none (py-spy native frames,
    faulthandler's ``???``).  ``source`` is the text of that line when the dump carried
    it (traceback style, or the ``# source`` lines :func:`take_stack` appends).
    """

    function: str
    file: str
    line: int | None
    source: str | None = None

    def __str__(self) -> str:
        """``/job/train.py:8 in train_step``."""
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where} in {self.function}"


@dataclass(frozen=True)
class ThreadStack:
    """One thread's stack, frames innermost (where it is now) first.

    ``active`` is py-spy's idle/active flag (None where the format has none: faulthandler,
    tracebacks); ``gil`` whether it held the GIL; ``dumping`` marks faulthandler's
    ``Current thread`` (the thread that wrote the dump, not one that was stuck);
    ``pid`` comes from py-spy's ``Process N:`` line, ``rank`` from the
    ``=== Rank N: addr ===`` sections of torch's debug server.
    """

    thread_id: int | None
    name: str | None
    active: bool | None
    frames: tuple[Frame, ...]
    gil: bool | None = None
    dumping: bool = False
    pid: int | None = None
    rank: int | None = None

    @property
    def is_main(self) -> bool:
        """Named MainThread, or running a script's top level (``<module>``, runpy).

        The frames decide where there is no Python name: faulthandler output has none
        before Python 3.14, and from 3.14 its ``[name]`` is the OS thread name, which for
        the main thread is the program's (``[python3]``).
        """
        if self.name == "MainThread":
            return True
        return bool(self.frames) and self.frames[-1].function in _MAIN_ENTRIES


_MAIN_ENTRIES = frozenset({"<module>", "_run_module_as_main", "_run_code"})


@dataclass(frozen=True)
class StackVerdict:
    """What a stack says.

    ``frame`` is the frame that explains ``kind`` for the user: the caller, in their own
    code where there is one, of the library code the thread waits in (the line that
    called ``next(loader)``, ``lock.acquire()``'s caller); ``inner`` is where the thread
    actually is (``Queue.get``, ``all_reduce``).  ``rule`` names the rule that matched.
    """

    kind: StackKind
    frame: str
    thread: str
    rule: str
    inner: str = ""


def _names(*names: str) -> re.Pattern[str]:
    """A function-name pattern that also accepts py-spy's qualified ``Class.name``."""
    return re.compile(rf"^(?:[\w<>]+\.)*(?:{'|'.join(names)})$")


def _path(pattern: str) -> re.Pattern[str]:
    """A file pattern anchored at a path component, for full and package-relative paths."""
    return re.compile(rf"(?:^|/){pattern}")


@dataclass(frozen=True)
class StackRule:
    """One row of the classifier's table: which frames mean which kind.

    A frame matches when every given pattern matches (``file`` and ``source`` by search,
    ``function`` as written by :func:`_names`).  ``innermost`` rules look at the
    innermost frame only: they read C calls (``lock.acquire()``, ``time.sleep()``,
    ``sock.recv()``) that leave no Python frame, from the source line of the frame that
    made them.  ``user`` asks for a frame in the user's own files, ``busy`` for a thread
    py-spy did not call idle.
    """

    kind: StackKind
    name: str
    file: re.Pattern[str] | None = None
    function: re.Pattern[str] | None = None
    source: re.Pattern[str] | None = None
    innermost: bool = False
    user: bool = False
    busy: bool = False

    def matches(self, thread: ThreadStack, index: int) -> bool:
        """Whether ``thread.frames[index]`` is one of this rule's frames."""
        frame = thread.frames[index]
        if self.innermost and index != 0:
            return False
        if self.busy and thread.active is False:
            return False
        if self.user and not is_user_file(frame.file):
            return False
        if self.file is not None and not self.file.search(_norm(frame.file)):
            return False
        if self.function is not None and not self.function.match(frame.function):
            return False
        return self.source is None or (
            frame.source is not None and self.source.search(frame.source) is not None
        )


_COLLECTIVES = _names(
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_coalesced",
    "_all_gather_base",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "send",
    "recv",
    "send_object_list",
    "recv_object_list",
    "batch_isend_irecv",
    "barrier",
    "monitored_barrier",
    "_store_based_barrier",
)

#: The classifier's table, highest priority first: the first rule with a matching frame
#: in the chosen thread names the kind.  The order is what makes it right: a collective
#: inside a checkpoint save is a wait for peers (in_collective); a queue wait inside the
#: data loader is the data loader, not a lock; a file write inside a save is the save.
STACK_RULES: tuple[StackRule, ...] = (
    StackRule("in_collective", "torch.distributed collective",
              _path(r"torch/distributed/distributed_c10d\.py$"), _COLLECTIVES),
    StackRule("in_collective", "torch functional collective",
              _path(r"torch/distributed/_functional_collectives\.py$")),
    StackRule("in_collective", "deepspeed.comm", _path(r"deepspeed/comm/")),
    # c10d's C++ waits, visible only in --native dumps
    StackRule("in_collective", "c10d native wait",
              function=re.compile(r"c10d::.*(?:[Ww]ait|[Bb]arrier)|^nccl[A-Z]\w*")),
    # Work.wait() is a C++ method: no Python frame, only the caller's source line
    StackRule("in_collective", "Work.wait()",
              source=re.compile(r"\b(?:work|handle|req|request|fut)\w*(?:\[[^\]]*\])?\.wait\("),
              innermost=True),
    StackRule("checkpoint", "torch.distributed.checkpoint",
              _path(r"torch/distributed/checkpoint/")),
    StackRule("checkpoint", "torch.save/torch.load", _path(r"torch/serialization\.py$")),
    StackRule("checkpoint", "deepspeed checkpoint", _path(r"deepspeed/runtime/checkpoint_engine/")),
    StackRule("checkpoint", "deepspeed engine checkpoint", _path(r"deepspeed/runtime/engine\.py$"),
              re.compile(r"^(?:[\w<>]+\.)*_?(?:save|load)\w*checkpoint\w*$")),
    StackRule("checkpoint", "safetensors", _path(r"safetensors/")),
    StackRule("data_loader", "torch.utils.data", _path(r"torch/utils/data/")),
    StackRule("lock", "threading wait",
              _path(r"threading\.py$"),
              _names("acquire", "wait", "wait_for", "join", "_wait_for_tstate_lock", "__enter__")),
    StackRule("lock", "queue", _path(r"queue\.py$"), _names("get", "put", "join")),
    StackRule("lock", "multiprocessing queue",
              _path(r"multiprocessing/(?:queues|synchronize)\.py$"),
              _names("get", "put", "join", "acquire", "wait", "__enter__")),
    StackRule("lock", "future result", _path(r"concurrent/futures/_base\.py$"),
              _names("result", "wait", "as_completed")),
    StackRule("lock", "lock.acquire()",
              source=re.compile(r"\.acquire\(|^\s*with\b.*lock", re.IGNORECASE), innermost=True),
    StackRule("sleep", "time.sleep()", source=re.compile(r"\bsleep\("), innermost=True),
    StackRule("io", "socket", _path(r"(?:socket|ssl|selectors)\.py$")),
    StackRule("io", "subprocess", _path(r"subprocess\.py$"),
              _names("wait", "_wait", "_try_wait", "communicate", "_communicate", "run", "call",
                     "check_call", "check_output")),
    StackRule("io", "multiprocessing connection", _path(r"multiprocessing/connection\.py$")),
    StackRule("io", "http", _path(r"(?:http/client\.py$|urllib3/|requests/|fsspec/|botocore/)")),
    StackRule("io", "read/recv call",
              source=re.compile(
                  r"\.(?:recv|recv_into|recvfrom|accept|read|readline|readlines|readinto|"
                  r"write|flush|connect|sendall)\(|\bos\.(?:read|write|wait|waitpid)\(|"
                  r"\bselect\(|\binput\("),
              innermost=True),
    StackRule("compute", "running user code", innermost=True, user=True, busy=True),
)  # fmt: skip


# --- which files are the user's -------------------------------------------------------

#: top-level packages py-spy shows package-relative that are libraries, not user code
_LIBRARIES = frozenset(
    {
        "torch", "deepspeed", "accelerate", "lightning", "pytorch_lightning", "transformers",
        "numpy", "apex", "triton", "safetensors", "fsspec", "urllib3", "requests", "tqdm",
        "wandb", "datasets", "megatron", "_pytest", "pluggy", "ncclscope",
    }
)  # fmt: skip
_STDLIB_DIR = re.compile(r"/lib(?:64)?/python\d+(?:\.\d+)?t?/")
_PACKAGES_DIR = re.compile(r"/(?:site|dist)-packages/")


def _norm(path: str) -> str:
    return path.replace("\\", "/")


def is_user_file(path: str) -> bool:
    """Whether ``path`` is the user's own code rather than the stdlib or an installed package.

    >>> is_user_file("/job/train.py"), is_user_file("train.py")
    (True, True)
    >>> is_user_file("/usr/lib/python3.11/threading.py"), is_user_file("threading.py")
    (False, False)
    >>> is_user_file("torch/utils/data/dataloader.py"), is_user_file("<frozen runpy>")
    (False, False)
    """
    p = _norm(path)
    if p.startswith("<frozen") or _PACKAGES_DIR.search(p) or _STDLIB_DIR.search(p):
        return False
    if p.startswith("/") or p.startswith("<"):
        return True
    # py-spy's short names: site-packages files relative to it, stdlib relative to its dir
    top = p.split("/", 1)[0].removesuffix(".py")
    return top not in sys.stdlib_module_names and top not in _LIBRARIES


# --- classify -------------------------------------------------------------------------


def _thread_label(t: ThreadStack) -> str:
    if t.name:
        return t.name
    if t.is_main:
        return "MainThread"
    return "thread" if t.thread_id is None else f"thread {t.thread_id:#x}"


def _pick_thread(threads: Sequence[ThreadStack]) -> ThreadStack | None:
    with_frames = [t for t in threads if t.frames]
    if not with_frames:
        return None
    # The training loop runs in the main thread: its stack is the one that stalls the
    # collective.  Without one (a dump of some threads only), a running thread says more
    # than an idle one, and faulthandler's own dumping thread says nothing.
    return min(
        with_frames,
        key=lambda t: (not t.is_main, t.dumping, t.active is not True, -len(t.frames)),
    )


def _explaining(thread: ThreadStack, rule: StackRule, first: int) -> Frame:
    """The frame that explains a match: the user's call into the matched library code."""
    frames = thread.frames
    if rule.innermost:
        return frames[0]
    last = first
    while last + 1 < len(frames) and rule.matches(thread, last + 1):
        last += 1
    for caller in frames[last + 1 :]:
        if is_user_file(caller.file):
            return caller
    return frames[last + 1] if last + 1 < len(frames) else frames[last]


def classify_stack(threads: Sequence[ThreadStack]) -> StackVerdict:
    """Say what one process's stack shows it doing.

    The thread that matters is the main thread (named ``MainThread``, or running a
    script's ``<module>`` where the format has no names), else the running thread with
    the deepest stack.  Its frames go through :data:`STACK_RULES` in order; the first rule
    with a matching frame names the kind.  No rule: ``unknown``, at the innermost frame
    in the user's code (an idle thread in a C call py-spy cannot see into).  Pass one
    process's threads; split a multi-rank dump by ``ThreadStack.rank`` first.

    >>> stack = parse_stacks('''Thread 7 (idle): "MainThread"
    ...     Queue.get (multiprocessing/queues.py:113)
    ...     _BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:725)
    ...     train_step (train.py:8)
    ...     <module> (train.py:11)''')
    >>> classify_stack(stack)
    StackVerdict(kind='data_loader', frame='train.py:8 in train_step', thread='MainThread', \
rule='torch.utils.data', inner='torch/utils/data/dataloader.py:725 in _BaseDataLoaderIter.__next__')
    """
    thread = _pick_thread(threads)
    if thread is None:
        return StackVerdict("unknown", "", "", "no Python frames")
    for rule in STACK_RULES:
        for i in range(len(thread.frames)):
            if rule.matches(thread, i):
                return StackVerdict(
                    kind=rule.kind,
                    frame=str(_explaining(thread, rule, i)),
                    thread=_thread_label(thread),
                    rule=rule.name,
                    inner=str(thread.frames[i]),
                )
    user = next((f for f in thread.frames if is_user_file(f.file)), thread.frames[0])
    return StackVerdict(
        "unknown", str(user), _thread_label(thread), "no rule matched", str(thread.frames[0])
    )


# --- parse ----------------------------------------------------------------------------

# py-spy dump:   Thread 31178 (active+gil): "MainThread"     (hex ids where no OS id)
_PYSPY_THREAD = re.compile(
    r'^Thread (?P<tid>0[xX][0-9a-fA-F]+|\d+) \((?P<status>[a-z+]+)\)(?:: "(?P<name>.*)")?\s*$'
)
# py-spy dump:       train_step (/job/train.py:8)      native: ncclAllReduce (libnccl.so.2)
_PYSPY_FRAME = re.compile(r"^ {4}(?P<func>\S.*?) \((?P<file>.+?)(?::(?P<line>\d+))?\)\s*$")
_PYSPY_PROCESS = re.compile(r"^Process (?P<pid>\d+): ")
# faulthandler:  Thread 0x00007f74980296c0 (most recent call first):
#                Current thread 0x00007f74968266c0 (most recent call first):
#                Stack (most recent call first):            (all_threads=False)
_FH_THREAD = re.compile(
    r"^(?:(?P<current>Current thread)|Thread) (?P<tid>0x[0-9a-fA-F]+)"
    r"(?: \[(?P<name>[^\]]*)\])? \(most recent call first\):\s*$"
)
_FH_STACK = re.compile(r"^Stack \(most recent call first\):\s*$")
#                  File "/job/train.py", line 8 in train_step
_FH_FRAME = re.compile(r'^ {2}File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<func>.+?)\s*$')
# traceback:     Traceback (most recent call last):     then, outermost first,
#                  File "/job/train.py", line 8, in train_step
#                    return next(it)
_TB_HEADER = re.compile(
    r"^(?:Traceback \(most recent call last\):"
    r"|# Thread: (?P<name>.*?)\((?P<tid>\d+)\)"
    r"|# ThreadID: (?P<tid2>\d+)"
    r"|Exception in thread (?P<name2>.+?)(?: \(\w+\))?:)\s*$"
)
_TB_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+), in (?P<func>.+?)\s*$')
# torch.distributed.debug's stacks dump: === Rank 0: host:port ===
_RANK_SECTION = re.compile(r"^=== Rank (?P<rank>\d+)\b.*===\s*$")
# what take_stack appends:  # source /job/train.py:8: return next(it)
_SOURCE_NOTE = re.compile(r"^# source (?P<file>.+?):(?P<line>\d+): (?P<text>.*)$")


@dataclass
class _Building:
    """A thread being read; frames in the order the format lists them."""

    style: Literal["pyspy", "faulthandler", "traceback"]
    thread_id: int | None = None
    name: str | None = None
    active: bool | None = None
    gil: bool | None = None
    dumping: bool = False
    pid: int | None = None
    rank: int | None = None
    frames: list[Frame] = field(default_factory=list)

    def done(self) -> ThreadStack:
        frames = self.frames[::-1] if self.style == "traceback" else self.frames
        return ThreadStack(
            thread_id=self.thread_id,
            name=self.name,
            active=self.active,
            frames=tuple(frames),
            gil=self.gil,
            dumping=self.dumping,
            pid=self.pid,
            rank=self.rank,
        )


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 0) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


def parse_stacks(text: str) -> list[ThreadStack]:
    """Read the threads' stacks from any of the dumps a stalled job leaves.

    Formats: ``py-spy dump`` text (short or ``--full-filenames``, with or without
    ``--locals``) and ``--json``; CPython's faulthandler (``faulthandler.dump_traceback``,
    which is also what PyTorch's control plane ``/handler/dump_traceback`` returns, and
    torch.distributed.debug's ``=== Rank N: addr ===`` concatenation of it); and the
    traceback module's ``File "x.py", line 12, in f`` blocks (``traceback.print_stack``,
    ``# Thread: name(id)`` dumps of ``sys._current_frames()``).  Frames come out
    innermost first whatever the format's order.  Lines it cannot read are skipped, so a
    truncated dump gives the threads it holds and garbage gives ``[]``; never raises.

    >>> [t] = parse_stacks('''Current thread 0x00007f74980296c0 (most recent call first):
    ...   File "/usr/lib/python3.11/threading.py", line 327 in wait
    ...   File "/job/train.py", line 11 in waiter''')
    >>> t.thread_id == 0x7F74980296C0, t.dumping, [str(f) for f in t.frames]
    (True, True, ['/usr/lib/python3.11/threading.py:327 in wait', '/job/train.py:11 in waiter'])
    """
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        threads = _parse_json(stripped)
        if threads:
            return threads
    return _parse_lines(text)


def _parse_lines(text: str) -> list[ThreadStack]:
    out: list[ThreadStack] = []
    sources: dict[tuple[str, int], str] = {}
    cur: _Building | None = None
    pid: int | None = None
    rank: int | None = None
    last_tb_frame = False

    def finish() -> None:
        nonlocal cur
        if cur is not None and (cur.frames or cur.style != "traceback"):
            out.append(cur.done())
        cur = None

    for raw in text.splitlines():
        line = raw.rstrip("\r\n")
        tb_source = last_tb_frame
        last_tb_frame = False
        if m := _SOURCE_NOTE.match(line):
            sources[(m["file"], int(m["line"]))] = m["text"]
        elif m := _RANK_SECTION.match(line):
            finish()
            rank, pid = int(m["rank"]), None
        elif m := _PYSPY_PROCESS.match(line):
            finish()
            pid = int(m["pid"])
        elif m := _PYSPY_THREAD.match(line):
            finish()
            status = m["status"]
            cur = _Building(
                "pyspy",
                thread_id=_int(m["tid"]),
                name=m["name"],
                active="active" in status,
                gil="gil" in status,
                pid=pid,
                rank=rank,
            )
        elif m := _FH_THREAD.match(line):
            finish()
            cur = _Building(
                "faulthandler",
                thread_id=_int(m["tid"]),
                name=m["name"] or None,
                dumping=m["current"] is not None,
                pid=pid,
                rank=rank,
            )
        elif _FH_STACK.match(line):
            finish()
            cur = _Building("faulthandler", pid=pid, rank=rank)
        elif m := _FH_FRAME.match(line):
            if cur is None or cur.style != "faulthandler":
                finish()
                cur = _Building("faulthandler", pid=pid, rank=rank)
            cur.frames.append(Frame(m["func"], m["file"], _int(m["line"])))
        elif m := _TB_FRAME.match(line):
            if cur is None or cur.style != "traceback":
                finish()
                cur = _Building("traceback", pid=pid, rank=rank)
            cur.frames.append(Frame(m["func"], m["file"], int(m["line"])))
            last_tb_frame = True
        elif m := _TB_HEADER.match(line):
            finish()
            cur = _Building(
                "traceback",
                thread_id=_int(m["tid"] or m["tid2"]),
                name=m["name"] or m["name2"],
                pid=pid,
                rank=rank,
            )
        elif cur is not None and cur.style == "pyspy" and (m := _PYSPY_FRAME.match(line)):
            cur.frames.append(Frame(m["func"], m["file"], _int(m["line"])))
        elif tb_source and cur is not None and line.startswith("    ") and line.strip():
            # the source line the traceback module prints under its frame
            cur.frames[-1] = replace(cur.frames[-1], source=line.strip())
        elif cur is not None and cur.style == "traceback" and not line.startswith(" "):
            # a traceback block ends at its exception line or a blank line
            finish()
    finish()
    if sources:
        out = [_with_sources(t, sources) for t in out]
    return out


def _with_sources(t: ThreadStack, sources: dict[tuple[str, int], str]) -> ThreadStack:
    frames = tuple(
        replace(f, source=sources[(f.file, f.line)])
        if f.source is None and f.line is not None and (f.file, f.line) in sources
        else f
        for f in t.frames
    )
    return replace(t, frames=frames)


def _json_objects(text: str) -> Iterator[Any]:
    """The JSON values of a list one by one, so a truncated list still gives its head."""
    decoder = json.JSONDecoder()
    i = 1 if text.startswith("[") else 0
    while i < len(text):
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return
        try:
            value, i = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):  # RecursionError: nested too deeply
            return
        yield value


def _parse_json(text: str) -> list[ThreadStack]:
    """py-spy dump --json: a list of threads, each with ``frames`` innermost first.

    One thread as py-spy 0.4 writes it (trimmed)::

        {"pid": 29461, "thread_id": 140588075371392, "thread_name": "MainThread",
         "os_thread_id": 29461, "active": false, "owns_gil": false,
         "frames": [{"name": "wait_for_lock", "filename": "/tmp/tgt.py",
                     "short_filename": "tgt.py", "line": 7, "locals": null}]}
    """
    out: list[ThreadStack] = []
    for doc in _json_objects(text):
        if not isinstance(doc, dict) or not isinstance(doc.get("frames"), list):
            continue
        frames = tuple(
            Frame(
                function=str(f.get("name", "?")),
                file=str(f.get("filename") or f.get("short_filename") or "?"),
                line=f["line"] if isinstance(f.get("line"), int) and f["line"] > 0 else None,
            )
            for f in doc["frames"]
            if isinstance(f, dict)
        )
        tid = doc.get("os_thread_id") or doc.get("thread_id")
        name = doc.get("thread_name")
        active = doc.get("active")
        gil = doc.get("owns_gil")
        pid = doc.get("pid")
        out.append(
            ThreadStack(
                thread_id=tid if isinstance(tid, int) else None,
                name=name if isinstance(name, str) else None,
                active=active if isinstance(active, bool) else None,
                frames=frames,
                gil=gil if isinstance(gil, bool) else None,
                pid=pid if isinstance(pid, int) else None,
            )
        )
    return out


# --- take -----------------------------------------------------------------------------


def find_py_spy(explicit: str | None = None) -> str | None:
    """The py-spy to run: ``explicit`` if given, else on PATH, else beside sys.executable.

    Beside sys.executable covers ``pip install py-spy`` into a venv that is not on PATH
    (``/venv/bin/python -m ncclscope agent``).
    """
    if explicit is not None:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("py-spy")
    if found is not None:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else None


# py-spy's own words: "Permission Denied: Try running again with elevated permissions ...",
# "Permission Denied\n\nIt looks like you are running in a docker container ... SYS_PTRACE",
# and, as root without the capability, "Error: Operation not permitted (os error 1)".
_REFUSED = re.compile(
    r"permission denied|operation not permitted|os error (?:1|13)\)|SYS_PTRACE", re.IGNORECASE
)
# "Error: Failed to get process executable name. Check that the process is running."
_GONE = re.compile(
    r"check that the process is running|no such process|os error 3\)|process \d+ not found",
    re.IGNORECASE,
)
_REFUSED_WHY = (
    "ptrace not permitted ({msg}); py-spy needs the target's user with "
    "kernel.yama.ptrace_scope 0 (1 only when the agent is the job's ancestor), or "
    "CAP_SYS_PTRACE (docker --cap-add SYS_PTRACE, Kubernetes securityContext.capabilities"
    ".add: [SYS_PTRACE], or kubectl debug --profile=sysadmin)"
)
#: py-spy's words when ptrace cannot stop a process that is already stopped
_UNSUSPENDABLE = re.compile(r"Failed to suspend process|unexpected waitpid result", re.IGNORECASE)
#: share of the time the blocking attempt gets; the rest goes to --nonblocking
_BLOCKING_SHARE = 0.6
_MIN_ATTEMPT_S = 0.2
_KILL_WAIT_S = 1.0


def _message(stderr: str) -> str:
    """py-spy's error in one line, without the Rust backtrace it may add."""
    lines: list[str] = []
    for line in stderr.splitlines():
        if line.strip().startswith("Stack backtrace:"):
            break
        if line.strip() and line.strip() != "Caused by:":
            lines.append(line.strip())
    msg = " / ".join(lines) or "no message"
    return msg if len(msg) <= 300 else msg[:297] + "..."


@dataclass
class _Ran:
    rc: int | None  # None: killed at the time limit
    stdout: str = ""
    stderr: str = ""


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # py-spy runs in its own session, so its process group is its alone: killing the
    # group takes any helper it started with it and leaves nothing attached to the rank.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:
        proc.kill()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    try:
        proc.wait(timeout=_KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        pass  # Popen reaps it later; SIGKILL cannot be refused


def _run(argv: list[str], budget_s: float) -> _Ran:
    env = dict(os.environ, RUST_BACKTRACE="0")  # a one-line error, not a backtrace
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    try:
        out, err = proc.communicate(timeout=budget_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return _Ran(rc=None)
    except BaseException:
        _kill_group(proc)
        raise
    return _Ran(
        proc.returncode,
        out.decode("utf-8", errors="replace"),
        err.decode("utf-8", errors="replace"),
    )


def _read_line(path: Path, line_no: int) -> str | None:
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            for i, text in enumerate(f, start=1):
                if i == line_no:
                    return text.strip()
    except OSError:
        return None
    return None


def _source_notes(
    threads: list[ThreadStack], pid: int, proc_root: Path | None, budget_s: float
) -> str:
    """``# source`` lines for each thread's innermost frame, read within ``budget_s``.

    A plain ``Lock.acquire()``, ``time.sleep()`` or ``sock.recv()`` is a C call: the
    stack ends at its caller, and only the caller's line says what it waits on.  The
    file is read through ``/proc/<pid>/root`` (the target's own filesystem, from a
    sidecar container too), then as is.  A thread does the reading, because a file on a
    stuck network filesystem can block a read for good; past the budget it is left.
    """
    wanted = {
        (t.frames[0].file, t.frames[0].line)
        for t in threads
        if t.frames and t.frames[0].line is not None and t.frames[0].file.startswith("/")
    }
    if not wanted or budget_s <= 0:
        return ""
    found: dict[tuple[str, int], str] = {}

    def read() -> None:
        for file, line_no in sorted(wanted, key=lambda w: (w[0], w[1] or 0)):
            if line_no is None:
                continue
            candidates = [Path(file)]
            if proc_root is not None:
                candidates.insert(0, proc_root / str(pid) / "root" / file.lstrip("/"))
            for path in candidates:
                text = _read_line(path, line_no)
                if text is not None:
                    found[(file, line_no)] = text
                    break

    reader = threading.Thread(target=read, name="ncclscope-stack-source", daemon=True)
    reader.start()
    reader.join(budget_s)
    if reader.is_alive() or not found:
        return ""
    where = f"{proc_root}/{pid}/root" if proc_root is not None else "disk"
    notes = [f"# ncclscope: source lines read from {where} when the stack was taken"]
    notes += [f"# source {f}:{n}: {t}" for (f, n), t in sorted(found.items())]
    return "\n" + "\n".join(notes) + "\n"


def _write(path: Path, text: str) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    data = text.encode("utf-8")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return len(data)


def take_stack(
    folder: Path,
    pid: int,
    *,
    rank: int | None = None,
    timeout_s: float = 5.0,
    py_spy: str | None = None,
    proc_root: Path | None = Path("/proc"),
) -> Ask:
    """Take a process's Python stacks with ``py-spy dump`` into ``folder/stacks/``.

    Writes ``stacks/rank<R>.txt`` (``pid<P>.txt`` without a rank): py-spy's text, with
    ``--full-filenames`` so that :func:`is_user_file` can tell the user's code from
    libraries, followed by the source line of each thread's innermost frame (see
    :func:`_source_notes`).  Text rather than ``--json``: the file is read by people
    first, and holds everything the JSON has that :func:`classify_stack` uses (thread
    names, idle/active, GIL) plus the command line and Python version.

    py-spy is first run blocking (it pauses the target for the few milliseconds of the
    read): a stuck process loses nothing by the pause, and the stacks are consistent,
    where ``--nonblocking`` may read a running thread mid-change.  A thread in the kernel
    (state D, e.g. on a hung filesystem or in the GPU driver) cannot be paused, so a
    blocking attempt past its share (60 %) of ``timeout_s`` is killed and py-spy is run
    once more ``--nonblocking``, which only reads memory.  ``--native`` is never used:
    unwinding native stacks takes seconds per process.

    Outcomes (``via`` is ``py-spy``, or ``py-spy --nonblocking`` when that answered):
    answered; garbage (py-spy printed no thread; the file is kept); unavailable (no
    py-spy); refused (ptrace denied, with what grants it); no_answer (nothing within
    ``timeout_s``: py-spy and its process group are killed); error (the process is gone,
    is not Python, or anything else, with py-spy's message).  Bounded by ``timeout_s``
    plus the ~1 s a kill may take, and never raises for the target's state.

    >>> ask = take_stack(Path("/tmp"), 4321, rank=5, py_spy="/no/such/py-spy")
    >>> ask.outcome, ask.target, ask.why
    ('unavailable', 'rank 5 (pid 4321)', 'no py-spy at /no/such/py-spy: pip install py-spy')
    """
    start = time.monotonic()
    target = f"rank {rank} (pid {pid})" if rank is not None else f"pid {pid}"
    rel = f"stacks/rank{rank}.txt" if rank is not None else f"stacks/pid{pid}.txt"

    def ask(outcome: Outcome, why: str = "", *, via: str = "py-spy", size: int = 0) -> Ask:
        return Ask(
            what="stack",
            target=target,
            via=via,
            outcome=outcome,
            why=why,
            file=rel if size else None,
            elapsed_s=round(time.monotonic() - start, 3),
            pid=pid,
            rank=rank,
            size_bytes=size,
        )

    exe = find_py_spy(py_spy)
    if exe is None:
        where = (
            f"at {py_spy}"
            if py_spy is not None
            else f"on PATH nor beside {Path(sys.executable).parent}"
        )
        return ask("unavailable", f"no py-spy {where}: pip install py-spy")
    if pid <= 0:
        return ask("error", f"{pid} is not a process id")

    deadline = start + timeout_s
    base = [exe, "dump", "--pid", str(pid), "--full-filenames"]
    attempts = (
        ("py-spy", base, timeout_s * _BLOCKING_SHARE),
        ("py-spy --nonblocking", [*base, "--nonblocking"], timeout_s),
    )
    tried: list[str] = []
    for via, argv, share_s in attempts:
        budget = min(share_s, deadline - time.monotonic())
        if budget < _MIN_ATTEMPT_S:
            break
        tried.append(via)
        try:
            ran = _run(argv, budget)
        except FileNotFoundError:
            return ask("unavailable", f"py-spy at {exe} cannot be run: pip install py-spy")
        except OSError as e:
            return ask("error", f"cannot run py-spy at {exe}: {e}")
        if ran.rc is None:
            continue
        if ran.rc != 0:
            msg = _message(ran.stderr)
            if _REFUSED.search(ran.stderr):
                return ask("refused", _REFUSED_WHY.format(msg=msg), via=via)
            if _GONE.search(ran.stderr):
                return ask("error", f"process {pid} is gone: {msg}", via=via)
            if _UNSUSPENDABLE.search(ran.stderr) and via == "py-spy":
                # A stopped process (SIGSTOP, a frozen node) cannot be suspended again;
                # its memory can still be read without stopping it.
                continue
            return ask("error", f"py-spy failed (exit {ran.rc}): {msg}", via=via)
        threads = parse_stacks(ran.stdout)
        text = ran.stdout
        if threads:
            text += _source_notes(threads, pid, proc_root, deadline - time.monotonic())
        try:
            size = _write(folder / rel, text)
        except OSError as e:
            return ask("error", f"cannot write {folder / rel}: {e}", via=via)
        if not threads:
            return ask(
                "garbage", "py-spy exited 0 but printed no thread's stack", via=via, size=size
            )
        return ask("answered", via=via, size=size)
    return ask(
        "no_answer",
        f"py-spy gave no stack within {timeout_s:g} s (tried: {', then '.join(tried) or 'none'});"
        " killed it. A process stuck in the kernel (state D) cannot be read.",
    )
