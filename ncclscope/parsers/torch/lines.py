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

import re
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum

import polars as pl

from ncclscope.parsers.common import last_segment, strip_ansi, to_dt
from ncclscope.schema import FAILURES_SCHEMA, TIMEOUTS_SCHEMA, TORCH_EVENTS_SCHEMA, validate

__all__ = [
    "BLOCK_LINES",
    "BLOCK_STARTS",
    "CANDIDATES",
    "CudaOom",
    "TorchResult",
    "logger_time",
    "parse_cuda_oom",
    "parse_torch",
]

#: Lines the caller delivers after each :data:`BLOCK_STARTS` line.
BLOCK_LINES: int = 200

_MAX_CHARS = 1 << 16  # longest text looked at: a watchdog line is ~300 chars, a desync
# line lists ranks (~7 chars each); 64 Ki keeps a 10 MB junk line cheap.
_MAX_MSG = 2000  # longest message stored in the events table
_MAX_PREFIXES = 12  # prefixes stripped per line at most (real lines carry up to 6)
_MAX_JOIN = 3  # hard-wrapped continuation lines glued to one message at most
_MAX_DETAIL = 4  # lines after an NCCL error searched for its ``Last error:`` text
_MAX_SEGMENTS = 8  # ``\r`` segments of one line searched for a message
_COMPANION_REACH = 200  # lines between a watchdog line and a companion of another SeqNum
_U64_MAX = (1 << 64) - 1  # NumelIn/NumelOut printed for "unknown" (uint64 -1)


# --------------------------------------------------------------------------------------
# Cleaning


def _clean(text: str) -> str:
    """Drop NULs, a ``\\r``-glued progress bar, ANSI escapes; cap the length.

    ``_clean(" 7%|##  | 41/596 [01:13<15:34]\\r[rank1]:[E ..] x")`` is
    ``"[rank1]:[E ..] x"``.  When a line holds several ``\\r`` segments the last one
    that carries a message this parser reads wins (a bar redrawn *after* the message
    must not hide it), else the last non-blank one.
    """
    if "\x00" in text:
        text = text.replace("\x00", "")
    if "\r" in text:
        text = last_segment(text, _has_needle, limit=_MAX_SEGMENTS, cap=_MAX_CHARS)
    if len(text) > _MAX_CHARS:
        text = text[:_MAX_CHARS]
    return strip_ansi(text).rstrip("\n")


def _has_needle(segment: str) -> bool:
    return any(needle in segment for needle in _ALL_NEEDLES)


# --------------------------------------------------------------------------------------
# Prefixes (outer to inner, stripped repeatedly in any order)


@dataclass(slots=True)
class _Ctx:
    """What the prefixes of one line say: who printed it, where and when."""

    host: str | None = None
    global_rank: int | None = None  # [rankG]:
    local_rank: int | None = None  # [default3]:
    pg: str | None = None  # [PG 1 Rank 2] / [PG ID 1 PG GUID 5(desc) Rank 2]
    pg_desc: str | None = None
    pg_rank: int | None = None
    msg_rank: int | None = None  # a bare [Rank r] in front of the message
    ts: datetime | None = None
    ts_source: str = "none"
    header: bool = False  # a logger header (glog, python logging) starts a new record here
    prefixed: bool = False  # a prefix other than a bare ``word: `` (pdsh) was stripped
    pdsh: bool = False  # a ``host: `` prefix was stripped (one per line)

    def rank(self) -> int | None:
        """The rank in the PG as printed by the line's prefixes."""
        return self.pg_rank if self.pg_rank is not None else self.msg_rank

    def inherit(self, head: _Ctx | None) -> _Ctx:
        """This line's context completed by the record head it continues, if compatible."""
        if head is None or self.header:
            return self
        if not (_same_host(self.host, head.host) and _compat(self.global_rank, head.global_rank)):
            return self
        return _Ctx(
            host=self.host or head.host,
            global_rank=_first(self.global_rank, head.global_rank),
            local_rank=_first(self.local_rank, head.local_rank),
            pg=self.pg or head.pg,
            pg_desc=self.pg_desc or head.pg_desc,
            pg_rank=_first(self.pg_rank, head.pg_rank),
            msg_rank=_first(self.msg_rank, head.msg_rank),
            ts=self.ts or head.ts,
            ts_source=self.ts_source if self.ts is not None else head.ts_source,
            header=False,
            prefixed=self.prefixed,
        )


_Apply = Callable[[_Ctx, re.Match[str], int | None], bool]

#: Ray worker prefix: ``(RayTrainWorker pid=4242, ip=10.0.3.17) `` (old Ray: ``(pid=4242) ``).
_RAY_RE = re.compile(
    r"\((?:(?P<actor>[\w.]{1,100}) )?pid=(?P<pid>\d{1,10})"
    r"(?:, ip=(?P<ip>[0-9A-Fa-f.:]{1,45}))?\) ?",
    re.ASCII,
)

#: pdsh ``gpu-node-07: ``, ``10.20.30.41: `` or ``srun -l`` ``3: ``.  What looks like a
#: host but is a message word (``RuntimeError: ``, ``ncclSystemError: ``) is refused by
#: :data:`_NOT_HOST_RE`.
_HOST_RE = re.compile(r"(?P<host>[A-Za-z0-9][\w.@-]{0,253}): ", re.ASCII)
_NOT_HOST_RE = re.compile(
    r"[\w.]*(?:Error|Exception|Warning|Interrupt|Exit|Failure)|nccl[A-Z]\w*|Traceback|Failures"
    r"|time|host|rank|local_rank|exitcode|error_file|traceback|msg|frame|Note|Hint"
)

#: ``[rank3]:`` (torch >= 2.2, #110623): the global rank of the default PG.
_RANK_RE = re.compile(r"\[rank(?P<grank>\d{1,12})\]: ?", re.ASCII)

#: torchrun ``--tee``/``--log-dir`` console prefix ``[default3]:`` (role + *local* rank).
_TEE_RE = re.compile(r"\[(?P<role>[A-Za-z_][\w-]{0,63}?)(?P<local_rank>\d{1,6})\]: ?", re.ASCII)

#: c10 glog header: ``[E1108 03:12:48.117804 4411 ProcessGroupNCCL.cpp:632] `` (>= 2.4,
#: month *not* zero-padded: ``E714`` is July 14) and ``[E ProcessGroupNCCL.cpp:475] ``
#: (<= 2.3, no time).
_GLOG_RE = re.compile(
    r"\[(?P<sev>[IWEF])(?:(?P<mmdd>\d{3,4}) (?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<frac>\d{1,9}))?)?"
    r"(?: (?P<tid>\d{1,20}))? (?P<src>[\w./-]{1,300}\.(?:cpp|cc|h|hpp|cu)):(?P<line>\d{1,7})\] ?",
    re.ASCII,
)

