"""NCCL's own tools beside the logs (issue #18): Inspector records, nccl-tests output and
RAS reports, found by content, read into their tables, joined to the COLL lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ncclscope.cli import cli
from ncclscope.parsers.tools import sniff_tool
from ncclscope.parsers.tools.inspector import read_inspector_files, read_inspector_text
from ncclscope.parsers.tools.nccl_tests import parse_nccl_tests
from ncclscope.parsers.tools.ras import parse_ras_json, parse_ras_text
from ncclscope.synth.inspector import InspectorJob, coll_log, inspector_files

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "fixtures"


def _analyze(*names: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["analyze", *names, "--format", "json", "--no-progress"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


RECORD = (
    '{"header":{"id":"0a1b2c3d4e5f6071","rank":1,"n_ranks":2,"nnodes":1},'
    '"metadata":{"inspector_output_format_version":"v4.0","git_rev":"g","rec_mechanism":'
    '"nccl_profiler_interface","dump_timestamp_us":1764000000000000,"hostname":"h","pid":7},'
    '"coll_perf":{"coll":"AllGather","coll_sn":3,"coll_msg_size_bytes":1048576,'
    '"coll_exec_time_us":250,"coll_timing_source":"kernel_gpu","coll_algobw_gbs":8.388608,'
    '"coll_busbw_gbs":4.194304}}'
)


def test_sniffing_by_content() -> None:
    assert sniff_tool(RECORD.encode()) == "inspector"
    assert sniff_tool((FIX / "ras/ras_2_28_json_dead.json").read_bytes()) == "ras_json"
    assert sniff_tool((FIX / "ras/ras_2_24_healthy.txt").read_bytes()) == "ras_text"
    for p in (FIX / "nccl-tests").glob("*.txt"):
        assert sniff_tool(p.read_bytes()[:8192]) == "nccl_tests", p
    assert sniff_tool(b"node-a:1:1 [0] NCCL INFO Bootstrap : Using eth0\n") is None
    assert sniff_tool(b'{"entries": [], "pg_config": {}}') is None


def test_an_inspector_record_is_read_in_base_units() -> None:
    rows = read_inspector_text(RECORD + "\n", "x").rows.to_dicts()
    assert len(rows) == 1
    r = rows[0]
    assert (r["comm_hash"], r["comm_rank"], r["nranks"], r["op"], r["sn"]) == (
        "a1b2c3d4e5f6071",
        1,
        2,
        "AllGather",
        3,
    )
    assert r["exec_time_s"] == pytest.approx(250e-6)
    assert r["bus_bw_bytes_per_s"] == pytest.approx(4.194304e9)
    assert (r["host"], r["pid"], r["timing_source"], r["format_version"]) == (
        "h",
        7,
        "kernel_gpu",
        "v4.0",
    )


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (RECORD[:120], "not JSON (cut or damaged line)"),
        ("[1, 2]", "not a JSON object"),
        (RECORD.replace('"AllGather"', '"Bogus"'), "unknown collective 'Bogus'"),
        (
            RECORD.replace('"coll_sn":3', '"coll_sn":-3'),
            "coll_perf.coll_sn missing or not a number >= 0",
        ),
        ("\x00\xff garbage", "not JSON (cut or damaged line)"),
        ("[" * 100_000, "not JSON (cut or damaged line)"),  # was a RecursionError
        # fuzz #28: past int64 once times the ranks (a traceback in collective_cost)
        (
            RECORD.replace(
                '"coll_msg_size_bytes":1048576', '"coll_msg_size_bytes":9223372036854775807'
            ),
            "coll_perf.coll_msg_size_bytes past 1 TiB (a damaged number)",
        ),
        (
            RECORD.replace('"n_ranks":2', '"n_ranks":2147483647'),
            "header.n_ranks not between 1 and 4M (a damaged number)",
        ),
        # fuzz #28: infinity, a NaN in exec_straggler's duration text
        (
            RECORD.replace('"coll_exec_time_us":250', '"coll_exec_time_us":1e400'),
            "coll_perf.coll_exec_time_us not finite or past 1e13 us (a damaged number)",
        ),
    ],
)
def test_a_bad_inspector_line_is_counted_and_skipped(line: str, reason: str) -> None:
    read = read_inspector_text(f"{RECORD}\n{line}\n{RECORD}\n", "x")
    assert read.rows.height == 2
    assert dict(read.skipped) == {reason: 1}


def test_an_inspector_bandwidth_that_is_not_one_is_unknown() -> None:
    """Fuzz #28: a negative or infinite bandwidth (optional) is left unknown, the
    record kept."""
    lines = [
        RECORD.replace('"coll_busbw_gbs":4.194304', '"coll_busbw_gbs":-1.5'),
        RECORD.replace('"coll_algobw_gbs":8.388608', '"coll_algobw_gbs":1e400'),
    ]
    read = read_inspector_text("\n".join(lines) + "\n", "x")
    assert read.rows["bus_bw_bytes_per_s"].to_list() == [None, pytest.approx(4.194304e9)]
    assert read.rows["algo_bw_bytes_per_s"].to_list() == [pytest.approx(8.388608e9), None]


def test_every_nccl_tests_row_is_read() -> None:
    new = parse_nccl_tests((FIX / "nccl-tests/all_gather_2_13.txt").read_text(), "x")
    run = new.runs.row(0, named=True)
    assert (run["test"], run["version"], run["nccl_version"], run["ranks"], run["hosts"]) == (
        "all_gather",
        "2.13.11",
        "2.23.4",
        4,
        ["node-a", "node-b"],
    )
    assert run["avg_bus_bw_bytes_per_s"] == pytest.approx(10.7036e9)
    assert new.rows["size_bytes"].to_list() == [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
    assert new.rows["oop_bus_bw_bytes_per_s"].to_list()[-1] == pytest.approx(11.92e9)
    assert new.rows["ip_time_s"].to_list()[-1] == pytest.approx(16874e-6)
    old = parse_nccl_tests((FIX / "nccl-tests/all_reduce_2_8_old.txt").read_text(), "x")
    assert old.rows.height == 5
    assert old.rows["root"].null_count() == 5
    assert old.rows["redop"].to_list() == ["sum"] * 5
    assert old.runs["wrong"].to_list() == [1]
    na = parse_nccl_tests(
        (FIX / "nccl-tests/reduce_scatter_2_10_with_nccl_lines.txt").read_text(), "x"
    )
    assert na.runs["test"].to_list() == ["reduce_scatter"]
    assert na.rows.height == 4
    assert na.rows["oop_wrong"].null_count() == 4


def test_a_row_that_does_not_fit_its_header_is_skipped() -> None:
    text = (FIX / "nccl-tests/all_gather_2_13.txt").read_text()
    text = text.replace("16890   15.89", "16890   15.89   99.0")
    out = parse_nccl_tests(text, "x")
    assert out.rows.height == 4
    assert dict(out.skipped) == {"table row that does not fit its header": 1}


def test_two_runs_in_one_file() -> None:
    a = (FIX / "nccl-tests/all_gather_2_13.txt").read_text()
    b = (FIX / "nccl-tests/reduce_scatter_2_10_with_nccl_lines.txt").read_text()
    out = parse_nccl_tests(a + b, "x")
    assert out.runs["test"].to_list() == ["all_gather", "reduce_scatter"]
    assert out.runs["rows"].to_list() == [5, 4]


def test_ras_text_names_dead_missing_and_mismatched_ranks() -> None:
    read = parse_ras_text((FIX / "ras/ras_2_26_mismatch_dead.txt").read_text(), "x")
    rep = read.report.row(0, named=True)
    assert (rep["nccl_version"], rep["nodes"], rep["processes"], rep["gpus"]) == ("2.26.5", 2, 8, 8)
    assert rep["dead_processes"] == 1
    assert read.comms["errors"].to_list() == ["INCOMPLETE,MISMATCH", "OK"]
    assert read.comms["comms"].to_list() == [1, 2]
    ranks = read.ranks.select("comm_rank", "pid", "state").rows()
    assert ranks == [(None, 60417, "dead"), (6, 60417, "missing"), (3, 58821, "mismatch")]
    assert not read.skipped


def test_ras_json_is_repaired_and_read() -> None:
    read = parse_ras_json((FIX / "ras/ras_2_28_json_dead.json").read_text(), "x")
    assert read.problem is None
    assert read.notes
    c = read.comms.row(0, named=True)
    assert (c["comm_hash"], c["nranks"], c["errors"]) == (
        "b7d1e2f3a4c5d6e",
        3,
        "INCOMPLETE,MISMATCH",
    )
    assert read.ranks.select("comm_rank", "state").rows() == [(1, "mismatch"), (2, "dead")]


@pytest.mark.parametrize("text", ["", "{", "[]", '{"nccl_version": 5, "communicators": 3}'])
def test_a_broken_ras_json_is_a_problem_not_a_crash(text: str) -> None:
    read = parse_ras_json(text, "x")
    assert read.problem is not None or read.comms.height == 0


def test_ras_json_nested_too_deeply_is_a_problem_not_a_crash() -> None:
    """Fuzz #28: junk of ``{"a": {"a": ...`` in a RAS file was a RecursionError out of the
    decoder; it is a problem (nothing read), the other inputs go on."""
    deep = '{"a": ' * 100_000
    read = parse_ras_json(deep, "x")
    assert read.problem == "not valid JSON (nested too deeply)"
    text = (FIX / "ras/ras_2_28_json_dead.json").read_text()
    read = parse_ras_json(deep + "\n" + text, "x")
    assert read.problem is None
    assert read.comms.height > 0


def test_ras_group_counts_that_each_fit_but_not_summed_are_left_out() -> None:
    """Fuzz #28: groups' communicator counts that each fit int32 summed past it (the
    report's ``communicators``) were a traceback; the sum is left out and counted."""
    text = (FIX / "ras/ras_2_27_uneven_incomplete.txt").read_text()
    row = "    1         2         1         4         8         4   RUNNING"
    damaged = text.replace(row, row.replace("    2  ", f"{2**31 - 1}  ", 1), 1)
    assert damaged != text
    read = parse_ras_text(damaged, "x")
    assert read.report["communicators"].to_list() == [None]
    assert read.skipped["number its column cannot hold"] == 1
    assert read.comms.height == 3


