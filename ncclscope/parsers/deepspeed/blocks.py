"""Multi-line blocks: the engine configuration dump, its user-config JSON, comms tables.

A block opens on a :data:`BLOCK_STARTS` line and takes the lines after it that carry
the same launcher prefix, until it ends or too many lines miss.

Sample::

    [2024-02-19 10:11:12,345] [INFO] [config.py:984:print] DeepSpeedEngine configuration:
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ncclscope.parsers.deepspeed.state import _ParserState as _Parser
from ncclscope.parsers.deepspeed.patterns import (
    COMM_HDR_RE,
    COMM_OP_RE,
    COMM_ROW_RE,
    COMM_SEP_RE,
    CONFIG_KEY_RE,
    JSON_START_RE,
)
from ncclscope.parsers.deepspeed.records import (
    _Block,
    _finite,
    _Line,
    _ms_to_s,
    _Outcome,
    _size_bytes,
    _Verdict,
)
from ncclscope.parsers.deepspeed.zero import (
    _MAX_JSON_CHARS,
    _depth,
    _loads,
)

__all__ = [
    "BLOCK_LINES",
    "feed_comms",
    "feed_config",
    "feed_json",
]


#: Lines delivered after each BLOCK_STARTS line (a dump is ~150 keys plus its JSON).
BLOCK_LINES: int = 400


# -- block feeders -----------------------------------------------------------------------


#: A member line of an indented JSON object: ``    "train_batch_size": 64,``.
_JSON_MEMBER_RE = re.compile(r'^\s+"[^"]{1,200}"\s*:')


def feed_config(p: _Parser, block: _Block, line: _Line) -> _Verdict:
    """The engine configuration dump: key lines, multi-line values, then ``json = {``.

    Samples::

        [2024-02-19 10:11:12,346] [INFO] [config.py:988:print]   activation_checkpointing_config  {
            "partition_activations": false,
        }
        [2024-02-19 10:11:12,347] [INFO] [config.py:988:print]   zero_optimization_stage ...... 3
    """
    if line.prefix != block.prefix:
        return p.miss(block)
    if block.key is not None:
        if not line.header:
            block.parts.append(line.body.rstrip())
            block.depth += _depth(line.body)
            if block.depth <= 0 or len(block.parts) > BLOCK_LINES:
                if block.keep:
                    p.store_config(block.key, "\n".join(block.parts))
                block.key, block.parts = None, []
            return _Verdict.TAKEN
        # A logger line before the value closed: the value was cut; keep what we have.
        if block.keep:
            p.store_config(block.key, "\n".join(block.parts))
        block.key, block.parts = None, []
    if not line.header:
        if line.prefix == block.prefix and _JSON_MEMBER_RE.match(line.body):
            # A member of a JSON object whose first line (``json = {`` or a key line
            # ending in ``{``) was damaged: the object is read without it, and not
            # stored (whose object it was went with that line).
            p.start_json(block, line.line_no, "{")
            block.damaged = True
            block.keep = False
            return feed_json(p, block, line)
        return p.miss(block)
    m = JSON_START_RE.match(line.msg)
    if m is not None:
        p.start_json(block, line.line_no, m["rest"])  # a later dump's is read, not stored
        return _Verdict.TAKEN
    m = CONFIG_KEY_RE.match(line.msg)
    if m is None:
        return p.miss(block)
    block.misses = 0
    key, value = m["key"], m["value"].rstrip()
    if _depth(value) > 0:
        block.key, block.parts, block.depth = key, [value], _depth(value)
    elif block.keep:
        p.store_config(key, value)
    return _Verdict.TAKEN


def feed_json(p: _Parser, block: _Block, line: _Line) -> _Verdict:
    """The user config after ``json = {``: header-less, indented lines up to the closing brace.

    Samples (``ScientificNotationEncoder``, >= v0.9; older dumps have no spaces)::

            "reduce_bucket_size": 5.000000e+08,
        }
    """
    body = line.body
    indented = body[:1].isspace() or body.startswith(("}", "]"))
    if line.prefix != block.prefix or line.header or not indented:
        if block.balanced:
            # The object (a damaged line inside) balanced earlier: it ended there.
            p.finish_json(block)
            p.block = None
            return _Verdict.ENDED
        if not line.header:
            # Not JSON (or its launcher tag damaged), no header, where the object goes
            # on: maybe a damaged line of it (an opening brace it held is lost, so the
            # braces may balance too early).
            block.damaged = True
        return p.miss(block)  # else not JSON printed with an indent: another process's
    block.parts.append(body)
    block.chars += len(body)
    block.depth += _depth(body)
    block.misses = 0
    whole = block.depth <= 0 and isinstance(_loads("\n".join(block.parts)), dict)
    if block.depth <= 0 and not block.damaged and not whole:
        # The braces balance but the object does not parse: a line of it was damaged
        # (``"bf16"`` that lost its ``: {``), so they may balance too early.
        block.damaged = True
    if block.depth <= 0 and block.damaged:
        block.balanced = True  # maybe early: more of the object may follow
    elif block.depth <= 0:
        p.finish_json(block)
        p.block = None
    elif block.chars > _MAX_JSON_CHARS:
        p.count(_Outcome.MALFORMED, block.start, 1)
        p.block = None
    return _Verdict.TAKEN


def feed_comms(p: _Parser, block: _Block, line: _Line) -> _Verdict:
    """A comms-logger table: record-name lines, each followed by its rows (one per size)."""
    if line.prefix != block.prefix:
        return p.miss(block)
    body = line.body
    row = COMM_ROW_RE.match(body)
    if row is not None:
        block.misses = 0
        if block.op is None:  # a row before any record name: whose is it?
            p.count(_Outcome.MALFORMED, line.line_no, 1)
            return _Verdict.SKIPPED
        a, b, c, d = (_finite(row[k]) for k in "abcd")
        if block.table == "summary":
            # total latency, avg latency (ms), tput_avg, busbw_avg (Gbps)
            latency, total = _ms_to_s(b), _ms_to_s(a)
            algbw = c * 1e9 / 8 if c is not None else None
            busbw = d * 1e9 / 8 if d is not None else None
        else:
            # total comm lat, total straggler, avg comm lat, avg straggler (ms)
            latency, total, algbw, busbw = _ms_to_s(d), _ms_to_s(b), None, None
        p.comms.append(
            (
                p.file_id,
                line.line_no,
                block.table,
                block.op,
                _size_bytes(row["size"]),
                int(row["count"]),
                latency,
                total,
                algbw,
                busbw,
                None,
                "none",
            )
        )
        return _Verdict.TAKEN
    if COMM_HDR_RE.search(body):
        return _Verdict.ENDED  # the next table starts: read on its own
    if COMM_SEP_RE.match(body):
        return _Verdict.TAKEN
    if line.header or not body.strip():
        return p.miss(block)
    op = COMM_OP_RE.match(body)
    if op is None:
        return p.miss(block)
    block.op = op["op"]
    block.misses = 0
    return _Verdict.TAKEN


_BLOCK_FEEDERS: dict[str, Callable[[_Parser, _Block, _Line], _Verdict]] = {
    "config": feed_config,
    "json": feed_json,
    "comms": feed_comms,
}
