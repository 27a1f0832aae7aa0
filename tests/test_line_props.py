"""Property-based tests of the NCCL line parser and of the vectorised first pass.

* ``parse_line`` never raises, whatever text it is given.
* A COLL line built from generated fields (format string of ``src/enqueue.cc``, see
  ``shared/formats/nccl.md`` §3.6) parses back to exactly those fields, with or
  without a launcher prefix and an NCCL timestamp in front.
* The fast path (polars, in ``run_analysis``) and the reference parser agree on the
  same generated lines: same calls, same ``by_op``, same fields row by row.
* Garbage in front of a line never changes its fields.
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ncclscope.analysis import run_analysis
from ncclscope.parsers.nccl.lines import Coll, ParsedLine, parse_line
from ncclscope.parsers.nccl.records import fits

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FILE_SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

#: ``%s`` of the COLL format: the names in ``src/collectives.cc`` (and a few of any version).
OPS = (
    "AllGather",
    "AllReduce",
    "AlltoAll",
    "Broadcast",
    "Gather",
    "Recv",
    "Reduce",
    "ReduceScatter",
    "Scatter",
    "Send",
)

HOSTS = st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True)
PIDS = st.integers(min_value=1, max_value=4_194_304)  # Linux pid_max
DEVS = st.one_of(st.integers(0, 15), st.integers(0, 2**31 - 1))  # garbage during shutdown
POINTERS = st.integers(min_value=0x1000, max_value=2**47 - 1).map(lambda v: f"0x{v:x}")


@dataclass(frozen=True)
class CollFields:
    host: str
    pid: int
    tid: int
    dev: int
    op: str
    opcount: int
    sendbuff: str
    recvbuff: str
    count: int
    dtype: int
    redop: int
    root: int
    comm: str
    nranks: int
    stream: str

    def text(self) -> str:
        """``"%s: opCount %lx sendbuff %p recvbuff %p count %zi datatype %d op %d root %d
        comm %p [nranks=%d] stream %p"`` behind the INFO header."""
        return (
            f"{self.host}:{self.pid}:{self.tid} [{self.dev}] NCCL INFO {self.op}: "
            f"opCount {self.opcount:x} sendbuff {self.sendbuff} recvbuff {self.recvbuff} "
            f"count {self.count} datatype {self.dtype} op {self.redop} root {self.root} "
            f"comm {self.comm} [nranks={self.nranks}] stream {self.stream}"
        )


@st.composite
def coll_fields(draw: st.DrawFn) -> CollFields:
    op = draw(st.sampled_from(OPS))
    nranks = draw(st.integers(1, 65536))
    buf = draw(POINTERS)
    # Send/Recv print the other buffer as (nil); root is the peer.
    sendbuff = "(nil)" if op == "Recv" else buf
    recvbuff = "(nil)" if op == "Send" else draw(POINTERS)
    pid = draw(PIDS)
    return CollFields(
        host=draw(HOSTS),
        pid=pid,
        tid=draw(st.one_of(st.just(pid), PIDS)),
        dev=draw(DEVS),
        op=op,
        opcount=draw(st.integers(0, 2**48)),
        sendbuff=sendbuff,
        recvbuff=recvbuff,
        count=draw(st.integers(0, 2**40)),
        dtype=draw(st.integers(0, 11)),
        redop=draw(st.integers(0, 4)),
        root=draw(st.integers(0, nranks - 1)),
        comm=draw(POINTERS),
        nranks=nranks,
        stream=draw(POINTERS),
    )


#: (name, template, launcher name the parser reports, carries the rank)
LAUNCHERS = (
    ("torchrun", "[default{r}]:", "torchrun", False),
    ("torch_rank", "[rank{r}]:", "torch_rank", True),
    ("srun", "{r}: ", "srun", True),
    ("pdsh", "{host}: ", "pdsh", False),
    ("openmpi", "[1,{r}]<stdout>:", "openmpi", True),
    ("ray", "(RayTrainWorker pid={r}, ip=10.0.0.1) ", "ray", False),
)


