"""Identity from the NCCL lines that outlive a cut head (issue #18): ``Init timings``
(rank and size per process, 2.22+) and the teardown lines ``- Destroy COMPLETE`` /
``- Abort COMPLETE`` (comm pointer, rank, size, GPU; 2.12+).

They name ranks where the Init lines were cut away, so that a hang in a log whose head
was lost gets its culprit; and they must never make a healthy cut log look hung: a
member named only by its teardown line did not say where its calls began (on 2.27+ one
node, where opCount stays 0 and calls are counted in log order, its count is no
sequence), and a member that destroyed its communicator cleanly had every call complete.

The logs here are written from NCCL's and PyTorch's format strings
(``shared/formats/nccl.md`` §3.3), not copied from anyone's log.
"""

from __future__ import annotations

import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import jobgen
import pytest
from test_lines import line_frame

from ncclscope.analysis import run_analysis
from ncclscope.export.json_report import to_json_dict
from ncclscope.parsers.nccl.records import (
    LineRecords,
    add_info_messages,
    collect_records,
    info_messages,
    plain_info_lines,
)
from ncclscope.synth import SynthSpec, generate

REPO = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------ a small hung job

T0 = datetime(2025, 3, 14, 9, 0, 0)
#: rank -> (host, pid, local GPU); two hosts of two GPUs (2.27, multi-node: opCount counts)
PROCS = {0: ("node-a", 4100, 0), 1: ("node-a", 4101, 1), 2: ("node-b", 5200, 0),
         3: ("node-b", 5201, 1)}  # fmt: skip
COMM = {0: "0x55a1c0", 1: "0x55a2c0", 2: "0x55b1c0", 3: "0x55b2c0"}
BUS = {0: "18000", 1: "19000", 2: "18000", 3: "19000"}


def _ts(s: float) -> str:
    return (T0 + timedelta(seconds=s)).strftime("[%Y-%m-%d %H:%M:%S.%f] ")


def _head(rank: int, t: float, tid_offset: int = 0) -> str:
    host, pid, dev = PROCS[rank]
    return f"[default{dev}]:{_ts(t)}{host}:{pid}:{pid + tid_offset} [{dev}] NCCL INFO "


def _coll(rank: int, k: int, t: float, *, opcount: int | None = None) -> str:
    return _head(rank, t) + (
        f"AllReduce: opCount {k if opcount is None else opcount:x} sendbuff 0x7f{rank}000 "
        f"recvbuff 0x7f{rank}000 count 4096 datatype 7 op 0 root 0 comm {COMM[rank]} "
        f"[nranks=4] stream 0x55c{rank}"
    )


def _init(rank: int, t: float) -> str:
    dev = PROCS[rank][2]
    return _head(rank, t, 70) + (
        f"ncclCommInitRankConfig comm {COMM[rank]} rank {rank} nranks 4 cudaDev {dev} "
        f"nvmlDev {dev} busId {BUS[rank]} commId 0x8a2f4c1d9e3b7a60 - Init COMPLETE"
    )


def _timings(rank: int, t: float) -> str:
    return _head(rank, t, 70) + (
        f"Init timings - ncclCommInitRankConfig: rank {rank} nranks 4 total 0.71 (kernels "
        "0.17, alloc 0.03, bootstrap 0.00, allgathers 0.00, topo 0.29, graphs 0.00, "
        "connections 0.18, rest 0.04)"
    )


def _teardown(rank: int, t: float, what: str) -> str:
    dev = PROCS[rank][2]
    # PyTorch's watchdog thread aborts the communicator: another tid than the calls'
    return _head(rank, t, 90) + (
        f"comm {COMM[rank]} rank {rank} nranks 4 cudaDev {dev} busId {BUS[rank]} - {what} COMPLETE"
    )


def _watchdog(rank: int) -> str:
    pid, dev = PROCS[rank][1], PROCS[rank][2]
    return (
        f"[default{dev}]:[rank{rank}]:[E314 09:10:01.311000 {pid} ProcessGroupNCCL.cpp:632] "
        f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=10, "
        "OpType=ALLREDUCE, NumelIn=4096, NumelOut=4096, Timeout(ms)=600000) ran for 600045 "
        "milliseconds before timing out."
    )


