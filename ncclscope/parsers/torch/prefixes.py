"""What the prefixes in front of a PyTorch-distributed message say: host, rank, time.

Launchers (pdsh/srun ``host: ``, torchrun ``--tee``'s ``[default3]:``, ``[rank3]:``,
Ray's ``(pid=..)``) and loggers (glog, python logging, DeepSpeed's) put prefixes in
front of a message, nested in any order; :func:`_strip_prefixes` takes them off the
front of a line one by one.  Also the number and time helpers every family shares.

Sample::

    node-3: [rank9]:[E1108 03:12:48.117 4411 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog ...
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from ncclscope.parsers.common import to_dt

__all__: list[str] = []  # internal to the torch parser; lines.py is its interface

_MAX_CHARS = 1 << 16  # longest text looked at: a watchdog line is ~300 chars, a desync
# line lists ranks (~7 chars each); 64 Ki keeps a 10 MB junk line cheap.
_MAX_MSG = 2000  # longest message stored in the events table
_MAX_PREFIXES = 12  # prefixes stripped per line at most (real lines carry up to 6)
_MAX_JOIN = 3  # hard-wrapped continuation lines glued to one message at most
_MAX_DETAIL = 4  # lines after an NCCL error searched for its ``Last error:`` text
_COMPANION_REACH = 200  # lines between a watchdog line and a companion of another SeqNum
_U64_MAX = (1 << 64) - 1  # NumelIn/NumelOut printed for "unknown" (uint64 -1)


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
