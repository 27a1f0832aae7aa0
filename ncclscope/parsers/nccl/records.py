"""Second pass, Python side: the non-COLL lines into records, grouped per table.

The first pass leaves a few thousand lines (init, connections, warnings, banners) in
the text store; this module runs the reference line parser over them in file order
and collects what each table needs.  Everything here is per line and per process;
cross-rank identity is decided in ``identity.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime

import polars as pl

from ncclscope.parsers.nccl import errors as nccl_errors
from ncclscope.parsers.nccl.lines import (
    Chain,
    Coll,
    CommEvent,
    Connection,
    EnvSetting,
    Header,
    InitTimings,
    Message,
    NodeLayout,
    ParsedLine,
    RankHint,
    Record,
    RingList,
    Version,
    classify_info,
    comm_event_from,
    parse_line,
    transport_name,
)
from ncclscope.parsers.nccl.patterns import BINARY_RE, COMM_EVENT_RE
from ncclscope.schema import CONNECTIONS_SCHEMA, LINE_KIND

__all__ = [
    "TOO_LONG_BYTES",
    "ErrorGroup",
    "LineRecords",
    "ProcKey",
    "add_connection_lines",
    "add_plain_info_lines",
    "collect_records",
    "connection_lines",
    "fits",
    "plain_info_lines",
]

#: A process: (file_id, host, pid).  Host names repeat across nodes; the file keeps
#: two containers that both call themselves ``localhost`` with pid 7 apart.
ProcKey = tuple[int, str, int]

#: A return-code line this many lines after its thread's last error line starts a new
#: error: a chain is printed as the failure unwinds, within a few lines of its WARN
#: (other processes' lines interleave in a combined log, hence the slack).
_CHAIN_GAP_LINES = 2_000
#: A WARN this close after another of its thread (and no chain between) is its follow-up.
_HINT_GAP_LINES = 64

#: Longer than any NCCL line can be (NCCL's own buffer is 1 KiB up to 2.28).
TOO_LONG_BYTES = 1 << 16


@dataclass
class ErrorGroup:
    """A WARN (or an orphan return-code chain) and the chain lines that followed it."""

    proc: ProcKey
    tid: int
    dev: int | None
    line_no: int
    message: str
    src: str | None
    ts: datetime | None
    chain: list[str] = field(default_factory=list)
    code: int | None = None
    from_warn: bool = True
    closed: bool = False  # a chain line was seen: the next WARN starts a new group
    last_line: int = 0  # line of the group's last WARN or chain line


@dataclass
class LineRecords:
    """Everything the Python parser found, per table, plus the line account."""

    versions: list[tuple[int, str | None, int | None, Version]] = field(default_factory=list)
    comm_events: list[tuple[ProcKey, int, CommEvent]] = field(default_factory=list)
    #: ``Init timings`` lines (2.22+): a rank and size per process, no comm pointer
    init_timings: list[tuple[ProcKey, int, InitTimings]] = field(default_factory=list)
    layouts: list[tuple[ProcKey, NodeLayout]] = field(default_factory=list)
    connections: list[tuple[ProcKey, int, Connection]] = field(default_factory=list)
    #: connection lines read in polars (``add_connection_lines``), ``CONNECTIONS_SCHEMA``
    connection_frames: list[pl.DataFrame] = field(default_factory=list)
    rank_hints: dict[ProcKey, Counter[int]] = field(default_factory=dict)
    colls: list[tuple[ProcKey, int, int, Coll, datetime | None]] = field(default_factory=list)
    errors: list[ErrorGroup] = field(default_factory=list)
    env: dict[str, set[str]] = field(default_factory=dict)
    hosts: set[str] = field(default_factory=set)
    #: network plugins in use (``Using network IB``)
    networks: set[str] = field(default_factory=set)
    #: processes seen on intact (not spliced) lines parsed here
    procs: set[ProcKey] = field(default_factory=set)
    #: per file_id: reason -> lines
    unparsed: dict[int, Counter[str]] = field(default_factory=dict)
    #: per file_id: first line number per reason (to point the user at the damage)
    first_bad: dict[int, dict[str, int]] = field(default_factory=dict)
    parsed: Counter[int] = field(default_factory=Counter)
    #: per file_id: COLL lines the vectorised field reader parsed (not in ``parsed``)
    fast_calls: Counter[int] = field(default_factory=Counter)
    #: per file_id: lines that held two processes' writes glued together
    spliced: Counter[int] = field(default_factory=Counter)
    header_lines: int = 0
    header_lines_with_ts: int = 0

    def connection_table(self) -> pl.DataFrame:
        """Every connection line, both readers', as one ``CONNECTIONS_SCHEMA`` frame."""
        rows = [
            {
                "file_id": proc[0],
                "host": proc[1],
                "pid": proc[2],
                "channel": c.channel,
                "src": c.src,
                "dst": c.dst,
                "direction": c.direction,
                "transport": c.transport,
                "via": c.via,
                "line_no": line_no,
            }
            for proc, line_no, c in self.connections
        ]
        frames = [*self.connection_frames, pl.DataFrame(rows, schema=CONNECTIONS_SCHEMA)]
        return pl.concat(frames).sort("file_id", "line_no")

    def skip(self, file_id: int, line_no: int, reason: str) -> None:
        """Count a line that carries no record, remembering the first of each reason."""
        self.unparsed.setdefault(file_id, Counter())[reason] += 1
        self.first_bad.setdefault(file_id, {}).setdefault(reason, line_no)


