"""nccl-tests tables and RAS reports as people paste them, and damaged input (issue #28).

Every fixture is written here in the writers' layouts (nccl-tests ``src/common.cu`` /
``util.cu`` printf formats; NCCL ``src/ras/client_support.cc``); each is then cut,
joined and skewed, and every whole row must still read with its size, times and
bandwidths, while what could not be read is counted with its reason, never raised.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner

from ncclscope.cli import cli
from ncclscope.parsers.tools.nccl_tests import NcclTestsRead, parse_nccl_tests
from ncclscope.parsers.tools.ras import parse_ras_json, parse_ras_text

FIX = Path(__file__).resolve().parent.parent / "fixtures"

# -- nccl-tests -----------------------------------------------------------------------------

#: (size, count, type, redop, root, oop time us, algbw, busbw, wrong, ip time, algbw, busbw)
Row = tuple[int, int, str, str, int, float, float, float, int, float, float, float]
ROWS: list[Row] = [
    (8, 2, "float", "sum", -1, 31.25, 0.00, 0.00, 0, 30.50, 0.00, 0.00),
    (1024, 256, "float", "sum", -1, 33.10, 0.03, 0.06, 0, 32.80, 0.03, 0.06),
    (131072, 32768, "float", "sum", -1, 58.40, 2.24, 4.21, 0, 57.90, 2.26, 4.24),
    (4194304, 1048576, "float", "sum", -1, 212.7, 19.72, 36.97, 0, 211.9, 19.79, 37.11),
    (67108864, 16777216, "float", "sum", -1, 1702.3, 39.42, 73.92, 0, 1699.8, 39.48, 74.03),
    (1073741824, 268435456, "float", "sum", -1, 24918, 43.09, 80.80, 0, 24903, 43.12, 80.84),
]

HEAD_213 = """\
# nccl-tests version 2.13.11 nccl-headers=22304 nccl-library=22304
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 \
iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  40112 on   gpu-n01 device  0 [0000:18:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  40113 on   gpu-n01 device  1 [0000:2a:00] NVIDIA H100 80GB HBM3
"""
HALVES = (
    "#                                                              out-of-place"
    "                       in-place\n"
)
NAMES = (
    "#       size         count      type   redop    root     time   algbw   busbw #wrong"
    "     time   algbw   busbw #wrong\n"
)
UNITS = (
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)      "
    "       (us)  (GB/s)  (GB/s)       \n"
)
TAIL = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 27.8127 \n#\n"


def _fmt(v: float) -> str:
    return f"{v:7.2f}" if v < 1e4 else f"{v:7.0f}"


def row_line(r: Row, redop: bool = True) -> str:
    """One row as ``PRINT("%12li  %12li  %8s  %6s  %6s", ...)`` then each half's
    ``"  %7s  %6.2f  %6.2f  %5s"`` prints it; ``redop`` False: the old tests that
    passed ``""`` as the op name (hypercube), whose row then has one token fewer."""
    size, count, dtype, op, root, ot, oa, ob, ow, it, ia, ib = r
    head = f"{size:12d}  {count:12d}  {dtype:>8s}  {op if redop else '':>6s}  {root:6d}"
    return (
        f"{head}  {_fmt(float(ot))}  {oa:6.2f}  {ob:6.2f}  {ow:5d}"
        f"  {_fmt(float(it))}  {ia:6.2f}  {ib:6.2f}  {0:5d}\n"
    )


def table(rows: list[Row] | None = None, redop: bool = True) -> str:
    return "".join(row_line(r, redop) for r in (rows or ROWS))


@dataclass
class Case:
    """One pasted form: its text and the rows it must give (by size)."""

    name: str
    text: str
    sizes: list[int]
    redop: str | None = "sum"


def _cases() -> list[Case]:
    all_sizes = [r[0] for r in ROWS]
    full = HEAD_213 + HALVES + NAMES + UNITS + table() + TAIL
    fail = (
        "gpu-n01: Test NCCL failure all_reduce.cu:44 'unhandled system error (run with "
        "NCCL_DEBUG=INFO for details) / '\n .. gpu-n01 pid 40112: Test failure common.cu:391\n"
        " .. gpu-n01 pid 40112: Test failure common.cu:590\n"
    )
    spliced = "".join(
        f"[1,0]<stdout>:{line[:40]}[1,1]<stdout>:{line[40:]}" if k % 2 else f"[1,0]<stdout>:{line}"
        for k, line in enumerate(table().splitlines(keepends=True))
    )
    head = HEAD_213 + HALVES + NAMES + UNITS
    return [
        Case("full", full, all_sizes),
        Case("from the units line", UNITS + table() + TAIL, all_sizes),
        Case("rows alone", table(), all_sizes),
        Case("rows and average", table() + TAIL, all_sizes),
        Case("empty redop, header", head + table(redop=False) + TAIL, all_sizes, None),
        Case("empty redop, rows alone", table(redop=False), all_sizes, None),
        Case("rows then failures", head + table(ROWS[:4]) + fail, all_sizes[:4]),
        Case("rows alone then failures", table(ROWS[:3]) + fail, all_sizes[:3]),
        Case("spliced prefixes", HEAD_213 + HALVES + NAMES + UNITS + spliced + TAIL, all_sizes),
        Case("spliced prefixes, rows alone", spliced, all_sizes),
    ]


def _skews(text: str, rng: random.Random) -> Iterator[tuple[str, str]]:
    """The pasted forms' accidents: CRLF, tabs, a Markdown indent, a timestamp prefix."""
    yield "as written", text
    yield "crlf", text.replace("\n", "\r\n")
    yield "tabs", "\n".join("\t".join(line.split(" ")) for line in text.split("\n"))
    yield "indented", "".join("    " + line for line in text.splitlines(keepends=True))
    yield "squeezed", "\n".join(" ".join(line.split()) for line in text.split("\n"))
    stamped = "".join(
        f"2026-03-02T11:04:{rng.randrange(60):02d}Z {line}"
        for line in text.splitlines(keepends=True)
    )
    yield "timestamped", stamped
    yield "mpirun tags", "".join("[1,0]<stdout>:" + x for x in text.splitlines(keepends=True))
    yield "srun labels", "".join("0: " + x for x in text.splitlines(keepends=True))
    info = "gpu-n01:40113:40290 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/IPC\n"
    yield (
        "NCCL lines between",
        "".join(
            x + (info if k % 3 == 1 else "") for k, x in enumerate(text.splitlines(keepends=True))
        ),
    )


def _check(read: NcclTestsRead, expect: list[int], redop: str | None) -> bool:
    by_size = {r[0]: r for r in ROWS}
    got = read.rows.sort("line_no").to_dicts()
    if [g["size_bytes"] for g in got] != expect:
        return False
    for g in got:
        r = by_size[g["size_bytes"]]
        want = (r[1], r[2], redop, r[4], r[5] * 1e-6, r[6] * 1e9, r[7] * 1e9, r[9] * 1e-6,
                r[10] * 1e9, r[11] * 1e9)  # fmt: skip
        have = (g["count"], g["dtype"], g["redop"], g["root"], g["oop_time_s"],
                g["oop_algo_bw_bytes_per_s"], g["oop_bus_bw_bytes_per_s"], g["ip_time_s"],
                g["ip_algo_bw_bytes_per_s"], g["ip_bus_bw_bytes_per_s"])  # fmt: skip
        for a, b in zip(have, want, strict=True):
            if isinstance(b, float):
                if not isinstance(a, float) or not math.isclose(a, b, rel_tol=1e-9):
                    return False
            elif a != b:
                return False
    return True


def _variants() -> Iterator[tuple[str, str, str, list[int], str | None]]:
    """(class, variant, text, sizes that must read, redop) for each case: as written and
    skewed; cut after each row (the rows before it stay); two pastes joined."""
    rng = random.Random(28)
    for case in _cases():
        for skew, text in _skews(case.text, rng):
            yield case.name, skew, text, case.sizes, case.redop
        lines = case.text.splitlines(keepends=True)
        row_at = [k for k, line in enumerate(lines) if _row_size(line) is not None]
        for k in row_at:
            cut = "".join(lines[:k]) + lines[k][: len(lines[k]) // 2]
            keep = [s for s in case.sizes if s in {_row_size(x) for x in lines[:k]}]
            yield case.name, f"cut in row at line {k}", cut, keep, case.redop
        yield case.name, "joined", case.text + case.text, case.sizes * 2, case.redop


def _row_size(line: str) -> int | None:
    tokens = line.replace("[1,1]<stdout>:", " ").replace("[1,0]<stdout>:", " ").split()
    if len(tokens) >= 12 and tokens[0].isdigit() and tokens[2] == "float":
        return int(tokens[0])
    return None


VARIANTS = list(_variants())


def _score(
    check: Callable[[str, list[int], str | None], bool],
) -> dict[str, tuple[int, int]]:
    score: dict[str, tuple[int, int]] = {}
    for cls, _variant, text, sizes, redop in VARIANTS:
        ok, n = score.get(cls, (0, 0))
        score[cls] = (ok + check(text, sizes, redop), n + 1)
    return score


def _nccl_ok(text: str, sizes: list[int], redop: str | None) -> bool:
    return _check(parse_nccl_tests(text, "t.txt"), sizes, redop)


def test_nccl_tests_pasted_forms_read_every_whole_row() -> None:
    score = _score(_nccl_ok)
    bad = [(c, v) for c, v, t, s, r in VARIANTS if not _nccl_ok(t, s, r)]
    for cls, (ok, n) in score.items():
        assert ok >= 0.95 * n, (cls, ok, n, bad[:8])
    assert len(VARIANTS) >= 150


def test_a_row_cut_in_a_paste_is_counted_with_its_reason() -> None:
    text = table()
    read = parse_nccl_tests(text[: len(text) - 30], "t.txt")
    assert read.rows.height == len(ROWS) - 1
    assert read.skipped == {"table row cut and never completed": 1}


def test_the_empty_redop_layout_keeps_root_and_null_redop() -> None:
    text = HEAD_213 + HALVES + NAMES + UNITS + table(redop=False) + TAIL
    read = parse_nccl_tests(text, "t.txt")
    assert read.rows["redop"].to_list() == [None] * len(ROWS)
    assert read.rows["root"].to_list() == [-1] * len(ROWS)
    assert not read.skipped
    assert read.runs["avg_bus_bw_bytes_per_s"].to_list() == [pytest.approx(27.8127e9)]


def _damage(line: str, column: int, value: str) -> str:
    tokens = line.split()
    tokens[column] = value
    return "  ".join(tokens) + "\n"


@pytest.mark.parametrize(
    ("column", "value"),
    [
        (1, "nan"),  # count: NaN where an integer is expected
        (1, "256.0"),  # count: a float
        (0, "-nan"),
        (0, "1e3"),
        (0, "99999999999999999999"),  # size past int64
        (1, "9223372036854775808"),  # count: 2**63
        (4, "4294967296"),  # root past int32
        (4, "nan"),
        (4, "0.5"),
    ],
)
def test_a_damaged_count_costs_only_its_row(column: int, value: str) -> None:
    lines = table().splitlines(keepends=True)
    lines[2] = _damage(lines[2], column, value)
    for text in ("".join(lines), HEAD_213 + HALVES + NAMES + UNITS + "".join(lines) + TAIL):
        read = parse_nccl_tests(text, "t.txt")
        assert read.rows["size_bytes"].to_list() == [r[0] for r in ROWS if r[0] != ROWS[2][0]]
        assert sum(read.skipped.values()) == 1, read.skipped


@pytest.mark.parametrize("value", ["1e999", "-1e999", "nan", "340282366920938463463374607431"])
def test_a_value_past_float64_reads_as_null_or_as_printed(value: str) -> None:
    lines = table().splitlines(keepends=True)
    lines[2] = _damage(lines[2], 6, value)  # out-of-place algbw
    read = parse_nccl_tests("".join(lines), "t.txt")
    assert read.rows.height == len(ROWS)
    alg = read.rows["oop_algo_bw_bytes_per_s"][2]
    assert alg is None or math.isfinite(alg)


# -- RAS reports ----------------------------------------------------------------------------

RAS_HEAD = """\
NCCL version {nccl} compiled with CUDA {cuda}
CUDA runtime version {rt}, driver version {drv}

Job summary
===========

  Nodes  Processes         GPUs  Processes     GPUs
(total)   per node  per process    (total)  (total)
      1          4            1          4        4

Communicators... (0.01s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         1         4         4         2   RUNNING  INCOMPLETE

Errors
======

"""
#: 2.24/2.25: the missing ranks of a communicator as one list.
RAS_224 = (
    RAS_HEAD.format(nccl="2.24.3", cuda="12.6", rt="12060", drv="12080")
    + """\
INCOMPLETE
  Missing communicator data from 2 job processes
  Process 70 on node 10.0.0.5 managing GPU 2
  Process 71 on node 10.0.0.5 managing GPU 3

#0-0 (2b8e41f07c95d3a6) INCOMPLETE
  Missing communicator data from 2 ranks
  The missing ranks: 2,3

"""
)
#: 2.26+: a dead process, then its communicator rank named with its host.
RAS_226 = (
    RAS_HEAD.format(nccl="2.26.2", cuda="12.8", rt="12080", drv="12090")
    + """\
DEAD
  1 job process is considered dead (unreachable via the RAS network)
  Process 70 on node 10.0.0.5 managing GPU 2

#0-0 (2b8e41f07c95d3a6) INCOMPLETE
  Missing communicator data from 1 rank
  Rank 2 -- GPU 2 managed by process 70 on node 10.0.0.5

"""
)


def _ras_facts(text: str) -> tuple[object, ...]:
    read = parse_ras_text(text, "ras.txt")
    rep = read.report.to_dicts()[0] if read.report.height else {}
    ranks = [
        (r["comm_hash"], r["comm_rank"], r["pid"], r["host"], r["state"])
        for r in read.ranks.to_dicts()
    ]
    return (read.problem, read.cuda_version, rep.get("nccl_version"),
            rep.get("cuda_runtime_version"), rep.get("missing_processes"),
            rep.get("dead_processes"), frozenset(ranks), len(ranks))  # fmt: skip


RAS_WANT: dict[str, tuple[object, ...]] = {
    "2.24 missing ranks": (None, "12.6", "2.24.3", 12060, 2, 0, frozenset({
        ("2b8e41f07c95d3a6", 2, None, None, "missing"),
        ("2b8e41f07c95d3a6", 3, None, None, "missing"),
        (None, None, 70, "10.0.0.5", "missing"),
        (None, None, 71, "10.0.0.5", "missing"),
    }), 4),
    "2.26 dead rank": (None, "12.8", "2.26.2", 12080, 0, 1, frozenset({
        ("2b8e41f07c95d3a6", 2, 70, "10.0.0.5", "missing"),
        (None, None, 70, "10.0.0.5", "dead"),
    }), 2),
}  # fmt: skip
TORCH_WARNING = "[rank0]:[W302 11:05:00.1 68 ProcessGroupNCCL.cpp:1168] Warning: WorkNCCL ...\n"
RAS_TEXT = {"2.24 missing ranks": RAS_224, "2.26 dead rank": RAS_226}


def _ras_variants() -> Iterator[tuple[str, str, str]]:
    """(class, variant, text): skewed as the nccl-tests pastes are, polled twice into one
    file (joined: the last report is read), and with a torch warning after it."""
    rng = random.Random(29)
    for cls, text in RAS_TEXT.items():
        for skew, skewed in _skews(text, rng):
            if skew in ("squeezed", "tabs"):
                continue  # the report's own indentation tells its lines from others'
            yield cls, skew, skewed
        yield cls, "joined", RAS_TEXT["2.26 dead rank" if "2.24" in cls else cls] + text
        yield cls, "trailing blank lines gone", text.rstrip("\n")
        yield cls, "torch warning after", text + TORCH_WARNING
        yield cls, "utf-8 bom", "\ufeff" + text


RAS_VARIANTS = list(_ras_variants())


def _marker(rank: tuple[object, ...]) -> str:
    """The line that names ``rank`` (a row of ``RAS_WANT``)."""
    comm, comm_rank, pid, _host, _state = rank
    if comm is None:
        return f"Process {pid} on node"
    return "The missing ranks: 2,3" if pid is None else f"Rank {comm_rank} --"


def test_ras_cut_between_any_two_lines_keeps_what_came_before() -> None:
    n = good = 0
    for cls, text in RAS_TEXT.items():
        lines = text.splitlines(keepends=True)
        want = RAS_WANT[cls][6]
        assert isinstance(want, frozenset)
        for k in range(1, len(lines) + 1):
            cut = "".join(lines[:k])
            facts = _ras_facts(cut)
            expect = {r for r in want if _marker(r) in cut}
            n += 1
            good += facts[1:3] == RAS_WANT[cls][1:3] and facts[6] == expect
    assert good >= 0.95 * n, (good, n)
    assert n >= 50


def test_ras_pasted_forms_read_the_same() -> None:
    score: dict[str, tuple[int, int]] = {}
    bad = []
    for cls, variant, text in RAS_VARIANTS:
        ok = _ras_facts(text) == RAS_WANT[cls]
        good, n = score.get(cls, (0, 0))
        score[cls] = (good + ok, n + 1)
        if not ok:
            bad.append((cls, variant, _ras_facts(text)))
    for cls, (good, n) in score.items():
        assert good >= 0.95 * n, (cls, good, n, bad[:4])


def test_the_224_missing_ranks_line_is_understood() -> None:
    read = parse_ras_text(RAS_224, "ras.txt")
    assert not read.skipped
    single = parse_ras_text(RAS_224.replace("The missing ranks: 2,3", "The missing rank: 5"), "r")
    assert single.ranks.filter(pl.col("comm_hash").is_not_null())["comm_rank"].to_list() == [5]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("      1          4            1          4        4", "      1          4  nan  4  4"),
        ("      1          4            1          4        4", "  1  4  1  4  99999999999"),
        ("    0         1         1         4         4         2   RUNNING",
         "    0         1         1         4   4294967296         2   RUNNING"),
        ("    0         1         1         4         4         2   RUNNING",
         "    0         1.0         1         4         4         2   RUNNING"),
        ("Missing communicator data from 2 job processes",
         "Missing communicator data from 99999999999 job processes"),
        ("The missing ranks: 2,3", "The missing ranks: 2,99999999999"),
        ("The missing ranks: 2,3", "The missing ranks: 2,nan"),
        ("Process 71 on node", "Process 99999999999 on node"),
        ("CUDA runtime version 12060", "CUDA runtime version 99999999999"),
    ],
)  # fmt: skip
def test_a_damaged_ras_number_is_a_skipped_line(old: str, new: str) -> None:
    assert old in RAS_224
    read = parse_ras_text(RAS_224.replace(old, new), "ras.txt")
    assert read.problem is None
    assert sum(read.skipped.values()) == 1, read.skipped
    assert read.report["nccl_version"].to_list() == ["2.24.3"]


