"""Vectorised first pass: every input line into one compact Parquet line store.

Why this shape: a 1,024-rank job with COLL logging writes tens of GB, ~95% of it COLL
lines.  Those are parsed here in polars' streaming engine (no Python per line) and
sunk to Parquet, so memory stays flat whatever the input size.  Every other line
keeps its text in the store and goes through the pure Python parser later: they are
few (init, connections, warnings) and need the full grammar.

The COLL fast path reads fields by their position from the *end* of the line, where
the format is fixed in every NCCL version (2.4-2.30)::

    ... host:pid:tid [dev] NCCL INFO AllGather: opCount 1a sendbuff 0x.. recvbuff 0x..
        count 4096 datatype 9 op 0 root 0 comm 0x55.. [nranks=16] stream 0x55..

so any launcher prefix or timestamp in front is harmless.  A line that does not
validate token by token, or that carries ANSI escapes, a carriage return or two NCCL
headers, is left to the reference parser instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ncclscope.schema import COLL_STORE_SCHEMA, LINE_KIND, TEXT_STORE_SCHEMA

__all__ = ["MAX_TEXT_CHARS", "ScanTarget", "scan_inputs"]

#: Text kept per non-COLL line; longer lines are not NCCL lines (NCCL truncates at 1 KiB
#: up to 2.28) and are counted as ``too_long`` when nothing parses.
MAX_TEXT_CHARS = 4096


@dataclass(frozen=True)
class ScanTarget:
    """A plain-text file and its index among the run's inputs."""

    file_id: int
    path: Path


def _lines(target: ScanTarget) -> pl.LazyFrame:
    return pl.scan_csv(
        target.path,
        has_header=False,
        separator="\x1f",
        quote_char=None,
        schema={"line": pl.String},
        truncate_ragged_lines=True,
        encoding="utf8-lossy",
        row_index_name="i",
        row_index_offset=1,
    ).with_columns(pl.lit(target.file_id, dtype=pl.UInt32).alias("file_id"))


def _fields(lf: pl.LazyFrame) -> pl.LazyFrame:
    """Add the COLL fields (read from the end of the line) and ``fast`` to every row."""
    line = pl.col("line")
    tok = line.str.split(" ")

    def t(k: int) -> pl.Expr:
        return tok.list.get(k, null_on_oob=True)

    hpt = t(-24).str.split(":")
    host = hpt.list.get(-3, null_on_oob=True)
    pid = hpt.list.get(-2, null_on_oob=True).cast(pl.Int32, strict=False)
    opcount = t(-18).str.to_integer(base=16, strict=False)
    count = t(-12).cast(pl.Int64, strict=False)
    nranks = t(-3).str.strip_prefix("[nranks=").str.strip_suffix("]").cast(pl.Int32, strict=False)
    fast = (
        line.str.contains("opCount", literal=True)
        & (t(-19) == "opCount")
        & (t(-21) == "INFO")
        & (t(-22) == "NCCL")
        & (t(-5) == "comm")
        & (t(-17) == "sendbuff")
        # ANSI escapes, \r progress bars and a second header (spliced writes) need
        # the reference parser to find where the real line starts.
        & ~line.str.contains(r"[\r\x1b]")
        & (line.str.count_matches("NCCL ", literal=True) == 1)
        & pid.is_not_null()
        & opcount.is_not_null()
        & count.is_not_null()
        & nranks.is_not_null()
        & (host.str.len_bytes() > 0)
    ).fill_null(value=False)
    # Default NCCL timestamp "[%F %T.%Nf] " right before the header; other formats -> null.
    ts_text = pl.concat_str(t(-26).str.slice(-10), pl.lit(" "), t(-25).str.strip_suffix("]"))
    ts = ts_text.str.to_datetime(
        "%Y-%m-%d %H:%M:%S%.f", time_unit="us", time_zone="UTC", strict=False
    )
    return lf.select(
        "file_id",
        "i",
        "line",
        fast.alias("fast"),
        host.alias("host"),
        pid.alias("pid"),
        t(-20).str.strip_suffix(":").alias("op"),
        opcount.alias("opcount"),
        count.alias("count"),
        t(-10).cast(pl.Int16, strict=False).alias("dtype"),
        t(-8).cast(pl.Int16, strict=False).alias("redop"),
        t(-6).cast(pl.Int32, strict=False).alias("root"),
        t(-4).str.to_lowercase().alias("comm"),
        nranks.alias("nranks"),
        ts.alias("ts"),
    )


def _text_rows(lf: pl.LazyFrame) -> pl.LazyFrame:
    """Rows the fast path did not take: their kind and (bounded) text."""
    line = pl.col("line")
    blank = line.is_null() | (line.str.strip_chars() == "")
    marker = line.str.contains(r"NCCL (?:INFO|WARN|TRACE|CALL)|NCCL version [0-9.]+[^ ]*\+cuda")
    kind = (
        pl.when(blank)
        .then(pl.lit(LINE_KIND["blank"]))
        .when(marker)
        .then(pl.lit(LINE_KIND["nccl"]))
        .otherwise(pl.lit(LINE_KIND["other"]))
    )
    return lf.filter(~pl.col("fast")).select(
        "file_id",
        "i",
        kind.cast(pl.UInt8).alias("kind"),
        line.str.slice(0, MAX_TEXT_CHARS).alias("text"),
        line.str.len_chars().cast(pl.Int32).alias("n_chars"),
    )


def scan_inputs(targets: Sequence[ScanTarget], coll_store: Path, text_store: Path) -> None:
    """Scan ``targets`` in one streaming query into two Parquet stores.

    ``coll_store`` gets one row per input line (COLL fields valid where ``fast``);
    ``text_store`` gets the other lines with their kind and text.

    Raises:
        polars.exceptions.PolarsError: a file could not be read; the caller retries
            file by file to name it.
    """
    frames = [_fields(_lines(target)) for target in targets]
    lf = pl.concat(frames, how="vertical") if len(frames) > 1 else frames[0]
    coll = lf.drop("line").cast(dict(COLL_STORE_SCHEMA))
    text = _text_rows(lf).cast(dict(TEXT_STORE_SCHEMA))
    pl.collect_all(
        [
            coll.sink_parquet(coll_store, lazy=True, compression="lz4"),
            text.sink_parquet(text_store, lazy=True, compression="lz4"),
        ],
        engine="streaming",
    )
