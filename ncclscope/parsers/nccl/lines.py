"""Pure NCCL line parser: one ``str`` in, one record (or ``None``) out.

This is the reference implementation.  The vectorised scanner handles the hot COLL
lines in polars and sends every other line here; tests check that both paths give
the same fields for the same lines.

Example::

    >>> rec = parse_line("[default3]:gpu-node-a:20116:20116 [3] NCCL INFO AllGather: "
    ...                  "opCount 1a sendbuff 0x7f00 recvbuff 0x7f80 count 4096 datatype 9 "
    ...                  "op 0 root 0 comm 0x55d1c2a4b2e0 [nranks=16] stream 0x55d1c29f7a10")
    >>> rec.header.host, rec.header.pid, rec.body.op, rec.body.opcount, rec.launcher_rank
    ('gpu-node-a', 20116, 'AllGather', 26, None)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from ncclscope.parsers.common import LineCleaner, to_dt
from ncclscope.parsers.nccl import patterns as pat
from ncclscope.parsers.zone import zoned_stamp

__all__ = [
    "Chain",
    "Coll",
    "CommEvent",
    "Connection",
    "EnvSetting",
    "Header",
    "InitTimings",
    "Message",
    "NodeLayout",
    "ParsedLine",
    "RankHint",
    "Record",
    "RingList",
    "Version",
    "clean_line",
    "parse_line",
    "parse_ts",
    "transport_name",
]

_MAX_LINE = 1 << 16  # NCCL lines are <= 1 KiB up to 2.28; longer text is not one line of NCCL


@dataclass(frozen=True, slots=True)
class Header:
    """``HOST:PID:TID [DEV] LEVEL`` of an NCCL line; ``dev`` is the CUDA ordinal, not the rank."""

    host: str
    pid: int
    tid: int
    dev: int | None
    level: str  # INFO | WARN | TRACE | CALL
    src_file: str | None = None  # WARN: __FILE__ relative to NCCL's src/
    src_line: int | None = None
    func: str | None = None  # WARN (2.30.7+) or TRACE function


@dataclass(frozen=True, slots=True)
class Version:
    """``NCCL version 2.18.3+cuda12.1`` (bare or INFO)."""

    version: str
    cuda: str
    suffix: str


@dataclass(frozen=True, slots=True)
class Coll:
    """A COLL line: one enqueued collective or point-to-point call on one rank."""

    op: str
    opcount: int
    count: int
    dtype: int
    redop: int
    root: int
    comm: str
    nranks: int


@dataclass(frozen=True, slots=True)
class CommEvent:
    """A communicator lifecycle line: Init/Destroy/Abort/Revoke, START or COMPLETE."""

    comm: str
    rank: int
    nranks: int
    event: str
    phase: str
    fn: str | None
    cuda_dev: int | None
    nvml_dev: int | None
    bus_id: str | None
    comm_id: str | None
    parent: str | None


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """``comm .. rank 9 nRanks 16 nNodes 2 localRanks 8 localRank 1 MNNVL 0`` (2.20+)."""

    comm: str
    rank: int
    nranks: int
    nnodes: int
    local_ranks: int
    local_rank: int


@dataclass(frozen=True, slots=True)
class Connection:
    """One transport connection between two ranks of a communicator (rank numbers of that comm)."""

    channel: int
    src: int
    dst: int | None
    direction: str | None  # send | receive | None (P2P/SHM)
    transport: str  # normalised name: NET/IB, P2P/IPC, SHM, ...
    via: str  # the text after "via", as printed


@dataclass(frozen=True, slots=True)
class RingList:
    """Rank 0's ``Channel 00/32 : 0 1 2 ...`` listing."""

    channel: int
    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RankHint:
    """A line that names the logging process's rank without a comm pointer (Trees, Ring, ...)."""

    rank: int
    source: str


@dataclass(frozen=True, slots=True)
class Chain:
    """A return-code line ``transport/net.cc:1286 -> 6`` that follows a failure up the stack."""

    file: str
    line: int
    code: int
    errstr: str | None
    thread: str | None
    func: str | None


@dataclass(frozen=True, slots=True)
class EnvSetting:
    """``NCCL_IB_TIMEOUT set by environment to 22.``."""

    name: str
    value: str


@dataclass(frozen=True, slots=True)
class InitTimings:
    """``Init timings - ncclCommInitRank: rank 3 nranks 16 total 1.21 (...)``."""

    rank: int
    nranks: int
    total_s: float


@dataclass(frozen=True, slots=True)
class Message:
    """Any other NCCL message (INFO text, WARN text, network selection, ...)."""

    text: str