@st.composite
def launcher_prefix(draw: st.DrawFn, host: str) -> tuple[str, str | None, int | None]:
    """A launcher prefix (possibly none) and what the parser should say about it."""
    if not draw(st.booleans()):
        return "", None, None
    _name, template, launcher, has_rank = draw(st.sampled_from(LAUNCHERS))
    r = draw(st.integers(0, 4095))
    return template.format(r=r, host=host), launcher, (r if has_rank else None)


@st.composite
def nccl_timestamp(draw: st.DrawFn) -> tuple[str, datetime | None]:
    """``NCCL_DEBUG_TIMESTAMP_FORMAT="[%F %T.%Nf] "`` (N = 1..9) or the default ``[%F %T] ``."""
    if not draw(st.booleans()):
        return "", None
    when = draw(
        st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2099, 12, 31))
    ).replace(microsecond=0)
    digits = draw(st.integers(0, 9))
    text = when.strftime("%Y-%m-%d %H:%M:%S")
    micro = 0
    if digits:
        frac = draw(st.integers(0, 10**digits - 1))
        sub = f"{frac:0{digits}d}"
        text += "." + sub
        micro = int(sub[:6].ljust(6, "0"))
    return f"[{text}] ", when.replace(microsecond=micro, tzinfo=UTC)


@dataclass(frozen=True)
class GeneratedLine:
    fields: CollFields
    prefix: str
    launcher: str | None
    launcher_rank: int | None
    ts: datetime | None

    @property
    def text(self) -> str:
        return self.prefix + self.fields.text()


@st.composite
def generated_lines(draw: st.DrawFn) -> GeneratedLine:
    fields = draw(coll_fields())
    launch, launcher, lrank = draw(launcher_prefix(fields.host))
    ts_text, ts = draw(nccl_timestamp())
    return GeneratedLine(fields, launch + ts_text, launcher, lrank, ts)


def assert_fields(parsed: ParsedLine | None, f: CollFields) -> None:
    assert parsed is not None
    assert parsed.kind == "coll"
    header = parsed.header
    assert header is not None
    assert (header.host, header.pid, header.tid, header.dev, header.level) == (
        f.host,
        f.pid,
        f.tid,
        f.dev,
        "INFO",
    )
    assert parsed.body == Coll(
        op=f.op,
        opcount=f.opcount,
        count=f.count,
        dtype=f.dtype,
        redop=f.redop,
        root=f.root,
        comm=f.comm.lower(),
        nranks=f.nranks,
    )


# --------------------------------------------------------------------------------------
# never raises


@SETTINGS
@given(st.text())
def test_parse_line_never_raises_on_text(text: str) -> None:
    parse_line(text)


@SETTINGS
@given(st.binary(max_size=2048).map(lambda b: b.decode("utf-8", "replace")))
def test_parse_line_never_raises_on_decoded_binary(text: str) -> None:
    parse_line(text)


_HEADERISH = st.sampled_from(
    [
        "node-a:1:2 [0] NCCL INFO ",
        "node-a:1:2 [0] NCCL WARN ",
        "node-a:1:2 [0] misc/socket.cc:479 NCCL WARN ",
        "node-a:1:2 [0] a.cc:1 (f) NCCL WARN ",
        "node-a:1:2 [0] 12.5 f:3 NCCL TRACE ",
        "node-a:1:2 NCCL CALL ",
        "NCCL version 2.18.3+cuda12.1",
        "AllReduce: opCount ",
        " comm 0x1 [nranks=",
        "comm 0x1 rank 0 nranks 2 ",
        "- Init COMPLETE",
        "Channel 00/0 : 0[0] -> 1[1] via ",
        "x.cc:12 -> 3",
        "\x1b[32m",
        "\r",
        "[2025-01-01 00:00:00.1] ",
    ]
)


@SETTINGS
@given(st.lists(st.one_of(_HEADERISH, st.text(max_size=12)), max_size=12).map("".join))
def test_parse_line_never_raises_on_nccl_shaped_text(text: str) -> None:
    """Fragments of real line shapes glued together: the regex paths are exercised."""
    parse_line(text)


# --------------------------------------------------------------------------------------
# round trip


