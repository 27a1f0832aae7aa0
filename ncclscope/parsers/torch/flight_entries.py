"""A Flight Recorder dump's ``entries`` into one frame, column by column.

A dump holds up to ``TORCH_FR_BUFFER_SIZE`` entries per rank (2,000 recommended), each
a dict of ~25 keys.  Checking them one by one costs ~13 us an entry in CPython; here each
key becomes a column (one list comprehension per key), and
each column is checked at once: the set of Python types it holds (``set(map(type,
col))``) is almost always the allowed one, and only a column that holds another type is
walked value by value to find the entries to skip.  Ranges are checked in polars.

An entry with a field missing, of the wrong type or out of range is skipped, with the
first such reason in the order of ``_CHECKS``; the others are read.  A sample entry (2.x,
pickle; the JSON form writes 0 for a time not seen and lists for tuples)::

    {"record_id": 2, "pg_id": 0, "process_group": ("0", "default_pg"),
     "collective_seq_id": 3, "p2p_seq_id": 0, "op_id": 3,
     "profiling_name": "nccl:all_reduce", "time_created_ns": 1764124401000000000,
     "input_sizes": [[1024]], "input_dtypes": ["Float"], "output_sizes": [[1024]],
     "output_dtypes": ["Float"], "state": "scheduled", "time_discovered_started_ns": None,
     "time_discovered_completed_ns": None, "retired": False, "timeout_ms": 600000,
     "is_p2p": False, "frames": [{"name": "all_reduce", "filename": "...", "line": 2950}]}
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any

import polars as pl

from ncclscope.units import TORCH_DTYPES

__all__ = ["ENTRY_SCHEMA", "OPS", "finish_entries", "normalise_op", "read_entries"]

#: Times outside these bounds (2000-01-01 .. 2200-01-01 in ns) are not wall-clock times.
NS_MIN = 946_684_800 * 10**9
NS_MAX = 7_258_118_400 * 10**9
STATES = frozenset({"scheduled", "started", "completed"})

#: The entries' frame as ``read_entries`` returns it: times as ns (0: not seen), two
#: helper columns instead of the bytes, count and datatype that ``finish_entries`` adds
#: over every dump at once.
ENTRY_SCHEMA = pl.Schema(
    {
        "record_id": pl.Int64,
        "pg_id": pl.Int64,
        "pg_name": pl.String,
        "pg_desc": pl.String,
        "collective_seq_id": pl.Int64,
        "p2p_seq_id": pl.Int64,
        "op_id": pl.Int64,
        "profiling_name": pl.String,
        "backend": pl.String,
        "op": pl.String,
        "is_p2p": pl.Boolean,
        "peer": pl.Int32,
        "state": pl.String,
        "created_ts": pl.Int64,
        "started_ts": pl.Int64,
        "completed_ts": pl.Int64,
        "duration_ms": pl.Float64,
        "input_numel": pl.Int64,
        "output_numel": pl.Int64,
        "input_dtype": pl.String,
        "output_dtype": pl.String,
        "_in_uniform": pl.String,  # the dtype of every input tensor, if they share one
        "_out_uniform": pl.String,
        "timeout_ms": pl.Int64,
        "retired": pl.Boolean,
        "thread_name": pl.String,
        "frame": pl.String,
    }
)

#: PyTorch's profiling names (``nccl:<name>``) -> the op name NCCL prints on COLL lines.
OPS = {
    "all_reduce": "AllReduce",
    "allreduce": "AllReduce",
    "allreduce_coalesced": "AllReduce",
    "all_reduce_coalesced": "AllReduce",
    "all_reduce_barrier": "AllReduce",
    "barrier": "AllReduce",
    "all_gather": "AllGather",
    "allgather": "AllGather",
    "_all_gather_base": "AllGather",
    "all_gather_into_tensor": "AllGather",
    "all_gather_into_tensor_coalesced": "AllGather",
    "all_gather_single": "AllGather",
    "all_gather_v": "AllGather",
    "allgather_coalesced": "AllGather",
    "ALLGATHER_coalesced": "AllGather",
    "reduce_scatter": "ReduceScatter",
    "_reduce_scatter_base": "ReduceScatter",
    "reduce_scatter_tensor": "ReduceScatter",
    "reduce_scatter_tensor_coalesced": "ReduceScatter",
    "reduce_scatter_single": "ReduceScatter",
    "reduce_scatter_v": "ReduceScatter",
    "REDUCE_SCATTER_coalesced": "ReduceScatter",
    "broadcast": "Broadcast",
    "_broadcast_oop": "Broadcast",
    "reduce": "Reduce",
    "_reduce_oop": "Reduce",
    "send": "Send",
    "recv": "Recv",
    "recvAnysource": "Recv",
    "all_to_all": "AllToAll",
    "alltoall": "AllToAll",
    "all_to_all_single": "AllToAll",
    "alltoall_base": "AllToAll",
    "all_to_all_v_single": "AllToAll",
    "gather": "Gather",
    "scatter": "Scatter",
    "coalesced": "Coalesced",
}


def _small_int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() and len(text) < 10 else None


def normalise_op(profiling_name: str) -> tuple[str | None, str, int | None, int | None]:
    """``"nccl:send 1->2"`` -> ``("nccl", "Send", 1, 2)``: backend, op, own and peer
    rank in the process group (send/recv only).  An unknown name is kept as written."""
    backend, sep, rest = profiling_name.partition(":")
    if not sep:
        backend, rest = "", profiling_name
    kind, _, meta = rest.strip().partition(" ")
    op = OPS.get(kind, kind)
    own = peer = None
    if op == "Send" and "->" in meta:
        a, _, b = meta.partition("->")
        own, peer = _small_int(a), _small_int(b)
    elif op == "Recv" and "<-" in meta:
        a, _, b = meta.partition("<-")
        own, peer = _small_int(a), _small_int(b)
    return backend or None, op, own, peer


_KEYS = (
    "profiling_name",
    "collective_seq_id",
    "seq_id",
    "state",
    "time_created_ns",
    "record_id",
    "pg_id",
    "p2p_seq_id",
    "op_id",
    "timeout_ms",
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
    "duration_ms",
    "process_group",
    "retired",
    "is_p2p",
    "input_sizes",
    "output_sizes",
    "input_dtypes",
    "output_dtypes",
    "thread_name",
    "frames",
)
_NONE = type(None)
_INT = frozenset({int})
_INT_NONE: frozenset[type] = frozenset({int, _NONE})
_BOOL_NONE: frozenset[type] = frozenset({bool, _NONE})
_SEQ = frozenset({list, tuple})
_NUMBER_NONE: frozenset[type] = frozenset({float, int, _NONE})


def _is_int(v: Any) -> bool:
    return type(v) is int


#: Stands for a value that cannot be a set member (a list inside a process_group).
_UNHASHABLE = object()


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


class _Skips:
    """The reason each entry is skipped (the first found wins), by row index."""

    def __init__(self, n: int) -> None:
        self.reason: dict[int, str] = {}
        self.n = n

    def mark(self, rows: Iterable[int], reason: str) -> None:
        for i in rows:
            self.reason.setdefault(i, reason)

    def typed(
        self, col: list[Any], name: str, fast: frozenset[type], ok: Callable[[Any], bool]
    ) -> None:
        """Mark the values of ``col`` whose type is not in ``fast`` and fail ``ok``;
        ``None`` where ``fast`` has no NoneType is a missing field."""
        if set(map(type, col)) <= fast:
            return
        for i, v in enumerate(col):
            if type(v) in fast:
                continue
            if v is None:
                self.reason.setdefault(i, f"missing {name}")
            elif not ok(v):
                self.reason.setdefault(i, f"ill-typed {name}")

    def ranged(self, col: list[Any], lo: int, hi: int, name: str, *, zero: bool = False) -> None:
        """Mark the ints of ``col`` outside ``[lo, hi]`` (``zero``: 0 is allowed too).
        Checked in C (``min``/``max``) unless some value is out of range."""
        values = [v for v in col if type(v) is int] if set(map(type, col)) != _INT else col
        if zero:
            values = list(filter(None, values))
        if not values or (lo <= min(values) and max(values) <= hi):
            return
        for i, v in enumerate(col):
            if type(v) is int and not (lo <= v <= hi or (zero and v == 0)):
                self.reason.setdefault(i, f"out-of-range {name}")


_I64_MAX = 2**63 - 1


def _ints(col: list[Any]) -> list[int | None]:
    """The ints of ``col`` that fit in int64, None elsewhere (``_Skips`` marked the
    others: ill-typed or out of range)."""
    kinds = set(map(type, col))
    out = col if kinds <= _INT_NONE else [v if _is_int(v) else None for v in col]
    ints = out if kinds == _INT else [v for v in out if v is not None]
    if ints and (max(ints) > _I64_MAX or min(ints) < -_I64_MAX):
        out = [v if v is None or -_I64_MAX <= v <= _I64_MAX else None for v in out]
    return out


def _numel(sizes: list[Any], skips: _Skips, name: str) -> list[int | None]:
    """Elements over each entry's tensors (``[[d0, d1], [d0]]``); bad shapes marked, and
    counts past int64 (a damaged size) marked out of range."""
    counts = _numel_of(sizes, skips, name)
    ints = [v for v in counts if v is not None]
    if ints and max(ints) > _I64_MAX:
        for i, v in enumerate(counts):
            if v is not None and v > _I64_MAX:
                skips.reason.setdefault(i, f"out-of-range {name}")
                counts[i] = None
    return counts


def _numel_of(sizes: list[Any], skips: _Skips, name: str) -> list[int | None]:
    missing = _NONE in set(map(type, sizes))
    if not missing and set(map(type, sizes)) <= _SEQ:
        inner = list(chain.from_iterable(sizes))
        if set(map(type, inner)) <= _SEQ:
            dims = list(chain.from_iterable(inner))
            if set(map(type, dims)) <= _INT and (not dims or min(dims) >= 0):
                if len(dims) == len(inner) == len(sizes):
                    return dims  # the common shape: one 1-D tensor an entry
                return [sum(map(math.prod, s)) for s in sizes]
    out: list[int | None] = []
    for i, s in enumerate(sizes):
        if s is None:
            out.append(None)  # not recorded
            continue
        ok = type(s) in _SEQ and all(
            type(d) in _SEQ and all(_is_int(x) and x >= 0 for x in d) for d in s
        )
        if not ok:
            skips.reason.setdefault(i, f"ill-typed {name}")
            out.append(None)
        else:
            out.append(sum(map(math.prod, s)))
    return out


def _dtype_lists(col: list[Any], skips: _Skips, name: str) -> None:
    kinds = set(map(type, col))
    if kinds <= _SEQ | {_NONE} and set(map(type, chain.from_iterable(c or () for c in col))) <= {
        str
    }:
        return
    for i, v in enumerate(col):
        if v is not None and not (type(v) in _SEQ and all(type(d) is str for d in v)):
            skips.reason.setdefault(i, f"ill-typed {name}")


def _uniform_dtype(dtypes: list[Any], sizes: list[Any]) -> list[str | None]:
    """Each entry's dtype where all its tensors have the one dtype (else None)."""
    if (
        set(map(type, dtypes)) <= _SEQ
        and set(map(type, sizes)) <= _SEQ
        and set(map(len, dtypes)) == {1}
        and set(map(len, sizes)) == {1}
    ):
        # The common shape: one tensor in, one out.
        return [d[0] if type(d[0]) is str else None for d in dtypes]
    out: list[str | None] = []
    for d, s in zip(dtypes, sizes, strict=True):
        if (
            d
            and type(d) in _SEQ
            and type(s) in _SEQ
            and len(d) == len(s)
            and d.count(d[0]) == len(d)
        ):
            out.append(d[0] if type(d[0]) is str else None)
        else:
            out.append(None)
    return out