def test_nccl_tests_numbers_past_their_columns_are_left_out() -> None:
    """Fuzz #28: an iteration count past int32 in the header (text or JSON), a JSON
    result's size past int64 and JSON nested too deeply were tracebacks; each is left
    out and counted, the rest read."""
    text = (FIX / "nccl-tests/all_gather_2_13.txt").read_text()
    damaged = text.replace("iters: 20", "iters: 9223372036854775807", 1)
    assert damaged != text
    out = parse_nccl_tests(damaged, "x")
    assert out.runs["iters"].to_list() == [None]
    assert out.rows.height == 5
    assert out.skipped["number past its column (damaged): left out"] == 1
    doc = json.loads((FIX / "nccl-tests/all_gather_2_17.json").read_text())
    doc["config"]["iterations"] = 2**63 - 1
    doc["results"][0]["size"] = 2**64
    doc["results"][1]["root"] = 2**40
    out = parse_nccl_tests(json.dumps(doc), "x")
    assert out.runs["iters"].to_list() == [None]
    assert out.skipped["result entry not understood"] == 1
    assert out.rows["root"].to_list()[0] is None
    deep = parse_nccl_tests('{"results": ' + "[" * 100_000, "x")
    assert deep.rows.height == 0


def test_a_broken_ras_text_is_contained() -> None:
    text = (FIX / "ras/ras_2_26_mismatch_dead.txt").read_text()
    lines = text.splitlines()
    damaged = "\n".join([*lines[:16], "    0   x  y  RUNNING", *lines[16:30]])
    read = parse_ras_text(damaged, "x")
    assert read.skipped["communicator table row not understood"] == 1
    assert read.report.height == 1


