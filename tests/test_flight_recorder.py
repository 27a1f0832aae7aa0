"""PyTorch Flight Recorder dumps as an input (issue #15): the formats, safety, damage,
dumps beside logs in one ``analyze`` call, and the join to the logs' COLL lines.

The dumps are built here as dicts, in the shapes ``FlightRecorder.hpp`` writes
(``shared/formats/deepspeed-torch.md`` T7) and PyTorch 2.14 wrote on gloo
(``/work/fr-format.md``), then pickled or dumped to JSON.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import COLLS, OPCOUNTS, CliRun, write_sample

from ncclscope.analysis import build
from ncclscope.model.flight import join_flight, read_flight
from ncclscope.parsers.torch.flight import (
    DumpRefusedError,
    load_dump,
    normalise_op,
    read_dump,
    sniff_dump,
)
from ncclscope.schema import FLIGHT_JOIN_SCHEMA, FLIGHT_SCHEMA
from ncclscope.sources import expand_inputs
from ncclscope.units import DTYPE_BYTES

T0 = 1_764_124_400_000_000_000  # 2025-11-26 02:33:20 UTC, in ns
TORCH_FRAME = {
    "name": "all_reduce",
    "filename": "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
    "line": 2950,
}
USER_FRAME = {"name": "train_step", "filename": "/home/u/train.py", "line": 42}
#: profiling name and torch dtype of the sample log's ops (conftest.COLLS)
_TORCH = {"AllReduce": ("all_reduce", "Float"), "Broadcast": ("broadcast", "BFloat16")}
_DTYPE_OF = {7: "Float", 9: "BFloat16"}


def entry(k: int, rank: int, *, state: str = "completed", **over: Any) -> dict[str, Any]:
    """The k-th (0-based) collective of ``rank`` as a 2.x entry: the sample log's k-th
    call (conftest.COLLS), collective_seq_id k + 1."""
    op, count, dtype = COLLS[k % len(COLLS)]
    name, _ = _TORCH[op]
    e: dict[str, Any] = {
        "frames": [TORCH_FRAME, USER_FRAME],
        "record_id": k,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "thread_name": "python",
        "thread_id": "140421802294144",
        "collective_seq_id": k + 1,
        "p2p_seq_id": 0,
        "op_id": k + 1,
        "profiling_name": f"nccl:{name}",
        "time_created_ns": T0 + k * 10_000_000 + rank * 1_000,
        "input_sizes": [[count]],
        "input_dtypes": [_DTYPE_OF[dtype]],
        "output_sizes": [[count]],
        "output_dtypes": [_DTYPE_OF[dtype]],
        "state": state,
        "time_discovered_started_ns": None if state == "scheduled" else T0 + k * 10**7 + 5_000,
        "time_discovered_completed_ns": T0 + k * 10**7 + 9_000 if state == "completed" else None,
        "retired": state == "completed",
        "timeout_ms": 600_000,
        "is_p2p": False,
    }
    e.update(over)
    return e


def dump(rank: int, n: int = 10, *, last_state: str = "scheduled", **top: Any) -> dict[str, Any]:
    """A 2.x dump of ``rank`` (of 2) with ``n`` collectives, the last in ``last_state``."""
    entries = [entry(k, rank, state="completed" if k < n - 1 else last_state) for k in range(n)]
    d: dict[str, Any] = {
        "version": "2.10",
        "comm_lib_version": "2.23.4",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": n,
                "last_started_collective": -1,
                "last_completed_collective": n - 1,
            }
        },
        "entries": entries,
    }
    d.update(top)
    return d


#: Keys a 1.x entry does not have.
_NOT_IN_1X = (
    "process_group", "collective_seq_id", "p2p_seq_id", "op_id", "is_p2p",
    "thread_name", "thread_id", "timeout_ms", "input_dtypes", "output_dtypes",
)  # fmt: skip


def v1_dump(rank: int) -> dict[str, Any]:
    """A 1.x dump (PyTorch 2.2): ``seq_id``, no process group tuple, no pg_status."""
    entries = []
    for k in range(3):
        e = entry(k, rank)
        for key in _NOT_IN_1X:
            e.pop(key)
        e["seq_id"] = k + 1
        entries.append(e)
    return {"version": "1.1", "entries": entries}


def json_dump(rank: int, n: int = 10) -> str:
    """What ``_dump_fr_trace_json`` writes: 0 for unseen times, strings in pg_status,
    lists for tuples, no frames, keys sorted."""
    d = dump(rank, n)
    for e in d["entries"]:
        e.pop("frames")
        for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            e[key] = e[key] or 0
    d["pg_status"] = {pg: {k: str(v) for k, v in st.items()} for pg, st in d["pg_status"].items()}
    d["nccl_comm_state"] = {}
    return json.dumps(d, sort_keys=True)


def write_dumps(
    where: Path, make: Callable[[int], dict[str, Any]] = dump, protocol: int = 2
) -> list[Path]:
    where.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in range(2):
        path = where / f"nccl_trace_rank_{rank}"
        path.write_bytes(pickle.dumps(make(rank), protocol=protocol))
        paths.append(path)
    return paths


def read(path: Path) -> Any:
    kind = sniff_dump(path.read_bytes()[:8192])
    assert kind is not None, path
    return read_dump(path, str(path), kind)


# --- detection by content


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_a_pickled_dump_is_found_by_content_whatever_the_protocol(protocol: int) -> None:
    assert sniff_dump(pickle.dumps(dump(0), protocol=protocol)) == "flight_pickle"


def test_what_is_not_a_dump_is_not_taken_for_one() -> None:
    assert sniff_dump(json_dump(0).encode()) == "flight_json"
    assert sniff_dump(b"  \n" + json_dump(0).encode()) == "flight_json"
    # a checkpoint-like pickle (a dict without the dump's keys), a list, a log, JSON config
    assert sniff_dump(pickle.dumps({"model": [1, 2], "version": 3})) is None
    assert sniff_dump(pickle.dumps([dump(0)])) is None
    assert sniff_dump(b"node-a:1:1 [0] NCCL INFO AllReduce: opCount 0\n") is None
    assert sniff_dump(b'{"train_batch_size": 8}') is None
    assert sniff_dump(b'{"step": 3, "entries": 12}\n{"step": 4, "entries": 9}\n') is None
    assert sniff_dump(b"") is None


def test_a_gzipped_dump_is_read_after_decompression(tmp_path: Path) -> None:
    import gzip

    path = tmp_path / "nccl_trace_rank_5.gz"
    path.write_bytes(gzip.compress(pickle.dumps(dump(5))))
    inputs, _ = expand_inputs([str(path)], workdir=tmp_path / "w")
    assert [i.kind for i in inputs] == ["flight_pickle"]
    tables, _ = read_flight([(inputs[0].display, inputs[0].path, inputs[0].kind)], 0)
    assert tables.dumps.select("rank", "read").row(0) == (5, 10)


def test_dumps_in_a_directory_are_inputs_of_their_own_kind(tmp_path: Path) -> None:
    write_dumps(tmp_path / "run")
    (tmp_path / "run" / "rank2.json").write_text(json_dump(2))
    write_sample(tmp_path / "run" / "train.log")
    (tmp_path / "run" / "ckpt.pt").write_bytes(pickle.dumps({"w": [1.0]}))
    inputs, problems = expand_inputs([str(tmp_path / "run")], workdir=tmp_path / "w")
    kinds = {Path(i.display).name: i.kind for i in inputs}
    assert problems == []
    assert kinds == {
        "nccl_trace_rank_0": "flight_pickle",
        "nccl_trace_rank_1": "flight_pickle",
        "rank2.json": "flight_json",
        "train.log": "log",
    }


# --- formats and versions


def test_a_2x_pickle_is_read_entry_by_entry(tmp_path: Path) -> None:
    path = write_dumps(tmp_path)[1]
    d = read(path)
    assert (d.format, d.version, d.layout, d.rank, d.rank_source) == (
        "pickle", "2.10", "2.x", 1, "file_name",
    )  # fmt: skip
    assert (d.n_entries, d.rows.height, d.skipped, d.problem) == (10, 10, {}, None)
    assert d.groups == [("0", "default_pg", [0, 1])]
    assert d.status == [(0, 10, -1, 9)]
    tables, _ = read_flight([(str(path), path, "flight_pickle")], first_file_id=3)
    e = tables.entries
    assert e.schema == FLIGHT_SCHEMA
    first = e.row(0, named=True)
    assert first["file_id"] == 3
    assert first["rank"] == 1
    assert (first["op"], first["backend"], first["pg_name"], first["pg_desc"]) == (
        "Broadcast", "nccl", "0", "default_pg",
    )  # fmt: skip
    assert (first["input_numel"], first["input_dtype"], first["input_bytes"]) == (
        1024, "BFloat16", 2048,
    )  # fmt: skip
    assert (first["coll_count"], first["coll_dtype"]) == (1024, 9)
    assert first["frame"] == "train_step at /home/u/train.py:42"
    assert first["created_ts"].isoformat() == "2025-11-26T02:33:20.000001+00:00"
    assert first["completed_ts"] is not None
    assert first["completed"] is True
    last = e.row(-1, named=True)
    assert (last["state"], last["started_ts"], last["completed"], last["retired"]) == (
        "scheduled", None, False, False,
    )  # fmt: skip
    assert e["op"].to_list()[:3] == ["Broadcast", "AllReduce", "AllReduce"]


def test_the_json_form_reads_like_the_pickle(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    pk = write_dumps(tmp_path / "p")[0]
    js = tmp_path / "nccl_trace_rank_0.json"
    js.write_text(json_dump(0))
    a = read_flight([("pk", pk, "flight_pickle"), ("js", js, "flight_json")], 0)[0]
    cols = ["rank", "collective_seq_id", "op", "state", "completed", "created_ts",
            "started_ts", "completed_ts", "input_bytes"]  # fmt: skip
    by_file = a.entries.partition_by("file_id", as_dict=True)
    assert by_file[(0,)].select(cols).equals(by_file[(1,)].select(cols))
    assert by_file[(1,)]["frame"].null_count() == 10  # JSON dumps carry no frames
    assert a.pg_status.filter(pl.col("file_id") == 1).row(0)[4:] == (10, -1, 9)
    assert a.dumps["format"].to_list() == ["pickle", "json"]


def test_a_1x_dump_reads_seq_id_and_the_group_from_pg_id(tmp_path: Path) -> None:
    path = write_dumps(tmp_path, v1_dump)[0]
    d = read(path)
    assert (d.layout, d.version, d.skipped, d.rows.height) == ("1.x", "1.1", {}, 3)
    t = read_flight([("d", path, "flight_pickle")], 0)[0].entries
    assert t["collective_seq_id"].to_list() == [1, 2, 3]
    assert t["pg_name"].to_list() == ["0", "0", "0"]
    assert t["input_bytes"].null_count() == 3  # no dtypes in 1.x: bytes unknown
    assert t["input_numel"].to_list() == [1024, 262144, 262144]


def test_an_unknown_version_is_read_by_the_keys_there_and_noted(tmp_path: Path) -> None:
    path = write_dumps(tmp_path, lambda r: dump(r, version="3.0"))[0]
    d = read(path)
    assert d.layout == "unknown"
    assert d.rows.height == 10
    assert any("version 3.0" in n for n in d.notes)


def test_gloo_2_14_shapes_default_group_and_completion(tmp_path: Path) -> None:
    """PyTorch 2.14 on gloo: pg_config names the default group "", state stays
    "scheduled" for completed calls (completion is in pg_status only)."""

    def gloo(rank: int) -> dict[str, Any]:
        d = dump(rank, 4)
        d["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}
        d["comm_lib_version"] = ""
        for e in d["entries"]:
            e.update(profiling_name=e["profiling_name"].replace("nccl:", "gloo:"),
                     state="scheduled", time_discovered_started_ns=None,
                     time_discovered_completed_ns=None)  # fmt: skip
        return d

    def two_groups(rank: int) -> dict[str, Any]:
        d = gloo(rank)
        d["entries"].append(entry(4, rank, process_group=("1", "dp"), pg_id=1,
                                  collective_seq_id=1, record_id=4))  # fmt: skip
        return d

    path = write_dumps(tmp_path, gloo)[0]
    t = read_flight([("d", path, "flight_pickle")], 0)[0]
    assert t.groups.select("pg_name", "pg_desc").row(0) == ("0", "default_pg")
    # pg_config names only "" even with a second group: "" is the default group ("0"),
    # the other group's members stay unknown.
    (tmp_path / "two").mkdir()
    two = write_dumps(tmp_path / "two", two_groups)
    t2 = read_flight([(str(p), p, "flight_pickle") for p in two], 0)[0]
    assert t2.groups.select("pg_name", "pg_ranks").unique().rows() == [("0", [0, 1])]
    assert sorted(t2.entries["pg_name"].unique().to_list()) == ["0", "1"]
    # Members of "1" unknown; the ranks that recorded calls in it are a lower bound.
    groups = join_flight(t2, pl.DataFrame(), None).pg_comms
    assert groups.select("pg_name", "pg_ranks", "ranks_with_entries", "reason").rows() == [
        ("0", [0, 1], [0, 1], "no_logs"),
        ("1", None, [0, 1], "no_logs"),
    ]
    assert t.entries["completed"].to_list() == [True, True, True, False]
    assert t.entries["backend"].unique().to_list() == ["gloo"]
    assert t.dumps["comm_lib_version"].to_list() == [None]


def test_the_rank_comes_from_a_send_when_the_name_has_none(tmp_path: Path) -> None:
    d = dump(0, 2)
    d["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[4, 7]"}}
    d["entries"].append(entry(2, 0, profiling_name="nccl:send 1->0", is_p2p=True, p2p_seq_id=1))
    path = tmp_path / "trace.pkl"
    path.write_bytes(pickle.dumps(d))
    r = read(path)
    assert (r.rank, r.rank_source) == (7, "p2p")
    assert normalise_op("nccl:recv 3<-0") == ("nccl", "Recv", 3, 0)
    assert normalise_op("nccl:_all_gather_base") == ("nccl", "AllGather", None, None)
    assert normalise_op("custom_op") == (None, "custom_op", None, None)


# --- safety


class _Payload:
    """A pickle that creates ``marker`` when loaded by an ordinary unpickler."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def test_a_reduce_payload_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    hostile = dump(0)
    hostile["entries"][3]["frames"] = [_Payload(marker)]
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(hostile, protocol=2))
    # The control: an ordinary unpickler runs the payload.
    pickle.loads(path.read_bytes())
    assert marker.exists()
    marker.rmdir()

    d = read(path)
    assert d.problem == "pickle refers to posix.mkdir: refused, dumps hold only plain data"
    assert d.rows.is_empty()
    assert not marker.exists()


