"""Benchmark features of the synthetic job generator: era 2.26, host clock offsets, one-off
delays, several slow ranks, ExtraCollective and DeadProcess.

Every check reads the written lines with regexes written from shared/formats/nccl.md and
deepspeed-torch.md, and compares them with truth.json; never with ncclscope's parsers.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ncclscope.synth import (
    DeadProcess,
    ExtraCollective,
    IbError,
    SlowRank,
    StopRank,
    SynthSpec,
    Truth,
    generate,
)
from ncclscope.synth import cli as synth_cli
from ncclscope.synth.eras import _ERA_FORMATS

# --- nccl.md §1.2 / §3.6 --------------------------------------------------------------
NCCL_TS = r"(?:\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.(?P<frac>\d{1,9}))?\] )?"
PREFIX = r"(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) "
INFO_RE = re.compile(NCCL_TS + PREFIX + r"\[(?P<dev>-?\d+)\] NCCL INFO (?P<msg>.*)$")
WARN_RE = re.compile(
    NCCL_TS + PREFIX + r"\[(?P<dev>-?\d+)\] (?P<src>[^\s:]+):(?P<line>\d+)"
    r"(?: \((?P<func>[^)]*)\))? NCCL WARN (?P<msg>.*)$"
)
COLL_RE = re.compile(
    r"^(?P<op>\w+): opCount (?P<opcount>[0-9a-f]+) sendbuff (?P<sendbuff>\S+) "
    r"recvbuff (?P<recvbuff>\S+) count (?P<count>\d+) datatype (?P<dtype>\d+) "
    r"op (?P<redop>\d+) root (?P<root>\d+) comm (?P<comm>\S+) \[nranks=(?P<nranks>\d+)\] "
    r"stream (?P<stream>\S+)"
)

SMALL: dict[str, Any] = {"ranks": 8, "hosts": 2, "steps": 2, "layers": 2}


# --- helpers --------------------------------------------------------------------------


def _lines(path: Path) -> list[str]:
    # Split on '\n' only: tqdm lines carry '\r', which universal newlines would split.
    return path.read_bytes().decode("utf-8").split("\n")[:-1]


def _gen(tmp_path: Path, name: str = "job", **kw: Any) -> tuple[Path, Truth, dict[str, Any]]:
    out = tmp_path / name
    truth = generate(SynthSpec(**kw), out)
    doc: dict[str, Any] = json.loads((out / "truth.json").read_text())
    return out, truth, doc


def _epoch(day_time: str, frac: str | None) -> float:
    """POSIX seconds of a printed NCCL time (UTC, as synth prints it)."""
    dt = datetime.strptime(day_time, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    return dt.timestamp() + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _colls(out: Path, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every COLL line of every file, with its global rank and communicator (via truth)."""
    rank_of = {(r["host"], r["pid"]): r["rank"] for r in doc["ranks"]}
    comm_of = {
        (int(rank), ptr): c["name"]
        for c in doc["communicators"]
        for rank, ptr in c["comm_ptrs"].items()
    }
    recs = []
    for f in doc["files"]:
        for no, line in enumerate(_lines(out / f["path"]), 1):
            m = INFO_RE.search(line)
            c = COLL_RE.match(m["msg"]) if m else None
            if not (m and c):
                continue
            rank = rank_of[(m["host"], int(m["pid"]))]
            recs.append(
                {
                    "path": f["path"],
                    "line_no": no,
                    "rank": rank,
                    "host": m["host"],
                    "comm": comm_of[(rank, c["comm"])],
                    "op": c["op"],
                    "opcount": int(c["opcount"], 16),
                    "count": int(c["count"]),
                    "dtype": int(c["dtype"]),
                    "ts": m["ts"],
                    "frac": m["frac"],
                }
            )
    return recs


def _info_msgs(out: Path, doc: dict[str, Any]) -> list[str]:
    return [
        m["msg"] for f in doc["files"] for x in _lines(out / f["path"]) if (m := INFO_RE.search(x))
    ]


# --- era 2.26 -------------------------------------------------------------------------


def test_era_226_line_formats(tmp_path: Path) -> None:
    out, truth, doc = _gen(tmp_path, era="2.26", tp_traffic=True, **SMALL)
    assert truth.nccl_version == "2.26.2"
    msgs = _info_msgs(out, doc)
    text = "\n".join(msgs)
    assert "NCCL version 2.26.2+cuda12.8" in msgs  # 2.23+: an INFO line
    # As real 2.25.1/2.26.2 logs print it (nccl.md's table has "Bootstrap : Using" to 2.26).
    assert any(re.match(r"^Bootstrap: Using eth0:[\d.]+<0>$", m) for m in msgs)
    assert "NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin." in msgs
    assert "Initialized NET plugin" not in text  # 2.27+
    assert "Assigned NET plugin" not in text  # 2.27+
    assert re.search(
        r"^ncclCommInitRankConfig comm 0x[0-9a-f]+ rank \d+ .* - Init START$", text, re.M
    )
    assert re.search(r"^Init timings - ncclCommInitRank: rank \d+ nranks 4 total ", text, re.M)
    assert "via NET/IB/0/GDRDMA(PCI)" in text  # 2.26+
    assert "Connected all rings, use ring PXN 0 GDR 1" in msgs  # 2.24+
    assert "RAS client listening socket at 127.0.0.1<28028>" in msgs  # 2.24+
    # opCount counts on single-node communicators too (2.27 prints 0 there).
    host_calls = [c for c in _colls(out, doc) if c["comm"] == "host0" and c["rank"] == 0]
    assert [c["opcount"] for c in host_calls] == list(range(len(host_calls)))
    assert len(host_calls) == SMALL["steps"] * 2 * SMALL["layers"]
    host0 = next(c for c in doc["communicators"] if c["name"] == "host0")
    assert host0["opcount_printed"] == "seq"


