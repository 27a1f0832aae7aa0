"""PyTorch and DeepSpeed lines of the text store into their tables.

The first pass (``parsers.nccl.scan``) keeps the text of every non-COLL line.  Framework
lines are a small share of it (rank 0's DeepSpeed timers once per step, watchdog lines at
the end of a hang), so they are picked in polars by each parser's ``CANDIDATES`` and
``BLOCK_STARTS`` patterns, and only those lines, with the line after each (hard-wrapped
messages) and the lines after each block start (the config dump's JSON, the torchelastic
summary), go through the Python parsers, file by file, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from ncclscope.parsers.common import local_to_utc
from ncclscope.parsers.deepspeed import lines as ds
from ncclscope.parsers.deepspeed import zero as ds_zero
from ncclscope.parsers.deepspeed.patterns import TIMER_RENAMES
from ncclscope.parsers.torch import lines as torch
from ncclscope.schema import (
    COMMS_SCHEMA,
    FAILURES_SCHEMA,
    LINE_KIND,
    MEMORY_SCHEMA,
    THROUGHPUT_SCHEMA,
    TIMEOUTS_SCHEMA,
    TIMERS_SCHEMA,
    TORCH_EVENTS_SCHEMA,
)

__all__ = ["FrameworkTables", "mtime_years", "read_frameworks"]

#: Process-group timeouts in force when no line states one (grammar T5): DeepSpeed
#: passes its own 30 min; PyTorch's NCCL default is 10 min from 2.2 (the release that
#: added the ``[rankN]:`` prefix), 30 min before.
DEEPSPEED_DEFAULT_TIMEOUT_S = 1800.0
TORCH_DEFAULT_TIMEOUT_S = 600.0
TORCH_OLD_DEFAULT_TIMEOUT_S = 1800.0


@dataclass
class FrameworkTables:
    """What the PyTorch and DeepSpeed parsers read from every input."""

    timeouts: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=TIMEOUTS_SCHEMA))
    failures: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=FAILURES_SCHEMA))
    torch_events: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(schema=TORCH_EVENTS_SCHEMA)
    )
    timers: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=TIMERS_SCHEMA))
    throughput: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=THROUGHPUT_SCHEMA))
    memory: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=MEMORY_SCHEMA))
    comms: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=COMMS_SCHEMA))
    zero: ds.ZeroConfig | None = None
    ds_config: dict[str, str] = field(default_factory=dict)
    #: the ZeRO offloads ``ds_config["zero_config"]`` prints
    offloads: list[ds_zero.OffloadSetting] = field(default_factory=list)
    torch_seen: bool = False
    torch_version: str | None = None
    #: a ``[rankN]:`` prefix was seen: PyTorch 2.2 or later
    torch_rank_prefix: bool = False
    deepspeed_seen: bool = False
    deepspeed_version: str | None = None
    world_size: int | None = None
    #: ``zero.Init``'s count of model elements (ZeRO-3), and ``(file_id, line_no)`` of
    #: its line
    model_elems: int | None = None
    model_elems_line: tuple[int, int] | None = None
    #: the ZeRO optimizer's dtype (``bfloat16``, ``float16``, ``float32``)
    train_dtype: str | None = None
    trace_cache_warnings: int = 0
    #: per file_id: lines the framework parsers used, and lines that looked like theirs
    #: but did not parse (with the first such line)
    parsed: dict[int, int] = field(default_factory=dict)
    malformed: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: where the year of year-less (glog) times came from, when some were seen
    year_source: str | None = None

    def year_less_files(self) -> dict[int, str]:
        """Per file_id with glog times (month and day only): a note on the year used."""
        out: dict[int, str] = {}
        for table in (self.timeouts, self.torch_events, self.failures):
            rows = table.filter(pl.col("ts_source") == "logger_no_year")
            for (file_id,), part in rows.group_by("file_id"):
                years = part["ts"].drop_nulls().dt.year().to_list()
                year = str(min(years)) if years else "none"
                out[int(file_id)] = (
                    f"PyTorch log times carry no year: took {year} from {self.year_source}"
                )
        return out

    @property
    def timeout(self) -> tuple[float | None, str | None]:
        """The process-group timeout in force, and whether the logs state it
        (``logged``) or it is the framework's default (``default``)."""
        stated = self.timeouts["timeout_s"].drop_nulls()
        if len(stated):
            return float(stated.mode().sort()[0]), "logged"
        if self.deepspeed_seen:
            return DEEPSPEED_DEFAULT_TIMEOUT_S, "default"
        if self.torch_seen:
            if self.torch_rank_prefix:
                return TORCH_DEFAULT_TIMEOUT_S, "default"
            return TORCH_OLD_DEFAULT_TIMEOUT_S, "default"
        return None, None


