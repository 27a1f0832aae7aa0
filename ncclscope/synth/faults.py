"""The faults a synthetic job can carry (each a frozen dataclass) and how truth.json names them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal, TypeAlias, TypeGuard, get_args

from ncclscope.synth.options import _BF16, _FP32, Json, MismatchField


@dataclass(frozen=True)
class SlowRank:
    """A straggler: ``rank`` enqueues every collective ``lateness_s`` after the others.

    Only visible through timestamps (``SynthSpec.timestamps``) and, in the combined layout,
    through the order in which ranks' COLL lines appear.
    """

    rank: int
    lateness_s: float


@dataclass(frozen=True)
class StopRank:
    """A hang: ``rank`` never enters world-communicator instance ``at_instance``.

    The other ranks log that instance's COLL line and then nothing more (they wait forever).
    ``at_instance`` is the 0-based index into the world communicator's collective sequence.
    """

    rank: int
    at_instance: int


@dataclass(frozen=True)
class Mismatch:
    """A desync: at world instance ``at_instance`` ``rank`` logs a different op/count/dtype.

    ``field`` is ``"op"`` (a different collective), ``"count"`` (twice the element count)
    or ``"dtype"`` (bf16 <-> fp32). With ``hang=True`` (what a real mismatch usually causes)
    every rank logs that instance and then nothing more.
    """

    rank: int
    at_instance: int
    field: MismatchField
    hang: bool = True


@dataclass(frozen=True)
class IbError:
    """An InfiniBand completion error on ``host`` during world instance ``at_instance``.

    All ranks log the instance; then the rank on ``host`` whose ring sends over the network
    prints the era's ``NET/IB`` completion-error WARN (preceded by an empty line) and its
    ``file:line -> N`` return-code chain, its ring peer on the next host prints a consequential
    error, and the job stops.
    """

    host: str
    at_instance: int


@dataclass(frozen=True)
class ExtraCollective:
    """A rank calls one collective too many: just before world instance ``at_instance``,
    ``rank`` issues an extra AllReduce (count 1, fp32: a stray ``all_reduce`` of a scalar,
    a metric reduced on one code path only) on the world communicator.

    From there on its sequence numbers are one ahead of everyone's. NCCL numbers calls per
    communicator, so the extra call gets opCount ``at_instance``, the opCount of the others'
    real call: at that sequence the culprit shows a different op/count/dtype, which is what
    a detector sees as a mismatch (at the step's grad-norm AllReduce only the buffers
    differ: truth's ``differs`` is then empty). The rank's real call follows with opCount
    ``at_instance + 1`` (on a 2.27 single-host job every opCount prints 0, so only the
    extra line tells). Nothing can match: the job hangs there. Every rank logs that
    instance, the culprit both its lines, then nothing more; with a framework every rank
    times out, the culprit on its extra ``ALLREDUCE`` (NumelIn=1), one more enqueued.
    """

    rank: int
    at_instance: int


DeadSignal = Literal["SIGKILL", "SIGSEGV", "SIGBUS", "SIGABRT"]
DEAD_SIGNALS: tuple[str, ...] = get_args(DeadSignal)
_SIGNUM = {"SIGKILL": 9, "SIGSEGV": 11, "SIGBUS": 7, "SIGABRT": 6}
_SIGNAME = {num: name for name, num in _SIGNUM.items()}


@dataclass(frozen=True)
class DeadProcess:
    """``rank``'s process dies just before world instance ``at_instance``, by ``signal``
    (SIGKILL, exit code -9: the OOM killer; SIGSEGV -11; SIGBUS -7, e.g. /dev/shm full).

    NCCL-side it looks like StopRank: the rank logs nothing from then on, the others log
    that instance and wait (NCCL itself prints nothing about it here). With a framework,
    the torchrun agent of its host sees the exit at its next poll, long before any
    timeout: it SIGTERMs the host's other workers (they print nothing more) and its
    ChildFailedError names the rank as root cause with that exit code and signal. Ranks on
    other hosts keep waiting and time out as in a hang.
    """

    rank: int
    at_instance: int
    signal: DeadSignal = "SIGKILL"

    @property
    def exit_code(self) -> int:
        """What torchelastic reports: minus the signal number."""
        return -_SIGNUM[self.signal]


@dataclass(frozen=True)
class SlowHost:
    """A slow node: every rank of ``host`` enqueues each collective late by ``lateness_s``
    plus ``slowdown`` x the slot's compute time (the time between collectives without
    stragglers; in the phased model the optimizer step counts for the slot after it),
    from world instance ``from_instance`` up to (not including) ``to_instance`` (``None``:
    to the end).  Unlike SlowRank's constant lateness, the delay holds the collective up
    for everyone as a one-off delay does: every later collective starts that much later,
    so a window of slowness is paid for in the job's time, and a lateness proportional to
    the compute time changes with the phase.

    ``by_phase``: the compute before each collective is that of its phase of the step
    (a backward layer about twice a forward one, the gradient norm's little), so the
    slow node's lateness differs between collective kinds as a slow GPU's does; off
    (the default), every slot's compute is the same outside the phased model and the
    slowness is a constant delay, which separate files cannot tell from a clock offset.
    """

    host: str
    lateness_s: float = 0.0
    slowdown: float = 0.0
    from_instance: int = 0
    to_instance: int | None = None
    by_phase: bool = False


@dataclass(frozen=True)
class SlowSpell:
    """An intermittent straggler: ``rank`` is late as a SlowHost's ranks are (``lateness_s``
    plus ``slowdown`` x the slot's compute time), only from world instance
    ``from_instance`` up to ``to_instance`` (thermal throttling, a noisy neighbour, a
    checkpoint write)."""

    rank: int
    lateness_s: float = 0.0
    slowdown: float = 0.0
    from_instance: int = 0
    to_instance: int | None = None


Fault: TypeAlias = (
    SlowRank | StopRank | Mismatch | IbError | ExtraCollective | DeadProcess | SlowHost | SlowSpell
)


def _is_terminal(
    fault: Fault,
) -> TypeGuard[StopRank | Mismatch | IbError | ExtraCollective | DeadProcess]:
    """Does the fault end the job at its instance (a hang, an error or a death)?"""
    if isinstance(fault, Mismatch):
        return fault.hang
    return isinstance(fault, StopRank | IbError | ExtraCollective | DeadProcess)


def _fault_json(fault: Fault) -> dict[str, Json]:
    out: dict[str, Json] = {"kind": type(fault).__name__}
    out.update(asdict(fault))
    return out


# What a Mismatch logs instead: another op, or the other of bf16/fp32.
_OTHER_OP = {"AllGather": "ReduceScatter", "ReduceScatter": "AllGather", "AllReduce": "AllGather"}


def _other_dtype(dtype: int) -> int:
    return _FP32 if dtype == _BF16 else _BF16
