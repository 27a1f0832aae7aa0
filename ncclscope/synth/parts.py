"""The pieces a job is made of: ranks, communicators, calls, output sinks and non-NCCL noise."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, Protocol

from ncclscope.synth.options import Json

_BUS_IDS = ("18000", "2a000", "3a000", "5d000", "9a000", "ab000", "ba000", "db000")
_N_NICS = 4


def _bus_id(local: int) -> str:
    return _BUS_IDS[local] if local < len(_BUS_IDS) else f"{0x100 + local:x}000"


# --------------------------------------------------------------------------------------
# Time formatting
# --------------------------------------------------------------------------------------


class _SecondCache:
    """strftime is slow; the seconds part of a timestamp changes rarely, so cache it."""

    __slots__ = ("_cache", "_fmt")

    def __init__(self, fmt: str) -> None:
        self._fmt = fmt
        self._cache: dict[int, str] = {}

    def get(self, sec: int) -> str:
        text = self._cache.get(sec)
        if text is None:
            if len(self._cache) > 4096:
                self._cache.clear()
            text = time.strftime(self._fmt, time.gmtime(sec))
            self._cache[sec] = text
        return text


def _subsec_226(frac: float) -> str:
    """The six sub-second digits NCCL 2.26.x prints for ``%6f`` (``frac`` in [0, 1)).

    2.26 divides ``tv_nsec`` by ``1000000 / 10^6`` instead of ``1000000000 / 10^6`` and
    prints the result into six characters: the first six digits of the zero-padded
    nanosecond count. That is the microsecond value when the fraction is >= 0.1 s, and wrong
    below (0.012345678 s prints ``123456``, not ``012345``).

    >>> _subsec_226(0.5), _subsec_226(0.012345678), _subsec_226(0.0000543)
    ('500000', '123456', '054300')
    """
    us = int(frac * 1e6)
    # The nanoseconds below the microsecond, kept consistent with ``us`` so that the bug is
    # the only difference from the microseconds 2.27 prints at the same instant.
    sub = min(max(int(frac * 1e9) - us * 1000, 0), 999)
    return f"{us * 1000 + sub:06d}"[:6]


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")


# --------------------------------------------------------------------------------------
# Internal model
# --------------------------------------------------------------------------------------


@dataclass
class _Rank:
    rank: int
    host: str
    host_index: int
    local: int
    pid: int
    proxy_tid: int
    bus: str
    ip: str
    head: str  # launcher prefix
    info: str  # "host:pid:tid [dev] NCCL INFO "
    proxy_info: str
    stream: str
    heap: int  # base address of this process's (fake) CUDA allocations
    file: str


@dataclass
class _Comm:
    name: str
    members: list[int]  # global ranks, in comm-rank order (always a contiguous range)
    host_index: int | None
    comm_id: int | None
    ptr: dict[int, str]
    n_nodes: int
    nch: int
    func: str
    zero_opcount: bool
    calls: int = 0
    seq: int = 0  # number of sequence numbers entered so far

    def index(self, rank: int) -> int:
        """Comm rank of global ``rank``."""
        return rank - self.members[0]


@dataclass(frozen=True)
class _Call:
    """One position of a step's program: comm, op, count (from comm size), dtype."""

    world: bool
    op: str
    count_of: Callable[[int], int]
    dtype: int
    buffer: int  # index of the (persistent) buffer this call uses
    # Where in the step it runs, for framework timers: fwd | bwd | reduce | norm | optim_ag
    phase: str = ""


@dataclass(frozen=True)
class _IbInfo:
    culprit: _Rank
    peer: _Rank
    culprit_pos: tuple[str, int]
    peer_pos: tuple[str, int]
    message: str
    peer_message: str


class _WarnPlan:
    """When the benign WARNs fall due: ascending thresholds on a progress measure.

    The measure is bytes written (``by_bytes``) or the number of collective slots entered.
    """

    __slots__ = ("at", "by_bytes", "next")

    def __init__(self, at: list[float], *, by_bytes: bool) -> None:
        self.at = at
        self.by_bytes = by_bytes
        self.next = 0

    def due(self, progress: float, *, everything: bool = False) -> int:
        """How many WARNs fall due at ``progress`` (all that are left if ``everything``)."""
        at = self.at
        k = self.next
        while k < len(at) and (everything or progress >= at[k]):
            k += 1
        count = k - self.next
        self.next = k
        return count


