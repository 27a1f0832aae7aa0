"""The nccl-tests and RAS readers on the layouts real outputs come in (issue #18).

Each fixture in ``fixtures/nccl-tests`` and ``fixtures/ras`` follows a layout found in
outputs users paste into public issues or in the tools' writers (their READMEs say
which); ``expected.json`` lists every table row and every communicator/rank, checked by
``test_fixtures.py``.  Here: values read exactly as printed, and the same outputs
damaged the ways real files are (CRLF, launcher prefixes, NCCL lines interleaved, cut
anywhere), which must read the same rows or lose only what was damaged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ncclscope.parsers.tools import sniff_tool
from ncclscope.parsers.tools.nccl_tests import parse_nccl_tests
from ncclscope.parsers.tools.prefix import strip_prefix
from ncclscope.parsers.tools.ras import parse_ras_json, parse_ras_text

FIX = Path(__file__).resolve().parent.parent / "fixtures"
NT = sorted((FIX / "nccl-tests").glob("*.txt"))
RAS = sorted((FIX / "ras").glob("*.txt"))

#: One row per fixture as printed: (fixture, run, size, out-of-place time us, busbw GB/s,
#: in-place busbw GB/s), read off the fixture files by eye.
PRINTED = [
    ("ompi_tag_all_reduce_mpi_2_16.txt", 0, 1 << 30, 3146.50, 182.00, 182.73),
    ("srun_label_alltoall_2_13.txt", 0, 16 << 20, 468.11, 40.96, 41.12),
    ("ray_ompi_sendrecv.txt", 0, 512 << 20, 22369.6, 24.00, 24.10),
    ("markdown_pasted_all_reduce_old.txt", 0, 1 << 20, 228.57, 2.62, 2.63),
    ("broadcast_old_check_off.txt", 0, 128 << 20, 11983.7, 11.20, 11.24),
    ("intelmpi_interleaved_rows_2_13.txt", 0, 2048, 5.47, 0.25, 0.25),
    ("intelmpi_interleaved_rows_2_13.txt", 0, 4096, 5.47, 0.50, 0.50),
    ("script_rccl_two_tests.txt", 1, 256 << 20, 2739.14, 112.00, 112.45),
    ("all_reduce_2_18_cputime_timestamps.txt", 0, 64 << 30, 1.3e7, 3.10, 3.11),
    ("reduce_scatter_2_19_per_iter_bitwise.txt", 0, 256 << 20, 1015.84, 302.00, 303.21),
    ("all_reduce_ops_types_all_2_13.txt", 0, 8 << 30, 580205, 9.87, 9.91),
    ("hypercube_cut_ts_crlf.txt", 0, 256 << 20, 1848.09, 166.00, 166.66),
    ("all_gather_2_17.json", 0, 32 << 20, 416.179002, 86.0, 86.34),
    ("nonmpi_build_two_processes_2_13.txt", 0, 1 << 30, 725.50, 0.0, 0.0),
    ("nonmpi_build_two_processes_2_13.txt", 1, 1 << 30, 714.87, 0.0, 0.0),
]


def _read(name: str) -> object:
    return parse_nccl_tests((FIX / "nccl-tests" / name).read_bytes().decode(), name)


@pytest.mark.parametrize(("name", "run", "size", "time_us", "oop_bus", "ip_bus"), PRINTED)
def test_a_row_reads_as_printed(
    name: str, run: int, size: int, time_us: float, oop_bus: float, ip_bus: float
) -> None:
    rows = parse_nccl_tests((FIX / "nccl-tests" / name).read_bytes().decode(), name).rows
    hits = rows.filter((rows["run"] == run) & (rows["size_bytes"] == size)).to_dicts()
    assert len(hits) >= 1, name
    r = hits[-1]
    assert r["oop_time_s"] == pytest.approx(time_us * 1e-6)
    assert r["oop_bus_bw_bytes_per_s"] == pytest.approx(oop_bus * 1e9)
    assert r["ip_bus_bw_bytes_per_s"] == pytest.approx(ip_bus * 1e9)


def test_wrong_counts_and_validation_off() -> None:
    srun = parse_nccl_tests((FIX / "nccl-tests/srun_label_alltoall_2_13.txt").read_text(), "x")
    assert srun.rows["oop_wrong"].null_count() == srun.rows.height  # -c 0: N/A
    ray = parse_nccl_tests((FIX / "nccl-tests/ray_ompi_sendrecv.txt").read_text(), "x")
    assert ray.rows["oop_wrong"].to_list() == [0.0] * 4
    assert ray.rows["ip_wrong"].null_count() == 4  # sendrecv in-place: N/A
    cut = parse_nccl_tests((FIX / "nccl-tests/hypercube_cut_ts_crlf.txt").read_text(), "x")
    assert dict(cut.skipped) == {"table row cut and never completed": 1}
    assert cut.runs["avg_bus_bw_bytes_per_s"].to_list() == [None]


def _rows(text: str) -> list[tuple[object, ...]]:
    read = parse_nccl_tests(text, "x")
    return read.rows.drop("line_no").rows()


PREFIXES = {
    "open-mpi": "[1,3]<stdout>:",
    "srun": " 3: ",
    "intel-mpi": "[12] ",
    "torchrun": "[default0]:",
    "ray": "(RayTrainWorker pid=4411, ip=10.0.0.5) ",
    "pdsh": "node-a: ",
    "iso": "2026-03-02T11:04:31.123456Z ",
    "bracketed": "[2026-03-02 11:04:31] ",
    "ts": "Mar  2 11:04:31 ",
}


@pytest.mark.parametrize("path", NT, ids=lambda p: p.name)
def test_nccl_tests_damaged_reads_the_same_rows(path: Path) -> None:
    text = path.read_text()
    base = _rows(text)
    assert base
    assert _rows(text.replace("\n", "\r\n")) == base
    for prefix in PREFIXES.values():
        assert _rows("\n".join(prefix + line for line in text.splitlines())) == base, prefix
    log = "node-z:11:12 [3] NCCL INFO Channel 00/02 : 0 1 2 3"
    assert _rows("\n".join(f"{line}\n{log}" for line in text.splitlines())) == base


#: Fixtures whose rows are stitched from pieces with other lines between them.
STITCHED = {"intelmpi_interleaved_rows_2_13.txt"}


@pytest.mark.parametrize("path", NT, ids=lambda p: p.name)
def test_nccl_tests_cut_anywhere_keeps_the_whole_rows_before(path: Path) -> None:
    lines = path.read_text().splitlines()
    read = parse_nccl_tests("\n".join(lines), "x").rows
    full = read.drop("line_no").rows()
    starts = read["line_no"].to_list()
    # The line a row is whole by: its own (1-based), or for a stitched one at the latest
    # the line before the next row starts (the end of the file for the last).
    ends = starts if path.name not in STITCHED else [n - 1 for n in starts[1:]] + [len(lines)]
    assert len(full) >= 2, path.name
    for k in range(len(lines) + 1):
        part = _rows("\n".join(lines[:k]))
        # A row stitched from pieces can only be whole once its last piece is in ...
        assert all(row in full for row in part), (path.name, k)
        # ... and every row whose lines are all in is read: the cut loses no more.
        done = [row for row, end in zip(full, ends, strict=True) if end <= k]
        assert part[: len(done)] == done, (path.name, k)
        if path.name not in STITCHED:
            assert part == done, (path.name, k)


def test_a_bad_line_in_the_table_costs_only_itself() -> None:
    text = (FIX / "nccl-tests/ompi_tag_all_reduce_mpi_2_16.txt").read_text()
    lines = text.splitlines()
    k = next(i for i, line in enumerate(lines) if "4194304 " in line)
    damaged = [*lines[:k], "[1,0]<stdout>:     8388608   \x00\x00 garbage 1.0 2.0", *lines[k:]]
    read = parse_nccl_tests("\n".join(damaged), "x")
    assert read.rows.height == 6
    assert sum(read.skipped.values()) == 1


def test_non_finite_values_read_as_null() -> None:
    text = (FIX / "nccl-tests/all_gather_2_13.txt").read_text()
    text = text.replace("101.2   10.36    7.77", "101.2    -nan     inf")
    text = text.replace("# Avg bus bandwidth    : 10.7036", "# Avg bus bandwidth    : -nan")
    read = parse_nccl_tests(text, "x")
    first = read.rows.row(0, named=True)
    assert first["oop_algo_bw_bytes_per_s"] is None
    assert first["oop_bus_bw_bytes_per_s"] is None
    assert read.rows.height == 5
    assert read.runs["avg_bus_bw_bytes_per_s"].to_list() == [None]


def test_nccl_tests_json_is_sniffed_and_a_cut_one_keeps_whole_results() -> None:
    raw = (FIX / "nccl-tests/all_gather_2_17.json").read_bytes()
    assert sniff_tool(raw[:8192]) == "nccl_tests"
    whole = parse_nccl_tests(raw.decode(), "x")
    assert whole.rows.height == 3
    assert whole.runs["test"].to_list() == ["all_gather"]
    text = raw.decode()
    cut = text[: text.index('"size":33554432') - 2]  # the job killed while writing
    read = parse_nccl_tests(cut, "x")
    assert read.rows["size_bytes"].to_list() == [2 << 20, 8 << 20]
    assert "JSON cut or damaged: whole results read one by one" in read.skipped


@pytest.mark.parametrize(
    ("line", "left"),
    [
        ("[1,0]<stdout>:# nThread 1", "# nThread 1"),
        ("(head, rank=0, pid=3808) [1,0]<stdout>:#  Rank  0", "#  Rank  0"),
        (" 0: # Using devices", "# Using devices"),
        ("Feb 27 22:40:00 [1,2]<stderr>:x", "x"),
        ("2026-03-02 11:04:31,120 node-a: 1024 256", "1024 256"),
        # never a row, a RAS line or an NCCL line of its own
        ("     1048576        262144     float", "     1048576        262144     float"),
        ("(total)   per node  per process", "(total)   per node  per process"),
        (
            "    0         1         4         8        32",
            "    0         1         4         8        32",
        ),
        ("h:1:2 [0] NCCL INFO comm 0x1 rank 0", "h:1:2 [0] NCCL INFO comm 0x1 rank 0"),
        ("  Rank 12 -- GPU 4 managed by", "  Rank 12 -- GPU 4 managed by"),
    ],
)
def test_strip_prefix(line: str, left: str) -> None:
    assert strip_prefix(line) == left


def _ras(read: object) -> tuple[object, ...]:
    from ncclscope.parsers.tools.ras import RasRead

    assert isinstance(read, RasRead)
    return (
        read.report.drop("file_id").rows(),
        read.comms.drop("file_id").rows(),
        read.ranks.drop("file_id").rows(),
    )


@pytest.mark.parametrize("path", RAS, ids=lambda p: p.name)
def test_ras_damaged_reads_the_same(path: Path) -> None:
    text = path.read_text()
    assert sniff_tool(text.encode()[:8192]) == "ras_text"
    base = _ras(parse_ras_text(text, "x"))
    assert base[1]
    assert _ras(parse_ras_text(text.replace("\n", "\r\n"), "x")) == base
    for prefix in PREFIXES.values():
        prefixed = "\n".join(prefix + line for line in text.splitlines())
        assert sniff_tool(prefixed.encode()[:8192]) == "ras_text", prefix
        assert _ras(parse_ras_text(prefixed, "x")) == base, prefix
    lines = text.splitlines()
    whole = parse_ras_text(text, "x").ranks
    # The last line naming each rank read (its process and node, or its rank): by then
    # it is read, however the file is cut after.
    by: dict[tuple[object, ...], int] = {}
    for r in whole.iter_rows(named=True):
        names = [f"process {r['pid']} on node {r['host']}"] if r["pid"] is not None else []
        names += [f"Rank {r['comm_rank']} "] if r["comm_rank"] is not None else []
        at = [n for n, line in enumerate(lines, 1) if any(w.lower() in line.lower() for w in names)]
        assert at, (path.name, r)
        by[_rank_key(r)] = max(at)
    for k in range(len(lines) + 1):
        part = parse_ras_text("\n".join(lines[:k]), "x")  # never raises
        assert part.ranks.height <= whole.height
        read = {_rank_key(r) for r in part.ranks.iter_rows(named=True)}
        assert read <= set(by), (path.name, k)
        assert {key for key, n in by.items() if n <= k} <= read, (path.name, k)


def _rank_key(r: dict[str, object]) -> tuple[object, ...]:
    return (r["comm_hash"], r["comm_rank"], r["pid"], r["host"])


def test_ras_polled_file_reads_the_last_report() -> None:
    read = parse_ras_text((FIX / "ras/ras_polled_2_26_two_reports.txt").read_text(), "x")
    assert read.notes == ["2 reports in this file; the last one is read"]
    assert read.comms["errors"].to_list() == ["MISMATCH", "OK"]
    doc = (
        (FIX / "ras/ras_2_28_json_dead.json")
        .read_text()
        .replace('"nvml_dev": 0\n', '"nvml_dev": 0,\n')
    )
    first = doc.replace('"considered_dead": true', '"considered_dead": false')
    two = parse_ras_json(first + "\n" + doc, "x")
    assert two.problem is None
    assert "2 reports in this file; the last one is read" in two.notes
    assert two.ranks["state"].to_list() == ["mismatch", "dead"]


def test_ras_json_after_ncs_ok_ack_and_a_null_status() -> None:
    raw = (FIX / "ras/ras_2_28_json_after_ok_ack.json").read_bytes()
    assert raw.startswith(b"OK\n")
    assert sniff_tool(raw) == "ras_json"
    read = parse_ras_json(raw.decode(), "x")
    assert read.problem is None
    # rank 3's "status": null counts for no status: the abort of rank 1 still shows
    assert read.comms["status"].to_list() == ["RUNNING", "ABORT", "RUNNING"]
    assert read.report["timeouts"].to_list() == [1]


def test_ncclras_connection_failure_is_a_problem_not_a_report() -> None:
    text = (
        "Connecting to 127.0.0.1:28028: Connection refused\n"
        "Failed to connect to the NCCL RAS service!\n"
        "Please make sure that the NCCL job has the RAS service enabled and that\n"
        "the RAS client was started on a node where the NCCL job is running.\n"
    )
    assert sniff_tool(text.encode()) == "ras_text"
    read = parse_ras_text(text, "x")
    assert read.problem is not None
    assert read.problem.startswith("ncclras could not reach the job: Connecting to 127.0.0.1")
    assert read.report.height == 0


def test_ras_rank_numbers_past_int32_are_counted_not_crashed() -> None:
    text = (FIX / "ras/ras_2_27_uneven_incomplete.txt").read_text()
    text = text.replace("  Rank 19 -- [process", "  Rank 3057455228 -- [process")
    read = parse_ras_text(text, "x")
    assert read.skipped["rank or process id out of range"] == 1
    assert 19 not in read.ranks["comm_rank"].to_list()


def test_every_fixture_is_in_the_readme() -> None:
    for tool in ("nccl-tests", "ras"):
        readme = (FIX / tool / "README.md").read_text()
        for p in (FIX / tool).iterdir():
            if p.name not in ("README.md", "expected.json"):
                assert f"`{p.name}`" in readme, p.name
    doc = json.loads((FIX / "nccl-tests/expected.json").read_text())
    runs = doc["nccl_tools"]["nccl_tests"]["runs"]
    assert {Path(r["path"]).name for r in runs} == {p.name for p in NT} | {"all_gather_2_17.json"}


def test_ras_foreign_lines_after_the_report_are_told_apart() -> None:
    read = parse_ras_text((FIX / "ras/ras_2_27_uneven_incomplete.txt").read_text(), "x")
    assert dict(read.skipped) == {"line not from ncclras": 1}
    text = (FIX / "ras/ras_2_26_many_comms_stragglers.txt").read_text()
    damaged = text.replace("  3 ranks have launched", "  3 ranks hav\x00e launched")
    assert dict(parse_ras_text(damaged, "x").skipped) == {"report line not understood": 1}


@pytest.mark.parametrize(
    ("name", "root", "redop"),
    [
        ("all_gather_2_13.txt", -1, "none"),
        ("broadcast_old_check_off.txt", 0, None),
        ("all_reduce_2_8_old.txt", None, "sum"),
    ],
)
def test_a_table_pasted_without_its_header(name: str, root: int | None, redop: str | None) -> None:
    """Users often paste the rows alone (with the footer): the writer's columns are
    taken from the row's width and its fourth token."""
    text = (FIX / "nccl-tests" / name).read_text()
    whole = parse_nccl_tests(text, "x").rows.drop("line_no", "test")
    rows = [line for line in text.splitlines() if line.strip()[:1].isdigit()]
    pasted = "\n".join([*rows, "# Out of bounds values : 0 OK"])
    assert sniff_tool(pasted.encode()) == "nccl_tests"
    read = parse_nccl_tests(pasted, "x")
    assert read.notes == ["a table without its column header: columns taken from the rows"]
    assert read.rows.drop("line_no", "test").to_dicts() == whole.to_dicts()
    assert set(read.rows["root"].to_list()) == {root}
    assert set(read.rows["redop"].to_list()) == {redop}


