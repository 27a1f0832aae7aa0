"""Vectorised first pass: input files into two compact Parquet stores.

Why this shape: a 1,024-rank job with COLL logging writes tens of GB, ~95% of it COLL
lines.  Those are parsed here by polars' native CSV reader in its streaming engine
(no Python per line) and sunk to Parquet, so memory stays flat whatever the input
size.  Every other line keeps its text and goes through the pure Python parser
later: they are few (init, connections, warnings) and need the full grammar.

Two readers go over each file:

* **the field reader** splits lines on single spaces (polars' CSV reader, the fastest
  tokenizer available: several times a regex with captures).  A COLL line has the same
  24 tokens from its header to its end in every NCCL version (2.4-2.30)::

      [default3]:[2025-03-14 09:00:09.387136] node-6:5381:5381 [3] NCCL INFO AllGather:
      opCount 1a sendbuff 0x7f.. recvbuff 0x7f.. count 4096 datatype 9 op 0 root 0
      comm 0x55.. [nranks=16] stream 0x55..

  so once the number of prefix tokens before the header (the *offset*, 2 above) is
  known, every field sits at a fixed column.  The offsets a file uses are sniffed
  from samples of it; one query runs per offset.  Header, op and nranks are kept as
  printed and decoded once per distinct token later.
* **the line reader** keeps every line that does not contain ``opCount`` with its
  text, and the line number of each one that does.

Every line with ``opCount`` that no field query took (another offset, ANSI colours, a
``\\r`` progress bar, a damaged field) is found by comparing line numbers and re-read
for the reference parser, so no COLL line is lost to the fast path's assumptions.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ncclscope.parsers.common import local_to_utc
from ncclscope.parsers.nccl.patterns import BINARY_CHARS
from ncclscope.parsers.nccl.procs import bad_tokens
from ncclscope.schema import COLL_STORE_SCHEMA, LINE_KIND, TEXT_STORE_SCHEMA, TS

__all__ = ["MAX_TEXT_CHARS", "Scan", "ScanTarget", "scan_inputs", "sniff_offsets"]

#: Text kept per non-COLL line; longer lines are not NCCL lines (NCCL truncates at 1 KiB
#: up to 2.28) and are counted as ``too_long`` when nothing parses.
MAX_TEXT_CHARS = 4096
#: Tokens from a COLL line's header to its end (``... [nranks=16] stream 0x55..``).
_COLL_TOKENS = 24
#: Columns the field reader needs after the offset (up to ``[nranks=N]``).
_FIELD_COLUMNS = 22
#: Offsets (prefix tokens) the field reader handles; more is someone's custom logger.
_MAX_OFFSET = 12
_SAMPLES = 8
_SAMPLE_BYTES = 64 << 10
#: COLL lines enough to know a window's offsets.
_SAMPLE_LINES = 64
#: An offset seen on fewer sampled COLL lines than this share gets no query of its own.
_MIN_SHARE = 0.02
#: COLL lines left to the Python parser beyond which the offsets are learned again.
_REPLAN_LINES = 20_000
#: Bytes per chunk of polars' CSV reader.  Its default let the two readers of
#: ``_query`` hold ~940 MB on a 1 GB log; 8 MB chunks hold ~530 MB at the same speed
#: (4 MB: 440 MB, a little slower).  Set only while scanning, and only if the user has
#: not set it.
_CSV_CHUNK_BYTES = 8_000_000


@dataclass(frozen=True)
class ScanTarget:
    """A plain-text file, its index among the run's inputs, and its COLL offsets."""

    file_id: int
    path: Path
    offsets: tuple[int, ...] = ()
    #: the file is a copy with one empty line in front (``Input.shifted``)
    shifted: bool = False