#: The parsers and their patterns: each gets only the lines it asked for.
_PARSERS = {
    "torch": (torch.CANDIDATES, torch.BLOCK_STARTS, torch.BLOCK_LINES),
    "ds": (ds.CANDIDATES, ds.BLOCK_STARTS, ds.BLOCK_LINES),
}
#: Per parser, lines delivered with the line before them too (``torch.PRECEDED``).
_PRECEDED = {"torch": torch.PRECEDED}


def _wanted(text_store: Path) -> pl.DataFrame:
    """``(file_id, i)`` of the lines the framework parsers need, sorted, with a boolean
    column per parser saying whether it needs the line.  No text: a few bytes a line."""
    text = pl.col("text")
    flags = [f"{name}_{what}" for name in _PARSERS for what in ("cand", "start")]
    flags += [f"{name}_prev" for name in _PRECEDED]
    marks = (
        pl.scan_parquet(text_store)
        .filter(pl.col("kind") == LINE_KIND["other"])
        .select(
            "file_id",
            "i",
            *(
                text.str.contains(pattern).alias(f"{name}_{what}")
                for name, (cand, start, _n) in _PARSERS.items()
                for what, pattern in (("cand", cand), ("start", start))
            ),
            *(text.str.contains(p).alias(f"{name}_prev") for name, p in _PRECEDED.items()),
        )
        .filter(pl.any_horizontal(flags))
        .collect(engine="streaming")
    )
    schema = {"file_id": pl.UInt32, "i": pl.UInt32, **dict.fromkeys(_PARSERS, pl.Boolean)}
    if marks.is_empty():
        return pl.DataFrame(schema=schema)
    # Wanted line numbers per parser: each candidate and the line after it, each block
    # start and the lines after it.
    wanted = []
    for name, (_cand, _start, block) in _PARSERS.items():
        own = pl.col(f"{name}_cand") | pl.col(f"{name}_start")
        back = pl.col(f"{name}_prev") if name in _PRECEDED else pl.lit(value=False)
        spans = marks.filter(own | back).select(
            "file_id",
            pl.int_ranges(
                pl.when(back & (pl.col("i") > 0)).then(pl.col("i") - 1).otherwise("i"),
                pl.col("i") + pl.when(pl.col(f"{name}_start")).then(block).otherwise(1) + 1,
            ).alias("i"),
        )
        wanted.append(
            spans.explode("i")
            .select("file_id", pl.col("i").cast(pl.UInt32), pl.lit(value=True).alias(name))
            .unique(["file_id", "i"])
        )
    return (
        wanted[0]
        .join(wanted[1], on=["file_id", "i"], how="full", coalesce=True)
        .select("file_id", "i", *(pl.col(name).fill_null(value=False) for name in _PARSERS))
        .sort("file_id", "i")
    )


def _needed_lines(
    text_store: Path, wanted: pl.DataFrame | None = None, rows: tuple[int, int] | None = None
) -> pl.DataFrame:
    """``(file_id, i, text)`` of the lines the framework parsers need (``wanted``, by
    default all), in file order, with a boolean column per parser saying whether it needs
    the line; only those among the text store's rows ``rows`` = (start, length) if given.
    """
    if wanted is None:
        wanted = _wanted(text_store)
    store = pl.scan_parquet(text_store)
    if rows is not None:
        store = store.slice(*rows)
    return (
        store.filter(pl.col("kind") != LINE_KIND["blank"])
        .join(wanted.lazy(), on=["file_id", "i"], how="inner")
        .select("file_id", "i", "text", *_PARSERS)
        .collect(engine="streaming")
        .sort("file_id", "i")
    )