#: MSCCL++'s copies of nccl-tests' writer: the in-place half first, and (for tests with
#: no out-of-place variant) only that half printed; no ``type`` column.
_INPLACE_FIRST = """\
#                                        in-place                       out-of-place
#       size         count     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)     (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
     4194304       1048576    61.25   68.48  119.84      0{second}
     8388608       2097152    101.9   82.32  144.06      0{second}

# Out of bounds values : 0 OK
"""


@pytest.mark.parametrize("second", ["", "    70.10   59.83  104.70      0"])
def test_a_table_with_the_in_place_half_first(second: str) -> None:
    read = parse_nccl_tests(_INPLACE_FIRST.format(second=second), "x")
    assert dict(read.skipped) == {}
    rows = read.rows
    assert rows["size_bytes"].to_list() == [4 << 20, 8 << 20]
    # The first half printed is the in-place one, whatever the order of the columns.
    assert rows["ip_bus_bw_bytes_per_s"].to_list() == [119.84e9, 144.06e9]
    assert rows["ip_time_s"].to_list() == pytest.approx([61.25e-6, 101.9e-6])
    oop = rows["oop_bus_bw_bytes_per_s"].to_list()
    assert oop == ([None, None] if not second else [104.70e9, 104.70e9])


def test_a_short_row_under_nccl_tests_own_header_is_a_cut_row() -> None:
    # Out-of-place first (nccl-tests itself): a row with one half is cut, not half a row.
    text = (FIX / "nccl-tests/all_gather_2_13.txt").read_text()
    rows = [line for line in text.splitlines() if line.strip()[:1].isdigit()]
    half = " ".join(rows[0].split()[:9])  # size, count, type, redop, root, one half
    cut = text.replace(rows[0], half)
    read = parse_nccl_tests(cut, "x")
    assert read.skipped["table row cut and never completed"] == 1
    assert read.rows.height == len(rows) - 1
