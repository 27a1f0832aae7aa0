"""Pure PyTorch-distributed line parser: c10d watchdog, heartbeat, desync and torchelastic.

The grammar is ``shared/formats/deepspeed-torch.md`` PART T: ProcessGroupNCCL's watchdog
timeout and its companion lines (1.x to 2.8), the heartbeat monitor, the desync report,
``NCCL error ... Last error:`` exceptions, and torchelastic's agent line and
``ChildFailedError`` summary.  Every era is matched by one pattern per family, so there
is no version dispatch: the eras differ in prefixes (stripped in any order) and in
optional fields (``NumelIn``), not in the message bodies.

The caller (the first pass) does not hand over every line of a file: only lines that
match :data:`CANDIDATES`, the line after each of them (hard-wrapped messages, the text
after ``Last error:``) and up to :data:`BLOCK_LINES` lines after each
:data:`BLOCK_STARTS` line (the elastic summary, a desync report).  A gap in the line
numbers means lines were left out, so nothing is joined or carried across one.

This module is the parser's interface: the family registry, the selection regexes and
:func:`parse_torch`.  The grammar lives beside it: ``prefixes`` (launcher and logger
prefixes, times), ``patterns`` (message bodies), ``oom`` (CUDA out of memory),
``state`` (rows and their merging) and ``handlers`` (one per family).

Example::

    >>> res = parse_torch(
    ...     [(7, "[rank3]:[E1108 03:12:48.117 4411 ProcessGroupNCCL.cpp:632] [Rank 3] "
    ...          "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=57, "
    ...          "OpType=_ALLGATHER_BASE, NumelIn=1024, NumelOut=16384, "
    ...          "Timeout(ms)=600000) ran for 600113 milliseconds before timing out.")],
    ...     file_id=0, year=2024)
    >>> res.timeouts.select("global_rank", "rank", "seq", "op", "timeout_s").row(0)
    (3, 3, 57, '_ALLGATHER_BASE', 600.0)
    >>> str(res.timeouts["ts"][0]), res.timeouts["ts_source"][0]
    ('2024-11-08 03:12:48.117000+00:00', 'logger_no_year')
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import polars as pl

from ncclscope.parsers.common import LineCleaner
from ncclscope.parsers.torch.handlers import (
    _companion,
    _desync_lag,
    _on_abort,
    _on_agent,
    _on_closing,
    _on_cuda_oom,
    _on_desync_timeout,
    _on_exception,
    _on_head,
    _on_heartbeat,
    _on_last_error,
    _on_nccl_error,
    _on_stuck,
    _on_summary,
    _on_terminated,
    _on_watchdog,
    _on_watchdog_cut,
)
from ncclscope.parsers.torch.oom import _OOM_TRIGGER, CudaOom, parse_cuda_oom
from ncclscope.parsers.torch.patterns import (
    _DESYNC_FINISHED_RE,
    _DESYNC_JOINED_RE,
    _DESYNC_NEVER_RE,
    _EXC_DET_RE,
    _EXC_RAISED,
    _FAIL_DET_RE,
    _NO_OTHER,
    _TO_AT_RE,
)
from ncclscope.parsers.torch.prefixes import (
    _MAX_CHARS,
    _strip_prefixes,
)
from ncclscope.parsers.torch.state import (
    TorchResult,
    _Family,
    _Parser,
)
from ncclscope.schema import FAILURES_SCHEMA, TIMEOUTS_SCHEMA, TORCH_EVENTS_SCHEMA, validate

__all__ = [
    "BLOCK_LINES",
    "BLOCK_STARTS",
    "CANDIDATES",
    "PRECEDED",
    "CudaOom",
    "TorchResult",
    "logger_time",
    "parse_cuda_oom",
    "parse_torch",
]

#: Lines the caller delivers after each :data:`BLOCK_STARTS` line.
BLOCK_LINES: int = 200
_MAX_SEGMENTS = 8  # ``\r`` segments of one line searched for a message


# --------------------------------------------------------------------------------------
# Cleaning


def _has_needle(segment: str) -> bool:
    return any(needle in segment for needle in _ALL_NEEDLES)


#: PyTorch's policy: NULs out; of a line's ``\\r`` segments the last that carries a
#: message this parser reads (a bar redrawn *after* the message must not hide it), else
#: the last non-blank one; at most ``_MAX_CHARS`` kept.
_CLEANER = LineCleaner(
    keep=_has_needle, segments=_MAX_SEGMENTS, head_chars=_MAX_CHARS, drop_nul=True
)


def _clean(text: str) -> str:
    """The text of a physical line, by PyTorch's policy (``_CLEANER``).

    >>> _clean(" 7%|##  | 41/596 [01:13<15:34]\\r[rank1]:[E ..] x")
    '[rank1]:[E ..] x'
    """
    return _CLEANER(text)


def logger_time(text: str, year: int | None) -> datetime | None:
    """The time a PyTorch or DeepSpeed logger header in front of a line says, if any.

    glog headers carry no year: ``year`` is used (None: no time from them).

    >>> logger_time("[rank4]:[E314 09:10:09.610966484 ProcessGroupNCCL.cpp:607] [Rank 4] "
    ...             "Watchdog caught collective operation timeout", 2025)
    datetime.datetime(2025, 3, 14, 9, 10, 9, 610966, tzinfo=datetime.timezone.utc)
    """
    ctx, _msg = _strip_prefixes(_clean(text), year)
    return ctx.ts


# --------------------------------------------------------------------------------------
# The registry


#: The desync report's first line: a glog header and at most a rank after it.
_HEAD_TRIGGER = r"\.(?:cpp|cc|hpp|h):\d+\] ?(?:\[(?:PG [^\]]{1,80} )?Rank \d+\] ?|Rank \d+ ?)?\s*$"

#: Families in the order they are tried on a line; several may read the same line
#: ("watchdog thread terminated with exception: [Rank 6] Watchdog caught ..." is a
#: timeout and an event).
_FAMILIES: tuple[_Family, ...] = (
    _Family(
        "watchdog_timeout",
        r"Watchdog caught collective operation timeout",
        ("Watchdog caught",),
        _on_watchdog,
    ),
    _Family(
        "watchdog_cut",
        r"\] (?:W|Wa|Wat|Watc|Watch|Watchd|Watchdo|Watchdog(?: [a-z]{1,10}){0,4}) ?$",
        (),
        _on_watchdog_cut,
        on_raw=True,
    ),
    _Family(
        "watchdog_terminated",
        r"watchdog thread terminated with exception",
        ("watchdog thread terminated",),
        _on_terminated,
    ),
    _Family(
        "exception_detected",
        r"detected by watchdog at work: ",
        ("detected by watchdog at work: ",),
        _companion("exception_detected", _EXC_DET_RE),
    ),
    _Family(
        "timeout_at",
        r"Timeout at NCCL work: ",
        ("Timeout at NCCL work: ",),
        _companion("timeout_at", _TO_AT_RE),
    ),
    _Family(
        "failure_detected",
        r"failure detected by watchdog at work sequence id",
        ("failure detected by watchdog",),
        _companion("failure_detected", _FAIL_DET_RE),
    ),
    _Family(
        "heartbeat_timeout",
        r"Heartbeat monitor timed out",
        ("Heartbeat monitor timed out",),
        _on_heartbeat,
    ),
    _Family("watchdog_stuck", r"watchdog got stuck for \d", ("watchdog got stuck",), _on_stuck),
    _Family(
        "process_abort",
        r"we are taking the entire process down",
        ("taking the entire process down",),
        _on_abort,
    ),
    _Family(
        "desync_timeout",
        r"\] Timeout at collective: ",
        ("Timeout at collective: ",),
        _on_desync_timeout,
    ),
    _Family(
        "desync_joined",
        r"\] joined but didn't finish collective #",
        ("joined but didn't finish",),
        _desync_lag("joined_not_finished", _DESYNC_JOINED_RE),
    ),
    _Family(
        "desync_finished",
        r"but didn't join collective #",
        ("but didn't join collective",),
        _desync_lag("finished_not_joined", _DESYNC_FINISHED_RE),
    ),
    _Family(
        "desync_never",
        r"\] are the lagging ranks that caused this timeout",
        ("are the lagging ranks",),
        _desync_lag("never_joined", _DESYNC_NEVER_RE),
    ),
    _Family("desync_head", _HEAD_TRIGGER, (), _on_head, on_raw=True),
    _Family("nccl_error", r"NCCL error(?: in)?: ", ("NCCL error",), _on_nccl_error),
    _Family("cuda_oom", _OOM_TRIGGER, ("out of memory",), _on_cuda_oom),
    _Family("last_error", r"Last error:", ("Last error:",), _on_last_error),
    _Family("exception", r"Exception raised from ", (_EXC_RAISED,), _on_exception),
    _Family(
        "closing_signal",
        r"Sending process \d+ closing signal",
        ("Sending process",),
        _on_closing,
    ),
    _Family(
        "agent_failed",
        r"failed \(exitcode: -?\d+\) local_rank: ",
        ("failed (exitcode: ",),
        _on_agent,
    ),
    _Family("summary_head", r"ChildFailedError:", ("ChildFailedError:",), _on_summary),
    _Family(
        "summary_section",
        r"Root Cause(?: \(first observed failure\))?:|Failures:\s*$",
        ("Root Cause", "Failures:"),
        _on_summary,
    ),
    _Family("summary_none", r"<NO_OTHER_FAILURES>", (_NO_OTHER,), _on_summary),
    # a summary's title: opens one whose head line was lost, under its ==== rule
    _Family("summary_title", r"\S FAILED\s*$", (" FAILED",), _on_summary),
    _Family(
        "summary_rank",
        r"rank *: \d+ \(local_rank: \d+\)",
        ("(local_rank: ",),
        _on_summary,
    ),
    _Family("summary_exit", r"exitcode *: -?\d+ \(pid: \d+\)", ("exitcode",), _on_summary),
    _Family(
        "summary_time",
        r"time *: \d{4}-\d\d-\d\d_\d\d:\d\d:\d\d",
        ("time",),
        _on_summary,
    ),
    _Family("summary_signal", r"Signal \d+ \(SIG", ("Signal ",), _on_summary),
)

_VERSION_TRIGGERS = (r"PyTorch version", r"torch version \.", r"torch==\d")

#: Pieces of a watchdog line that a job runner wrapped over three or more lines: each
#: is delivered (with the line after it), so the head's reader finds every piece.
_WRAP_TRIGGERS = (r"WorkNCCL\(SeqNum=", r"milliseconds before timing out")

#: Families that look at the whole line: tried even when no needle is present.
_RAW_FAMILIES = tuple(f for f in _FAMILIES if f.on_raw or not f.needles)

#: Every family's needles: a ``\r`` segment holding one is the line's message.
_ALL_NEEDLES: tuple[str, ...] = (
    *dict.fromkeys(n for f in _FAMILIES for n in f.needles),
    "version",
)

#: Regex in the syntax of Rust's ``regex`` crate as polars uses it in ``str.contains``
#: (no lookaround, no backreferences): matches every line this parser needs on its own.
#: Every branch starts with a literal so the engine can prefilter millions of lines.
CANDIDATES: str = "|".join(
    [f"(?:{f.trigger})" for f in _FAMILIES]
    + [f"(?:{t})" for t in (*_VERSION_TRIGGERS, *_WRAP_TRIGGERS)]
)

#: Regex (same syntax) for lines delivered with the line before them: a summary's title,
#: whose ``====`` rule above is part of the summary (``frameworks`` reads it).
PRECEDED: str = r"^\s{0,40}\S{1,500} FAILED\s*$"

#: Regex (same syntax) for lines that open a multi-line block: the ChildFailedError
#: summary (its head and its two section headers) and a desync report's header line.
#: The caller also delivers up to :data:`BLOCK_LINES` lines that follow each such line.
BLOCK_STARTS: str = "|".join(
    f"(?:{t})"
    for t in (
        r"ChildFailedError:",
        r"Root Cause(?: \(first observed failure\))?:",
        r"Failures:\s*$",
        _HEAD_TRIGGER,
    )
)


# --------------------------------------------------------------------------------------
# Entry point


def parse_torch(lines: Iterable[tuple[int, str]], *, file_id: int, year: int | None) -> TorchResult:
    """Read the PyTorch-distributed and torchelastic records of one file.

    ``lines`` are ``(line_no, text)`` in file order, a subset of the file's lines (see
    the module docstring).  ``year`` dates glog headers, which print month and day only;
    without it their rows get no ``ts``.  Never raises on any text.
    """
    parser = _Parser([(no, _clean(text)) for no, text in lines], year=year)
    parser.run(_FAMILIES, _RAW_FAMILIES, _ALL_NEEDLES)
    timeouts = _frame(
        [
            {
                "line_no": r.line_no,
                "host": r.host,
                "global_rank": r.global_rank,
                "rank": r.rank,
                "pg": r.pg,
                "pg_desc": r.pg_desc,
                "seq": r.seq,
                "op": r.op,
                "numel_in": r.numel_in,
                "numel_out": r.numel_out,
                "timeout_s": r.timeout_s,
                "ran_for_s": r.ran_for_s,
                "last_enqueued": r.last_enqueued,
                "last_completed": r.last_completed,
                "ts": r.ts,
                "ts_source": r.ts_source,
            }
            for r in parser.timeouts
        ],
        TIMEOUTS_SCHEMA,
        file_id,
        "timeouts",
    )
    failures = _frame(
        [
            {
                "line_no": r.line_no,
                "host": r.host,
                "rank": r.rank,
                "local_rank": r.local_rank,
                "pid": r.pid,
                "exitcode": r.exitcode,
                "signal": r.signal,
                "root_cause": r.root_cause,
                "source": r.source,
                "ts": r.ts,
                "ts_source": r.ts_source,
            }
            for r in sorted(parser.failures, key=lambda r: r.line_no)
        ],
        FAILURES_SCHEMA,
        file_id,
        "failures",
    )
    events = _frame(
        [
            {
                "line_no": e.line_no,
                "host": e.host,
                "global_rank": e.global_rank,
                "rank": e.rank,
                "pg": e.pg,
                "kind": e.kind,
                "seq": e.seq,
                "op": e.op,
                "ranks": e.ranks,
                "value": e.value,
                "message": e.message,
                "ts": e.ts,
                "ts_source": e.ts_source,
            }
            for e in parser.events
        ],
        TORCH_EVENTS_SCHEMA,
        file_id,
        "torch_events",
    )
    return TorchResult(
        timeouts=timeouts,
        failures=failures,
        events=events,
        version=parser.version,
        seen=bool(parser.parsed or parser.malformed),
        parsed=len(parser.parsed),
        malformed=len(parser.malformed),
        first_malformed=parser.line_no(min(parser.malformed)) if parser.malformed else None,
    )


def _frame(
    rows: list[dict[str, object]], schema: pl.Schema, file_id: int, name: str
) -> pl.DataFrame:
    data: dict[str, list[object]] = {col: [] for col in schema}
    for row in rows:
        for col in schema:
            data[col].append(file_id if col == "file_id" else row[col])
    return validate(pl.DataFrame(data, schema=schema), schema, name)