#: torchelastic >= 2.4 (python glog format):
#: ``E0314 09:41:52.117000 140913 torch/distributed/elastic/multiprocessing/api.py:869] ``
_PYGLOG_RE = re.compile(
    r"(?P<sev>[DIWEF])(?P<mmdd>\d{3,4}) (?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<frac>\d{1,9}))? "
    r"(?P<pid>\d{1,10}) (?P<src>[\w./-]{1,300}\.py):(?P<line>\d{1,7})\] ?",
    re.ASCII,
)

_DATE = r"(?P<date>\d{4}-\d{2}-\d{2})[ T](?P<time>\d{2}:\d{2}:\d{2})(?:[.,](?P<frac>\d{1,9}))?"

#: torchelastic 2.1-2.3 logger header:
#: ``[2023-11-21 16:05:44,392] torch.distributed.elastic.multiprocessing.api: [ERROR] ``
_PYLOG_RE = re.compile(rf"\[{_DATE}\] (?P<logger>[\w.]{{1,200}}): \[(?P<lvl>[A-Z]{{1,10}})\] ?")

#: DeepSpeed's header ``[2024-01-01 10:00:00,123] [INFO] [launch.py:315:sigkill_handler] ``.
_DSLOG_RE = re.compile(
    rf"\[{_DATE}\] \[(?P<lvl>[A-Z]{{1,10}})\] \[[\w.-]{{1,100}}:\d{{1,7}}:[\w<>]{{1,100}}\] ?"
)

#: torchelastic <= 2.0 (``logging.basicConfig`` default):
#: ``ERROR:torch.distributed.elastic.multiprocessing.api:``
_PYLOG_OLD_RE = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):(?P<logger>[\w.]{1,200}):")

#: ProcessGroupNCCL logPrefix, every generation: ``[PG 1 Rank 2] `` (2.3),
#: ``[PG 0 (default_pg) Rank 6] `` (2.4), ``[PG ID 0 PG GUID 0(default_pg) Rank 3] `` (>= 2.5).
#: The 2.3/2.4 number is the PG uid, which 2.5 prints as the GUID.
_PG_RE = re.compile(
    r"\[(?:PG ID (?P<pgid>\d{1,9}) PG GUID (?P<guid>[^\s(\]]{1,64})"
    r"(?:\((?P<desc2>[^)\]]{0,200})\))?"
    r"|PG (?P<pg>[^\s(\]]{1,64})(?: \((?P<desc>[^)\]]{0,200})\))?) Rank (?P<pgrank>\d{1,9})\] ?",
    re.ASCII,
)

#: ``[Rank 4] `` in front of a message (<= 2.2 logPrefix, WorkNCCL's prefix).
_RANKMSG_RE = re.compile(r"\[Rank (?P<rank>\d{1,9})\] ?", re.ASCII)

#: A bare number in brackets in front of the other prefixes, as log collectors and
#: pasted excerpts tag each line with its line number or the writer's pid:
#: ``[80746] [rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 0] ...``.
#: Only taken when another prefix follows, so the companion line keeps its ``[PG 1 Rank 0]``
#: and can be joined to its timeout.
_TAG_RE = re.compile(r"\[\d{1,12}\] (?=\[)", re.ASCII)


def _apply_ray(ctx: _Ctx, m: re.Match[str], year: int | None) -> bool:
    if ctx.host is None and m["ip"]:
        ctx.host = m["ip"]
    return True


def _apply_host(ctx: _Ctx, m: re.Match[str], year: int | None) -> bool:
    host = m["host"]
    if ctx.pdsh or _NOT_HOST_RE.fullmatch(host):
        return False
    ctx.pdsh = True
    if not host.isdigit():  # "3: " is srun -l's task number, not a host
        ctx.host = host
    return True


def _apply_rank(ctx: _Ctx, m: re.Match[str], year: int | None) -> bool:
    ctx.global_rank = _int(m["grank"], 32)
    return True


def _apply_tee(ctx: _Ctx, m: re.Match[str], year: int | None) -> bool:
    ctx.local_rank = _int(m["local_rank"], 32)
    return True


def _apply_glog(ctx: _Ctx, m: re.Match[str], year: int | None) -> bool:
    ctx.header = True
    if m["mmdd"] and ctx.ts_source == "none":
        ctx.ts, ctx.ts_source = _glog_ts(m["mmdd"], m["time"], m["frac"], year)
    return True


def _apply_pylog(ctx: _Ctx, m: re.Match[str], year: int | None) -> bool:
    ctx.header = True
    if ctx.ts_source == "none":
        ts = to_dt(m["date"], m["time"], m["frac"])
        if ts is not None:
            ctx.ts, ctx.ts_source = ts, "logger"
    return True


def _apply_header(ctx: _Ctx, m: re.Match[str], year: int | None) -> bool:
    ctx.header = True
    return True


def _apply_pg(ctx: _Ctx, m: re.Match[str], year: int | None) -> bool:
    ctx.pg = m["guid"] or m["pg"]
    ctx.pg_desc = m["desc2"] or m["desc"] or ctx.pg_desc
    ctx.pg_rank = _int(m["pgrank"], 32)
    return True


def _apply_rankmsg(ctx: _Ctx, m: re.Match[str], year: int | None) -> bool:
    ctx.msg_rank = _int(m["rank"], 32)
    return True


def _apply_tag(ctx: _Ctx, m: re.Match[str], year: int | None) -> bool:
    return True


_Prefix = tuple[str, re.Pattern[str], _Apply]

#: (name, pattern, apply) tried in order at the current position; the first accepted
#: match is stripped and the scan starts over (prefixes nest in any order).  Keyed by
#: the character a prefix starts with ("" = a letter or digit), so a line tries only
#: the few that can match there.
_PREFIXES: dict[str, tuple[_Prefix, ...]] = {
    "(": (("ray", _RAY_RE, _apply_ray),),
    "[": (
        ("rank", _RANK_RE, _apply_rank),
        ("tee", _TEE_RE, _apply_tee),
        ("glog", _GLOG_RE, _apply_glog),
        ("pylog", _PYLOG_RE, _apply_pylog),
        ("dslog", _DSLOG_RE, _apply_pylog),
        ("pg", _PG_RE, _apply_pg),
        ("rank_msg", _RANKMSG_RE, _apply_rankmsg),
        ("tag", _TAG_RE, _apply_tag),
    ),
    "": (
        ("pyglog", _PYGLOG_RE, _apply_glog),
        ("pylog_old", _PYLOG_OLD_RE, _apply_header),
        ("host", _HOST_RE, _apply_host),
    ),
}