class _Frames:
    """The first frame outside PyTorch of each stack, as ``name at file:line``.

    PyTorch's pickler writes each distinct frame once and refers to it after, so the
    same frame dicts (and stacks) come back again and again: each stack, keyed by its
    frames' identities, is looked at once.  The keys are ids: valid while the dump's
    objects are alive, which they are for one ``read_entries`` call."""

    def first_user(self, stacks: list[Any]) -> list[str | None]:
        # A stack list the pickler wrote once and referred to after is one object: its
        # id is its key; otherwise the ids of its (memoised) frames.
        lists = {id(f): f for f in stacks if type(f) is list and f}
        if len(lists) * 4 <= len(stacks):
            by_list = {k: _first_user(f) for k, f in lists.items()}
            return [by_list.get(id(f)) if type(f) is list else None for f in stacks]
        keys = [tuple(map(id, f)) if type(f) is list and f else None for f in stacks]
        by_key = dict(zip(keys, stacks, strict=True))
        found = {k: _first_user(f) if k is not None else None for k, f in by_key.items()}
        return [found[k] for k in keys]


def _first_user(frames: list[Any]) -> str | None:
    chosen = None
    for f in frames:
        filename = f.get("filename") if type(f) is dict else None
        if type(filename) is not str:
            continue
        if chosen is None:
            chosen = f
        if "/torch/" not in filename and not filename.startswith("torch/"):
            chosen = f
            break
    if chosen is None:
        return None
    return f"{chosen.get('name')} at {chosen.get('filename')}:{chosen.get('line')}"