def test_a_payload_calling_os_system_is_refused_by_name(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    # GLOBAL os.system, the command, TUPLE1, REDUCE: what a hand-made exploit writes.
    evil = (
        b"\x80\x02}(X\x07\x00\x00\x00versionX\x04\x00\x00\x002.10"
        b"X\x09\x00\x00\x00pg_config}X\x07\x00\x00\x00entries"
        b"]cos\nsystem\n(X" + len(f"touch {marker}").to_bytes(4, "little")
        + f"touch {marker}".encode() + b"tRa" + b"u."
    )  # fmt: skip
    assert sniff_dump(evil) == "flight_pickle"
    pickle.loads(evil)  # the control: an ordinary unpickler runs the command
    assert marker.exists()
    marker.unlink()
    with pytest.raises(DumpRefusedError, match=r"os\.system: refused"):
        load_dump(evil, "pickle")
    assert not marker.exists()


def test_the_cli_refuses_a_hostile_dump_with_a_message_and_status_1(
    tmp_path: Path, analyze: Callable[..., CliRun]
) -> None:
    marker = tmp_path / "pwned"
    hostile = dump(0)
    hostile["entries"].append(_Payload(marker))
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps(hostile))
    run = analyze([tmp_path])
    assert run.code == 1
    assert not marker.exists()
    assert "nccl_trace_rank_0: pickle refers to posix.mkdir: refused" in run.stderr
    assert run.doc is not None
    (d,) = run.doc["flight_recorder"]["dumps"]
    assert d["problem"].startswith("pickle refers to")
    assert d["read"] == 0


