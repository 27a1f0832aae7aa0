"""Fuzzing every text reader with damaged logs (issue #17).

Valid logs of each grammar come from the project's generator (``ncclscope synth``: NCCL
2.7 to 2.27 INIT, connection, COLL, P2P and WARN lines in each era's format, PyTorch
watchdog and torchrun lines of 2.1 to 2.7, DeepSpeed timer, throughput and config lines
of both timer eras) and from the shipped fixtures; hypothesis then damages them the
ways logs get damaged: a flipped byte, a number no column holds, a line spliced from
two, a cut, binary junk, a giant line, NUL padding, a line in UTF-16, launcher prefixes.

Properties, for every damaged file:

* no exception escapes ``run_analysis``, and the JSON report is valid
  (``json.dumps(..., allow_nan=False)``, the ``schema`` key present);
* the inputs accounting holds: ``parsed + unparsed == lines``, and ``unparsed`` is the
  sum of its reasons;
* nothing is lost: with k lines damaged in place, at least ``parsed - k`` lines are
  still parsed, and every COLL row of an undamaged line is still there, field for field.

Profiles: ``ci`` (the default: a few hundred examples in all, derandomized, well under
a minute) and ``long`` (``NCCLSCOPE_FUZZ=long``: 50 times the examples, random unless
``CI=true``).  The long run over the fixtures is ``benchmarks/fuzz_inputs.py``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ncclscope.analysis import run_analysis
from ncclscope.cli import cli
from ncclscope.export.json_report import to_json_dict
from ncclscope.parsers.deepspeed.lines import parse_deepspeed
from ncclscope.parsers.nccl.lines import parse_line
from ncclscope.parsers.torch.lines import parse_torch

REPO = Path(__file__).resolve().parent.parent

_LONG = os.environ.get("NCCLSCOPE_FUZZ", "ci") == "long"
_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
settings.register_profile(
    "fuzz-ci",
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "fuzz-long",
    deadline=None,
    derandomize=_CI,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_PROFILE = settings.get_profile("fuzz-long" if _LONG else "fuzz-ci")


def fuzz(examples: int) -> settings:
    """The profile's settings with ``examples`` examples (50 times that in ``long``)."""
    return settings(_PROFILE, max_examples=examples * (50 if _LONG else 1))


# --------------------------------------------------------------------------------------
# valid logs of each grammar


#: (name, synth arguments): each era's NCCL formats, with PyTorch and DeepSpeed lines.
_SYNTH = (
    ("nccl-2.7-pdsh-ib", "--era 2.7 --launcher pdsh --ib-error node-1:2"),
    ("nccl-2.18-srun-ds-old", "--era 2.18 --launcher srun --framework deepspeed --ds-era old "
     "--zero-stage 2 --steps-per-print 1"),
    ("nccl-2.21-torch-2.1", "--era 2.21 --framework torch --torch-era 2.1 --stop-rank 1:3"),
    ("nccl-2.26-ts-torch-2.4", "--era 2.26 --timestamps --launcher rank --framework torch "
     "--torch-era 2.4 --dead-process 3:4"),
    ("nccl-2.27-ts-ds-new", "--era 2.27 --timestamps --launcher torchrun --framework deepspeed "
     "--warns 2 --comms-summary --steps-per-print 1"),
    ("nccl-2.27-torch-2.7-desync", "--era 2.27 --timestamps --framework torch --torch-era 2.7 "
     "--stop-rank 2:3 --desync-report"),
)  # fmt: skip
#: Hand-written fixtures in the real formats (sockets era, watchdog, DeepSpeed eras).
_FIXTURES = (
    "sockets-old-24/node1.3101",
    "watchdog-only-mismatch/train.log",
    "zero2-timers-eras/run1-ds0.9.5.log",
    "ib-completion-error/train.log",
)
#: Send/Recv lines (P2P, the COLL format with the peer as root) and their init lines.
_P2P = [
    "node-a:101:101 [0] NCCL INFO NCCL version 2.27.3+cuda12.4",
    "node-a:101:101 [0] NCCL INFO comm 0x55001 rank 0 nranks 2 cudaDev 0 busId 8000 "
    "commId 0xabc - Init COMPLETE",
    "node-a:102:102 [1] NCCL INFO comm 0x55002 rank 1 nranks 2 cudaDev 1 busId 18000 "
    "commId 0xabc - Init COMPLETE",
] + [
    f"node-a:{101 + r}:{101 + r} [{r}] NCCL INFO {op}: opCount {k:x} "
    f"sendbuff {'0x7f00' if op == 'Send' else '(nil)'} "
    f"recvbuff {'(nil)' if op == 'Send' else '0x7f01'} count 1024 datatype 7 op 0 "
    f"root {1 - r} comm 0x5500{r + 1} [nranks=2] stream 0x66"
    for k in range(4)
    for r in range(2)
    for op in ["Send" if (r + k) % 2 == 0 else "Recv"]
]


