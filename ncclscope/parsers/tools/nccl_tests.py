"""nccl-tests output (``all_reduce_perf``, ``all_gather_perf``, ...): header, table, average.

The layouts differ by version; the table's own column header says which columns a row
has, so rows are read by that header, not by a fixed position.  Older versions (2.0-2.9)
print no ``root`` column and, for tests without a reduction, no ``redop``; the error
column is the max error (``0e+00``).  From 2.10 every test prints ``redop`` and ``root``
and the ``#wrong`` count (``N/A`` without validation); 2.13+ also print the
``# nccl-tests version`` line and ``# Collective test starting:``.  A run as 2.13 prints
it (trimmed)::

    # nccl-tests version 2.13.11 nccl-headers=22203 nccl-library=22203
    # Collective test starting: all_gather_perf
    # nThread 1 nGpus 1 minBytes 1024 maxBytes 1073741824 step: 2(factor) warmup iters: 5
      iters: 20 agg iters: 1 validation: 1 graph: 0
    # Using devices
    #  Rank  0 Group  0 Pid  31337 on     node-a device  0 [0000:18:00] NVIDIA H100 80GB HBM3
    #                                         out-of-place                in-place
    #  size   count  type redop root  time algbw busbw #wrong  time algbw busbw #wrong
    #   (B) (elements)                (us) (GB/s) (GB/s)       (us) (GB/s) (GB/s)
       1024      32 float  none   -1 24.10  0.04  0.04      0 23.80  0.04  0.04      0
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 12.3456

(the nThread line is one line; the columns are wider in the real output).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import polars as pl

from ncclscope.schema import NCCL_TESTS_RUNS_SCHEMA, NCCL_TESTS_SCHEMA, validate

__all__ = ["NcclTestsRead", "parse_nccl_tests"]

_VERSION = re.compile(r"#\s*nccl-tests version (\S+)(?:.*?nccl-library=(\d+))?")
_STARTING = re.compile(r"#\s*Collective test starting:\s*(\w+?)(?:_perf)?\b")
_HEADER = re.compile(
    r"nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+\d+.*?warmup iters:\s*(\d+)\s+iters:\s*(\d+)"
)
_DEVICE = re.compile(
    r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)"
)
_AVG = re.compile(r"#?\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+|nan|inf)")
_COMMAND = re.compile(r"\b(\w+?)_perf(?:_mpi)?\b")
#: Column names as the table header spells them -> ours (time/algbw/busbw/#wrong twice).
_KNOWN = {"size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "error"}


@dataclass
class NcclTestsRead:
    """One file of nccl-tests output: runs (NCCL_TESTS_RUNS_SCHEMA) and their table rows
    (NCCL_TESTS_SCHEMA), ``file_id`` 0 until the caller sets it; lines skipped by reason."""

    path: str
    runs: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=NCCL_TESTS_RUNS_SCHEMA))
    rows: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=NCCL_TESTS_SCHEMA))
    skipped: Counter[str] = field(default_factory=Counter)


@dataclass
class _Run:
    test: str | None = None
    version: str | None = None
    nccl_version: str | None = None
    n_threads: int | None = None
    n_gpus: int | None = None
    iters: int | None = None
    warmup: int | None = None
    ranks: set[int] = field(default_factory=set)
    hosts: list[str] = field(default_factory=list)
    avg: float | None = None
    columns: list[str] | None = None
    rows: list[tuple[object, ...]] = field(default_factory=list)

    def started(self) -> bool:
        return bool(self.rows or self.columns or self.avg is not None)


def _nccl_version(code: str) -> str:
    """``22203`` -> ``2.22.3`` (NCCL_VERSION_CODE: major*10000 + minor*100 + patch)."""
    n = int(code)
    return f"{n // 10000}.{n // 100 % 100}.{n % 100}" if n >= 10000 else code


def _num(token: str) -> float | None:
    if token in ("N/A", "n/a", "-"):
        return None
    return float(token)


def parse_nccl_tests(text: str, display: str) -> NcclTestsRead:
    """Read every run in ``text``; never raises on its content."""
    out = NcclTestsRead(display)
    runs: list[_Run] = []
    run = _Run()
    command_test: str | None = None

    def new_run() -> _Run:
        runs.append(run)
        return _Run(test=None)

    for k, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if m := _VERSION.match(line):
            if run.started():
                run = new_run()
            run.version = m.group(1)
            run.nccl_version = _nccl_version(m.group(2)) if m.group(2) else None
            continue
        if m := _STARTING.match(line):
            if run.started():
                run = new_run()
            run.test = m.group(1)
            continue
        if m := _HEADER.search(line):
            if run.started():
                run = new_run()
            run.n_threads, run.n_gpus, run.warmup, run.iters = (int(g) for g in m.groups())
            if run.test is None:
                run.test = command_test
            continue
        if m := _DEVICE.match(line):
            rank, host = int(m.group(1)), m.group(3)
            run.ranks.add(rank)
            if host not in run.hosts:
                run.hosts.append(host)
            continue
        if m := _AVG.match(line):
            run.avg = float(m.group(1)) * 1e9
            continue
        if line.startswith("#"):
            tokens = line.lstrip("#").split()
            if tokens[:2] == ["size", "count"] and "busbw" in tokens:
                if not set(tokens) <= _KNOWN or tokens.count("time") != 2:
                    out.skipped["table header with unknown columns"] += 1
                    run.columns = None
                else:
                    run.columns = tokens
            continue
        if "NCCL INFO" in line or "NCCL WARN" in line:
            continue
        if m := _COMMAND.search(line):
            if not line[:1].isdigit():
                command_test = m.group(1)
                if run.test is None and not run.started():
                    run.test = command_test
                continue
        if run.columns is None or not line[:1].isdigit():
            continue
        row = _row(line, run.columns)
        if row is None:
            out.skipped["table row that does not fit its header"] += 1
            continue
        run.rows.append((k, *row))
    runs.append(run)
    _frames(out, [r for r in runs if r.rows or r.avg is not None])
    return out


def _row(line: str, columns: list[str]) -> tuple[object, ...] | None:
    """One table row by its header's columns: (size, count, type, redop, root, then
    time, algbw, busbw, wrong for out-of-place and in-place)."""
    tokens = line.split()
    if len(tokens) != len(columns):
        return None
    halves: list[list[float | None]] = [[], []]
    fixed: dict[str, str] = {}
    half = 0
    try:
        for name, tok in zip(columns, tokens, strict=True):
            if name in ("time", "algbw", "busbw", "#wrong", "error"):
                halves[half].append(_num(tok))
                if name in ("#wrong", "error"):
                    half = 1
            else:
                fixed[name] = tok
        size, count = int(fixed["size"]), int(fixed["count"])
        root = int(fixed["root"]) if "root" in fixed else None
    except (ValueError, KeyError):
        return None
    if size < 0 or count < 0 or any(len(h) != 4 for h in halves):
        return None
    (ot, oa, ob, ow), (it, ia, ib, iw) = halves
    us, gbs = 1e-6, 1e9
    return (
        size, count, fixed.get("type"), fixed.get("redop"), root,
        ot * us if ot is not None else None, oa * gbs if oa is not None else None,
        ob * gbs if ob is not None else None, ow,
        it * us if it is not None else None, ia * gbs if ia is not None else None,
        ib * gbs if ib is not None else None, iw,
    )  # fmt: skip


def _positive(value: object) -> bool:
    return isinstance(value, float) and value > 0


def _frames(out: NcclTestsRead, runs: list[_Run]) -> None:
    head = []
    rows = []
    for k, r in enumerate(runs):
        wrong = sum(1 for row in r.rows if any(_positive(row[i]) for i in (9, 13)))
        head.append(
            (0, k, r.test, r.version, r.nccl_version, r.n_threads, r.n_gpus, r.iters,
             r.warmup, len(r.ranks) or None, r.hosts, r.avg, len(r.rows), wrong)
        )  # fmt: skip
        rows += [(0, k, row[0], r.test, *row[1:]) for row in r.rows]
    out.runs = validate(
        pl.DataFrame(head, schema=NCCL_TESTS_RUNS_SCHEMA, orient="row"),
        NCCL_TESTS_RUNS_SCHEMA,
        "nccl_tests_runs",
    )
    out.rows = validate(
        pl.DataFrame(rows, schema=NCCL_TESTS_SCHEMA, orient="row"),
        NCCL_TESTS_SCHEMA,
        "nccl_tests",
    )