@dataclass
class _Batch:
    """Files read by one list scan.  polars numbers rows across the whole list (``g``);
    ``starts`` (the first ``g`` of each file) maps a row back to its file and its line
    number there.  One list scan of 1,024 small files is several times faster than
    1,024 scans."""

    targets: list[ScanTarget]
    ids: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)

    @property
    def multi(self) -> bool:
        return len(self.targets) > 1

    def read(self, *, numbered: bool, **options: Any) -> pl.LazyFrame:
        """All lines of the batch's files, in order; numbered ``g`` from 1 across the
        list and with the file's path (several files) when ``numbered``.  A shifted
        file's extra first line is numbered 0."""
        shifted = self.targets[0].shifted  # a shifted file is always alone in its batch
        return pl.scan_csv(
            [str(t.path) for t in self.targets],
            has_header=False,
            quote_char=None,  # a log line is never quoted
            truncate_ragged_lines=True,
            encoding="utf8-lossy",  # crashed jobs leave invalid UTF-8: keep the line
            row_index_name="g" if numbered else None,
            row_index_offset=0 if shifted else 1,
            include_file_paths="path" if numbered and self.multi else None,
            **options,
        )

    def file_ids(self, lf: pl.LazyFrame) -> pl.LazyFrame:
        """Add ``file_id`` to numbered rows (from the path when there are several files)."""
        if not self.multi:
            return lf.with_columns(
                pl.lit(self.targets[0].file_id, dtype=pl.UInt32).alias("file_id")
            )
        table = pl.LazyFrame(
            {
                "path": [str(t.path) for t in self.targets],
                "file_id": [t.file_id for t in self.targets],
            },
            schema={"path": pl.String, "file_id": pl.UInt32},
        )
        # A join: far cheaper per row than replacing strings.  It may reorder rows, which
        # is why it runs after the readers' rows are put side by side.
        return lf.join(table, on="path", how="left").drop("path")

    def _first_g(self) -> pl.Expr:
        """The first ``g`` of each row's file.  A gather from a table indexed by
        ``file_id`` (a few thousand entries): several times cheaper per row than
        ``replace_strict``."""
        first = [0] * (max(self.ids, default=0) + 1)
        for file_id, start in zip(self.ids, self.starts, strict=True):
            first[file_id] = start
        return pl.lit(pl.Series(first, dtype=pl.UInt32)).gather(pl.col("file_id"))

    def line_no(self) -> pl.Expr:
        """The line number ``i`` in its own file of a row with ``file_id`` and ``g``."""
        if not self.multi:
            return pl.col("g").cast(pl.UInt32).alias("i")
        return (pl.col("g") - self._first_g() + 1).cast(pl.UInt32).alias("i")


def _batches(targets: Sequence[ScanTarget]) -> list[_Batch]:
    plain = [t for t in targets if not t.shifted]
    return ([_Batch(plain)] if plain else []) + [_Batch([t]) for t in targets if t.shifted]


