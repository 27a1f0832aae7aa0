"""Pure DeepSpeed log parser: the ``(line_no, text)`` of one file in, tidy tables out.

The grammar is ``shared/formats/deepspeed-torch.md`` PART D, read from DeepSpeed's own
format strings (v0.3 to v0.16).  Where a format changed between versions every shape
is taken at once (``rank=0 time (ms) | forward: ...`` and ``time (ms) | fwd: ...``), so
no version dispatch is needed; timer names are normalised to the >= v0.10.1 spelling.

The caller selects the lines with :data:`CANDIDATES` and :data:`BLOCK_STARTS` (both in
the regex syntax polars uses) and hands over, in file order, every candidate line, the
line after each (hard wraps), and up to :data:`BLOCK_LINES` lines after a block start.
A gap in ``line_no`` ends any block being read.

This module is the parser's interface: the selection regexes, line cleaning, the parser
state and :func:`parse_deepspeed`.  The grammar lives beside it: ``patterns`` (the line
grammars), ``families`` (single-line records), ``blocks`` (configuration dump, JSON,
comms tables), ``zero`` (ZeRO and offload settings) and ``records`` (rows and values).

Families and what becomes of them:

* wall-clock, ZeRO, fp16, swap, pipeline and MoE timer lines -> ``timers`` (one row per
  value, values in the MoE line's parentheses included);
* ``ThroughputTimer`` lines (three formats) -> ``throughput``;
* ``see_memory_usage``'s label, ``MA ...`` and ``CPU Virtual Memory:`` lines -> one
  ``memory`` row;
* comms-logger verbose lines (``source`` "call"), its summary table ("summary") and the
  ``show_straggler`` table ("straggler": ``latency_s``/``total_latency_s`` there are the
  *straggler* times, the average and total time rank 0 waited beyond the fastest rank);
* the engine configuration dump -> ``config``, ``world_size`` and :class:`ZeroConfig`;
* ``DeepSpeed info: version=``, ``dist_world_size=``, ``Invalidate trace cache`` and the
  step counters (progress ``step=N, skipped=``, throughput, pipeline ``steps: N loss:``).

Example::

    >>> res = parse_deepspeed(
    ...     [(7, "[2024-02-19 10:11:12,345] [INFO] [logging.py:96:log_dist] [Rank 0] "
    ...          "rank=0 time (ms) | forward_microstep: 287.41 | backward_microstep: 612.86")],
    ...     file_id=0,
    ... )
    >>> res.timers.select("rank", "name", "name_printed", "duration_s").rows()
    [(0, 'fwd_microstep', 'forward_microstep', 0.28741), (0, 'bwd_microstep', 'backward_microstep', 0.61286)]
    >>> res.year, res.seen, res.parsed
    (2024, True, 1)
"""  # noqa: E501

from __future__ import annotations

import re
from collections.abc import Iterable

from ncclscope.parsers.common import LineCleaner
from ncclscope.parsers.deepspeed.blocks import (
    _BLOCK_FEEDERS,
    BLOCK_LINES,
)
from ncclscope.parsers.deepspeed.families import _FAMILIES
from ncclscope.parsers.deepspeed.patterns import (
    HEADER_RE,
    PREFIX_RE,
    RANK_RE,
    normalise_timer_name,
)
from ncclscope.parsers.deepspeed.records import (
    DeepSpeedResult,
    Row,
    _Block,
    _frame,
    _header_us,
    _Line,
    _Outcome,
    _rank,
    _Verdict,
)
from ncclscope.parsers.deepspeed.zero import (
    ZERO3_FILES,
    ZeroConfig,
    ZeroFields,
    _as_int,
    _depth,
    _loads,
    loads_lines,
    merge_zero,
    zero_from_repr,
    zero_from_user_config,
)
from ncclscope.schema import (
    COMMS_SCHEMA,
    MEMORY_SCHEMA,
    THROUGHPUT_SCHEMA,
    TIMERS_SCHEMA,
)

__all__ = [
    "BLOCK_LINES",
    "BLOCK_STARTS",
    "CANDIDATES",
    "DeepSpeedResult",
    "ZeroConfig",
    "normalise_timer_name",
    "parse_deepspeed",
]


# --------------------------------------------------------------------------------------
# Selection regexes (Rust `regex` syntax, as polars runs them in `str.contains`)