def collect_records(
    rows: Iterable[tuple[int, int, int, str | None, int]],
    known_hosts: Iterable[str] = (),
    out: LineRecords | None = None,
) -> LineRecords:
    """Parse the text-store rows ``(file_id, line_no, kind, text, n_bytes)`` in file order.

    Only rows the first pass marked as carrying an NCCL marker need to come here; the
    others are counted by reason (blank, other text, binary, too long) the same way.
    ``known_hosts`` are host names seen on intact lines elsewhere (the fast COLL path);
    they repair the host of a spliced line, whose host may carry the other write's tail.
    Records are added to ``out`` when given.
    """
    out = LineRecords() if out is None else out
    open_groups: dict[tuple[ProcKey, int], ErrorGroup] = {}
    fast_hosts = set(known_hosts)
    for file_id, line_no, kind, text, n_bytes in rows:
        if kind == LINE_KIND["blank"] or text is None:
            out.skip(file_id, line_no, "blank")
            continue
        if n_bytes > TOO_LONG_BYTES:
            out.skip(file_id, line_no, "too_long")
            continue
        if kind != LINE_KIND["nccl"]:
            out.skip(file_id, line_no, "binary" if kind == LINE_KIND["binary"] else "other")
            continue
        parsed = parse_line(text)
        if parsed is None:
            reason = "binary" if BINARY_RE.search(text) else "malformed"
            out.skip(file_id, line_no, reason)
            continue
        if parsed.spliced:
            # The head of another process's write was lost in the splice; the tail is
            # a whole line whose host may carry the lost write's last characters.
            out.spliced[file_id] += 1
            out.first_bad.setdefault(file_id, {}).setdefault("spliced", line_no)
            hosts = sorted(out.hosts | fast_hosts, key=len, reverse=True)
            parsed = _repair_host(parsed, hosts)
        _take(out, parsed, file_id, line_no, open_groups)
    return out


def _repair_host(parsed: ParsedLine, hosts: list[str]) -> ParsedLine:
    header = parsed.header
    if header is None or header.host in hosts:
        return parsed
    for host in hosts:  # longest first: "node-1" must not win over "node-12"
        if header.host.endswith(host):
            return replace(parsed, header=replace(header, host=host))
    return parsed