class _Sink:
    """A binary output file that buffers text and counts what it wrote."""

    __slots__ = ("_counted", "_counted_lines", "bytes", "fh", "lines", "pending", "rel")

    def __init__(self, path: Path, rel: str) -> None:
        self.rel = rel
        self.fh: BinaryIO = path.open("wb")
        self.pending: list[str] = []
        self.bytes = 0
        self.lines = 0
        # '\n's in pending[:_counted], so that pending_lines() scans each text only once.
        self._counted = 0
        self._counted_lines = 0

    def add(self, text: str) -> None:
        self.pending.append(text)

    def pending_lines(self) -> int:
        """'\n's buffered but not yet written (incremental: texts are counted once)."""
        pending = self.pending
        if self._counted < len(pending):
            self._counted_lines += sum(
                pending[i].count("\n") for i in range(self._counted, len(pending))
            )
            self._counted = len(pending)
        return self._counted_lines

    def flush(self) -> None:
        if not self.pending:
            return
        data = "".join(self.pending).encode("utf-8")
        self.pending.clear()
        self._counted = self._counted_lines = 0
        self.fh.write(data)
        self.bytes += len(data)
        self.lines += data.count(b"\n")

    def close(self) -> None:
        self.flush()
        self.fh.close()


# --------------------------------------------------------------------------------------
# Non-NCCL noise
# --------------------------------------------------------------------------------------

_PY_WARNINGS = (
    "/usr/local/lib/python3.10/dist-packages/torch/utils/checkpoint.py:91: UserWarning: "
    "None of the inputs have requires_grad=True. Gradients will be None",
    "/usr/local/lib/python3.10/dist-packages/torch/distributed/distributed_c10d.py:4631: "
    "UserWarning: No device id is provided via `init_process_group` or `barrier `.",
    "/usr/local/lib/python3.10/dist-packages/deepspeed/runtime/zero/stage3.py:1330: "
    "UserWarning: The torch.cuda.*DtypeTensor constructors are no longer recommended.",
)
_BAR_PARTIAL = " ▏▎▍▌▋▊▉"