def test_inspector_joins_the_coll_lines(tmp_path: Path) -> None:
    job = InspectorJob(nranks=4, ranks_per_host=2, collectives=24, drop=0.25, seed=3)
    for name, text in inspector_files(job).items():
        (tmp_path / name).write_text(text)
    (tmp_path / "train.log").write_text(coll_log(job))
    doc = _analyze(str(tmp_path))
    ins = doc["nccl_tools"]["inspector"]
    assert ins["records"] > 0
    # Every record has its COLL line, and the sizes agree.
    assert ins["joined"] == ins["records"] == ins["joined_size_agrees"]
    assert [f["path"] for f in doc["inputs"]] == [str(tmp_path / "train.log")]


@pytest.mark.parametrize(
    ("log", "why"),
    [("whole", None), ("head cut", "no_comm_ids"), ("none", "no_coll_lines")],
)
def test_why_inspector_records_did_not_join(tmp_path: Path, log: str, why: str | None) -> None:
    job = InspectorJob(nranks=4, ranks_per_host=2, collectives=30, drop=0.0, seed=4)
    for name, text in inspector_files(job).items():
        (tmp_path / name).write_text(text)
    lines = coll_log(job).splitlines(keepends=True)
    if log == "whole":
        (tmp_path / "train.log").write_text("".join(lines))
    elif log == "head cut":  # the Init lines (and their commId) are gone, COLL lines stay
        (tmp_path / "train.log").write_text("".join(lines[len(lines) // 3 :]))
    ins = _analyze(str(tmp_path))["nccl_tools"]["inspector"]
    assert ins["not_joined_why"] == why
    assert (ins["joined"] == ins["records"]) if why is None else (ins["joined"] == 0)
    text = CliRunner().invoke(cli, ["analyze", str(tmp_path), "--no-progress"]).stdout
    assert ("not joined to the logs:" in text) == (why is not None)


#: The first fixtures of each tool (the directories hold more layouts since).
FIRST = [
    "ras/ras_2_24_healthy.txt",
    "ras/ras_2_26_mismatch_dead.txt",
    "ras/ras_2_28_json_dead.json",
    "nccl-tests/all_gather_2_13.txt",
    "nccl-tests/all_reduce_2_8_old.txt",
    "nccl-tests/reduce_scatter_2_10_with_nccl_lines.txt",
]


def test_all_three_beside_a_log_in_one_directory(tmp_path: Path) -> None:
    for name in FIRST:
        p = FIX / name
        (tmp_path / p.name).write_bytes(p.read_bytes())
    (tmp_path / "insp.log").write_text(RECORD + "\n")
    doc = _analyze(str(tmp_path))
    kinds = sorted(f["kind"] for f in doc["nccl_tools"]["files"])
    assert kinds == ["inspector", "nccl_tests", "nccl_tests", "nccl_tests", "ras_json",
                     "ras_text", "ras_text"]  # fmt: skip
    assert len(doc["nccl_tools"]["nccl_tests"]["runs"]) == 3
    assert sum(len(r["table"]) for r in doc["nccl_tools"]["nccl_tests"]["runs"]) == 14
    assert doc["job"]["nccl_versions"] == ["2.18.5"]  # the NCCL lines in nccl-tests output
    result = CliRunner().invoke(cli, ["analyze", str(tmp_path), "--no-progress"])
    assert "NCCL TOOLS" in result.output
    assert "RAS report (json), NCCL 2.28.9" in result.output


def _ras_json(comm: str, missing_rank: int, dead: bool) -> str:
    flag = "true" if dead else "false"
    rank = (
        f'{{"rank": {missing_rank}, "host": "10.0.0.9", "pid": 999, "cuda_dev": 1, '
        f'"nvml_dev": 1, "status": {{"unresponsive": true, "considered_dead": {flag}}}}}'
    )
    return (
        '{"nccl_version": "2.28.9", "cuda_runtime_version": 12090, "cuda_driver_version": 12090,'
        ' "timestamp": "2026-03-02 11:04:31", "communicators_count": 1, "communicators": [{'
        f'"hash": "{comm}", "size": 4, "ranks_count": 0, "missing_ranks_count": 1,'
        f' "ranks": [], "missing_ranks": [{rank}]}}], "ras": {{"timeouts_count": 0}}}}'
    )


def test_ras_dead_rank_is_evidence_for_the_logs_hang(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_bytes((FIX / "missing-rank-hang/train.log").read_bytes())
    (tmp_path / "ras.json").write_text(_ras_json("0x2b8e41f07c95d3a6", 2, dead=True))
    doc = _analyze(str(tmp_path))
    hangs = [f for f in doc["findings"] if f["kind"] == "hang"]
    assert len(hangs) == 1
    ras = hangs[0]["evidence"]["ras"]
    assert ras["ts"] == "2026-03-02T11:04:31+00:00"
    assert [(s["comm_rank"], s["rank"], s["state"]) for s in ras["stopped"]] == [(2, 2, "dead")]


def test_ras_alone_makes_hang_and_mismatch_findings(tmp_path: Path) -> None:
    for name in FIRST[:3]:
        (tmp_path / Path(name).name).write_bytes((FIX / name).read_bytes())
    doc = _analyze(str(tmp_path))
    kinds = sorted((f["kind"], f["hang_class"]) for f in doc["findings"] if f["kind"] != "config")
    assert kinds == [("hang", "dead_process"), ("hang", "dead_process"),
                     ("mismatch", "mismatch"), ("mismatch", "mismatch")]  # fmt: skip
    texts = " ".join(f["message"] for f in doc["findings"])
    assert "operation 1521 (AllGather)" in texts
    assert "rank 6 of 3c9e0b2d4e6f5a10" in texts


@pytest.mark.parametrize(
    "bad",
    [
        RECORD[:120],
        RECORD.replace('"coll_sn":3', '"coll_sn":-3'),
        RECORD.replace('"rank":1', '"rank":"one"'),
        "",
    ],
)
def test_many_files_at_once_keep_every_good_record(tmp_path: Path, bad: str) -> None:
    good = [tmp_path / f"h-pid{k}.log" for k in range(3)]
    for p in good:
        p.write_text((RECORD + "\n") * 4)
    damaged = tmp_path / "h-pid9.log"
    damaged.write_text(RECORD + "\n" + bad + "\n" + RECORD + "\n")
    files = [(k, p, p.name) for k, p in enumerate([*good, damaged])]
    reads = read_inspector_files(files)
    assert [reads[k].rows.height for k in range(4)] == [4, 4, 4, 2]
    assert [reads[k].rows["file_id"].unique().to_list() for k in range(3)] == [[0], [1], [2]]
    assert reads[3].rows["line_no"].to_list() == [1, 3]
    assert sum(reads[3].skipped.values()) == (1 if bad else 0)


def test_the_bootstrap_roots_warn_gives_the_job_size(tmp_path: Path) -> None:
    log = tmp_path / "boot.log"
    log.write_text(
        "node-a:4101:4101 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
        "node-a:4101:4190 [0] NCCL WARN Bootstrap Root : rank 3 of 16 ranks has already "
        "checked in\n"
    )
    job = _analyze(str(log))["job"]
    assert (job["world_size"], job["world_size_source"]) == (16, "bootstrap")


def test_ncclscopes_own_json_report_is_not_taken_for_a_tool(tmp_path: Path) -> None:
    doc = json.dumps(_analyze(str(FIX / "ras")), indent=2).encode()
    assert b'"nccl_version"' in doc
    assert b'"communicators"' in doc
    assert sniff_tool(doc[:8192]) is None