def sniff_offsets(path: Path, size: int) -> tuple[int, ...]:
    """The prefix-token offsets of COLL lines in samples spread over the file.

    ``[default3]:[2025-03-14 09:00:09.387136] node-6:5381:5381 [3] NCCL INFO AllGather:``
    has offset 2 (two space-separated tokens before the header).  A wrong guess costs
    only time: lines no query takes go to the reference parser, and many such lines
    make ``scan_inputs`` learn their offsets.
    """
    counts: Counter[int] = Counter()
    windows = min(_SAMPLES, 1 + size // (8 << 20))
    with path.open("rb") as fh:
        for k in range(windows):
            start = max(0, min(size * (2 * k + 1) // (2 * windows), size - _SAMPLE_BYTES))
            fh.seek(start)
            chunk = fh.read(_SAMPLE_BYTES).decode("utf-8", "replace").split("\n")
            found = 0
            for line in chunk[1:-1] if start else chunk[:-1]:
                offset = _coll_offset(line)
                if offset is not None:
                    counts[offset] += 1
                    found += 1
                    if found >= _SAMPLE_LINES:
                        break
    total = sum(counts.values())
    return tuple(sorted(h for h, n in counts.items() if n >= _MIN_SHARE * total))


def _coll_offset(line: str) -> int | None:
    """Prefix tokens before the header of a COLL-shaped line, else None (cheap check)."""
    at = line.find(" NCCL INFO ")
    if at < 0 or " opCount " not in line:
        return None
    offset = line.count(" ", 0, at) - 1
    if 0 <= offset <= _MAX_OFFSET and line.count(" ") == offset + _COLL_TOKENS - 1:
        return offset
    return None


#: The time token of NCCL's default timestamp, ``09:00:09.387136]`` (``%Nf``: 0 to 9
#: fraction digits).
_CLOCK_TOKEN = r"^[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?\]$"


def _default_ts(date_token: pl.Expr, time_token: pl.Expr) -> pl.Expr:
    """NCCL's default timestamp ``[%F %T.%Nf] `` from its two tokens, as UTC (read in
    ``LOG_ZONE``: NCCL prints local time).

    ``[2025-03-14`` + ``09:00:09.387136]``: the date repeats on every line (parsed once
    per distinct value), the time is cut into fields where it stands; cheaper than
    strptime, or than stripping and padding a copy of the token, on millions of lines.
    """
    day = date_token.str.slice(-10).str.to_date("%Y-%m-%d", strict=False, cache=True)
    clock = time_token

    def part(start: int, length: int = 2) -> pl.Expr:
        return clock.str.slice(start, length).cast(pl.Int64, strict=False)

    seconds = part(0) * 3600 + part(3) * 60 + part(6)
    # The usual 6 fraction digits are read as they stand; other precisions (``%3f``,
    # ``%9f``, none) are scaled to microseconds by their digit count.
    digits = (clock.str.len_bytes().cast(pl.Int64) - 10).clip(0, 6)
    fraction = clock.str.slice(9, 6).str.strip_suffix("]").cast(pl.Int64, strict=False).fill_null(0)
    micros = fraction * pl.lit(10, dtype=pl.Int64).pow(6 - digits)
    total = day.cast(pl.Int64) * 86_400_000_000 + seconds * 1_000_000 + micros
    return local_to_utc(pl.when(clock.str.contains(_CLOCK_TOKEN)).then(total), nccl=True)


#: The largest ``[nranks=N]`` token an Int32 column holds.
_NRANKS_MAX = f"[nranks={2**31 - 1}]"

#: The COLL store's columns after ``file_id`` and ``i``: what the field reader writes.
_FIELD_NAMES = tuple(list(COLL_STORE_SCHEMA)[2:])


#: Numeric fields by their column after the offset (``count``, ``datatype``, ``op``,
#: ``root``): the CSV reader parses these itself, which saves a string column and a
#: cast per field on millions of lines; a token that is no number reads as null.
_NUMERIC_FIELDS: dict[int, pl.DataType] = {
    12: pl.Int64(),
    14: pl.Int16(),
    16: pl.Int16(),
    18: pl.Int32(),
}


def _field_schema(offsets: Sequence[int]) -> dict[str, pl.DataType]:
    """The field reader's columns: strings, except a numeric field's column where every
    offset that reads that column reads it as the same number (one offset: always)."""
    width = max(offsets) + _FIELD_COLUMNS
    roles: dict[int, set[pl.DataType]] = {k: set() for k in range(width)}
    for h in offsets:
        for k in range(width):
            roles[k].add(_NUMERIC_FIELDS.get(k - h, pl.String()))
    return {
        f"c{k}": next(iter(kinds)) if len(kinds) == 1 else pl.String() for k, kinds in roles.items()
    }


def _fields(batch: _Batch, offsets: Sequence[int]) -> pl.LazyFrame:
    """The field reader: one row per line, in file order, unnumbered.

    ``taken`` is true where the line, with one of ``offsets`` prefix tokens, is a
    well-formed COLL line; its fields are then filled, else null.
    """
    schema = _field_schema(offsets)

    def c(k: int) -> pl.Expr:
        return pl.col(f"c{k}")

    oks: list[pl.Expr] = []
    values: dict[str, list[pl.Expr]] = {name: [] for name in _FIELD_NAMES}
    for h in offsets:

        def f(k: int, h: int = h) -> pl.Expr:
            return c(h + k)

        valid = (
            (f(2) == "NCCL")
            & (f(3) == "INFO")
            & (f(5) == "opCount")
            & (f(7) == "sendbuff")
            & (f(19) == "comm")
        )
        for k in range(h):
            # a second header in the prefix: two processes' writes spliced
            valid = valid & (c(k).fill_null("") != "NCCL")
        opcount = f(6).str.to_integer(base=16, strict=False)
        count = f(12).cast(pl.Int64, strict=False)
        dtype = f(14).cast(pl.Int16, strict=False)
        redop = f(16).cast(pl.Int16, strict=False)
        root = f(18).cast(pl.Int32, strict=False)
        # A damaged field (one too large for its column, or with a sign the format
        # never prints: ``%lx``, ``%zi`` of a size, ``%d`` of an enum): the line goes to
        # the reference parser instead, which counts it as malformed.  ``[nranks=N]`` is
        # kept as printed: compared as text, with N of 10 digits at most, it is at most
        # ``_NRANKS_MAX`` exactly when N fits its Int32 column (no cast per line).
        nranks = f(21)
        ok = (
            valid.fill_null(value=False)
            & f(0).is_not_null()  # a line that starts with a space has no header token
            & opcount.is_not_null()
            & count.is_not_null()
            & dtype.is_not_null()
            & redop.is_not_null()
            & root.is_not_null()
            & (opcount >= 0)
            & (count >= 0)
            & (dtype >= 0)
            & (redop >= 0)
            & (
                (nranks.str.len_bytes() < len(_NRANKS_MAX))
                | ((nranks.str.len_bytes() == len(_NRANKS_MAX)) & (nranks <= _NRANKS_MAX))
            ).fill_null(value=False)
        )
        ts = _default_ts(c(h - 2), c(h - 1)) if h >= 2 else pl.lit(None, dtype=TS)
        fields = {
            # Tokens kept as printed: a job has few distinct values, decoded once later.
            "proc": f(0),
            "op_tok": f(4),
            "opcount": opcount,
            "count": count,
            "dtype": dtype,
            "redop": redop,
            "root": root,
            "comm": f(20),  # %p prints lowercase hex
            "nranks_tok": f(21),
            "ts": ts,
        }
        for name, expr in fields.items():
            # One offset: a row's fields are read only where ``taken``, so they need no
            # masking (``when`` copies every string: +0.1 s on a 1 GiB log).  Several
            # offsets: the null of a row that offset did not take lets ``coalesce``
            # pick the right one.
            values[name].append(expr if len(offsets) == 1 else pl.when(ok).then(expr))
        oks.append(ok)
    return batch.read(
        numbered=False,
        separator=" ",
        schema=schema,
        missing_columns="insert",
        extra_columns="ignore",
        ignore_errors=True,  # a numeric column's token that is no number: null
    ).select(
        pl.any_horizontal(oks).alias("taken"),
        *(
            (pl.coalesce(v) if len(v) > 1 else v[0]).cast(COLL_STORE_SCHEMA[name]).alias(name)
            for name, v in values.items()
        ),
    )


def _kind(line: pl.Expr) -> pl.Expr:
    blank = line.is_null() | (line.str.strip_chars() == "")
    marker = line.str.contains(r"NCCL (?:INFO|WARN|TRACE|CALL)|NCCL version [0-9.]+[^ ]*\+cuda")
    binary = line.str.contains(BINARY_CHARS)
    return (
        pl.when(blank)
        .then(pl.lit(LINE_KIND["blank"]))
        .when(marker)
        .then(pl.lit(LINE_KIND["nccl"]))
        .when(binary)
        .then(pl.lit(LINE_KIND["binary"]))
        .otherwise(pl.lit(LINE_KIND["other"]))
        .cast(pl.UInt8)
    )


def _text_columns(line: pl.Expr, keep: pl.Expr) -> list[pl.Expr]:
    """``text`` (cut at MAX_TEXT_CHARS; empty where ``keep`` is false) and ``n_bytes`` of a
    line.

    The text is emptied by a zero-length slice, not nulled by ``when``: over millions of
    lines that rewrites only the string views, where ``when`` copied the strings (+0.3 s
    on a 1 GiB log).  ``kind`` is added when the text store is written, on its few
    rows: string kernels run over every row of a column, emptied or not.
    """
    return [
        line.str.slice(0, pl.when(keep).then(MAX_TEXT_CHARS).otherwise(0)).alias("text"),
        line.str.len_bytes().cast(pl.Int32).alias("n_bytes"),
    ]


#: The line reader: one column, the whole line.  A line holding the separator byte (binary
#: junk) has more: the rest is cut off, never an error (on the first line polars raises
#: unless told to ignore them, and the whole file would be lost).
_LINE_READER: dict[str, Any] = {
    "separator": "\x1f",
    "schema": {"line": pl.String},
    "extra_columns": "ignore",
}


def _query(batch: _Batch, offsets: Sequence[int]) -> pl.LazyFrame:
    """Both readers side by side, one row per line: the line reader numbers the lines
    and keeps the text of every line the field reader did not take.

    Why side by side: numbering rows across many files makes polars count each file's
    lines before reading on (a third more time on 1,024 files); reading both ways in
    one query pays that once.  Rows pair up by position, which polars keeps for a
    horizontal concat of two scans of the same files; ``scan_inputs`` checks it.
    """
    line = pl.col("line")
    lines = batch.read(numbered=True, **_LINE_READER).with_columns(
        line.str.contains("opCount", literal=True).fill_null(value=False).alias("has_op")
    )
    if offsets:
        both = pl.concat([lines, _fields(batch, offsets)], how="horizontal")
    else:
        both = lines.with_columns(
            pl.lit(value=False).alias("taken"),
            *(pl.lit(None, dtype=COLL_STORE_SCHEMA[n]).alias(n) for n in _FIELD_NAMES),
        )
    if batch.targets[0].shifted:
        both = both.filter(pl.col("g") >= 1)
    return batch.file_ids(
        both.select(
            *(["path"] if batch.multi else []),
            "g",
            "has_op",
            "taken",
            *_text_columns(line, ~pl.col("taken")),
            *_FIELD_NAMES,
        )
    )


def _reread(batch: _Batch, rows: list[int]) -> pl.DataFrame:
    """Text-store rows for the lines ``rows`` (their ``g``), read again from the files."""
    return (
        batch.file_ids(
            batch.read(numbered=True, **_LINE_READER).filter(
                pl.col("g").is_in(pl.Series(rows, dtype=pl.UInt32).implode())
            )
        )
        .select("file_id", batch.line_no(), *_text_columns(pl.col("line"), pl.lit(value=True)))
        .collect(engine="streaming")
    )


def _offsets_of(texts: list[str | None]) -> Counter[int]:
    offsets = (_coll_offset(text) for text in texts if text)
    return Counter(h for h in offsets if h is not None)


@dataclass(frozen=True)
class Scan:
    """What ``scan_inputs`` read."""

    #: Every COLL line the field reader took (``COLL_STORE_SCHEMA``), lazily.
    coll: pl.LazyFrame
    #: Every other line (``TEXT_STORE_SCHEMA``), sorted by file and line.
    text_store: Path
    #: Lines per file_id.
    n_lines: dict[int, int]
    #: Header tokens with junk glued to the host: their lines are in the text store.
    bad: list[str]
    #: Every other header token of ``coll`` (``host:pid:tid`` as printed).
    tokens: list[str]
    #: Rows of ``coll`` per file_id.
    coll_lines: dict[int, int]


@contextmanager
def _csv_chunks() -> Iterator[None]:
    name = "POLARS_CSV_CHUNK_SIZE"
    if name in os.environ:
        yield
        return
    os.environ[name] = str(_CSV_CHUNK_BYTES)
    try:
        yield
    finally:
        os.environ.pop(name, None)


def scan_inputs(targets: Sequence[ScanTarget], store: Path) -> Scan:
    """Scan ``targets`` into Parquet under ``store``.

    Raises:
        polars.exceptions.PolarsError: a file could not be read; the caller retries
            file by file to name it.
    """
    with _csv_chunks():
        return _scan_inputs(targets, store)


def _scan_inputs(targets: Sequence[ScanTarget], store: Path) -> Scan:
    store.mkdir(parents=True, exist_ok=True)
    batches = _batches(targets)
    offsets = [sorted({h for t in b.targets for h in t.offsets}) for b in batches]
    parts = [store / f"scan-{b}.parquet" for b in range(len(batches))]
    todo = list(range(len(batches)))
    n_lines: dict[int, int] = {}
    taken: Counter[int] = Counter()
    for _round in range(3):
        for b in todo:
            # No column statistics: every row of this store is read back, none skipped
            # by them, and writing them costs ~0.1 s on a 1 GiB log.
            _query(batches[b], offsets[b]).sink_parquet(
                parts[b], compression="lz4", statistics=False, engine="streaming"
            )
            per_file = (
                pl.scan_parquet(parts[b])
                .group_by("file_id")
                .agg(
                    pl.col("g").min().alias("first"),
                    pl.len(),
                    pl.col("taken").sum(),
                    (pl.col("has_op") & ~pl.col("taken")).sum().alias("left"),
                    (pl.col("taken") & ~pl.col("has_op")).sum().alias("stray"),
                )
                .sort("first")
                .collect(engine="streaming")
            )
            if per_file["stray"].sum():
                # Cannot happen while polars pairs rows by position; fail loudly if not.
                msg = "internal error: the two line readers disagree on line order"
                raise RuntimeError(msg)
            batches[b].ids = per_file["file_id"].to_list()
            batches[b].starts = per_file["first"].to_list()
            n_lines.update(zip(batches[b].ids, per_file["len"].to_list(), strict=True))
            taken.update(dict(zip(batches[b].ids, per_file["taken"].to_list(), strict=True)))
        left = pl.scan_parquet(parts).filter(pl.col("has_op") & ~pl.col("taken"))
        if left.select(pl.len()).collect().item() < _REPLAN_LINES:
            break
        # Many COLL lines left: the samples missed an offset.  Learn it from them.
        todo = []
        for b, part in enumerate(parts):
            texts = (
                pl.scan_parquet(part)
                .filter(pl.col("has_op") & ~pl.col("taken"))
                .group_by("file_id")
                .head(50)
                .head(5_000)
                .collect()["text"]
                .to_list()
            )
            found = _offsets_of(texts)
            total = sum(found.values())
            new = {h for h, n in found.items() if n >= _MIN_SHARE * total} - set(offsets[b])
            if new:
                offsets[b] = sorted(set(offsets[b]) | new)
                todo.append(b)
        if not todo:
            break

    # Junk glued to a host (colour codes, NUL padding, a \r bar): those lines go to
    # the reference parser, which finds where the host starts.
    tokens = pl.scan_parquet(parts).filter("taken").select(pl.col("proc").unique())
    seen = tokens.collect(engine="streaming")["proc"].to_list()
    bad = bad_tokens(seen)
    colls, texts = [], []
    for batch, part in zip(batches, parts, strict=True):
        scan = pl.scan_parquet(part)
        colls.append(
            scan.filter(pl.col("taken") & ~pl.col("proc").is_in(bad)).select(
                "file_id", batch.line_no(), *_FIELD_NAMES
            )
        )
        texts.append(
            scan.filter(~pl.col("taken")).select("file_id", batch.line_no(), "text", "n_bytes")
        )
        if bad:
            rows = scan.filter(pl.col("taken") & pl.col("proc").is_in(bad)).select("g")
            rows_g = rows.collect()["g"].to_list()
            if rows_g:
                again = _reread(batch, rows_g)
                taken.subtract(Counter(again["file_id"].to_list()))
                texts.append(again.lazy())
    text_store = store / "text.parquet"
    text = pl.concat(texts).with_columns(_kind(pl.col("text")).alias("kind"))
    text.select(list(TEXT_STORE_SCHEMA)).sort("file_id", "i").sink_parquet(
        text_store, compression="lz4", engine="streaming"
    )
    coll = pl.concat(colls) if colls else pl.LazyFrame(schema=COLL_STORE_SCHEMA)
    good = sorted(set(seen) - set(bad))
    return Scan(coll.cast(COLL_STORE_SCHEMA), text_store, n_lines, bad, good, dict(taken))