def _strip_prefixes(text: str, year: int | None) -> tuple[_Ctx, str]:
    """Split ``text`` into what its prefixes say and the message after them.

    >>> ctx, msg = _strip_prefixes("node-3: [rank9]:[E ProcessGroupNCCL.cpp:475] "
    ...                            "[PG 0 (default_pg) Rank 1] Timeout at NCCL work: 5", None)
    >>> ctx.host, ctx.global_rank, ctx.pg, ctx.pg_desc, ctx.pg_rank, msg
    ('node-3', 9, '0', 'default_pg', 1, 'Timeout at NCCL work: 5')
    """
    ctx = _Ctx()
    pos = 0
    for _ in range(_MAX_PREFIXES):
        first = text[pos : pos + 1]
        if first in _PREFIXES:
            prefixes = _PREFIXES[first]
        elif first.isascii() and first.isalnum():
            prefixes = _PREFIXES[""]
        else:
            break
        for name, regex, apply in prefixes:
            m = regex.match(text, pos)
            if m is not None and m.end() > pos and apply(ctx, m, year):
                pos = m.end()
                # "work: 58, ..." looks like a pdsh host but may be a wrapped message's
                # tail: only the other prefixes prove that a line starts a new record.
                ctx.prefixed = ctx.prefixed or name != "host"
                break
        else:
            break
    return ctx, text[pos:]


def logger_time(text: str, year: int | None) -> datetime | None:
    """The time a PyTorch or DeepSpeed logger header in front of a line says, if any.

    glog headers carry no year: ``year`` is used (None: no time from them).

    >>> logger_time("[rank4]:[E314 09:10:09.610966484 ProcessGroupNCCL.cpp:607] [Rank 4] "
    ...             "Watchdog caught collective operation timeout", 2025)
    datetime.datetime(2025, 3, 14, 9, 10, 9, 610966, tzinfo=datetime.timezone.utc)
    """
    ctx, _msg = _strip_prefixes(_clean(text), year)
    return ctx.ts


#: Prefixes a launcher or job runner puts on every physical line it forwards (so on each
#: piece of a line it hard-wrapped too), as opposed to the logger's own.
_LAUNCHER_PREFIXES: tuple[re.Pattern[str], ...] = (_RAY_RE, _RANK_RE, _TEE_RE, _HOST_RE)


def _launcher_prefix(text: str, within: str | None = None) -> str:
    """The launcher tags at the start of ``text`` (pdsh/srun host, ``[rankN]:``, torchrun's
    ``[default3]:``, Ray's ``(pid=..)``), up to the first logger prefix; with ``within``,
    only as far as they are also the start of ``within`` (a wrapped piece carries the
    runner's tags, not those that were inside the line it wrapped).

    >>> _launcher_prefix("node-3: [rank9]:[E1108 03:12:48.117 4411 x.cpp:1] [Rank 1] W")
    'node-3: [rank9]:'
    >>> _launcher_prefix("node-3: out: WorkNCCL(SeqNum=7", within="node-3: [rank9]:")
    'node-3: '
    """
    pos = 0
    for _ in range(_MAX_PREFIXES):
        for regex in _LAUNCHER_PREFIXES:
            m = regex.match(text, pos)
            if m is None or m.end() <= pos:
                continue
            end = m.end()
            if within is not None:
                # "[default3]: " takes a space the wrapped text may own: keep it there
                if not within.startswith(text[:end]) and text[end - 1] == " ":
                    end -= 1
                if not within.startswith(text[:end]):
                    continue
            pos = end
            break
        else:
            break
    return text[:pos]


def _other_host(host: str | None, mine: str | None) -> bool:
    """``host`` (a continuation's ``word: ``) names another machine than ``mine``.

    A wrapped message's own text can look like a pdsh tag (``work: 58, last ...``), so
    only a tag shaped like a host name (digits, ``-`` or ``.`` in it) counts.

    >>> _other_host("node-b", "node-a"), _other_host("work", "node-a"), _other_host("x1", None)
    (True, False, False)
    """
    if host is None or mine is None or host == mine:
        return False
    return any(c.isdigit() or c in "-." for c in host)


# --------------------------------------------------------------------------------------
# Numbers and times


def _int(value: str | None, bits: int = 64) -> int | None:
    """``int(value)`` when it fits a signed ``bits``-bit column, else ``None``."""
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    limit = 1 << (bits - 1)
    return number if -limit <= number < limit else None


def _numel(value: str | None) -> int | None:
    """NumelIn/NumelOut; the 2^64-1 "unknown" sentinel (and -1) become ``None``."""
    number = _int(value, 66)
    if number is None or number < 0 or number == _U64_MAX or number >= 1 << 63:
        return None
    return number


def _first(a: int | None, b: int | None) -> int | None:
    return a if a is not None else b


def _compat(a: object, b: object) -> bool:
    return a is None or b is None or a == b


def _same_host(a: str | None, b: str | None) -> bool:
    """Hosts match when equal or one is the other cut at a dot (pdsh name vs FQDN)."""
    if a is None or b is None or a == b:
        return True
    return a.startswith(b + ".") or b.startswith(a + ".")


def _glog_ts(
    mmdd: str, time: str, frac: str | None, year: int | None
) -> tuple[datetime | None, str]:
    """A glog ``MMDD``/``MDD`` stamp: month not zero-padded, so ``714`` is July 14."""
    if year is None:
        return None, "none"
    ts = to_dt(f"{year:04d}-{int(mmdd[:-2]):02d}-{mmdd[-2:]}", time, frac)
    return (ts, "logger_no_year") if ts is not None else (None, "none")


