"""What each message family does with a line it recognised.

A handler gets the parser, the line's index, what its prefixes said and the message
text; it adds rows and says whether the line was parsed, malformed or not its family.

Sample (read by :func:`_on_agent`)::

    failed (exitcode: -6) local_rank: 1 (pid: 87) of binary: /opt/conda/bin/python
"""

from __future__ import annotations

import re

from ncclscope.parsers.torch.oom import (
    _OOM_RE,
    parse_cuda_oom,
)
from ncclscope.parsers.torch.patterns import (
    _AGENT_RE,
    _CLOSING_RE,
    _DESYNC_TO_RE,
    _EXC_RAISED,
    _HB_LENIENT_RE,
    _HB_RE,
    _KV_RE,
    _LAST_ERR_RE,
    _NCCL_CODE_RE,
    _NCCL_ERR_RE,
    _STUCK_RE,
    _TERM_RE,
    _WD_RE,
)
from ncclscope.parsers.torch.prefixes import (
    _MAX_DETAIL,
    _MAX_MSG,
    _Ctx,
    _first,
    _int,
    _numel,
    _signal_name,
)
from ncclscope.parsers.torch.state import (
    _Companion,
    _Failure,
    _Handler,
    _Outcome,
    _Parser,
    _Timeout,
)

__all__: list[str] = []  # internal to the torch parser; lines.py is its interface

# --------------------------------------------------------------------------------------
# Family handlers: (parser, line index, prefixes, message) -> (outcome, message)


def _on_watchdog(p: _Parser, i: int, ctx: _Ctx, text: str) -> tuple[_Outcome, str]:
    m, text = p.match(i, text, _WD_RE)
    if m is None:
        return _Outcome.MALFORMED, text
    fields = {k: v.strip() for k, v in _KV_RE.findall(m["fields"])}
    op, timeout_ms = fields.get("OpType"), _int(fields.get("Timeout(ms)"))
    if not op or timeout_ms is None:
        return _Outcome.MALFORMED, text
    ran_ms = _int(m["ran"])
    rank = _int(m["rank"], 32) if m["rank"] else _first(ctx.msg_rank, ctx.pg_rank)
    p.add_timeout(
        _Timeout(
            line_no=p.line_no(i),
            host=ctx.host,
            global_rank=ctx.global_rank,
            rank=rank,
            pg=ctx.pg,
            pg_desc=ctx.pg_desc,
            seq=_int(fields.get("SeqNum")),
            op=op,
            numel_in=_numel(fields.get("NumelIn")),
            numel_out=_numel(fields.get("NumelOut")),
            timeout_s=timeout_ms / 1000,
            ran_for_s=ran_ms / 1000 if ran_ms is not None else None,
            ts=ctx.ts,
            ts_source=ctx.ts_source,
        )
    )
    return _Outcome.PARSED, text


#: The watchdog line's head, whole: a line that holds it is read by ``watchdog_timeout``.
_WD_HEAD = "Watchdog caught collective operation timeout"


def _on_watchdog_cut(p: _Parser, i: int, ctx: _Ctx, text: str) -> tuple[_Outcome, str]:
    """A watchdog line hard-wrapped inside its head (``... [Rank 2] Watchdog caught
    collective ope`` / ``ration timeout: WorkNCCL(SeqNum=212, ...``): read glued."""
    if _WD_HEAD in text:
        return _Outcome.NONE, text
    outcome, joined = _on_watchdog(p, i, ctx, text)
    # a line ending in "Watchdog" that no continuation completes is not a watchdog line
    return (_Outcome.NONE, text) if outcome is _Outcome.MALFORMED else (outcome, joined)


def _on_terminated(p: _Parser, i: int, ctx: _Ctx, text: str) -> tuple[_Outcome, str]:
    m = _TERM_RE.search(text)
    if m is None:
        return _Outcome.NONE, text
    what = text[m.end() :].strip()
    wd = _WD_RE.search(what)
    seq = op = None
    if wd is not None:
        fields = {k: v.strip() for k, v in _KV_RE.findall(wd["fields"])}
        seq, op = _int(fields.get("SeqNum")), fields.get("OpType") or None
    p.event(i, ctx, "watchdog_terminated", seq=seq, op=op, message=what[:_MAX_MSG] or None)
    return _Outcome.PARSED, text