#: DeepSpeed's logger header (``deepspeed.lines.HEADER_RE`` in polars' regex syntax) with
#: the space after it, checked without captures.
_DS_HEADER_CHECK = (
    r"\[[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2},[0-9]{3}\] "
    r"\[[A-Z]{1,16}\] \[[^\s:\]]{1,200}:[0-9]{1,9}:[^\s\]]{1,200}\] "
)
#: The start of any logger header: a line with two of them is two records spliced.
_DS_ANY_HEADER = r"\[[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2},[0-9]{3}\] \["

#: The common shapes of DeepSpeed's chattiest records, read in polars rather than one by
#: one (a chatty job prints hundreds of thousands).  Each is matched against the message
#: after the header and ``[Rank N] ``, whole; any other shape (MoE breakdown, ``inf``,
#: two headers, colour codes, a cut line) goes to ``parse_deepspeed``, whose rows these
#: must equal (tests/test_frameworks.py checks it).
#:
#: ``[2024-05-02 10:00:01,100] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) |
#: fwd_microstep: 101.25 | bwd_microstep: 210.50``
_DS_TIMER_MSG = (
    r"^(?:rank=(?P<rank2>[0-9]{1,9}) )?time \(ms\)"
    r"(?P<pairs>(?: \| [^|:()]{1,100}: -?[0-9]{1,13}\.[0-9]{2})+)\s*$"
)
#: The progress line, which only sets the global step:
#: ``[...] [Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]``.
_DS_PROGRESS_MSG = r"^step=(?P<step>[0-9]{1,15}), skipped=[0-9]{1,15}, lr=\[[^\]]*\], mom=.*$"
#: Needles of the families ``parse_deepspeed`` tries before the progress line's.
_BEFORE_PROGRESS = r"time \(ms\) \||SamplesPerSec=|comm op: |MA |CPU Virtual Memory:"
#: ThroughputTimer (DeepSpeed >= 0.7.6), with plain decimals:
#: ``[...] [timer.py:264:stop] epoch=0/micro_step=40/global_step=10,
#: RunningAvgSamplesPerSec=21.873046128374906, CurrSamplesPerSec=22.41,
#: MemAllocated=3.47GB, MaxMemAllocated=9.12GB``
_DECIMAL = r"[0-9]{1,30}\.[0-9]{1,30}"
_GB = r"[0-9]{1,12}(?:\.[0-9]{1,12})?"
_DS_TPUT_MSG = (
    r"^epoch=(?P<epoch>[0-9]{1,12})/micro_step=(?P<micro>[0-9]{1,15})"
    rf"/global_step=(?P<gstep>[0-9]{{1,15}}), RunningAvgSamplesPerSec=(?P<avg>{_DECIMAL}), "
    rf"CurrSamplesPerSec=(?P<cur>{_DECIMAL}), MemAllocated=(?P<ma>{_GB})GB, "
    rf"MaxMemAllocated=(?P<mma>{_GB})GB\s*$"
)