def _signal_name(exitcode: int | None) -> str | None:
    """torchelastic's own rule: a negative exit code is ``-signum``."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return None


# --------------------------------------------------------------------------------------
# Message patterns (applied to the text after the prefixes)

#: The watchdog timeout, 1.x to 2.8 (``NumelIn``/``NumelOut`` from 2.0, ``SeqNum``
#: from 1.10); the fields are read by :data:`_KV_RE` so new ones do not break it::
#:
#:     [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=57,
#:     OpType=_ALLGATHER_BASE, NumelIn=1024, NumelOut=16384, Timeout(ms)=600000) ran for
#:     600113 milliseconds before timing out.
_WD_RE = re.compile(
    r"(?:\[Rank (?P<rank>\d{1,9})\] )?Watchdog caught collective operation timeout: "
    r"WorkNCCL\((?P<fields>(?:[^()]|\(ms\)){1,600}?)\) ran for\s?(?P<ran>\d{1,19})\s?"
    r"milliseconds before timing out",
    re.ASCII,
)
_KV_RE = re.compile(r"(\w{1,40}(?:\(ms\))?)=([^,]{0,40})", re.ASCII)

#: ``[PG 2 Rank 6] Process group watchdog thread terminated with exception: <what>``
#: (``NCCL watchdog thread ...`` in 2.0-2.3).
_TERM_RE = re.compile(r"(?:NCCL|Process group) watchdog thread terminated with exception: ?")

#: Companion lines: where the PG stood when the watchdog fired.
#:
#:     [PG 1 Rank 2] Exception (either an error or timeout) detected by watchdog at work:
#:     2641, last enqueued NCCL work: 2643, last completed NCCL work: 2640.        (2.4-2.6)
#:     [PG 0 (default_pg) Rank 6] Timeout at NCCL work: 57, last enqueued NCCL work: 58,
#:     last completed NCCL work: 56.                                                (2.4)
#:     [PG ID 0 PG GUID 0(default_pg) Rank 3]  failure detected by watchdog at work
#:     sequence id: 48213 PG status: last enqueued work: 48215, last completed work: 48212
_EXC_DET_RE = re.compile(
    r"Exception \(either an error or timeout\) detected by watchdog at work: (?P<seq>\d{1,19}), "
    r"last enqueued NCCL work: (?P<enq>-?\d{1,19}), last completed NCCL work: (?P<comp>-?\d{1,19})",
    re.ASCII,
)
_TO_AT_RE = re.compile(
    r"Timeout at NCCL work: (?P<seq>\d{1,19}), last enqueued\s{1,4}NCCL work: (?P<enq>-?\d{1,19}), "
    r"last completed\s{1,4}NCCL work: (?P<comp>-?\d{1,19})",
    re.ASCII,
)
_FAIL_DET_RE = re.compile(
    r"failure detected by watchdog at work sequence id: (?P<seq>\d{1,19}) PG status: "
    r"last enqueued work: (?P<enq>-?\d{1,19}), last completed work: (?P<comp>-?\d{1,19})",
    re.ASCII,
)

#: ``[PG 0 Rank 3] Heartbeat monitor timed out! Process will be terminated after dumping
#: debug info. workMetaList_.size()=57`` (>= 2.3): outstanding works on this rank.
_HB_RE = re.compile(
    r"Heartbeat monitor timed out!.{0,300}?workMetaList_\.size\(\) ?= ?(?P<n>\d{1,19})", re.ASCII
)
_HB_LENIENT_RE = re.compile(r"Heartbeat monitor timed out!")

#: ``[PG 0 Rank 3] ProcessGroupNCCL's watchdog got stuck for 600 seconds without making
#: progress in monitoring enqueued collectives. ...``
_STUCK_RE = re.compile(
    r"watchdog got stuck for (?P<sec>\d{1,12}) seconds? without making progress", re.ASCII
)

#: The desync report (``TORCH_NCCL_DESYNC_DEBUG=1``, TraceUtils.h), one item a line::
#:
#:     [E ProcessGroupNCCL.cpp:1942]
#:     	 - [2] Timeout at collective: ALLREDUCE, #642
#:     	 - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:
#:     	   - [5] joined but didn't finish collective #436 (count from 1)
#:     	     [0, 1] finished collective #436, but didn't join collective #437 (count from 1)
#:     	 - To our best knowledge, ranks [4, 7] are the lagging ranks that caused this
#:     timeout. They never joined any collectives
_DESYNC_TO_RE = re.compile(
    r"\[(?P<rank>\d{1,9})\] Timeout at collective: (?P<op>\w{1,64}), #(?P<seq>\d{1,19})",
    re.ASCII,
)
_RANKS = r"\[(?P<ranks>[\d, ]{1,65536})\]"
_DESYNC_JOINED_RE = re.compile(
    _RANKS + r" joined but didn't finish collective #(?P<seq>\d{1,19})", re.ASCII
)
_DESYNC_FINISHED_RE = re.compile(
    _RANKS + r" finished collective #\d{1,19}, but didn't join collective #(?P<seq>\d{1,19})",
    re.ASCII,
)
_DESYNC_NEVER_RE = re.compile(_RANKS + r" are the lagging ranks that caused this timeout", re.ASCII)

#: ``NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, unhandled
#: system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3`` (C10D_NCCL_CHECK)
#: and ``NCCL error: remote process exited or there was a network error, NCCL version
#: 2.18.1`` (async errors); then ``ncclRemoteError: ...``, ``Last error:`` and its text.
_NCCL_ERR_RE = re.compile(r"NCCL error(?: in: (?P<where>[^\s,]{1,400}),|:) (?P<rest>.{0,4000})")
_NCCL_CODE_RE = re.compile(r"\s{0,8}(?P<code>nccl[A-Z]\w{0,40}): (?P<desc>.{0,1000})", re.ASCII)
_LAST_ERR_RE = re.compile(r"\s{0,8}Last error:(?P<text>.{0,2000})")

#: ``Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:565
#: (most recent call first):`` (every c10::Error's location line).
_EXC_RAISED = "Exception raised from "

#: torchelastic, before it kills the others: ``Sending process 48210 closing signal SIGTERM``.
_CLOSING_RE = re.compile(
    r"Sending process (?P<pid>\d{1,10}) closing signal (?P<sig>SIG[A-Z0-9]{1,10})", re.ASCII
)

#: The torchelastic agent's verdict (three header styles, all stripped as prefixes):
#: ``failed (exitcode: -6) local_rank: 1 (pid: 87) of binary: /opt/conda/bin/python``
_AGENT_RE = re.compile(
    r"failed \(exitcode: (?P<code>-?\d{1,10})\) local_rank: (?P<lr>\d{1,9}) "
    r"\(pid: (?P<pid>\d{1,10})\)",
    re.ASCII,
)

#: The ChildFailedError summary (>= 1.11; 1.9/1.10 print ``Root Cause:`` first and
#: ``Other Failures:``, fields ``time: ``, ``msg: "Signal 6 (SIGABRT) ..."``)::
#:
#:     torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
#:     ============================================================
#:     train.py FAILED
#:     ------------------------------------------------------------
#:     Failures:
#:     [1]:
#:       time      : 2024-09-27_03:12:48
#:       host      : gpu-node-07.cluster.local
#:       rank      : 13 (local_rank: 5)
#:       exitcode  : -6 (pid: 1184572)
#:       error_file: <N/A>
#:       traceback : Signal 6 (SIGABRT) received by PID 1184572
#:     ------------------------------------------------------------
#:     Root Cause (first observed failure):
#:     [0]:
#:       ...
#:     ============================================================
#:
#: ``[k]:`` is the entry's index, not the rank (``[1]:`` may hold ``rank : 2``).
_SUM_SECTION_RE = re.compile(
    r"\s{0,8}(?:(?P<root>Root Cause(?: \(first observed failure\))?)|(?:Other )?Failures):\s*$"
)
_SUM_ENTRY_RE = re.compile(r"\s{0,8}\[(?P<idx>\d{1,9})\]:\s*$", re.ASCII)
_SUM_FIELD_RE = re.compile(
    r"\s{0,8}(?P<key>time|host|rank|exitcode|error_file|traceback|msg)\s{0,12}:\s?(?P<val>.{0,2000})"
)
_SUM_RANK_RE = re.compile(r"(?P<rank>\d{1,9}) \(local_rank: (?P<lr>\d{1,9})\)", re.ASCII)
_SUM_EXIT_RE = re.compile(r"(?P<code>-?\d{1,10}) \(pid: (?P<pid>\d{1,10})\)", re.ASCII)
_SUM_TIME_RE = re.compile(r"(?P<date>\d{4}-\d{2}-\d{2})_(?P<time>\d{2}:\d{2}:\d{2})", re.ASCII)
_SUM_SIGNAL_RE = re.compile(r"Signal \d{1,3} \((?P<sig>SIG[A-Z0-9]{1,10})\)", re.ASCII)
_SUM_RULE_RE = re.compile(r"\s{0,8}(?:={5,}|-{5,}|\*{5,})\s*$")
_SUM_TITLE_RE = re.compile(r"\s{0,40}\S{1,500} FAILED\s*$")
_NO_OTHER = "<NO_OTHER_FAILURES>"

#: A torch version printed by an environment dump: ``PyTorch version: 2.1.0+cu121``
#: (collect_env), ``- PyTorch version (GPU?): 2.3.1 (True)`` (transformers-cli env),
#: ``torch version .................... 2.1.0+cu121`` (ds_report), ``torch==2.4.1`` (pip).
_VERSION_RES: tuple[re.Pattern[str], ...] = (
    re.compile(r"PyTorch version(?: \(GPU\?\))?: (?P<v>\d{1,3}\.\d{1,3}[\w.+-]{0,60})", re.ASCII),
    re.compile(r"torch version \.{0,80} ?(?P<v>\d{1,3}\.\d{1,3}[\w.+-]{0,60})", re.ASCII),
    re.compile(r"(?<![\w.-])torch==(?P<v>\d{1,3}\.\d{1,3}[\w.+-]{0,60})", re.ASCII),
)


# --------------------------------------------------------------------------------------
# Rows


@dataclass(slots=True)
class _Timeout:
    line_no: int
    host: str | None
    global_rank: int | None
    rank: int | None
    pg: str | None
    pg_desc: str | None
    seq: int | None
    op: str | None
    numel_in: int | None = None
    numel_out: int | None = None
    timeout_s: float | None = None
    ran_for_s: float | None = None
    last_enqueued: int | None = None
    last_completed: int | None = None
    ts: datetime | None = None
    ts_source: str = "none"


@dataclass(slots=True)
class _Failure:
    line_no: int
    host: str | None
    rank: int | None
    local_rank: int | None
    pid: int | None
    exitcode: int | None
    signal: str | None
    root_cause: bool
    source: str  # summary | agent
    ts: datetime | None = None
    ts_source: str = "none"


@dataclass(slots=True)
class _Event:
    line_no: int
    host: str | None
    global_rank: int | None
    rank: int | None
    pg: str | None
    kind: str
    seq: int | None = None
    op: str | None = None
    ranks: list[int] | None = None
    value: int | None = None
    message: str | None = None
    ts: datetime | None = None
    ts_source: str = "none"


@dataclass(slots=True)
class _Companion:
    """A companion line (EXC_DET / TO_AT / FAIL_DET), matched to its timeout at the end."""

    line_no: int
    variant: str
    ctx: _Ctx
    seq: int
    enqueued: int | None
    completed: int | None


@dataclass(slots=True)
class _Entry:
    """One ``[k]:`` entry of a ChildFailedError summary, filled field by field."""

    line_no: int
    host: str | None
    root_cause: bool
    fields: dict[str, str] = field(default_factory=dict)


_TS_RANK = {"none": 0, "logger_no_year": 1, "logger": 2}


@dataclass(frozen=True, slots=True)
class TorchResult:
    """What :func:`parse_torch` read from one file."""

    timeouts: pl.DataFrame  # TIMEOUTS_SCHEMA
    failures: pl.DataFrame  # FAILURES_SCHEMA
    events: pl.DataFrame  # TORCH_EVENTS_SCHEMA
    version: str | None  # a torch version if some line printed one, else None
    seen: bool  # at least one PyTorch-distributed / torchelastic line recognised
    parsed: int  # lines that contributed to a record (continuation lines included)
    malformed: int  # lines that began like a family but could not be parsed
    first_malformed: int | None  # line_no of the first of those


# --------------------------------------------------------------------------------------
# The parser


class _Outcome(Enum):
    """What a family made of a line.

    NONE: not this family after all (its needle matched, its trigger did not).
    PARSED: the line (and any lines glued to it) gave a record.
    MALFORMED: the line began like the family but its pattern failed, even after
    gluing the following lines.
    """

    NONE = 0
    PARSED = 1
    MALFORMED = 2


_Handler = Callable[["_Parser", int, _Ctx, str], tuple[_Outcome, str]]


class _Parser:
    """State of one pass over one file's delivered lines."""

    def __init__(self, lines: Iterable[tuple[int, str]], *, year: int | None) -> None:
        self.items: list[tuple[int, str]] = [(no, _clean(text)) for no, text in lines]
        self.year = year
        self._stripped: list[tuple[_Ctx, str] | None] = [None] * len(self.items)
        self.consumed = [False] * len(self.items)
        self.parsed: set[int] = set()
        self.malformed: set[int] = set()  # disjoint from parsed
        self.version: str | None = None
        self.timeouts: list[_Timeout] = []
        self._timeout_index: dict[tuple[str | None, int | None, int | None], list[_Timeout]] = {}
        self.companions: list[_Companion] = []
        self.failures: list[_Failure] = []
        self._failures_by_pid: dict[int, list[_Failure]] = {}
        self.events: list[_Event] = []
        # the header line of the record that unprefixed lines continue (desync report)
        self.head: _Ctx | None = None
        self.head_index: int | None = None
        self.desync_rank: int | None = None
        # the ChildFailedError summary being read
        self.summary_active = False
        self.section_root = False
        self.entry: _Entry | None = None

    # ---- line access ------------------------------------------------------------

    def stripped(self, i: int) -> tuple[_Ctx, str]:
        cached = self._stripped[i]
        if cached is None:
            cached = _strip_prefixes(self.items[i][1], self.year)
            self._stripped[i] = cached
        return cached

    def follows(self, j: int) -> bool:
        """Line ``j`` was delivered right after line ``j - 1`` (no gap) and is unread."""
        return (
            0 < j < len(self.items)
            and not self.consumed[j]
            and self.items[j][0] == self.items[j - 1][0] + 1
        )

    def take(self, first: int, last: int) -> None:
        """Mark lines ``first..last`` as part of a record and not to be read again."""
        for j in range(first, last + 1):
            self.consumed[j] = True
            self.parsed.add(j)

    def detail_text(self, j: int, head: _Ctx) -> str | None:
        """Line ``j`` as a continuation of the record ``head`` printed, or ``None``.

        A line with its own logger header, or from another host or rank, is not one.
        A lone ``word: `` taken for a pdsh host where ``head`` had none is the text's own
        (``socketStartConnect: Connect to ... failed``), so the whole line is kept.
        """
        ctx, text = self.stripped(j)
        if ctx.header or not (
            _same_host(ctx.host, head.host) and _compat(ctx.global_rank, head.global_rank)
        ):
            return None
        if ctx.host is not None and head.host is None and not ctx.prefixed:
            return self.items[j][1]
        return text

    def match(self, i: int, text: str, regex: re.Pattern[str]) -> tuple[re.Match[str] | None, str]:
        """``regex`` in ``text``, gluing hard-wrapped continuation lines when needed.

        A terminal or a pasting user cuts long lines anywhere (``Nume`` / ``lOut=1``,
        ``ran for 600052 `` / ``milliseconds``); the cut may have kept or dropped the
        space, so both joins are tried.  Only lines with no prefix of their own, right
        after this one, are glued.
        """
        m = regex.search(text)
        if m is not None:
            return m, text
        variants = [text]
        # A job runner that wraps long lines forwards each piece with its own tags
        # (``srun -l``'s ``3: ``, ``[default3]:``): a piece that starts with (the outer
        # part of) this line's tags, and holds no logger prefix after them, is glued
        # without them.
        tags = _launcher_prefix(self.items[i][1])
        for k in range(1, _MAX_JOIN + 1):
            j = i + k
            if not self.follows(j):
                break
            ctx, _ = self.stripped(j)
            nxt = self.items[j][1]
            shared = _launcher_prefix(nxt, within=tags) if tags else ""
            if shared:
                nxt = nxt[len(shared) :]
                ctx, _ = _strip_prefixes(nxt, self.year)
            elif _other_host(ctx.host, self.stripped(i)[0].host):
                break  # another host's line, not a piece of this one
            if ctx.prefixed or not nxt.strip():
                break
            variants = [v + sep + nxt for v in variants for sep in ("", " ")]
            variants = [v for v in variants if len(v) <= 2 * _MAX_CHARS]
            for joined in variants:
                m = regex.search(joined)
                if m is not None:
                    self.take(i + 1, j)
                    return m, joined
        return None, text

    # ---- the pass -----------------------------------------------------------------

    def run(self) -> None:
        for i, (line_no, raw) in enumerate(self.items):
            if i > 0 and self.items[i - 1][0] + 1 != line_no:
                self.head, self.head_index, self.desync_rank = None, None, None
            if self.consumed[i]:
                continue
            ctx, text = self.stripped(i)
            if ctx.header:
                self.head, self.head_index, self.desync_rank = ctx, i, None
            if self.version is None:
                self._version(text)
            outcomes: set[_Outcome] = set()
            present = {n for n in _ALL_NEEDLES if n in text}
            for family in _FAMILIES if present else _RAW_FAMILIES:
                if family.needles and present.isdisjoint(family.needles):
                    continue
                if not family.trigger_re.search(raw if family.on_raw else text):
                    continue
                outcome, text = family.handler(self, i, ctx, text)
                outcomes.add(outcome)
            if _Outcome.PARSED in outcomes:
                self.parsed.add(i)
            elif _Outcome.MALFORMED in outcomes:
                self.malformed.add(i)
            elif self.summary_active:  # host/error_file/[k]:/rules inside a summary
                if self.summary_line(i, ctx, text, implicit=False) is _Outcome.PARSED:
                    self.parsed.add(i)
        self._flush_entry()
        self._resolve_companions()

    def _version(self, text: str) -> None:
        if "version" not in text and "torch==" not in text:
            return
        for regex in _VERSION_RES:
            m = regex.search(text)
            if m is not None:
                self.version = m["v"].rstrip(".,;)-")
                return

    # ---- records ------------------------------------------------------------------

    def line_no(self, i: int) -> int:
        return self.items[i][0]

    def event(self, i: int, ctx: _Ctx, kind: str, **values: object) -> None:
        ev = _Event(
            line_no=self.line_no(i),
            host=ctx.host,
            global_rank=ctx.global_rank,
            rank=ctx.rank(),
            pg=ctx.pg,
            kind=kind,
            ts=ctx.ts,
            ts_source=ctx.ts_source,
        )
        for name, value in values.items():
            setattr(ev, name, value)
        self.events.append(ev)

    def add_timeout(self, row: _Timeout) -> None:
        """Add a watchdog timeout, or fill the row of the same work seen earlier.

        The same work is printed again in ``what():``, in "watchdog thread terminated
        with exception: ..." and in the Python traceback; those lines may lack the PG
        prefix or the ``[rankG]:`` prefix, so a missing value matches any.
        """
        key = (row.host, row.rank, row.seq)
        for old in self._timeout_index.get(key, ()):
            if _compat(old.pg, row.pg) and _compat(old.global_rank, row.global_rank):
                if _compat(old.op, row.op):
                    _fill(old, row)
                    return
        self._timeout_index.setdefault(key, []).append(row)
        self.timeouts.append(row)

    def add_failure(self, row: _Failure) -> None:
        """Add a process failure, or merge it with the same process seen before.

        The agent line (local rank, pid) and the summary entry (rank, local rank, pid)
        describe the same exit: they merge on pid, host and local rank.
        """
        same_pid = self._failures_by_pid.get(row.pid, []) if row.pid is not None else []
        for old in same_pid:
            if (
                _same_host(old.host, row.host)
                and _compat(old.local_rank, row.local_rank)
                and _compat(old.rank, row.rank)
            ):
                old.host = old.host or row.host
                old.rank = _first(old.rank, row.rank)
                old.local_rank = _first(old.local_rank, row.local_rank)
                old.exitcode = _first(old.exitcode, row.exitcode)
                old.signal = old.signal or row.signal
                old.root_cause = old.root_cause or row.root_cause
                if row.source == "summary" and old.source != "summary":
                    # The summary entry is the report of record (JSON first_line).
                    old.source = "summary"
                    old.line_no = row.line_no
                if _TS_RANK[row.ts_source] > _TS_RANK[old.ts_source]:
                    old.ts, old.ts_source = row.ts, row.ts_source
                return
        self.failures.append(row)
        if row.pid is not None:
            self._failures_by_pid.setdefault(row.pid, []).append(row)

    def _resolve_companions(self) -> None:
        """Fill last enqueued/completed from the companion lines; lone TO_AT -> a row."""
        by_ident: dict[tuple[str | None, int | None], list[_Timeout]] = {}
        for row in self.timeouts:
            by_ident.setdefault((row.host, row.rank), []).append(row)
        for comp in self.companions:
            ctx = comp.ctx
            target = self._companion_target(comp, by_ident.get((ctx.host, ctx.rank()), []))
            if target is not None:
                if target.last_completed is None and target.last_enqueued is None:
                    target.last_enqueued, target.last_completed = comp.enqueued, comp.completed
                target.pg = target.pg or ctx.pg
                target.pg_desc = target.pg_desc or ctx.pg_desc
                target.global_rank = _first(target.global_rank, ctx.global_rank)
                continue
            if comp.variant != "timeout_at":
                continue  # an error, not necessarily a timeout: an event only
            row = _Timeout(
                line_no=comp.line_no,
                host=ctx.host,
                global_rank=ctx.global_rank,
                rank=ctx.rank(),
                pg=ctx.pg,
                pg_desc=ctx.pg_desc,
                seq=comp.seq,
                op=None,
                last_enqueued=comp.enqueued,
                last_completed=comp.completed,
                ts=ctx.ts,
                ts_source=ctx.ts_source,
            )
            self.timeouts.append(row)
            by_ident.setdefault((row.host, row.rank), []).append(row)
        self.timeouts.sort(key=lambda r: r.line_no)

    def _companion_target(self, comp: _Companion, rows: list[_Timeout]) -> _Timeout | None:
        ctx = comp.ctx
        fits = [
            r for r in rows if _compat(r.pg, ctx.pg) and _compat(r.global_rank, ctx.global_rank)
        ]
        for row in fits:
            if row.seq == comp.seq:
                return row
        if comp.variant == "timeout_at":
            return None
        # The counters can differ (an observed 2.8 nightly): take the nearest timeout of
        # the same rank and PG that has no companion yet.
        near = [
            r
            for r in fits
            if r.last_completed is None
            and r.last_enqueued is None
            and abs(r.line_no - comp.line_no) <= _COMPANION_REACH
        ]
        return min(near, key=lambda r: abs(r.line_no - comp.line_no), default=None)

    # ---- ChildFailedError summary ------------------------------------------------

    def end_summary(self) -> None:
        if self.summary_active:
            self._flush_entry()
            self.summary_active = False
            self.section_root = False

    def _flush_entry(self) -> None:
        entry, self.entry = self.entry, None
        if entry is None:
            return
        f = entry.fields
        rank_m = _SUM_RANK_RE.match(f.get("rank", ""))
        exit_m = _SUM_EXIT_RE.match(f.get("exitcode", ""))
        if rank_m is None and exit_m is None:
            return
        exitcode = _int(exit_m["code"], 32) if exit_m else None
        text = f.get("traceback", "") + " " + f.get("msg", "")
        sig_m = _SUM_SIGNAL_RE.search(text)
        time_m = _SUM_TIME_RE.search(f.get("time", ""))
        ts = to_dt(time_m["date"], time_m["time"], None) if time_m else None
        host = f.get("host", "").strip()
        self.add_failure(
            _Failure(
                line_no=entry.line_no,
                host=host if host and host != "<N/A>" else entry.host,
                rank=_int(rank_m["rank"], 32) if rank_m else None,
                local_rank=_int(rank_m["lr"], 32) if rank_m else None,
                pid=_int(exit_m["pid"], 32) if exit_m else None,
                exitcode=exitcode,
                signal=sig_m["sig"] if sig_m else _signal_name(exitcode),
                root_cause=entry.root_cause,
                source="summary",
                ts=ts,
                ts_source="logger" if ts is not None else "none",
            )
        )

    def summary_line(self, i: int, ctx: _Ctx, text: str, *, implicit: bool) -> _Outcome:
        """Read one line of a ChildFailedError summary.

        With ``implicit`` a section header or an entry field opens a summary whose head
        was not delivered (a long summary seen through CANDIDATES only).
        """
        if "ChildFailedError:" in text:  # not "raise ChildFailedError(" in the traceback
            self.end_summary()
            self.summary_active = True
            return _Outcome.PARSED
        section = _SUM_SECTION_RE.match(text)
        fld = _SUM_FIELD_RE.match(text) if section is None else None
        if not self.summary_active:
            if not (implicit and (section is not None or fld is not None)):
                return _Outcome.NONE
            self.summary_active = True
        if section is not None:
            self._flush_entry()
            self.section_root = section["root"] is not None
            return _Outcome.PARSED
        if fld is not None:
            key = fld["key"]
            if self.entry is not None and key in self.entry.fields:
                self._flush_entry()  # the next entry, its "[k]:" line not delivered
            if self.entry is None:
                self.entry = _Entry(self.line_no(i), ctx.host, self.section_root)
            self.entry.fields[key] = fld["val"].strip()
            return _Outcome.PARSED
        if _NO_OTHER in text or _SUM_RULE_RE.match(text) or _SUM_TITLE_RE.match(text):
            self._flush_entry()
            return _Outcome.PARSED
        if _SUM_ENTRY_RE.match(text):
            self._flush_entry()
            self.entry = _Entry(self.line_no(i), ctx.host, self.section_root)
            return _Outcome.PARSED
        return _Outcome.NONE


