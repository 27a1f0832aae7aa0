"""The reference line parser on every family and version shape of shared/formats/nccl.md.

Sample lines are written here from NCCL's format strings (values invented).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from ncclscope.parsers.nccl.lines import (
    Chain,
    Coll,
    CommEvent,
    Connection,
    EnvSetting,
    InitTimings,
    Message,
    NodeLayout,
    RankHint,
    RingList,
    Version,
    clean_line,
    parse_line,
    transport_name,
)
from ncclscope.parsers.nccl.procs import decode_proc
from ncclscope.parsers.nccl.records import (
    LineRecords,
    add_connection_lines,
    add_info_messages,
    collect_records,
    connection_lines,
    info_messages,
)
from ncclscope.parsers.nccl.scan import ScanTarget, scan_inputs, sniff_offsets

H = "node-a:4411:4411 [1] NCCL INFO "


@pytest.mark.parametrize(
    ("line", "kind", "body"),
    [
        # 3.1 banners
        ("NCCL version 2.7.8+cuda11.0", "banner", Version("2.7.8", "11.0", "")),
        (H + "NCCL version 2.23.4+cuda12.6", "version", Version("2.23.4", "12.6", "")),
        ("NCCL version 2.18.5-1+cuda12.2", "banner", Version("2.18.5", "12.2", "-1")),
        # 3.3 init lines, 2.4 .. 2.29
        (
            H + "comm 0x55d4f0 rank 3 nranks 8 cudaDev 1 nvmlDev 1 - Init COMPLETE",
            "comm_event",
            CommEvent("0x55d4f0", 3, 8, "Init", "COMPLETE", None, 1, 1, None, None, None),
        ),
        (
            H + "comm 0x55d4f0 rank 3 nranks 8 cudaDev 1 busId 2000 - Init COMPLETE",
            "comm_event",
            CommEvent("0x55d4f0", 3, 8, "Init", "COMPLETE", None, 1, None, "2000", None, None),
        ),
        (
            H + "comm 0x55d4f0 rank 3 nranks 8 cudaDev 1 busId 2000 commId 0xabc12 - Init COMPLETE",
            "comm_event",
            CommEvent("0x55d4f0", 3, 8, "Init", "COMPLETE", None, 1, None, "2000", "0xabc12", None),
        ),
        (
            H + "ncclCommInitRankConfig comm 0x55d4f0 rank 3 nranks 8 cudaDev 1 nvmlDev 1 "
            "busId 2000 commId 0xabc12 - Init START",
            "comm_event",
            CommEvent(
                "0x55d4f0",
                3,
                8,
                "Init",
                "START",
                "ncclCommInitRankConfig",
                1,
                1,
                "2000",
                "0xabc12",
                None,
            ),
        ),
        (
            H + "ncclCommSplit comm 0x55e1 rank 1 nranks 4 cudaDev 1 nvmlDev 1 busId 1b000 "
            "parent 0x55d4f0 splitCount 1 color 0 key 1- Init START",
            "comm_event",
            CommEvent(
                "0x55e1", 1, 4, "Init", "START", "ncclCommSplit", 1, 1, "1b000", None, "0x55d4f0"
            ),
        ),
        (
            H + "[Rank 3] ncclCommInitRank comm 0x55d4f0 rank 3 nranks 8 cudaDev 1 nvmlDev 1 "
            "busId 2000 commId 0xabc12 - Init START",
            "comm_event",
            CommEvent(
                "0x55d4f0", 3, 8, "Init", "START", "ncclCommInitRank", 1, 1, "2000", "0xabc12", None
            ),
        ),
        (
            H + "comm 0x55d4f0 rank 3 nRanks 8 cudaDev 1 busId 2000 - Abort START",
            "comm_event",
            CommEvent("0x55d4f0", 3, 8, "Abort", "START", None, 1, None, "2000", None, None),
        ),
        (
            H + "comm 0x55d4f0 rank 3 nranks 8 cudaDev 1 busId 2000 - Destroy COMPLETE",
            "comm_event",
            CommEvent("0x55d4f0", 3, 8, "Destroy", "COMPLETE", None, 1, None, "2000", None, None),
        ),
        (
            H + "comm 0x55d4f0 rank 9 nRanks 16 nNodes 2 localRanks 8 localRank 1 MNNVL 0",
            "node_layout",
            NodeLayout("0x55d4f0", 9, 16, 2, 8, 1),
        ),
        # 3.4 rings and trees
        (H + "Channel 00/32 :    0   1   2   3", "ring_list", RingList(0, (0, 1, 2, 3))),
        (H + "Channel 01 :    0   1", "ring_list", RingList(1, (0, 1))),
        (H + "Trees [0] 1/-1/-1->0->-1 [1] -1/-1/-1->0->1", "rank_hint", RankHint(0, "trees")),
        (H + "Trees [0] 2/-1/-1->1->0|0->1->2/-1/-1", "rank_hint", RankHint(1, "trees")),
        (H + "Ring 00 : 7 -> 0 -> 1", "rank_hint", RankHint(0, "graph")),
        # 3.5 connections, every era
        (
            H + "Ring 00 : 0 -> 1 via P2P/direct pointer",
            "connection",
            Connection(0, 0, 1, None, "P2P/direct", "P2P/direct pointer"),
        ),
        (
            H + "Ring 00 : 0[1000] -> 1[2000] via direct shared memory",
            "connection",
            Connection(0, 0, 1, None, "SHM", "direct shared memory"),
        ),
        (
            H + "Channel 00 : 1[2000] -> 2[1000] [send] via NET/Socket/0",
            "connection",
            Connection(0, 1, 2, "send", "NET/Socket", "NET/Socket/0"),
        ),
        (
            H + "Channel 00/0 : 7[7] -> 8[0] [send] via NET/IB/0/GDRDMA",
            "connection",
            Connection(0, 7, 8, "send", "NET/IB", "NET/IB/0/GDRDMA"),
        ),
        (
            H + "Channel 03/0 : 15[7] -> 0[0] [receive] via NET/IBext_v8/1/GDRDMA(PCI)",
            "connection",
            Connection(3, 15, 0, "receive", "NET/IBext_v8", "NET/IBext_v8/1/GDRDMA(PCI)"),
        ),
        (
            H + "Channel 02/0 : 1[1] -> 2[2] via P2P/CUMEM/read",
            "connection",
            Connection(2, 1, 2, None, "P2P/CUMEM", "P2P/CUMEM/read"),
        ),
        (
            H + "Channel 00 : 0[0] -> 1[1] via SHM/direct/direct",
            "connection",
            Connection(0, 0, 1, None, "SHM", "SHM/direct/direct"),
        ),
        (
            H + "CollNet 00/0 : 3 [send] via COLLNET/SHARP/0",
            "connection",
            Connection(0, 3, None, "send", "CollNet", "COLLNET/SHARP/0"),
        ),
        # 3.6 COLL
        (
            H + "Send: opCount 2f sendbuff 0x7f00 recvbuff (nil) count 1024 datatype 7 op 0 "
            "root 3 comm 0x55d4f0 [nranks=8] stream 0x55aa",
            "coll",
            Coll("Send", 0x2F, 1024, 7, 0, 3, "0x55d4f0", 8),
        ),
        (
            H + "AlltoAll: opCount 0 sendbuff 0x7f00 recvbuff 0x7f80 count 8 datatype 9 op 0 "
            "root 0 comm 0x55d4f0 [nranks=8] stream 0x55aa",
            "coll",
            Coll("AlltoAll", 0, 8, 9, 0, 0, "0x55d4f0", 8),
        ),
        # 3.7 chains, env, timings
        (
            H + "transport/net.cc:1286 -> 6",
            "chain",
            Chain("transport/net.cc", 1286, 6, None, None, None),
        ),
        (
            H + "misc/socket.cc:561 -> 2 (Connection refused) [Async thread]",
            "chain",
            Chain("misc/socket.cc", 561, 2, "Connection refused", "Async thread", None),
        ),
        (
            H + "proxy.cc:1529 (progressOps) -> 6 [Progress Thread]",
            "chain",
            Chain("proxy.cc", 1529, 6, None, "Progress Thread", "progressOps"),
        ),
        (
            H + "NCCL_IB_TIMEOUT set by environment to 22.",
            "env",
            EnvSetting("NCCL_IB_TIMEOUT", "22"),
        ),
        (H + "NCCL_IB_HCA set to mlx5_0", "env", EnvSetting("NCCL_IB_HCA", "mlx5_0")),
        (
            H + "Init timings - ncclCommInitRank: rank 3 nranks 16 total 1.21 (kernels 0.18, "
            "alloc 0.01, bootstrap 0.62, allgathers 0.02, topo 0.21, graphs 0.01, "
            "connections 0.15, rest 0.01)",
            "init_timings",
            InitTimings(3, 16, 1.21),
        ),
        (H + "Using network IB", "info", Message("Using network IB")),
        (
            H + "RAS declaring peer 10.0.0.2<41234> as DEAD; rasDeadPeersHash 0x1f2e",
            "ras",
            Message("RAS declaring peer 10.0.0.2<41234> as DEAD; rasDeadPeersHash 0x1f2e"),
        ),
    ],
)
def test_families(line: str, kind: str, body: object) -> None:
    parsed = parse_line(line)
    assert parsed is not None
    assert parsed.kind == kind
    assert parsed.body == body


@pytest.mark.parametrize(
    ("line", "src", "func"),
    [
        (
            "node-a:4411:4502 [3] misc/socket.cc:479 NCCL WARN Net : Connection closed by remote "
            "peer",
            "misc/socket.cc",
            None,
        ),
        (
            "node-a:4411:4502 [3] transport/net.cc:1286 (sendProxyProgress) NCCL WARN Bad thing",
            "transport/net.cc",
            "sendProxyProgress",
        ),
        (
            "[2025-03-14 09:05:37] node-a:4411:4502 [3] ib_plugin.c:1187 NCCL WARN NET/IB : Got "
            "async event : port error",
            "ib_plugin.c",
            None,
        ),
    ],
)
def test_warn_header(line: str, src: str, func: str | None) -> None:
    parsed = parse_line(line)
    assert parsed is not None
    assert parsed.kind == "warn"
    assert parsed.header is not None
    assert (parsed.header.level, parsed.header.src_file, parsed.header.func) == ("WARN", src, func)
    assert parsed.header.pid == 4411
    assert parsed.header.tid == 4502


@pytest.mark.parametrize(
    ("prefix", "launcher", "rank"),
    [
        ("[default3]:", "torchrun", None),
        ("[rank3]:", "torch_rank", 3),
        ("[1,3]<stdout>:", "openmpi", 3),
        ("3: ", "srun", 3),
        ("node-a: ", "pdsh", None),
        ("10.0.0.1: ", "pdsh", None),
        ("(RayTrainWorker pid=4821, ip=10.12.3.44) ", "ray", None),
        ("2024-08-03 14:07:22,519 - INFO - ", None, None),
    ],
)
def test_launcher_prefixes(prefix: str, launcher: str | None, rank: int | None) -> None:
    parsed = parse_line(prefix + H + "Using network IB")
    assert parsed is not None
    assert parsed.header is not None
    assert parsed.header.host == "node-a"
    assert (parsed.launcher, parsed.launcher_rank) == (launcher, rank)


@pytest.mark.parametrize(
    ("prefix", "ts"),
    [
        ("[2025-03-14 09:05:37] ", datetime(2025, 3, 14, 9, 5, 37, tzinfo=UTC)),
        ("[2025-03-14 09:05:37.123] ", datetime(2025, 3, 14, 9, 5, 37, 123000, tzinfo=UTC)),
        ("[2025-03-14 09:05:37.123456789] ", datetime(2025, 3, 14, 9, 5, 37, 123456, tzinfo=UTC)),
        ("[rank0]:[2025-03-14 09:05:37.5] ", datetime(2025, 3, 14, 9, 5, 37, 500000, tzinfo=UTC)),
    ],
)
def test_nccl_timestamps(prefix: str, ts: datetime) -> None:
    parsed = parse_line(prefix + H + "Using network IB")
    assert parsed is not None
    assert (parsed.ts, parsed.ts_source) == (ts, "nccl")


def test_clean_line_strips_ansi_and_progress_bars() -> None:
    assert clean_line("\x1b[32m" + H + "x\x1b[0m") == H + "x"
    assert clean_line("Epoch 1:  42%|####  | 42/100\r" + H + "x") == H + "x"


def test_spliced_line_keeps_the_complete_tail() -> None:
    line = (
        "node-a:1:1 [0] NCCL INFO AllRednode-b:2:2 [1] NCCL INFO Broadcast: opCount 3 "
        "sendbuff 0x1 recvbuff 0x2 count 5 datatype 7 op 0 root 0 comm 0x55 [nranks=2] stream 0x5"
    )
    parsed = parse_line(line)
    assert parsed is not None
    assert parsed.spliced
    assert parsed.header is not None
    assert parsed.header.pid == 2
    assert parsed.body == Coll("Broadcast", 3, 5, 7, 0, 0, "0x55", 2)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "hello world",
        "NCCL INFO",
        "x:1:2 [0] NCCL BOGUS y",
        "\x00\x01\x02",
        "[rank0]: Traceback",
        "NCCL error in: ../ProcessGroupNCCL.cpp:1970, unhandled system error, NCCL version 2.18.6",
    ],
)
def test_not_nccl(line: str) -> None:
    assert parse_line(line) is None


def test_transport_names() -> None:
    assert transport_name("NET/AWS Libfabric/0/GDRDMA") == "NET/OFI"
    assert transport_name("P2P/indirect/1[1]") == "P2P/indirect"
    assert transport_name("P2P/MNNVL/read") == "P2P/MNNVL"


def _fixture_lines() -> list[str]:
    root = Path(__file__).resolve().parent.parent / "fixtures"
    lines: list[str] = []
    for path in sorted(root.rglob("*")):
        if (
            path.is_file()
            and path.name not in ("expected.json", "README.md")
            and path.suffix != ".parquet"  # the agent's telemetry parts
            and "flight-recorder" not in path.parts  # PyTorch's dumps: pickles, not lines
        ):
            lines.extend(path.read_text().splitlines())
    return lines


def test_fast_path_agrees_with_reference(tmp_path: Path) -> None:
    """Every COLL line the vectorised pass takes gives the reference parser's fields."""
    lines = _fixture_lines()
    log = tmp_path / "all.log"
    log.write_text("\n".join(lines) + "\n")
    offsets = sniff_offsets(log, log.stat().st_size)
    assert offsets  # the fixtures use several prefix shapes
    scan = scan_inputs([ScanTarget(0, log, offsets)], tmp_path / "s")
    assert scan.n_lines == {0: len(lines)}
    assert scan.bad == []
    fast = scan.coll.collect()
    assert fast.height > 300
    for row in fast.iter_rows(named=True):
        ref = parse_line(lines[row["i"] - 1])
        assert ref is not None
        assert ref.header is not None
        assert isinstance(ref.body, Coll)
        decoded = decode_proc(row["proc"])
        assert decoded is not None
        host, pid, _tid = decoded
        got = (
            host,
            pid,
            row["op_tok"].removesuffix(":"),
            row["opcount"],
            row["count"],
            row["dtype"],
            row["redop"],
            row["root"],
            row["comm"],
            int(row["nranks_tok"].removeprefix("[nranks=").removesuffix("]")),
            row["ts"],
        )
        want = (
            ref.header.host,
            ref.header.pid,
            ref.body.op,
            ref.body.opcount,
            ref.body.count,
            ref.body.dtype,
            ref.body.redop,
            ref.body.root,
            ref.body.comm,
            ref.body.nranks,
            ref.ts if ref.ts_source == "nccl" else None,
        )
        assert got == want, lines[row["i"] - 1]
    # and every COLL line the reference parser finds was taken by one path or the other
    text = pl.read_parquet(scan.text_store)
    slow_coll = sum(
        1 for t in text["text"].to_list() if t and (p := parse_line(t)) and p.kind == "coll"
    )
    ref_coll = sum(1 for t in lines if (p := parse_line(t)) and p.kind == "coll")
    assert fast.height + slow_coll == ref_coll