def _headed(lines: pl.DataFrame) -> pl.DataFrame:
    """The DeepSpeed lines (``ds`` rows of ``_needed_lines``) that hold one logger header
    and neither ``\\r`` nor colour codes (the parser strips those first), with the
    header's fields: ``file_id``, ``i``, ``rank``, ``ts``, ``msg`` (after ``[Rank N] ``),
    and ``maybe_cut`` (the next line may be the rest of this one)."""
    text, head, msg = pl.col("text"), pl.col("head"), pl.col("msg")
    # Rows are sorted by (file_id, i): the next row is the next line when adjacent.
    nxt = text.shift(-1)
    adjacent = (pl.col("file_id").shift(-1) == pl.col("file_id")) & (
        pl.col("i").shift(-1) == pl.col("i") + 1
    )
    # The next line, when adjacent, header-less and shaped like the rest of a timer line
    # (`` | name: value``; or holding \r or colour codes, which the parser strips
    # first), may continue this one: the parser joins them.
    maybe_cut = (
        adjacent.fill_null(value=False)
        & ~nxt.str.contains(_DS_ANY_HEADER).fill_null(value=True)
        & nxt.str.contains(r"^\s?\||[\r\x1b]").fill_null(value=False)
    )
    # Cut where the header starts rather than capture it with a regex: captures over
    # whole lines cost ~20x more in polars' regex engine.  ``find`` gives a byte offset
    # and ``slice`` counts characters, so only all-ASCII lines go this way.  The header's
    # closing ``] `` is the third one from its start: none of its fields holds one.
    fields = (
        lines.filter(pl.col("ds"))
        .select(
            "file_id",
            "i",
            "text",
            maybe_cut.alias("maybe_cut"),
            text.str.slice(text.str.find(_DS_ANY_HEADER)).alias("head"),
        )
        .filter(
            (text.str.len_bytes() == text.str.len_chars())
            & ~text.str.contains(r"[\r\x1b]")
            & head.str.contains("^" + _DS_HEADER_CHECK)
        )
        .select(
            "file_id",
            "i",
            "maybe_cut",
            head.str.slice(1, 10).alias("date"),
            head.str.slice(12, 8).alias("time"),
            head.str.slice(21, 3).alias("ms"),
            head.str.splitn("] ", 4).struct.field("field_3").alias("msg"),
        )
        .filter(~msg.str.contains(_DS_ANY_HEADER))
        .with_columns(msg.str.extract(r"^\[Rank ([0-9]{1,9})\] ", 1).alias("rank"))
        .with_columns(
            pl.when(pl.col("rank").is_not_null())
            .then(msg.str.slice(pl.col("rank").str.len_chars() + len("[Rank ] ")))
            .otherwise(msg)
            .alias("msg")
        )
    )
    day = pl.col("date").str.to_date("%Y-%m-%d", strict=False)
    clock = pl.col("time")
    hms = [clock.str.slice(k, 2).cast(pl.Int64) for k in (0, 3, 6)]
    valid = day.is_not_null() & (hms[0] < 24) & (hms[1] < 60) & (hms[2] < 60)
    micros = (
        day.cast(pl.Int64) * 86_400_000_000
        + (hms[0] * 3600 + hms[1] * 60 + hms[2]) * 1_000_000
        + pl.col("ms").cast(pl.Int64) * 1000
    )
    return fields.select(
        "file_id",
        "i",
        pl.col("rank").cast(pl.Int32),
        local_to_utc(pl.when(valid).then(micros)).alias("ts"),
        "msg",
        "maybe_cut",
    )


def _fast_timer_lines(headed: pl.DataFrame) -> pl.DataFrame:
    """Plain timer lines of ``_headed`` rows: ``file_id``, ``i``, ``rank``, ``ts``,
    ``pairs``."""
    return (
        headed.filter(
            ~pl.col("maybe_cut") & pl.col("msg").str.contains("time (ms) |", literal=True)
        )
        .with_columns(pl.col("msg").str.extract_groups(_DS_TIMER_MSG).alias("m"))
        .unnest("m")
        .filter(pl.col("pairs").is_not_null())
        .select(
            "file_id",
            "i",
            pl.coalesce(pl.col("rank"), pl.col("rank2").cast(pl.Int32)).alias("rank"),
            "ts",
            "pairs",
        )
    )


def _fast_progress_marks(headed: pl.DataFrame) -> pl.DataFrame:
    """``(file_id, i, step)`` of plain progress lines of ``_headed`` rows."""
    msg = pl.col("msg")
    return (
        headed.filter(msg.str.starts_with("step=") & ~msg.str.contains(_BEFORE_PROGRESS))
        .select("file_id", "i", msg.str.extract(_DS_PROGRESS_MSG, 1).alias("step"))
        .filter(pl.col("step").is_not_null())
        .select("file_id", "i", pl.col("step").cast(pl.Int64))
    )


def _fast_throughput(headed: pl.DataFrame) -> pl.DataFrame:
    """THROUGHPUT rows of the plain ThroughputTimer lines of ``_headed`` rows."""
    fields = (
        headed.filter(pl.col("msg").str.starts_with("epoch="))
        .with_columns(pl.col("msg").str.extract_groups(_DS_TPUT_MSG).alias("m"))
        .unnest("m")
        .filter(pl.col("mma").is_not_null())
    )

    def gib(name: str) -> pl.Expr:
        # DeepSpeed's GB is GiB; rounded half to even like Python's round(); past Int64:
        # null, like the parser.
        bytes_ = (pl.col(name).cast(pl.Float64) * 2**30).round(mode="half_to_even")
        return bytes_.cast(pl.Int64, strict=False)

    return fields.select(
        "file_id",
        pl.col("i").alias("line_no"),
        pl.col("epoch").cast(pl.Int64),
        pl.col("micro").cast(pl.Int64).alias("micro_step"),
        pl.col("gstep").cast(pl.Int64).alias("global_step"),
        pl.col("cur").cast(pl.Float64).alias("samples_per_s"),
        pl.col("avg").cast(pl.Float64).alias("avg_samples_per_s"),
        gib("ma").alias("mem_allocated_bytes"),
        gib("mma").alias("max_mem_allocated_bytes"),
        "ts",
        pl.when(pl.col("ts").is_null())
        .then(pl.lit("none"))
        .otherwise(pl.lit("logger"))
        .alias("ts_source"),
    ).cast(THROUGHPUT_SCHEMA)


