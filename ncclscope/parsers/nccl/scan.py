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

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ncclscope.parsers.nccl.collectives import bad_tokens
from ncclscope.parsers.nccl.patterns import BINARY_CHARS
from ncclscope.schema import COLL_STORE_SCHEMA, LINE_KIND, TEXT_STORE_SCHEMA

__all__ = ["MAX_TEXT_CHARS", "ScanTarget", "scan_inputs", "sniff_offsets"]

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
    ``starts`` (the first ``g`` of each file, learned from the line reader) maps a row
    back to its file and its line number there.  One list scan of 1,024 small files is
    several times faster than 1,024 scans."""

    targets: list[ScanTarget]
    starts: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    def read(self, **options: Any) -> pl.LazyFrame:
        """All lines of the batch's files, numbered ``g`` from 1 across the list; with
        the file's path when the batch holds several files."""
        shifted = self.targets[0].shifted  # a shifted file is always alone in its batch
        lf = pl.scan_csv(
            [str(t.path) for t in self.targets],
            has_header=False,
            quote_char=None,  # a log line is never quoted
            truncate_ragged_lines=True,
            encoding="utf8-lossy",  # crashed jobs leave invalid UTF-8: keep the line
            row_index_name="g",
            row_index_offset=0 if shifted else 1,
            include_file_paths="path" if len(self.targets) > 1 else None,
            **options,
        )
        return lf.filter(pl.col("g") >= 1) if shifted else lf

    def locate(self, lf: pl.LazyFrame) -> pl.LazyFrame:
        """Add ``file_id`` and ``i`` (the line number in its own file) to rows of ``read``."""
        if len(self.targets) == 1:
            return lf.with_columns(
                pl.lit(self.targets[0].file_id, dtype=pl.UInt32).alias("file_id"),
                pl.col("g").cast(pl.UInt32).alias("i"),
            )
        # A join on the path: cheaper per row than a per-row search over the starts.
        table = pl.LazyFrame(
            {"path": self.paths, "file_id": self.ids, "first_g": self.starts},
            schema={"path": pl.String, "file_id": pl.UInt32, "first_g": pl.UInt32},
        )
        return lf.join(table, on="path", how="left").with_columns(
            (pl.col("g") - pl.col("first_g") + 1).cast(pl.UInt32).alias("i")
        )

    def global_row(self) -> pl.Expr:
        """``g`` of a row given its ``file_id`` and ``i`` (the inverse of ``locate``)."""
        first = pl.col("file_id").replace_strict(
            self.ids, self.starts, default=None, return_dtype=pl.UInt32
        )
        return (first + pl.col("i") - 1).alias("g")


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


def _default_ts(date_token: pl.Expr, time_token: pl.Expr) -> pl.Expr:
    """NCCL's default timestamp ``[%F %T.%Nf] `` from its two tokens, as UTC microseconds.

    ``[2025-03-14`` + ``09:00:09.387136]``: the date repeats on every line (parsed once
    per distinct value), the time is cut into fields; cheaper than strptime per line.
    """
    day = date_token.str.slice(-10).str.to_date("%Y-%m-%d", strict=False, cache=True)
    clock = time_token.str.strip_suffix("]")
    well_formed = clock.str.contains(r"^[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?$")

    def part(start: int) -> pl.Expr:
        return clock.str.slice(start, 2).cast(pl.Int64, strict=False)

    seconds = part(0) * 3600 + part(3) * 60 + part(6)
    micros = clock.str.slice(9, 6).str.pad_end(6, "0").cast(pl.Int64, strict=False).fill_null(0)
    total = day.cast(pl.Int64) * 86_400_000_000 + seconds * 1_000_000 + micros
    return pl.when(well_formed).then(total).otherwise(None).cast(pl.Datetime("us", "UTC"))