def _fill(old: _Timeout, new: _Timeout) -> None:
    """Complete ``old`` with what ``new`` (a later print of the same work) adds."""
    old.pg = old.pg or new.pg
    old.pg_desc = old.pg_desc or new.pg_desc
    old.global_rank = _first(old.global_rank, new.global_rank)
    old.op = old.op or new.op
    old.numel_in = _first(old.numel_in, new.numel_in)
    old.numel_out = _first(old.numel_out, new.numel_out)
    if old.timeout_s is None:
        old.timeout_s = new.timeout_s
    if old.ran_for_s is None:
        old.ran_for_s = new.ran_for_s
    if old.ts is None and new.ts is not None:
        old.ts, old.ts_source = new.ts, new.ts_source


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


#: The caching allocator's out-of-memory message, both eras, up to its last figure
#: (hard-wrapped lines are glued until this matches; the advice that follows is not read).
#:
#: Samples (values invented)::
#:
#:     CUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; 79.15 GiB total capacity;
#:     74.10 GiB already allocated; 1.20 GiB free; 76.35 GiB reserved in total by PyTorch)
#:     CUDA out of memory. Tried to allocate 1.50 GiB. GPU 3 has a total capacity of
#:     79.14 GiB of which 610.00 MiB is free. Process 4242 has 78.52 GiB memory in use.
#:     Of the allocated memory 75.31 GiB is allocated by PyTorch, and 2.27 GiB is
#:     reserved by PyTorch but unallocated.
_OOM_RE = re.compile(
    r"CUDA out of memory\. Tried to allocate (?P<tried>[^.(]{1,40}?(?:\.\d{1,4} ?[KMGT]iB)?)"
    r"(?: \((?P<old>GPU \d{1,4};.{0,400}?)\)|\. (?P<new>GPU \d{1,4} has a total "
    r"capac.{0,1000}?is reserved by PyTorch but unallocated))",
    re.ASCII,
)
_OOM_TRIGGER = r"CUDA out of memory\. Tried to allocate |CUDA error: out of memory"
#: ``format_size``: ``0 bytes``, ``512 bytes``, ``12.00 MiB``, ``1.50 GiB``.
_OOM_SIZE = r"(\d{1,15}(?:\.\d{1,4})?) ?(bytes|[KMGTP]iB)"
_OOM_UNITS = {"bytes": 0, "KiB": 1, "MiB": 2, "GiB": 3, "TiB": 4, "PiB": 5}
_OOM_FIELDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(rx.replace("SIZE", _OOM_SIZE), re.ASCII))
    for name, rx in (
        ("tried_bytes", r"Tried to allocate SIZE"),
        ("total_bytes", r"SIZE total capacity|total capac\w{0,4} of SIZE"),
        ("free_bytes", r"SIZE free|of which SIZE is free"),
        ("allocated_bytes", r"SIZE already allocated|memory SIZE is allocated by PyTorch"),
        ("reserved_bytes", r"SIZE reserved in total by PyTorch"),
        ("unallocated_bytes", r"and SIZE is reserved by PyTorch but unallocated"),
        ("process_bytes", r"this process has SIZE memory in use"),
    )
)
_OOM_GPU_RE = re.compile(r"\(GPU (?P<a>\d{1,4});|\. GPU (?P<b>\d{1,4}) has a total", re.ASCII)