_I16 = (-(2**15), 2**15 - 1)
_I32 = (-(2**31), 2**31 - 1)
_I64 = (-(2**63), 2**63 - 1)
_COUNT = (0, 2**31 - 1)

#: (field, lowest, highest) of the numbers a header or record carries: what their
#: columns hold (``schema.py``: pids, tids, ranks, channels Int32; COLL_STORE_SCHEMA's
#: opcount/count Int64, dtype/redop Int16).  ``None`` (not printed) always fits; a
#: tuple (a ring listing's ranks) fits when each of its numbers does.
_RANGES: dict[type, tuple[tuple[str, int, int], ...]] = {
    Header: (("pid", *_I32), ("tid", *_I32)),
    Coll: (
        ("opcount", *_I64),
        ("count", *_I64),
        ("dtype", *_I16),
        ("redop", *_I16),
        ("root", *_I32),
        ("nranks", *_COUNT),
    ),
    CommEvent: (("rank", *_I32), ("nranks", *_I32), ("cuda_dev", *_I32), ("nvml_dev", *_I32)),
    NodeLayout: (
        ("rank", *_I32),
        ("nranks", *_I32),
        ("nnodes", *_I32),
        ("local_ranks", *_I32),
        ("local_rank", *_I32),
    ),
    Connection: (("channel", *_I32), ("src", *_I32), ("dst", *_I32)),
    RingList: (("channel", *_I32), ("ranks", *_I32)),
    RankHint: (("rank", *_I32),),
    Chain: (("line", *_I32), ("code", *_I32)),
    InitTimings: (("rank", *_I32), ("nranks", *_I32)),
}


def fits(record: Header | Record) -> bool:
    """Every number of ``record`` fits its column.

    >>> fits(RankHint(rank=3, source="Trees")), fits(RankHint(rank=2**40, source="Trees"))
    (True, False)
    """
    for name, lo, hi in _RANGES.get(type(record), ()):
        value = getattr(record, name)
        if value is None:
            continue
        if isinstance(value, tuple):
            if not all(lo <= v <= hi for v in value):
                return False
        elif not lo <= value <= hi:
            return False
    return True


def _take(
    out: LineRecords,
    parsed: ParsedLine,
    file_id: int,
    line_no: int,
    open_groups: dict[tuple[ProcKey, int], ErrorGroup],
) -> None:
    header = parsed.header
    body = parsed.body
    if not fits(body) or (header is not None and not fits(header)):
        # A damaged number (two lines spliced inside it, a flipped byte) that no column
        # holds: the line is skipped and counted, the rest of the report goes on.
        out.skip(file_id, line_no, "malformed")
        return
    if header is None:
        if isinstance(body, Version):
            out.versions.append((file_id, None, None, body))
            out.parsed[file_id] += 1
        return
    out.parsed[file_id] += 1
    proc: ProcKey = (file_id, header.host, header.pid)
    if not parsed.spliced:
        out.hosts.add(header.host)
        out.procs.add(proc)
    out.header_lines += 1
    if parsed.ts_source == "nccl":
        out.header_lines_with_ts += 1
    if isinstance(body, Coll):
        out.colls.append((proc, line_no, header.tid, body, parsed.ts))
    elif isinstance(body, Chain):
        _chain(out, proc, header.tid, header.dev, line_no, body, parsed.ts, open_groups)
    elif isinstance(body, Message) and parsed.kind in ("warn", "ras"):
        key = (proc, header.tid)
        group = open_groups.get(key)
        if (
            group is not None
            and not group.closed
            and group.from_warn
            and line_no - group.last_line <= _HINT_GAP_LINES
        ):
            # Back-to-back WARNs of one thread describe one failure (e.g. a HINT line).
            group.last_line = line_no
            return
        src = f"{header.src_file}:{header.src_line}" if header.src_file else None
        group = ErrorGroup(proc, header.tid, header.dev, line_no, body.text, src, parsed.ts)
        group.last_line = line_no
        open_groups[key] = group
        out.errors.append(group)
    else:
        _take_plain(out, proc, line_no, parsed.kind, body)