def _coll(k: int, host: str = "node-b") -> str:
    return (
        f"{host}:77:77 [0] NCCL INFO AllReduce: opCount {k:x} sendbuff 0x7f1 recvbuff 0x7f2 "
        f"count {k + 1} datatype 7 op 0 root 0 comm 0x55e1 [nranks=2] stream 0x55e2"
    )


def test_many_files_keep_their_own_line_numbers(tmp_path: Path) -> None:
    """Files read by one list scan: each row gets its file and its line there."""
    shapes = {
        "a.log": ["hello", _coll(0), "", _coll(1)],
        "b.log": [_coll(0), "node-b:77:77 [0] NCCL INFO Using network IB", _coll(1), "bye"],
        "c.log": ["only text"],
    }
    targets = []
    for k, (name, lines) in enumerate(shapes.items()):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
        targets.append(ScanTarget(k, tmp_path / name, (0,)))
    scan = scan_inputs(targets, tmp_path / "s")
    assert scan.n_lines == {0: 4, 1: 4, 2: 1}
    coll = scan.coll.sort("file_id", "i").collect()
    assert coll.select("file_id", "i", "opcount").rows() == [
        (0, 2, 0),
        (0, 4, 1),
        (1, 1, 0),
        (1, 3, 1),
    ]
    text = pl.read_parquet(scan.text_store)
    assert text.select("file_id", "i", "text").rows() == [
        (0, 1, "hello"),
        (0, 3, None),
        (1, 2, "node-b:77:77 [0] NCCL INFO Using network IB"),
        (1, 4, "bye"),
        (2, 1, "only text"),
    ]


