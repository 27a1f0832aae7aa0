"""Asking RAS (ncclscope.evidence.ras) against the stand-in server (ncclscope.synth.ras_server):
every layout NCCL prints, every misbehaviour, each bounded in time with its outcome."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from ncclscope.evidence.manifest import Ask
from ncclscope.evidence.ras import ask_ras, ras_addr_from_env
from ncclscope.parsers.tools.ras import RasRead, parse_ras_json, parse_ras_text
from ncclscope.synth.ras_server import (
    Mode,
    RasJob,
    RasServer,
    free_port,
    ras_json_report,
    ras_text_report,
)

#: What a bounded ask may take past its budget on a loaded machine.
SLACK_S = 3.0

JOB = RasJob(
    nodes=("10.1.0.11", "10.1.0.12", "10.1.0.13"),
    ranks_per_node=4,
    dead=(6,),
    missing=(9,),
    mismatched={2: 639},
    cuda_compiled="12.8",
    cuda_runtime=12080,
    cuda_driver=12090,
)


def _ask(tmp_path: Path, server: RasServer, *, timeout_s: float, **kw: object) -> tuple[Ask, float]:
    """ask_ras on a thread, so that an unbounded ask fails the test instead of hanging it."""
    done: list[Ask] = []

    def run() -> None:
        done.append(ask_ras(tmp_path, addr=server.addr, timeout_s=timeout_s, **kw))  # type: ignore[arg-type]

    worker = threading.Thread(target=run, daemon=True)
    t0 = time.monotonic()
    worker.start()
    worker.join(timeout_s + SLACK_S)
    assert done, f"ask_ras still running {timeout_s + SLACK_S:.1f} s after a {timeout_s} s budget"
    return done[0], time.monotonic() - t0


def _read(tmp_path: Path, ask: Ask) -> RasRead:
    assert ask.file is not None
    text = (tmp_path / ask.file).read_text()
    return (
        parse_ras_json(text, ask.file)
        if ask.file.endswith(".json")
        else parse_ras_text(text, ask.file)
    )


def _named(read: RasRead) -> set[tuple[int | None, int | None, str | None, str]]:
    """(comm rank, pid, host, state) of every rank or process the report names."""
    return {
        (r["comm_rank"], r["pid"], r["host"], r["state"])
        for r in read.ranks.select("comm_rank", "pid", "host", "state").to_dicts()
    }


# (NCCL release, format asked, file written): the text of 2.24/2.25 (one count per
# communicator), of 2.26+ (per op), JSON with 2.28.7-2.28.9's missing comma, JSON fixed.
LAYOUTS = [
    ("2.24.3", "auto", "ras/report.txt"),
    ("2.26.2", "auto", "ras/report.txt"),
    ("2.28.9", "text", "ras/report.txt"),
    ("2.28.7", "auto", "ras/report.json"),
    ("2.28.9", "json", "ras/report.json"),
    ("2.29.7", "auto", "ras/report.json"),
]


@pytest.mark.parametrize(("version", "fmt", "file"), LAYOUTS)
def test_every_layout_is_answered_and_names_the_ranks(
    tmp_path: Path, version: str, fmt: str, file: str
) -> None:
    with RasServer(JOB, nccl_version=version) as ras:
        ask, took = _ask(tmp_path, ras, fmt=fmt, timeout_s=5.0)
    assert (ask.outcome, ask.why, ask.file) == ("answered", "", file)
    assert ask.target == f"RAS {ras.addr}"
    assert ask.via == "ncclras protocol 2"
    assert ask.size_bytes == (tmp_path / file).stat().st_size > 0
    assert took < 5.0 + SLACK_S
    read = _read(tmp_path, ask)
    assert read.problem is None
    assert read.report["nccl_version"].to_list() == [version]
    assert read.report["cuda_runtime_version"].to_list() == [12080]
    named = _named(read)
    # the lagging rank with its process and host, in every layout
    assert (2, 4002, "10.1.0.11", "mismatch") in named
    if file.endswith(".json"):
        assert (6, 4006, "10.1.0.12", "dead") in named
        assert (9, 4009, "10.1.0.13", "unresponsive") in named
        return
    assert read.report["nodes"].to_list() == [3]
    # the dead and the silent process (Errors: DEAD and INCOMPLETE)
    assert (None, 4006, "10.1.0.12", "dead") in named
    assert (None, 4009, "10.1.0.13", "missing") in named
    if version >= "2.26":  # 2.24/2.25 give a communicator's missing ranks as numbers only
        assert (6, 4006, "10.1.0.12", "missing") in named
        assert (9, 4009, "10.1.0.13", "missing") in named


def test_the_conversation_is_ncclras_own(tmp_path: Path) -> None:
    with RasServer(JOB, nccl_version="2.28.9") as ras:
        ask_ras(tmp_path, addr=ras.addr, timeout_s=5.0)
        ask_ras(tmp_path, addr=ras.addr, fmt="text", timeout_s=20.0, verbose=False)
    # TIMEOUT leaves room to send the report (5 s) and for RAS's extra 5 s (20 s).
    assert ras.commands == [
        "CLIENT PROTOCOL 2", "TIMEOUT 3", "SET FORMAT json", "VERBOSE STATUS",
        "CLIENT PROTOCOL 2", "TIMEOUT 13", "STATUS",
    ]  # fmt: skip


def test_an_old_server_gives_text_to_auto_and_refuses_json(tmp_path: Path) -> None:
    with RasServer(JOB, nccl_version="2.26.2") as ras:
        auto = ask_ras(tmp_path / "a", addr=ras.addr, fmt="auto", timeout_s=5.0)
        strict = ask_ras(tmp_path / "j", addr=ras.addr, fmt="json", timeout_s=5.0)
    assert (auto.outcome, auto.file) == ("answered", "ras/report.txt")
    assert (strict.outcome, strict.file) == ("refused", None)
    assert "2.28.7" in strict.why
    assert "Unknown command" in strict.why


def test_another_protocol_number_is_recorded_and_spoken_to(tmp_path: Path) -> None:
    with RasServer(JOB, nccl_version="2.28.9", protocol=3) as ras:
        ask = ask_ras(tmp_path, addr=ras.addr, timeout_s=5.0)
    assert (ask.outcome, ask.via) == ("answered", "ncclras protocol 3")


# (mode, release, budget, outcome, file kept, words in why)
MISBEHAVIOUR: list[tuple[Mode, str, float, str, str | None, str]] = [
    ("silent", "2.28.9", 1.0, "no_answer", None, "CLIENT PROTOCOL"),
    ("stall", "2.28.9", 1.0, "no_answer", None, "no report within 1.0 s"),
    ("drip", "2.28.9", 1.0, "truncated", "ras/report.json", "still coming"),
    ("drip", "2.24.3", 1.0, "truncated", "ras/report.txt", "still coming"),
    ("truncate", "2.28.9", 5.0, "truncated", "ras/report.json", "mid-report"),
    ("truncate", "2.26.2", 5.0, "truncated", "ras/report.txt", "mid-report"),
    ("garbage", "2.28.9", 5.0, "garbage", "ras/answer.raw", "not a RAS report"),
    ("garbage", "2.24.3", 5.0, "garbage", "ras/answer.raw", "not a RAS report"),
    ("noise", "2.28.9", 5.0, "garbage", None, "not RAS protocol"),
]


@pytest.mark.parametrize(("mode", "version", "budget", "outcome", "file", "why"), MISBEHAVIOUR)
def test_a_misbehaving_server_is_bounded_and_named(
    tmp_path: Path, mode: Mode, version: str, budget: float, outcome: str, file: str | None,
    why: str,
) -> None:  # fmt: skip
    with RasServer(JOB, nccl_version=version, mode=mode, drip_s=0.05) as ras:
        ask, took = _ask(tmp_path, ras, timeout_s=budget)
    assert (ask.outcome, ask.file) == (outcome, file)
    assert why in ask.why
    assert took < budget + SLACK_S
    assert ask.elapsed_s < budget + SLACK_S
    if file is not None:
        assert 0 < ask.size_bytes == (tmp_path / file).stat().st_size


def test_a_one_byte_a_second_drip_is_cut_at_the_budget(tmp_path: Path) -> None:
    with RasServer(JOB, nccl_version="2.26.2", mode="drip", drip_s=1.0) as ras:
        ask, took = _ask(tmp_path, ras, timeout_s=1.5)
    assert ask.outcome == "truncated"
    assert took < 1.5 + SLACK_S
    assert "NCCL version".startswith((tmp_path / "ras/report.txt").read_text())


def test_a_cut_report_keeps_what_came(tmp_path: Path) -> None:
    with RasServer(JOB, nccl_version="2.26.2", mode="truncate") as ras:
        ask = ask_ras(tmp_path, addr=ras.addr, timeout_s=5.0)
    whole = ras_text_report(JOB, "2.26.2").encode()
    kept = (tmp_path / "ras/report.txt").read_bytes()
    assert ask.outcome == "truncated"
    assert kept == whole[: len(whole) // 2]


def test_a_refused_connection_says_how_to_enable_ras(tmp_path: Path) -> None:
    ask = ask_ras(tmp_path, addr=f"127.0.0.1:{free_port()}", timeout_s=2.0)
    assert (ask.outcome, ask.file) == ("unavailable", None)
    assert "NCCL_RAS_ENABLE" in ask.why
    assert "NCCL_RAS_ADDR" in ask.why
    assert ask.elapsed_s < 2.0 + SLACK_S
    assert not (tmp_path / "ras").exists()


def test_a_bad_address_is_an_error_not_a_raise(tmp_path: Path) -> None:
    ask = ask_ras(tmp_path, addr="node-1:port", timeout_s=1.0)
    assert ask.outcome == "error"
    assert "host:port" in ask.why


def test_the_address_comes_from_nccl_ras_addr() -> None:
    assert ras_addr_from_env({"NCCL_RAS_ADDR": "10.0.0.7:29000"}) == "10.0.0.7:29000"
    assert ras_addr_from_env({"NCCL_RAS_ADDR": " "}) == "127.0.0.1:28028"
    assert ras_addr_from_env({}) == "127.0.0.1:28028"


def test_an_address_from_env_reaches_the_server(tmp_path: Path) -> None:
    with RasServer(JOB, nccl_version="2.29.7") as ras:
        port = ras.addr.rsplit(":", 1)[1]
        ask = ask_ras(tmp_path, addr=ras_addr_from_env({"NCCL_RAS_ADDR": f"localhost:{port}"}))
    assert ask.outcome == "answered"


def test_the_json_writer_drops_the_comma_exactly_where_nccl_did() -> None:
    # 2.28.7-2.28.9 jsonWriteMissingRank: "nvml_dev": %d\n then "status"; 2.29.2 fixed it.
    now = datetime(2026, 3, 2, 11, 4, 31)
    bad = ras_json_report(JOB, "2.28.9", now=now)
    good = ras_json_report(JOB, "2.29.7", now=now)
    assert '"nvml_dev": 2\n          "status"' in bad
    assert bad.replace('"nvml_dev": 2\n', '"nvml_dev": 2,\n').replace(
        '"nvml_dev": 1\n', '"nvml_dev": 1,\n'
    ) == good.replace("2.29.7", "2.28.9")
    assert parse_ras_json(bad, "x").notes  # repaired by the parser, and said so
    assert not parse_ras_json(good, "x").notes
