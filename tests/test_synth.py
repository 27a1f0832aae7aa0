"""Tests for the synthetic job generator (ncclscope.synth) and its CLI.

The regexes below are written from shared/formats/nccl.md, not from the generator, so they
check that the generator writes what real NCCL writes.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ncclscope.synth import (
    IbError,
    Mismatch,
    MismatchField,
    SlowRank,
    StopRank,
    SynthSpec,
    Truth,
    generate,
)
from ncclscope.synth.cli import parse_size, synth

# --- nccl.md §1.2 ---------------------------------------------------------------------
NCCL_TS = r"(?:\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{1,9})?)\] )?"
PREFIX = r"(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) "
INFO_RE = re.compile(NCCL_TS + PREFIX + r"\[(?P<dev>-?\d+)\] NCCL INFO (?P<msg>.*)$")
WARN_RE = re.compile(
    NCCL_TS + PREFIX + r"\[(?P<dev>-?\d+)\] (?P<src>[^\s:]+):(?P<line>\d+)"
    r"(?: \((?P<func>[^)]*)\))? NCCL WARN (?P<msg>.*)$"
)
BANNER_RE = re.compile(
    r"NCCL version (?P<ver>\d+\.\d+\.\d+)(?P<suffix>[^+\s]*)\+cuda(?P<cuda>\d+\.\d+)"
)
# --- nccl.md §3.6 ---------------------------------------------------------------------
COLL_RE = re.compile(
    r"^(?P<op>\w+): opCount (?P<opcount>[0-9a-f]+) sendbuff (?P<sendbuff>\S+) "
    r"recvbuff (?P<recvbuff>\S+) count (?P<count>\d+) datatype (?P<dtype>\d+) "
    r"op (?P<redop>\d+) root (?P<root>\d+) comm (?P<comm>\S+) \[nranks=(?P<nranks>\d+)\] "
    r"stream (?P<stream>\S+)"
)
# --- nccl.md §3.3, one shape per era --------------------------------------------------
_IDENT = (
    r"comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) "
    r"cudaDev (?P<dev>\d+) nvmlDev (?P<nvml>\d+) busId (?P<bus>[0-9a-f]+) "
    r"commId 0x(?P<cid>[0-9a-f]+) - Init (?P<what>START|COMPLETE)$"
)
INIT_RE = {
    # 2.5-2.8: busId, no nvmlDev, no commId, no START
    "2.7": re.compile(
        r"^comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) "
        r"cudaDev (?P<dev>\d+) busId (?P<bus>[0-9a-f]+) - Init (?P<what>COMPLETE)$"
    ),
    # 2.18.3-2.20: no function-name prefix
    "2.18": re.compile("^" + _IDENT),
    # 2.21-2.22: literal ncclCommInitRank prefix
    "2.21": re.compile("^ncclCommInitRank " + _IDENT),
    # 2.23+: %s = the API that created the comm
    "2.27": re.compile(
        r"^(?P<func>ncclCommInitRank|ncclCommInitRankConfig|ncclCommInitAll|"
        r"ncclCommInitRankScalable) " + _IDENT
    ),
}
NNODES_RE = re.compile(
    r"^comm 0x[0-9a-f]+ rank \d+ nRanks \d+ nNodes (?P<nodes>\d+) localRanks \d+ "
    r"localRank \d+ MNNVL \d+$"
)
CHAIN_RE = re.compile(r"^(?P<file>[\w/.]+):(?P<line>\d+) -> (?P<code>\d+)(?: \[[\w ]+\])?$")
IB_RE = {
    "2.7": re.compile(
        r"^NET/IB : Got completion with error \d+, opcode \d+, len \d+, vendor err \d+$"
    ),
    "2.18": re.compile(
        r"^NET/IB : Got completion from peer \S+ with error \d+, opcode \d+, len \d+, "
        r"vendor err \d+ \(\w+\)"
    ),
    "2.21": re.compile(
        r"^NET/IB : Got completion from peer \S+ with status=\d+ opcode=\d+ len=\d+ "
        r"vendor err \d+ \(\w+\)"
    ),
    "2.27": re.compile(
        r"^NET/IB: Got completion from peer \S+ with status=\d+ opcode=\d+ len=\d+ "
        r"vendor err \d+ \(\w+\).* hca \S+$"
    ),
}

SMALL: dict[str, Any] = {"ranks": 8, "hosts": 2, "steps": 2, "layers": 2}


# --- helpers --------------------------------------------------------------------------


def _lines(path: Path) -> list[str]:
    # Split on '\n' only: tqdm lines carry '\r', which universal newlines would split.
    return path.read_bytes().decode("utf-8").split("\n")[:-1]


def _truth(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "truth.json").read_text())
    return data


def _gen(tmp_path: Path, name: str = "job", **kw: Any) -> tuple[Path, Truth]:
    out = tmp_path / name
    return out, generate(SynthSpec(**kw), out)


def _info_msgs(path: Path) -> list[re.Match[str]]:
    return [m for line in _lines(path) if (m := INFO_RE.search(line))]


def _coll_records(out: Path) -> list[dict[str, Any]]:
    """COLL lines of all files, each joined to (comm name, global rank) through truth."""
    truth = _truth(out)
    rank_of_pid = {(r["host"], r["pid"]): r["rank"] for r in truth["ranks"]}
    comm_of = {}
    for c in truth["communicators"]:
        for rank, ptr in c["comm_ptrs"].items():
            comm_of[(int(rank), ptr)] = c["name"]
    recs = []
    for f in truth["files"]:
        for i, line in enumerate(_lines(out / f["path"])):
            m = INFO_RE.search(line)
            if not m:
                continue
            c = COLL_RE.match(m["msg"])
            if not c:
                continue
            rank = rank_of_pid[(m["host"], int(m["pid"]))]
            recs.append(
                {
                    "file": f["path"],
                    "line_no": i + 1,
                    "rank": rank,
                    "comm": comm_of[(rank, c["comm"])],
                    "op": c["op"],
                    "opcount": int(c["opcount"], 16),
                    "count": int(c["count"]),
                    "dtype": int(c["dtype"]),
                    "nranks": int(c["nranks"]),
                    "ts": m["ts"],
                }
            )
    return recs


def _seconds(ts: str) -> float:
    hh, mm, ss = ts.split(" ")[1].split(":")
    return int(hh) * 3600 + int(mm) * 60 + float(ss)


# --- determinism ----------------------------------------------------------------------


def test_same_seed_same_bytes_different_seed_differs(tmp_path: Path) -> None:
    kw = {**SMALL, "timestamps": True, "launcher": "torchrun", "faults": (SlowRank(1, 0.01),)}
    a, _ = _gen(tmp_path, "a", seed=7, **kw)
    b, _ = _gen(tmp_path, "b", seed=7, **kw)
    c, _ = _gen(tmp_path, "c", seed=8, **kw)
    assert (a / "job.log").read_bytes() == (b / "job.log").read_bytes()
    assert (a / "truth.json").read_bytes() == (b / "truth.json").read_bytes()
    assert (a / "job.log").read_bytes() != (c / "job.log").read_bytes()


def test_truth_file_stats_match_files(tmp_path: Path) -> None:
    out, truth = _gen(tmp_path, **SMALL)
    assert _truth(out) == json.loads(truth.to_json())
    for f in truth.files:
        data = (out / f.path).read_bytes()
        assert f.bytes == len(data)
        assert f.lines == data.count(b"\n")


# --- era line shapes ------------------------------------------------------------------


@pytest.mark.parametrize("era", ["2.7", "2.18", "2.21", "2.27"])
def test_init_lines_match_era_format(tmp_path: Path, era: str) -> None:
    out, truth = _gen(tmp_path, era=era, non_nccl_frac=0.0, **SMALL)
    lines = _lines(out / "job.log")
    msgs = [m["msg"] for line in lines if (m := INFO_RE.search(line))]
    init = [m for msg in msgs if (m := INIT_RE[era].match(msg))]
    n_comms = len(truth.communicators)
    completes = [m for m in init if m["what"] == "COMPLETE"]
    assert len(completes) == SMALL["ranks"] * 2 == sum(c.nranks for c in truth.communicators)
    starts = [m for m in init if m["what"] == "START"]
    assert len(starts) == (0 if era == "2.7" else len(completes))
    # No Init line in another era's shape sneaks in.
    assert sum("- Init " in msg for msg in msgs) == len(init)
    if era != "2.7":
        by_cid = defaultdict(set)
        for m in completes:
            by_cid[m["cid"]].add((m["nranks"], m["rank"]))
        assert len(by_cid) == n_comms
        want = {c.comm_id: c.nranks for c in truth.communicators}
        for cid, members in by_cid.items():
            assert want[f"0x{cid}"] == len(members)
    else:
        assert all(c.comm_id is None for c in truth.communicators)
    nnodes = [m for msg in msgs if (m := NNODES_RE.match(msg))]
    assert bool(nnodes) == (era in ("2.21", "2.27"))
    banners = [line for line in lines if BANNER_RE.search(line)]
    assert banners
    if era == "2.27":  # 2.23+: INFO line
        assert all(INFO_RE.search(b) for b in banners)
    else:  # <= 2.22: bare printf, once per process
        assert all(BANNER_RE.fullmatch(b) for b in banners)
    bootstrap = [msg for msg in msgs if msg.startswith("Bootstrap") and "Using" in msg]
    assert bootstrap
    shape = {
        "2.7": r"^Bootstrap : Using \[0\]eth0:",
        "2.18": r"^Bootstrap : Using eth0:",
        "2.21": r"^Bootstrap : Using eth0:",
        "2.27": r"^Bootstrap: Using eth0:",
    }[era]
    assert all(re.match(shape, msg) for msg in bootstrap)


def test_27_single_node_comms_print_opcount_zero(tmp_path: Path) -> None:
    out, truth = _gen(tmp_path, era="2.27", tp_traffic=True, **SMALL)
    recs = _coll_records(out)
    host = [r for r in recs if r["comm"].startswith("host")]
    world = [r for r in recs if r["comm"] == "world"]
    assert host
    assert {r["opcount"] for r in host} == {0}
    assert max(r["opcount"] for r in world) == truth.world_instances - 1
    assert {c.name: c.opcount_printed for c in truth.communicators}["world"] == "seq"


# --- collective sequences -------------------------------------------------------------


@pytest.mark.parametrize("layout", ["combined", "per-rank"])
def test_opcount_sequences_consistent_across_ranks(tmp_path: Path, layout: str) -> None:
    out, truth = _gen(tmp_path, era="2.21", tp_traffic=True, layout=layout, **SMALL)
    recs = _coll_records(out)
    assert len(recs) == truth.coll_calls
    per = defaultdict(list)
    for r in recs:
        per[(r["comm"], r["rank"])].append(r)
    comms = {c.name: c for c in truth.communicators}
    by_instance: dict[tuple[str, int], set[tuple[str, int, int]]] = defaultdict(set)
    for (comm, _rank), rs in per.items():
        assert [r["opcount"] for r in rs] == list(range(comms[comm].instances))
        for r in rs:
            assert r["nranks"] == comms[comm].nranks
            by_instance[(comm, r["opcount"])].add((r["op"], r["count"], r["dtype"]))
    # Every rank logged the same op/count/dtype at every instance.
    assert all(len(v) == 1 for v in by_instance.values())
    ops: dict[str, int] = defaultdict(int)
    for r in recs:
        ops[r["op"]] += 1
    assert dict(ops) == truth.calls_by_op
    world = [op for (comm, _), v in sorted(by_instance.items()) if comm == "world" for op in v]
    per_step = 3 * SMALL["layers"] + 1
    assert len(world) == SMALL["steps"] * per_step
    assert world[per_step - 1] == ("AllReduce", 1, 7)  # grad-norm AllReduce closes a step


# --- faults ---------------------------------------------------------------------------


def test_stop_rank_truth_matches_lines(tmp_path: Path) -> None:
    out, truth = _gen(tmp_path, faults=(StopRank(rank=5, at_instance=9),), **SMALL)
    recs = [r for r in _coll_records(out) if r["comm"] == "world"]
    at = {r["rank"] for r in recs if r["opcount"] == 9}
    assert at == set(range(8)) - {5}
    assert not [r for r in recs if r["opcount"] > 9]
    last: dict[int, int] = {}
    for r in recs:
        last[r["rank"]] = max(last.get(r["rank"], -1), r["opcount"])
    (outcome,) = truth.faults
    assert outcome.effective
    assert truth.end_reason == "hang"
    seqs = outcome.details["last_seq"]
    assert isinstance(seqs, dict)
    world = seqs["world"]
    assert isinstance(world, dict)
    assert {int(k): v for k, v in world.items()} == last
    assert last[5] == 8
    # Nothing at all after the hang: the file ends with the others' instance-9 lines.
    tail = _lines(out / "job.log")[-1]
    assert "opCount 9 " in tail


def test_two_stop_ranks_at_one_instance_both_apply(tmp_path: Path) -> None:
    faults = (StopRank(1, 5), StopRank(6, 5), StopRank(2, 9))
    out, truth = _gen(tmp_path, faults=faults, **SMALL)
    at5 = {r["rank"] for r in _coll_records(out) if r["comm"] == "world" and r["opcount"] == 5}
    assert at5 == set(range(8)) - {1, 6}
    assert [f.effective for f in truth.faults] == [True, True, False]
    world = next(c for c in truth.communicators if c.name == "world")
    assert world.last_seq["1"] == world.last_seq["6"] == 4
    assert world.last_seq["0"] == 5


def test_slow_rank_lateness_visible_in_timestamps(tmp_path: Path) -> None:
    out, _ = _gen(
        tmp_path, era="2.27", timestamps=True, faults=(SlowRank(rank=3, lateness_s=0.05),), **SMALL
    )
    by_inst: dict[int, dict[int, float]] = defaultdict(dict)
    for r in _coll_records(out):
        if r["comm"] == "world":
            assert r["ts"] is not None
            by_inst[r["opcount"]][r["rank"]] = _seconds(r["ts"])
    lateness = []
    for times in by_inst.values():
        others = [t for rank, t in times.items() if rank != 3]
        lateness.append(times[3] - statistics.median(others))
        assert times[3] == max(times.values())  # always last
    assert statistics.mean(lateness) == pytest.approx(0.05, abs=0.003)


@pytest.mark.parametrize("field", ["op", "count", "dtype"])
def test_mismatch_logged_by_one_rank_then_hang(tmp_path: Path, field: MismatchField) -> None:
    out, truth = _gen(tmp_path, faults=(Mismatch(rank=2, at_instance=4, field=field),), **SMALL)
    recs = [r for r in _coll_records(out) if r["comm"] == "world" and r["opcount"] == 4]
    assert len(recs) == 8
    shapes = {r["rank"]: (r["op"], r["count"], r["dtype"]) for r in recs}
    others = {shape for rank, shape in shapes.items() if rank != 2}
    assert len(others) == 1
    (good,) = others
    bad = shapes[2]
    pos = ["op", "count", "dtype"].index(field)
    assert [i for i in range(3) if bad[i] != good[i]] == [pos]
    (outcome,) = truth.faults
    logged = outcome.details["logged"]
    assert isinstance(logged, dict)
    assert logged[{"dtype": "datatype"}.get(field, field)] == bad[pos]
    assert truth.end_reason == "hang"
    assert truth.world_instances == 5


@pytest.mark.parametrize("era", ["2.7", "2.18", "2.21", "2.27"])
def test_ib_error_warn_and_chain(tmp_path: Path, era: str) -> None:
    out, truth = _gen(
        tmp_path, era=era, launcher="pdsh", faults=(IbError(host="node-1", at_instance=3),), **SMALL
    )
    (outcome,) = truth.faults
    assert outcome.effective
    assert truth.end_reason == "error"
    d = outcome.details
    lines = _lines(out / str(d["file"]))
    line_no = d["line_no"]
    assert isinstance(line_no, int)
    warn_line = lines[line_no - 1]
    assert lines[line_no - 2] == "node-1: "  # the empty line NCCL writes before a WARN
    m = WARN_RE.search(warn_line)
    assert m
    assert warn_line.startswith("node-1: ")
    assert (m["host"], int(m["pid"])) == (d["host"], d["pid"])
    assert IB_RE[era].match(m["msg"])
    assert f"{m['src']}:{m['line']}" == d["warn_src"]
    assert (m["ts"] is not None) == (era == "2.27")  # 2.26+ stamps WARN by default
    chain = [
        CHAIN_RE.match(mm["msg"])
        for line in lines[line_no : line_no + 8]
        if (mm := INFO_RE.search(line)) and mm["tid"] == m["tid"]
    ]
    codes = {c["code"] for c in chain if c}
    assert codes == {"2" if era == "2.7" else "6"}
    # Nothing collective after the error.
    assert not [r for r in _coll_records(out) if r["line_no"] > line_no]


# --- layouts and launchers ------------------------------------------------------------


def test_per_rank_layout_one_file_per_process(tmp_path: Path) -> None:
    out, truth = _gen(tmp_path, layout="per-rank", non_nccl_frac=0.3, **SMALL)
    files = sorted(p.name for p in out.glob("*.log"))
    want = sorted(f"{r.host}.{r.pid}.log" for r in truth.ranks)
    assert files == want == sorted(f.path for f in truth.files)
    for r in truth.ranks:
        lines = _lines(out / f"{r.host}.{r.pid}.log")
        assert lines
        for line in lines:
            m = INFO_RE.match(line) or WARN_RE.match(line)
            assert m, line  # NCCL_DEBUG_FILE holds NCCL output only, no prefixes
            assert (m["host"], int(m["pid"])) == (r.host, r.pid)
    assert truth.non_nccl_lines == 0


@pytest.mark.parametrize("launcher", ["torchrun", "rank", "srun", "pdsh", "none"])
def test_launcher_prefixes(tmp_path: Path, launcher: str) -> None:
    out, truth = _gen(tmp_path, launcher=launcher, ranks=12, hosts=2, steps=1, layers=1)
    width = len(str(11))
    expect = {}
    for r in truth.ranks:
        expect[(r.host, r.pid)] = {
            "torchrun": f"[default{r.local_rank}]:",
            "rank": f"[rank{r.rank}]:",
            "srun": f"{r.rank:>{width}}: ",
            "pdsh": f"{r.host}: ",
            "none": "",
        }[launcher]
    seen = 0
    for line in _lines(out / "job.log"):
        m = INFO_RE.search(line)
        if m:
            assert line[: m.start()] == expect[(m["host"], int(m["pid"]))]
            seen += 1
    assert seen > 100


def test_per_rank_with_launcher_is_rejected() -> None:
    with pytest.raises(ValueError, match="combined layout"):
        SynthSpec(layout="per-rank", launcher="torchrun")


def test_non_nccl_lines_counted(tmp_path: Path) -> None:
    out, truth = _gen(tmp_path, non_nccl_frac=0.2, launcher="none", **SMALL)
    lines = _lines(out / "job.log")
    nccl = sum(
        bool(INFO_RE.search(x) or WARN_RE.search(x) or BANNER_RE.fullmatch(x)) for x in lines
    )
    assert nccl + truth.non_nccl_lines == len(lines)
    assert any("\r" in x for x in lines)  # tqdm redraws
    assert any("[INFO] [logging.py" in x for x in lines)  # DeepSpeed logger


def test_combined_timestamps_ordered(tmp_path: Path) -> None:
    out, _ = _gen(tmp_path, era="2.27", timestamps=True, faults=(SlowRank(1, 0.02),), **SMALL)
    stamps = [m["ts"] for line in _lines(out / "job.log") if (m := INFO_RE.search(line))]
    assert stamps == sorted(stamps)


def test_target_size_respected(tmp_path: Path) -> None:
    target = 600_000
    out, truth = _gen(tmp_path, target_size_bytes=target, timestamps=True, ranks=16, hosts=2)
    size = (out / "job.log").stat().st_size
    assert abs(size - target) / target < 0.05
    assert truth.end_reason == "target_size"


def test_single_host_uses_socket(tmp_path: Path) -> None:
    out, _ = _gen(tmp_path, ranks=4, hosts=1, steps=1, layers=1)
    msgs = {m["msg"] for m in _info_msgs(out / "job.log")}
    assert "Using network Socket" in msgs
    assert not any("NET/IB/" in msg for msg in msgs)


# --- validation and CLI ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"ranks": 10, "hosts": 3}, "multiple of hosts"),
        ({"era": "2.21", "timestamps": True}, "2.26"),
        ({"faults": (StopRank(99, 1),)}, "rank must be"),
        ({"steps": 1, "faults": (StopRank(1, 500),)}, "at_instance must be <"),
        ({"hosts": 1, "ranks": 4, "faults": (IbError("node-0", 1),)}, ">= 2 hosts"),
        ({"faults": (IbError("nope", 1),)}, "unknown host"),
        ({"host_names": ("a.b", "c")}, "bad host name"),
    ],
)
def test_spec_validation(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SynthSpec(**kw)


def test_parse_size() -> None:
    assert parse_size("1GB") == 1 << 30
    assert parse_size("200MB") == 200 << 20
    assert parse_size("1.5k") == 1536
    assert parse_size("4096") == 4096
    with pytest.raises(ValueError, match="not a size"):
        parse_size("12XB")


def test_cli_help() -> None:
    result = CliRunner().invoke(synth, ["--help"])
    assert result.exit_code == 0
    assert "--stop-rank RANK:INSTANCE" in result.output
    assert "Examples:" in result.output
    assert "ncclscope synth --out" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slow-rank", "abc"], "RANK:SECONDS"),
        (["--slow-rank", "x:1"], "RANK must be an integer"),
        (["--mismatch", "1:2:size"], "FIELD must be one of"),
        (["--size", "12XB"], "--size"),
        (["--era", "2.18", "--timestamps"], "2.26"),
        (["--ranks", "7"], "multiple of hosts"),
    ],
)
def test_cli_bad_values(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(synth, ["--out", str(tmp_path / "x"), *args])
    assert result.exit_code == 2
    assert message in result.output


def test_cli_run_writes_summary(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    result = CliRunner().invoke(
        synth,
        [
            "--out", str(out), "--ranks", "8", "--hosts", "2", "--steps", "2",
            "--era", "2.27", "--timestamps", "--launcher", "torchrun",
            "--slow-rank", "3:0.01", "--stop-rank", "2:20", "--seed", "3",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.startswith("synth: wrote job.log")
    assert "end=hang" in result.output
    truth = _truth(out)
    assert [f["kind"] for f in truth["spec"]["faults"]] == ["SlowRank", "StopRank"]


# --- benign WARNs ---------------------------------------------------------------------

# nccl.md §1: a WARN is "\n" + [timestamp, 2.26+] + "host:pid:tid [dev] file:line NCCL WARN msg";
# the "(function)" after file:line only appears in 2.30.7+, so never in these eras.
_WARN_HEAD = r"(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?P<src>[\w/.]+:\d+) "
WARN_SHAPE = {
    "no-ts": re.compile("^" + _WARN_HEAD + r"NCCL WARN (?P<msg>.*)$"),
    # 2.26+ default NCCL_DEBUG_TIMESTAMP_LEVELS=WARN with the default "[%F %T] " format
    "default-ts": re.compile(
        r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\] " + _WARN_HEAD + r"NCCL WARN (?P<msg>.*)$"
    ),
    # NCCL_DEBUG_TIMESTAMP_FORMAT="[%F %T.%6f] "
    "us-ts": re.compile(
        r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{6}\] " + _WARN_HEAD + r"NCCL WARN (?P<msg>.*)$"
    ),
}
# nccl.md §3.7 "NET/IB : Got async event : %s"; 2.20.5 source adds "%s:%d" (device:port);
# the 2.2x switch prints non-fatal events as "%s:%d Got async error event: %s".
ASYNC_RE = {
    "2.7": re.compile(r"^NET/IB : Got async event : (?P<event>[\w ]+)$"),
    "2.18": re.compile(r"^NET/IB : Got async event : (?P<event>[\w ]+)$"),
    "2.21": re.compile(r"^NET/IB : mlx5_\d+:\d+ Got async event : (?P<event>[\w ]+)$"),
    "2.27": re.compile(r"^NET/IB : mlx5_\d+:\d+ Got async error event: (?P<event>[\w ]+)$"),
}
_PREFIX_OF = {"none": "", "pdsh": "{host}: ", "torchrun": "[default{local}]:"}


def _warn_lines(out: Path, truth: Truth) -> list[tuple[str, int]]:
    """(file, 1-based line number) of every line that contains 'NCCL WARN'."""
    found = []
    for f in truth.files:
        for i, line in enumerate(_lines(out / f.path)):
            if "NCCL WARN" in line:
                found.append((f.path, i + 1))
    return found


def _without_lines(path: Path, drop: set[int]) -> bytes:
    data = path.read_bytes().split(b"\n")
    return b"\n".join(x for i, x in enumerate(data) if i + 1 not in drop)


@pytest.mark.parametrize(
    ("era", "timestamps", "shape"),
    [
        ("2.7", False, "no-ts"),
        ("2.18", False, "no-ts"),
        ("2.21", False, "no-ts"),
        ("2.27", False, "default-ts"),
        ("2.27", True, "us-ts"),
    ],
)
@pytest.mark.parametrize(("layout", "launcher"), [("combined", "pdsh"), ("per-rank", "none")])
def test_benign_warns_shape_and_truth(
    tmp_path: Path, era: str, timestamps: bool, shape: str, layout: str, launcher: str
) -> None:
    kw: dict[str, Any] = {
        **SMALL,
        "steps": 6,
        "era": era,
        "timestamps": timestamps,
        "layout": layout,
        "launcher": launcher,
    }
    out, truth = _gen(tmp_path, "w", benign_warns=5, **kw)
    assert truth.end_reason == "completed"  # the job goes on
    recs = truth.benign_warns
    assert len(recs) == 5
    assert _truth(out)["benign_warns"] == [
        {
            "rank": r.rank,
            "host": r.host,
            "pid": r.pid,
            "tid": r.tid,
            "path": r.path,
            "line_no": r.line_no,
            "warn_src": r.warn_src,
            "message": r.message,
        }
        for r in recs
    ]
    # Every WARN line in the output is a recorded one, and nothing else is a WARN.
    assert sorted(_warn_lines(out, truth)) == sorted((r.path, r.line_no) for r in recs)
    ranks = {r.rank: r for r in truth.ranks}
    for rec in recs:
        rk = ranks[rec.rank]
        assert rec.path == rk.file
        lines = _lines(out / rec.path)
        prefix = _PREFIX_OF[launcher].format(host=rk.host, local=rk.local_rank)
        assert lines[rec.line_no - 2] == prefix  # the empty line NCCL writes before a WARN
        warn = lines[rec.line_no - 1]
        assert warn.startswith(prefix)
        m = WARN_SHAPE[shape].match(warn[len(prefix) :])
        assert m, warn
        assert WARN_RE.search(warn)  # and the generic §1.2 regex agrees
        assert (m["host"], int(m["pid"]), int(m["tid"])) == (rec.host, rec.pid, rec.tid)
        assert (rk.host, rk.pid) == (rec.host, rec.pid)
        assert int(m["tid"]) not in (rk.pid, rk.proxy_tid)  # the IB async thread
        assert m["dev"] == "0"  # helper thread that never set a CUDA device
        assert m["src"] == rec.warn_src
        assert m["src"].startswith("transport/net_ib.cc:")
        assert m["msg"] == rec.message
        a = ASYNC_RE[era].match(m["msg"])
        assert a, m["msg"]
        assert a["event"] == "SM change"
        # Benign: no "file:line -> N" chain after it, nothing else from that thread.
        later = [mm for x in lines[rec.line_no :] if (mm := INFO_RE.search(x))]
        assert later  # the job went on
        assert not any(CHAIN_RE.match(mm["msg"]) for mm in later)
        assert all(int(mm["tid"]) != rec.tid for mm in later)


@pytest.mark.parametrize("layout", ["combined", "per-rank"])
def test_benign_warns_change_nothing_else(tmp_path: Path, layout: str) -> None:
    kw: dict[str, Any] = {**SMALL, "steps": 4, "era": "2.27", "timestamps": True, "layout": layout}
    plain, t0 = _gen(tmp_path, "plain", **kw)
    warned, t1 = _gen(tmp_path, "warned", benign_warns=7, **kw)
    again, _ = _gen(tmp_path, "again", benign_warns=7, **kw)
    assert [f.path for f in t0.files] == [f.path for f in t1.files]
    drop: dict[str, set[int]] = defaultdict(set)
    for rec in t1.benign_warns:
        drop[rec.path] |= {rec.line_no - 1, rec.line_no}
    for f in t1.files:
        assert (warned / f.path).read_bytes() == (again / f.path).read_bytes()  # deterministic
        # Take the WARNs (and their empty lines) out: the rest is the job without them.
        assert _without_lines(warned / f.path, drop[f.path]) == (plain / f.path).read_bytes()
    assert t0.coll_calls == t1.coll_calls
    assert t0.benign_warns == []
    assert _truth(plain)["spec"]["benign_warns"] == 0


def test_benign_warns_evenly_spread_over_steps(tmp_path: Path) -> None:
    n = 6
    out, truth = _gen(tmp_path, benign_warns=n, non_nccl_frac=0.0, **{**SMALL, "steps": 10})
    recs = _coll_records(out)
    slots = 10 * (3 * SMALL["layers"] + 1)
    assert len(recs) == slots * SMALL["ranks"]
    for i, rec in enumerate(truth.benign_warns):
        before = sum(r["line_no"] < rec.line_no for r in recs)
        # Each slot logs one line per rank, so this is the fraction of slots before it.
        assert abs(before / len(recs) - (i + 0.5) / n) <= 1 / slots


def test_benign_warns_spread_by_bytes_with_target_size(tmp_path: Path) -> None:
    n, target = 8, 2_000_000
    out, truth = _gen(
        tmp_path, benign_warns=n, target_size_bytes=target, ranks=16, hosts=2, timestamps=True
    )
    assert truth.end_reason == "target_size"
    assert len(truth.benign_warns) == n
    data = (out / "job.log").read_bytes()
    assert abs(len(data) - target) / target < 0.05
    starts = [0]
    for line in data.split(b"\n"):
        starts.append(starts[-1] + len(line) + 1)
    offsets = [starts[rec.line_no - 1] for rec in truth.benign_warns]
    first_coll = data.index(b"NCCL INFO AllGather: opCount")
    spacing = (len(data) - first_coll) / n
    gaps = [b - a for a, b in zip([first_coll, *offsets], offsets, strict=False)]
    assert gaps[0] == pytest.approx(spacing / 2, rel=0.1)  # the first falls at 1/2N
    for gap in gaps[1:]:
        assert gap == pytest.approx(spacing, rel=0.1)


def test_benign_warns_with_a_tiny_target_all_still_written(tmp_path: Path) -> None:
    out, truth = _gen(tmp_path, benign_warns=3, target_size_bytes=1000, ranks=8, hosts=2)
    assert len(truth.benign_warns) == 3
    assert len(_warn_lines(out, truth)) == 3


def test_benign_warns_before_a_terminal_fault(tmp_path: Path) -> None:
    faults = (IbError(host="node-0", at_instance=9),)
    out, truth = _gen(tmp_path, benign_warns=4, faults=faults, **SMALL)
    assert truth.end_reason == "error"
    assert len(truth.benign_warns) == 4
    (outcome,) = truth.faults
    ib_line = outcome.details["line_no"]
    assert isinstance(ib_line, int)
    lines = _lines(out / "job.log")
    assert "Got completion" in lines[ib_line - 1]  # its line number is still right
    assert all(rec.line_no < ib_line for rec in truth.benign_warns)
    all_warns = {no for _, no in _warn_lines(out, truth)}
    assert {rec.line_no for rec in truth.benign_warns} < all_warns


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"benign_warns": -1}, "benign_warns must be >= 0"),
        ({"benign_warns": 2, "hosts": 1, "ranks": 4}, ">= 2 hosts"),
        ({"benign_warns": 2, "steps": 0}, "at least one step"),
    ],
)
def test_benign_warns_validation(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SynthSpec(**kw)


def test_cli_warns(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    args = ["--out", str(out), "--ranks", "8", "--hosts", "2", "--steps", "3", "--warns", "3"]
    result = CliRunner().invoke(synth, args)
    assert result.exit_code == 0, result.output
    assert ", 3 benign WARNs," in result.output
    assert len(_truth(out)["benign_warns"]) == 3
    bad = CliRunner().invoke(synth, [*args, "--hosts", "1", "--ranks", "4"])
    assert bad.exit_code == 2
    assert ">= 2 hosts" in bad.output
    helped = CliRunner().invoke(synth, ["--help"])
    assert "--warns N" in helped.output