def test_an_offset_the_samples_missed_is_learned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many COLL lines with a prefix no sample showed: the scan learns their offset
    from them instead of leaving them all to the Python parser."""
    monkeypatch.setattr("ncclscope.parsers.nccl.scan._REPLAN_LINES", 10)
    lines = ["[default0]:" + _coll(k) for k in range(30)] + ["a b " + _coll(k) for k in range(30)]
    log = tmp_path / "job.log"
    log.write_text("\n".join(lines) + "\n")
    scan = scan_inputs([ScanTarget(0, log, (0,))], tmp_path / "s")
    coll = scan.coll.sort("i").collect()
    assert coll["i"].to_list() == list(range(1, 61))
    assert coll["count"].to_list() == [k + 1 for k in range(30)] * 2
    assert pl.read_parquet(scan.text_store).height == 0


def test_junk_glued_to_a_host_goes_to_the_reference_parser(tmp_path: Path) -> None:
    """A COLL line whose header token holds colour codes is re-read as text."""
    lines = [_coll(0), "\x1b[0m" + _coll(1), _coll(2)]
    log = tmp_path / "job.log"
    log.write_text("\n".join(lines) + "\n")
    scan = scan_inputs([ScanTarget(0, log, (0,))], tmp_path / "s")
    assert scan.bad == ["\x1b[0mnode-b:77:77"]
    assert scan.coll.collect()["i"].sort().to_list() == [1, 3]
    text = pl.read_parquet(scan.text_store)
    assert text.select("i", "text").rows() == [(2, lines[1])]


def test_vectorised_connection_lines_agree_with_reference() -> None:
    """The polars reader of connection lines gives the reference parser's records."""
    texts = [t for t in _fixture_lines() if " via " in t]
    texts.append("x\x1b[0mnode-a:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC")
    frame = pl.DataFrame(
        {"file_id": [0] * len(texts), "i": list(range(1, len(texts) + 1)), "text": texts},
        schema={"file_id": pl.UInt32, "i": pl.UInt32, "text": pl.String},
    )
    conns = connection_lines(frame.lazy())
    records = LineRecords()
    add_connection_lines(records, conns)
    assert records.connections == []  # all in the polars frame
    table = records.connection_table()
    assert table.height > 100
    for r in table.iter_rows(named=True):
        ref = parse_line(texts[r["line_no"] - 1])
        assert ref is not None
        assert ref.header is not None
        assert (ref.header.host, ref.header.pid) == (r["host"], r["pid"])
        conn = Connection(
            r["channel"], r["src"], r["dst"], r["direction"], r["transport"], r["via"]
        )
        assert ref.body == conn
    # the line with a colour code in front of the host is left to the reference parser
    assert len(texts) not in table["line_no"].to_list()