def _fields(batch: _Batch, h: int) -> pl.LazyFrame:
    """COLL rows of the batch's lines that have ``h`` prefix tokens."""
    schema = {f"c{k}": pl.String for k in range(h + _FIELD_COLUMNS)}

    def c(k: int) -> pl.Expr:
        return pl.col(f"c{k}")

    def f(k: int) -> pl.Expr:
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
    if h >= 2:
        ts = _default_ts(c(h - 2), c(h - 1))
    else:
        ts = pl.lit(None, dtype=pl.Datetime("us", "UTC"))
    rows = batch.read(
        separator=" ", schema=schema, missing_columns="insert", extra_columns="ignore"
    ).filter(valid.fill_null(value=False))
    return (
        batch.locate(rows)
        .select(
            "file_id",
            "i",
            # Tokens kept as printed: a job has few distinct values, decoded once later.
            f(0).alias("proc"),
            f(4).alias("op_tok"),
            f(6).str.to_integer(base=16, strict=False).alias("opcount"),
            f(12).cast(pl.Int64, strict=False).alias("count"),
            f(14).cast(pl.Int16, strict=False).alias("dtype"),
            f(16).cast(pl.Int16, strict=False).alias("redop"),
            f(18).cast(pl.Int32, strict=False).alias("root"),
            f(20).alias("comm"),  # %p prints lowercase hex
            f(21).alias("nranks_tok"),
            ts.alias("ts"),
        )
        # A damaged field: the line goes to the reference parser instead.
        .drop_nulls(["opcount", "count"])
    )


def _lines(batch: _Batch) -> pl.LazyFrame:
    """Every line: its text where it has no ``opCount``, else only its number.

    Keeping a row per line gives the line count per file and, when the field
    reader missed some COLL lines, the numbers to compare against.
    """
    line = pl.col("line")
    has_op = line.str.contains("opCount", literal=True).fill_null(value=False)
    return batch.read(separator="\x1f", schema={"line": pl.String}).select(
        *(["path"] if len(batch.targets) > 1 else []),
        "g",
        has_op.alias("has_op"),
        pl.when(has_op).then(None).otherwise(line).alias("text"),
    )


def _kind() -> pl.Expr:
    line = pl.col("text")
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
        .alias("kind")
    )


def _reread(batches: Sequence[_Batch], wanted: pl.DataFrame) -> pl.DataFrame:
    """Text of the given (file_id, i) lines, for lines the field reader did not take."""
    frames = []
    for batch in batches:
        rows = wanted.filter(pl.col("file_id").is_in(batch.ids))
        if rows.is_empty():
            continue
        lines = rows.select(batch.global_row())["g"]
        read = batch.read(separator="\x1f", schema={"line": pl.String}).filter(
            pl.col("g").is_in(lines.implode())
        )
        frames.append(
            batch.locate(read)
            .select(
                "file_id",
                "i",
                pl.col("line").str.slice(0, MAX_TEXT_CHARS).alias("text"),
                pl.col("line").str.len_chars().cast(pl.Int32).alias("n_chars"),
            )
            .collect(engine="streaming")
        )
    empty = {"file_id": pl.UInt32, "i": pl.UInt32, "text": pl.String, "n_chars": pl.Int32}
    return pl.concat(frames) if frames else pl.DataFrame(schema=empty)


def _offsets_of(lines: pl.DataFrame) -> Counter[int]:
    offsets = (_coll_offset(text) for text in lines["text"].to_list() if text)
    return Counter(h for h in offsets if h is not None)