@functools.cache
def _bases_dir() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="ncclscope-fuzz-bases-"))
    runner = CliRunner()
    for name, args in _SYNTH:
        out = folder / name
        common = "--ranks 4 --hosts 2 --steps 2 --layers 1 --non-nccl-frac 0.02 --seed 3"
        result = runner.invoke(cli, ["synth", "--out", str(out), *common.split(), *args.split()])
        assert result.exit_code == 0, result.output
    return folder


@functools.cache
def bases() -> dict[str, list[bytes]]:
    """Every base log's lines (no line ends), by name."""
    out: dict[str, list[bytes]] = {}
    for name, _args in _SYNTH:
        (log,) = (_bases_dir() / name).glob("*.log")
        out[name] = log.read_bytes().split(b"\n")[:-1]
    for rel in _FIXTURES:
        out[rel] = (REPO / "fixtures" / rel).read_bytes().split(b"\n")[:-1]
    out["p2p"] = [line.encode() for line in _P2P]
    return out


# --------------------------------------------------------------------------------------
# damage


HUGE = (
    "99999999999999999999",
    "18446744073709551616",
    "9223372036854775808",
    "4294967296",
    "2147483648",
    "-99999999999999999999",
    "-1",
    # legal for their column, absurd as data
    "0",
    "2147483647",
    "9223372036854775807",
    "7fffffffffffffff",
    "1e308",
    # digits int() cannot read, or reads but a regex or polars does not
    "1\u00b2",
    "\uff15",
    "\u0661\u0662",
    "9" * 40,
    "ffffffffffffffffffffffff",
)
_NUMBER = re.compile(rb"-?[0-9a-fA-F]*[0-9][0-9a-fA-F]*")


def _clean(raw: bytes) -> bytes:
    """No line end inside a damaged line: it must stay one line."""
    return raw.replace(b"\n", b" ").replace(b"\r", b" ")


@st.composite
def damaged_line(draw: st.DrawFn, line: bytes, other: bytes) -> bytes:
    """``line`` damaged one way (``other``: a second line to splice in)."""
    how = draw(
        st.sampled_from(
            (
                "overflow",
                "overflow",
                "overflow",
                "flip",
                "splice",
                "cut",
                "binary",
                "giant",
                "nul",
                "utf16",
                "prefix",
            )
        )
    )
    if how == "overflow":
        runs = list(_NUMBER.finditer(line))
        if not runs:
            return line + draw(st.sampled_from(HUGE)).encode()
        chosen = draw(st.lists(st.sampled_from(runs), min_size=1, max_size=3, unique_by=id))
        out = line
        for m in sorted(chosen, key=lambda m: m.start(), reverse=True):
            out = out[: m.start()] + draw(st.sampled_from(HUGE)).encode() + out[m.end() :]
        return out
    if how == "flip" and line:
        k = draw(st.integers(0, len(line) - 1))
        bit = 1 << draw(st.integers(0, 7))
        return _clean(line[:k] + bytes([line[k] ^ bit]) + line[k + 1 :])
    if how == "splice":
        return line[: draw(st.integers(0, len(line)))] + other[draw(st.integers(0, len(other))) :]
    if how == "cut":
        return line[: draw(st.integers(0, len(line)))]
    if how == "binary":
        junk = draw(st.binary(min_size=1, max_size=200))
        return _clean(junk + line[draw(st.integers(0, len(line))) :])
    if how == "giant":
        return line * draw(st.sampled_from((2, 50, 2000)))
    if how == "nul":
        return b"\x00" * draw(st.integers(1, 300)) + line
    if how == "utf16":
        return _clean(line.decode("utf-8", "replace").encode("utf-16-le"))
    prefix = draw(st.sampled_from(("[default3]:", "[rank7]:", "3: ", "[1,3]<stdout>:", "\x1b[31m")))
    return prefix.encode() + line