@SETTINGS
@given(coll_fields())
def test_coll_line_round_trips(f: CollFields) -> None:
    parsed = parse_line(f.text())
    assert_fields(parsed, f)
    assert parsed is not None
    assert parsed.prefix == ""
    assert parsed.ts is None
    assert parsed.launcher is None
    assert not parsed.spliced


@SETTINGS
@given(generated_lines())
def test_coll_line_round_trips_behind_launcher_and_timestamp(line: GeneratedLine) -> None:
    parsed = parse_line(line.text)
    assert_fields(parsed, line.fields)
    assert parsed is not None
    assert parsed.prefix == line.prefix
    assert parsed.launcher == line.launcher
    if line.launcher_rank is not None:
        assert parsed.launcher_rank == line.launcher_rank
    assert parsed.ts == line.ts
    assert parsed.ts_source == ("nccl" if line.ts is not None else "none")
    assert not parsed.spliced


@SETTINGS
@given(generated_lines(), st.sampled_from(["\n", "\r\n", ""]))
def test_line_ending_does_not_matter(line: GeneratedLine, eol: str) -> None:
    assert_fields(parse_line(line.text + eol), line.fields)


# --------------------------------------------------------------------------------------
# garbage in front


#: Characters a host name (or its ``<redacted>`` form) can end with.
HOST_LIKE = re.compile(r"[A-Za-z0-9._<>%/-]")


def _not_host_like_end(text: str) -> bool:
    return bool(text) and not HOST_LIKE.fullmatch(text[-1])