def test_era_226_warn_default_timestamp(tmp_path: Path) -> None:
    out, _, _ = _gen(tmp_path, era="2.26", benign_warns=2, **SMALL)
    warns = [m for x in _lines(out / "job.log") if (m := WARN_RE.search(x))]
    assert len(warns) == 2
    # NCCL_DEBUG_TIMESTAMP_FORMAT's default "[%F %T] ": no sub-second part, so no bug either.
    assert all(m["ts"] and m["frac"] is None for m in warns)


def test_era_226_subsecond_digits_follow_the_bug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same 2.26 job written twice, once with the bug switched off: same draws, same
    # instants, so the fixed job's microseconds show what 2.26 should have printed.
    kw = {**SMALL, "steps": 6, "era": "2.26", "timestamps": True, "seed": 11}
    out6, _, doc6 = _gen(tmp_path, "bug", **kw)
    fixed = dataclasses.replace(_ERA_FORMATS["2.26"], subsec_bug=False)
    monkeypatch.setitem(_ERA_FORMATS, "2.26", fixed)
    out7, _, doc7 = _gen(tmp_path, "fixed", **kw)
    w6 = _colls(out6, doc6)
    w7 = _colls(out7, doc7)
    assert [(c["rank"], c["opcount"]) for c in w6] == [(c["rank"], c["opcount"]) for c in w7]
    right = wrong = 0
    for c6, c7 in zip(w6, w7, strict=True):
        assert c6["ts"] == c7["ts"]  # the seconds are printed right
        assert len(c6["frac"]) == len(c7["frac"]) == 6
        us = int(c7["frac"])
        if us >= 100_000:  # a 9-digit nanosecond count: its first six digits are the us
            assert c6["frac"] == c7["frac"]
            right += 1
        else:  # fewer digits: 2.26 prints the leading digits of the us, then nanoseconds
            assert c6["frac"] != c7["frac"]
            if us:
                assert c6["frac"].startswith(str(us))
            wrong += 1
    # About one line in ten falls in the first 0.1 s of a second.
    assert right
    assert wrong


def test_timestamps_need_era_226_or_later() -> None:
    SynthSpec(era="2.26", timestamps=True)
    with pytest.raises(ValueError, match=r"era >= 2\.26"):
        SynthSpec(era="2.21", timestamps=True)


# --- host clock offsets ---------------------------------------------------------------

# Any printed time of day: NCCL "[%F %T.%6f]", DeepSpeed "[%F %T,mmm]", c10 glog
# "E314 09:41:52.117183842", torchelastic "E0314 09:41:52.117000".
CLOCK_RE = re.compile(r"(?<!\d)(\d\d):(\d\d):(\d\d)[.,](\d+)")
CHILD_TIME_RE = re.compile(r"^(?P<head>.*  time      : \d{4}-\d\d-\d\d_)(\d\d):(\d\d):(\d\d)$")


def _clocks(line: str) -> tuple[str, list[float]]:
    """The line with its times of day cut out, and those times (seconds since midnight)."""
    times = [
        int(h) * 3600 + int(m) * 60 + int(s) + int(f) / 10 ** len(f)
        for h, m, s, f in CLOCK_RE.findall(line)
    ]
    if c := CHILD_TIME_RE.match(line):
        times.append(int(c[2]) * 3600 + int(c[3]) * 60 + int(c[4]))
        line = c["head"]
    return CLOCK_RE.sub("T", line), times


@pytest.mark.parametrize("framework", ["none", "deepspeed", "torch"])
def test_clock_offsets_shift_printed_times_only(tmp_path: Path, framework: str) -> None:
    kw: dict[str, Any] = {
        **SMALL,
        "hosts": 4,
        "steps": 3,
        "timestamps": True,
        "launcher": "pdsh",  # every line, agents' included, says which host printed it
        "seed": 3,
        "benign_warns": 2,
        "faults": (StopRank(5, 9),) if framework != "none" else (),
    }
    if framework != "none":
        kw["framework"] = framework
    plain, _, p_doc = _gen(tmp_path, "plain", **kw)
    off, truth, o_doc = _gen(tmp_path, "off", clock_offset_max_s=0.2, **kw)
    assert o_doc["spec"]["clock_offset_max_s"] == 0.2
    assert "clock_offset_max_s" not in p_doc["spec"]
    assert "clock_offsets" not in p_doc
    offsets = o_doc["clock_offsets"]
    assert [o["host_index"] for o in offsets] == [0, 1, 2, 3]
    assert [o["host"] for o in offsets] == [f"node-{h}" for h in range(4)]
    assert all(-0.2 <= o["offset_s"] <= 0.2 for o in offsets)
    assert len({o["offset_s"] for o in offsets}) == 4
    shift = {o["host"]: o["offset_s"] for o in offsets}
    a_lines = _lines(plain / "job.log")
    b_lines = _lines(off / "job.log")
    assert len(a_lines) == len(b_lines)  # the same lines, in the same (true) order
    seen: set[str] = set()
    n_times = 0
    for a, b in zip(a_lines, b_lines, strict=True):
        a_text, a_times = _clocks(a)
        b_text, b_times = _clocks(b)
        assert a_text == b_text
        assert len(a_times) == len(b_times)
        if not a_times:
            continue
        host = a.split(": ", 1)[0]
        seen.add(host)
        for ta, tb in zip(a_times, b_times, strict=True):
            n_times += 1
            m = INFO_RE.search(a) or WARN_RE.search(a)
            if m and m["frac"]:  # NCCL's own microseconds: exact
                assert abs(tb - ta - shift[host]) <= 1.01e-6
            elif CHILD_TIME_RE.match(a):  # whole seconds
                assert abs(tb - ta - shift[host]) < 1.0
            else:  # milliseconds
                assert abs(tb - ta - shift[host]) <= 1.01e-3
    assert seen == set(shift)
    assert n_times > 100
    # truth.json keeps true times.
    assert o_doc["first_ts"] == p_doc["first_ts"]
    assert o_doc["last_ts"] == p_doc["last_ts"]
    assert truth.clock_offsets == offsets


