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

Variants read (see ``fixtures/nccl-tests/README.md``): ``cputime`` for ``time`` (``-C 1``),
``#bitdiff`` and per-iteration ``i_min i_max i_p99 i_cv%`` columns (2.19), a trailing
``timestamp`` column (two tokens), ``N/A`` (``-c 0``), values in e-notation, ``-nan``/
``inf`` (read as null), rccl-tests' ``*`` after a value; every line behind launcher or
logger prefixes (:mod:`.prefix`); headers whose ``#`` was eaten by Markdown; rows cut
into pieces by NCCL's own lines written into the same stdout buffer (stitched back);
several runs in one file; one build without MPI started as several processes (one run
per process); a table pasted without its column header (columns from the row width),
from its units line on or as bare rows; rows whose op name was printed empty under a
``redop`` column (``1024  256  float      -1  33.10 ...``: hypercube, the 2.10-era
tests without a reduction); another process's launcher tag spliced into a row by
interleaved output (``... -1 [1,1]<stdout>:  33.10 ...``: cut out); test-failure lines
after the rows (``node-a: Test NCCL failure ...``); the ``-J`` JSON file of 2.17+.  A
line that fits nothing is counted by reason and skipped (a size or count that is NaN,
a fraction or past int64, a root past int32: ``table row with a number its column
cannot hold``); it never costs the rows around it.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from ncclscope.parsers.common import fit_rows
from ncclscope.parsers.tools.prefix import strip_prefix
from ncclscope.schema import NCCL_TESTS_RUNS_SCHEMA, NCCL_TESTS_SCHEMA, validate

__all__ = ["NcclTestsRead", "parse_nccl_tests"]

_VERSION = re.compile(r"#?\s*[nr]ccl-tests(?: version|: Version) (\S+)(?:.*?nccl-library=(\d+))?")
_STARTING = re.compile(r"Collective test starting:\s*(\w+?)(?:_perf(?:_mpi)?)?(?:\s|$)")
_HEADER = re.compile(
    r"nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+\d+.*?warmup iters:\s*(\d+)\s+iters:\s*(\d+)"
)
_DEVICE = re.compile(
    r"\bRank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)"
)
_AVG = re.compile(r"Avg bus bandwidth\s*:\s*([-+]?(?:nan|inf|[0-9.]+(?:[eE][-+]?\d+)?))", re.I)
_COMMAND = re.compile(r"\b(\w+?)_perf(?:_mpi)?\b")
#: A NCCL log line glued to the end of a row fragment (both streams on one line).
_GLUED = re.compile(r"(?:\[\d{1,5}\]\s*)?[\w.-]+:\d+:\d+ \[\d+\] NCCL (?:INFO|WARN|TRACE)")
#: Another process's launcher tag spliced into a row by interleaved output (``[1,1]<stdout>:``,
#: torchrun's ``[default1]:``, Intel MPI's ``[1]``, ``srun --label``'s ``1:``): no value of a
#: row looks like one, so it is cut out and the row read around it.
_SPLICED = re.compile(
    r"\[\d+,\d+\]<std(?:out|err)>:|\[[A-Za-z]+\d+\]:|\[\d{1,5}\](?=\s)|(?<=\s)\d{1,5}:(?=\s)"
    r"|\([^()]{0,80}?\b(?:pid|rank)=[^()]{0,60}\)"
)
#: Past the columns' types (size and count are int64 in the table): damaged digits.
_INT64 = 2**63
_DAMAGED = "table row with a number its column cannot hold (NaN, a fraction, too large)"
_TIME_COLUMNS = ("time", "cputime")
_WRONG_COLUMNS = ("#wrong", "error")
#: Datatype and reduction names nccl-tests (and rccl-tests) print.
_TYPES = frozenset(
    "int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 char int fp8_e4m3 "
    "fp8_e5m2 f8e4m3 f8e5m2 float16 float32 float64 bf16 fp16 fp32 fp64".split()
)


