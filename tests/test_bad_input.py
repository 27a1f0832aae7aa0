"""Bad input: every kind of damage is reported, counted, and costs no valid line around it.

Each case starts from the small valid log of ``conftest.sample_lines`` (two ranks,
Init lines with commId, connections, ten COLL lines per rank, one IB WARN), damages
it in ``tmp_path``, runs the real CLI (``analyze PATH --format json``) and checks

* the exit code (0 analysed, 1 an input could not be read) and that no traceback escaped,
* the line account of ``inputs[]`` (``lines``, ``parsed``, ``unparsed``,
  ``unparsed_by_reason``, ``spliced``, ``notes``) and ``problems``,
* that everything learned from the valid lines (``conftest.facts``: ranks,
  communicators, collectives, errors, ...) is what the undamaged log gives.
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import os
import random
import re
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import (
    COMM_ID,
    COMM_PTRS,
    HOSTS,
    OPCOUNTS,
    PIDS,
    STREAMS,
    CliRun,
    LogLine,
    coll_text,
    facts,
    run_cli,
    sample_lines,
    sample_text,
    write_sample,
)

from ncclscope.analysis import run_analysis
from ncclscope.cli import cli
from ncclscope.export.json_report import to_json_dict

REASONS = {"blank", "other", "malformed", "binary", "too_long"}


# --------------------------------------------------------------------------------------
# helpers


def clean_run(tmp_path: Path) -> CliRun:
    """The analysis of the undamaged sample log (the reference for every case)."""
    ref_dir = tmp_path / "reference"
    ref_dir.mkdir(exist_ok=True)
    path = write_sample(ref_dir / "clean.log")
    run = run_cli([path])
    assert run.code == 0, run.stderr
    return run


def only_input(run: CliRun) -> dict[str, Any]:
    assert run.doc is not None
    assert len(run.doc["inputs"]) == 1, run.doc["inputs"]
    return run.doc["inputs"][0]


def check_account(inp: dict[str, Any]) -> None:
    """The line account adds up: parsed + unparsed = lines; reasons sum to unparsed."""
    assert inp["parsed"] + inp["unparsed"] == inp["lines"], inp
    assert set(inp["unparsed_by_reason"]) <= REASONS, inp
    assert sum(inp["unparsed_by_reason"].values()) == inp["unparsed"], inp
    assert 0 <= inp["spliced"] <= inp["parsed"], inp


def note_names_line(inp: dict[str, Any], line_no: int) -> bool:
    """Some note on this input points the user at ``line_no``."""
    number = re.compile(rf"(?<![\d.]){line_no}(?!\d)")
    return any("line" in note and number.search(note) for note in inp["notes"])


def assert_one_more_malformed(run: CliRun, ref: CliRun, line_no: int) -> None:
    """``run`` read the reference plus one damaged line at ``line_no``: no traceback,
    that line counted as malformed and named in a note, every other line parsed."""
    assert run.code == 0, run.stderr
    assert "Traceback" not in run.stderr
    inp, ref_inp = only_input(run), only_input(ref)
    check_account(inp)
    assert inp["lines"] == ref_inp["lines"] + 1
    assert inp["parsed"] == ref_inp["parsed"]
    assert inp["unparsed_by_reason"].get("malformed", 0) == (
        ref_inp["unparsed_by_reason"].get("malformed", 0) + 1
    )
    assert note_names_line(inp, line_no), inp["notes"]


def lines_with(lines: list[LogLine], index: int, extra: list[bytes]) -> bytes:
    """The sample as bytes with raw ``extra`` lines inserted before line ``index`` (0-based)."""
    encoded = [(line.text + "\n").encode() for line in lines]
    return b"".join(encoded[:index] + [e + b"\n" for e in extra] + encoded[index:])


def middle_index(lines: list[LogLine]) -> int:
    """A point between two COLL lines in the middle of the log."""
    colls = [k for k, line in enumerate(lines) if line.is_coll]
    return colls[len(colls) // 2]


# --------------------------------------------------------------------------------------
# the reference itself


def test_sample_log_is_what_the_grammar_says(tmp_path: Path) -> None:
    run = clean_run(tmp_path)
    inp = only_input(run)
    check_account(inp)
    assert inp["lines"] == len(sample_lines())
    assert inp["unparsed_by_reason"] == {"blank": 1, "other": 4}
    assert inp["spliced"] == 0
    assert inp["notes"] == []
    assert run.doc is not None
    assert run.doc["problems"] == []
    assert run.doc["collectives"]["calls"] == 20
    assert run.doc["collectives"]["instances"] == 10
    assert run.doc["job"]["world_size"] == 2
    assert [(r["rank"], r["host"], r["pid"]) for r in run.doc["job"]["ranks"]] == [
        (0, HOSTS[0], PIDS[0]),
        (1, HOSTS[1], PIDS[1]),
    ]
    assert [(e["rank"], e["kind"]) for e in run.doc["errors"]] == [(1, "ib_completion")]


# --------------------------------------------------------------------------------------
# binary junk, invalid UTF-8, a 10 MB line


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_binary_junk_block_in_the_middle(tmp_path: Path, seed: int) -> None:
    ref = clean_run(tmp_path)
    lines = sample_lines()
    junk = random.Random(seed).randbytes(4096)
    assert b"\x00" in junk
    at = middle_index(lines)
    path = tmp_path / "junk.log"
    path.write_bytes(lines_with(lines, at, [junk]))

    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    assert run.doc["problems"] == []
    inp, ref_inp = only_input(run), only_input(ref)
    check_account(inp)
    junk_lines = junk.count(b"\n") + 1
    assert inp["lines"] == ref_inp["lines"] + junk_lines
    assert inp["parsed"] == ref_inp["parsed"], "a valid line around the junk was lost"
    assert inp["unparsed"] == ref_inp["unparsed"] + junk_lines
    assert inp["unparsed_by_reason"].get("binary", 0) >= 1, inp
    assert inp["spliced"] == 0
    assert facts(run.doc) == facts(ref.doc)
    # The user is told where the damage starts (the junk's first line, 1-based).
    assert note_names_line(inp, at + 1), inp["notes"]


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(b"\x00\x01\x02junk", id="nul"),
        pytest.param(b"\x28\xb5\x2f\xfd" + b"\x00\x07junk", id="zstd_magic"),
        pytest.param(b"\x78\x9c" + b"\xf3junk", id="zlib_magic"),
        pytest.param(b"BZh91AY&SY\x00junk", id="bzip2_magic"),
    ],
)
def test_binary_junk_at_the_start_of_a_file(tmp_path: Path, head: bytes) -> None:
    """Junk whose first bytes look like another compression format is still junk."""
    ref = clean_run(tmp_path)
    path = tmp_path / "head.log"
    path.write_bytes(head + b"\n" + sample_text().encode())
    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp, ref_inp = only_input(run), only_input(ref)
    check_account(inp)
    assert inp["lines"] == ref_inp["lines"] + 1
    assert inp["parsed"] == ref_inp["parsed"]
    assert facts(run.doc) == facts(ref.doc)


@pytest.mark.parametrize("target", ["coll", "init_complete", "warn"])
def test_nul_padding_glued_in_front_of_a_line(tmp_path: Path, target: str) -> None:
    """A crash can leave a run of NUL bytes where unwritten data was; the next write follows
    on the same physical line.  The line behind the NULs is whole and must count as before.
    """
    ref = clean_run(tmp_path)
    lines = sample_lines()
    if target == "coll":
        at = middle_index(lines)
    elif target == "init_complete":
        at = next(k for k, line in enumerate(lines) if line.text.endswith("Init COMPLETE"))
    else:
        at = next(k for k, line in enumerate(lines) if "NCCL WARN" in line.text)
    data = [(line.text + "\n").encode() for line in lines]
    data[at] = b"\x00" * 512 + data[at]
    path = tmp_path / "nul.log"
    path.write_bytes(b"".join(data))
    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp, ref_inp = only_input(run), only_input(ref)
    check_account(inp)
    assert inp["lines"] == ref_inp["lines"]
    assert inp["parsed"] == ref_inp["parsed"]
    assert facts(run.doc) == facts(ref.doc)


def test_invalid_utf8_in_a_non_nccl_line(tmp_path: Path) -> None:
    ref = clean_run(tmp_path)
    lines = sample_lines()
    at = next(k for k, line in enumerate(lines) if line.text.startswith("epoch 0"))
    data = (
        sample_text(lines)
        .encode()
        .replace(b"epoch 0 step 0 loss 2.3125", b"epoch 0 \xff\xfe step \xc3\x28 loss \x80")
    )
    path = tmp_path / "utf8.log"
    path.write_bytes(data)

    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp, ref_inp = only_input(run), only_input(ref)
    check_account(inp)
    assert inp["lines"] == ref_inp["lines"]
    assert inp["parsed"] == ref_inp["parsed"]
    assert inp["unparsed_by_reason"] == {"blank": 1, "other": 3, "binary": 1}
    assert facts(run.doc) == facts(ref.doc)
    assert note_names_line(inp, at + 1), inp["notes"]


@pytest.mark.parametrize(
    "target",
    ["bootstrap", "coll", "init_complete"],
)
def test_invalid_utf8_in_an_nccl_lines_tail(tmp_path: Path, target: str) -> None:
    """Bytes that are not UTF-8 after the fields NCCL printed cost no field of that line."""
    ref = clean_run(tmp_path)
    text = sample_text().encode()
    if target == "bootstrap":
        old = b"Bootstrap : Using eth0:10.0.0.1<0>\n"
        new = b"Bootstrap : Using eth0:10.0.0.1<0>\xff\xfe\n"
    elif target == "coll":
        old = coll_text(0, 3).encode() + b"\n"
        new = coll_text(0, 3).encode() + b"\xc3\x28\xff\n"
    else:
        old = f"busId 18000 commId {COMM_ID} - Init COMPLETE\n".encode()
        new = old[:-1] + b" \xff\n"
    assert text.count(old) == 1
    path = tmp_path / "tail.log"
    path.write_bytes(text.replace(old, new))

    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp, ref_inp = only_input(run), only_input(ref)
    check_account(inp)
    assert inp["lines"] == ref_inp["lines"]
    assert inp["parsed"] == ref_inp["parsed"], inp
    assert inp["unparsed_by_reason"] == ref_inp["unparsed_by_reason"]
    assert facts(run.doc) == facts(ref.doc)


def test_ten_megabyte_line_in_the_middle(tmp_path: Path) -> None:
    ref = clean_run(tmp_path)
    lines = sample_lines()
    at = middle_index(lines)
    path = tmp_path / "long.log"
    path.write_bytes(lines_with(lines, at, [b"x" * (10 << 20)]))

    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp, ref_inp = only_input(run), only_input(ref)
    check_account(inp)
    assert inp["lines"] == ref_inp["lines"] + 1
    assert inp["parsed"] == ref_inp["parsed"], "a valid line around the long line was lost"
    assert inp["unparsed_by_reason"] == {**ref_inp["unparsed_by_reason"], "too_long": 1}
    assert facts(run.doc) == facts(ref.doc)
    assert note_names_line(inp, at + 1), inp["notes"]


def test_ten_megabyte_line_glued_in_front_of_an_nccl_line(tmp_path: Path) -> None:
    """A runaway line that ends in a complete NCCL line: counted too long, never a crash."""
    lines = sample_lines()
    at = middle_index(lines)
    data = lines_with(lines, at, [b"x" * (10 << 20) + coll_text(0, 0).encode()])
    path = tmp_path / "glued.log"
    path.write_bytes(data)
    run = run_cli([path])
    assert run.code == 0, run.stderr
    inp = only_input(run)
    check_account(inp)
    assert inp["lines"] == len(lines) + 1


# --------------------------------------------------------------------------------------
# two processes' writes spliced mid-line


@pytest.mark.parametrize("cut", ["middle", "in_header", "after_info", "in_op_name"])
def test_two_processes_spliced_mid_line(tmp_path: Path, cut: str) -> None:
    """Line A is cut, line B (another process) is written whole, then A's tail follows.

    B is complete and must be counted; A is lost (its head and tail are apart), and the
    physical line holding A's head and B is counted as spliced.
    """
    ref = clean_run(tmp_path)
    lines = sample_lines()
    k = 4
    a, b = coll_text(0, k), coll_text(1, k)
    if cut == "middle":
        mid = len(a) // 2
    elif cut == "in_header":
        mid = len("node-a:41")
    elif cut == "after_info":
        mid = a.index("NCCL INFO ") + len("NCCL INFO ")
    else:
        mid = a.index("NCCL INFO ") + len("NCCL INFO All")
    texts = [line.text for line in lines]
    ia, ib = texts.index(a), texts.index(b)
    assert ib == ia + 1
    texts[ia : ib + 1] = [a[:mid] + b, a[mid:]]
    path = tmp_path / "spliced.log"
    path.write_text("".join(t + "\n" for t in texts))

    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp, ref_inp = only_input(run), only_input(ref)
    check_account(inp)
    assert inp["lines"] == ref_inp["lines"]
    assert inp["spliced"] == 1, inp
    assert inp["parsed"] == ref_inp["parsed"] - 1, "B (complete) must be parsed, A is lost"
    assert inp["unparsed"] == ref_inp["unparsed"] + 1
    got, want = facts(run.doc), facts(ref.doc)
    op = a.split("NCCL INFO ")[1].split(":")[0]
    assert got["collectives"]["calls"] == want["collectives"]["calls"] - 1
    assert got["collectives"]["instances"] == want["collectives"]["instances"]
    want_by_op = dict(want["collectives"]["by_op"])
    want_by_op[op] -= 1
    assert got["collectives"]["by_op"] == want_by_op
    # B's host was repaired: no new host, same ranks, same communicators' members.
    assert got["hosts"] == want["hosts"]
    assert got["ranks"] == want["ranks"]
    assert got["world_size"] == want["world_size"]
    assert [c["ranks_seen"] for c in got["communicators"]] == [
        c["ranks_seen"] for c in want["communicators"]
    ]
    assert got["errors"] == want["errors"]


def test_spliced_warn_keeps_the_error(tmp_path: Path) -> None:
    """The WARN written whole into the middle of another process's COLL line is kept."""
    ref = clean_run(tmp_path)
    lines = sample_lines()
    texts = [line.text for line in lines]
    warn = next(t for t in texts if "NCCL WARN" in t)
    a = coll_text(0, 9)
    ia = texts.index(a)
    iw = texts.index(warn)
    mid = len(a) // 2
    texts[ia] = a[:mid] + warn
    texts.insert(ia + 1, a[mid:])
    texts.pop(iw + 1)
    path = tmp_path / "spliced-warn.log"
    path.write_text("".join(t + "\n" for t in texts))

    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp = only_input(run)
    check_account(inp)
    assert inp["spliced"] == 1
    got, want = facts(run.doc), facts(ref.doc)
    assert [(e["host"], e["pid"], e["rank"], e["kind"], e["message"]) for e in got["errors"]] == [
        (e["host"], e["pid"], e["rank"], e["kind"], e["message"]) for e in want["errors"]
    ]