# --- damage


def test_truncated_and_garbage_dumps_give_a_message_not_a_traceback(tmp_path: Path) -> None:
    whole = pickle.dumps(dump(0), protocol=2)
    cases = {
        "cut_pickle": whole[: len(whole) // 2],
        "cut_json": json_dump(0).encode()[:700],
        "bad_opcode": whole[:300] + b"\xff" * 40,
        "list_top": b'{"entries": [1]}'.replace(b"{", b"[", 1),
    }
    messages = {}
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        kind = sniff_dump(data)
        if kind is None:
            continue
        messages[name] = read_dump(path, name, kind).problem
    assert messages["cut_pickle"] == "pickle data ends early (was the file cut?): nothing read"
    assert messages["cut_json"] is not None
    assert messages["cut_json"].startswith("invalid JSON at")
    assert messages["bad_opcode"] is not None
    assert "nothing read" in messages["bad_opcode"]
    assert "list_top" not in messages  # a JSON list is not a dump at all


def test_entries_with_bad_fields_are_counted_and_the_rest_is_read(tmp_path: Path) -> None:
    d = dump(0, 10)
    bad = d["entries"]
    bad[0]["collective_seq_id"] = "3"  # ill-typed
    bad[1]["state"] = "finished"  # out of range
    del bad[2]["profiling_name"]  # missing
    bad[3]["time_created_ns"] = -5  # out of range
    bad[4]["input_sizes"] = [["1024"]]  # ill-typed
    bad[5]["retired"] = 1  # ill-typed (not a bool)
    bad[6]["record_id"] = 2**70  # beyond int64
    bad[7]["duration_ms"] = -1.0
    bad.append("not an entry")
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(d))
    r = read(path)
    assert r.rows.height == 2
    assert r.n_entries == 11
    assert dict(r.skipped) == {
        "ill-typed collective_seq_id": 1,
        "out-of-range state": 1,
        "missing profiling_name": 1,
        "out-of-range time_created_ns": 1,
        "ill-typed input_sizes": 1,
        "ill-typed retired": 1,
        "out-of-range record_id": 1,
        "out-of-range duration_ms": 1,
        "not a dict": 1,
    }