def test_clock_offsets_per_rank_files(tmp_path: Path) -> None:
    kw: dict[str, Any] = {**SMALL, "layout": "per-rank", "timestamps": True}
    plain, _, doc = _gen(tmp_path, "plain", **kw)
    off, _, o_doc = _gen(tmp_path, "off", clock_offset_max_s=0.001, **kw)
    shift = {o["host"]: o["offset_s"] for o in o_doc["clock_offsets"]}
    assert all(0 < abs(v) <= 0.001 for v in shift.values())
    for f in doc["files"]:
        for a, b in zip(_lines(plain / f["path"]), _lines(off / f["path"]), strict=True):
            ma, mb = INFO_RE.search(a), INFO_RE.search(b)
            if not ma:
                assert a == b
                continue
            assert mb
            assert ma["msg"] == mb["msg"]
            ta = _epoch(ma["ts"], ma["frac"])
            tb = _epoch(mb["ts"], mb["frac"])
            assert abs(tb - ta - shift[ma["host"]]) <= 1.01e-6


def test_clock_offset_validation() -> None:
    with pytest.raises(ValueError, match="clock_offset_max_s"):
        SynthSpec(clock_offset_max_s=-0.001)
    with pytest.raises(ValueError, match="clock_offset_max_s"):
        SynthSpec(clock_offset_max_s=float("nan"))


# --- one-off delays (jitter_events) --------------------------------------------------


def _world_times(out: Path, doc: dict[str, Any]) -> dict[tuple[int, int], float]:
    """(rank, opCount) -> printed time of every world COLL line."""
    return {
        (c["rank"], c["opcount"]): _epoch(c["ts"], c["frac"])
        for c in _colls(out, doc)
        if c["comm"] == "world"
    }


@pytest.mark.parametrize("slow", [(), (SlowRank(2, 0.02),)])
def test_delays_hold_everyone_up(tmp_path: Path, slow: tuple[SlowRank, ...]) -> None:
    kw: dict[str, Any] = {
        **SMALL,
        "steps": 4,
        "timestamps": True,
        "layout": "per-rank",
        "seed": 8,
        "faults": slow,
    }
    plain, _, p_doc = _gen(tmp_path, "plain", **kw)
    jit, truth, doc = _gen(tmp_path, "jit", jitter_events=6, **kw)
    assert doc["spec"]["jitter_events"] == 6
    assert "jitter_events" not in p_doc["spec"]
    assert "noise" not in p_doc
    events = doc["noise"]
    assert truth.noise == events
    assert len(events) == 6
    assert len({(e["instance"], e["rank"]) for e in events}) == 6
    wps = 3 * SMALL["layers"] + 1
    late = {f.rank: f.lateness_s for f in slow}
    max_late = max(late.values(), default=0.0)
    push: dict[int, float] = {}  # world instance -> how much later everything after starts
    delay: dict[tuple[int, int], float] = {}
    for e in events:
        assert e["kind"] == "delay"
        assert 0.005 <= e["delay_s"] <= 0.05
        assert 0 <= e["instance"] < 4 * wps
        assert e["step"] == e["instance"] // wps
        assert e["host"] == doc["ranks"][e["rank"]]["host"]
        assert e["pid"] == doc["ranks"][e["rank"]]["pid"]
        delay[(e["rank"], e["instance"])] = e["delay_s"]
        extra = late.get(e["rank"], 0.0) + e["delay_s"] - max_late
        push[e["instance"]] = max(push.get(e["instance"], 0.0), extra)
    a = _world_times(plain, p_doc)
    b = _world_times(jit, doc)
    assert a.keys() == b.keys()
    for (rank, k), ta in a.items():
        want = sum(p for i, p in push.items() if i < k) + delay.get((rank, k), 0.0)
        assert abs(b[(rank, k)] - ta - want) <= 2.1e-6
    # The delayed rank logged the op truth names, at that instance.
    ops = {(c["rank"], c["opcount"]): c for c in _colls(jit, doc) if c["comm"] == "world"}
    for e in events:
        c = ops[(e["rank"], e["instance"])]
        assert (c["op"], c["count"]) == (e["op"], e["count"])
    # Not faults: the faults list only has what the spec asked for.
    assert [f["kind"] for f in doc["faults"]] == ["SlowRank"] * len(slow)