def hung_job(
    *, first: int = 3, init: bool = False, timings: bool = False, aborts: bool = True
) -> list[str]:
    """Rank 2 never calls AllReduce #9; ranks 0, 1 and 3 time out in it and PyTorch
    aborts their communicators.  The head is cut at collective ``first``: no Init lines
    unless ``init``, and the Init timings (printed right after them) only if ``timings``."""
    out = []
    for r in range(4):
        if init:
            out.append(_init(r, 0.4))
        if timings:
            out.append(_timings(r, 0.5))
    for k in range(first, 10):
        out += [_coll(r, k, 1 + k * 0.1 + r * 0.001) for r in range(4) if (r, k) != (2, 9)]
    out += [_watchdog(r) for r in (0, 1, 3)]
    if aborts:
        out += [_teardown(r, 602 + r * 0.01, "Abort") for r in (0, 1, 3)]
    return out


def analyse(lines: list[str] | dict[str, list[str]]) -> dict[str, Any]:
    files = lines if isinstance(lines, dict) else {"job.log": lines}
    with tempfile.TemporaryDirectory(prefix="teardown-") as tmp:
        folder = Path(tmp) / "logs"
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text("\n".join(text) + "\n")
        return to_json_dict(run_analysis([str(folder)], workdir=Path(tmp) / "w"))


def blamed(doc: dict[str, Any]) -> list[tuple[str, str, list[int], list[str]]]:
    return [
        (f["kind"], f["severity"], f["ranks"], f["hosts"])
        for f in doc["findings"]
        if f["kind"] in ("hang", "timeout", "mismatch") and f["severity"] != "info"
    ]


def ranks_of(doc: dict[str, Any]) -> dict[int, str]:
    return {r["rank"]: r["host"] for r in doc["job"]["ranks"]}


# ------------------------------------------------------------------ attribution


def test_abort_lines_name_the_culprit_of_a_hang_whose_head_was_cut() -> None:
    """Ranks 0, 1, 3 are named by their Abort lines, rank 2 by elimination (the one
    member of the 4-rank communicator left): the COLL lines then show rank 2 behind."""
    doc = analyse(hung_job())
    assert ranks_of(doc) == {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}
    assert doc["job"]["world_size_source"] == "teardown"
    hang = [b for b in blamed(doc) if b[0] == "hang"]
    assert hang == [("hang", "critical", [2], ["node-b"])]
    (finding,) = [f for f in doc["findings"] if f["kind"] == "hang"]
    assert finding["evidence"]["torn_down"] == [{"rank": r, "ended": "Abort"} for r in (0, 1, 3)]
    # The same log without its Abort lines (what the reader saw before): nobody named.
    before = analyse(hung_job(aborts=False))
    assert ranks_of(before) == {}
    assert all(ranks == [] for _k, _s, ranks, _h in blamed(before))


def test_init_timings_name_the_culprit_of_a_hang_whose_init_lines_were_cut() -> None:
    doc = analyse(hung_job(first=0, timings=True, aborts=False))
    assert ranks_of(doc) == {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}
    assert doc["job"]["world_size_source"] == "init_timings"
    assert [b for b in blamed(doc) if b[0] == "hang"] == [("hang", "critical", [2], ["node-b"])]


def test_a_culprit_that_destroyed_its_communicator_early_is_still_named() -> None:
    """Rank 2 skipped #9 and destroyed its communicator cleanly; the others waited in #9:
    its own Destroy says nothing of #9 (it left before), the hang stands."""
    lines = hung_job(first=0, init=True, aborts=False)
    lines.insert(len(lines) - 3, _teardown(2, 3.0, "Destroy"))
    doc = analyse(lines)
    assert [b for b in blamed(doc) if b[0] == "hang"] == [("hang", "critical", [2], ["node-b"])]
    (finding,) = [f for f in doc["findings"] if f["kind"] == "hang"]
    assert "rank 2 had destroyed the communicator" in finding["message"]
    assert finding["evidence"]["torn_down"] == [{"rank": 2, "ended": "Destroy"}]