# --------------------------------------------------------------------------------------
# gzip: whole, truncated, via stdin


def test_gzip_file_same_as_plain(tmp_path: Path) -> None:
    ref = clean_run(tmp_path)
    path = tmp_path / "train.log.gz"
    path.write_bytes(gzip.compress(sample_text().encode()))
    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp, ref_inp = only_input(run), only_input(ref)
    assert inp["path"] == str(path)
    for key in ("lines", "parsed", "unparsed", "unparsed_by_reason", "spliced", "notes"):
        assert inp[key] == ref_inp[key], key
    assert facts(run.doc) == facts(ref.doc)


@pytest.mark.parametrize("fraction", [0.5, 0.8, 0.95])
def test_truncated_gzip_keeps_every_line_before_the_cut(tmp_path: Path, fraction: float) -> None:
    text = sample_text().encode()
    compressed = gzip.compress(text, compresslevel=9)
    cut = compressed[: int(len(compressed) * fraction)]
    path = tmp_path / "train.log.gz"
    path.write_bytes(cut)
    recovered = zlib.decompressobj(wbits=31).decompress(cut)
    assert 0 < len(recovered) < len(text)
    assert text.startswith(recovered)

    run = run_cli([path])
    assert run.code == 0, run.stderr + run.stdout
    assert run.doc is not None
    assert run.doc["problems"] == []
    inp = only_input(run)
    check_account(inp)
    assert any("truncated" in note for note in inp["notes"]), inp["notes"]
    assert inp["size_bytes"] == len(recovered), "every decompressible byte is kept"

    # The same analysis of the plain prefix up to the last full line.
    full = recovered[: recovered.rfind(b"\n") + 1]
    partial = recovered[len(full) :]
    prefix_path = tmp_path / "prefix.log"
    prefix_path.write_bytes(full)
    prefix = run_cli([prefix_path])
    assert prefix.code == 0
    assert prefix.doc is not None
    p_inp = only_input(prefix)
    assert inp["lines"] == p_inp["lines"] + (1 if partial else 0)
    assert inp["parsed"] >= p_inp["parsed"]
    assert inp["parsed"] <= p_inp["parsed"] + (1 if partial else 0)
    got, want = facts(run.doc), facts(prefix.doc)
    assert got["collectives"]["calls"] >= want["collectives"]["calls"]
    assert all(r in got["ranks"] for r in want["ranks"])
    assert all(e in got["errors"] for e in want["errors"])
    if not partial or "NCCL" not in partial.decode(errors="replace"):
        assert got == want
    # And exactly what the same bytes give as a plain file.
    same_path = tmp_path / "same.log"
    same_path.write_bytes(recovered)
    same = run_cli([same_path])
    assert same.doc is not None
    s_inp = only_input(same)
    for key in ("lines", "parsed", "unparsed", "unparsed_by_reason", "spliced"):
        assert inp[key] == s_inp[key], key
    assert got == facts(same.doc)