def read_entries(entries: list[Any]) -> tuple[pl.DataFrame, Counter[str]]:
    """The entries that can be read (ENTRY_SCHEMA) and the others counted by reason."""
    skipped: Counter[str] = Counter()
    dicts = [e for e in entries if type(e) is dict]
    if len(dicts) < len(entries):
        skipped["not a dict"] = len(entries) - len(dicts)
    if not dicts:
        return pl.DataFrame(schema=ENTRY_SCHEMA), skipped
    # One list per key: a comprehension per key beats transposing per-entry tuples
    # (7x: no tuple per entry for the GC to track).
    c: dict[str, list[Any]] = {key: [e.get(key) for e in dicts] for key in _KEYS}
    n = len(dicts)
    skips = _Skips(n)
    # Required fields (the order of the checks is the order reasons are given in).
    skips.typed(c["profiling_name"], "profiling_name", frozenset({str}), lambda v: False)
    seq = c["collective_seq_id"]
    if _NONE in set(map(type, seq)):  # 1.x: seq_id
        seq = [a if a is not None else b for a, b in zip(seq, c["seq_id"], strict=True)]
    skips.typed(seq, "collective_seq_id", _INT, lambda v: False)
    skips.ranged(seq, 0, _I64_MAX, "collective_seq_id")
    seq_s = _ints(seq)
    states = c["state"]
    if not set(map(type, states)) <= {str} or not set(states) <= STATES:
        for i, v in enumerate(states):
            if v is None:
                skips.reason.setdefault(i, "missing state")
            elif type(v) is not str:  # a list is not even hashable
                skips.reason.setdefault(i, "ill-typed state")
            elif v not in STATES:
                skips.reason.setdefault(i, "out-of-range state")
    skips.typed(c["time_created_ns"], "time_created_ns", _INT, lambda v: False)
    skips.ranged(c["time_created_ns"], NS_MIN, NS_MAX, "time_created_ns")
    created = _ints(c["time_created_ns"])
    ints = {}
    for key in ("record_id", "pg_id", "p2p_seq_id", "op_id", "timeout_ms"):
        skips.typed(c[key], key, _INT_NONE, lambda v: False)
        skips.ranged(c[key], 0, _I64_MAX, key)
        ints[key] = _ints(c[key])
    times = {}
    for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):
        skips.typed(c[key], key, _INT_NONE, lambda v: False)
        # JSON dumps write 0 for "not seen": nulled with the other derived columns.
        skips.ranged(c[key], NS_MIN, NS_MAX, key, zero=True)
        times[key] = _ints(c[key])
    skips.typed(c["duration_ms"], "duration_ms", _NUMBER_NONE, lambda v: False)
    dur_col = c["duration_ms"]
    kinds = set(map(type, dur_col))
    if bool in kinds:
        skips.mark((i for i, v in enumerate(dur_col) if type(v) is bool), "ill-typed duration_ms")
    if kinds <= {_NONE}:
        duration: list[float | None] = dur_col
    else:
        duration = [float(v) if type(v) in (float, int) else None for v in dur_col]
        skips.mark(
            (i for i, v in enumerate(duration) if v is not None and not 0 <= v < math.inf),
            "out-of-range duration_ms",
        )
    # process_group: (name, desc); 1.x has none and names the group by pg_id.
    pgs = [tuple(p) if type(p) is list else p for p in c["process_group"]]
    try:
        distinct = set(pgs)
    except TypeError:  # a list or dict inside one: ill-typed, marked below
        pgs = [p if _hashable(p) else _UNHASHABLE for p in pgs]
        distinct = set(pgs)
    known = {
        p: (type(p) is tuple and len(p) == 2 and all(type(x) is str for x in p))
        for p in distinct
        if p is not None
    }
    if not all(known.values()):
        skips.mark(
            (i for i, p in enumerate(pgs) if p is not None and not known[p]),
            "ill-typed process_group",
        )
    pg_ids = ints["pg_id"]
    pg_name = [
        p[0] if p is not None and known[p] else None if g is None else str(g)
        for p, g in zip(pgs, pg_ids, strict=True)
    ]
    pg_desc = [p[1] if p is not None and known[p] else None for p in pgs]
    for key in ("retired", "is_p2p"):
        skips.typed(c[key], key, _BOOL_NONE, lambda v: False)
    in_numel = _numel(c["input_sizes"], skips, "input_sizes")
    out_numel = _numel(c["output_sizes"], skips, "output_sizes")
    _dtype_lists(c["input_dtypes"], skips, "input_dtypes")
    _dtype_lists(c["output_dtypes"], skips, "output_dtypes")

    names = c["profiling_name"]
    parsed = {nm: normalise_op(nm) for nm in {nm for nm in names if type(nm) is str}}
    none4 = (None, None, None, None)
    ops = [parsed.get(nm, none4) if type(nm) is str else none4 for nm in names]
    in_dt = _uniform_dtype(c["input_dtypes"], c["input_sizes"])
    out_dt = _uniform_dtype(c["output_dtypes"], c["output_sizes"])
    frames = _Frames()
    first_in = [
        d[0] if d and type(d) in _SEQ and type(d[0]) is str else None for d in c["input_dtypes"]
    ]
    first_out = [
        d[0] if d and type(d) in _SEQ and type(d[0]) is str else None for d in c["output_dtypes"]
    ]
    frame = pl.DataFrame(
        {
            "record_id": pl.Series(ints["record_id"], dtype=pl.Int64),
            "pg_id": pl.Series(ints["pg_id"], dtype=pl.Int64),
            "pg_name": pl.Series(pg_name, dtype=pl.String),
            "pg_desc": pl.Series(pg_desc, dtype=pl.String),
            "collective_seq_id": pl.Series(seq_s, dtype=pl.Int64),
            "p2p_seq_id": pl.Series(ints["p2p_seq_id"], dtype=pl.Int64),
            "op_id": pl.Series(ints["op_id"], dtype=pl.Int64),
            "profiling_name": pl.Series(
                [v if type(v) is str else None for v in names], dtype=pl.String
            ),
            "backend": pl.Series([o[0] for o in ops], dtype=pl.String),
            "op": pl.Series([o[1] for o in ops], dtype=pl.String),
            "is_p2p": pl.Series(
                [v if type(v) is bool else None for v in c["is_p2p"]], dtype=pl.Boolean
            ),
            "peer": pl.Series([o[3] for o in ops], dtype=pl.Int32),
            "state": pl.Series([v if type(v) is str else None for v in states], dtype=pl.String),
            "created_ts": pl.Series(created, dtype=pl.Int64),
            "started_ts": pl.Series(times["time_discovered_started_ns"], dtype=pl.Int64),
            "completed_ts": pl.Series(times["time_discovered_completed_ns"], dtype=pl.Int64),
            "duration_ms": pl.Series(duration, dtype=pl.Float64),
            "input_numel": pl.Series(in_numel, dtype=pl.Int64),
            "output_numel": pl.Series(out_numel, dtype=pl.Int64),
            "input_dtype": pl.Series(first_in, dtype=pl.String),
            "output_dtype": pl.Series(first_out, dtype=pl.String),
            "_in_uniform": pl.Series(in_dt, dtype=pl.String),
            "_out_uniform": pl.Series(out_dt, dtype=pl.String),
            "timeout_ms": pl.Series(ints["timeout_ms"], dtype=pl.Int64),
            "retired": pl.Series(
                [v if type(v) is bool else None for v in c["retired"]], dtype=pl.Boolean
            ),
            "thread_name": pl.Series(
                [v if type(v) is str else None for v in c["thread_name"]], dtype=pl.String
            ),
            "frame": pl.Series(frames.first_user(c["frames"]), dtype=pl.String),
        }
    )
    if skips.reason:
        skipped.update(skips.reason.values())
        keep = pl.Series([i not in skips.reason for i in range(n)])
        frame = frame.filter(keep)
    return frame, skipped