def test_a_stall_whose_waiters_then_destroyed_the_communicator_is_no_hang() -> None:
    """Rank 2's line of #9 was lost (a splice, a cut); every rank then destroyed the
    communicator cleanly, which NCCL does only once their calls completed: #9 completed,
    so rank 2 joined it.  Nothing says the job was stuck, and nothing is said."""
    lines = [ln for r in range(4) for ln in (_init(r, 0.4), _timings(r, 0.5))]
    calls = [(r, k) for k in range(10) for r in range(4) if (r, k) != (2, 9)]
    lines += [_coll(r, k, 1 + k * 0.1 + r * 0.001) for r, k in calls]
    end = [_teardown(r, 3 + r * 0.01, "Destroy") for r in range(4)]
    assert not [f for f in analyse(lines + end)["findings"] if f["kind"] == "hang"]
    # Without the Destroy lines the log ends with rank 2 a collective behind (info).
    assert [f["severity"] for f in analyse(lines)["findings"] if f["kind"] == "hang"] == ["info"]


# ------------------------------------------------------------------ healthy cut logs


def _alarms(doc: dict[str, Any]) -> list[str]:
    return jobgen.judge(doc, set()).alarms


CUTS = (0.05, 0.25, 0.5, 0.73, 0.9, 0.95, 0.98)


@pytest.mark.parametrize("what", ["Destroy", "Abort"])
@pytest.mark.parametrize("keep_from", CUTS)
def test_a_healthy_227_log_cut_at_the_head_stays_healthy(keep_from: float, what: str) -> None:
    """The 8-GPU 2.27 fixture ends with every rank's Destroy COMPLETE (or Abort COMPLETE:
    PyTorch's shutdown aborts its communicators at a clean exit); opCount is 0 on every
    call, so calls are counted in log order.  Cut at the head, its ranks are named by the
    teardown lines, and no count from a cut head is compared with another."""
    whole = jobgen.load_files(REPO / "fixtures" / "nvlink-8gpu-227")
    cut = jobgen.cut_lines(whole, keep_from, 1.0)
    texts = {k: [ln.text.replace("- Destroy COMPLETE", f"- {what} COMPLETE") for ln in v]
             for k, v in cut.items()}  # fmt: skip
    doc = analyse(texts)
    assert not _alarms(doc), keep_from
    assert not [f for f in doc["findings"] if f["kind"] == "hang"], keep_from
    kept = [t for lines in texts.values() for t in lines]
    if not any(" Init " in t for t in kept):
        torn_down = {int(t.split(" rank ")[1].split()[0]) for t in kept if f"{what} COMPLETE" in t}
        assert torn_down
        assert set(ranks_of(doc)) == torn_down


def _synth(tmp: Path, era: str, layout: str, skew: float) -> dict[str, list[str]]:
    spec = SynthSpec(ranks=8, hosts=2, steps=3, era=era, timestamps=era == "2.27", seed=11,
                     layout=layout, clock_offset_max_s=skew)  # fmt: skip
    folder = tmp / f"{era}-{layout}-{skew}"
    generate(spec, folder)
    return {p.name: p.read_text().splitlines() for p in sorted(folder.glob("*.log"))}