@dataclass
class NcclTestsRead:
    """One file of nccl-tests output: runs (NCCL_TESTS_RUNS_SCHEMA) and their table rows
    (NCCL_TESTS_SCHEMA), ``file_id`` 0 until the caller sets it; lines skipped by reason."""

    path: str
    runs: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=NCCL_TESTS_RUNS_SCHEMA))
    rows: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=NCCL_TESTS_SCHEMA))
    skipped: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)


@dataclass
class _Run:
    test: str | None = None
    version: str | None = None
    nccl_version: str | None = None
    n_threads: int | None = None
    n_gpus: int | None = None
    iters: int | None = None
    warmup: int | None = None
    devices: list[tuple[int, str]] = field(default_factory=list)
    avgs: list[float | None] = field(default_factory=list)
    layout: _Layout | None = None
    rows: list[tuple[object, ...]] = field(default_factory=list)
    #: Processes that each printed this header: a build without MPI started by mpirun
    #: runs one single-rank test per process, all printing to one stream.
    copies: int = 1

    def started(self) -> bool:
        return bool(self.rows or self.layout or self.avgs)

    def carry(self) -> _Run:
        """A new run after this one's table, keeping what its header said (a second
        table under one header: ``-o all``/``-d all`` printed again, a resumed run)."""
        return _Run(self.test, self.version, self.nccl_version, self.n_threads, self.n_gpus,
                    self.iters, self.warmup, list(self.devices))  # fmt: skip

    @property
    def ranks(self) -> set[int]:
        return {rank for rank, _host in self.devices}

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(host for _rank, host in self.devices))

    @property
    def avg(self) -> float | None:
        return self.avgs[-1] if self.avgs else None


@dataclass(frozen=True)
class _Layout:
    """A table header: where the fixed columns and each half's values sit."""

    ncol: int
    fixed: dict[str, int]
    halves: tuple[dict[str, int], dict[str, int]]  # out-of-place, in-place
    timestamp: bool  # a trailing ``timestamp`` column (two tokens: date and time)
    #: Tokens of a row that prints only its first half, where rows may (MSCCL++'s
    #: tests, under an ``in-place out-of-place`` header, print the in-place half alone);
    #: 0 elsewhere: in nccl-tests' own tables a short row is a cut one.
    first_ncol: int = 0
    #: Which of ``halves`` is printed first: 1 where the header reads ``in-place
    #: out-of-place`` (MSCCL++'s copies of nccl-tests' writer).
    first: int = 0


def _layout(tokens: list[str], ip_first: bool = False) -> _Layout | None:
    """The layout of a column header (``size count type redop root time algbw busbw
    #wrong time ...``), or None where it is not one (``ip_first``: the line above it
    names the in-place half first).  Columns this reader does not know (``#bitdiff``,
    ``i_min``...) are kept in place and ignored."""
    starts = [k for k, t in enumerate(tokens) if t in _TIME_COLUMNS]
    if tokens[:2] != ["size", "count"] or len(starts) != 2:
        return None
    timestamp = tokens[-1] == "timestamp"
    end = len(tokens) - (1 if timestamp else 0)
    fixed = {t: k for k, t in enumerate(tokens[: starts[0]])}
    halves: list[dict[str, int]] = []
    for a, b in ((starts[0], starts[1]), (starts[1], end)):
        half: dict[str, int] = {}
        for k in range(a, b):
            name = "wrong" if tokens[k] in _WRONG_COLUMNS else tokens[k]
            if name in ("time", "cputime"):
                name = "time"
            half.setdefault(name, k)
        if "busbw" not in half:
            return None
        halves.append(half)
    pair = (halves[1], halves[0]) if ip_first else (halves[0], halves[1])
    return _Layout(len(tokens), fixed, pair, timestamp, starts[1] if ip_first else 0, int(ip_first))


