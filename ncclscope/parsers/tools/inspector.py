"""NCCL Inspector records: one JSON object per line, per completed collective per rank.

The plugin (``ext-profiler/inspector`` in NCCL 2.28.3-2.29, ``plugins/profiler/inspector``
from 2.29.7) writes one file per process, ``<hostname>-pid<pid>.log``, under
``NCCL_INSPECTOR_DUMP_DIR``.  A record as ``inspectorCommInfoDump`` writes it (output
format ``v4.0``; doubles printed with ``%lf``)::

    {"header":{"id":"5a1f3c9e0b2d4e6f","rank":3,"n_ranks":8,"nnodes":2},
     "metadata":{"inspector_output_format_version":"v4.0","git_rev":"...",
                 "rec_mechanism":"nccl_profiler_interface",
                 "dump_timestamp_us":1764124401000123,"hostname":"gpu-a","pid":4242},
     "coll_perf":{"coll":"AllGather","coll_sn":17,"coll_msg_size_bytes":4194304,
                  "coll_exec_time_us":812,"coll_timing_source":"kernel_gpu",
                  "coll_algobw_gbs":41.325911,"coll_busbw_gbs":36.160172}}

(on one line).  2.30 adds ``header.comm_name``; with ``NCCL_INSPECTOR_DUMP_VERBOSE=1``
``coll_perf`` also holds ``event_trace_sn``/``event_trace_ts``, ignored here.
``header.id`` is the communicator's hash (``commId`` in NCCL's Init lines);
``coll_sn`` counts per communicator and per op, from 0.

Reading is vectorised, fastest first (:func:`read_inspector_files`):

- by the writer's layout, taken from each file's first lines: polars' CSV reader splits
  the records at their commas and every cell is checked against the layout (key, the
  objects it closes, the value's type); the ``header``/``metadata`` cells, the same for
  every record of a process between two dumps, are parsed once per run;
- files without a layout (verbose records with arrays, a damaged first line) through
  polars' JSON-lines reader;
- lines that match neither, one regex per field (key order and spacing do not matter),
  and ``json`` to say why a line is skipped.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ncclscope.schema import INSPECTOR_SCHEMA, validate

__all__ = [
    "InspectorRead",
    "normalise_hash",
    "read_inspector",
    "read_inspector_files",
    "read_inspector_text",
]

_INT = r"\s*:\s*(-?\d+)"
_NUM = r"\s*:\s*(-?[0-9.]+(?:[eE][-+]?\d+)?|nan|inf|-nan|-inf)"
_STR = r'\s*:\s*"([^"\\]*)"'
#: field -> (regex, dtype, required)
_FIELDS: dict[str, tuple[str, Any, bool]] = {
    "comm_hash": (r'"id"' + _STR, pl.String, True),
    "comm_name": (r'"comm_name"' + _STR, pl.String, False),
    "comm_rank": (r'"rank"' + _INT, pl.Int32, True),
    "nranks": (r'"n_ranks"' + _INT, pl.Int32, False),
    "nnodes": (r'"nnodes"' + _INT, pl.Int32, False),
    "format_version": (r'"inspector_output_format_version"' + _STR, pl.String, False),
    "dump_us": (r'"dump_timestamp_us"' + _INT, pl.Int64, False),
    "host": (r'"hostname"' + _STR, pl.String, False),
    "pid": (r'"pid"' + _INT, pl.Int32, False),
    "op": (r'"coll"' + _STR, pl.String, True),
    "sn": (r'"coll_sn"' + _INT, pl.Int64, True),
    "msg_size_bytes": (r'"coll_msg_size_bytes"' + _INT, pl.Int64, True),
    "exec_us": (r'"coll_exec_time_us"' + _NUM, pl.Float64, True),
    "timing_source": (r'"coll_timing_source"' + _STR, pl.String, False),
    "algo_gbs": (r'"coll_algobw_gbs"' + _NUM, pl.Float64, False),
    "bus_gbs": (r'"coll_busbw_gbs"' + _NUM, pl.Float64, False),
}
_REQUIRED = [k for k, (_r, _t, req) in _FIELDS.items() if req]
#: The plugin's op names (``ncclFuncToString``); anything else is skipped.
OPS = frozenset(
    {"AllGather", "AllReduce", "Broadcast", "Reduce", "ReduceScatter", "Send", "Recv",
     "SendRecv", "AllToAll", "Gather", "Scatter"}
)  # fmt: skip
#: The record's objects as the writer nests them, for polars' JSON-lines reader (keys
#: it does not list, such as ``git_rev`` or the verbose ``event_trace_*``, are ignored).
_NDJSON = {
    "header": pl.Struct(
        {"id": pl.String, "comm_name": pl.String, "rank": pl.Int64, "n_ranks": pl.Int64,
         "nnodes": pl.Int64}
    ),
    "metadata": pl.Struct(
        {"inspector_output_format_version": pl.String, "dump_timestamp_us": pl.Int64,
         "hostname": pl.String, "pid": pl.Int64}
    ),
    "coll_perf": pl.Struct(
        {"coll": pl.String, "coll_sn": pl.Int64, "coll_msg_size_bytes": pl.Int64,
         "coll_exec_time_us": pl.Float64, "coll_timing_source": pl.String,
         "coll_algobw_gbs": pl.Float64, "coll_busbw_gbs": pl.Float64}
    ),
}  # fmt: skip
_FROM_NDJSON = {
    "comm_hash": ("header", "id"),
    "comm_name": ("header", "comm_name"),
    "comm_rank": ("header", "rank"),
    "nranks": ("header", "n_ranks"),
    "nnodes": ("header", "nnodes"),
    "format_version": ("metadata", "inspector_output_format_version"),
    "dump_us": ("metadata", "dump_timestamp_us"),
    "host": ("metadata", "hostname"),
    "pid": ("metadata", "pid"),
    "op": ("coll_perf", "coll"),
    "sn": ("coll_perf", "coll_sn"),
    "msg_size_bytes": ("coll_perf", "coll_msg_size_bytes"),
    "exec_us": ("coll_perf", "coll_exec_time_us"),
    "timing_source": ("coll_perf", "coll_timing_source"),
    "algo_gbs": ("coll_perf", "coll_algobw_gbs"),
    "bus_gbs": ("coll_perf", "coll_busbw_gbs"),
}


@dataclass
class InspectorRead:
    """One Inspector file as read: ``rows`` (INSPECTOR_SCHEMA, ``file_id`` 0 until the
    caller sets it), lines skipped by reason, and the format versions seen."""

    path: str
    lines: int = 0
    rows: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=INSPECTOR_SCHEMA))
    skipped: Counter[str] = field(default_factory=Counter)
    versions: list[str] = field(default_factory=list)


def normalise_hash(value: pl.Expr) -> pl.Expr:
    """A communicator hash as both sides write it (``0x00ab..``, ``AB..``) -> ``ab..``."""
    return (
        value.str.to_lowercase()
        .str.strip_chars()
        .str.strip_prefix("0x")
        .str.strip_chars_start("0")
        .replace("", "0")
    )


def read_inspector(path: Path, display: str) -> InspectorRead:
    """Read one Inspector output file; never raises on its content.

    A whole file of well-formed JSON lines goes through polars' JSON-lines reader in one
    call; the lines it cannot take as records, or every line of a file that is not all
    JSON, are read line by line (per-field regexes), so that every good record is kept
    and every bad line counted with its reason.
    """
    try:
        raw = _text_lines(path)
    except OSError as err:
        out = InspectorRead(display)
        out.skipped[f"cannot read: {err}"] += 1
        return out
    raw = raw.filter(pl.col("line").is_not_null() & (pl.col("line").str.strip_chars() != ""))
    try:
        doc = pl.read_ndjson(path, schema=_NDJSON)
    except (OSError, pl.exceptions.PolarsError):
        doc = None
    if doc is None or doc.height != raw.height:
        return _read(raw, display)
    parsed = raw.hstack(_fields(doc))
    good = parsed.filter(_valid())
    if good.height == parsed.height:
        return _finish(InspectorRead(display, lines=raw.height), parsed)
    # Lines the JSON reader could not take as records (a key of an object damaged, a
    # field out of place) get the per-field regexes, as on every other path.
    again = _read(raw.join(good.select("line_no"), on="line_no", how="anti"), display)
    out = _finish(InspectorRead(display, lines=raw.height), good)
    out.rows = pl.concat([out.rows, again.rows]).sort("line_no")
    out.skipped = again.skipped
    out.versions = sorted({*out.versions, *again.versions})
    return out


def _fields(doc: pl.DataFrame) -> pl.DataFrame:
    return doc.select(
        pl.col(obj).struct.field(key).cast(_FIELDS[name][1], strict=False).alias(name)
        for name, (obj, key) in _FROM_NDJSON.items()
    )


def _plain_lines(path: Path) -> int | None:
    """Lines of a file with no blank line and no carriage return (what the JSON-lines
    reader's row count must equal), else None: such a file is read on its own."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not data.strip() or b"\n\n" in data or b"\r" in data or data.startswith(b"\n"):
        return None
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def read_inspector_files(files: Sequence[tuple[int, Path, str]]) -> dict[int, InspectorRead]:
    """Read many Inspector files (``file_id``, path, display name); ``rows.file_id`` is
    set.  Files are read, fastest first, by the writer's layout (:func:`_by_layout`), then
    in one call of polars' JSON-lines reader (per-file costs add up: the plugin writes
    one file per process), and any other with :func:`read_inspector`."""
    out: dict[int, InspectorRead] = {}
    groups: dict[_Layout, list[tuple[int, Path, str]]] = {}
    for fid, path, display in files:
        layout = _file_layout(path)
        if layout is not None:
            groups.setdefault(layout, []).append((fid, path, display))
    for layout, members in groups.items():
        out.update(_by_layout(members, layout))
    files = [f for f in files if f[0] not in out]
    counts = {fid: _plain_lines(path) for fid, path, _d in files}
    batch = [(fid, path, d) for fid, path, d in files if counts[fid] is not None]
    if len(batch) > 1:
        out.update(_batch(batch, counts))
    for fid, path, display in files:
        if fid not in out:
            read = read_inspector(path, display)
            read.rows = read.rows.with_columns(pl.lit(fid, pl.UInt32).alias("file_id"))
            out[fid] = read
    return out


def _batch(
    batch: list[tuple[int, Path, str]], counts: dict[int, int | None]
) -> dict[int, InspectorRead]:
    ids = {str(path): fid for fid, path, _d in batch}
    try:
        doc = pl.scan_ndjson(
            [path for _f, path, _d in batch], schema=_NDJSON, include_file_paths="src"
        ).collect()
    except (OSError, pl.exceptions.PolarsError):
        return {}
    per_file = doc.group_by("src").len()
    if any(counts[ids.get(src, -1)] != n for src, n in per_file.iter_rows()) or len(
        per_file
    ) != len(batch):
        return {}
    parsed = _fields(doc).with_columns(
        doc["src"].replace_strict(ids, return_dtype=pl.UInt32).alias("fid"),
        (pl.int_range(pl.len()).over(doc["src"]) + 1).cast(pl.UInt32).alias("line_no"),
    )
    if not parsed.filter(~_valid()).is_empty():
        return {}  # a record out of range: read each file on its own to say which
    rows = _rows(parsed, pl.col("fid"))
    out = {}
    by_file = rows.partition_by("file_id", as_dict=True)
    for fid, _path, display in batch:
        part = by_file.get((fid,), rows.clear())
        n = counts[fid] or 0
        versions = sorted(v for v in part["format_version"].drop_nulls().unique())
        out[fid] = InspectorRead(display, lines=n, rows=part, versions=versions)
    return out


#: One field of a record as the writer prints it: the opening of its objects and its
#: key (``{"header":{"id":``), its value, and the objects it closes (``}}``).
_TOKEN = re.compile(r'\s*(?:(\{)|"([^"\\]*)"\s*:\s*)')
_SCALAR = re.compile(r'"[^"\\]*"|-?[0-9][0-9.eE+-]*|true|false|null')
_STRING = r'^"[^"\\]*"$'


@dataclass(frozen=True)
class _Cell:
    """One comma-separated cell of a record: what it must start and end with, and the
    field it holds (``(object, key)``)."""

    prefix: str
    closes: int
    path: tuple[str, ...]


_Layout = tuple[_Cell, ...]


def _file_layout(path: Path) -> _Layout | None:
    """The layout most of the file's first lines (up to 8, within 64 KiB) share, so that
    one damaged first line does not decide how the file is read."""
    try:
        with path.open("rb") as fh:
            head = fh.read(65536)
    except OSError:
        return None
    lines = head.split(b"\n")[:8]
    if len(lines) > 1 and len(head) == 65536:
        lines = lines[:-1]  # the last may be cut by the read
    seen: Counter[_Layout] = Counter()
    for raw in lines:
        try:
            layout = _layout(raw.decode().rstrip("\r"))
        except UnicodeDecodeError:
            continue
        if layout is not None:
            seen[layout] += 1
    if not seen:
        return None
    # Most lines first; between as many, the layout that reads more fields (a damaged
    # key reads one field fewer).
    wanted = set(_FROM_NDJSON.values())
    return max(seen, key=lambda lay: (seen[lay], sum(c.path in wanted for c in lay)))


def _layout(line: str) -> _Layout | None:
    """The cells of a record as ``line`` lays them out, where every field is a scalar
    and no value holds a comma (the plugin's ``fprintf`` records); None otherwise.

    >>> cells = _layout('{"header":{"id":"5a1f","rank":3},"coll_perf":{"coll":"AllGather",'
    ...     '"coll_sn":17,"coll_msg_size_bytes":4194304,"coll_exec_time_us":812}}')
    >>> [(c.prefix, c.closes, c.path) for c in cells[:2]]
    [('{"header":{"id":', 0, ('header', 'id')), ('"rank":', 1, ('header', 'rank'))]
    """
    if not line or not line.startswith("{"):
        return None
    stack: list[str] = []
    cells = []
    for cell in line.split(","):
        pos, key = 0, None
        while m := _TOKEN.match(cell, pos):
            if m.group(1):
                stack.append(key or "")
                key = None
            elif key is not None:
                return None  # a key without its value
            else:
                key = m.group(2)
            pos = m.end()
        rest = cell[pos:]
        value = rest.rstrip("}")
        closes = len(rest) - len(value)
        if key is None or not stack or not _SCALAR.fullmatch(value) or closes > len(stack):
            return None
        cells.append(_Cell(cell[:pos], closes, (*stack[1:], key)))
        del stack[len(stack) - closes :]
    paths = {c.path for c in cells}
    needed = {_FROM_NDJSON[name] for name in _REQUIRED}
    if stack or len(paths) != len(cells) or not needed <= paths:
        return None
    return tuple(cells)


def _cell_exprs(
    layout: _Layout, cells: list[int], last: int
) -> tuple[list[pl.Expr], list[pl.Expr]]:
    """The checks and the field values of the ``cells`` of ``layout`` (columns ``c<i>``,
    strings): each cell starts with its key, ends with the objects it closes, and holds
    a value of its field's type."""
    by_path: dict[tuple[str, ...], str] = {path: name for name, path in _FROM_NDJSON.items()}
    checks: list[pl.Expr] = []
    values: list[pl.Expr] = []
    for i in cells:
        cell = layout[i]
        col = pl.col(f"c{i}")
        if i == last:
            col = col.str.strip_suffix("\r")
        tail = "}" * cell.closes
        checks.append(col.str.starts_with(cell.prefix))
        if tail:
            checks.append(col.str.ends_with(tail))
        name = by_path.get(cell.path)
        if name is None:
            continue
        value = col.str.strip_prefix(cell.prefix)
        if tail:
            value = value.str.strip_suffix(tail)
        dtype = _FIELDS[name][1]
        if dtype == pl.String:
            checks.append(value.str.contains(_STRING))
            value = value.str.strip_prefix('"').str.strip_suffix('"')
        else:
            value = value.cast(dtype, strict=False)
            checks.append(value.is_not_null())
        values.append(value.alias(name))
    return checks, values


def _by_layout(members: list[tuple[int, Path, str]], layout: _Layout) -> dict[int, InspectorRead]:
    """Read files of one layout together, cell by cell: polars' CSV reader splits each
    line at its commas and every cell is checked against the layout (its key, the
    objects it closes, its value's type).  A line that does not match (cut, spliced,
    a comma inside a string, another writer) is read again from the file's text with
    the per-field regexes, so its reason is counted and no good record is lost.

    The cells outside the record's own object (``header``, ``metadata``: the same for
    every record of a process between two dumps) are read as categoricals and parsed
    once per run of equal cells, not once per record."""
    paths = [str(path) for _f, path, _d in members]
    ids = {path: fid for path, (fid, _p, _d) in zip(paths, members, strict=True)}
    n = len(layout)
    own = layout[[c.path for c in layout].index(_FROM_NDJSON["sn"])].path[:-1]
    per_row = [i for i, c in enumerate(layout) if c.path[:-1] == own or i == n - 1]
    # The other cells, but those of fields not read (``git_rev``...): the cells around
    # them would show a comma too many or too few.
    wanted = set(_FROM_NDJSON.values())
    per_run = [i for i in range(n) if i not in per_row and layout[i].path in wanted]
    row_checks, row_values = _cell_exprs(layout, per_row, n - 1)
    run_checks, run_values = _cell_exprs(layout, per_run, n - 1)
    try:
        parsed = (
            pl.scan_csv(
                paths,
                has_header=False,
                separator=",",
                quote_char=None,
                schema={f"c{i}": pl.Categorical if i in per_run else pl.String for i in range(n)},
                truncate_ragged_lines=True,
                encoding="utf8-lossy",
                include_file_paths="_src",
                row_index_name="_row",
            )
            .select(
                "_row",
                "_src",
                pl.all_horizontal(row_checks).fill_null(False).alias("_ok"),
                *(pl.col(f"c{i}") for i in sorted({0, *per_run})),
                *row_values,
            )
            # The streaming engine keeps the lines' order and costs ~15% less CPU here.
            .collect(engine="streaming")
        )
        if not parsed["_row"].is_sorted():
            parsed = parsed.sort("_row")  # the line and file numbers below need the order
        parsed = _heads(parsed, per_run, run_checks, run_values)
    except (OSError, pl.exceptions.PolarsError):
        return {}
    # The file and line of each row: a file's rows are one run of ``_src``, in order
    # (eager: an expression over all rows, ``over``, costs more than the read).
    src = parsed["_src"].rle()
    lens = src.struct.field("len")
    fids = pl.Series([ids[v] for v in src.struct.field("value").to_list()], dtype=pl.UInt32)
    run = parsed["_src"].rle_id()
    line_no = pl.int_range(parsed.height, eager=True) - (lens.cum_sum() - lens).gather(run) + 1
    parsed = parsed.with_columns(
        fids.gather(run).alias("fid"), line_no.cast(pl.UInt32).alias("line_no")
    )
    missing = [pl.lit(None, t).alias(k) for k, (_r, t, _q) in _FIELDS.items() if k not in parsed]
    parsed = parsed.with_columns(*missing).with_columns(pl.col("_ok") & _valid().fill_null(False))
    rows = _rows(parsed.filter(pl.col("_ok")), pl.col("fid"), hashed=True)
    # A file's rows are contiguous: zero-copy slices, not a partition (a copy).
    spans = rows["file_id"].rle()
    sizes = spans.struct.field("len")
    by_file = {
        fid: rows.slice(end - n, n)
        for fid, end, n in zip(
            spans.struct.field("value").to_list(),
            sizes.cum_sum().to_list(),
            sizes.to_list(),
            strict=True,
        )
    }
    versions = {
        fid: sorted(vs)
        for fid, vs in rows.group_by("file_id")
        .agg(pl.col("format_version").drop_nulls().unique())
        .iter_rows()
    }
    # Lines that do not match, blank ones among them (the CSV reader gives a blank line
    # and a line of commas alike): the file's text says which is which.
    redo = parsed.filter(~pl.col("_ok")).select("fid", "line_no")
    again = redo.partition_by("fid", as_dict=True)
    total = dict(parsed.group_by("fid").len().iter_rows())
    out = {}
    for fid, path, display in members:
        n_rows = total.get(fid, 0)
        read = InspectorRead(display, lines=n_rows, rows=by_file.get(fid, rows.clear()))
        read.versions = versions.get(fid, [])
        if (fid,) in again:
            redone = _again(path, display, again[(fid,)]["line_no"], n_rows)
            if redone is None:
                continue  # the file read as text does not line up: read on its own
            read.lines = redone.lines
            read.skipped = redone.skipped
            read.rows = pl.concat([read.rows, redone.rows.with_columns(
                pl.lit(fid, pl.UInt32).alias("file_id"))]).sort("line_no")  # fmt: skip
            read.versions = sorted({*read.versions, *redone.versions})
        out[fid] = read
    return out


def _heads(
    parsed: pl.DataFrame, per_run: list[int], checks: list[pl.Expr], values: list[pl.Expr]
) -> pl.DataFrame:
    """``parsed`` with the fields of its ``per_run`` cells (categoricals): each run of
    lines whose cells are all equal is parsed once, from its first line, and the
    values are spread over the run (``_ok`` and-ed with the run's checks)."""
    if not per_run:
        return parsed
    run = parsed.select(pl.struct(pl.col(f"c{i}").to_physical() for i in per_run).rle_id())
    at = run.to_series()
    heads = (
        parsed.filter(at.diff().fill_null(1) != 0)
        .select(pl.col(f"c{i}").cast(pl.String) for i in per_run)
        .select(pl.all_horizontal(checks).fill_null(False).alias("_run_ok"), *values)
    )
    if "comm_hash" in heads:
        heads = heads.with_columns(normalise_hash(pl.col("comm_hash")))
    return parsed.with_columns(heads[c].gather(at) for c in heads.columns).with_columns(
        pl.col("_ok") & pl.col("_run_ok")
    )


def _text_lines(path: Path) -> pl.DataFrame:
    """The file's lines (``line_no``, ``line``), invalid UTF-8 replaced.  Split in Python,
    not by a CSV reader: any separator byte a reader is given can be in a damaged line,
    and would cut it there."""
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return pl.DataFrame({"line": lines}, schema={"line": pl.String}).with_row_index(
        "line_no", offset=1
    )


def _again(path: Path, display: str, line_nos: pl.Series, rows: int) -> InspectorRead | None:
    """The lines ``line_nos`` of ``path`` read with the per-field regexes (``lines``: the
    file's lines but blank ones); None where the file's lines as text are not the ones
    the CSV reader saw (then it is read whole)."""
    try:
        raw = _text_lines(path)
    except OSError:
        return None
    if raw.height != rows:
        return None
    blank = pl.col("line").is_null() | (pl.col("line").str.strip_chars() == "")
    picked = raw.filter(pl.col("line_no").is_in(line_nos.implode()) & ~blank)
    read = _read(picked, display)
    read.lines = rows - raw.filter(blank).height
    return read


def read_inspector_text(text: str, display: str) -> InspectorRead:
    """Read Inspector records from ``text`` (one JSON object a line), line by line."""
    raw = pl.DataFrame({"line": text.split("\n")}).with_row_index("line_no", offset=1)
    raw = raw.filter(pl.col("line").is_not_null() & (pl.col("line").str.strip_chars() != ""))
    return _read(raw, display)


def _read(raw: pl.DataFrame, display: str) -> InspectorRead:
    parsed = raw.with_columns(
        pl.col("line").str.extract(rx, 1).cast(dtype, strict=False).alias(name)
        for name, (rx, dtype, _req) in _FIELDS.items()
    )
    return _finish(InspectorRead(display, lines=raw.height), parsed)


#: Bounds past which a record's number is damage, not data: no collective moves more
#: than 1 TiB a rank in one call, no job has 4M ranks (and the whole buffer, size times
#: ranks, must stay within int64).
MAX_MSG_BYTES = 1 << 40
MAX_RANKS = 1 << 22
#: A kernel time past 1e13 us (116 days) is damage too ("1e400" reads as infinity).
MAX_EXEC_US = 1e13


def _valid() -> pl.Expr:
    ok = pl.all_horizontal(pl.col(c).is_not_null() for c in _REQUIRED) & pl.col("op").is_in(
        list(OPS)
    )
    nranks = pl.col("nranks")
    return (
        ok
        & (pl.col("sn") >= 0)
        & pl.col("msg_size_bytes").is_between(0, MAX_MSG_BYTES)
        & pl.col("exec_us").is_between(0, MAX_EXEC_US)  # NaN and infinity are not
        & (nranks.is_null() | nranks.is_between(1, MAX_RANKS))
    )


def _finish(out: InspectorRead, parsed: pl.DataFrame) -> InspectorRead:
    """Keep the records with every required field valid; count the others by reason."""
    good = parsed.filter(_valid())
    for bad in parsed.filter(~_valid())["line"].to_list():
        out.skipped[_why(bad)] += 1
    out.versions = sorted(v for v in good["format_version"].drop_nulls().unique())
    out.rows = _rows(good, pl.lit(0, pl.UInt32))
    return out


def _rows(good: pl.DataFrame, file_id: pl.Expr, *, hashed: bool = False) -> pl.DataFrame:
    """The valid records as INSPECTOR_SCHEMA rows (``hashed``: ``comm_hash`` is
    normalised already)."""
    comm_hash = pl.col("comm_hash")
    rows = good.select(
        file_id.cast(pl.UInt32).alias("file_id"),
        pl.col("line_no").cast(pl.UInt32),
        "host",
        "pid",
        (comm_hash if hashed else normalise_hash(comm_hash)).alias("comm_hash"),
        pl.when(pl.col("comm_name") != "unknown").then(pl.col("comm_name")).alias("comm_name"),
        "comm_rank",
        "nranks",
        "nnodes",
        "op",
        "sn",
        "msg_size_bytes",
        (pl.col("exec_us") / 1e6).alias("exec_time_s"),
        "timing_source",
        *(
            # an optional number that is not a bandwidth (NaN, infinite, below 0) is unknown
            pl.when(pl.col(c).is_finite() & (pl.col(c) >= 0)).then(pl.col(c) * 1e9).alias(name)
            for c, name in (("algo_gbs", "algo_bw_bytes_per_s"), ("bus_gbs", "bus_bw_bytes_per_s"))
        ),
        pl.from_epoch(pl.col("dump_us"), time_unit="us")
        .dt.replace_time_zone("UTC")
        .alias("dump_ts"),
        "format_version",
    )
    return validate(rows, INSPECTOR_SCHEMA, "inspector")


def _why(line: str) -> str:
    """Why a line is not a record: the reason counted for it."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." junk
        return "not JSON (cut or damaged line)"
    if not isinstance(obj, dict):
        return "not a JSON object"
    perf = obj.get("coll_perf")
    header = obj.get("header")
    if not isinstance(header, dict) or not isinstance(perf, dict):
        return "no header or coll_perf object"
    if perf.get("coll") not in OPS:
        return f"unknown collective {str(perf.get('coll'))[:40]!r}"
    for key in ("coll_sn", "coll_msg_size_bytes", "coll_exec_time_us"):
        value = perf.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            return f"coll_perf.{key} missing or not a number >= 0"
    if not perf["coll_exec_time_us"] <= MAX_EXEC_US:  # NaN too
        return "coll_perf.coll_exec_time_us not finite or past 1e13 us (a damaged number)"
    if perf["coll_msg_size_bytes"] > MAX_MSG_BYTES:
        return "coll_perf.coll_msg_size_bytes past 1 TiB (a damaged number)"
    n_ranks = header.get("n_ranks")
    if isinstance(n_ranks, int) and not 1 <= n_ranks <= MAX_RANKS:
        return "header.n_ranks not between 1 and 4M (a damaged number)"
    if not isinstance(header.get("id"), str) or not isinstance(header.get("rank"), int):
        return "header.id or header.rank missing"
    return "a field is not of its type"