GARBAGE_TEXT = st.text(
    alphabet=st.characters(blacklist_characters="\n\x1b", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=200,
)


@SETTINGS
@given(
    GARBAGE_TEXT.map(lambda g: g + " ") | GARBAGE_TEXT.filter(lambda g: g[-1] in ":[]() \t"),
    generated_lines(),
)
def test_garbage_ending_in_a_separator_never_changes_fields(
    garbage: str, line: GeneratedLine
) -> None:
    """Text (no newline) ending in whitespace or a bracket/colon cannot touch the header."""
    assert_fields(parse_line(garbage + line.text), line.fields)


@SETTINGS
@given(GARBAGE_TEXT.filter(_not_host_like_end), generated_lines())
def test_garbage_not_ending_host_like_never_changes_fields(
    garbage: str, line: GeneratedLine
) -> None:
    """Any text (no newline) whose last character cannot end a host name.

    E.g. NUL padding left by a crash, U+FFFD from invalid UTF-8, a progress bar's ``|``.
    """
    assert_fields(parse_line(garbage + line.text), line.fields)


@SETTINGS
@given(
    st.binary(min_size=1, max_size=300)
    .map(lambda b: b.decode("utf-8", "replace").replace("\n", "").replace("\x1b", ""))
    .filter(_not_host_like_end),
    generated_lines(),
)
def test_binary_garbage_never_changes_fields(garbage: str, line: GeneratedLine) -> None:
    assert_fields(parse_line(garbage + line.text), line.fields)


@SETTINGS
@given(coll_fields(), coll_fields(), st.data())
def test_spliced_second_line_is_recovered(
    a: CollFields, b: CollFields, data: st.DataObject
) -> None:
    """``A[:k] + B``: B's fields (host up to the junk glued before it) are recovered."""
    text_a = a.text()
    k = data.draw(st.integers(1, len(text_a) - 1))
    head = text_a[:k]
    parsed = parse_line(head + b.text())
    assert parsed is not None
    assert parsed.kind == "coll"
    assert parsed.body == Coll(
        op=b.op,
        opcount=b.opcount,
        count=b.count,
        dtype=b.dtype,
        redop=b.redop,
        root=b.root,
        comm=b.comm.lower(),
        nranks=b.nranks,
    )
    header = parsed.header
    assert header is not None
    assert (header.pid, header.tid, header.dev) == (b.pid, b.tid, b.dev)
    assert header.host.endswith(b.host)


# --------------------------------------------------------------------------------------
# the fast path and the reference agree


def _workdir(tmp: str) -> Path:
    work = Path(tmp) / "work"
    work.mkdir()
    return work


_COMPARE = ("host", "pid", "op", "opcount", "count", "dtype", "redop", "root", "comm", "nranks")

FILLER = st.sampled_from(
    [
        "",
        "epoch 1 step 3 loss 0.25",
        "node-x:1:1 [0] NCCL INFO Using network IB",
        "node-x:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE",
    ]
)


@FILE_SETTINGS
@given(
    st.lists(st.tuples(generated_lines(), st.lists(FILLER, max_size=2)), min_size=1, max_size=25)
)
def test_fast_path_and_reference_agree(rows: list[tuple[GeneratedLine, list[str]]]) -> None:
    texts: list[str] = []
    expected: list[tuple[object, ...]] = []
    for line, filler in rows:
        texts.extend(filler)
        texts.append(line.text)
        parsed = parse_line(line.text)
        assert parsed is not None
        assert parsed.header is not None
        assert isinstance(parsed.body, Coll)
        body = parsed.body
        expected.append(
            (
                len(texts),
                parsed.header.host,
                parsed.header.pid,
                body.op,
                body.opcount,
                body.count,
                body.dtype,
                body.redop,
                body.root,
                body.comm,
                body.nranks,
                parsed.ts,
            )
        )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gen.log"
        path.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
        analysis = run_analysis([str(path)], workdir=_workdir(tmp)).analysis
        assert analysis.problems == []
        assert analysis.summary is not None
        assert analysis.collectives is not None
        got_rows = (
            analysis.collectives.select("line_no", *_COMPARE, "ts").sort("line_no").collect().rows()
        )
        summary = analysis.summary
        account = analysis.inputs.row(0, named=True)
    assert summary.calls == len(expected)
    assert summary.by_op == dict(sorted(Counter(e[3] for e in expected).items()))
    assert [tuple(r) for r in got_rows] == expected
    assert account["lines"] == len(texts)


@FILE_SETTINGS
@given(st.lists(generated_lines(), min_size=1, max_size=20))
def test_fast_path_counts_every_coll_line(lines: list[GeneratedLine]) -> None:
    """Every generated line is one call, and each is a parsed line of the input."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gen.log"
        path.write_text("".join(line.text + "\n" for line in lines), encoding="utf-8")
        analysis = run_analysis([str(path)], workdir=_workdir(tmp)).analysis
        account = analysis.inputs.row(0, named=True)
        assert analysis.summary is not None
        calls = analysis.summary.calls
    assert calls == len(lines)
    assert account["lines"] == len(lines)
    assert account["parsed"] == len(lines)
    assert account["unparsed"] == 0


def test_fast_path_and_reference_agree_on_the_timestamp_digits() -> None:
    """One explicit example per sub-second precision N of ``%Nf`` (and none)."""
    base = "node-a:7:7 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x2 count 4 "
    base += "datatype 7 op 0 root 0 comm 0xab [nranks=2] stream 0x3"
    stamps = ["[2025-03-14 09:05:37] "] + [
        f"[2025-03-14 09:05:37.{'987654321'[:n]}] " for n in range(1, 10)
    ]
    texts = [s + base.replace("opCount 1", f"opCount {k + 1:x}") for k, s in enumerate(stamps)]
    want = [parse_line(t).ts for t in texts]  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ts.log"
        path.write_text("".join(t + "\n" for t in texts))
        analysis = run_analysis([str(path)], workdir=_workdir(tmp)).analysis
        assert analysis.collectives is not None
        got = analysis.collectives.sort("line_no").select("ts").collect()["ts"].to_list()
    assert got == want
    assert all(ts is not None for ts in want)


# --------------------------------------------------------------------------------------
# numbers no column holds: counted, never fatal, the same in both paths

#: (field, values) that no column of its kind holds (pid/tid/root Int32, opcount/count
#: Int64, datatype/op Int16, nranks a count of ranks), and values at the very top of it.
_OVERFLOWS = {
    "pid": (2**31, 2**32, 10**20),
    "tid": (2**31, 10**20),
    "opcount": (2**63, 2**64, 16**24 - 1),
    "count": (2**63, 10**20),
    "dtype": (2**15, 10**20),
    "redop": (2**15, 10**20),
    "root": (2**31, 10**20),
    "nranks": (2**31, 10**20),
    "dev": (2**31, 10**20),
}
_TOPS = {"pid": 2**31 - 1, "opcount": 2**63 - 1, "count": 2**63 - 1, "root": 2**31 - 1}


@st.composite
def damaged_coll_fields(draw: st.DrawFn) -> CollFields:
    """A COLL line with one to three numbers too large for their columns (or at the top)."""
    f = draw(coll_fields())
    names = draw(st.lists(st.sampled_from(sorted(_OVERFLOWS)), min_size=1, max_size=3))
    changes: dict[str, int] = {}
    for name in names:
        top = draw(st.booleans()) and name in _TOPS
        changes[name] = _TOPS[name] if top else draw(st.sampled_from(_OVERFLOWS[name]))
    return replace(f, **changes)


#: Token index (in the line split on spaces) -> tokens the format never prints there: a
#: wrong sign, bad hex, a letter in a decimal, an ``[nranks=N]`` no column holds.  (Not
#: yet the same in both paths, so not drawn: a damaged ``[dev]``, op token, or ``N`` with
#: a letter or a sign, ``-0`` or ``+1``: the fast path keeps the row, the reference skips.)
_BAD_TOKENS = {
    1: ("[2147483648]", "[-1]"),
    6: ("-1a", "0x1a", "g1"),
    12: ("-5", "1a", "5.0"),
    14: ("-1", "x", "07x"),
    16: ("-1", "1e3"),
    18: ("1x", "--1"),
    21: ("[nranks=2147483648]", "[nranks=9999999999]", "[nranks=99999999999999999999]"),
}


@st.composite
def damaged_coll_text(draw: st.DrawFn) -> str:
    """A COLL line with numbers no column holds, or with a token its format never prints."""
    if draw(st.booleans()):
        return draw(damaged_coll_fields()).text()
    tokens = draw(coll_fields()).text().split(" ")
    for k in draw(st.lists(st.sampled_from(sorted(_BAD_TOKENS)), min_size=1, max_size=2)):
        tokens[k] = draw(st.sampled_from(_BAD_TOKENS[k]))
    return " ".join(tokens)


@FILE_SETTINGS
@given(
    st.lists(st.tuples(st.booleans(), coll_fields(), damaged_coll_text()), min_size=1, max_size=20)
)
def test_fast_path_and_reference_agree_with_overflowing_numbers(
    rows: list[tuple[bool, CollFields, str]],
) -> None:
    """Lines with a number too large for its column, a wrong sign or bad hex among good
    ones: the reference parser skips each (``fits``, or no grammar matches) and the fast
    path hands each to it, so the parsed rows are the reference's row for row, and every
    COLL line with a number too large is counted ``malformed``."""
    texts = [bad if damaged else good.text() for damaged, good, bad in rows]
    expected: list[tuple[object, ...]] = []
    overflowing = other = 0
    for k, text in enumerate(texts, start=1):
        parsed = parse_line(text)
        header = parsed.header if parsed is not None else None
        body = parsed.body if parsed is not None else None
        if not (isinstance(body, Coll) and header is not None and fits(header) and fits(body)):
            # a COLL line with a number no column holds is malformed; a line the COLL
            # grammar does not read may still be another INFO line
            overflowing += isinstance(body, Coll)
            other += 1
            continue
        fields = (body.op, body.opcount, body.count, body.dtype, body.redop, body.root)
        expected.append((k, header.host, header.pid, *fields, body.comm, body.nranks))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gen.log"
        path.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
        analysis = run_analysis([str(path)], workdir=_workdir(tmp)).analysis
        got: list[tuple[object, ...]] = []
        if analysis.collectives is not None:
            got = [
                tuple(r)
                for r in analysis.collectives.select("line_no", *_COMPARE)
                .sort("line_no")
                .collect()
                .rows()
            ]
        account = analysis.inputs.row(0, named=True)
    assert got == expected
    assert account["lines"] == len(texts)
    assert overflowing <= account["malformed"] <= other
    assert account["parsed"] + account["malformed"] == len(texts)
    assert account["parsed"] + account["unparsed"] == account["lines"]