@dataclass(frozen=True)
class Damaged:
    """A base log with ``damaged`` (0-based line indices) replaced in place."""

    base: str
    lines: list[bytes]
    damaged: frozenset[int]


@st.composite
def damaged_logs(draw: st.DrawFn, base_names: tuple[str, ...] | None = None) -> Damaged:
    name = draw(st.sampled_from(base_names or tuple(bases())))
    lines = list(bases()[name])
    n = draw(st.integers(1, min(8, len(lines))))
    where = draw(st.lists(st.integers(0, len(lines) - 1), min_size=n, max_size=n, unique=True))
    for k in where:
        other = lines[draw(st.integers(0, len(lines) - 1))]
        lines[k] = draw(damaged_line(lines[k], other))
    return Damaged(name, lines, frozenset(where))


# --------------------------------------------------------------------------------------
# analysing one file


@dataclass(frozen=True)
class Outcome:
    account: dict[str, Any]
    coll: list[tuple[Any, ...]]
    doc: dict[str, Any]


_COLL = ("line_no", "host", "pid", "op", "opcount", "count", "dtype", "redop", "root", "comm")


def analyse(data: bytes, name: str = "damaged.log") -> Outcome:
    """``analyze --format json`` in process; fails the test on any exception."""
    with tempfile.TemporaryDirectory(prefix="ncclscope-fuzz-") as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        work = Path(tmp) / "work"
        work.mkdir()
        diagnosis = run_analysis([str(path)], workdir=work)
        doc = to_json_dict(diagnosis)
        text = json.dumps(doc, allow_nan=False)  # NaN/Infinity: not JSON
        analysis = diagnosis.analysis
        coll: list[tuple[Any, ...]] = []
        if analysis.collectives is not None:
            coll = [
                tuple(r)
                for r in analysis.collectives.select(_COLL).sort("line_no").collect().rows()
            ]
        account = analysis.inputs.row(0, named=True) if len(analysis.inputs) else {}
    parsed_doc = json.loads(text)
    assert parsed_doc["schema"].startswith("ncclscope.analysis/")
    return Outcome(account, coll, parsed_doc)


@functools.cache
def clean_outcome(name: str) -> Outcome:
    return analyse(b"".join(line + b"\n" for line in bases()[name]))


_REASONS = ("blank", "other", "malformed", "binary", "too_long")


def assert_accounting(account: dict[str, Any]) -> None:
    assert account["parsed"] + account["unparsed"] == account["lines"]
    assert account["unparsed"] == sum(account[r] for r in _REASONS)
    assert all(account[r] >= 0 for r in (*_REASONS, "parsed"))


# --------------------------------------------------------------------------------------
# properties


def _continuations(lines: list[bytes], damaged: frozenset[int]) -> set[int]:
    """The undamaged lines that continue a damaged line's record in the clean log: the
    indented or closing-bracket lines right after it (``    "stage": 2,`` ... ``}``)."""
    out: set[int] = set()
    for k in damaged:
        j = k + 1
        while j < len(lines) and lines[j][:1] in (b" ", b"\t", b"}", b"]", b")"):
            if j not in damaged:
                out.add(j)
            j += 1
    return out


def test_a_damaged_record_head_may_cost_only_its_continuations() -> None:
    """The allowance above is the record's own lines, nothing more."""
    lines = [b"[t] head {", b'    "a": 1,', b"}", b"[t] next", b"    x"]
    assert _continuations(lines, frozenset({0})) == {1, 2}
    assert _continuations(lines, frozenset({3})) == {4}
    assert _continuations(lines, frozenset({2})) == set()