@pytest.mark.parametrize(
    ("era", "layout", "skew"),
    [
        ("2.27", "combined", 0.0),
        ("2.27", "per-rank", 0.05),
        ("2.18", "combined", 0.0),
        ("2.18", "per-rank", 0.0),
    ],
)
def test_healthy_synthetic_jobs_cut_split_and_joined_stay_healthy(
    tmp_path: Path, era: str, layout: str, skew: float
) -> None:
    """Healthy jobs whose every rank destroys its communicators at the end (2.18: opCount
    counts; 2.27 on two hosts), in one file or one per rank, with skewed clocks: cut at
    the head at every point, and with a restart appended, no finding says they hung."""
    texts = _synth(tmp_path, era, layout, skew)
    assert any("Destroy COMPLETE" in t for lines in texts.values() for t in lines)
    files = {
        name: [jobgen.Line(t, float(k), None, jobgen.classify(t), 0, k) for k, t in enumerate(v)]
        for name, v in texts.items()
    }
    cuts: list[tuple[str, jobgen.Files]] = [
        (f"head{p}", jobgen.cut_lines(files, p, 1.0)) for p in CUTS
    ]
    first = sorted(files)[0]
    cuts += [(f"one-file-head{p}", jobgen.cut_lines(files, p, 1.0, only=first)) for p in (0.5, 0.9)]
    cuts += [("restart", jobgen.join_runs(jobgen.cut_lines(files, 0.6, 1.0)))]
    for name, cut in cuts:
        doc = analyse({k: [ln.text for ln in v] for k, v in cut.items()})
        assert not _alarms(doc), (era, layout, name, _alarms(doc))


# ------------------------------------------------------------------ both readers agree


def test_both_readers_give_the_same_init_timings_and_teardown_records() -> None:
    """``Init timings`` (2.22 and 2.23+ forms) and teardown lines: the polars readers and
    the reference parser give the same records (the fast path used to count Init
    timings only)."""
    texts = [
        _timings(1, 0.5),
        "node-a:4101:4171 [1] NCCL INFO Init timings: rank 1 nranks 4 total 0.70 (kernels "
        "0.17, bootstrap 0.00, allgathers 0.00, topo 0.29, graphs 0.00, connections 0.18, "
        "rest 0.04)",
        _teardown(1, 3.0, "Destroy"),
        _teardown(2, 3.0, "Abort"),
        "node-b:5200:5290 [0] NCCL INFO comm 0x55b1c0 rank 2 nRanks 4 cudaDev 0 busId 18000 "
        "- Abort START",
    ]
    rows, frame = line_frame(texts)
    want = collect_records(rows)
    assert plain_info_lines(frame.lazy()).is_empty()  # none of them is only counted
    got = LineRecords()
    done = add_info_messages(got, info_messages(frame.lazy()))
    rest = frame.join(done, on=["file_id", "i"], how="anti").sort("i")
    collect_records(rest.iter_rows(), out=got)
    assert [(p, n, t.rank, t.nranks) for p, n, t in want.init_timings] == [
        ((0, "node-a", 4101), 1, 1, 4),
        ((0, "node-a", 4101), 2, 1, 4),
    ]
    assert sorted(got.init_timings, key=repr) == sorted(want.init_timings, key=repr)
    assert sorted(got.comm_events, key=repr) == sorted(want.comm_events, key=repr)
    assert [e.event for _p, _n, e in want.comm_events] == ["Destroy", "Abort", "Abort"]


@pytest.mark.parametrize(
    ("case", "keep_from", "kind", "culprit"),
    [
        # 2.27 on two hosts: the world communicator's opCount counts; Destroy lines name
        # the ranks whose Init lines were cut, so the slow rank's lateness is measured
        ("straggler-227-ts", 0.5, "straggler", [11]),
        # the IB error's rank, named by its Abort lines (README: rank 5 raised it)
        ("ib-completion-error", 0.8, "nccl_error", [5]),
    ],
)
def test_fixture_culprits_named_through_teardown_lines_after_a_head_cut(
    case: str, keep_from: float, kind: str, culprit: list[int]
) -> None:
    cut = jobgen.cut_lines(jobgen.load_files(REPO / "fixtures" / case), keep_from, 1.0)
    texts = {k: [ln.text for ln in v] for k, v in cut.items()}
    assert not any(" Init " in t for v in texts.values() for t in v)
    doc = analyse(texts)
    named = [f["ranks"] for f in jobgen.severe(doc) if f["kind"] == kind]
    assert culprit in named
    # without the teardown lines nobody is named
    bare = {k: [t for t in v if " COMPLETE" not in t] for k, v in texts.items()}
    assert not [f["ranks"] for f in jobgen.severe(analyse(bare)) if f["ranks"]]