def _companion(variant: str, regex: re.Pattern[str]) -> _Handler:
    def handle(p: _Parser, i: int, ctx: _Ctx, text: str) -> tuple[_Outcome, str]:
        m, text = p.match(i, text, regex)
        if m is None:
            return _Outcome.MALFORMED, text
        seq = _int(m["seq"])
        enq, comp = _int(m["enq"]), _int(m["comp"])
        if seq is None:
            return _Outcome.MALFORMED, text
        p.companions.append(_Companion(p.line_no(i), variant, ctx, seq, enq, comp))
        p.event(
            i,
            ctx,
            "work_status",
            seq=seq,
            value=comp,
            message=f"{variant} last_enqueued={enq if enq is not None else 'null'}",
        )
        return _Outcome.PARSED, text

    return handle


def _on_heartbeat(p: _Parser, i: int, ctx: _Ctx, text: str) -> tuple[_Outcome, str]:
    m, text = p.match(i, text, _HB_RE)
    if m is None and not _HB_LENIENT_RE.search(text):
        return _Outcome.MALFORMED, text
    value = _int(m["n"]) if m is not None else None  # some builds print no size
    p.event(i, ctx, "heartbeat_timeout", value=value, message=text.strip()[:_MAX_MSG])
    return _Outcome.PARSED, text


def _on_abort(p: _Parser, i: int, ctx: _Ctx, text: str) -> tuple[_Outcome, str]:
    """``[Rank 3] To avoid data inconsistency, we are taking the entire process down.``:
    the watchdog aborts its own process after a timeout or an error (2.0+), the line
    after each rank's reports."""
    p.event(i, ctx, "process_abort", message=text.strip()[:_MAX_MSG])
    return _Outcome.PARSED, text


def _on_stuck(p: _Parser, i: int, ctx: _Ctx, text: str) -> tuple[_Outcome, str]:
    m, text = p.match(i, text, _STUCK_RE)
    if m is None:
        return _Outcome.MALFORMED, text
    p.event(i, ctx, "watchdog_stuck", value=_int(m["sec"]), message=text.strip()[:_MAX_MSG])
    return _Outcome.PARSED, text


def _on_cuda_oom(p: _Parser, i: int, ctx: _Ctx, text: str) -> tuple[_Outcome, str]:
    """``CUDA out of memory`` (the caching allocator) or ``CUDA error: out of memory``."""
    if "CUDA out of memory" in text:
        m, text = p.match(i, text, _OOM_RE)
        if m is None and "Tried to allocate" not in text:
            return _Outcome.MALFORMED, text
    oom = parse_cuda_oom(text)
    if oom is None:
        return _Outcome.MALFORMED, text
    k = max(text.find("CUDA out of memory"), text.find("CUDA error: out of memory"))
    p.event(i, ctx, "cuda_oom", value=oom.tried_bytes, message=text[k:].strip()[:_MAX_MSG])
    return _Outcome.PARSED, text


def _desync_ctx(p: _Parser, i: int, ctx: _Ctx) -> _Ctx:
    """A desync line continues the record whose header came before it (no gap)."""
    if ctx.header or p.head is None:
        return ctx
    if p.head_index is not None and p.head_index not in p.malformed:
        p.parsed.add(p.head_index)
    return ctx.inherit(p.head)


def _on_desync_timeout(p: _Parser, i: int, ctx: _Ctx, text: str) -> tuple[_Outcome, str]:
    m, text = p.match(i, text, _DESYNC_TO_RE)
    if m is None:
        return _Outcome.MALFORMED, text
    dctx = _desync_ctx(p, i, ctx)
    rank = _int(m["rank"], 32)
    p.desync_rank = rank
    p.event(
        i,
        dctx,
        "desync_timeout",
        rank=rank,
        op=m["op"],
        seq=_int(m["seq"]),
        message=text.strip()[:_MAX_MSG],
    )
    return _Outcome.PARSED, text


def _ranks(text: str) -> list[int]:
    return [n for part in text.split(",") if (n := _int(part.strip(), 32)) is not None]


