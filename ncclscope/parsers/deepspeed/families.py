"""Single-line families: what each DeepSpeed record type adds to the parser state.

A handler gets the parser and one line; it returns ``None`` (not its line), or the
outcome: parsed, seen, malformed.  :data:`_FAMILIES` lists them by needle.

Sample (read by :func:`throughput_line`)::

    epoch=0/micro_step=40/global_step=10, RunningAvgSamplesPerSec=21.873046128374906,
    CurrSamplesPerSec=22.41, MemAllocated=3.47GB, MaxMemAllocated=9.12GB
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ncclscope.parsers.deepspeed.state import _ParserState as _Parser
from ncclscope.parsers.deepspeed.blocks import feed_config
from ncclscope.parsers.deepspeed.patterns import (
    _MEM_JOIN_LINES,
    _MEM_MA_START_RE,
    COMM_CALL_RE,
    COMM_HDR_RE,
    CONFIG_KEY_RE,
    CONFIG_START_RE,
    CREATING_DTYPE_RE,
    DIST_WORLD_RE,
    JSON_START_RE,
    MEM_CPU_RE,
    MEM_MA_RE,
    MODEL_INIT_RE,
    PIPE_STEPS_RE,
    PROGRESS_RE,
    TIMER_CONT_RE,
    TIMER_HEAD_RE,
    TIMER_INNER_RE,
    TIMER_MEM_RE,
    TIMER_PAIR_RE,
    TIMER_PAIRS_RE,
    TIMER_PRINT_RANK_RE,
    TIMER_RENAMES,
    TPUT_OLD_RE,
    TPUT_RE,
    TRACE_CACHE,
    VERSION_RE,
)
from ncclscope.parsers.deepspeed.records import (
    _Block,
    _finite,
    _gbps,
    _gib,
    _i64,
    _Line,
    _ms_to_s,
    _Outcome,
    _rank,
    _size_bytes,
)
from ncclscope.parsers.deepspeed.zero import (
    INIT_LINE_RES,
    ZERO3_ENGINE,
    ZERO3_LABELS,
    ZERO3_PERSISTENT,
    _as_int,
)

__all__: list[str] = []  # internal to the DeepSpeed parser; lines.py is its interface


# -- single-line families ------------------------------------------------------------


def timers_line(p: _Parser, line: _Line) -> _Outcome | None:
    head = TIMER_HEAD_RE.search(line.msg)
    if head is None:
        return None
    pairs = line.msg[head.end() :]
    if (mem := TIMER_MEM_RE.search(pairs)) is not None:
        pairs = pairs[: mem.start()]  # memory figures, not timers
    if not TIMER_PAIRS_RE.fullmatch(pairs):
        return _Outcome.MALFORMED  # cut, spliced, or not a timer line after all
    values: list[tuple[str, str]] = []
    for name, ms, inner in TIMER_PAIR_RE.findall(pairs):
        values.append((name.strip(), ms))
        if inner:  # the MoE breakdown: "(fwd_moe: 30.10, 1st_a2a: 5.20, ...)"
            matches = [TIMER_INNER_RE.fullmatch(x.strip()) for x in inner.split(", ")]
            if not all(matches):
                return _Outcome.MALFORMED
            values += [(m["name"].strip(), m["ms"]) for m in matches if m is not None]
    rank = line.rank if line.rank is not None else _rank(head["rank"])
    if rank is None:
        printed = TIMER_PRINT_RANK_RE.search(line.msg, max(head.start() - 20, 0), head.start())
        rank = _rank(printed["rank"]) if printed else None
    # Every row of the line shares these; only name and value differ.
    fid, no, step, ts, src = p.file_id, line.line_no, p.step, line.ts, line.ts_source
    p.timers += [
        (
            fid,
            no,
            rank,
            step,
            TIMER_RENAMES.get(name, name),
            name,
            _ms_to_s(_finite(ms)),
            ts,
            src,
        )
        for name, ms in values
    ]
    return _Outcome.PARSED


def throughput_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = TPUT_RE.search(line.msg)
    if m is not None:
        epoch, micro, gstep = int(m["epoch"]), int(m["micro"]), int(m["gstep"])
        avg, cur = _finite(m["avg"]), _finite(m["cur"])
    else:
        m = TPUT_OLD_RE.search(line.msg)
        if m is None or line.msg[m.end() :].strip():
            # Text after the last field: the record was cut inside "MemAllocated".
            return _Outcome.MALFORMED
        # The second number counted micro steps (within the epoch) before v0.7.6.
        epoch, micro, gstep = int(m["epoch"]), int(m["step"]), None
        # <= v0.6 printed only the running average, as "SamplesPerSec".
        avg = _finite(m["avg"] if m["sps"] is None else m["sps"])
        cur = _finite(m["cur"])
    p.throughput.append(
        (
            p.file_id,
            line.line_no,
            epoch,
            micro,
            gstep,
            cur,
            avg,
            _gib(m["ma"]),
            _gib(m["mma"]),
            line.ts,
            line.ts_source,
        )
    )
    p.step = gstep if gstep is not None else micro
    if p.step is not None:
        p.step_marks.append((line.line_no, p.step))
    return _Outcome.PARSED


def progress_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = PROGRESS_RE.search(line.msg)
    if m is None:
        return _Outcome.MALFORMED if "step=" in line.msg else None
    p.step = int(m["step"])
    p.step_marks.append((line.line_no, p.step))
    return _Outcome.PARSED


def pipe_steps_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = PIPE_STEPS_RE.search(line.msg)
    if m is None:
        return None
    p.step = int(m["step"])
    p.step_marks.append((line.line_no, p.step))
    return _Outcome.PARSED


def comm_call_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = COMM_CALL_RE.search(line.msg)
    if m is None:
        return _Outcome.MALFORMED
    latency = _finite(m["ms"])
    latency_s = latency / 1000 if latency is not None else None
    p.comms.append(
        (
            p.file_id,
            line.line_no,
            "call",
            m["op"].strip(),
            _size_bytes(m["size"]),
            1,
            latency_s,
            latency_s,
            _gbps(m["algbw"]),
            _gbps(m["busbw"]),
            line.ts,
            line.ts_source,
        )
    )
    return _Outcome.PARSED


def memory_ma_line(p: _Parser, line: _Line) -> _Outcome | None:
    if not _MEM_MA_START_RE.match(line.msg):
        return None
    m = MEM_MA_RE.match(line.msg)
    if m is None:
        return _Outcome.MALFORMED
    label = None
    if p.label is not None and 0 < line.line_no - p.label[0] <= _MEM_JOIN_LINES:
        label = p.label[1]
        p.parsed += 1  # the label line contributed to this row
    p.label = None
    p.memory.append(
        [
            p.file_id,
            line.line_no,
            label,
            _gib(m["ma"]),
            _gib(m["max_ma"]),
            _gib(m["ca"]),
            _gib(m["max_ca"]),
            None,
            None,
            line.ts,
            line.ts_source,
        ]
    )
    p.open_mem = (len(p.memory) - 1, line.line_no)
    return _Outcome.PARSED


def memory_cpu_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = MEM_CPU_RE.search(line.msg)
    if m is None:
        return _Outcome.MALFORMED
    if p.open_mem is None or not 0 < line.line_no - p.open_mem[1] <= _MEM_JOIN_LINES:
        return _Outcome.SEEN  # its MA line was not read: nothing to join it to
    row = p.memory[p.open_mem[0]]
    row[7] = _gib(m["used"])
    row[8] = _finite(m["pct"])
    p.open_mem = None
    return _Outcome.PARSED


def trace_cache_line(p: _Parser, line: _Line) -> _Outcome | None:
    p.trace_cache += 1
    return _Outcome.PARSED


def version_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = VERSION_RE.search(line.msg)
    if m is None:
        return _Outcome.MALFORMED
    if p.version is None:
        p.version = m["version"]
    return _Outcome.PARSED


def dist_world_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = DIST_WORLD_RE.search(line.msg)
    if m is None:
        return None
    if p.world_launcher is None:
        p.world_launcher = int(m["n"])
    return _Outcome.PARSED


def model_init_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = MODEL_INIT_RE.search(line.msg)
    if m is None:
        return _Outcome.MALFORMED
    if p.model_elems is None:
        elems = _i64(float(m["billions"]) * 1e9)
        if elems is not None:
            p.model_elems = (elems, line.line_no)
    return _Outcome.PARSED


def init_line(p: _Parser, line: _Line) -> _Outcome | None:
    msg = line.msg.strip()
    dm = CREATING_DTYPE_RE.match(msg)
    if dm is not None and p.train_dtype is None:
        p.train_dtype = dm["dtype"]
    for name, regex in INIT_LINE_RES:
        m = regex.match(msg)
        if m is None:
            continue
        fields = p.zero.setdefault("init_lines", {})
        if name == "offload_optimizer":
            value: int | str | None = "cpu" if m["v"] == "True" else "none"
        else:
            value = _as_int(m["v"])
        if fields.get(name) is None:
            fields[name] = value
        return _Outcome.PARSED
    return None


def by_func_line(p: _Parser, line: _Line) -> _Outcome | None:
    handler = _BY_FUNC.get(line.func or "")
    return handler(p, line) if handler is not None and line.header else None


def memory_label_line(p: _Parser, line: _Line) -> _Outcome | None:
    p.label = (line.line_no, line.msg.rstrip())
    if line.msg.startswith(ZERO3_LABELS):
        p.zero3_seen()
    return _Outcome.SEEN


def zero3_line(p: _Parser, line: _Line) -> _Outcome | None:
    p.zero3_seen()
    return _Outcome.PARSED


def config_key_line(p: _Parser, line: _Line) -> _Outcome | None:
    """A dump key line with no open block (its start was cut off by a gap)."""
    if not CONFIG_KEY_RE.match(line.msg):
        return None
    # The rest of the dump being read (a gap cut it), unless a second dump started.
    block = _Block("config", line.prefix, line.line_no, keep=p.dumps <= 1)
    p.open_block(block)
    feed_config(p, block, line)
    return _Outcome.PARSED


def config_start_line(p: _Parser, line: _Line) -> _Outcome | None:
    if not CONFIG_START_RE.search(line.msg):
        return None
    p.open_block(_Block("config", line.prefix, line.line_no, keep=p.dumps == 0))
    p.dumps += 1
    return _Outcome.PARSED


def json_start_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = JSON_START_RE.match(line.msg)
    if m is None or not line.header:
        return None
    block = _Block("json", line.prefix, line.line_no)
    p.open_block(block)
    p.start_json(block, line.line_no, m["rest"])
    return _Outcome.PARSED


def comm_table_line(p: _Parser, line: _Line) -> _Outcome | None:
    m = COMM_HDR_RE.search(line.msg)
    if m is None:
        return None
    table = "straggler" if m["kind"].startswith("Total comm") else "summary"
    p.open_block(_Block("comms", line.prefix, line.line_no, table=table))
    return _Outcome.PARSED


Handler = Callable[["_Parser", _Line], _Outcome | None]

#: Single-line families: (needle, handler, continuation pattern).  A handler runs when
#: its needle is in the message; the first that claims the line wins.  The
#: continuation pattern says when the next line is the rest of a record cut after a value.
_FAMILIES: tuple[tuple[str, Handler, re.Pattern[str] | None], ...] = (
    ("time (ms) |", timers_line, TIMER_CONT_RE),
    ("SamplesPerSec=", throughput_line, None),
    ("comm op: ", comm_call_line, None),
    ("MA ", memory_ma_line, None),
    ("CPU Virtual Memory:", memory_cpu_line, None),
    (", skipped=", progress_line, None),
    (TRACE_CACHE, trace_cache_line, None),
    ("DeepSpeed info: ", version_line, None),
    ("dist_world_size=", dist_world_line, None),
    ("bucket size ", init_line, None),
    ("CPU Offload: ", init_line, None),
    ("ZeRO stage ", init_line, None),
    ("finished initializing model - ", model_init_line, None),
    ("configuration:", config_start_line, None),
    ("json = ", json_start_line, None),
    ("Comm. Op", comm_table_line, None),
    ("steps: ", pipe_steps_line, None),
    (ZERO3_PERSISTENT, zero3_line, None),
    (ZERO3_ENGINE, zero3_line, None),
    ("", by_func_line, None),
)

#: Logger lines known by the function that logged them.
_BY_FUNC: dict[str, Handler] = {
    "see_memory_usage": memory_label_line,
    "print": config_key_line,
}