_SIZES = {name: size for name, (size, _code) in TORCH_DTYPES.items()}
_CODES = {name: code for name, (_size, code) in TORCH_DTYPES.items() if code is not None}


def finish_entries(frame: pl.LazyFrame) -> pl.LazyFrame:
    """The columns computed over every dump's entries at once (one polars query, not
    one per dump): bytes, the COLL line's count and datatype, is_p2p where 1.x lacks
    it, and null for the JSON form's 0 (not seen) times."""
    return frame.with_columns(*_derived())


def _derived() -> list[pl.Expr]:
    """Bytes, the COLL line's count and datatype, and is_p2p where 1.x lacks it."""
    op = pl.col("op")

    def nbytes(numel: str, uniform: str) -> pl.Expr:
        size = pl.col(uniform).replace_strict(_SIZES, default=None, return_dtype=pl.Int64)
        return (pl.col(numel) * size).alias(numel.replace("numel", "bytes"))

    return [
        nbytes("input_numel", "_in_uniform"),
        nbytes("output_numel", "_out_uniform"),
        # NCCL's count: the per-rank send count (AllGather), the per-rank receive count
        # (ReduceScatter), the buffer's elements otherwise.
        pl.when(op == "ReduceScatter")
        .then(pl.col("output_numel"))
        .otherwise(pl.col("input_numel"))
        .alias("coll_count"),
        pl.coalesce("input_dtype", "output_dtype")
        .replace_strict(_CODES, default=None, return_dtype=pl.Int16)
        .alias("coll_dtype"),
        pl.col("is_p2p").fill_null(op.is_in(["Send", "Recv"])),
        *(pl.when(pl.col(c) != 0).then(pl.col(c)).alias(c) for c in ("started_ts", "completed_ts")),
    ]