def test_truncated_gzip_names_the_file_in_the_text_report(tmp_path: Path) -> None:
    compressed = gzip.compress(sample_text().encode())
    path = tmp_path / "cut.log.gz"
    path.write_bytes(compressed[: len(compressed) // 2])
    result = CliRunner().invoke(cli, ["analyze", str(path), "--no-progress"])
    assert result.exit_code == 0, result.output
    out = result.stdout + result.stderr
    assert "Traceback" not in out
    assert "cut.log.gz" in out
    assert "truncated" in out


def test_damaged_gzip_header_is_reported(tmp_path: Path) -> None:
    """Gzip magic followed by garbage: a message naming the file, and the rest still analysed."""
    ref = clean_run(tmp_path)
    bad = tmp_path / "bad.log.gz"
    bad.write_bytes(b"\x1f\x8b" + bytes(range(256)) * 4)
    good = write_sample(tmp_path / "good.log")
    run = run_cli([bad, good])
    assert run.code in (0, 1)
    assert run.doc is not None
    mentioned = [n for i in run.doc["inputs"] if i["path"] == str(bad) for n in i["notes"]]
    mentioned += [p["reason"] for p in run.doc["problems"] if p["path"] == str(bad)]
    assert mentioned, run.doc["inputs"]
    assert facts(run.doc) == facts(ref.doc)


def test_truncated_gzip_inside_gzip(tmp_path: Path) -> None:
    """A .gz of a cut .gz: no traceback, a message naming the file."""
    compressed = gzip.compress(sample_text().encode())
    path = tmp_path / "twice.log.gz.gz"
    path.write_bytes(gzip.compress(compressed[: len(compressed) // 2]))
    run = run_cli([path])
    assert run.code in (0, 1)
    assert run.doc is not None
    # What is said about the file is said of it (its input's notes, its problem) and
    # says that it is cut, not merely that its last line has no newline.
    said = [n for i in run.doc["inputs"] if i["path"] == str(path) for n in i["notes"]]
    said += [p["reason"] for p in run.doc["problems"] if p["path"] == str(path)]
    assert any(re.search(r"truncat|end of file|\bcut\b", s, re.IGNORECASE) for s in said), said
    if run.code == 1:
        assert str(path) in run.stderr
        assert [p["path"] for p in run.doc["problems"]] == [str(path)]


def test_stdin_plain_same_as_file(tmp_path: Path) -> None:
    ref = clean_run(tmp_path)
    run = run_cli(["-"], stdin=sample_text().encode())
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp, ref_inp = only_input(run), only_input(ref)
    assert inp["path"] == "-"
    for key in ("lines", "parsed", "unparsed", "unparsed_by_reason", "spliced", "notes"):
        assert inp[key] == ref_inp[key], key
    assert facts(run.doc) == facts(ref.doc)


def test_stdin_gzip_via_cli_runner(tmp_path: Path) -> None:
    ref = clean_run(tmp_path)
    run = run_cli(["-"], stdin=gzip.compress(sample_text().encode()))
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp, ref_inp = only_input(run), only_input(ref)
    for key in ("lines", "parsed", "unparsed", "unparsed_by_reason", "spliced", "notes"):
        assert inp[key] == ref_inp[key], key
    assert facts(run.doc) == facts(ref.doc)


@pytest.mark.parametrize("wrap", ["bytesio", "buffered"])
def test_stdin_gzip_via_run_analysis(tmp_path: Path, wrap: str) -> None:
    """``run_analysis(stdin=...)`` takes any binary stream, peekable or not."""
    ref = clean_run(tmp_path)
    raw = io.BytesIO(gzip.compress(sample_text().encode()))
    stream = raw if wrap == "bytesio" else io.BufferedReader(raw)  # type: ignore[arg-type]
    work = tmp_path / "work"
    analysis = run_analysis(["-"], workdir=work, stdin=stream)
    doc = to_json_dict(analysis)
    assert facts(doc) == facts(ref.doc)  # type: ignore[arg-type]
    inp, ref_inp = doc["inputs"][0], only_input(ref)
    assert inp["size_bytes"] == ref_inp["size_bytes"], "the decompressed size"
    for key in ("lines", "parsed", "unparsed", "unparsed_by_reason", "spliced", "notes"):
        assert inp[key] == ref_inp[key], key


@pytest.mark.parametrize("wrap", ["bytesio", "buffered"])
def test_truncated_stdin_gzip_via_run_analysis(tmp_path: Path, wrap: str) -> None:
    """A cut gzip stream on any binary stream: a note, and no exception."""
    compressed = gzip.compress(sample_text().encode())
    raw = io.BytesIO(compressed[: len(compressed) // 2])
    stream = raw if wrap == "bytesio" else io.BufferedReader(raw)  # type: ignore[arg-type]
    analysis = run_analysis(["-"], workdir=tmp_path / "work", stdin=stream)
    doc = to_json_dict(analysis)
    assert doc["problems"] == []
    assert any("truncated" in n for n in doc["inputs"][0]["notes"]), doc["inputs"]


def test_stdin_gzip_through_a_real_pipe(tmp_path: Path) -> None:
    ref = clean_run(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "ncclscope", "analyze", "-", "--format", "json"],
        input=gzip.compress(sample_text().encode()),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["inputs"][0]["path"] == "-"
    assert doc["inputs"][0]["lines"] == only_input(ref)["lines"]
    assert facts(doc) == facts(ref.doc)  # type: ignore[arg-type]


def test_truncated_gzip_via_stdin(tmp_path: Path) -> None:
    compressed = gzip.compress(sample_text().encode())
    proc = subprocess.run(
        [sys.executable, "-m", "ncclscope", "analyze", "-", "--format", "json"],
        input=compressed[: len(compressed) // 2],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    assert any("truncated" in n for n in doc["inputs"][0]["notes"]), doc["inputs"]


# --------------------------------------------------------------------------------------
# empty, missing, directories, a file still being written


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.log"
    path.write_bytes(b"")
    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    assert run.doc["problems"] == []
    inp = only_input(run)
    assert inp["path"] == str(path)
    assert (inp["lines"], inp["parsed"], inp["unparsed"], inp["spliced"]) == (0, 0, 0, 0)
    assert inp["unparsed_by_reason"] == {}
    assert any("empty file" in note for note in inp["notes"]), inp["notes"]
    assert run.doc["collectives"]["calls"] == 0


def test_empty_file_beside_a_log(tmp_path: Path) -> None:
    ref = clean_run(tmp_path)
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    good = write_sample(tmp_path / "good.log")
    run = run_cli([empty, good])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    assert any("empty file" in n for n in run.input(str(empty))["notes"])
    assert run.input(str(good))["parsed"] == only_input(ref)["parsed"]
    assert facts(run.doc) == facts(ref.doc)


def test_empty_gzip(tmp_path: Path) -> None:
    path = tmp_path / "empty.log.gz"
    path.write_bytes(gzip.compress(b""))
    run = run_cli([path])
    assert run.code == 0, run.stderr
    inp = only_input(run)
    assert inp["lines"] == 0
    assert any("empty file" in note for note in inp["notes"]), inp["notes"]


@pytest.mark.parametrize("content", ["nothing", "only_non_logs", "only_hidden"])
def test_directory_with_no_logs(tmp_path: Path, content: str) -> None:
    folder = tmp_path / "run-42"
    folder.mkdir()
    if content == "only_non_logs":
        (folder / "model.pt").write_bytes(b"\x00\x01" * 100)
        (folder / "config.yaml").write_text("lr: 0.1\n")
    elif content == "only_hidden":
        (folder / ".train.log").write_text(sample_text())
    run = run_cli([folder])
    assert run.code == 1
    assert str(folder) in run.stderr
    assert "no log" in run.stderr
    if run.doc is not None:
        assert [p["path"] for p in run.doc["problems"]] == [str(folder)]
        assert run.doc["inputs"] == []


@pytest.mark.parametrize("bad", ["empty-dir", "no-such.log"])
def test_unreadable_path_beside_a_log(tmp_path: Path, bad: str) -> None:
    """A directory with no logs or a missing file next to a good log: exit 1, the bad
    path named, and the good log analysed exactly as alone."""
    ref = clean_run(tmp_path)
    path = tmp_path / bad
    if bad == "empty-dir":
        path.mkdir()
    good = write_sample(tmp_path / "good.log")
    run = run_cli([path, good])
    assert run.code == 1
    assert str(path) in run.stderr
    assert run.doc is not None
    assert [p["path"] for p in run.doc["problems"]] == [str(path)]
    assert facts(run.doc) == facts(ref.doc)


def test_directory_skips_binary_files(tmp_path: Path) -> None:
    ref = clean_run(tmp_path)
    folder = tmp_path / "logs"
    folder.mkdir()
    write_sample(folder / "train.log")
    (folder / "core.12345").write_bytes(random.Random(7).randbytes(20000) + b"\x00" * 100)
    run = run_cli([folder])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    assert [i["path"] for i in run.doc["inputs"]] == [str(folder / "train.log")]
    assert facts(run.doc) == facts(ref.doc)


def test_nonexistent_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such.log"
    run = run_cli([missing])
    assert run.code == 1
    assert str(missing) in run.stderr
    assert "no such file" in run.stderr


def test_glob_matching_nothing(tmp_path: Path) -> None:
    pattern = str(tmp_path / "rank*.log")
    run = run_cli([pattern])
    assert run.code == 1
    assert pattern in run.stderr


def test_usage_error_without_paths() -> None:
    result = CliRunner().invoke(cli, ["analyze"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file that is listed but cannot be opened (mode 0 for anyone but root, who runs
    CI): opening it fails as it does for a user without the permission, whoever runs
    the test; the message names the file and why."""
    path = write_sample(tmp_path / "secret.log")
    opened = Path.open
    tried: list[str] = []

    def refuse(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == path:
            tried.append(str(self))
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return opened(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refuse)
    run = run_cli([path])
    monkeypatch.undo()
    assert tried, "the file was never opened"
    assert run.code == 1
    assert str(path) in run.stderr
    assert os.strerror(errno.EACCES) in run.stderr


def test_fifo_is_not_a_regular_file(tmp_path: Path) -> None:
    """A named pipe is refused up front (reading it could block forever)."""
    fifo = tmp_path / "live.log"
    os.mkfifo(fifo)
    good = write_sample(tmp_path / "good.log")
    run = run_cli([fifo, good])
    assert run.code == 1
    assert str(fifo) in run.stderr
    assert run.doc is not None
    assert [p["path"] for p in run.doc["problems"]] == [str(fifo)]
    assert run.input(str(good))["parsed"] > 0


@pytest.mark.parametrize("last", ["chain", "coll", "other"])
def test_last_line_without_newline(tmp_path: Path, last: str) -> None:
    """A file still being written: a note, and the last line parsed when it is complete."""
    lines = sample_lines()
    if last == "chain":
        lines = lines[:-1]  # ends with the return-code chain line
    elif last == "coll":
        lines = [line for line in lines if line.rank is None or "NCCL WARN" not in line.text]
        lines = [line for line in lines if "-> 6" not in line.text and line.text]
        lines = [line for line in lines if not line.text.startswith("RuntimeError")]
        assert lines[-1].is_coll
    with_nl = tmp_path / "complete.log"
    write_sample(with_nl, lines)
    growing = tmp_path / "growing.log"
    growing.write_bytes(sample_text(lines).encode()[:-1])

    ref = run_cli([with_nl])
    run = run_cli([growing])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp, ref_inp = only_input(run), only_input(ref)
    check_account(inp)
    assert any("newline" in n or "being written" in n for n in inp["notes"]), inp["notes"]
    for key in ("lines", "parsed", "unparsed", "unparsed_by_reason", "spliced"):
        assert inp[key] == ref_inp[key], key
    assert facts(run.doc) == facts(ref.doc)


def test_last_line_cut_mid_write(tmp_path: Path) -> None:
    """The last line is a COLL line cut before its comm: noted, counted, nothing else lost."""
    lines = sample_lines()[:-4]  # ... ends with rank 1's last COLL line
    assert lines[-1].is_coll
    text = sample_text(lines)
    cut = text[: text.rindex(" comm ")]
    path = tmp_path / "cut.log"
    path.write_text(cut)
    prefix = tmp_path / "prefix.log"
    write_sample(prefix, lines[:-1])
    run, ref = run_cli([path]), run_cli([prefix])
    assert run.code == 0, run.stderr
    inp, ref_inp = only_input(run), only_input(ref)
    check_account(inp)
    assert inp["notes"]
    assert inp["lines"] == ref_inp["lines"] + 1
    # The cut line still has a valid INFO header: it may count as a generic INFO line or
    # as malformed, but never as a collective.
    assert inp["parsed"] in (ref_inp["parsed"], ref_inp["parsed"] + 1)
    assert facts(run.doc) == facts(ref.doc)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# terminal decorations, line endings, launcher prefixes


TQDM = "Epoch 1:  42%|\u2588\u2588\u2588\u2588\u258f     | 42/100 [00:03<00:01, 12.1it/s]"


@pytest.mark.parametrize("decoration", ["ansi", "tqdm", "both"])
def test_ansi_and_progress_bars_in_front_of_nccl_lines(tmp_path: Path, decoration: str) -> None:
    ref = clean_run(tmp_path)
    lines = sample_lines()
    out = []
    for k, line in enumerate(lines):
        text = line.text
        if line.rank is not None and text:
            if decoration in ("ansi", "both"):
                text = f"\x1b[0;3{k % 8}m{text}\x1b[0m" if k % 2 else f"\x1b[1m\x1b[32m{text}"
            if decoration in ("tqdm", "both") and k % 3 == 0:
                text = f"{TQDM}\r{TQDM}\r{text}"
        out.append(LogLine(line.rank, text, line.is_coll))
    path = write_sample(tmp_path / "decorated.log", out)
    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp, ref_inp = only_input(run), only_input(ref)
    check_account(inp)
    for key in ("lines", "parsed", "unparsed", "unparsed_by_reason", "spliced"):
        assert inp[key] == ref_inp[key], key
    assert facts(run.doc) == facts(ref.doc)


def test_crlf_line_endings(tmp_path: Path) -> None:
    ref = clean_run(tmp_path)
    path = tmp_path / "windows.log"
    path.write_bytes(sample_text(eol="\r\n").encode())
    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp, ref_inp = only_input(run), only_input(ref)
    check_account(inp)
    for key in ("lines", "parsed", "unparsed", "unparsed_by_reason", "spliced"):
        assert inp[key] == ref_inp[key], key
    assert facts(run.doc) == facts(ref.doc)


LAUNCHERS = {
    "torchrun": lambda r, host, pid: f"[default{r}]:",
    "torch_rank": lambda r, host, pid: f"[rank{r}]:",
    "srun": lambda r, host, pid: f"{r}: ",
    "pdsh": lambda r, host, pid: f"{host}: ",
    "pdsh_ip": lambda r, host, pid: f"10.0.0.{r + 1}: ",
    "openmpi": lambda r, host, pid: f"[1,{r}]<stdout>:",
    "ray": lambda r, host, pid: f"(RayTrainWorker pid={pid}, ip=10.0.0.{r + 1}) ",
    "site_rank": lambda r, host, pid: f"[{r}] ",
    "python_logging": lambda r, host, pid: "2024-08-03 14:07:22,519 - INFO - ",
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_launcher_prefixes_give_identical_results(tmp_path: Path, launcher: str) -> None:
    ref = clean_run(tmp_path)
    make = LAUNCHERS[launcher]
    out = []
    for line in sample_lines():
        r = 0 if line.rank is None else line.rank
        out.append(LogLine(line.rank, make(r, HOSTS[r], PIDS[r]) + line.text, line.is_coll))
    path = write_sample(tmp_path / f"{launcher}.log", out)
    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp, ref_inp = only_input(run), only_input(ref)
    check_account(inp)
    assert inp["lines"] == ref_inp["lines"]
    assert inp["parsed"] == ref_inp["parsed"]
    assert inp["spliced"] == 0
    got, want = facts(run.doc), facts(ref.doc)
    if launcher == "python_logging":
        # The logger's time is a time source of its own (ts_source "logger").
        assert [e["ts"] for e in got["errors"]] == ["2024-08-03T14:07:22.519000+00:00"]
        for e in got["errors"] + want["errors"]:
            e.pop("ts")
    assert got == want


def test_mixed_launcher_prefixes_in_one_file(tmp_path: Path) -> None:
    """Some lines prefixed, some not (e.g. a wrapper that tags only one stream)."""
    ref = clean_run(tmp_path)
    out = []
    for k, line in enumerate(sample_lines()):
        r = 0 if line.rank is None else line.rank
        prefix = [f"[rank{r}]:", f"{r}: ", ""][k % 3]
        out.append(LogLine(line.rank, prefix + line.text, line.is_coll))
    path = write_sample(tmp_path / "mixed.log", out)
    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    assert only_input(run)["parsed"] == only_input(ref)["parsed"]
    assert facts(run.doc) == facts(ref.doc)


# --------------------------------------------------------------------------------------
# one file per rank


def test_one_file_per_rank_same_as_combined(tmp_path: Path) -> None:
    ref = clean_run(tmp_path)
    folder = tmp_path / "per-rank"
    folder.mkdir()
    lines = sample_lines()
    paths = []
    for r in range(2):
        mine = [line for line in lines if (line.rank if line.rank is not None else 0) == r]
        paths.append(write_sample(folder / f"{HOSTS[r]}.{PIDS[r]}.log", mine))
    ref_inp = only_input(ref)
    for args in (paths, [folder], [str(folder / "*.log")]):
        run = run_cli(args)
        assert run.code == 0, run.stderr
        assert run.doc is not None
        assert sorted(i["path"] for i in run.doc["inputs"]) == sorted(str(p) for p in paths)
        for key in ("lines", "parsed", "unparsed", "spliced"):
            assert sum(i[key] for i in run.doc["inputs"]) == ref_inp[key], key
        assert facts(run.doc) == facts(ref.doc)
        by_rank = {r["rank"]: r["path"] for r in run.doc["job"]["ranks"]}
        assert by_rank == {0: str(paths[0]), 1: str(paths[1])}


def test_same_file_twice_counts_once(tmp_path: Path) -> None:
    ref = clean_run(tmp_path)
    path = write_sample(tmp_path / "train.log")
    run = run_cli([path, path])
    assert run.code == 0
    assert run.doc is not None
    assert len(run.doc["inputs"]) == 1
    assert facts(run.doc) == facts(ref.doc)


def test_one_damaged_file_among_many(tmp_path: Path) -> None:
    """Damage in one rank's file costs nothing in the other's."""
    folder = tmp_path / "per-rank"
    folder.mkdir()
    lines = sample_lines()
    r0 = [line for line in lines if line.rank in (None, 0)]
    r1 = [line for line in lines if line.rank == 1]
    p0 = write_sample(folder / "rank0.log", r0)
    p1 = folder / "rank1.log"
    p1.write_bytes(lines_with(r1, middle_index(r1), [random.Random(3).randbytes(2048)]))
    ref = clean_run(tmp_path)
    run = run_cli([p0, p1])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    assert run.input(str(p0))["unparsed_by_reason"].get("binary", 0) == 0
    assert run.input(str(p1))["unparsed_by_reason"].get("binary", 0) >= 1
    assert facts(run.doc) == facts(ref.doc)


# --------------------------------------------------------------------------------------
# a future NCCL


FUTURE_INFO = [
    "Quantum/Plugin: Loaded qnet plugin libnccl-qnet.so (v12)",
    "QNET : Using [0]qpu0:1/Entangled; OOB eth0:10.0.0.1<0>",
    "Init timings v2 - ncclCommInitRankQuantum: rank 0 nranks 2 total 0.42 (teleport 0.1)",
    "Symmetric memory window 0x7f00 registered size 1048576 flags 0x3",
    "ChannelGroup 00/07 : 0 1 | 1 0",
    "comm 0x55aa10c0ffee rank 0 nranks 2 - Hibernate START",
    "",
    "\u00fcberlange Nachricht mit Unicode \u2603 and {braces} %s %d [brackets] (parens)",
]


def test_unknown_future_info_families_are_counted(tmp_path: Path) -> None:
    ref = clean_run(tmp_path)
    lines = sample_lines()
    at = middle_index(lines)
    host, pid = HOSTS[0], PIDS[0]
    future = [LogLine(0, f"{host}:{pid}:{pid} [0] NCCL INFO {msg}") for msg in FUTURE_INFO]
    future += [
        # a new level and a 2.30.7-style WARN that is not an error the tool knows
        LogLine(0, ""),
        LogLine(
            0,
            f"{host}:{pid}:{pid} [0] misc/quantum.cc:77 (qnetInit) NCCL WARN "
            "qnet: decoherence budget low",
        ),
        LogLine(0, f"{host}:{pid}:{pid} [0] NCCL NOTICE something new"),
        LogLine(0, f"{host}:{pid}:{pid} NCCL CALL ncclQuantumAllReduce(0x1,0x2,3)"),
    ]
    path = write_sample(tmp_path / "future.log", lines[:at] + future + lines[at:])
    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp, ref_inp = only_input(run), only_input(ref)
    check_account(inp)
    assert inp["lines"] == ref_inp["lines"] + len(future)
    # every line with an NCCL INFO/WARN/CALL header is a parsed line, known family or not
    n_headers = sum(1 for f in future if f.text and "NOTICE" not in f.text)
    assert inp["parsed"] == ref_inp["parsed"] + n_headers
    got, want = facts(run.doc), facts(ref.doc)
    for key in ("ranks", "world_size", "communicators", "collectives", "transports", "hosts"):
        assert got[key] == want[key], key
    assert all(e in got["errors"] for e in want["errors"])


def test_unknown_collective_op_and_extra_fields_are_counted(tmp_path: Path) -> None:
    ref = clean_run(tmp_path)
    lines = sample_lines()
    last_coll = max(k for k, line in enumerate(lines) if line.is_coll)
    extra = []
    for r in range(2):
        host, pid, comm, stream = HOSTS[r], PIDS[r], COMM_PTRS[r], STREAMS[r]
        base = (
            f"{host}:{pid}:{pid} [0] NCCL INFO AllReduceV: opCount {OPCOUNTS[-1] + 1:x} "
            f"sendbuff 0x7f3a{r}c000000 recvbuff 0x7f3a{r}e000000 count 64 datatype 7 op 0 "
            f"root 0 comm {comm} [nranks=2] stream {stream}"
        )
        extra.append(LogLine(r, base, is_coll=True))
        extra.append(
            LogLine(
                r,
                base.replace("AllReduceV", "AllReduce").replace(
                    f"opCount {OPCOUNTS[-1] + 1:x}", f"opCount {OPCOUNTS[-1] + 2:x}"
                )
                + " task 7 algo RING proto SIMPLE",
                is_coll=True,
            )
        )
    path = write_sample(
        tmp_path / "future-coll.log", lines[: last_coll + 1] + extra + lines[last_coll + 1 :]
    )
    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp, ref_inp = only_input(run), only_input(ref)
    check_account(inp)
    assert inp["parsed"] == ref_inp["parsed"] + 4
    coll, ref_coll = run.doc["collectives"], ref.doc["collectives"]  # type: ignore[index]
    assert coll["calls"] == ref_coll["calls"] + 4
    assert coll["instances"] == ref_coll["instances"] + 2
    assert coll["by_op"] == {
        **ref_coll["by_op"],
        "AllReduce": ref_coll["by_op"]["AllReduce"] + 2,
        "AllReduceV": 2,
    }


# --------------------------------------------------------------------------------------
# a real fixture, damaged


FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ib-completion-error" / "train.log"


def test_fixture_with_junk_and_splices_loses_no_valid_line(tmp_path: Path) -> None:
    """The IB fixture with junk every 40 lines: every valid line is still counted."""
    ref = run_cli([FIXTURE])
    assert ref.code == 0
    raw = FIXTURE.read_bytes().split(b"\n")
    rng = random.Random(11)
    out: list[bytes] = []
    n_junk = 0
    for k, line in enumerate(raw):
        if k and k % 40 == 0:
            junk = rng.randbytes(300).replace(b"\n", b"\x00")
            out.append(junk)
            n_junk += 1
        out.append(line)
    path = tmp_path / "train.log"
    path.write_bytes(b"\n".join(out))
    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp, ref_inp = only_input(run), only_input(ref)
    check_account(inp)
    assert inp["lines"] == ref_inp["lines"] + n_junk
    assert inp["parsed"] == ref_inp["parsed"]
    assert inp["unparsed_by_reason"].get("binary", 0) == n_junk
    assert facts(run.doc) == facts(ref.doc)  # type: ignore[arg-type]


def test_coloured_chatter_is_text_not_binary(tmp_path: Path) -> None:
    """ANSI colour codes in a framework's log line are text: counted as other, not binary."""
    ref = clean_run(tmp_path)
    lines = sample_lines()
    coloured = b"\x1b[32m2024-08-03 14:07:22,519 - INFO - epoch 1 done\x1b[0m"
    path = tmp_path / "colour.log"
    path.write_bytes(lines_with(lines, middle_index(lines), [coloured]))
    run = run_cli([path])
    assert run.code == 0, run.stderr
    assert run.doc is not None
    inp = only_input(run)
    assert "binary" not in inp["unparsed_by_reason"]
    assert inp["unparsed_by_reason"]["other"] == only_input(ref)["unparsed_by_reason"]["other"] + 1
    assert facts(run.doc) == facts(ref.doc)


# --------------------------------------------------------------------------------------
# PyTorch and DeepSpeed lines keep the same rules


_DS = "[2024-05-02 10:00:{s:02d},100] [INFO] [logging.py:96:log_dist] [Rank 0] "
_WATCHDOG = (
    "[rank{r}]:[E502 10:31:02.{r}00000 7{r} ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog "
    "caught collective operation timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE, "
    "NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for 600150 milliseconds before "
    "timing out."
)


def _framework_log(junk: bytes) -> bytes:
    """Four DeepSpeed timer lines and three watchdog lines around ``junk``."""

    def timer(s: int) -> str:
        return (
            _DS.format(s=s) + f"time (ms) | fwd_microstep: {100 + s}.25 | bwd_microstep: 2{s}0.50"
        )

    def text(lines: list[str]) -> bytes:
        return ("\n".join(lines) + "\n").encode()

    head = text([timer(0), timer(1), _WATCHDOG.format(r=0), _WATCHDOG.format(r=1)])
    return head + junk + text([timer(2), timer(3), _WATCHDOG.format(r=3)])


@pytest.mark.parametrize(
    "junk",
    [
        pytest.param(b"\x00\x01\xff\xfe binary \x9c\x80\n", id="binary"),
        pytest.param(b"x" * (10 << 20) + b"\n", id="giant-line"),
        pytest.param(b"[rank2]:[E502 10:31:02.2 72 ProcessGroupNCCL.cpp:632] [Rank 2] Watch\n",
                     id="cut-watchdog-line"),
        pytest.param(_DS.format(s=9).encode() + b"time (ms) | fwd_microstep: 1\xff2.50\n",
                     id="invalid-utf8-in-a-timer"),
    ],
)  # fmt: skip
def test_damage_among_framework_lines_loses_no_valid_line(tmp_path: Path, junk: bytes) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(_framework_log(junk))
    run = run_cli([log])
    assert run.result.exit_code == 0
    assert run.doc is not None
    assert run.doc["timers"]["fwd_microstep"]["count"] == 4
    assert run.doc["timers"]["bwd_microstep"]["count"] == 4
    assert sorted(t["rank"] for t in run.doc["timeouts"]) == [0, 1, 3]
    inp = run.doc["inputs"][0]
    assert inp["lines"] == 8
    assert inp["unparsed"] == inp["lines"] - inp["parsed"] >= 1  # the damaged line


def test_framework_log_still_being_written(tmp_path: Path) -> None:
    """The last watchdog line is cut (no newline yet): the complete ones are all read,
    and the cut one is not invented."""
    text = _framework_log(b"").decode()
    cut = text[: text.rindex("Timeout(ms)")]  # inside rank 3's line
    log = tmp_path / "train.log"
    log.write_text(cut)
    run = run_cli([log])
    assert run.doc is not None
    assert sorted(t["rank"] for t in run.doc["timeouts"]) == [0, 1]
    assert run.doc["timers"]["fwd_microstep"]["count"] == 4
    assert any("no newline" in n for n in run.doc["inputs"][0]["notes"])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("count", "count 999999999999999999999999999"),
        ("opCount", "opCount ffffffffffffffffffffffff"),
        ("datatype", "datatype 4294967299"),
    ],
)
def test_coll_line_with_a_number_too_big_for_its_column(
    tmp_path: Path, field: str, value: str
) -> None:
    """One damaged COLL line whose number no column holds is skipped and counted as
    malformed; the report goes on and every other line is kept (it used to end the
    report in a polars overflow traceback)."""
    ref = clean_run(tmp_path)
    lines = sample_lines()
    at = middle_index(lines)
    good = lines[at].text
    pattern = {"count": r"count \d+", "opCount": r"opCount [0-9a-f]+", "datatype": r"datatype \d+"}
    damaged = re.sub(pattern[field], value, good, count=1)
    assert damaged != good
    path = tmp_path / "big.log"
    path.write_bytes(lines_with(lines, at, [damaged.encode()]))

    assert_one_more_malformed(run_cli([path]), ref, at + 1)


@pytest.mark.parametrize(
    ("case", "pattern", "value"),
    [
        # a plain INFO line (counted by the vectorised reader when intact)
        ("info pid", r"^node-a:4101:4191 .* Connected all rings", "99999999999999999999999"),
        # a connection line (parsed by the vectorised connection reader when intact)
        ("connection channel", r"^node-a:4101:4191 .* Channel 00/0 : 0\[0\] -> 1", "4294967296"),
        # init lines (their headers read in polars, their messages in Python)
        ("init pid", r"^node-a:4101:4191 .* Init COMPLETE$", "18446744073709551616"),
        ("init rank", r"^node-a:4101:4191 .* Init COMPLETE$", "4294967296"),
        # a COLL line's header (the fast field reader keeps the host:pid:tid token)
        ("coll pid", r"^node-a:4101:\d+ .* opCount", "99999999999999999999999"),
    ],
)
def test_header_or_record_number_too_big_for_its_column(
    tmp_path: Path, case: str, pattern: str, value: str
) -> None:
    """A damaged copy of a non-COLL line (or of a COLL line's header) whose pid, channel
    or rank no Int32 column holds is skipped and counted as malformed; every other line
    is parsed as in the reference (these used to end the report in a polars traceback)."""
    ref = clean_run(tmp_path)
    lines = sample_lines()
    at = middle_index(lines)
    good = next(line.text for line in lines if re.search(pattern, line.text))
    where = {"pid": r"(?<=^node-a:)4101", "channel": r"(?<=Channel )00", "rank": r"(?<= rank )0"}
    damaged = re.sub(where[case.split()[1]], value, good, count=1)
    assert damaged != good
    path = tmp_path / "big.log"
    path.write_bytes(lines_with(lines, at, [damaged.encode()]))

    assert_one_more_malformed(run_cli([path]), ref, at + 1)