@pytest.mark.parametrize(
    "entry",
    ['"rank": NaN', '"rank": 2.0', '"rank": 99999999999', '"rank": true'],
)
def test_a_damaged_ras_json_rank_is_a_skipped_entry(entry: str) -> None:
    text = (
        '{"nccl_version": "2.28.9", "cuda_runtime_version": 12090, "cuda_driver_version": '
        '99999999999, "timestamp": "2026-03-02 11:04:31", "communicators": [{"hash": '
        '"0x2b8e41f07c95d3a6", "size": 4, "ranks": [{"rank": 0, "host": "10.0.0.5", "pid": 68,'
        ' "cuda_dev": 0, "status": {"init_state": 0}, "collective_counts": {"AllReduce": 9}}, '
        "{" + entry + ', "host": "10.0.0.5", "pid": 99999999999, "cuda_dev": 1}], '
        '"missing_ranks": []}]}'
    )
    read = parse_ras_json(text, "ras.json")
    assert read.problem is None
    assert read.skipped == {"rank entry not understood": 1}
    assert read.report["cuda_driver_version"].to_list() == [None]


def _analyze(tmp_path: Path, ras: str, log: bool = True) -> dict[str, Any]:
    if log:
        (tmp_path / "train.log").write_bytes((FIX / "missing-rank-hang/train.log").read_bytes())
    (tmp_path / "ras.txt").write_text(ras)
    result = CliRunner().invoke(
        cli, ["analyze", str(tmp_path), "--format", "json", "--no-progress"]
    )
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_ras_cuda_versions_reach_the_json(tmp_path: Path) -> None:
    rep = _analyze(tmp_path, RAS_226, log=False)["nccl_tools"]["ras"]["reports"][0]
    assert (rep["cuda_version"], rep["cuda_runtime"], rep["cuda_driver"]) == (
        "12.8",
        "12.8",
        "12.9",
    )
    assert rep["cuda_runtime_version"] == 12080


