"""Inspector files read by their layout (the fast path, cell by cell) give what reading
each file on its own gives (polars' JSON-lines reader, else per-field regexes): the
same records, line numbers, skip reasons and counts, on clean and damaged files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal
from test_nccl_tools import RECORD

from ncclscope.parsers.tools import inspector
from ncclscope.parsers.tools.inspector import (
    InspectorRead,
    _layout,
    read_inspector,
    read_inspector_files,
)
from ncclscope.synth.inspector import InspectorJob, inspector_files

NAMED = RECORD.replace('"nnodes":1}', '"nnodes":1,"comm_name":"dp"}')


def _rec(sn: int, base: str = RECORD) -> str:
    return base.replace('"coll_sn":3', f'"coll_sn":{sn}')


def _lines(n: int, base: str = RECORD) -> list[str]:
    return [_rec(k, base) for k in range(n)]


DAMAGED: dict[str, str] = {
    "clean": "\n".join(_lines(6)) + "\n",
    "no final newline": "\n".join(_lines(6)),
    "cut last line": "\n".join(_lines(5)) + "\n" + _rec(5)[:150],
    "crlf": "\r\n".join(_lines(6)) + "\r\n",
    "blank and space lines": "\n".join([*_lines(3), "", "   ", *_lines(3)]) + "\n",
    "comma in comm_name": "\n".join(
        [*_lines(2, NAMED), _rec(2, NAMED).replace('"dp"', '"dp,tp"'), *_lines(2, NAMED)]
    )
    + "\n",
    "spliced lines": "\n".join([*_lines(2), _rec(2)[:200] + _rec(3), *_lines(2)]) + "\n",
    "extra field at the end": "\n".join([*_lines(2), _rec(2).replace("}}", ',"x":1}}'), *_lines(2)])
    + "\n",
    "nan bandwidth": "\n".join(
        [*_lines(2), _rec(2).replace("8.388608", "nan"), _rec(3).replace("4.194304", "-nan")]
    )
    + "\n",
    "negative sn and unknown op": "\n".join(
        [*_lines(2), _rec(-4), _rec(5).replace("AllGather", "Bogus"), *_lines(1)]
    )
    + "\n",
    "string where a number is": "\n".join([*_lines(2), _rec(2).replace('"rank":1', '"rank":"1"')])
    + "\n",
    "spaces after colons": "\n".join(r.replace('":', '": ') for r in _lines(4)) + "\n",
    "other key order": "\n".join(
        r.replace('"coll":"AllGather","coll_sn"', '"coll_sn"').replace(
            '"coll_busbw_gbs":4.194304}}', '"coll_busbw_gbs":4.194304,"coll":"AllGather"}}'
        )
        for r in _lines(4)
    )
    + "\n",
    "verbose event trace": "\n".join(
        r.replace("}}", ',"event_trace_sn":[1,2,3],"event_trace_ts":[4,5]}}') for r in _lines(3)
    )
    + "\n",
    "binary garbage": "\n".join([*_lines(2), "\x00\x01\xff,,,}}", *_lines(2)]) + "\n",
    "commas and braces only": "\n".join([*_lines(2), ",,,,,,,,,,,,,,,,", "}}", ",", *_lines(2)])
    + "\n",
    "tabs and a lone brace": "\n".join([*_lines(2), "\t", "{", *_lines(2)]) + "\n",
    "empty": "",
}


def _same(a: pl.DataFrame, b: pl.DataFrame) -> None:
    assert_frame_equal(a, b)  # NaN equals NaN here, unlike in dicts


#: Files whose first line is no layout: read by the JSON-lines reader or line by line.
NOT_BY_LAYOUT = {"verbose event trace", "empty"}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_the_layout_reader_reads_what_each_file_alone_reads(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Clean files of the same layout beside the damaged one: they are read together.
    paths = []
    for k in range(2):
        p = tmp_path / f"h-pid{k}.log"
        p.write_text("\n".join(_lines(4)) + "\n")
        paths.append(p)
    damaged = tmp_path / "h-pid9.log"
    damaged.write_bytes(DAMAGED[case].encode("utf-8", "surrogateescape"))
    paths.append(damaged)
    files = [(k, p, p.name) for k, p in enumerate(paths)]
    whole: list[str] = []

    def spy(path: Path, display: str) -> InspectorRead:
        whole.append(display)
        return read_inspector(path, display)

    batch = inspector._batch

    def batch_spy(members: Any, counts: Any) -> Any:
        whole.extend(display for _f, _p, display in members)
        return batch(members, counts)

    monkeypatch.setattr(inspector, "read_inspector", spy)
    monkeypatch.setattr(inspector, "_batch", batch_spy)
    together = read_inspector_files(files)
    # The clean files are read by their layout; the damaged one too, but where its
    # first line gives none.
    assert whole == (["h-pid9.log"] if case in NOT_BY_LAYOUT else [])
    for fid, path, name in files:
        alone = read_inspector(path, name)
        alone.rows = alone.rows.with_columns(pl.lit(fid, pl.UInt32).alias("file_id"))
        got = together[fid]
        _same(got.rows, alone.rows)
        assert (got.lines, dict(got.skipped), got.versions) == (
            alone.lines,
            dict(alone.skipped),
            alone.versions,
        ), case


def _layout_spy(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The ids of the files :func:`inspector._by_layout` gave a read for, filled as
    :func:`read_inspector_files` runs: a check that the layout reader ran, not the
    fallback readers compared with themselves."""
    read: set[int] = set()
    by_layout = inspector._by_layout

    def spy(members: Any, layout: Any) -> Any:
        out = by_layout(members, layout)
        read.update(out)
        return out

    monkeypatch.setattr(inspector, "_by_layout", spy)
    return read