def _take_plain(out: LineRecords, proc: ProcKey, line_no: int, kind: str, body: Record) -> None:
    """Record a body that needs neither the line's time nor its thread's state."""
    if isinstance(body, CommEvent):
        out.comm_events.append((proc, line_no, body))
    elif isinstance(body, InitTimings):
        out.init_timings.append((proc, line_no, body))
    elif isinstance(body, NodeLayout):
        out.layouts.append((proc, body))
    elif isinstance(body, Connection):
        out.connections.append((proc, line_no, body))
    elif isinstance(body, RankHint):
        out.rank_hints.setdefault(proc, Counter())[body.rank] += 1
    elif isinstance(body, Version):
        out.versions.append((proc[0], proc[1], proc[2], body))
    elif isinstance(body, EnvSetting):
        out.env.setdefault(body.name, set()).add(body.value)
    elif isinstance(body, Message) and kind == "info":
        if body.text.startswith("Using network "):
            out.networks.add(body.text.removeprefix("Using network ").strip())


def _chain(
    out: LineRecords,
    proc: ProcKey,
    tid: int,
    dev: int | None,
    line_no: int,
    body: Chain,
    ts: datetime | None,
    open_groups: dict[tuple[ProcKey, int], ErrorGroup],
) -> None:
    key = (proc, tid)
    group = open_groups.get(key)
    text = f"{body.file}:{body.line} -> {body.code}"
    if group is not None and line_no - group.last_line > _CHAIN_GAP_LINES:
        group = None  # a later failure on the same thread, not the end of that chain
    if group is None:
        # A failure returned up the stack with no WARN: still a root cause to report.
        name = nccl_errors.RESULT_CODES.get(body.code, f"code {body.code}")
        message = f"{name} returned at {body.file}:{body.line} (no WARN line before it)"
        group = ErrorGroup(proc, tid, dev, line_no, message, None, ts, from_warn=False)
        open_groups[key] = group
        out.errors.append(group)
    group.chain.append(text)
    group.code = body.code
    group.closed = True
    group.last_line = line_no


#: A whole connection line, for the vectorised reader (Rust regex, ASCII classes).
_CONN_LINE = (
    r"^(?P<pre>[^\r\x1b]*?)(?P<host>[A-Za-z0-9_<>.%/-]+):(?P<pid>[0-9]+):(?P<tid>[0-9]+) "
    r"\[(?P<dev>-?[0-9]+)\] NCCL INFO (?P<kind>Ring|Channel|CollNet) (?P<ch>[0-9]+)(?:/[0-9]+)? : "
    r"(?P<src>[0-9]+)(?:\[[0-9a-fA-F]+\])?(?: -> (?P<dst>[0-9]+)(?:\[[0-9a-fA-F]+\])?)?"
    r"(?: \[(?P<dir>send|receive)\])? via (?P<via>[^\r]+?) *$"
)
#: The default NCCL timestamp at the end of a prefix (as ``PREFIX_TS_RE``).
_TS_TAIL = r"[0-9]{4}-[0-9]{2}-[0-9]{2}[ T_][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,9})?\]? *$"


def _fit(*names: str) -> pl.Expr:
    """True where each named token (digits, or absent) fits an Int32 column.  A token
    too large for it (a damaged line) leaves its line to the reference parser, which
    counts it as malformed."""
    return pl.all_horizontal(
        pl.col(n).is_null() | pl.col(n).cast(pl.Int32, strict=False).is_not_null() for n in names
    )