@dataclass(frozen=True, slots=True)
class CudaOom:
    """The figures of one ``CUDA out of memory`` message (bytes; ``None`` where unsaid).

    ``reserved_bytes`` is what PyTorch's caching allocator held (allocated plus cached);
    the newer message prints the cached part alone, which is added back here.
    """

    gpu: int | None
    tried_bytes: int | None
    total_bytes: int | None
    free_bytes: int | None
    allocated_bytes: int | None
    reserved_bytes: int | None


def parse_cuda_oom(text: str) -> CudaOom | None:
    """The figures of a ``CUDA out of memory`` message, or ``None`` when ``text`` holds none.

    >>> o = parse_cuda_oom("CUDA out of memory. Tried to allocate 1.50 GiB. GPU 3 has a "
    ...     "total capacity of 79.14 GiB of which 610.00 MiB is free. Of the allocated "
    ...     "memory 75.31 GiB is allocated by PyTorch, and 2.27 GiB is reserved by "
    ...     "PyTorch but unallocated.")
    >>> o.gpu, o.tried_bytes == 3 << 29, round(o.reserved_bytes / 2**30, 2)
    (3, True, 77.58)
    """
    k = text.find("CUDA out of memory")
    if k < 0:
        if "CUDA error: out of memory" in text:
            return CudaOom(None, None, None, None, None, None)
        return None
    body = text[k : k + 4000]
    got: dict[str, int | None] = {}
    for name, regex in _OOM_FIELDS:
        m = regex.search(body)
        # each alternative has its own (number, unit) pair: the one that matched
        pair = [g for g in m.groups() if g is not None] if m is not None else []
        got[name] = _oom_bytes(pair[0], pair[1]) if len(pair) == 2 else None
    reserved, alloc = got["reserved_bytes"], got["allocated_bytes"]
    cached = got["unallocated_bytes"]
    if reserved is None and alloc is not None and cached is not None:
        reserved = alloc + cached
    gm = _OOM_GPU_RE.search(body)
    gpu = _int(gm["a"] or gm["b"], 32) if gm else None
    return CudaOom(
        gpu, got["tried_bytes"], got["total_bytes"], got["free_bytes"], got["allocated_bytes"],
        reserved,
    )  # fmt: skip


def _oom_bytes(number: str, unit: str) -> int | None:
    try:
        return int(float(number) * 1024 ** _OOM_UNITS[unit])
    except (KeyError, ValueError, OverflowError):
        return None


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


# --------------------------------------------------------------------------------------
# The registry


@dataclass(frozen=True, slots=True)
class _Family:
    """One message family.

    ``trigger`` (regex syntax common to Python ``re`` and Rust ``regex``) says a line
    begins like the family; it goes into :data:`CANDIDATES`.  ``needles`` are literal
    substrings of every trigger match, checked first because ``in`` is far cheaper than
    a regex.  ``on_raw`` families look at the whole line, not the text after the prefixes.
    """

    name: str
    trigger: str
    needles: tuple[str, ...]
    handler: _Handler
    on_raw: bool = False
    trigger_re: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "trigger_re", re.compile(self.trigger, re.ASCII))


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
    parser = _Parser(lines, year=year)
    parser.run()
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