@fuzz(100)
@given(damaged_logs())
def test_damaged_lines_cost_only_themselves(log: Damaged) -> None:
    """No traceback, valid JSON, the accounting holds, and nothing undamaged is lost."""
    got = analyse(b"".join(line + b"\n" for line in log.lines))
    clean = clean_outcome(log.base)
    assert_accounting(got.account)
    assert got.account["lines"] == clean.account["lines"]
    # A damaged line may take with it the continuation lines of the record it opened
    # (a DeepSpeed config entry's dict, a JSON block): their meaning hangs on it.
    allowed = len(log.damaged) + len(_continuations(bases()[log.base], log.damaged))
    assert got.account["parsed"] >= clean.account["parsed"] - allowed
    kept = [r for r in clean.coll if r[0] - 1 not in log.damaged]
    rows = {r[0]: r for r in got.coll}
    lost = [r for r in kept if rows.get(r[0]) != r]
    assert lost == []


@fuzz(15)
@given(
    damaged_logs(),
    st.sampled_from(("crlf", "utf16", "gzip_cut", "cut", "shuffle", "double", "drop")),
    st.data(),
)
def test_whole_file_damage_never_raises(log: Damaged, how: str, data: st.DataObject) -> None:
    """Damage to the whole file: a report and a true accounting, whatever it holds."""
    import gzip
    import random

    body = b"".join(line + b"\n" for line in log.lines)
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    name = "damaged.log"
    lines = list(log.lines)
    if how == "crlf":
        body = body.replace(b"\n", b"\r\n")
    elif how == "utf16":
        body = body.decode("utf-8", "replace").encode(rng.choice(("utf-16", "utf-16-le")))
    elif how == "gzip_cut":
        packed = gzip.compress(body, mtime=0)
        body, name = packed[: rng.randint(10, len(packed) - 1)], "damaged.log.gz"
    elif how == "cut":
        body = body[: rng.randint(0, len(body))]
    else:
        if how == "shuffle":
            rng.shuffle(lines)
        elif how == "double":
            lines = [x for line in lines for x in ([line, line] if rng.random() < 0.2 else [line])]
        else:
            lines = [line for line in lines if rng.random() > 0.2]
        body = b"".join(line + b"\n" for line in lines)
    got = analyse(body, name)
    if got.account:
        assert_accounting(got.account)


@fuzz(10)
@given(damaged_logs())
def test_crlf_loses_nothing(log: Damaged) -> None:
    """CRLF line ends read like LF ones."""
    body = b"".join(line + b"\r\n" for line in bases()[log.base])
    got = analyse(body)
    clean = clean_outcome(log.base)
    assert_accounting(got.account)
    assert got.account["parsed"] == clean.account["parsed"]
    assert got.coll == clean.coll


def _texts(lines: list[bytes]) -> list[tuple[int, str]]:
    return [(k + 1, line.decode("utf-8", "replace")) for k, line in enumerate(lines)]


@fuzz(60)
@given(damaged_logs())
def test_framework_readers_never_raise_on_damaged_lines(log: Damaged) -> None:
    """The PyTorch and DeepSpeed readers over every line of a damaged log; each line is
    parsed or counted once at most."""
    texts = _texts(log.lines)
    torch = parse_torch(texts, file_id=0, year=2025)
    ds = parse_deepspeed(texts, file_id=0)
    for result in (torch, ds):
        assert 0 <= result.malformed <= len(texts)
        assert 0 <= result.parsed + result.malformed <= len(texts)
    for frame in (torch.timeouts, torch.failures, torch.events, ds.timers, ds.throughput):
        assert isinstance(frame, pl.DataFrame)


@fuzz(100)
@given(damaged_logs(), st.data())
def test_reference_parser_never_raises_on_damaged_lines(log: Damaged, data: st.DataObject) -> None:
    for k in sorted(log.damaged):
        parse_line(log.lines[k].decode("utf-8", "replace"))
    k = data.draw(st.integers(0, len(log.lines) - 1))
    parse_line(log.lines[k].decode("utf-8", "replace"))


# --------------------------------------------------------------------------------------
# odd but legal values: data, not a crash