def connection_lines(nccl_lines: pl.LazyFrame) -> pl.DataFrame:
    """Connection lines of the text store, parsed in polars.

    A 1,024-rank job prints tens of thousands of them (every channel of every ring and
    tree); they are half the non-COLL lines and all of one simple shape, so they skip
    the per-line Python parser.  Lines with two headers or control bytes stay with it.
    """
    text = pl.col("text")
    return (
        nccl_lines.filter(
            text.str.contains(" via ", literal=True)
            & (text.str.count_matches(" NCCL ", literal=True) == 1)
        )
        .select("file_id", "i", text.str.extract_groups(_CONN_LINE).alias("m"))
        .unnest("m")
        .filter(pl.col("host").is_not_null() & _fit("pid", "tid", "ch", "src", "dst"))
        .with_columns(pl.col("pre").str.contains(_TS_TAIL).alias("has_ts"))
        .collect(engine="streaming")
    )


def add_connection_lines(out: LineRecords, conns: pl.DataFrame) -> None:
    """Fold the vectorised connection lines into the records, as ``_take`` would."""
    vias = conns["via"].unique().to_list()
    named = pl.col("via").replace_strict(
        vias, [transport_name(v) for v in vias], return_dtype=pl.String
    )
    frame = conns.select(
        "file_id",
        "host",
        pl.col("pid").cast(pl.Int32),
        pl.col("ch").cast(pl.Int32).alias("channel"),
        pl.col("src").cast(pl.Int32),
        pl.col("dst").cast(pl.Int32),
        pl.col("dir").alias("direction"),
        pl.when(pl.col("kind") == "CollNet")
        .then(pl.lit("CollNet"))
        .otherwise(named)
        .alias("transport"),
        "via",
        pl.col("i").alias("line_no"),
    )
    out.connection_frames.append(frame.cast(CONNECTIONS_SCHEMA))
    for file_id, host, pid in frame.select("file_id", "host", "pid").unique().iter_rows():
        out.procs.add((file_id, host, pid))
        out.hosts.add(host)
    for file_id, n in conns.group_by("file_id").agg(pl.len()).iter_rows():
        out.parsed[file_id] += n
    out.header_lines += conns.height
    out.header_lines_with_ts += int(conns["has_ts"].sum())


#: First words of INFO messages whose record a table uses (``lines.INFO_FAMILIES``) or
#: that name the network; every other INFO message is only counted.  Rank 0's ring
#: listings (``Channel 00/32 : 0 1 2 ...``) are parsed by the reference parser but feed
#: no table yet, so they are counted here too.  ``Init timings`` name a process's rank
#: and size where its Init lines were cut away (``identity.py``).
_RECORD_WORDS = (
    "Init",
    "Ring",
    "CollNet",
    "Trees",
    "Tree",
    "comm",
    "[Rank",
    "[Proxy",
    "NCCL",
    "RAS",
    "Using",
)
_INFO_HEAD = (
    r"^(?P<pre>[^\r\x1b]*?)(?P<host>[A-Za-z0-9_<>.%/-]+):(?P<pid>[0-9]+):(?P<tid>[0-9]+) "
    r"\[-?[0-9]+\] NCCL INFO (?P<word>[^ ]*)"
)


def plain_info_lines(nccl_lines: pl.LazyFrame) -> pl.DataFrame:
    """INFO lines whose message no table needs (``Setting affinity``, ``Connected all
    rings``, ...): counted in polars instead of parsed one by one in Python."""
    text = pl.col("text")
    word = pl.col("word")
    return (
        nccl_lines.filter(
            (text.str.count_matches(" NCCL ", literal=True) == 1)
            & ~text.str.contains(" via ", literal=True)  # a connection line of any shape
        )
        .select("file_id", "i", text.str.extract_groups(_INFO_HEAD).alias("m"))
        .unnest("m")
        .filter(
            pl.col("host").is_not_null()
            & _fit("pid", "tid")
            & ~word.is_in(_RECORD_WORDS)
            & ~word.str.contains(":", literal=True)  # a return-code chain, a COLL op
            & ~word.str.starts_with("NCCL_")  # an environment setting
            & ~word.str.starts_with("nccl")  # ncclCommInitRank comm ...
        )
        .with_columns(pl.col("pre").str.contains(_TS_TAIL).alias("has_ts"))
        .select("file_id", "i", "host", pl.col("pid").cast(pl.Int32), "has_ts")
        .collect(engine="streaming")
    )