def _fast_timers(fast: pl.DataFrame, step_marks: pl.DataFrame) -> pl.DataFrame:
    """TIMERS rows of ``_fast_timer_lines``; the step is the last one set before the line."""
    pairs = (
        fast.with_columns(pl.col("pairs").str.strip_chars_end().str.split(" | ").list.slice(1))
        .explode("pairs")
        .with_columns(pl.col("pairs").str.split_exact(": ", 1).alias("kv"))
        .unnest("kv")
        .rename({"field_0": "name_printed", "field_1": "ms"})
        .with_columns(pl.col("name_printed").str.strip_chars())
    )
    # Seconds exactly as Python's float("1176.83") / 1000: polars divides by a scalar
    # through its reciprocal (40.27 / 1000 -> 0.04027000000000001) and its float parse
    # may differ in the last bit, so both divisions are by a column, which rounds
    # correctly: 117683 / 100 -> 1176.83, then / 1000.
    divisor = pl.Series([100.0, 1000.0]).repeat_by(pairs.height).explode()
    pairs = pairs.with_columns(
        pl.col("ms").str.replace(".", "", literal=True).cast(pl.Float64).alias("ms"),
        divisor[: pairs.height].alias("by_100"),
        divisor[pairs.height :].alias("by_1000"),
    ).with_columns((pl.col("ms") / pl.col("by_100") / pl.col("by_1000")).alias("ms"))
    renames = TIMER_RENAMES
    out = (
        pairs.sort("file_id", "i")
        .join_asof(
            step_marks.sort("file_id", "i"),
            on="i",
            by="file_id",
            strategy="backward",
            check_sortedness=False,  # both sides are sorted by (file_id, i) just above
        )
        .select(
            "file_id",
            pl.col("i").alias("line_no"),
            "rank",
            "step",
            pl.col("name_printed")
            .replace_strict(list(renames), list(renames.values()), default=pl.col("name_printed"))
            .alias("name"),
            "name_printed",
            pl.col("ms").alias("duration_s"),
            "ts",
            pl.when(pl.col("ts").is_null())
            .then(pl.lit("none"))
            .otherwise(pl.lit("logger"))
            .alias("ts_source"),
        )
    )
    return out.cast(TIMERS_SCHEMA)


#: Text-store rows per batch of the framework stage (a 1 GiB log has ~250,000).
_BATCH_ROWS = 250_000


@dataclass
class _Batch:
    """What one batch of the text store gave: rows read in polars, and the lines left
    for the Python parsers."""

    fast_timers: pl.DataFrame  # _fast_timer_lines
    throughput: pl.DataFrame  # THROUGHPUT_SCHEMA
    marks: pl.DataFrame  # (file_id, i, step) of progress and throughput lines
    slow: pl.DataFrame  # _needed_lines rows, ``ds`` false where read in polars
    first_ts: pl.DataFrame  # (file_id, i, ts) of each file's first dated header here