#: Lines this parser needs on their own.  The logger header is matched from its
#: ``] [LEVEL] [file:line:func]`` part: starting at a literal lets polars' regex engine
#: skip ahead with a substring search (starting with the date made it 6x slower on
#: NCCL-heavy logs); the Python side checks the full header with its date.
#:
#: Samples::
#:
#:     [2024-02-19 10:11:12,345] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | ...
#:     rank=0 time (ms) | forward: 120.31 | backward: 250.12              (v0.3, print)
#:     Invalidate trace cache @ step 5: expected module 12, but got module 14   (print)
#:     Comm. Op            Message Size        Count               Total Latency(ms) ...
#:     steps: 100 loss: 2.3456 iter time (s): 0.512 samples/sec: 125.000  (pipeline, print)
#:     Parameter Offload: Total persistent parameters: 92160 in 81 params     (ZeRO-3, print)
CANDIDATES: str = (
    r"\] \[[A-Z]+\] \[[^\]\s]+:[0-9]+:[^\]\s]+\]"
    r"|time \(ms\) \|"
    r"|Invalidate trace cache @ step"
    r"|Comm\. Op {2,}Message Size"
    r"|SamplesPerSec="
    r"|steps: [0-9]+ loss: "
    r"|Parameter Offload: Total persistent parameters"
)

#: Lines that open a multi-line block: the engine configuration dump (its key lines carry
#: the logger header, but multi-line values and the ``json = {`` object do not), the
#: user-config JSON itself, and the comms-logger tables (printed with ``print``).
#: ``see_memory_usage`` is not here: each of its three lines carries the logger header,
#: so CANDIDATES delivers them, and a window after every per-step memory report
#: (``memory_breakdown: true``) would deliver most of the file.
#:
#: Samples::
#:
#:     [2024-02-19 10:11:12,345] [INFO] [config.py:984:print] DeepSpeedEngine configuration:
#:     [2024-02-19 10:11:12,351] [INFO] [config.py:974:print_user_config]   json = {
#:     Comm. Op            Message Size        Count               Total Latency(ms) ...
#:
#: A dump's key line whose value goes on over the next lines also starts one, so that a
#: damaged ``configuration:`` line costs only itself::
#:
#:     [2023-06-12 10:01:25,994] [INFO] [config.py:960:print]   activation_checkpointing_config  {
BLOCK_STARTS: str = (
    r"DeepSpeed(?:Engine|Light) configuration:|\] +json = \{|Comm\. Op {2,}Message Size"
    r"|:print\] +[A-Za-z_][A-Za-z0-9_]* [. ]*\{\s*$"
)

# --------------------------------------------------------------------------------------
# Line anatomy

#: A DeepSpeed record is at most a few KiB; of a longer line only the tail is read (what
#: comes before is a progress bar or another process's output glued in front).
_MAX_LINE = 1 << 16
#: Lines a block may skip in a row (other processes' lines) before it is given up.
_BLOCK_MISSES = {"config": 20, "json": 20, "comms": 8}
#: Lines missing inside a JSON object (blank, or damaged past reading) that leave it open;
#: a longer gap cuts it.
_JSON_GAP = 4


# --------------------------------------------------------------------------------------
# Cleaning and prefixes


def _holds_record(segment: str) -> bool:
    return "time (ms) |" in segment or HEADER_RE.search(segment) is not None


def _split_prefix(text: str) -> tuple[str, str]:
    """Launcher tags at the start of ``text`` (up to four) and the rest.

    >>> _split_prefix("gpu-node-07: [default0]:                    4.0 MB   48")
    ('gpu-node-07: [default0]:', '                    4.0 MB   48')
    """
    pos = 0
    for _ in range(4):
        m = PREFIX_RE.match(text, pos)
        if m is None:
            break
        pos = m.end()
    return text[:pos], text[pos:]


#: DeepSpeed's policy: the tail of an overlong line (the record ends it); of ``\\r``
#: segments the last that holds a record (a bar redrawn after the record, as an
#: unbuffered stderr interleaves with stdout, must not hide it), with the launcher tag
#: of the physical line, which only the first segment carries, kept in front.
_CLEANER = LineCleaner(
    keep=_holds_record, tail_chars=_MAX_LINE, tag=lambda text: _split_prefix(text)[0]
)


def _clean(raw: str) -> str:
    """The text of a physical line, by DeepSpeed's policy (``_CLEANER``).

    >>> _clean("host-1: \\r 7%|#  | 41/596\\r[2024-02-19 10:11:12,345] [INFO] x\\r\\n")
    'host-1: [2024-02-19 10:11:12,345] [INFO] x'
    >>> _clean("[Rank 0] time (ms) | fwd: 80.20\\r 7%|#  | 41/596 [00:30<07:11]")
    '[Rank 0] time (ms) | fwd: 80.20'
    """
    return _CLEANER(raw)


