"""CUDA out-of-memory messages of PyTorch's caching allocator, both eras.

Sample::

    CUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; 79.15 GiB total capacity;
    74.10 GiB already allocated; 1.20 GiB free; 76.35 GiB reserved in total by PyTorch)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ncclscope.parsers.torch.prefixes import _int

__all__ = ["CudaOom", "parse_cuda_oom"]

#: The caching allocator's out-of-memory message, both eras, up to its last figure
#: (hard-wrapped lines are glued until this matches; the advice that follows is not read).
#:
#: Samples (values invented)::
#:
#:     CUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; 79.15 GiB total capacity;
#:     74.10 GiB already allocated; 1.20 GiB free; 76.35 GiB reserved in total by PyTorch)
#:     CUDA out of memory. Tried to allocate 1.50 GiB. GPU 3 has a total capacity of
#:     79.14 GiB of which 610.00 MiB is free. Process 4242 has 78.52 GiB memory in use.
#:     Of the allocated memory 75.31 GiB is allocated by PyTorch, and 2.27 GiB is
#:     reserved by PyTorch but unallocated.
_OOM_RE = re.compile(
    r"CUDA out of memory\. Tried to allocate (?P<tried>[^.(]{1,40}?(?:\.\d{1,4} ?[KMGT]iB)?)"
    r"(?: \((?P<old>GPU \d{1,4};.{0,400}?)\)|\. (?P<new>GPU \d{1,4} has a total "
    r"capac.{0,1000}?is reserved by PyTorch but unallocated))",
    re.ASCII,
)
_OOM_TRIGGER = r"CUDA out of memory\. Tried to allocate |CUDA error: out of memory"
#: ``format_size``: ``0 bytes``, ``512 bytes``, ``12.00 MiB``, ``1.50 GiB``.
_OOM_SIZE = r"(\d{1,15}(?:\.\d{1,4})?) ?(bytes|[KMGTP]iB)"
_OOM_UNITS = {"bytes": 0, "KiB": 1, "MiB": 2, "GiB": 3, "TiB": 4, "PiB": 5}
_OOM_FIELDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(rx.replace("SIZE", _OOM_SIZE), re.ASCII))
    for name, rx in (
        ("tried_bytes", r"Tried to allocate SIZE"),
        ("total_bytes", r"SIZE total capacity|total capac\w{0,4} of SIZE"),
        ("free_bytes", r"SIZE free|of which SIZE is free"),
        ("allocated_bytes", r"SIZE already allocated|memory SIZE is allocated by PyTorch"),
        ("reserved_bytes", r"SIZE reserved in total by PyTorch"),
        ("unallocated_bytes", r"and SIZE is reserved by PyTorch but unallocated"),
        ("process_bytes", r"this process has SIZE memory in use"),
    )
)
_OOM_GPU_RE = re.compile(r"\(GPU (?P<a>\d{1,4});|\. GPU (?P<b>\d{1,4}) has a total", re.ASCII)


@dataclass(frozen=True, slots=True)
class CudaOom:
    """The figures of one ``CUDA out of memory`` message (bytes; ``None`` where unsaid).

    ``reserved_bytes`` is what PyTorch's caching allocator held (allocated plus cached);
    the newer message prints the cached part alone, which is added back here.
    """

    gpu: int | None
    tried_bytes: int | None
    total_bytes: int | None
    free_bytes: int | None
    allocated_bytes: int | None
    reserved_bytes: int | None


def parse_cuda_oom(text: str) -> CudaOom | None:
    """The figures of a ``CUDA out of memory`` message, or ``None`` when ``text`` holds none.

    >>> o = parse_cuda_oom("CUDA out of memory. Tried to allocate 1.50 GiB. GPU 3 has a "
    ...     "total capacity of 79.14 GiB of which 610.00 MiB is free. Of the allocated "
    ...     "memory 75.31 GiB is allocated by PyTorch, and 2.27 GiB is reserved by "
    ...     "PyTorch but unallocated.")
    >>> o.gpu, o.tried_bytes == 3 << 29, round(o.reserved_bytes / 2**30, 2)
    (3, True, 77.58)
    """
    k = text.find("CUDA out of memory")
    if k < 0:
        if "CUDA error: out of memory" in text:
            return CudaOom(None, None, None, None, None, None)
        return None
    body = text[k : k + 4000]
    got: dict[str, int | None] = {}
    for name, regex in _OOM_FIELDS:
        m = regex.search(body)
        # each alternative has its own (number, unit) pair: the one that matched
        pair = [g for g in m.groups() if g is not None] if m is not None else []
        got[name] = _oom_bytes(pair[0], pair[1]) if len(pair) == 2 else None
    reserved, alloc = got["reserved_bytes"], got["allocated_bytes"]
    cached = got["unallocated_bytes"]
    if reserved is None and alloc is not None and cached is not None:
        reserved = alloc + cached
    gm = _OOM_GPU_RE.search(body)
    gpu = _int(gm["a"] or gm["b"], 32) if gm else None
    return CudaOom(
        gpu, got["tried_bytes"], got["total_bytes"], got["free_bytes"], got["allocated_bytes"],
        reserved,
    )  # fmt: skip


def _oom_bytes(number: str, unit: str) -> int | None:
    try:
        return int(float(number) * 1024 ** _OOM_UNITS[unit])
    except (KeyError, ValueError, OverflowError):
        return None