def test_a_synthetic_jobs_files_read_by_layout_match_the_json_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = InspectorJob(nranks=8, ranks_per_host=4, collectives=60, drop=0.1, seed=5)
    paths = []
    for name, text in inspector_files(job).items():
        (tmp_path / name).write_text(text)
        paths.append(tmp_path / name)
    assert _layout(paths[0].read_text().split("\n", 1)[0]) is not None
    files = [(k, p, p.name) for k, p in enumerate(sorted(paths))]
    by_layout = _layout_spy(monkeypatch)
    together = read_inspector_files(files)
    monkeypatch.undo()
    # Every file was read by its layout, and it read records.
    assert by_layout == {fid for fid, _p, _n in files}
    assert all(together[fid].rows.height > 0 for fid, _p, _n in files)
    for fid, path, name in files:
        alone = read_inspector(path, name)
        _same(together[fid].rows, alone.rows.with_columns(pl.lit(fid, pl.UInt32).alias("file_id")))


@pytest.mark.parametrize(
    "line",
    [
        "",
        "[1,2]",
        '{"header":{"id":"a,b","rank":1}}',  # a comma inside a string
        RECORD.replace('"coll_sn":3', '"coll_sn":[3]'),  # not a scalar
        RECORD.replace('"coll_perf":{', '"coll_perf":{"coll_perf":{') + "}",  # key repeated
        RECORD[:-1],  # an object left open
        RECORD.replace('"coll":"AllGather",', ""),  # a required field missing
    ],
)
def test_lines_that_give_no_layout(line: str) -> None:
    assert _layout(line) is None


def test_many_large_files_keep_their_lines_in_order(tmp_path: Path) -> None:
    # Enough records for the streaming engine to cut the read into many pieces: each
    # record must stay with its file and its line number.
    files = []
    for k in range(24):
        p = tmp_path / f"h{k}-pid{k}.log"
        base = RECORD.replace('"pid":7', f'"pid":{k}')
        p.write_text("\n".join(_rec(n, base) for n in range(6000)) + "\n")
        files.append((k, p, p.name))
    reads = read_inspector_files(files)
    for k, _p, _n in files:
        rows = reads[k].rows
        assert rows.height == 6000
        assert rows["pid"].unique().to_list() == [k]
        assert rows["file_id"].unique().to_list() == [k]
        assert rows["line_no"].to_list() == list(range(1, 6001))
        assert rows["sn"].to_list() == list(range(6000))