def test_unhashable_fields_and_sizes_past_int64_skip_their_entry(tmp_path: Path) -> None:
    """Fuzz (#28): a list where a string belongs (process_group, state, profiling_name)
    and a size whose element count passes int64 cost their entry, not the dump."""
    d = dump(0, 10)
    bad = d["entries"]
    bad[0]["process_group"] = ["0", []]  # a tuple holding a list: unhashable
    bad[1]["state"] = []
    bad[2]["profiling_name"] = ["nccl:all_reduce"]
    bad[3]["input_sizes"] = [[2**64]]
    bad[4]["output_sizes"] = [[2**40, 2**40]]
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(d))
    r = read(path)
    assert r.problem is None
    assert r.rows.height == 5
    assert dict(r.skipped) == {
        "ill-typed process_group": 1,
        "ill-typed state": 1,
        "ill-typed profiling_name": 1,
        "out-of-range input_sizes": 1,
        "out-of-range output_sizes": 1,
    }


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("pg_status", 2**64),
        ("pg_status", "9999999999999999999"),
        ("pg_status", -(2**63) - 1),
        ("pg_status_key", "9999999999999999999"),
        ("ranks", [0, 2**40]),
        ("ranks", [0, 2**64]),
        ("ranks", "[0, 99999999999999999999]"),
    ],
)
def test_group_and_status_numbers_past_their_column_are_left_out(
    tmp_path: Path, analyze: Callable[..., CliRun], where: str, value: Any
) -> None:
    """Fuzz (#28): a pg_status number past int64 or a rank past int32 is left out with a
    note; the dump's entries and the other dumps are read (it was a traceback)."""

    def make(rank: int) -> dict[str, Any]:
        d = dump(rank)
        if rank == 0 and where == "pg_status":
            d["pg_status"]["0"]["last_completed_collective"] = value
        elif rank == 0 and where == "pg_status_key":
            d["pg_status"][value] = d["pg_status"]["0"]
        elif rank == 0:
            d["pg_config"]["0"]["ranks"] = value
        return d

    paths = write_dumps(tmp_path / "dumps", make)
    r = read(paths[0])
    assert r.rows.height == 10
    assert any("pg_status" in n or "rank list" in n for n in r.notes), r.notes
    result = analyze([tmp_path / "dumps"])
    assert result.code == 0, result.stdout + result.stderr
    assert result.doc is not None
    assert len(result.doc["flight_recorder"]["dumps"]) == 2