class _Noise:
    """Builds non-NCCL lines: python prints and warnings, DeepSpeed lines, tqdm, blanks."""

    def __init__(
        self, rnd: random.Random, heads: list[str], total_steps: int, framework: str = "none"
    ) -> None:
        self._rnd = rnd
        self._heads = heads
        self._ds_sec = _SecondCache("%Y-%m-%d %H:%M:%S")
        self._total = max(total_steps, 1)
        self.count = 0
        # Rank 0's host clock offset: the DeepSpeed lines below are rank 0's.
        self.offset0 = 0.0
        # Ranks whose process is dead: nothing is printed in their name.
        self.silent: frozenset[int] = frozenset()
        kinds: list[tuple[float, Callable[[int, float, int], str]]] = [
            (0.15, self._blank),
            (0.20, self._print),
            (0.10, self._warning),
            (0.15, self._ds_progress),
            (0.15, self._ds_timers),
            (0.10, self._ds_throughput),
            (0.15, self._tqdm),
        ]
        self._warnings: tuple[str, ...] = _PY_WARNINGS
        if framework != "none":
            # The framework writes the real DeepSpeed lines and counts them in the truth;
            # invented ones would contradict it (and a plain torch job has none at all).
            ds_kinds = (self._ds_progress, self._ds_timers, self._ds_throughput)
            kinds = [k for k in kinds if k[1] not in ds_kinds]
            if framework == "torch":
                self._warnings = tuple(w for w in _PY_WARNINGS if "deepspeed" not in w)
        self._cum: list[float] = []
        acc = 0.0
        for weight, _ in kinds:
            acc += weight
            self._cum.append(acc)
        self._kinds = [kind for _, kind in kinds]

    def line(self, rank: int, t: float, step: int) -> str:
        """Return one non-NCCL record (one or more physical lines, each ending in '\\n')."""
        x = self._rnd.random() * self._cum[-1]
        for cum, kind in zip(self._cum, self._kinds, strict=True):
            if x < cum:
                return kind(rank, t, step)
        return self._kinds[-1](rank, t, step)

    def emit(self, rank: int, *lines: str) -> str:
        """Format physical lines of ``rank``'s stdout (launcher prefix added) and count them."""
        if rank in self.silent:
            return ""
        self.count += len(lines)
        head = self._heads[rank]
        return "".join(f"{head}{text}\n" for text in lines)

    def ds_ts(self, t: float) -> str:
        """DeepSpeed logger time: ``[%Y-%m-%d %H:%M:%S,mmm]``."""
        sec = int(t)
        return f"[{self._ds_sec.get(sec)},{int((t - sec) * 1000):03d}]"

    def _blank(self, rank: int, t: float, step: int) -> str:
        return self.emit(rank, "")

    def _print(self, rank: int, t: float, step: int) -> str:
        r = self._rnd
        loss = r.uniform(1.5, 3.5)
        return self.emit(
            rank, f"[rank {rank}] step {step} loss {loss:.4f} tokens {r.randrange(8192, 65536)}"
        )

    def _warning(self, rank: int, t: float, step: int) -> str:
        # The warnings module prints the source line of the call under the message.
        return self.emit(rank, self._rnd.choice(self._warnings), "  warnings.warn(")

    def _ds_progress(self, rank: int, t: float, step: int) -> str:
        lr = 3e-4 * min(1.0, (step + 1) / 100)
        return self.emit(
            0,
            f"{self.ds_ts(t + self.offset0)} [INFO] [logging.py:128:log_dist] [Rank 0] "
            f"step={step}, skipped=0, lr=[{lr!r}], mom=[(0.9, 0.95)]",
        )

    def _ds_timers(self, rank: int, t: float, step: int) -> str:
        r = self._rnd
        fwd, bwd = r.uniform(80, 160), r.uniform(160, 330)
        return self.emit(
            0,
            f"{self.ds_ts(t + self.offset0)} [INFO] [logging.py:128:log_dist] [Rank 0] time (ms) | "
            f"fwd_microstep: {fwd:.2f} | bwd_microstep: {bwd:.2f} | "
            f"bwd_inner_microstep: {bwd * 0.93:.2f} | bwd_allreduce_microstep: "
            f"{r.uniform(0.01, 0.2):.2f} | step_microstep: {r.uniform(10, 40):.2f}",
        )

    def _ds_throughput(self, rank: int, t: float, step: int) -> str:
        r = self._rnd
        cur = r.uniform(90, 140)
        return self.emit(
            0,
            f"{self.ds_ts(t + self.offset0)} [INFO] [timer.py:264:stop] epoch=0/micro_step={step}/"
            f"global_step={step}, RunningAvgSamplesPerSec={cur * 0.99!r}, "
            f"CurrSamplesPerSec={cur!r}, MemAllocated={r.uniform(18, 22):.2f}GB, "
            f"MaxMemAllocated={r.uniform(30, 38):.2f}GB",
        )

    def _tqdm(self, rank: int, t: float, step: int) -> str:
        # tqdm redraws with '\r' and no '\n'; the launcher only passes a line on once a
        # newline arrives, so several redraws end up in one physical line.
        total = max(self._total, step + 2)
        parts = []
        for done in (step, step + 1):
            frac = done / total
            filled = frac * 10
            full = int(filled)
            bar = "█" * full
            if full < 10:
                bar += _BAR_PARTIAL[int((filled - full) * 8)] + " " * (9 - full)
            left = total - done
            parts.append(
                f"\rTraining: {int(frac * 100):3d}%|{bar}| {done}/{total} "
                f"[{done // 120:02d}:{done // 2 % 60:02d}<{left // 120:02d}:{left // 2 % 60:02d}, "
                f"{self._rnd.uniform(1.8, 2.2):.2f}it/s]"
            )
        return self.emit(0, "".join(parts))


class _FrameworkLines(Protocol):
    """What the job's NCCL side reads of the framework's line writer
    (``framework_hang._Framework``), so that the job's base classes need not import it
    (``_Job`` makes the real one)."""

    ds: bool
    lines: int
    off_opt: bool
    off_param: bool
    share: dict[str, float]
    step_extra: dict[str, float]
    step_push: float

    def delayed(self, phase: str, push: float) -> None: ...

    def end_events(self, events: list[list[tuple[float, str]]]) -> None: ...

    def hang(self) -> None: ...

    def init_events(self, events: list[list[tuple[float, str]]], steps_t0: float) -> None: ...

    def step_done(self, gstep: int, t: float) -> int: ...

    def truth(self) -> dict[str, Json]: ...