def add_plain_info_lines(out: LineRecords, plain: pl.DataFrame) -> None:
    """Count the lines ``plain_info_lines`` found, as ``_take`` would."""
    for file_id, host, pid in plain.select("file_id", "host", "pid").unique().iter_rows():
        out.procs.add((file_id, host, pid))
        out.hosts.add(host)
    for file_id, n in plain.group_by("file_id").agg(pl.len()).iter_rows():
        out.parsed[file_id] += n
    out.header_lines += plain.height
    out.header_lines_with_ts += int(plain["has_ts"].sum())


#: Header and message of a single-header INFO line, for ``info_messages``.
_INFO_MSG = (
    r"^(?P<pre>[^\r\x1b]*?)(?P<host>[A-Za-z0-9_<>.%/-]+):(?P<pid>[0-9]+):(?P<tid>[0-9]+) "
    r"\[-?[0-9]+\] NCCL INFO ?(?P<msg>[^\r\x1b]*)$"
)
#: Families whose records need the line's time or its thread's open error group: these
#: go through the whole reference parser.
_TIMED_KINDS = frozenset({"coll", "chain", "ras", "warn"})


def info_messages(nccl_lines: pl.LazyFrame) -> pl.DataFrame:
    """Single-header INFO lines with their header read in polars (``file_id``, ``i``,
    ``host``, ``pid``, ``has_ts``, ``msg``).

    A 1,024-rank job prints ~15 init lines per rank (Init START/COMPLETE, nNodes,
    Trees, environment): reading their headers here and only their messages in Python
    (``add_info_messages``) costs a quarter of the whole reference parser.
    """
    text = pl.col("text")
    return (
        nccl_lines.filter(
            (pl.col("n_bytes") <= TOO_LONG_BYTES)
            & (text.str.count_matches(" NCCL ", literal=True) == 1)
        )
        .select("file_id", "i", text.str.extract_groups(_INFO_MSG).alias("m"))
        .unnest("m")
        .filter(pl.col("host").is_not_null() & _fit("pid", "tid"))
        .select(
            "file_id",
            "i",
            "host",
            pl.col("pid").cast(pl.Int32),
            pl.col("pre").str.contains(_TS_TAIL).alias("has_ts"),
            "msg",
            # the most common init line, matched here rather than one by one
            pl.col("msg").str.extract_groups(COMM_EVENT_RE.pattern).alias("ev"),
        )
        .collect(engine="streaming")
    )


def add_info_messages(out: LineRecords, messages: pl.DataFrame) -> pl.DataFrame:
    """Record the messages of ``info_messages`` as ``_take`` would; returns the
    ``(file_id, i)`` of those recorded.  The others (a COLL line the field reader
    left, a return-code chain) need the whole reference parser."""
    done_files: list[int] = []
    done_lines: list[int] = []
    with_ts = 0
    for file_id, line_no, host, pid, has_ts, msg, ev in messages.iter_rows():
        kind: str
        body: Record
        if ev["comm"] is not None:
            kind, body = "comm_event", comm_event_from(**ev)
        else:
            kind, body = classify_info(msg)
        if kind in _TIMED_KINDS or not fits(body):
            # a number too large for its column: the reference parser counts the line
            continue
        proc: ProcKey = (file_id, host, pid)
        _take_plain(out, proc, line_no, kind, body)
        out.parsed[file_id] += 1
        out.procs.add(proc)
        out.hosts.add(host)
        with_ts += has_ts
        done_files.append(file_id)
        done_lines.append(line_no)
    out.header_lines += len(done_lines)
    out.header_lines_with_ts += with_ts
    return pl.DataFrame(
        {"file_id": done_files, "i": done_lines}, schema={"file_id": pl.UInt32, "i": pl.UInt32}
    )