#: The writers' column headers by row width, for a table pasted without its header:
#: 2.10+ (every test), then pre-2.10 with ``redop`` or with ``root``, then neither.
_HEADERS = {
    13: "size count type redop root time algbw busbw #wrong time algbw busbw #wrong",
    12: "size count type {} time algbw busbw error time algbw busbw error",
    11: "size count type time algbw busbw error time algbw busbw error",
}


def _guess_layout(tokens: list[str]) -> _Layout | None:
    """The layout of a row met before any column header, from its width and whether
    its fourth token is a reduction (``sum``) or a root (``0``)."""
    if not _starts_row(tokens) or len(tokens) not in _HEADERS:
        return None
    header = _HEADERS[len(tokens)]
    if "{}" in header:
        header = header.format("root" if tokens[3].lstrip("-").isdigit() else "redop")
    return _layout(header.split())


def _nccl_version(code: str) -> str:
    """``22203`` -> ``2.22.3`` (NCCL_VERSION_CODE: major*10000 + minor*100 + patch)."""
    n = int(code)
    return f"{n // 10000}.{n // 100 % 100}.{n % 100}" if n >= 10000 else code


def _num(token: str) -> float | None:
    """A printed value: ``N/A``/``-`` and non-finite values (``nan``, ``-nan``, ``inf``)
    are None; rccl-tests' trailing ``*`` (an error over its threshold) is dropped."""
    token = token.rstrip("*")
    if token in ("N/A", "n/a", "-", ""):
        return None
    value = float(token)
    return value if math.isfinite(value) else None


def _is_value(token: str) -> bool:
    try:
        _num(token)
    except ValueError:
        return False
    return True


def parse_nccl_tests(text: str, display: str) -> NcclTestsRead:
    """Read every run in ``text`` (the text output, or the ``-J`` JSON file of 2.17+);
    never raises on its content."""
    if text.lstrip(" \t\r\n\ufeff").startswith("{"):
        return _parse_json(text, display)
    out = NcclTestsRead(display)
    runs: list[_Run] = []
    run = _Run()
    command_test: str | None = None
    pending: tuple[int, list[str]] | None = None  # a row cut by interleaved output
    ip_first = False  # the half-names line above the column header: in-place first
    notes_guessed = False

    def new_run(keep: bool = False) -> _Run:
        runs.append(run)
        return run.carry() if keep else _Run(test=None)

    for k, raw in enumerate(text.splitlines(), start=1):
        line = strip_prefix(raw.strip("\ufeff\x00").lstrip()).strip()
        if not line:
            continue
        glued = _GLUED.search(line)
        if glued is not None and glued.start() > 0:
            line = line[: glued.start()].rstrip()  # the row's part; the rest is a log line
        if m := _VERSION.search(raw):  # before prefixes go: "rccl-tests: Version" is one
            if run.started():
                run = new_run()
            run.version = m.group(1)
            run.nccl_version = _nccl_version(m.group(2)) if m.group(2) else None
            continue
        if m := _STARTING.search(line):
            if run.started():
                run = new_run()
            run.test = m.group(1)
            continue
        if m := _HEADER.search(line):
            if run.started():
                run = new_run()
            elif run.n_threads is not None:
                run.copies += 1  # the same header again before any table: another process
            run.n_threads, run.n_gpus, run.warmup, run.iters = (int(g) for g in m.groups())
            if run.test is None:
                run.test = command_test
            continue
        if m := _DEVICE.search(line):
            run.devices.append((int(m.group(1)), m.group(3)))
            continue
        if m := _AVG.search(line):
            value = _num(m.group(1))
            run.avgs.append(value * 1e9 if value is not None else None)
            continue
        if "out-of-place" in line and "in-place" in line:
            ip_first = line.index("in-place") < line.index("out-of-place")
            continue
        tokens = line.lstrip("#").split()
        if tokens[:2] == ["size", "count"]:
            layout = _layout(tokens, ip_first)
            ip_first = False
            if layout is None:
                out.skipped["table header with unknown columns"] += 1
            elif run.rows:
                run = new_run(keep=True)
            run.layout = layout
            pending = None
            continue
        if line.startswith("#") or (glued is not None and glued.start() == 0):
            continue
        if "NCCL INFO" in line or "NCCL WARN" in line:
            continue
        if line[:1].isdigit():
            line = _SPLICED.sub(" ", line)
        else:
            if m := _COMMAND.search(line):
                command_test = m.group(1)
                if run.test is None and not run.started():
                    run.test = command_test
            elif run.layout is not None and _damaged_row(line.split()):
                out.skipped[_DAMAGED] += 1
            continue
        tokens = line.split()
        if run.layout is None:
            run.layout = _guess_layout(tokens)
            if run.layout is None:
                continue
            notes_guessed = True
        tokens = _empty_redop(tokens, run.layout)
        if pending is not None and not _starts_row(tokens) and all(map(_is_value, tokens)):
            first, before = pending
            tokens = _empty_redop(before + tokens, run.layout)
            if len(tokens) < run.layout.ncol - run.layout.timestamp:
                pending = (first, tokens)
                continue
            k, pending = first, None
        else:
            if pending is not None:
                _half_or_cut(out, run, pending)
                pending = None
            if _starts_row(tokens) and len(tokens) < run.layout.ncol - run.layout.timestamp:
                pending = (k, tokens)
                continue
        row = _row(tokens, run.layout)
        if row is None:
            lay = run.layout
            fits = len(tokens) in (lay.ncol - lay.timestamp, lay.ncol + lay.timestamp)
            out.skipped[_DAMAGED if fits else "table row that does not fit its header"] += 1
            continue
        run.rows.append((k, *row))
    if pending is not None:
        _half_or_cut(out, run, pending)
    if notes_guessed:
        out.notes.append("a table without its column header: columns taken from the rows")
    runs.append(run)
    _frames(out, [part for r in runs if r.rows or r.avgs for part in _processes(r)])
    return out


