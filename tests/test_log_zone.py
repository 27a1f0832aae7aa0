"""NCCL prints the node's local time without a zone: the agent learns the job's clock
from when its lines arrive, ``analyze --log-tz`` reads the zone it is given, and every
time either exports is UTC."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import polars as pl
import pytest
from click.testing import CliRunner

from ncclscope.agent.run import Agent, AgentConfig
from ncclscope.cli import cli
from ncclscope.parsers.common import local_to_utc, parse_zone, read_as, to_dt

REPO = Path(__file__).resolve().parent.parent
STALLED = REPO / "fixtures" / "stalled-227-ts" / "job.log"
_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6})\] ")
#: UTC, New York (EDT in this job's March: -04:00) and Tokyo (+09:00)
ZONES = ["UTC", "America/New_York", "Asia/Tokyo"]


@dataclass(frozen=True)
class _Line:
    path: str
    text: str
    arrived: datetime


class _Node:
    """A job's lines as a node in ``zone`` writes them: each NCCL stamp in the zone's
    wall time, each line arriving 0.2 s after its (UTC) moment, polled by the clock."""

    def __init__(self, lines: list[str], zone: tzinfo, start: datetime) -> None:
        first = _first_time(lines)
        self.start = start
        self.lines: list[tuple[datetime, str]] = []
        last = start
        for text in lines:
            m = _STAMP.search(text)
            if m:
                printed = datetime.fromisoformat(m[1]).replace(tzinfo=UTC)
                last = start + (printed - first)
                local = last.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S.%f")
                text = f"{text[: m.start()]}[{local}] {text[m.end() :]}"
            self.lines.append((last + timedelta(seconds=0.2), text))
        self.now = start
        self.at = 0

    def poll(self) -> list[_Line]:
        out = []
        while self.at < len(self.lines) and self.lines[self.at][0] <= self.now:
            out.append(_Line("job.log", self.lines[self.at][1], self.now))
            self.at += 1
        return out


def _first_time(lines: list[str]) -> datetime:
    m = next(m for m in map(_STAMP.search, lines) if m)
    return datetime.fromisoformat(m[1]).replace(tzinfo=UTC)


def _run(
    lines: list[str], zone: str, *, rest_s: float, out: Path | None = None
) -> tuple[Agent, _Node]:
    start = datetime(2026, 3, 14, 13, 0, tzinfo=UTC)  # EDT in New York, as the job's date
    node = _Node(lines, ZoneInfo(zone), start)
    a = Agent(
        AgentConfig(interval_s=1.0, analyse_s=0.0, hostname="node-0", out=out),
        lines=node,
        wall=lambda: node.now,
    )
    end = node.lines[-1][0] + timedelta(seconds=rest_s)
    while node.now < end:
        node.now += timedelta(seconds=1)
        a.tick()
    a.finish()
    return a, node


def _job(a: Agent) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    return a.board.snapshot()


@pytest.fixture(scope="module")
def utc_left() -> float:
    """The countdown of the job run in UTC, 120 s after its last line (one run for every
    zone's test to match)."""
    lines = STALLED.read_text(encoding="utf-8").splitlines()
    reference, _ = _run(lines, "UTC", rest_s=120)
    left: float = reference.board.snapshot()["ncclscope_timeout_remaining_seconds"][0][1]
    return left


@pytest.mark.parametrize("zone", ZONES)
def test_a_hang_counts_down_alike_in_every_zone(zone: str, utc_left: float) -> None:
    lines = STALLED.read_text(encoding="utf-8").splitlines()
    a, _node = _run(lines, zone, rest_s=120)
    rows = _job(a)
    # 120 s after the last line (AllGather #30, rank 6 missing since ~09:00:09.45 of
    # the job's 10 s): about 120 s of the 30-minute timeout gone, whatever the zone.
    left = rows["ncclscope_timeout_remaining_seconds"]
    assert len(left) == 1
    assert left[0][1] == pytest.approx(utc_left, abs=1.0)
    assert 1800 - 125 < left[0][1] < 1800 - 115  # the job's Timeout(ms)=1800000
    culprit = rows["ncclscope_timeout_culprit_info"]
    assert [labels[1] for labels, _v in culprit] == ["6"]
    offset = dict(rows["ncclscope_log_utc_offset_seconds"])[()]
    want = {"UTC": 0.0, "America/New_York": -4 * 3600.0, "Asia/Tokyo": 9 * 3600.0}[zone]
    assert offset == want
    # The times exported are UTC: the node's ranks have waited ~120 s, and the first
    # collective's mark is the job's start (13:00 UTC), not hours away.
    waits = [v for _l, v in rows["ncclscope_node_collective_wait_seconds"]]
    assert waits
    assert all(115 < w < 135 for w in waits)
    marks = [v for _l, v in rows["ncclscope_node_collective_mark_timestamp_seconds"]]
    assert marks
    assert all(0 <= t - _node.start.timestamp() < 15 for t in marks)


@pytest.mark.parametrize("zone", ["America/New_York", "Asia/Tokyo"])
def test_a_healthy_job_in_another_zone_raises_nothing(zone: str) -> None:
    lines = STALLED.read_text(encoding="utf-8").splitlines()
    # The job without the collective it hung in: every rank's last is AllGather #29.
    healthy = [t for t in lines if "opCount 1e " not in t and "Watchdog" not in t]
    a, _node = _run(healthy, zone, rest_s=3)
    rows = _job(a)
    assert "ncclscope_timeout_remaining_seconds" not in rows
    assert "ncclscope_pending_collective_age_seconds" not in rows
    assert "ncclscope_timeout_culprit_info" not in rows
    waits = [v for _l, v in rows.get("ncclscope_node_collective_wait_seconds", [])]
    assert all(w < 10 for w in waits)


def test_a_line_hours_old_teaches_nothing() -> None:
    """A file's first poll may hold hours of history (--from-start): not a clock."""
    lines = STALLED.read_text(encoding="utf-8").splitlines()
    start = datetime(2026, 3, 14, 13, 0, tzinfo=UTC)
    node = _Node(lines, ZoneInfo("UTC"), start)
    node.now = node.lines[-1][0] + timedelta(hours=3)  # everything in one late poll
    a = Agent(AgentConfig(analyse_s=0.0, hostname="node-0"), lines=node, wall=lambda: node.now)
    a.tick()
    a.finish()
    assert a.progress.offset_s is None
    assert "ncclscope_log_utc_offset_seconds" not in a.board.snapshot()


def test_a_named_zone_is_read_with_its_daylight_saving_time() -> None:
    with read_as(parse_zone("America/New_York")):
        winter = to_dt("2026-01-15", "09:00:00", None)
        summer = to_dt("2026-07-15", "09:00:00", None)
    assert winter == datetime(2026, 1, 15, 14, tzinfo=UTC)
    assert summer == datetime(2026, 7, 15, 13, tzinfo=UTC)
    assert to_dt("2026-07-15", "09:00:00", None) == datetime(2026, 7, 15, 9, tzinfo=UTC)


def test_a_stamp_a_zone_moves_out_of_range_is_no_time() -> None:
    """A damaged date at datetime's edge, read in a zone, costs only itself."""
    with read_as(parse_zone("+09:00")):
        assert to_dt("0001-01-01", "00:00:00", None) is None
        assert to_dt("2025-03-14", "09:00:00", None) == datetime(2025, 3, 14, tzinfo=UTC)
    with read_as(parse_zone("-05:00")):
        assert to_dt("9999-12-31", "23:59:59", None) is None
    # The vectorised readers alike (NCCL's stamp, PyTorch's and DeepSpeed's prefixes).
    edge = [datetime(1, 1, 1, tzinfo=UTC), datetime(2025, 3, 14, 9, tzinfo=UTC)]
    micros = pl.Series([int((t - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))
                        for t in edge])  # fmt: skip
    for zone in ("Asia/Tokyo", "+09:00"):
        with read_as(parse_zone(zone)):
            got = pl.DataFrame({"m": micros}).select(local_to_utc(pl.col("m")))["m"].to_list()
        assert got == [None, datetime(2025, 3, 14, 0, tzinfo=UTC)]


def test_a_zone_that_is_none_says_what_to_give() -> None:
    with pytest.raises(ValueError, match="IANA name"):
        parse_zone("Mars/Olympus")
    with pytest.raises(ValueError, match="18 hours"):
        parse_zone("+19:00")


def test_analyze_reads_the_zone_it_is_given() -> None:
    as_utc = _analyze(str(STALLED))
    tokyo = _analyze(str(STALLED), "--log-tz", "Asia/Tokyo")
    assert as_utc["job"]["log_zone"] == "UTC"
    assert as_utc["job"]["log_zone_source"] == "assumed"
    assert tokyo["job"]["log_zone"] == "Asia/Tokyo"
    assert tokyo["job"]["log_zone_source"] == "given"
    assert _since(as_utc) - _since(tokyo) == timedelta(hours=9)


def _analyze(*args: str) -> dict[str, Any]:
    """``ncclscope analyze --format json ARGS`` (in this process: a new one per run would
    only add its start)."""
    out = CliRunner().invoke(cli, ["analyze", "--format", "json", "--no-progress", *args])
    assert out.exit_code == 0, (out.output, out.exception)
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def _since(doc: dict[str, Any]) -> datetime:
    found = next(f for f in doc["findings"] if f["kind"] == "timeout_imminent")
    return datetime.fromisoformat(found["evidence"]["since"])


def test_analyze_reads_the_zone_the_agent_learned(tmp_path: Path) -> None:
    """The agent keeps the offset it learned with its telemetry; analyze --telemetry
    reads the same logs in it, where nothing else says the zone."""
    lines = STALLED.read_text(encoding="utf-8").splitlines()
    written = {}
    for zone in ("UTC", "Asia/Tokyo"):
        tel = tmp_path / f"telemetry-{zone.replace('/', '-')}"
        _agent, node = _run(lines, zone, rest_s=5, out=tel)
        log = tmp_path / f"job-{zone.replace('/', '-')}.log"
        log.write_text("".join(f"{text}\n" for _t, text in node.lines), encoding="utf-8")
        written[zone] = (log, tel)
    log, tel = written["Asia/Tokyo"]
    tokyo = _analyze(str(log), "--telemetry", str(tel))
    assert tokyo["job"]["log_zone"] == "+09:00"
    assert tokyo["job"]["log_zone_source"] == "telemetry"
    plain = _analyze(str(log))  # the same lines, nothing said: read as UTC, 9 h off
    utc = _analyze(str(written["UTC"][0]))
    assert _since(tokyo) == _since(utc)
    assert _since(plain) - _since(utc) == timedelta(hours=9)


# -- analyze learns the zone from a clock in the logs that names its own ------------


def _collected(node: _Node, prefix: Any) -> str:
    """The node's lines as a collector kept them: each behind its arrival stamp."""
    return "".join(f"{prefix(arrived)}{text}\n" for arrived, text in node.lines)


def _kubectl(arrived: datetime) -> str:  # kubectl logs --timestamps: RFC 3339, UTC
    return f"{arrived:%Y-%m-%dT%H:%M:%S.%f}123Z "


def _journal(zone: str) -> Any:  # journalctl -o short-iso: the node's zone, +hhmm
    return lambda at: f"{at.astimezone(ZoneInfo(zone)):%Y-%m-%dT%H:%M:%S%z} node-0 python[41]: "


@pytest.mark.parametrize(
    ("zone", "prefix", "named"),
    [
        ("Asia/Tokyo", _kubectl, "+09:00"),
        ("America/New_York", _kubectl, "-04:00"),
        ("UTC", _kubectl, "UTC"),
        ("Asia/Kathmandu", _journal("Asia/Kathmandu"), "+05:45"),
    ],
)
def test_analyze_learns_the_zone_from_stamps_that_name_theirs(
    tmp_path: Path, zone: str, prefix: Any, named: str
) -> None:
    lines = STALLED.read_text(encoding="utf-8").splitlines()
    start = datetime(2026, 3, 14, 13, 0, tzinfo=UTC)
    log = tmp_path / "job.log"
    log.write_text(_collected(_Node(lines, ZoneInfo(zone), start), prefix), encoding="utf-8")
    bare = tmp_path / "utc.log"
    bare.write_text("".join(f"{t}\n" for _a, t in _Node(lines, UTC, start).lines))
    doc = _analyze(str(log))
    assert doc["job"]["log_zone"] == named
    assert doc["job"]["log_zone_source"] == "learned"
    assert "learned from" in doc["job"]["log_zone_evidence"]
    assert _since(doc) == _since(_analyze(str(bare)))
    # What the user names wins over what the logs suggest.
    given = _analyze(str(log), "--log-tz", "UTC")
    assert given["job"]["log_zone_source"] == "given"


def test_a_logger_that_prints_its_zone_teaches_the_lines_beside_it(tmp_path: Path) -> None:
    """Python logging with %z on its own lines, NCCL's local stamps on the others."""
    lines = STALLED.read_text(encoding="utf-8").splitlines()
    node = _Node(lines, ZoneInfo("Asia/Tokyo"), datetime(2026, 3, 14, 13, 0, tzinfo=UTC))
    out = []
    for k, (arrived, text) in enumerate(node.lines):
        if k % 50 == 0:
            local = arrived.astimezone(ZoneInfo("Asia/Tokyo"))
            out.append(f"{local:%Y-%m-%d %H:%M:%S},{local.microsecond // 1000:03d}"
                       f"{local:%z} INFO train.py: step {k}")  # fmt: skip
        out.append(text)
    log = tmp_path / "job.log"
    log.write_text("\n".join(out) + "\n", encoding="utf-8")
    doc = _analyze(str(log))
    assert (doc["job"]["log_zone"], doc["job"]["log_zone_source"]) == ("+09:00", "learned")


def test_clocks_that_disagree_or_are_quoted_teach_nothing(tmp_path: Path) -> None:
    from ncclscope.parsers.zone import decide, offset_votes

    # A message that quotes a UTC time is no clock of its line.
    quoted = ["[2025-03-14 09:00:00.100000] n:1:1 [0] NCCL INFO saved checkpoint "
              "stamped 2025-03-14T00:00:00Z"] * 10  # fmt: skip
    assert offset_votes(quoted) == {}
    # Two lines minutes apart are two moments; a lag past 2 minutes is no vote.
    assert offset_votes(["2025-03-14T00:05:00Z x", "[2025-03-14 09:00:00.1] y"]) == {}
    assert offset_votes(["2025-03-14T00:01:00Z x", "[2025-03-14 09:00:00.1] y"]) == {9 * 3600: 1}
    # Fewer than three pairs, or pairs that disagree, decide nothing.
    assert decide(offset_votes(["2025-03-14T00:00:00Z [2025-03-14 09:00:00.0] a"])).zone is None
    split = decide(offset_votes(
        ["2025-03-14T00:00:00Z [2025-03-14 09:00:00.0] a"] * 3
        + ["2025-03-14T00:00:00Z [2025-03-14 02:00:00.0] b"] * 3
    ))  # fmt: skip
    assert split.zone is None
    assert "do not agree" in split.evidence
    log = tmp_path / "split.log"
    log.write_text(
        "".join(f"2025-03-14T00:00:0{k}Z [2025-03-14 0{9 if k % 2 else 2}:00:0{k}.0] "
                f"n:1:1 [0] NCCL INFO Init COMPLETE\n" for k in range(8)),
        encoding="utf-8",
    )  # fmt: skip
    doc = _analyze(str(log))
    assert doc["job"]["log_zone_source"] == "assumed"
    assert "do not agree" in doc["job"]["log_zone_evidence"]


# -- NCCL without stamps: the window's arrivals stay UTC, the frameworks' are local ---

OFFLOAD = REPO / "fixtures" / "zero3-offload-hang" / "train.log"


def test_a_stamped_window_reads_nccl_as_utc_and_the_rest_in_the_zone(tmp_path: Path) -> None:
    from ncclscope.agent.live import stamp
    from ncclscope.analysis import build

    arrived = datetime(2026, 3, 14, 13, 0, tzinfo=UTC)
    window = tmp_path / "window.log"
    window.write_text(
        "".join(f"{stamp(t, arrived) or t}\n" for t in OFFLOAD.read_text().splitlines()),
        encoding="utf-8",
    )

    def tables(zone: str | None) -> tuple[set[datetime], list[datetime]]:
        built = build(
            [str(window)],
            workdir=tmp_path / f"w-{zone}",
            coll_ts_source="stamped",
            log_zone=parse_zone(zone) if zone else None,
        )
        assert built.analysis.collectives is not None
        colls = set(built.analysis.collectives.select("ts").collect()["ts"].drop_nulls())
        return colls, built.analysis.frameworks.timers["ts"].drop_nulls().to_list()

    colls_utc, timers_utc = tables(None)
    colls_tokyo, timers_tokyo = tables("+09:00")
    assert colls_utc == colls_tokyo == {arrived}
    assert timers_utc
    assert [t - timedelta(hours=9) for t in timers_utc] == timers_tokyo


_DEEPSPEED = "[{:%Y-%m-%d %H:%M:%S},123] [INFO] [logging.py:96:log_dist] [Rank 0] step={}"
#: PyTorch's C++ logger: no year, and the month not zero-padded
_GLOG = "[rank0]:[I{0.month}{0:%d %H:%M:%S}.123456 41 ProcessGroupNCCL.cpp:607] step {1}"


@pytest.mark.parametrize("logger", [_DEEPSPEED, _GLOG], ids=["deepspeed", "glog"])
def test_the_agent_learns_the_clock_from_framework_stamps_where_nccl_prints_none(
    logger: str,
) -> None:
    from ncclscope.agent.progress import LiveProgress

    p = LiveProgress()
    start = datetime(2026, 3, 14, 13, 0, tzinfo=UTC)
    tokyo = ZoneInfo("Asia/Tokyo")
    for k in range(3):
        arrived = start + timedelta(seconds=k)
        local = (arrived - timedelta(seconds=0.3)).astimezone(tokyo)
        texts = [
            logger.format(local, k),
            "node-0:41:41 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x2 "
            "count 4 datatype 7 op 0 root 0 comm 0x55 [nranks=2] stream 0x5",
        ]
        p.add_texts([("job.log", texts, arrived)], own_times=False)
        # The first poll may be history; two polls must agree.
        assert p.offset_s == (None if k < 2 else 9 * 3600.0)
    # The members' times are their arrivals, UTC already.
    assert p.utc(start) == start
