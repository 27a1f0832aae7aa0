"""The metric catalog, the board and its exposition, and the job's live metric rows."""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from ncclscope.agent.exporter import (
    Board,
    identity_rows,
    new_registry,
    render,
    serve,
    write_textfile,
)
from ncclscope.agent.live import LiveWindow, job_rows, stamp
from ncclscope.analysis import run_analysis
from ncclscope.catalog import CATALOG, by_name, render_markdown
from ncclscope.detect import Context
from ncclscope.synth import SlowRank, StopRank, SynthSpec, generate

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "metrics.md"


def test_catalog_names_follow_the_conventions() -> None:
    names = [m.name for m in CATALOG]
    assert len(names) == len(set(names))
    for m in CATALOG:
        assert m.name.startswith("ncclscope_")
        assert (m.kind == "counter") == m.name.endswith("_total"), m.name
        assert (m.kind == "info") == m.name.endswith("_info"), m.name
        if m.unit:
            assert m.unit in m.name, m.name
        if m.name.startswith("ncclscope_gpu_"):
            assert m.labels[:3] == ("gpu", "UUID", "pci_bus_id"), m.name
        # Host identity lives in node_info (the agent's host) and rank_info (the host a
        # rank's log lines name: one agent may read several hosts' logs), nowhere else.
        assert "hostname" not in m.labels or m.name in {
            "ncclscope_node_info",
            "ncclscope_rank_info",
        }
    required = {
        "ncclscope_host_memory_available_bytes",
        "ncclscope_gpu_memory_used_bytes",
        "ncclscope_gpu_pcie_tx_bytes_per_second",
        "ncclscope_gpu_pcie_rx_bytes_per_second",
        "ncclscope_gpu_pcie_link_max_bytes_per_second",
        "ncclscope_collective_seq",
        "ncclscope_pending_collective_age_seconds",
        "ncclscope_timeout_remaining_seconds",
        "ncclscope_straggler_score",
        "ncclscope_scrape_collector_success",
        "ncclscope_build_info",
        "ncclscope_node_info",
    }
    assert required <= set(names)


def test_docs_are_rendered_from_the_catalog() -> None:
    text = DOC.read_text(encoding="utf-8")
    head = text[: text.index("### ")]
    if os.environ.get("NCCLSCOPE_REGENERATE"):
        DOC.write_text(head + render_markdown(), encoding="utf-8")
        text = DOC.read_text(encoding="utf-8")
    assert text[len(head) :] == render_markdown(), "run with NCCLSCOPE_REGENERATE=1"


def test_board_checks_names_and_labels() -> None:
    board = Board()
    with pytest.raises(KeyError):
        board.set("x", {"ncclscope_no_such_metric": [((), 1.0)]})
    with pytest.raises(ValueError, match="labels"):
        board.set("x", {"ncclscope_collective_seq": [(("comm",), 1.0)]})


def _render(board: Board) -> str:
    body = render(board)
    assert body == generate_latest(new_registry(board)), "render differs from client_python"
    return body.decode()


def test_exposition_and_replacement() -> None:
    board = Board()
    board.set("identity", identity_rows("node-7"))
    board.set("host", {"ncclscope_host_memory_available_bytes": [((), 1.5e9)]})
    board.set("host", {"ncclscope_process_resident_memory_bytes": [(("41",), 2.0)]})
    text = _render(board)
    assert 'ncclscope_node_info{hostname="node-7"} 1.0' in text
    assert 'ncclscope_process_resident_memory_bytes{pid="41"} 2.0' in text
    # a collector's rows replace its earlier rows: a series it stops reporting is gone
    assert "ncclscope_host_memory_available_bytes" not in text
    assert "# TYPE ncclscope_build_info gauge" in text


