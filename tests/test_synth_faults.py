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

from ncclscope import synth
from ncclscope.synth import SlowRank, StopRank, SynthSpec, Truth, generate

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
    fixed = dataclasses.replace(synth._ERA_FORMATS["2.26"], subsec_bug=False)
    monkeypatch.setitem(synth._ERA_FORMATS, "2.26", fixed)
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
    per_step: dict[int, float] = {}
    for e in doc["noise"]:  # no stragglers: the whole delay holds the step up
        per_step[e["step"]] = per_step.get(e["step"], 0.0)
    for e in doc["noise"]:
        same = [x["delay_s"] for x in doc["noise"] if x["instance"] == e["instance"]]
        if e["delay_s"] == max(same):
            per_step[e["step"]] += e["delay_s"]
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