# --- in analyze, beside logs


def test_dumps_and_logs_in_one_analyze_call(tmp_path: Path, analyze: Callable[..., CliRun]) -> None:
    write_dumps(tmp_path / "run")
    write_sample(tmp_path / "run" / "train.log")
    run = analyze([tmp_path / "run"])
    assert run.code == 0, run.stderr
    doc = run.doc
    assert doc is not None
    assert [i["path"] for i in doc["inputs"]] == [str(tmp_path / "run" / "train.log")]
    fr = doc["flight_recorder"]
    assert [(d["rank"], d["read"], d["skipped"]) for d in fr["dumps"]] == [(0, 10, 0), (1, 10, 0)]
    assert fr["entries"] == 20
    assert fr["ranks"] == [0, 1]
    assert fr["versions"] == ["2.10"]
    assert fr["entries_by_state"] == {"scheduled": 2, "started": 0, "completed": 18}
    (group,) = fr["process_groups"]
    assert group["join"] == "joined"
    assert group["ranks"] == [0, 1]
    assert (group["seq_offset"], group["checked"], group["agreed"]) == (OPCOUNTS[0] - 1, 20, 20)
    assert doc["collectives"]["calls"] == 20  # the logs' own counts are unchanged


def test_the_text_report_says_what_came_from_the_dumps(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ncclscope.cli import cli

    write_sample(tmp_path / "train.log")
    write_dumps(tmp_path)
    out = CliRunner().invoke(cli, ["analyze", str(tmp_path), "--no-progress"]).stdout
    assert "; 2 Flight Recorder dumps" in out.splitlines()[0]
    assert "FLIGHT RECORDER (from the dumps, not the logs)" in out
    assert "2 dumps read, 2 ranks (0-1), 1 process group, 20 entries (pickle, version 2.10)" in out
    assert "COLL seq = collective_seq_id +7, 20 of 20 calls agree" in out


def test_dumps_alone_are_analysed(tmp_path: Path, analyze: Callable[..., CliRun]) -> None:
    write_dumps(tmp_path)
    run = analyze([tmp_path])
    assert run.code == 0
    assert run.doc is not None
    assert run.doc["inputs"] == []
    (group,) = run.doc["flight_recorder"]["process_groups"]
    assert (group["join"], group["comm_key"]) == ("no_logs", None)


# --- the join


def _built(tmp_path: Path) -> Any:
    return build([str(tmp_path)], workdir=tmp_path / "work").analysis


def test_the_join_puts_each_call_beside_its_coll_line(tmp_path: Path) -> None:
    write_sample(tmp_path / "train.log")
    write_dumps(tmp_path)
    a = _built(tmp_path)
    j = a.flight.joined
    assert j.schema == FLIGHT_JOIN_SCHEMA
    assert j.height == 20
    assert j["agrees"].all()
    assert j["seq"].to_list() == [s + OPCOUNTS[0] - 1 for s in range(1, 11)] * 2
    # sizes from the COLL line, state and times from the dump
    row = j.filter((pl.col("rank") == 1) & (pl.col("collective_seq_id") == 10)).row(0, named=True)
    op, count, dtype = COLLS[9]
    size = count * DTYPE_BYTES[dtype]
    assert (row["op"], row["size_bytes"], row["state"]) == (op, size, "scheduled")
    assert row["completed_ts"] is None
    assert row["line_no"] is not None
    assert a.paths[row["file_id"]].endswith("train.log")
    comm = a.flight.pg_comms.row(0, named=True)
    assert comm["comm_key"] == a.communicators["comm_key"][0]


def test_calls_that_do_not_line_up_are_not_joined(tmp_path: Path) -> None:
    write_sample(tmp_path / "train.log")

    def shuffled(rank: int) -> dict[str, Any]:
        d = dump(rank)
        for e in d["entries"]:
            e["input_sizes"] = e["output_sizes"] = [[7]]  # no COLL line has count 7
        return d

    write_dumps(tmp_path, shuffled)
    a = _built(tmp_path)
    assert a.flight.pg_comms["reason"].to_list() == ["no_alignment"]
    assert a.flight.joined.is_empty()


def test_a_group_no_communicator_has_is_not_joined(tmp_path: Path) -> None:
    write_sample(tmp_path / "train.log")

    def other_ranks(rank: int) -> dict[str, Any]:
        d = copy.deepcopy(dump(rank))
        d["pg_config"]["0"]["ranks"] = "[0, 1, 2, 3]"
        return d

    write_dumps(tmp_path, other_ranks)
    a = _built(tmp_path)
    assert a.flight.pg_comms["reason"].to_list() == ["no_communicator"]


def test_a_dump_that_starts_later_in_the_ring_still_aligns(tmp_path: Path) -> None:
    """The ring buffer kept only the last 6 calls: the offset is the same."""
    write_sample(tmp_path / "train.log")

    def tail(rank: int) -> dict[str, Any]:
        d = dump(rank)
        d["entries"] = d["entries"][4:]
        return d

    write_dumps(tmp_path, tail)
    comm = _built(tmp_path).flight.pg_comms.row(0, named=True)
    assert (comm["reason"], comm["offset"], comm["matched"]) == ("joined", OPCOUNTS[0] - 1, 12)