def _half_or_cut(out: NcclTestsRead, run: _Run, pending: tuple[int, list[str]]) -> None:
    """A short row followed by no continuation: a row that prints only its first half,
    or one cut and never completed."""
    k, tokens = pending
    row = _row(_empty_redop(tokens, run.layout), run.layout) if run.layout is not None else None
    if row is None:
        out.skipped["table row cut and never completed"] += 1
    else:
        run.rows.append((k, *row))


def _processes(run: _Run) -> list[_Run]:
    """``run`` split into the single-process runs printed into one stream (``copies``):
    the k-th row of a size (and type, op, root) is the k-th process's, the device rows
    and average lines go to the processes in the order printed."""
    n = run.copies
    if n < 2:
        return [run]
    parts = [_Run(run.test, run.version, run.nccl_version, run.n_threads, run.n_gpus, run.iters,
                  run.warmup) for _ in range(n)]  # fmt: skip
    per = -(-len(run.devices) // n)  # a cut file may miss the last process's rows
    for k, part in enumerate(parts):
        part.devices = run.devices[k * per : (k + 1) * per]
        part.avgs = run.avgs[k : k + 1]
    seen: Counter[tuple[object, ...]] = Counter()
    for row in run.rows:
        key = row[1:6]
        parts[min(seen[key], n - 1)].rows.append(row)
        seen[key] += 1
    return [part for part in parts if part.rows or part.avgs or part.devices]


def _damaged_row(tokens: list[str]) -> bool:
    """Whether ``tokens`` are a row whose size is not a number (``-nan 256 float ...``):
    a line damaged in the row's place, not another program's."""
    return (
        len(tokens) >= 8
        and tokens[1].lstrip("-").isdigit()
        and tokens[2].lower() in _TYPES
        and sum(map(_is_value, tokens[3:])) >= 5
    )


def _empty_redop(tokens: list[str], lay: _Layout) -> list[str]:
    """``tokens`` with the reduction put back where a test printed an empty op name
    under a ``redop`` column (``TimeTest(..., "", -1)``: hypercube, and every test
    without a reduction in the 2.10 era), so the row is one token short and its root
    sits where the op should be::

        1024   256  float      -1   33.10  0.03  0.06  0   32.80  0.03  0.06  0
    """
    op, root = lay.fixed.get("redop"), lay.fixed.get("root")
    width = lay.ncol - (1 if lay.timestamp else 0)
    if (
        op is None
        or root != op + 1
        or len(tokens) not in (width - 1, width + (1 if lay.timestamp else 0) - 1)
        or not _starts_row(tokens)
        or not tokens[op].lstrip("-").isdigit()
    ):
        return tokens
    return [*tokens[:op], "", *tokens[op:]]


def _starts_row(tokens: list[str]) -> bool:
    """Whether ``tokens`` begin a table row: size and count, then a datatype name."""
    return (
        len(tokens) >= 3
        and tokens[0].isdigit()
        and tokens[1].isdigit()
        and tokens[2].lower() in _TYPES
    )


def _row(tokens: list[str], lay: _Layout) -> tuple[object, ...] | None:
    """One table row by its header's layout: (size, count, type, redop, root, then
    time, algbw, busbw, wrong for out-of-place and in-place)."""
    n = len(tokens)
    if lay.timestamp and n == lay.ncol + 1:
        tokens = tokens[:-2]  # "2026-03-02 11:04:31": two tokens under one label
        n = len(tokens)
    elif lay.timestamp and n == lay.ncol:
        tokens = tokens[:-1]
        n = len(tokens)
    halves: tuple[dict[str, int], ...] = lay.halves
    if n == lay.first_ncol and lay.first_ncol:
        # Only the first printed half: the other one's values are missing.
        halves = tuple(h if k == lay.first else {} for k, h in enumerate(lay.halves))
    elif n != lay.ncol - (1 if lay.timestamp else 0):
        return None
    try:
        size, count = int(tokens[lay.fixed["size"]]), int(tokens[lay.fixed["count"]])
        dtype = tokens[lay.fixed["type"]] if "type" in lay.fixed else None
        redop = (tokens[lay.fixed["redop"]] or None) if "redop" in lay.fixed else None
        root = int(tokens[lay.fixed["root"]]) if "root" in lay.fixed else None
        values = [
            _num(tokens[half[name]]) if name in half else None
            for half in halves
            for name in ("time", "algbw", "busbw", "wrong")
        ]
    except (ValueError, KeyError, IndexError):
        return None
    if not (0 <= size < _INT64 and 0 <= count < _INT64):
        return None
    if dtype is not None and not dtype[:1].isalpha():
        return None
    if root is not None and not -(2**31) <= root < 2**31:
        return None
    ot, oa, ob, ow, it, ia, ib, iw = values
    return (size, count, dtype, redop, root, *_si(ot, oa, ob), ow, *_si(it, ia, ib), iw)


def _si(time_us: float | None, alg: float | None, bus: float | None) -> tuple[float | None, ...]:
    """Microseconds and GB/s as printed -> seconds and bytes per second."""
    return (
        time_us * 1e-6 if time_us is not None else None,
        alg * 1e9 if alg is not None else None,
        bus * 1e9 if bus is not None else None,
    )


def _positive(value: object) -> bool:
    return isinstance(value, float) and value > 0


def _frames(out: NcclTestsRead, runs: list[_Run]) -> None:
    head: list[tuple[object, ...]] = []
    rows: list[tuple[object, ...]] = []
    for k, r in enumerate(runs):
        wrong = sum(1 for row in r.rows if any(_positive(row[i]) for i in (9, 13)))
        head.append(
            (0, k, r.test, r.version, r.nccl_version, r.n_threads, r.n_gpus, r.iters,
             r.warmup, len(r.ranks) or None, r.hosts, r.avg, len(r.rows), wrong)
        )  # fmt: skip
        rows += [(0, k, row[0], r.test, *row[1:]) for row in r.rows]
    # A number past its column (a damaged thread or iteration count) is left out.
    head, bad_head = fit_rows(head, NCCL_TESTS_RUNS_SCHEMA)
    rows, bad_rows = fit_rows(rows, NCCL_TESTS_SCHEMA)
    if bad := bad_head + bad_rows:
        out.skipped["number past its column (damaged): left out"] += bad
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


# -- the JSON file (``-J path``, nccl-tests 2.17+; JSON_FILE_VERSION 3) ---------------------


def _parse_json(text: str, display: str) -> NcclTestsRead:
    """``{"version", "args", "nccl_version", "config": {..., "devices": [...]},
    "results": [{"size", "count", "type", "redop", "root", "out_of_place": {"time",
    "alg_bw", "bus_bw", "nwrong"}, "in_place": {...}}], "average_bus_bandwidth":
    {"bandwidth"}}``.  A file cut short (the job killed) keeps every whole result."""
    out = NcclTestsRead(display)
    run = _Run()
    try:
        top = json.loads(text)
        results = top.get("results") if isinstance(top, dict) else None
    except (ValueError, RecursionError):  # RecursionError: nested too deeply (junk)
        top, results = None, None
        out.skipped["JSON cut or damaged: whole results read one by one"] += 1
    if not isinstance(top, dict):
        top = {}
        results = _salvage(text)
    config = _obj(top.get("config"))
    args = top.get("args")
    if isinstance(args, list) and args and isinstance(args[0], str):
        if m := _COMMAND.search(args[0]):
            run.test = m.group(1)
    code = top.get("nccl_version")
    if isinstance(code, int) and not isinstance(code, bool):
        run.nccl_version = _nccl_version(str(code))
    run.n_threads, run.n_gpus = _int(config.get("nthreads")), _int(config.get("ngpus"))
    run.iters, run.warmup = _int(config.get("iterations")), _int(config.get("warmup_iters"))
    for d in config.get("devices") or []:
        if isinstance(d, dict) and _int(d.get("rank")) is not None:
            host = d.get("hostname")
            run.devices.append((d["rank"], host if isinstance(host, str) else "?"))
    bandwidth = _obj(top.get("average_bus_bandwidth"))
    if bandwidth:
        avg = _float(bandwidth.get("bandwidth"))
        run.avgs.append(avg * 1e9 if avg is not None else None)
    for k, r in enumerate(results if isinstance(results, list) else []):
        row = _json_row(r)
        if row is None:
            out.skipped["result entry not understood"] += 1
            continue
        run.rows.append((k + 1, *row))
    _frames(out, [run] if run.rows or run.avgs else [])
    return out


def _salvage(text: str) -> list[Any]:
    """Every whole ``{"size": ...}`` result object in a cut JSON file."""
    decoder = json.JSONDecoder()
    found: list[Any] = []
    for m in re.finditer(r'\{\s*"size"\s*:', text):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except (ValueError, RecursionError):
            continue
        found.append(obj)
    return found


def _json_row(r: Any) -> tuple[object, ...] | None:
    if not isinstance(r, dict):
        return None
    size, count = _int(r.get("size")), _int(r.get("count"))
    if size is None or count is None or not (0 <= size < _INT64 and 0 <= count < _INT64):
        return None  # as in the text table: a size past int64 is damage
    root_raw = r.get("root")
    try:
        root = int(str(root_raw).strip()) if root_raw is not None else None
    except ValueError:
        root = None
    if root is not None and not -(2**31) <= root < 2**31:
        root = None
    halves = []
    for key in ("out_of_place", "in_place"):
        h = _obj(r.get(key))
        time_us = _float(h.get("time", h.get("cpu_time")))
        halves.append((*_si(time_us, _float(h.get("alg_bw")), _float(h.get("bus_bw"))),
                       _float(h.get("nwrong"))))  # fmt: skip
    dtype, redop = r.get("type"), r.get("redop")
    return (size, count, dtype if isinstance(dtype, str) else None,
            redop if isinstance(redop, str) else None, root, *halves[0], *halves[1])  # fmt: skip


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        f = float(value)
    except ValueError:
        return None
    return f if math.isfinite(f) else None