def scan_inputs(
    targets: Sequence[ScanTarget], store: Path
) -> tuple[list[Path], Path, dict[int, int], list[str]]:
    """Scan ``targets`` into Parquet stores under ``store``.

    Returns:
        The COLL stores (one per batch and offset query, ``COLL_STORE_SCHEMA``), the text
        store (``TEXT_STORE_SCHEMA``: every line without ``opCount``, and every line with
        it that no field query took) and the number of lines per file_id.

    Raises:
        polars.exceptions.PolarsError: a file could not be read; the caller retries
            file by file to name it.
    """
    store.mkdir(parents=True, exist_ok=True)
    batches = _batches(targets)
    n_lines: dict[int, int] = {}
    op_lines: dict[int, int] = {}
    line_stores: list[pl.LazyFrame] = []
    for b, batch in enumerate(batches):
        part = store / f"lines-{b}.parquet"
        _lines(batch).sink_parquet(part, compression="lz4", engine="streaming")
        by_path = {str(t.path): t.file_id for t in batch.targets}
        lines_lf = pl.scan_parquet(part)
        if len(batch.targets) == 1:
            lines_lf = lines_lf.with_columns(pl.lit(str(batch.targets[0].path)).alias("path"))
        per_file = (
            lines_lf.group_by("path")
            .agg(pl.col("g").min().alias("first"), pl.len(), pl.col("has_op").sum())
            .sort("first")
            .collect(engine="streaming")
        )
        batch.paths = per_file["path"].to_list()
        batch.ids = [by_path[path] for path in batch.paths]
        batch.starts = per_file["first"].to_list()
        n_lines.update(zip(batch.ids, per_file["len"].to_list(), strict=True))
        op_lines.update(zip(batch.ids, per_file["has_op"].to_list(), strict=True))
        line_stores.append(
            batch.locate(pl.scan_parquet(part)).select("file_id", "i", "has_op", "text")
        )
    lines_lf = pl.concat(line_stores)

    coll_stores: list[Path] = []
    plan = {t.file_id: set(t.offsets) for t in targets}
    done: dict[int, set[int]] = {t.file_id: set() for t in targets}
    missing = pl.DataFrame(schema={"file_id": pl.UInt32, "i": pl.UInt32})
    bad: list[str] = []
    for _round in range(3):
        for batch in batches:
            wanted = {h for t in batch.targets for h in plan.get(t.file_id, ())}
            for h in sorted(wanted):
                part = store / f"coll-{len(coll_stores)}.parquet"
                _fields(batch, h).cast(COLL_STORE_SCHEMA).sink_parquet(
                    part, compression="lz4", engine="streaming"
                )
                coll_stores.append(part)
                for t in batch.targets:
                    done[t.file_id].add(h)
        taken: dict[int, int] = {}
        if coll_stores:
            # Junk glued to a host (colour codes, NUL padding, a \r bar): those lines
            # go to the reference parser, which finds where the host starts.
            tokens = pl.scan_parquet(coll_stores).select(pl.col("proc").unique())
            bad = bad_tokens(tokens.collect(engine="streaming")["proc"].to_list())
            taken = dict(
                pl.scan_parquet(coll_stores)
                .filter(~pl.col("proc").is_in(bad))
                .group_by("file_id")
                .agg(pl.len())
                .collect(engine="streaming")
                .iter_rows()
            )
        short = [
            t.file_id for t in targets if op_lines.get(t.file_id, 0) != taken.get(t.file_id, 0)
        ]
        if not short:
            missing = missing.clear()
            break
        # Some opCount lines were not taken: find exactly which.
        taken_lines = (
            pl.scan_parquet(coll_stores).filter(~pl.col("proc").is_in(bad)).select("file_id", "i")
            if coll_stores
            else pl.LazyFrame(schema={"file_id": pl.UInt32, "i": pl.UInt32})
        )
        missing = (
            lines_lf.filter(pl.col("has_op") & pl.col("file_id").is_in(short))
            .select("file_id", "i")
            .join(taken_lines, on=["file_id", "i"], how="anti")
            .collect(engine="streaming")
        )
        if missing.height < _REPLAN_LINES:
            break
        # Many COLL lines left: the samples missed an offset.  Learn it from them.
        sample = _reread(batches, missing.group_by("file_id").head(50).head(5_000))
        plan = {}
        for (file_id,), lines in sample.group_by("file_id"):
            found = _offsets_of(lines)
            total = sum(found.values())
            new = {h for h, n in found.items() if n >= _MIN_SHARE * total} - done[int(file_id)]
            if new:
                plan[int(file_id)] = new
        if not plan:
            break
    text_store = store / "text.parquet"
    text = lines_lf.filter(~pl.col("has_op")).select(
        "file_id",
        "i",
        pl.col("text").str.slice(0, MAX_TEXT_CHARS),
        pl.col("text").str.len_chars().cast(pl.Int32).alias("n_chars"),
    )
    if missing.height:
        text = pl.concat([text, _reread(batches, missing).lazy()])
    text.with_columns(_kind()).select(list(TEXT_STORE_SCHEMA)).sort("file_id", "i").sink_parquet(
        text_store, compression="lz4", engine="streaming"
    )
    return coll_stores, text_store, n_lines, bad