def _read_batch(text_store: Path, wanted: pl.DataFrame, start: int) -> _Batch:
    """Read the framework lines among the text store's rows from ``start``.  One row more
    is read: a line's successor decides whether it was cut (``_headed``)."""
    lines = _needed_lines(text_store, wanted, (start, _BATCH_ROWS + 1))
    headed = _headed(lines)
    if len(lines):
        # The extra row belongs to the next batch: drop its results here.
        end = pl.scan_parquet(text_store).slice(start + _BATCH_ROWS, 1).collect()
        if len(end):
            beyond = (pl.col("file_id") > end["file_id"][0]) | (
                (pl.col("file_id") == end["file_id"][0]) & (pl.col("i") >= end["i"][0])
            )
            lines, headed = lines.filter(~beyond), headed.filter(~beyond)
    fast = _fast_timer_lines(headed)
    throughput = _fast_throughput(headed)
    marks = pl.concat(
        [
            _fast_progress_marks(headed),
            throughput.select(
                "file_id", pl.col("line_no").alias("i"), pl.col("global_step").alias("step")
            ),
        ]
    )
    keys = pl.concat([fast.select("file_id", "i"), marks.select("file_id", "i")])
    if len(keys):
        lines = (
            lines.join(keys.with_columns(fast=pl.lit(value=True)), on=["file_id", "i"], how="left")
            .with_columns(pl.col("ds") & pl.col("fast").is_null())
            .drop("fast")
            .filter(pl.col("ds") | pl.col("torch"))
        )
    first_ts = (
        headed.filter(pl.col("ts").is_not_null())
        .group_by("file_id")
        .agg(pl.col("i", "ts").sort_by("i").first())
    )
    return _Batch(fast, throughput, marks, lines, first_ts)


def _per_file(
    lines: pl.DataFrame,
) -> Iterable[tuple[int, list[tuple[int, str]], list[tuple[int, str]]]]:
    """Per file: the torch parser's lines and the DeepSpeed parser's lines."""
    for (file_id,), part in lines.group_by("file_id", maintain_order=True):
        yield (
            int(file_id),
            _rows(part.filter(pl.col("torch"))),
            _rows(part.filter(pl.col("ds"))),
        )


def _rows(part: pl.DataFrame) -> list[tuple[int, str]]:
    return list(zip(part["i"].to_list(), part["text"].to_list(), strict=True))


def read_frameworks(
    text_store: Path,
    *,
    year_hint: Callable[[], int | None] = lambda: None,
    file_years: dict[int, int] | None = None,
) -> FrameworkTables:
    """Parse the PyTorch and DeepSpeed lines of the text store.

    glog headers carry no year: it is taken from DeepSpeed headers, else from
    ``year_hint()`` (NCCL timestamps; called only then, it may cost a pass over the
    COLL lines), else from ``file_years`` (each input's modification time).
    """
    out = FrameworkTables()
    wanted = _wanted(text_store)
    rows = pl.scan_parquet(text_store).select(pl.len()).collect().item() if len(wanted) else 0
    # Batches of the text store bound this stage's memory whatever the log's size.
    batches = [_read_batch(text_store, wanted, start) for start in range(0, rows, _BATCH_ROWS)] or [
        _read_batch(text_store, wanted, 0)
    ]
    fast = pl.concat([b.fast_timers for b in batches])
    fast_tput = pl.concat([b.throughput for b in batches])
    fast_marks = pl.concat([b.marks for b in batches])
    keys = pl.concat([fast.select("file_id", "i"), fast_marks.select("file_id", "i")])
    lines = pl.concat([b.slow for b in batches])
    first_ts = pl.concat([b.first_ts for b in batches])
    files = list(_per_file(lines))
    results = [
        (file_id, torch_rows, ds.parse_deepspeed(ds_rows, file_id=file_id))
        for file_id, torch_rows, ds_rows in files
    ]
    marks = pl.concat(
        [
            pl.DataFrame(
                [(file_id, i, step) for file_id, _r, d in results for i, step in d.step_marks],
                schema={"file_id": pl.UInt32, "i": pl.UInt32, "step": pl.Int64},
                orient="row",
            ),
            fast_marks,
        ]
    )
    fast_timers = _fast_timers(fast, marks)
    if len(fast_marks):
        # The parser did not see these steps: its timer rows take theirs again.
        for _file_id, _rows, d in results:
            d.timers = _restep(d.timers, marks)
    fast_lines = dict(keys.group_by("file_id").agg(pl.len()).iter_rows())
    fast_years = dict(first_ts.sort("i").group_by("file_id").agg(pl.col("ts").first()).iter_rows())
    results = [
        (file_id, rows, _with_fast(d, fast_lines.get(file_id, 0), fast_years.get(file_id)))
        for file_id, rows, d in results
    ]
    year, source = _year(results, year_hint if files else lambda: None, file_years or {})
    timers, throughput, memory, comms = [], [], [], []
    timeouts, failures, events = [], [], []
    for file_id, rows, d in results:
        fy = year if year is not None else (file_years or {}).get(file_id)
        t = torch.parse_torch(rows, file_id=file_id, year=fy)
        timers.append(d.timers)
        throughput.append(d.throughput)
        memory.append(d.memory)
        comms.append(d.comms)
        timeouts.append(t.timeouts)
        failures.append(t.failures)
        events.append(t.events)
        out.deepspeed_seen |= d.seen
        out.torch_seen |= t.seen
        out.deepspeed_version = out.deepspeed_version or d.version
        out.torch_version = out.torch_version or t.version
        out.world_size = out.world_size or d.world_size
        if out.model_elems is None and d.model_elems is not None:
            out.model_elems = d.model_elems
            out.model_elems_line = (file_id, d.model_elems_line or 0)
        out.train_dtype = out.train_dtype or d.train_dtype
        out.trace_cache_warnings += d.trace_cache_warnings
        if d.zero is not None and (out.zero is None or _rank(d.zero) > _rank(out.zero)):
            out.zero = d.zero
        out.ds_config = out.ds_config or d.config
        out.offloads = ds_zero.offload_settings(out.ds_config.get("zero_config", ""))
        used = d.parsed + t.parsed
        if used:
            out.parsed[file_id] = used
        bad = d.malformed + t.malformed
        if bad:
            firsts = [x for x in (d.first_malformed, t.first_malformed) if x is not None]
            out.malformed[file_id] = (bad, min(firsts) if firsts else 0)
        if t.seen and any("[rank" in text for _i, text in rows[:2000]):
            out.torch_rank_prefix = True
    out.timers = pl.concat([out.timers, *timers, fast_timers]).sort(
        "file_id", "line_no", maintain_order=True
    )
    out.throughput = pl.concat([out.throughput, *throughput, fast_tput]).sort(
        "file_id", "line_no", maintain_order=True
    )
    out.memory = pl.concat([out.memory, *memory])
    out.comms = pl.concat([out.comms, *comms])
    out.timeouts = pl.concat([out.timeouts, *timeouts])
    out.failures = pl.concat([out.failures, *failures])
    out.torch_events = pl.concat([out.torch_events, *events])
    tables = (out.timeouts, out.torch_events, out.failures)
    if any((t["ts_source"] == "logger_no_year").any() for t in tables):
        out.year_source = source
    return out