Record = (
    Version
    | Coll
    | CommEvent
    | NodeLayout
    | Connection
    | RingList
    | RankHint
    | Chain
    | EnvSetting
    | InitTimings
    | Message
)


@dataclass(frozen=True, slots=True)
class ParsedLine:
    """One recognised line: where its text came from, its header, and its typed body.

    ``kind`` names the family (``coll``, ``comm_event``, ``warn``, ``banner``, ...).
    ``header`` is ``None`` only for the bare version banner.
    """

    kind: str
    header: Header | None
    body: Record
    prefix: str = ""
    ts: datetime | None = None
    ts_source: str = "none"  # nccl | logger | none
    launcher: str | None = None
    launcher_rank: int | None = None
    spliced: bool = False
    extra: dict[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------------------
# Cleaning and prefixes


#: NCCL's policy: the last non-blank ``\\r`` segment (a bar glued in front of a line),
#: the whole line otherwise (overlong lines are the scan's to count).
#: ``clean_line("Epoch 1: 42%|####  | 42/100\\rnode1:1:1 [0] NCCL INFO x")`` is
#: ``"node1:1:1 [0] NCCL INFO x"``.
clean_line = LineCleaner()


def parse_ts(prefix: str) -> tuple[datetime | None, str]:
    """The time in the text before an NCCL header (``prefix``) and where it came from:
    NCCL's own stamp ending the prefix (``nccl``), else a logger's (``logger``).

    >>> parse_ts("[2025-03-14 09:00:09.387136] ")
    (datetime.datetime(2025, 3, 14, 9, 0, 9, 387136, tzinfo=datetime.timezone.utc), 'nccl')
    """
    if len(prefix) < 19:  # shorter than "2025-03-14 09:05:37": no time in it
        return None, "none"
    # NCCL's stamp ends the prefix; searching its tail alone keeps this cheap.
    match = pat.PREFIX_TS_RE.search(prefix, max(0, len(prefix) - 40))
    if match:
        return to_dt(match["date"], match["time"], match["frac"], nccl=True), "nccl"
    # A collector's stamp that names its zone (kubectl logs --timestamps) is exact.
    zoned = zoned_stamp(prefix)
    if zoned is not None:
        return zoned[0], "logger"
    logger = re.search(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:[.,](\d{1,9}))?", prefix)
    if logger:
        return to_dt(logger[1], logger[2], logger[3]), "logger"
    return None, "none"


def _launcher(prefix: str) -> tuple[str | None, int | None]:
    if not prefix:
        return None, None
    for name, regex in pat.LAUNCHER_RES:
        match = regex.search(prefix)
        if match:
            groups = match.groupdict()
            rank = groups.get("rank")
            return name, int(rank) if rank is not None else None
    return None, None


# --------------------------------------------------------------------------------------
# Message families (registry: first match wins)

_TRANSPORT_ALIASES = {"AWS Libfabric": "OFI", "Libfabric": "OFI", "OFI": "OFI"}


def transport_name(via: str) -> str:
    """Normalise the text after ``via`` to NCCL's transport name without index or qualifiers.

    >>> transport_name("NET/IB/0/GDRDMA"), transport_name("P2P/IPC/read")
    ('NET/IB', 'P2P/IPC')
    >>> transport_name("direct shared memory"), transport_name("SHM/direct/direct")
    ('SHM', 'SHM')
    """
    if via.startswith("NET/"):
        name = via[4:].split("/", 1)[0]
        return "NET/" + _TRANSPORT_ALIASES.get(name, name)
    if via.startswith("P2P/"):
        kind = via[4:].split("/", 1)[0].split(" ", 1)[0]
        return "P2P/" + kind
    if via.startswith(("SHM", "direct shared memory")):
        return "SHM"
    if via.upper().startswith("COLLNET"):
        return "CollNet"
    if via.startswith("NVLS"):
        return "NVLS"
    return via.split("/", 1)[0]


def _coll(msg: str) -> Record | None:
    m = pat.COLL_RE.match(msg)
    if not m:
        return None
    return Coll(
        op=m["op"],
        opcount=int(m["opcount"], 16),
        count=int(m["count"]),
        dtype=int(m["dtype"]),
        redop=int(m["redop"]),
        root=int(m["root"]),
        comm=m["comm"].lower(),
        nranks=int(m["nranks"]),
    )


#: A signed decimal integer (``\d``: the digits int() reads).
_SIGNED = re.compile(r"-?\d+")


def _int_or_none(value: str | None) -> int | None:
    """``-3`` -> -3; None for anything else (``--3``, ``\u00b2``: a damaged value).

    >>> _int_or_none("-3"), _int_or_none("--3"), _int_or_none("\u00b2"), _int_or_none("x")
    (-3, None, None, None)
    """
    return int(value) if value is not None and _SIGNED.fullmatch(value) else None


def _comm_event(msg: str) -> Record | None:
    m = pat.COMM_EVENT_RE.match(msg)
    if not m:
        return None
    return comm_event_from(
        m["fn"], m["comm"], m["rank"], m["nranks"], m["kv"], m["event"], m["phase"]
    )


def comm_event_from(
    fn: str | None, comm: str, rank: str, nranks: str, kv: str, event: str, phase: str
) -> CommEvent:
    """The record of ``COMM_EVENT_RE``'s groups (matched here or in polars)."""
    pairs = dict(pat.KV_RE.findall(kv))
    return CommEvent(
        comm=comm.lower(),
        rank=int(rank),
        nranks=int(nranks),
        event=event,
        phase=phase,
        fn=fn,
        cuda_dev=_int_or_none(pairs.get("cudaDev")),
        nvml_dev=_int_or_none(pairs.get("nvmlDev")),
        bus_id=pairs.get("busId", "").lower() or None,
        comm_id=pairs.get("commId", "").lower() or None,
        parent=pairs.get("parent"),
    )


def _nnodes(msg: str) -> Record | None:
    m = pat.NNODES_RE.match(msg)
    if not m:
        return None
    return NodeLayout(
        comm=m["comm"].lower(),
        rank=int(m["rank"]),
        nranks=int(m["nranks"]),
        nnodes=int(m["nnodes"]),
        local_ranks=int(m["local_ranks"]),
        local_rank=int(m["local_rank"]),
    )


def _connection(msg: str) -> Record | None:
    if " via " not in msg:
        return None
    m = pat.CONN_RE.match(msg)
    if not m:
        return None
    via = m["via"]
    if m["kind"] == "CollNet":
        transport = "CollNet"
    else:
        transport = transport_name(via)
    return Connection(
        channel=int(m["ch"]),
        src=int(m["src"]),
        dst=_int_or_none(m["dst"]),
        direction=m["dir"],
        transport=transport,
        via=via,
    )


def _ring_list(msg: str) -> Record | None:
    m = pat.RING_LIST_RE.match(msg)
    if not m or not m["ranks"].strip():
        return None
    return RingList(channel=int(m["ch"]), ranks=tuple(int(x) for x in m["ranks"].split()))


def _rank_hint(msg: str) -> Record | None:
    m = pat.TREE_RANK_RE.match(msg)
    if m:
        source = "trees" if m["trees"] is not None else "graph"
        return RankHint(rank=int(m["trees"] or m["graph"]), source=source)
    proxy = re.match(r"^\[Proxy Service (\d+)\]", msg)
    if proxy and "Failed" not in msg:
        return RankHint(rank=int(proxy[1]), source="proxy")
    return None


def _chain(msg: str) -> Record | None:
    m = pat.CHAIN_RE.match(msg)
    if not m:
        return None
    return Chain(
        file=m["file"],
        line=int(m["line"]),
        code=int(m["code"]),
        errstr=m["errstr"],
        thread=m["thread"],
        func=m["func"],
    )


def _version(msg: str) -> Record | None:
    m = pat.BANNER_RE.match(msg)
    if not m:
        return None
    return Version(version=m["version"], cuda=m["cuda"], suffix=m["suffix"])


def _env(msg: str) -> Record | None:
    m = pat.ENV_RE.match(msg)
    return EnvSetting(name=m["name"], value=m["value"]) if m else None


def _init_timings(msg: str) -> Record | None:
    m = pat.INIT_TIMINGS_RE.match(msg)
    if not m:
        return None
    return InitTimings(rank=int(m["rank"]), nranks=int(m["nranks"]), total_s=float(m["total"]))


_RAS_RE = re.compile(r"^RAS (?:declaring peer \S+ as DEAD|collective .*timeout warning)")


def _ras(msg: str) -> Record | None:
    """RAS (2.24+) verdicts printed at INFO: ``RAS declaring peer 10.0.0.2<41234> as DEAD;
    rasDeadPeersHash 0x1f2e`` and ``RAS collective ... timeout warning (5s) -- 1 responses
    missing``.  They are errors even at INFO level."""
    return Message(msg.strip()) if _RAS_RE.match(msg) else None


#: (kind, parser) pairs for INFO messages, most frequent first; the first hit wins.
INFO_FAMILIES: tuple[tuple[str, Callable[[str], Record | None]], ...] = (
    ("coll", _coll),
    ("connection", _connection),
    ("chain", _chain),
    ("comm_event", _comm_event),
    ("node_layout", _nnodes),
    ("ring_list", _ring_list),
    ("rank_hint", _rank_hint),
    ("version", _version),
    ("env", _env),
    ("init_timings", _init_timings),
    ("ras", _ras),
)


# --------------------------------------------------------------------------------------
# The line parser


def parse_line(line: str) -> ParsedLine | None:
    """Parse one physical log line; ``None`` when it holds no NCCL record.

    The header is searched anywhere in the line: everything before it is the prefix
    (launcher tags, timestamps, a logger header).  When two NCCL headers appear, two
    processes' writes were spliced together: the last header starts the complete line.
    """
    if len(line) > _MAX_LINE:
        return None
    text = clean_line(line)
    if text.count(" NCCL ") > 1:
        # Two headers: two processes' writes spliced; the last one starts a whole line.
        headers = list(pat.HEADER_RE.finditer(text))
    else:
        # One header at most: stop at the first (scanning the rest of a long message
        # with the header pattern is what made this parser slow).
        first = pat.HEADER_RE.search(text)
        headers = [first] if first else []
    if not headers:
        m = pat.BANNER_RE.search(text)
        if m and "compiled with" not in text:
            prefix = text[: m.start()]
            ts, ts_source = parse_ts(prefix)
            launcher, lrank = _launcher(prefix)
            return ParsedLine(
                kind="banner",
                header=None,
                body=Version(version=m["version"], cuda=m["cuda"], suffix=m["suffix"]),
                prefix=prefix,
                ts=ts,
                ts_source=ts_source,
                launcher=launcher,
                launcher_rank=lrank,
            )
        return None
    hm = headers[-1]
    prefix = text[: hm.start()]
    msg = text[hm.end() :]
    if hm["warn"]:
        level = "WARN"
    elif hm["trace"]:
        level = "TRACE"
    else:
        level = hm["level"]
    header = Header(
        host=hm["host"],
        pid=int(hm["pid"]),
        tid=int(hm["tid"]),
        dev=_int_or_none(hm["dev"]),
        level=level,
        src_file=hm["src"] or hm["tfunc"],
        src_line=_int_or_none(hm["srcline"] or hm["tline"]),
        func=hm["func"],
    )
    ts, ts_source = parse_ts(prefix)
    launcher, lrank = _launcher(prefix)
    kind, body = _classify(level, msg)
    return ParsedLine(
        kind=kind,
        header=header,
        body=body,
        prefix=prefix,
        ts=ts,
        ts_source=ts_source,
        launcher=launcher,
        launcher_rank=lrank,
        spliced=len(headers) > 1,
    )


#: Which families can start with a given first word; the rest of INFO_FAMILIES is tried
#: for any other word (chain lines start with a source path, so they have no fixed word).
_BY_FIRST_WORD: dict[str, tuple[str, ...]] = {
    "Channel": ("connection", "ring_list"),
    "Ring": ("connection", "rank_hint"),
    "CollNet": ("connection",),
    "Trees": ("rank_hint",),
    "Tree": ("rank_hint",),
    "comm": ("comm_event", "node_layout"),
    "[Rank": ("comm_event",),
    "[Proxy": ("rank_hint",),
    "NCCL": ("version",),
    "Init": ("init_timings",),
    "RAS": ("ras",),
}
_FAMILY = dict(INFO_FAMILIES)
_OTHER_WORD = ("chain", "comm_event", "env")  # "ncclCommInitRank comm ...", "NCCL_IB_HCA ..."


def classify_info(msg: str) -> tuple[str, Record]:
    """The family and record of an INFO message (the text after ``NCCL INFO ``).

    >>> classify_info("Using network IB")
    ('info', Message(text='Using network IB'))
    """
    return _classify("INFO", msg)


def _classify(level: str, msg: str) -> tuple[str, Record]:
    if level == "WARN":
        return "warn", Message(msg.strip())
    if level == "INFO":
        word = msg.split(" ", 1)[0]
        kinds = _BY_FIRST_WORD.get(word)
        if kinds is None:
            kinds = ("env",) if word.startswith("NCCL_") else _OTHER_WORD
        for kind in ("coll", *kinds) if word.endswith(":") else kinds:
            record = _FAMILY[kind](msg)
            if record is not None:
                return kind, record
        return "info", Message(msg.strip())
    return level.lower(), Message(msg.strip())