def test_delayed_rank_is_last_in_the_combined_log(tmp_path: Path) -> None:
    out, _, doc = _gen(tmp_path, jitter_events=5, seed=4, **{**SMALL, "steps": 4})
    by_instance: dict[int, list[int]] = {}
    for e in doc["noise"]:
        by_instance.setdefault(e["instance"], []).append(e["rank"])
    order: dict[int, list[int]] = {}
    for c in _colls(out, doc):
        if c["comm"] == "world":
            order.setdefault(c["opcount"], []).append(c["rank"])
    for k, ranks in by_instance.items():
        # A delay of >= 5 ms beats the 2 ms enqueue jitter: the delayed ranks come last.
        assert set(order[k][-len(ranks) :]) == set(ranks)


def test_delays_grow_the_deepspeed_timers(tmp_path: Path) -> None:
    kw: dict[str, Any] = {**SMALL, "steps": 4, "seed": 6, "framework": "deepspeed"}
    plain, _, _ = _gen(tmp_path, "plain", **kw)
    jit, _, doc = _gen(tmp_path, "jit", jitter_events=4, **kw)
    names = ("fwd_microstep", "bwd_inner_microstep", "step_microstep")

    def timers(out: Path) -> list[dict[str, float]]:
        rows = []
        for x in _lines(out / "job.log"):
            if "time (ms) | fwd_microstep:" in x:
                pairs = re.findall(r"\| (\w+): (-?\d+\.\d+)", x)
                rows.append({k: float(v) for k, v in pairs})
        return rows

    a, b = timers(plain), timers(jit)
    assert len(a) == len(b) == 4
    # No stragglers: each instance is held up by its longest delay.
    push: dict[tuple[int, int], float] = {}  # (step, instance) -> delay
    for e in doc["noise"]:
        key = (e["step"], e["instance"])
        push[key] = max(push.get(key, 0.0), e["delay_s"])
    per_step: dict[int, float] = {}
    for (step, _), delay in push.items():
        per_step[step] = per_step.get(step, 0.0) + delay
    for step, (ra, rb) in enumerate(zip(a, b, strict=True)):
        grown = sum(rb[n] - ra[n] for n in names)
        want = per_step.get(step, 0.0) * 1000.0
        assert want * 0.97 - 0.03 <= grown <= want * 1.03 + 0.03


def test_jitter_validation() -> None:
    with pytest.raises(ValueError, match="jitter_events must be >= 0"):
        SynthSpec(jitter_events=-1)
    with pytest.raises(ValueError, match="not target_size_bytes"):
        SynthSpec(jitter_events=1, target_size_bytes=10_000)
    with pytest.raises(ValueError, match="exceeds"):
        SynthSpec(ranks=2, hosts=1, steps=1, layers=1, jitter_events=9)
    # Drawn before the terminal fault: StopRank at instance 2 leaves 2 x 2 pairs.
    SynthSpec(ranks=2, hosts=1, steps=1, layers=1, jitter_events=4, faults=(StopRank(0, 2),))
    with pytest.raises(ValueError, match="exceeds"):
        SynthSpec(ranks=2, hosts=1, steps=1, layers=1, jitter_events=5, faults=(StopRank(0, 2),))


# --- several slow ranks, slowdown ----------------------------------------------------