def _restep(timers: pl.DataFrame, marks: pl.DataFrame) -> pl.DataFrame:
    """``timers`` with ``step`` = the last step set before each row's line."""
    if timers.is_empty():
        return timers
    return (
        timers.with_row_index("_k")
        .drop("step")
        .sort("file_id", "line_no")
        .join_asof(
            marks.sort("file_id", "i").rename({"i": "line_no"}),
            on="line_no",
            by="file_id",
            strategy="backward",
            check_sortedness=False,  # both sorted by (file_id, line) just above
        )
        .sort("_k")
        .select(list(TIMERS_SCHEMA))
    )


def _with_fast(d: ds.DeepSpeedResult, lines: int, first: datetime | None) -> ds.DeepSpeedResult:
    """``d`` counting the timer lines read in polars as its own."""
    if not lines:
        return d
    d.parsed += lines
    d.seen = True
    if d.year is None and first is not None:
        d.year = first.year
    return d


def _rank(zero: ds.ZeroConfig) -> int:
    """Which ZeRO description to trust when files disagree: the JSON block first."""
    return {"json": 2, "zero_config": 1}.get(zero.source, 0)


def _year(
    results: list[tuple[int, list[tuple[int, str]], ds.DeepSpeedResult]],
    year_hint: Callable[[], int | None],
    file_years: dict[int, int],
) -> tuple[int | None, str | None]:
    for _file_id, _rows, d in results:
        if d.year is not None:
            return d.year, "DeepSpeed log headers"
    hint = year_hint()
    if hint is not None:
        return hint, "NCCL timestamps"
    if file_years:
        return None, "the files' modification times"
    return None, None


def mtime_years(paths: dict[int, Path]) -> dict[int, int]:
    """The year of each file's modification time (glog headers carry no year)."""
    years = {}
    for file_id, path in paths.items():
        try:
            years[file_id] = datetime.fromtimestamp(path.stat().st_mtime, tz=UTC).year
        except OSError:
            continue
    return years