def test_info_messages_read_in_polars_give_the_reference_records() -> None:
    """Headers read in polars and messages by the families give what the whole
    reference parser gives, line for line, on every fixture line."""
    texts = _fixture_lines()
    texts += [
        "[default1]:[2025-03-14 09:00:00.1] node-a:4411:4412 [1] NCCL INFO comm 0x55d4f0 "
        "rank 3 nranks 8 cudaDev 1 busId 2000 commId 0xabc12 - Init COMPLETE",
        "x\x1b[0mnode-a:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 - Init START",
        "node-a:1:1 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x2 count 8 "
        "datatype 7 op 0 root 0 comm 0x3 [nranks=2] stream 0x4",
        "node-a:1:1 [0] NCCL INFO transport/net.cc:1286 -> 6",
    ]
    rows, frame = line_frame(texts)
    want = collect_records(rows)
    got = LineRecords()
    messages = info_messages(frame.lazy())
    done = add_info_messages(got, messages)
    assert done.height > 200  # most init lines of the fixtures
    rest = frame.join(done, on=["file_id", "i"], how="anti").sort("i")
    collect_records(rest.iter_rows(), out=got)
    got.comm_events.sort(key=lambda e: (e[0][0], e[1]))
    got.init_timings.sort(key=lambda e: (e[0][0], e[1]))
    assert len(want.init_timings) >= 8  # the fixtures' 2.23+ ``Init timings - ...`` lines
    for name in (
        "comm_events",
        "init_timings",
        "versions",
        "rank_hints",
        "colls",
        "env",
        "hosts",
        "networks",
        "procs",
        "unparsed",
        "parsed",
        "header_lines",
        "header_lines_with_ts",
    ):
        assert getattr(got, name) == getattr(want, name), name
    assert sorted(got.layouts, key=repr) == sorted(want.layouts, key=repr)
    assert [(g.proc, g.line_no, g.message, g.chain) for g in got.errors] == [
        (g.proc, g.line_no, g.message, g.chain) for g in want.errors
    ]


def line_frame(
    texts: list[str],
) -> tuple[list[tuple[int, int, int, str | None, int]], pl.DataFrame]:
    """Lines of one file as the reference parser takes them (``file_id``, line number,
    kind, text, bytes) and as the polars fast path's frame holds them."""
    rows: list[tuple[int, int, int, str | None, int]] = [
        (0, k + 1, 2, t, len(t)) for k, t in enumerate(texts)
    ]
    frame = pl.DataFrame(
        rows, schema=["file_id", "i", "kind", "text", "n_bytes"], orient="row"
    ).with_columns(pl.col("file_id", "i").cast(pl.UInt32))
    return rows, frame