@pytest.mark.parametrize(
    "slow",
    [
        (SlowRank(3, 0.03),),
        (SlowRank(1, 0.01), SlowRank(6, 0.04)),
        (SlowRank(1, 0.01), SlowRank(4, 0.02), SlowRank(6, 0.04)),
    ],
)
def test_several_slow_ranks(tmp_path: Path, slow: tuple[SlowRank, ...]) -> None:
    kw: dict[str, Any] = {**SMALL, "steps": 4, "timestamps": True, "seed": 2, "faults": slow}
    out, _, doc = _gen(tmp_path, truth_format=2, **kw)
    assert doc["format_version"] == 2
    assert doc["spec"]["truth_format"] == 2
    n_prog = 3 * SMALL["layers"] + 1
    max_late = max(f.lateness_s for f in slow)
    gap = 0.5 / n_prog + max_late  # no tp_traffic: consecutive world collectives are slots
    times: dict[int, dict[int, float]] = {}  # instance -> rank -> printed enqueue time
    for c in _colls(out, doc):
        times.setdefault(c["opcount"], {})[c["rank"]] = _epoch(c["ts"], c["frac"])
    assert len(times) == 4 * n_prog
    slow_ranks = {f.rank for f in slow}
    starts = [
        min(t for r, t in per.items() if r not in slow_ranks) for _, per in sorted(times.items())
    ]
    gaps = sorted(b - a for a, b in itertools.pairwise(starts))
    measured_gap = gaps[len(gaps) // 2]
    assert abs(measured_gap - gap) < 0.0021  # the others' 2 ms enqueue jitter
    outcomes = [o for o in doc["faults"] if o["kind"] == "SlowRank"]
    assert [o["details"]["rank"] for o in outcomes] == [f.rank for f in slow]
    for f, o in zip(slow, outcomes, strict=True):
        d = o["details"]
        assert o["effective"]
        assert d["lateness_s"] == f.lateness_s
        assert d["median_world_gap_s"] == pytest.approx(gap, abs=1e-9)
        assert d["slowdown"] == pytest.approx(f.lateness_s / gap, rel=1e-9)
        # What the lines show: this rank's enqueue minus the earliest of the others'.
        late = sorted(per[f.rank] - min(per.values()) for per in times.values())
        assert abs(late[len(late) // 2] - f.lateness_s) < 0.0021
        assert abs(late[len(late) // 2] / measured_gap - d["slowdown"]) < 0.05


def test_truth_format_1_keeps_the_old_slow_rank_record(tmp_path: Path) -> None:
    _, _, doc = _gen(tmp_path, faults=(SlowRank(1, 0.01), SlowRank(2, 0.02)), **SMALL)
    assert doc["format_version"] == 1
    assert "truth_format" not in doc["spec"]
    for o in doc["faults"]:
        assert set(o["details"]) == {"rank", "host", "pid", "lateness_s", "visible_in_timestamps"}
    assert "clock_offsets" not in doc
    assert "noise" not in doc


def test_truth_format_2_always_has_the_benchmark_keys(tmp_path: Path) -> None:
    _, truth, doc = _gen(tmp_path, truth_format=2, **SMALL)
    assert doc["noise"] == []
    assert doc["clock_offsets"] == [
        {"host_index": h, "host": f"node-{h}", "offset_s": 0.0} for h in range(2)
    ]
    assert truth.format_version == 2
    with pytest.raises(ValueError, match="truth_format"):
        SynthSpec(truth_format=3)


# --- deepspeed-torch.md T2, T4, T6 ----------------------------------------------------
WD = re.compile(
    r"\[Rank (?P<rank>\d+)\] Watchdog caught collective operation timeout: "
    r"WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)(?:, NumelIn=(?P<nin>-?\d+), "
    r"NumelOut=(?P<nout>-?\d+))?, Timeout\(ms\)=(?P<timeout_ms>\d+)\) ran for\s+(?P<ran_ms>\d+)\s+"
    r"milliseconds before timing out\."
)
EXC_DET = re.compile(
    r"\[PG 0 \(default_pg\) Rank (?P<rank>\d+)\] Exception \(either an error or timeout\) "
    r"detected by watchdog at work: (?P<seq>\d+), last enqueued NCCL work: (?P<enq>-?\d+), "
    r"last completed NCCL work: (?P<comp>-?\d+)\."
)
WD_TERM = re.compile(r"(?:NCCL|Process group) watchdog thread terminated with exception: ")
DESYNC_TO = re.compile(r"- \[(?P<rank>\d+)\] Timeout at collective: (?P<op>\w+), #(?P<seq>\d+)")
DESYNC_LAG = re.compile(r"\[(?P<ranks>[\d, ]+)\] joined but didn't finish collective #(?P<s>\d+)")
RANKPFX = re.compile(r"^\[rank(?P<grank>\d+)\]:")
EL_FAILED = re.compile(
    r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<lr>\d+) \(pid: (?P<pid>\d+)\) "
    r"of binary: (?P<bin>\S+)"
)
EL_RANK = re.compile(r"^\s+rank\s+: (?P<rank>\d+) \(local_rank: (?P<lr>\d+)\)")
EL_EXIT = re.compile(r"^\s+exitcode\s+: (?P<code>-?\d+) \(pid: (?P<pid>\d+)\)")
SIGTERM = re.compile(r"Sending process (?P<pid>\d+) closing signal SIGTERM")
PYGLOG = re.compile(
    r"^(?P<sev>[IWEF])(?P<mmdd>\d{3,4}) (?P<time>\d{2}:\d{2}:\d{2}\.\d+) (?P<pid>\d+) "
    r"(?P<src>[\w./-]+\.py):(?P<line>\d+)\] (?P<msg>.*)$"
)
AGENT_OLD = re.compile(
    r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(?P<ms>\d{3})\] "
    r"torch\.distributed\.elastic\.multiprocessing\.api: \[(?P<lvl>[A-Z]+)\] (?P<msg>.*)$"
)


# --- ExtraCollective -----------------------------------------------------------------


@pytest.mark.parametrize(("layout", "launcher"), [("combined", "torchrun"), ("per-rank", "none")])
def test_extra_collective_lines(tmp_path: Path, layout: str, launcher: str) -> None:
    rank, at = 3, 9  # instance 9 = step 1's third world collective: an AllGather
    out, truth, doc = _gen(
        tmp_path,
        layout=layout,
        launcher=launcher,
        timestamps=True,
        faults=(ExtraCollective(rank, at),),
        **{**SMALL, "steps": 3},
    )
    assert truth.end_reason == "hang"
    colls = [c for c in _colls(out, doc) if c["comm"] == "world"]
    mine = [c for c in colls if c["rank"] == rank]
    others = [c for c in colls if c["rank"] != rank]
    # The others logged instance `at` (their real call) and nothing after it.
    assert max(c["opcount"] for c in others) == at
    real = {(c["op"], c["count"], c["dtype"]) for c in others if c["opcount"] == at}
    assert len(real) == 1
    (op, count, dtype) = real.pop()
    assert op == "AllGather"
    # The culprit: the extra AllReduce at the same opCount, then its real call one ahead.
    assert [c["opcount"] for c in mine[-3:]] == [at - 1, at, at + 1]
    extra, late = mine[-2], mine[-1]
    assert (extra["op"], extra["count"], extra["dtype"]) == ("AllReduce", 1, 7)
    assert (late["op"], late["count"], late["dtype"]) == (op, count, dtype)
    assert extra["line_no"] < late["line_no"] or extra["path"] != late["path"]
    assert _epoch(extra["ts"], extra["frac"]) < _epoch(late["ts"], late["frac"])
    if layout == "combined":  # nothing but COLL lines of that slot from there on
        first = min(c["line_no"] for c in colls if c["opcount"] == at)
        tail = _lines(out / "job.log")[first - 1 :]
        assert all(
            "NCCL INFO" not in x or COLL_RE.search(x.split("NCCL INFO ", 1)[1]) for x in tail
        )
        # The combined layout stays in true (here: printed) time order.
        stamps = [_epoch(m["ts"], m["frac"]) for x in tail if (m := INFO_RE.search(x))]
        assert stamps == sorted(stamps)
    # truth.json
    (outcome,) = doc["faults"]
    d = outcome["details"]
    assert outcome["kind"] == "ExtraCollective"
    assert outcome["effective"]
    assert (d["rank"], d["seq"], d["opcount"], d["op"]) == (rank, at, f"{at:x}", "AllReduce")
    assert d["extra"] == {"op": "AllReduce", "count": 1, "datatype": 7}
    assert d["expected"] == {"op": op, "count": count, "datatype": dtype}
    assert d["differs"] == ["op", "count", "datatype"]
    assert d["real_call_seq"] == at + 1
    want_last = {str(r): at for r in range(SMALL["ranks"])} | {str(rank): at + 1}
    assert d["last_seq"]["world"] == want_last
    world = next(c for c in doc["communicators"] if c["name"] == "world")
    assert world["last_seq"] == want_last
    assert world["instances"] == doc["world_instances"] == at + 2
    assert world["calls"] == len(colls)
    assert doc["calls_by_op"]["AllReduce"] == sum(1 for c in colls if c["op"] == "AllReduce")


def test_extra_collective_at_the_grad_norm(tmp_path: Path) -> None:
    # Instance 6 is step 0's grad-norm AllReduce (count 1, fp32): the extra call looks
    # the same there, only the sequence shows it.
    out, _, doc = _gen(tmp_path, faults=(ExtraCollective(5, 6),), **SMALL)
    colls = [c for c in _colls(out, doc) if c["comm"] == "world"]
    assert {(c["op"], c["count"], c["dtype"]) for c in colls if c["opcount"] == 6} == {
        ("AllReduce", 1, 7)
    }
    assert [c["rank"] for c in colls if c["opcount"] == 7] == [5]
    assert doc["faults"][0]["details"]["differs"] == []


def test_extra_collective_single_host_227_prints_opcount_0(tmp_path: Path) -> None:
    out, _, doc = _gen(tmp_path, faults=(ExtraCollective(1, 4),), **{**SMALL, "hosts": 1})
    assert doc["faults"][0]["details"]["opcount"] == "0"
    mine = [c for c in _colls(out, doc) if c["comm"] == "world" and c["rank"] == 1]
    assert {c["opcount"] for c in mine} == {0}
    assert (mine[-2]["op"], mine[-2]["count"]) == ("AllReduce", 1)
    assert len(mine) == 4 + 2


@pytest.mark.parametrize("desync", [False, True])
def test_extra_collective_watchdog(tmp_path: Path, desync: bool) -> None:
    rank, at = 2, 10  # step 1's fourth world collective: a ReduceScatter
    out, _, doc = _gen(
        tmp_path,
        framework="torch",
        launcher="torchrun",
        desync_report=desync,
        faults=(ExtraCollective(rank, at),),
        **SMALL,
    )
    text = _lines(out / "job.log")
    wd = {int(m["rank"]): m for x in text if (m := WD.search(x)) and not WD_TERM.search(x)}
    wd = {r: m for r, m in wd.items() if "what():" not in m.string}
    assert set(wd) == set(range(SMALL["ranks"]))  # everyone waits, the culprit too
    for r, m in wd.items():
        assert int(m["seq"]) == at + 1  # SeqNum counts from 1
        if r == rank:  # stuck on its extra call
            assert (m["op"], m["nin"], m["nout"]) == ("ALLREDUCE", "1", "1")
        else:
            assert m["op"] == "_REDUCE_SCATTER_BASE"
    exc = {int(m["rank"]): m for x in text if (m := EXC_DET.search(x))}
    for r, m in exc.items():
        want_enq = at + 2 if r == rank else at + 1  # the culprit enqueued its real call too
        assert (int(m["seq"]), int(m["enq"]), int(m["comp"])) == (at + 1, want_enq, at)
    timeouts = {t["rank"]: t for t in doc["framework"]["timeouts"]}
    assert timeouts[rank]["op"] == "ALLREDUCE"
    assert timeouts[rank]["last_enqueued"] == at + 2
    if desync:
        joined = "\n".join(text)
        tos = {int(m["rank"]): m["op"] for m in DESYNC_TO.finditer(joined)}
        assert tos[rank] == "ALLREDUCE"
        lags = {m["ranks"] for m in DESYNC_LAG.finditer(joined)}
        # The report is fooled: it names everyone but the culprit, who is one ahead.
        others = ", ".join(str(r) for r in range(SMALL["ranks"]) if r != rank)
        assert lags == {others}
        assert f"#{at + 2} started ranks:" in joined
        assert doc["framework"]["desync_lagging"] == [r for r in range(8) if r != rank]


# --- DeadProcess ---------------------------------------------------------------------


def _iso_epoch(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize("layout", ["combined", "per-rank"])
def test_dead_process_nccl_lines(tmp_path: Path, layout: str) -> None:
    rank, at = 5, 9
    out, truth, doc = _gen(
        tmp_path, layout=layout, timestamps=True, faults=(DeadProcess(rank, at),), **SMALL
    )
    assert truth.end_reason == "died"
    colls = [c for c in _colls(out, doc) if c["comm"] == "world"]
    assert max(c["opcount"] for c in colls if c["rank"] == rank) == at - 1
    assert {c["rank"] for c in colls if c["opcount"] == at} == set(range(8)) - {rank}
    assert max(c["opcount"] for c in colls) == at
    if layout == "per-rank":  # the dead process's file ends with its last collective
        mine = _lines(out / doc["ranks"][rank]["file"])
        last = INFO_RE.search(mine[-1])
        assert last
        c = COLL_RE.match(last["msg"])
        assert c
        assert int(c["opcount"], 16) == at - 1
    (outcome,) = doc["faults"]
    d = outcome["details"]
    assert outcome["kind"] == "DeadProcess"
    assert outcome["effective"]
    assert (d["rank"], d["signal"], d["exit_code"]) == (rank, "SIGKILL", -9)
    assert d["last_seq"]["world"] == {str(r): at - 1 if r == rank else at for r in range(8)}
    # Died after its last collective, before the others entered the next one.
    died = _iso_epoch(d["died_at"])
    mine_last = max(_epoch(c["ts"], c["frac"]) for c in colls if c["rank"] == rank)
    others_at = min(_epoch(c["ts"], c["frac"]) for c in colls if c["opcount"] == at)
    assert mine_last < died < others_at + 0.0021


def _agent_time(line: str) -> float | None:
    """Seconds since midnight of a torchelastic agent line (after the pdsh prefix)."""
    body = line.split(": ", 1)[1] if ": " in line else line
    if g := PYGLOG.match(body):
        hh, mm, ss = g["time"].split(":")
        return int(hh) * 3600 + int(mm) * 60 + float(ss)
    if a := AGENT_OLD.match(body):
        hh, mm, ss = a["ts"].split(" ")[1].split(":")
        return int(hh) * 3600 + int(mm) * 60 + int(ss) + int(a["ms"]) / 1000
    return None


@pytest.mark.parametrize("torch_era", ["2.1", "2.4", "2.7"])
@pytest.mark.parametrize("framework", ["torch", "deepspeed"])
def test_dead_process_torchrun_reports_it(tmp_path: Path, torch_era: str, framework: str) -> None:
    rank, at = 5, 9  # node-1, local rank 1
    out, _, doc = _gen(
        tmp_path,
        framework=framework,
        torch_era=torch_era,
        launcher="pdsh",
        faults=(DeadProcess(rank, at),),
        **SMALL,
    )
    lines = _lines(out / "job.log")
    pid = {r["rank"]: r["pid"] for r in doc["ranks"]}
    host1 = [r for r in range(8) if doc["ranks"][r]["host"] == "node-1"]
    died = _iso_epoch(doc["faults"][0]["details"]["died_at"]) % 86400
    monitor = 5.0 if torch_era == "2.1" else 0.1
    # node-1's agent: SIGTERM to the host's other workers right after the death ...
    sigterm = [(x, m) for x in lines if x.startswith("node-1: ") and (m := SIGTERM.search(x))]
    assert sorted(int(m["pid"]) for _, m in sigterm) == sorted(pid[r] for r in host1 if r != rank)
    for x, _ in sigterm:
        t = _agent_time(x)
        assert t is not None
        assert died - 0.001 <= t <= died + monitor + 0.001  # its next poll, not a timeout
    # ... then "failed (exitcode: -9)" for the dead rank, and the ChildFailedError summary.
    failed = [m for x in lines if x.startswith("node-1: ") and (m := EL_FAILED.search(x))]
    assert [(int(m["code"]), int(m["lr"]), int(m["pid"])) for m in failed] == [(-9, 1, pid[rank])]
    body = [x.split(": ", 1)[1] for x in lines if x.startswith("node-1: ")]
    root = body.index("Root Cause (first observed failure):")
    entry = body[root + 1 : root + 8]
    rk, ex = EL_RANK.match(entry[3]), EL_EXIT.match(entry[4])
    assert rk
    assert ex
    assert (int(rk["rank"]), int(rk["lr"])) == (rank, 1)
    assert (int(ex["code"]), int(ex["pid"])) == (-9, pid[rank])
    assert entry[6] == f"  traceback : Signal 9 (SIGKILL) received by PID {pid[rank]}"
    assert body[root - 2] == "  <NO_OTHER_FAILURES>"
    # Nobody on node-1 reaches the watchdog; node-0's ranks wait out the timeout.
    wd = {int(m["rank"]) for x in lines if (m := WD.search(x)) and not WD_TERM.search(x)}
    assert wd == {r for r in range(8) if r not in host1}
    fw = doc["framework"]
    dead = [f for f in fw["failures"] if f["rank"] == rank]
    assert dead == [
        {
            "rank": rank,
            "local_rank": 1,
            "host": "node-1",
            "pid": pid[rank],
            "exitcode": -9,
            "signal": "SIGKILL",
            "root_cause": True,
            "path": "job.log",
            "line_no": dead[0]["line_no"],
        }
    ]
    assert set(host1) - {rank} <= set(fw["terminated"])
    assert rank not in fw["terminated"]
    assert {t["rank"] for t in fw["timeouts"]} == {r for r in range(8) if r not in host1}


def test_dead_process_other_signal(tmp_path: Path) -> None:
    out, _, doc = _gen(tmp_path, framework="torch", faults=(DeadProcess(2, 4, "SIGSEGV"),), **SMALL)
    text = (out / "job.log").read_text()
    pid = doc["ranks"][2]["pid"]
    assert f"failed (exitcode: -11) local_rank: 2 (pid: {pid})" in text
    assert f"  traceback : Signal 11 (SIGSEGV) received by PID {pid}" in text
    assert doc["faults"][0]["details"]["exit_code"] == -11


def test_dead_rank_0_prints_nothing_after_it_died(tmp_path: Path) -> None:
    # Rank 0 writes most of the noise (tqdm, DeepSpeed): none of it after its death.
    out, _, doc = _gen(
        tmp_path,
        framework="deepspeed",
        launcher="rank",
        non_nccl_frac=0.4,
        seed=5,
        faults=(DeadProcess(0, 11),),
        **SMALL,
    )
    lines = _lines(out / "job.log")
    colls = [c for c in _colls(out, doc) if c["comm"] == "world"]
    assert max(c["opcount"] for c in colls if c["rank"] == 0) == 10
    # It died after the previous slot's lines (its noise among them is its own doing).
    first = min(c["line_no"] for c in colls if c["opcount"] == 11)
    assert not [x for x in lines[first - 1 :] if x.startswith("[rank0]:")]
    assert sum(x.startswith("[rank0]:") for x in lines[: first - 1]) > 50


def test_new_fault_validation() -> None:
    with pytest.raises(ValueError, match="signal must be one of"):
        SynthSpec(faults=(DeadProcess(1, 3, "SIGHUP"),))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rank must be in"):
        SynthSpec(faults=(ExtraCollective(16, 3),))
    with pytest.raises(ValueError, match="at_instance must be"):
        SynthSpec(faults=(DeadProcess(1, 10_000),))
    with pytest.raises(ValueError, match="already has"):
        SynthSpec(faults=(StopRank(1, 3), DeadProcess(1, 3)))
    with pytest.raises(ValueError, match="already has"):
        SynthSpec(faults=(ExtraCollective(1, 3), DeadProcess(1, 3)))
    # Different ranks at one instance, or one rank at two instances, are fine.
    SynthSpec(faults=(ExtraCollective(1, 3), DeadProcess(2, 3), StopRank(1, 5)))
    assert DeadProcess(0, 1).exit_code == -9
    assert DeadProcess(0, 1, "SIGBUS").exit_code == -7


def test_earliest_terminal_fault_wins(tmp_path: Path) -> None:
    _, truth, doc = _gen(
        tmp_path, faults=(DeadProcess(1, 12), ExtraCollective(2, 5), StopRank(3, 8)), **SMALL
    )
    assert truth.end_reason == "hang"
    assert [f["effective"] for f in doc["faults"]] == [False, True, False]
    assert doc["faults"][0]["details"]["died_at"] is None
    assert doc["world_instances"] == 7


def test_death_and_ib_error_at_one_instance_are_refused() -> None:
    with pytest.raises(ValueError, match="IbError is at the same instance"):
        SynthSpec(faults=(IbError("node-1", 4), DeadProcess(1, 4)))
    SynthSpec(faults=(IbError("node-1", 4), DeadProcess(1, 5)))


# --- CLI ------------------------------------------------------------------------------


def test_cli_benchmark_options(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    result = CliRunner().invoke(
        synth_cli.synth,
        [
            "--out", str(out), "--ranks", "8", "--hosts", "2", "--steps", "3", "--layers", "2",
            "--era", "2.26", "--timestamps", "--clock-offset-max", "0.001",
            "--jitter-events", "3", "--truth-format", "2",
            "--slow-rank", "1:0.01", "--slow-rank", "6:0.03",
            "--framework", "torch", "--dead-process", "5:12:SIGBUS",
            "--extra-collective", "2:15",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "3 one-off delays" in result.output
    assert "end=died" in result.output
    doc = json.loads((out / "truth.json").read_text())
    spec = doc["spec"]
    assert (spec["era"], spec["clock_offset_max_s"], spec["jitter_events"]) == ("2.26", 0.001, 3)
    assert spec["truth_format"] == doc["format_version"] == 2
    assert spec["faults"] == [
        {"kind": "SlowRank", "rank": 1, "lateness_s": 0.01},
        {"kind": "SlowRank", "rank": 6, "lateness_s": 0.03},
        {"kind": "ExtraCollective", "rank": 2, "at_instance": 15},
        {"kind": "DeadProcess", "rank": 5, "at_instance": 12, "signal": "SIGBUS"},
    ]
    assert [f["effective"] for f in doc["faults"]] == [True, True, False, True]
    assert doc["faults"][3]["details"]["exit_code"] == -7
    assert len(doc["clock_offsets"]) == 2
    assert len(doc["noise"]) == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dead-process", "3"], "RANK:INSTANCE[:SIGNAL]"),
        (["--dead-process", "3:4:5:6"], "RANK:INSTANCE[:SIGNAL]"),
        (["--dead-process", "3:4:SIGHUP"], "SIGNAL must be one of"),
        (["--dead-process", "x:4"], "RANK must be an integer"),
        (["--extra-collective", "3"], "RANK:INSTANCE"),
        (["--extra-collective", "3:9999"], "at_instance must be <"),
        (["--truth-format", "3"], "'3' is not one of"),
        (["--clock-offset-max", "-1"], "clock_offset_max_s"),
        (["--jitter-events", "1", "--size", "1MB"], "not target_size_bytes"),
    ],
)
def test_cli_benchmark_bad_values(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(synth_cli.synth, ["--out", str(tmp_path / "x"), *args])
    assert result.exit_code == 2
    assert message in result.output