def _last_header(text: str) -> re.Match[str] | None:
    # Two headers on one line are two processes' writes spliced: the last one starts
    # the complete record.
    m = HEADER_RE.search(text)
    while m is not None:
        nxt = HEADER_RE.search(text, m.end())
        if nxt is None:
            return m
        m = nxt
    return None


class _Parser:
    """State of one file: rows so far, the open block, counters."""

    def __init__(self, file_id: int) -> None:
        self.file_id = file_id
        self.timers: list[Row] = []
        self.throughput: list[Row] = []
        self.memory: list[list[object]] = []
        self.comms: list[Row] = []
        self.config: dict[str, str] = {}
        self.zero: dict[str, ZeroFields] = {}
        self.version: str | None = None
        self.world_config: int | None = None
        self.world_launcher: int | None = None
        self.trace_cache = 0
        self.year: int | None = None
        self.seen = False
        self.parsed = 0
        self.malformed = 0
        self.first_malformed: int | None = None
        self.step: int | None = None
        self.step_marks: list[tuple[int, int]] = []
        self.prev: int | None = None
        self.block: _Block | None = None
        self.dumps = 0
        self.label: tuple[int, str] | None = None  # see_memory_usage label waiting for MA
        self.open_mem: tuple[int, int] | None = None  # (row index, MA line) waiting for CPU
        self.model_elems: tuple[int, int] | None = None  # (elements, line_no)
        self.train_dtype: str | None = None

    # -- reading ---------------------------------------------------------------------

    def read(self, line_no: int, raw: str) -> _Line:
        text = _clean(raw)
        prefix, body = _split_prefix(text)
        hm = _last_header(text) if "] [" in text else None
        if hm is None:
            # The whole text is searched: a "word: " at the start may be a message
            # ("steps: 100 loss: ..."), not a host name.
            return _Line(line_no, text, prefix, body, text, False, None, None, None)
        self.seen = True
        if hm["file"] in ZERO3_FILES:
            self.zero3_seen()
        ts = _header_us(hm)
        if ts is not None and self.year is None:
            self.year = int(hm["date"][:4])
        msg = text[hm.end() :]
        rank = None
        rm = RANK_RE.match(msg)
        if rm:
            rank = _rank(rm["rank"])
            msg = msg[rm.end() :]
        return _Line(line_no, text, prefix, body, msg, True, hm["func"], ts, rank)

    def feed(self, line_no: int, raw: str, nxt: tuple[int, str] | None) -> bool:
        """Read one line; True when it also took ``nxt`` (its hard-wrapped continuation)."""
        if self.prev is not None and line_no != self.prev + 1:
            block = self.block
            if block is not None and block.kind == "json" and line_no - self.prev <= _JSON_GAP:
                # a line or two inside the JSON object blank or damaged (not delivered)
                block.damaged = True
            else:
                self.close_block()  # a gap: the lines in between were not delivered
        self.prev = line_no
        line = self.read(line_no, raw)
        if self.block is not None:
            verdict = _BLOCK_FEEDERS[self.block.kind](self, self.block, line)
            if verdict is _Verdict.TAKEN:
                self.parsed += 1
                self.seen = True
                return False
            if verdict is _Verdict.ENDED:
                self.close_block()
        took_next = self.single(line, nxt)
        if took_next and nxt is not None:
            self.prev = nxt[0]
        return took_next

    def follow(self, line: _Line, nxt: tuple[int, str] | None) -> str | None:
        """The next line's text if it can continue ``line``: adjacent, no logger header."""
        if nxt is None or nxt[0] != line.line_no + 1 or not isinstance(nxt[1], str):
            return None
        text = _clean(nxt[1])
        if not text or HEADER_RE.search(text):
            return None
        return text

    def single(self, line: _Line, nxt: tuple[int, str] | None) -> bool:
        msg = line.msg
        for needle, handler, cont in _FAMILIES:
            if needle not in msg:
                continue
            if cont is not None:
                # Cut right after a value: the rest of the record is on the next line.
                rest = self.follow(line, nxt)
                if rest is not None and cont.match(rest):
                    joined = self.read(line.line_no, line.text + rest)
                    if handler(self, joined) is _Outcome.PARSED:
                        self.count(_Outcome.PARSED, line.line_no, 2)
                        return True
            outcome = handler(self, line)
            if outcome is None:
                continue
            if outcome is _Outcome.MALFORMED:
                # Cut by a terminal inside the record: retry with the next line glued on.
                rest = self.follow(line, nxt)
                if rest is not None:
                    joined = self.read(line.line_no, line.text + rest)
                    if handler(self, joined) is _Outcome.PARSED:
                        self.count(_Outcome.PARSED, line.line_no, 2)
                        return True
            self.count(outcome, line.line_no, 1)
            return False
        return False

    def count(self, outcome: _Outcome, line_no: int, lines: int) -> None:
        if outcome is _Outcome.PARSED:
            self.parsed += lines
            self.seen = True
        elif outcome is _Outcome.SEEN:
            self.seen = True
        else:
            self.malformed += 1
            if self.first_malformed is None:
                self.first_malformed = line_no

    def zero3_seen(self) -> None:
        """A line only ZeRO stage 3 prints was read (see :data:`ZERO3_FILES`)."""
        self.zero.setdefault("zero3_lines", {})["stage"] = 3

    # -- blocks ------------------------------------------------------------------------

    def open_block(self, block: _Block) -> None:
        self.close_block()
        self.block = block

    def start_json(self, block: _Block, line_no: int, rest: str) -> None:
        """Turn the open ``block`` into the JSON object that starts with ``rest``."""
        block.kind = "json"
        block.start = line_no
        block.parts = [rest]
        block.chars = len(rest)
        block.depth = _depth(rest)
        block.misses = 0
        if block.depth <= 0:  # the whole object on one line
            self.finish_json(block)
            self.block = None

    def finish_json(self, block: _Block) -> None:
        data = _loads("\n".join(block.parts))
        if not isinstance(data, dict) and block.damaged:
            data = loads_lines(block.parts) or None  # a line lost: read the others alone
        if not isinstance(data, dict):
            self.count(_Outcome.MALFORMED, block.start, 1)
            return
        fields = zero_from_user_config(data)
        if fields and block.keep and "json" not in self.zero:
            self.zero["json"] = fields

    def store_config(self, key: str, value: str) -> None:
        if key in self.config:
            return
        self.config[key] = value
        if key == "world_size":
            self.world_config = _as_int(value)
        elif key == "zero_config":
            fields = zero_from_repr(value)
            if fields:
                self.zero.setdefault("zero_config", fields)

    def close_block(self) -> None:
        block = self.block
        self.block = None
        if block is None:
            return
        if block.kind == "config" and block.key is not None and block.keep:
            # A multi-line value cut off: keep what was printed.
            self.store_config(block.key, "\n".join(block.parts))
        elif block.kind == "json" and block.balanced:
            self.finish_json(block)
        elif block.kind == "json":
            self.count(_Outcome.MALFORMED, block.start, 1)  # the object never closed

    def miss(self, block: _Block) -> _Verdict:
        block.misses += 1
        return _Verdict.ENDED if block.misses >= _BLOCK_MISSES[block.kind] else _Verdict.SKIPPED

    def result(self) -> DeepSpeedResult:
        self.close_block()
        return DeepSpeedResult(
            timers=_frame(self.timers, TIMERS_SCHEMA, "timers"),
            throughput=_frame(self.throughput, THROUGHPUT_SCHEMA, "throughput"),
            memory=_frame([tuple(r) for r in self.memory], MEMORY_SCHEMA, "memory"),
            comms=_frame(self.comms, COMMS_SCHEMA, "comms"),
            zero=merge_zero(self.zero),
            config=self.config,
            version=self.version,
            world_size=self.world_config if self.world_config is not None else self.world_launcher,
            trace_cache_warnings=self.trace_cache,
            year=self.year,
            seen=self.seen,
            parsed=self.parsed,
            malformed=self.malformed,
            first_malformed=self.first_malformed,
            step_marks=self.step_marks,
            model_elems=self.model_elems[0] if self.model_elems else None,
            model_elems_line=self.model_elems[1] if self.model_elems else None,
            train_dtype=self.train_dtype,
        )


def parse_deepspeed(lines: Iterable[tuple[int, str]], *, file_id: int) -> DeepSpeedResult:
    """Parse the DeepSpeed lines of one file (``(line_no, text)`` in file order).

    Never raises on the text: lines that cannot be read are counted in ``malformed``
    (when they began like a DeepSpeed record) or ignored.
    """
    parser = _Parser(file_id)
    it = iter(lines)
    current = next(it, None)
    while current is not None:
        nxt = next(it, None)
        line_no, text = current
        if isinstance(line_no, int) and 0 <= line_no < 2**32 and isinstance(text, str):
            if parser.feed(line_no, text, nxt):
                nxt = next(it, None)
        current = nxt
    return parser.result()