def test_render_escapes_like_client_python() -> None:
    board = Board()
    hostile = 'a"b\\c\nd{e}=f,g'
    board.set("identity", {"ncclscope_node_info": [((hostile,), 1.0)]})
    board.set(
        "logs",
        {
            "ncclscope_log_lines_read_total": [((), 12345678901.0)],
            "ncclscope_collective_seq": [((hostile, "3"), float("nan")), (("0xc", "4"), 1e-9)],
            "ncclscope_timeout_remaining_seconds": [(("0xc",), float("inf")), (("0xd",), -0.0)],
        },
    )
    text = _render(board)
    assert 'ncclscope_node_info{hostname="a\\"b\\\\c\\nd{e}=f,g"} 1.0' in text
    assert "ncclscope_log_lines_read_total 1.2345678901e+10" in text


def test_promtool_accepts_the_exposition(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: .ci/run installs the prometheus package")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    board = Board()
    board.set("identity", identity_rows("node-7"))
    board.set(
        "gpu",
        {
            "ncclscope_gpu_memory_used_bytes": [(("0", "GPU-1", "00000000:3B:00.0"), 1e9)],
            "ncclscope_gpu_ecc_uncorrected_errors_total": [(("0", "GPU-1", "00000000:3B:00.0"), 0)],
        },
    )
    result = subprocess.run(
        [promtool, "check", "metrics"], input=_render(board), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_http_endpoint(tmp_path: Path) -> None:
    board = Board()
    board.set("identity", identity_rows("node-7"))
    host, port = serve(board, "127.0.0.1:0")
    assert host == "127.0.0.1"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    assert 'ncclscope_node_info{hostname="node-7"} 1.0' in body
    out = tmp_path / "ncclscope.prom"
    write_textfile(board, out)
    assert 'ncclscope_node_info{hostname="node-7"}' in out.read_text()


def test_stamp() -> None:
    from datetime import UTC, datetime

    at = datetime(2026, 11, 23, 19, 58, 2, 113402, tzinfo=UTC)
    line = "[rank3]:node-0:4103:4103 [3] NCCL INFO AllGather: opCount 0"
    assert stamp(line, at) == (
        "[rank3]:[2026-11-23 19:58:02.113402] node-0:4103:4103 [3] NCCL INFO AllGather: opCount 0"
    )
    assert stamp("plain text", at) is None


def _window(job: Path) -> LiveWindow:
    """The job's lines as if followed: arrival = the NCCL time on the line, else the last."""
    from datetime import UTC, datetime

    window = LiveWindow(job.parent / f"{job.name}-window")
    t = datetime(2026, 1, 1, tzinfo=UTC)
    for path in sorted(job.glob("*.log")):
        for text in path.read_text().splitlines():
            window.add([(str(path), text, t)])
            t += timedelta(microseconds=100)
    return window


def test_job_rows_count_down_and_name_the_culprit(tmp_path: Path) -> None:
    spec = SynthSpec(
        ranks=8, hosts=2, steps=3, era="2.27", timestamps=True, seed=6,
        faults=(StopRank(rank=4, at_instance=11),),
    )  # fmt: skip
    generate(spec, tmp_path / "job")
    a = run_analysis([str(tmp_path / "job")], workdir=tmp_path / "w")
    ctx = Context(a.analysis)
    assert ctx.last_ts is not None
    rows = job_rows(a, ctx.last_ts + timedelta(seconds=90))
    (comm, rank, _op, seq), _one = rows["ncclscope_timeout_culprit_info"][0]
    assert (rank, seq) == ("4", "11")
    ((_c,), left) = rows["ncclscope_timeout_remaining_seconds"][0]
    ((_c2,), age) = rows["ncclscope_pending_collective_age_seconds"][0]
    timeout_s, _source = a.analysis.frameworks.timeout
    assert timeout_s is not None
    assert left == pytest.approx(timeout_s - age)
    assert 90 <= age < 91
    seqs = {labels: v for labels, v in rows["ncclscope_collective_seq"]}
    assert seqs[(comm, "4")] == 10
    assert seqs[(comm, "0")] == 11


def test_series_do_not_grow_with_collectives(tmp_path: Path) -> None:
    counts = []
    for steps in (3, 12):
        spec = SynthSpec(
            ranks=16, hosts=2, steps=steps, era="2.27", timestamps=True, seed=1,
            faults=(SlowRank(rank=3, lateness_s=0.005),),
        )  # fmt: skip
        generate(spec, tmp_path / f"job{steps}")
        a = run_analysis([str(tmp_path / f"job{steps}")], workdir=tmp_path / f"w{steps}")
        rows = job_rows(a, a.analysis.frameworks.timers["ts"].max() or a.context.last_ts)  # type: ignore[arg-type]
        counts.append(sum(len(v) for v in rows.values()))
        scores = dict(rows["ncclscope_straggler_score"])
        assert max(scores, key=scores.__getitem__) == ("3",)
    assert counts[0] == counts[1]


def test_series_per_metric_grow_with_ranks_and_comms_not_collectives(tmp_path: Path) -> None:
    """Each agent (one node's per-rank files) exports the same series, metric by metric,
    after 20 steps and after 200 (~10x the collectives): one per rank and communicator,
    one per communicator, one per rank; never one per collective."""
    per_metric: dict[tuple[int, str], dict[str, int]] = {}
    last_seq: dict[int, float] = {}
    for steps in (20, 200):
        spec = SynthSpec(
            ranks=16, hosts=2, steps=steps, layers=2, era="2.27", timestamps=True, seed=1,
            layout="per-rank", tp_traffic=True, faults=(SlowRank(rank=3, lateness_s=0.005),),
        )  # fmt: skip
        generate(spec, tmp_path / f"job{steps}")
        for node in ("node-0", "node-1"):
            files = sorted(str(f) for f in (tmp_path / f"job{steps}").glob(f"{node}.*.log"))
            a = run_analysis(files, workdir=tmp_path / f"w{steps}{node}")
            last = Context(a.analysis).last_ts
            assert last is not None
            rows = job_rows(a, last)
            per_metric[(steps, node)] = {name: len(v) for name, v in rows.items() if v}
            if node == "node-0":
                last_seq[steps] = max(v for _labels, v in rows["ncclscope_collective_seq"])
    # The longer job did run ~10x the collectives, past several marks of every=64 and 1024.
    assert last_seq[200] > 9 * last_seq[20]
    assert last_seq[200] > 1024
    for node in ("node-0", "node-1"):
        counts = per_metric[(20, node)]
        assert counts == per_metric[(200, node)]
        # 8 ranks on the node, each on 2 communicators (the world and its node's).
        assert counts["ncclscope_collective_seq"] == 8 * 2
        assert counts["ncclscope_collective_entered_timestamp_seconds"] == 8 * 2
        assert counts["ncclscope_collective_op_info"] == 8 * 2
        assert counts["ncclscope_collective_mark_seq"] == 8 * 2 * 2  # every=64 and 1024
        assert counts["ncclscope_communicator_ranks"] == 2
        assert counts["ncclscope_rank_info"] == 8
        # One lateness and score per rank, though the node sees as many members of the
        # world as of its own communicator (two rows would be one series twice).
        assert counts["ncclscope_collective_lateness_seconds"] == 8
        assert counts["ncclscope_straggler_score"] == 8


def test_window_stamps_arrival_times_when_nccl_prints_none(tmp_path: Path) -> None:
    generate(SynthSpec(ranks=8, hosts=1, steps=3, era="2.21", seed=2), tmp_path / "job")
    window = _window(tmp_path / "job")
    assert window.own_times is False
    a = window.analyse(tmp_path / "live")
    window.close()
    assert a is not None
    assert a.analysis.collectives is not None
    sources = a.analysis.collectives.select("ts_source").unique().collect()["ts_source"].to_list()
    assert sources == ["stamped"]
    timed = SynthSpec(ranks=8, hosts=1, steps=3, era="2.27", timestamps=True, seed=2)
    generate(timed, tmp_path / "j2")
    timed_window = _window(tmp_path / "j2")
    timed_window.close()
    assert timed_window.own_times is True
    assert len(by_name()) == len(CATALOG)


def test_window_keeps_the_last_lines_on_disk_and_bounded(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    window = LiveWindow(tmp_path / "segments", max_lines=10, segment_lines=4, keep_lines=3)
    t = datetime(2026, 1, 1, tzinfo=UTC)
    header = "node-0:41:41 [0] NCCL INFO AllReduce: opCount {:x} count 8"
    came: list[str] = []

    def add(text: str, at: datetime) -> None:
        window.add([("a.log", text, at)])
        came.append(stamp(text, at) or text)

    add("node-0:41:41 [0] NCCL INFO comm 0x5 rank 0 nranks 8 cudaDev 0 - Init COMPLETE", t)
    add("a config line", t)
    for k in range(30):
        add(header.format(k), t + timedelta(seconds=k))
        if k == 15:
            add("a warning in between", t)
        # never fewer than max_lines once that many came, never more than a segment over
        assert min(len(came), 10) <= window.lines <= 10 + 4
        assert len(list((tmp_path / "segments").glob("a.log.*.seg"))) <= 10 // 4 + 2
    (out,) = window.write(tmp_path / "out")
    window.close()
    written = out.read_text().splitlines()
    # the newest lines as they came, each stamped with its own arrival time...
    assert written[-10:] == came[-10:]
    # ...after the other lines of the segments that were dropped, in their order
    assert written[:3] == [came[0], came[1], "a warning in between"]
    assert len(written) == 3 + window.lines
    assert came.index(written[3]) > came.index("a warning in between")


def test_window_shares_max_lines_among_files(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    window = LiveWindow(tmp_path / "segments", max_lines=40, segment_lines=4)
    t = datetime(2026, 1, 1, tzinfo=UTC)
    for k in range(100):
        window.add([(f"rank{r}.log", f"x {k} opCount {k:x}", t) for r in range(4)])
    outs = window.write(tmp_path / "out")
    window.close()
    # One output per file, each the newest quarter of the lines (up to a segment over),
    # the file's own, in order.
    assert sorted(p.name.split(".log.")[0] for p in outs) == [f"rank{r}" for r in range(4)]
    for p in outs:
        written = p.read_text().splitlines()
        assert 10 <= len(written) <= 10 + 4, (p.name, len(written))
        assert written == [f"x {k} opCount {k:x}" for k in range(100 - len(written), 100)]


def test_bulk_stamping_matches_stamp_line_by_line(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    lines = [
        "node-0:41:41 [0] NCCL INFO AllReduce: opCount 1 count 8",
        "[rank3]:node-0:41:41 [3] NCCL INFO x",
        "é→ node-1:7:9 [1] NCCL INFO Init COMPLETE",  # non-ASCII before the header
        "node-0:41:41 node-0:41:41 [0] NCCL INFO twice",
        "says NCCL but has no header",
        "a plain line",
        "",
        "node-0:41:41 [0] transport.cc:12 NCCL WARN something",
        "node-0:41:41 [0] 1234.5 init.cc:99 NCCL TRACE t",
    ]
    window = LiveWindow(tmp_path / "segments", segment_lines=3)
    t = datetime(2026, 1, 1, tzinfo=UTC)
    for k, text in enumerate(lines):  # one poll per line: each its own arrival time
        window.add([("a.log", text, t + timedelta(seconds=k))])
    assert window.own_times is False
    (out,) = window.write(tmp_path / "out")
    window.close()
    want = [stamp(x, t + timedelta(seconds=k)) or x for k, x in enumerate(lines)]
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == want