#: The required fields, with the record's place.
_KEYED = ["file_id", "line_no", "comm_hash", "comm_rank", "op", "sn", "msg_size_bytes",
          "exec_time_s"]  # fmt: skip
_FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
#: Bytes that matter to the layout reader: cell and object bounds, quotes, line ends.
_SHARP = st.sampled_from([b",", b"}", b"{", b'"', b":", b"\n", b"\r\n", b"\\", b"\x00", b"\xff"])


#: The edits made to the fuzzed file: where, what, and the bytes.
_EDITS = st.lists(
    st.tuples(
        st.integers(0, 10**9),
        st.sampled_from(["insert", "delete", "replace", "cut"]),
        st.one_of(_SHARP, st.binary(min_size=1, max_size=4)),
    ),
    min_size=1,
    max_size=6,
)


def test_damaged_files_read_by_layout_as_each_alone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Random edits at random places of a well-formed file (its first line may be hit
    # too): whatever path reads it, the records, lines and reasons are those of the
    # file read on its own.  A damaged file beside the clean one may send both to the
    # other readers (a line with a cell too many fails the whole CSV read), but most
    # examples must go through the layout reader, or this compares the fallback
    # readers with themselves.
    read_by_layout: list[bool] = []

    @_FUZZ
    @given(edits=_EDITS)
    def check(edits: list[tuple[int, str, bytes]]) -> None:
        read_by_layout.append(_check_damaged(tmp_path_factory, edits))

    check()
    assert sum(read_by_layout) >= len(read_by_layout) // 2, read_by_layout


def _check_damaged(
    tmp_path_factory: pytest.TempPathFactory, edits: list[tuple[int, str, bytes]]
) -> bool:
    """Check one fuzzed file; whether the clean file beside it was read by layout."""
    tmp = tmp_path_factory.mktemp("fuzz")
    data = bytearray(("\n".join(_lines(12, NAMED)) + "\n").encode())
    for at, kind, chunk in edits:
        i = at % (len(data) + 1)
        if kind == "insert":
            data[i:i] = chunk
        elif kind == "delete":
            del data[i : i + len(chunk)]
        elif kind == "replace":
            data[i : i + len(chunk)] = chunk
        else:
            del data[i:]
    clean = tmp / "h-pid0.log"
    clean.write_text("\n".join(_lines(5, NAMED)) + "\n")
    damaged = tmp / "h-pid1.log"
    damaged.write_bytes(bytes(data))
    files = [(0, clean, clean.name), (1, damaged, damaged.name)]
    with pytest.MonkeyPatch.context() as mp:
        by_layout = _layout_spy(mp)
        together = read_inspector_files(files)
    assert together[0].rows.height == 5
    intact = {
        k + 1
        for k, line in enumerate(bytes(data).split(b"\n"))
        if line.decode(errors="replace") in _lines(12, NAMED)
    }
    for fid, path, name in files:
        alone = read_inspector(path, name)
        got, want = together[fid], alone.rows.with_columns(pl.lit(fid, pl.UInt32).alias("file_id"))
        assert (got.lines, dict(got.skipped)) == (alone.lines, dict(alone.skipped))
        # The same records with the same required fields; every field the same on the
        # lines the edits left intact (on a damaged line an optional field may be read by
        # its key alone, or by its object and key).
        _same(got.rows.select(_KEYED), want.select(_KEYED))
        on_intact = pl.col("line_no").is_in(sorted(intact)) if fid else pl.lit(True)
        _same(got.rows.filter(on_intact), want.filter(on_intact))
    return 0 in by_layout