_ODD_COMM = (
    "node-a:{pid}:{pid} [0] NCCL INFO comm 0x55001 rank {rank} nranks {nranks} cudaDev 0 "
    "busId 8000 commId 0xabc - Init COMPLETE"
)
_ODD_COLL = (
    "node-a:{pid}:{pid} [0] NCCL INFO AllReduce: opCount {op} sendbuff 0x7f00 recvbuff 0x7f01 "
    "count 1024 datatype 7 op 0 root {root} comm 0x55001 [nranks={nranks}] stream 0x66"
)


@pytest.fixture
def _memory_guard() -> Any:
    """A blow-up (a damaged size enumerated rank by rank) fails the test, not the machine."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = 8 << 30
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.usefixtures("_memory_guard")
@fuzz(25)
@given(
    pid=st.sampled_from((0, 1, 2**31 - 1)),
    rank=st.sampled_from((0, 1, 5, 2**31 - 1, -1)),
    nranks=st.sampled_from((0, 1, 2, 2**31 - 1)),
    root=st.sampled_from((0, -1, 7, 2**31 - 1)),
    op=st.sampled_from(("0", "0", "7fffffffffffffff", "1")),
)
def test_odd_but_legal_values_are_data(
    pid: int, rank: int, nranks: int, root: int, op: str
) -> None:
    """pid 0, a rank beyond nranks, nranks 0, a root outside the communicator, opCount
    at the top of its column: read as data; the detectors and the report go on."""
    lines = [
        _ODD_COMM.format(pid=pid, rank=rank, nranks=nranks),
        _ODD_COMM.format(pid=pid + 1, rank=rank + 1, nranks=nranks),
        *(
            _ODD_COLL.format(pid=p, op=op, root=root, nranks=nranks)
            for p in (pid, pid + 1)
            for _ in range(3)
        ),
    ]
    got = analyse("".join(line + "\n" for line in lines).encode())
    assert_accounting(got.account)


_ODD_WATCHDOG = (
    "[rank{g}]:[E ProcessGroupNCCL.cpp:475] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn={n}, NumelOut={n}, "
    "Timeout(ms)={ms}) ran for {ran} milliseconds before timing out."
)


@fuzz(25)
@given(
    seq=st.sampled_from((-1, 0, 2**63 - 1, -(2**63))),
    rank=st.sampled_from((0, 7, 2**31 - 1)),
    n=st.sampled_from((0, -1, 2**63 - 1)),
    ms=st.sampled_from((0, 1, 2**63 - 1)),
    ran=st.sampled_from((0, 2**63 - 1)),
)
def test_odd_watchdog_values_are_data(seq: int, rank: int, n: int, ms: int, ran: int) -> None:
    """A negative or huge sequence number, a rank beyond the world, a zero timeout, sizes
    at the top of their column: a timeout report, never a traceback or a NaN."""
    lines = [
        _ODD_COMM.format(pid=11, rank=0, nranks=2),
        _ODD_COMM.format(pid=12, rank=1, nranks=2),
        *(_ODD_WATCHDOG.format(g=g, r=g, seq=seq, n=n, ms=ms, ran=ran) for g in (rank, 1)),
    ]
    got = analyse("".join(line + "\n" for line in lines).encode())
    assert_accounting(got.account)


def test_fixture_damage_script_runs(tmp_path: Path) -> None:
    """``benchmarks/fuzz_inputs.py`` (the long profile over the fixtures), a few inputs."""
    import subprocess
    import sys

    keep = tmp_path / "failures"
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "fuzz_inputs.py"), "--seed", "3",
         "--count", "12", "--keep", str(keep), "--json", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["inputs"] == 12
    assert report["failures"] == 0, result.stdout[-3000:]
    assert result.returncode == 0
    shutil.rmtree(keep, ignore_errors=True)


@pytest.fixture(autouse=True, scope="module")
def _cleanup_bases() -> Any:
    yield
    if _bases_dir.cache_info().currsize:
        shutil.rmtree(_bases_dir(), ignore_errors=True)


# --------------------------------------------------------------------------------------
# multi-line records: a damaged line inside costs only itself

_RUN1 = REPO / "fixtures" / "zero2-timers-eras" / "run1-ds0.9.5.log"
_RUN2 = REPO / "fixtures" / "zero2-timers-eras" / "run2-ds0.14.4.log"


def _with(path: Path, line_no: int, text: bytes) -> bytes:
    lines = path.read_bytes().split(b"\n")
    assert lines[line_no - 1]  # a line of the record, not a blank one
    lines[line_no - 1] = text
    return b"\n".join(lines)


@pytest.mark.parametrize(
    ("path", "line_no", "text"),
    [
        # the user config's '"bf16": {' as UTF-16: its brace is lost, the braces balance early
        (_RUN2, 120, '    "bf16": {'.encode("utf-16")),
        # a line of the user config cut to its indent (blank: not delivered to the parser)
        (_RUN2, 133, b"   "),
        # binary junk in place of a line of the user config
        (_RUN2, 125, b"\x16\x97\x86\x9f\x15\x03\xf0\xaf"),
        # the dump's first line damaged: its multi-line first value is still read
        (_RUN1, 57, b"[2023-06-12 10:01:25,993] [INFO] [config.py:956:print] DeexSpeedEngine conf"),
        # the line that opens the user config ('json = {') damaged
        (_RUN1, 107, b'[2023-06-12 10:01:25,996] [INFO] [configer": {'),
        # a key line whose value goes on over the next lines, its header damaged
        (_RUN1, 58, b"[2023-"),
        # a line of the user config that lost its brace but kept its indent
        (_RUN1, 113, b'    "bf16"'),
    ],
)
def test_a_damaged_line_of_a_deepspeed_dump_costs_only_itself(
    path: Path, line_no: int, text: bytes
) -> None:
    clean = analyse(path.read_bytes())
    got = analyse(_with(path, line_no, text))
    assert_accounting(got.account)
    assert got.account["parsed"] >= clean.account["parsed"] - 1
    assert got.doc["job"]["zero"] == clean.doc["job"]["zero"]


@pytest.mark.parametrize(
    "line",
    [
        # a pid with a digit int() cannot read (a flipped byte made it '²')
        "node-a:1\u00b2:1 [0] NCCL INFO AllGather: opCount 0 sendbuff 0x1000 recvbuff 0x1000 "
        "count 0 datatype 0 op 0 root 0 comm 0x1000 [nranks=1] stream 0x1000",
        # the same in an init line's key value
        "node-a:1:1 [0] NCCL INFO comm 0x55 rank 0 nranks 2 cudaDev \u00b2 busId 1000 "
        "commId 0xab - Init COMPLETE",
        # and in a watchdog's last enqueued work
        "[rank0]:[E ProcessGroupNCCL.cpp:1] [PG 0 Rank 0] Exception (either an error or "
        "timeout) detected by watchdog at work: 12, last enqueued NCCL work: 1\u00b2, last "
        "completed NCCL work: 11.",
        # a COLL line whose header token was cut away (it starts with the space after it)
        " [0] NCCL INFO AllReduce: opCount a sendbuff 0x7f4b recvbuff 0x7f4b count 9437184 "
        "datatype 7 op 0 root 0 comm 0x7f50 [nranks=4] stream 0x55a1",
    ],
)
def test_lines_that_ended_analyze_in_a_traceback(line: str) -> None:
    """Each was a traceback once (found by fuzzing): now one malformed line."""
    got = analyse((line + "\n").encode())
    assert_accounting(got.account)
    assert got.account["lines"] == 1


def test_a_separator_byte_in_the_first_line_costs_only_that_line() -> None:
    """Binary junk with a 0x1f byte (the line reader's separator) as the first line: the
    whole file was "cannot be read" (polars refused the extra column)."""
    path = REPO / "fixtures" / "nvlink-8gpu-227" / "run.log"
    clean = analyse(path.read_bytes())
    got = analyse(_with(path, 1, b"\xec?\x1e\xd8d\x1f\xcd\x805_1PL\xee\xff:n"))
    assert got.doc["problems"] == []
    assert_accounting(got.account)
    assert got.account["lines"] == clean.account["lines"]
    assert got.account["parsed"] >= clean.account["parsed"] - 1