def _desync_lag(variant: str, regex: re.Pattern[str]) -> _Handler:
    def handle(p: _Parser, i: int, ctx: _Ctx, text: str) -> tuple[_Outcome, str]:
        m, text = p.match(i, text, regex)
        if m is None:
            return _Outcome.MALFORMED, text
        dctx = _desync_ctx(p, i, ctx)
        groups = m.groupdict()
        p.event(
            i,
            dctx,
            "desync_lagging",
            rank=_first(p.desync_rank, dctx.rank()),
            seq=_int(groups.get("seq")),
            ranks=_ranks(m["ranks"]),
            message=variant,
        )
        return _Outcome.PARSED, text

    return handle


def _on_nccl_error(p: _Parser, i: int, ctx: _Ctx, text: str) -> tuple[_Outcome, str]:
    m = _NCCL_ERR_RE.search(text)
    if m is None:
        return _Outcome.MALFORMED, text
    parts = [m["rest"].strip()]
    last: str | None = None
    if (k := parts[0].find("Last error:")) >= 0:  # details on the same line
        parts[0], last = parts[0][:k].strip(), parts[0][k + len("Last error:") :].strip()
    # C10D_NCCL_CHECK prints "\n" + "ncclRemoteError: ..." + "\nLast error:\n" + text.
    for j in range(i + 1, i + 1 + _MAX_DETAIL):
        if last is not None or not p.follows(j):
            break
        detail = p.detail_text(j, ctx)
        if detail is None:
            break
        if code := _NCCL_CODE_RE.match(detail):
            parts.append(f"{code['code']}: {code['desc'].strip()}")
            p.take(j, j)
        elif err := _LAST_ERR_RE.match(detail):
            p.take(j, j)
            last = err["text"].strip()
            if not last and p.follows(j + 1):
                nxt = p.detail_text(j + 1, ctx)
                if nxt is not None and nxt.strip():
                    last = nxt.strip()
                    p.take(j + 1, j + 1)
        else:
            break
    if last:
        parts.append(f"Last error: {last}")
    p.event(i, ctx, "nccl_error", message=" | ".join(x for x in parts if x)[:_MAX_MSG])
    return _Outcome.PARSED, text


def _on_last_error(p: _Parser, i: int, ctx: _Ctx, text: str) -> tuple[_Outcome, str]:
    # Only read as part of an NCCL error (above); alone it says nothing.
    return _Outcome.NONE, text


def _on_exception(p: _Parser, i: int, ctx: _Ctx, text: str) -> tuple[_Outcome, str]:
    k = text.find(_EXC_RAISED)
    if k < 0:
        return _Outcome.NONE, text
    where = text[k + len(_EXC_RAISED) : k + len(_EXC_RAISED) + _MAX_MSG].strip()
    where = where.removesuffix(":").removesuffix("(most recent call first)").strip()
    p.event(i, ctx, "exception", message=where or None)
    return _Outcome.PARSED, text


def _on_closing(p: _Parser, i: int, ctx: _Ctx, text: str) -> tuple[_Outcome, str]:
    m, text = p.match(i, text, _CLOSING_RE)
    if m is None:
        return _Outcome.MALFORMED, text
    p.event(i, ctx, "closing_signal", value=_int(m["pid"]), message=m["sig"])
    return _Outcome.PARSED, text


def _on_agent(p: _Parser, i: int, ctx: _Ctx, text: str) -> tuple[_Outcome, str]:
    m, text = p.match(i, text, _AGENT_RE)
    if m is None:
        return _Outcome.MALFORMED, text
    p.end_summary()  # a new round of failures
    exitcode = _int(m["code"], 32)
    p.add_failure(
        _Failure(
            line_no=p.line_no(i),
            host=ctx.host,
            rank=None,
            local_rank=_int(m["lr"], 32),
            pid=_int(m["pid"], 32),
            exitcode=exitcode,
            signal=_signal_name(exitcode),
            root_cause=False,
            source="agent",
            ts=ctx.ts,
            ts_source=ctx.ts_source,
        )
    )
    return _Outcome.PARSED, text


def _on_summary(p: _Parser, i: int, ctx: _Ctx, text: str) -> tuple[_Outcome, str]:
    outcome = p.summary_line(i, ctx, text, implicit=True)
    return outcome, text


def _on_head(p: _Parser, i: int, ctx: _Ctx, text: str) -> tuple[_Outcome, str]:
    # The first line of a multi-line glog record: kept as p.head by the main loop;
    # it counts as parsed once a desync line uses it.
    return _Outcome.NONE, text