@pytest.mark.parametrize("ras", [RAS_226, RAS_224], ids=["2.26", "2.24"])
def test_a_stopped_rank_is_named_with_its_host_and_job_rank(tmp_path: Path, ras: str) -> None:
    doc = _analyze(tmp_path, ras)
    hangs = [f for f in doc["findings"] if f["kind"] == "hang"]
    assert len(hangs) == 1
    stopped = hangs[0]["evidence"]["ras"]["stopped"]
    # The log's Init lines map comm rank 2 of 2b8e41f07c95d3a6 and pid 70 (GPU 2) to rank 2.
    by = {(s["communicator"], s["comm_rank"], s["pid"]): s for s in stopped}
    assert by[(None, None, 70)]["rank"] == 2
    assert by[(None, None, 70)]["host"] == "10.0.0.5"
    assert by[("2b8e41f07c95d3a6", 2, 70 if ras is RAS_226 else None)]["rank"] == 2
    if ras is RAS_224:
        assert by[(None, None, 71)]["rank"] == 3
        assert by[("2b8e41f07c95d3a6", 3, None)]["rank"] == 3


def test_ras_alone_names_each_stopped_rank_with_its_host(tmp_path: Path) -> None:
    doc = _analyze(tmp_path, RAS_226, log=False)
    hang = next(f for f in doc["findings"] if f["kind"] == "hang")
    assert "comm rank 2 of 2b8e41f07c95d3a6, process 70 on 10.0.0.5" in hang["message"]
    assert hang["hosts"] == ["10.0.0.5"]
