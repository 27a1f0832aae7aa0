"""Framework lines of the synthetic job generator (``SynthSpec.framework``).

What synth wrote is checked against what its truth.json says, with regexes written from
shared/formats/deepspeed-torch.md (never with ncclscope's parsers, which synth must not
use either).
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ncclscope.synth import (
    IbError,
    Mismatch,
    SlowRank,
    StopRank,
    SynthSpec,
    Truth,
    generate,
)
from ncclscope.synth.cli import synth

# --- deepspeed-torch.md D1-D7 ---------------------------------------------------------
DS_HDR = re.compile(
    r"\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3})\] \[(?P<lvl>[A-Z]+)\] "
    r"\[(?P<file>[\w.]+):(?P<line>\d+):(?P<func>\w+)\] (?P<msg>.*)$"
)
DS_RANK = re.compile(r"^\[Rank (?P<rank>-?\d+)\] (?P<body>.*)$")
DS_TIMER = re.compile(
    r"(?:rank=(?P<rank>\d+) )?time \(ms\)(?P<pairs>(?: \| [^|:]+: -?\d+\.\d+(?: \([^)]*\))?)+)\s*$"
)
DS_PAIR = re.compile(r"\| (?P<name>[^|:]+): (?P<ms>-?\d+\.\d+)")
DS_TPUT = re.compile(
    r"epoch=(?P<epoch>\d+)/micro_step=(?P<micro>\d+)/global_step=(?P<gstep>\d+), "
    r"RunningAvgSamplesPerSec=(?P<avg>[-+\w.]+), CurrSamplesPerSec=(?P<cur>[-+\w.]+), "
    r"MemAllocated=(?P<ma>[\d.]+)GB, MaxMemAllocated=(?P<mma>[\d.]+)GB"
)
DS_MEM = re.compile(
    r"MA (?P<ma>[\d.]+) GB\s+Max_MA (?P<max_ma>[\d.]+) GB\s+CA (?P<ca>[\d.]+) GB\s+"
    r"Max_CA (?P<max_ca>[\d.]+) GB"
)
DS_CPU = re.compile(r"CPU Virtual Memory:\s+used = (?P<used>[\d.]+) GB, percent = (?P<pct>[\d.]+)%")
DS_CFG = re.compile(r"^  (?P<key>[A-Za-z_]\w*) (?:\.+)? (?P<value>.*)$")
COMM_HDR = re.compile(
    r"^Comm\. Op\s+Message Size\s+Count\s+Total Latency\(ms\)\s+Avg Latency\(ms\)\s+"
    r"tput_avg \(Gbps\)\s+busbw_avg \(Gbps\)\s*$"
)
COMM_OP = re.compile(r"^(?P<op>[A-Za-z_]\w*(?: \| \[Caller Func: \w+\])?)\s*$")
COMM_ROW = re.compile(
    r"^\s{20}(?P<size>\d+(?:\.\d+)? ?[KMGTPEZY]?B)\s+(?P<count>\d+)\s+(?P<total>[\d.]+)\s+"
    r"(?P<avg>[\d.]+)\s+(?P<tput>[\d.]+)\s+(?P<busbw>[\d.]+)\s*$"
)
# DeepSpeed <= 0.10.0 timer names (D2 table) -> >= 0.10.1
RENAMES = {
    "forward_microstep": "fwd_microstep",
    "backward_microstep": "bwd_microstep",
    "backward_inner_microstep": "bwd_inner_microstep",
    "backward_allreduce_microstep": "bwd_allreduce_microstep",
    "forward": "fwd",
    "backward": "bwd",
    "backward_inner": "bwd_inner",
    "backward_allreduce": "bwd_allreduce",
}

# --- deepspeed-torch.md T1-T6 ---------------------------------------------------------
TEE = re.compile(r"^\[(?P<role>[A-Za-z_][\w-]*?)(?P<local_rank>\d+)\]:")
RANKPFX = re.compile(r"^\[rank(?P<grank>\d+)\]:")
GLOG = re.compile(
    r"\[(?P<sev>[IWEF])(?:(?P<mmdd>\d{3,4}) (?P<time>\d{2}:\d{2}:\d{2}\.\d+))?(?: (?P<tid>\d+))? "
    r"(?P<src>[\w./-]+\.(?:cpp|h|hpp|cc)):(?P<line>\d+)\] "
)
PG = re.compile(
    r"\[(?:PG ID (?P<pgid>\d+) PG GUID (?P<guid>[^\s(\]]+)(?:\((?P<desc2>[^)]*)\))?|"
    r"PG (?P<pg>\d+)(?: \((?P<desc>[^)]*)\))?) Rank (?P<pgrank>\d+)\]"
)
WD = re.compile(
    r"\[Rank (?P<rank>\d+)\] Watchdog caught collective operation timeout: "
    r"WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)(?:, NumelIn=(?P<nin>-?\d+), "
    r"NumelOut=(?P<nout>-?\d+))?, Timeout\(ms\)=(?P<timeout_ms>\d+)\) ran for\s+(?P<ran_ms>\d+)\s+"
    r"milliseconds before timing out\."
)
EXC_DET = re.compile(
    r"Exception \(either an error or timeout\) detected by watchdog at work: (?P<seq>\d+), "
    r"last enqueued NCCL work: (?P<enq>-?\d+), last completed NCCL work: (?P<comp>-?\d+)\."
)
TO_AT = re.compile(
    r"Timeout at NCCL work: (?P<seq>\d+), last enqueued\s+NCCL work: (?P<enq>-?\d+), "
    r"last completed NCCL work: (?P<comp>-?\d+)\."
)
FAIL_DET = re.compile(
    r"failure detected by watchdog at work sequence id: (?P<seq>\d+) PG status: "
    r"last enqueued work: (?P<enq>-?\d+), last completed work: (?P<comp>-?\d+)"
)
WD_TERM = re.compile(r"(?:NCCL|Process group) watchdog thread terminated with exception: ")
DESYNC_TO = re.compile(r"- \[(?P<rank>\d+)\] Timeout at collective: (?P<op>\w+), #(?P<seq>\d+)")
DESYNC_LAG = re.compile(
    r"\[(?P<ranks>[\d, ]+)\] (?:joined but didn't finish collective #(?P<s1>\d+)|"
    r"finished collective #(?P<s2>\d+), but didn't join collective #(?P<s3>\d+))"
)
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
# nccl.md §1.2, to tell NCCL lines from the rest
NCCL_LINE = re.compile(
    r"[^\s:]+:\d+:\d+ \[-?\d+\] (?:NCCL INFO |[^\s:]+:\d+(?: \([^)]*\))? NCCL WARN )"
    r"|^(?:\S+ ?)?NCCL version \d+\.\d+\.\d+\S*\+cuda\d+\.\d+$"
)

SMALL: dict[str, Any] = {"ranks": 8, "hosts": 2, "steps": 4, "layers": 2}


# --- helpers --------------------------------------------------------------------------


def _lines(path: Path) -> list[str]:
    # Split on '\n' only: tqdm lines carry '\r'.
    return path.read_bytes().decode("utf-8").split("\n")[:-1]


def _gen(tmp_path: Path, name: str = "job", **kw: Any) -> tuple[Path, Truth, dict[str, Any]]:
    out = tmp_path / name
    truth = generate(SynthSpec(**kw), out)
    doc: dict[str, Any] = json.loads((out / "truth.json").read_text())
    return out, truth, doc


def _all_lines(out: Path, doc: dict[str, Any]) -> list[tuple[str, int, str]]:
    """(file, 1-based line number, text) of every line of every written file."""
    return [
        (f["path"], i + 1, line)
        for f in doc["files"]
        for i, line in enumerate(_lines(out / f["path"]))
    ]


def _ds_records(out: Path, doc: dict[str, Any]) -> list[tuple[str, re.Match[str]]]:
    """(launcher prefix, DS_HDR match) of every DeepSpeed logger line."""
    recs = []
    for _, _, line in _all_lines(out, doc):
        m = DS_HDR.search(line)
        if m:
            recs.append((line[: m.start()], m))
    return recs


def _timer_counts(out: Path, doc: dict[str, Any]) -> tuple[Counter[str], list[dict[str, float]]]:
    """Values per normalised timer name, and each timer line's values."""
    counts: Counter[str] = Counter()
    per_line = []
    for _, m in _ds_records(out, doc):
        r = DS_RANK.match(m["msg"])
        body = r["body"] if r else m["msg"]
        t = DS_TIMER.match(body)
        if not t:
            continue
        values = {}
        for p in DS_PAIR.finditer(t["pairs"]):
            name = RENAMES.get(p["name"], p["name"])
            counts[name] += 1
            values[name] = float(p["ms"])
        per_line.append(values)
    return counts, per_line


def _nccl_only(out: Path, doc: dict[str, Any]) -> dict[str, list[str]]:
    return {
        f["path"]: [x for x in _lines(out / f["path"]) if NCCL_LINE.search(x)] for f in doc["files"]
    }


def _digest(out: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(out.iterdir()):
        h.update(p.name.encode())
        h.update(b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


# --- framework="none" is what synth always wrote ----------------------------------------

# sha256 over (name, bytes) of every file written, taken before frameworks were added.
PINNED: list[tuple[dict[str, Any], str]] = [
    ({}, "46c464658e5f114b8def1298d1223a2f1fd3c1051bc283d479f5902dd1889587"),
    (
        {
            "ranks": 8,
            "hosts": 2,
            "steps": 2,
            "layers": 2,
            "timestamps": True,
            "launcher": "torchrun",
            "seed": 7,
            "faults": (SlowRank(1, 0.01),),
        },
        "bf397b1374656400a2850f212b4c3119df29de3dbde3ab61eae408b290c3b7c9",
    ),
    (
        {
            "ranks": 8,
            "hosts": 2,
            "steps": 3,
            "layers": 2,
            "era": "2.21",
            "launcher": "pdsh",
            "faults": (StopRank(5, 9),),
            "seed": 3,
        },
        "e5b0186969810a04d09b0f8664161d11544ea7bd2b394391f52ff3e91af2abdd",
    ),
    (
        {
            "ranks": 8,
            "hosts": 2,
            "steps": 3,
            "layers": 2,
            "era": "2.18",
            "layout": "per-rank",
            "faults": (Mismatch(2, 4, "count"),),
            "seed": 5,
        },
        "e2263458b6a6b53a3fe0e663e81cd72236e207d9ac2b3e36d83811ffe852fdbb",
    ),
    (
        {
            "ranks": 16,
            "hosts": 4,
            "steps": 3,
            "layers": 2,
            "tp_traffic": True,
            "benign_warns": 3,
            "faults": (IbError("node-1", 12),),
            "seed": 9,
            "launcher": "srun",
        },
        "5888b8c9c790ff5cd6adea0bb887f7f2792c46927c732aabb8ddfa4a51ef4f6f",
    ),
    (
        {
            "ranks": 16,
            "hosts": 2,
            "target_size_bytes": 300_000,
            "timestamps": True,
            "seed": 1,
            "launcher": "rank",
        },
        "c6c2062d3375dcc24df563f3d2e95682f1c49d0ce0a24e487f886264734b6a80",
    ),
    (
        {"ranks": 8, "hosts": 1, "steps": 2, "era": "2.7", "non_nccl_frac": 0.3, "seed": 2},
        "1533046f645b4a516da5f3410e50b17e47175af5b70e4264495609a7ae6dee80",
    ),
]


@pytest.mark.parametrize(("kw", "digest"), PINNED)
def test_framework_none_writes_the_pinned_bytes(
    tmp_path: Path, kw: dict[str, Any], digest: str
) -> None:
    out, truth, doc = _gen(tmp_path, **kw)
    assert _digest(out) == digest
    assert truth.framework is None
    assert "framework" not in doc
    assert "framework" not in doc["spec"]


@pytest.mark.parametrize("framework", ["deepspeed", "torch"])
@pytest.mark.parametrize(("layout", "launcher"), [("combined", "torchrun"), ("per-rank", "none")])
def test_framework_leaves_every_nccl_line_as_it_was(
    tmp_path: Path, framework: str, layout: str, launcher: str
) -> None:
    kw = {**SMALL, "layout": layout, "launcher": launcher, "timestamps": True, "seed": 4}
    faults = (StopRank(3, 10), SlowRank(6, 0.01))
    plain, _, p_doc = _gen(tmp_path, "plain", faults=faults, **kw)
    fw, _, f_doc = _gen(tmp_path, "fw", framework=framework, faults=faults, **kw)
    plain_lines = _nccl_only(plain, p_doc)
    fw_lines = _nccl_only(fw, f_doc)
    for path, lines in plain_lines.items():
        assert fw_lines[path] == lines
    assert p_doc["ranks"] == f_doc["ranks"]
    assert p_doc["communicators"] == f_doc["communicators"]


def test_same_seed_same_bytes_with_a_framework(tmp_path: Path) -> None:
    kw = {
        **SMALL,
        "framework": "deepspeed",
        "launcher": "torchrun",
        "timestamps": True,
        "comms_summary": True,
        "desync_report": True,
        "faults": (SlowRank(2, 0.02), StopRank(5, 17)),
    }
    a, _, _ = _gen(tmp_path, "a", seed=3, **kw)
    b, _, _ = _gen(tmp_path, "b", seed=3, **kw)
    c, _, _ = _gen(tmp_path, "c", seed=4, **kw)
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)


def test_all_lines_accounted_for(tmp_path: Path) -> None:
    out, truth, doc = _gen(
        tmp_path,
        framework="deepspeed",
        launcher="torchrun",
        non_nccl_frac=0.2,
        faults=(StopRank(1, 12),),
        **SMALL,
    )
    lines = [x for _, _, x in _all_lines(out, doc)]
    nccl = sum(bool(NCCL_LINE.search(x)) for x in lines)
    assert nccl + truth.non_nccl_lines == len(lines)
    assert doc["framework"]["lines"] <= truth.non_nccl_lines


# --- DeepSpeed start-up ---------------------------------------------------------------


def _config_json(out: Path, doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The ``json = {`` block of the config dump, and the ``key ... value`` lines."""
    lines = _lines(out / "job.log")
    attrs: dict[str, str] = {}
    block: dict[str, Any] | None = None
    for i, line in enumerate(lines):
        m = DS_HDR.search(line)
        if not m or m["file"] != "config.py":
            continue
        if m["msg"] == "  json = {":
            prefix = line[: m.start()]
            body = ["{"]
            for nxt in lines[i + 1 :]:
                assert nxt.startswith(prefix)
                body.append(nxt[len(prefix) :])
                if body[-1] == "}":
                    break
            block = json.loads("\n".join(body))
        elif m["func"] == "print" and (kv := DS_CFG.match(m["msg"])):
            attrs[kv["key"]] = kv["value"]
    assert block is not None
    return block, attrs


@pytest.mark.parametrize(
    ("stage", "offload"),
    [(3, "none"), (3, "optimizer"), (3, "param"), (3, "both"), (2, "optimizer"), (1, "none")],
)
def test_config_dump_states_the_truth(tmp_path: Path, stage: int, offload: str) -> None:
    out, _, doc = _gen(
        tmp_path,
        framework="deepspeed",
        zero_stage=stage,
        offload=offload,
        launcher="torchrun",
        **SMALL,
    )
    zero = doc["framework"]["zero"]
    cfg, attrs = _config_json(out, doc)
    zo = cfg["zero_optimization"]
    assert zo["stage"] == zero["stage"] == stage
    assert zo.get("offload_optimizer", {}).get("device", "none") == zero["offload_optimizer"]
    assert zo.get("offload_param", {}).get("device", "none") == zero["offload_param"]
    assert zo["overlap_comm"] == zero["overlap_comm"]
    assert zo["reduce_bucket_size"] == zero["reduce_bucket_size"]
    assert cfg["wall_clock_breakdown"] is True
    assert cfg["train_batch_size"] == doc["framework"]["train_batch_size"]
    # The attribute lines agree with the json.
    assert attrs["zero_optimization_stage"] == str(stage)
    assert attrs["world_size"] == str(SMALL["ranks"])
    assert attrs["wall_clock_breakdown"] == "True"
    assert attrs["zero_enabled"] == "True"
    zc = attrs["zero_config"]
    assert zc.startswith(f"stage={stage} ")
    # User values print plain, DeepSpeed's own integer defaults comma-grouped (D7).
    ag = re.search(r" allgather_bucket_size=([\d,]+) ", zc)
    assert ag
    assert int(ag[1].replace(",", "")) == zero["allgather_bucket_size"]
    assert f" reduce_bucket_size={zero['reduce_bucket_size']} " in zc
    assert ("offload_param=DeepSpeedZeroOffloadParamConfig(device='cpu'" in zc) == (
        zero["offload_param"] == "cpu"
    )
    assert ("offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig(device='cpu'" in zc) == (
        zero["offload_optimizer"] == "cpu"
    )
    # Keys of 29+ characters get no dots and two spaces.
    raw = [m["msg"] for _, m in _ds_records(out, doc) if m["func"] == "print"]
    assert "  train_micro_batch_size_per_gpu  " + str(cfg["train_micro_batch_size_per_gpu"]) in raw


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_init_lines(tmp_path: Path, stage: int) -> None:
    out, _, doc = _gen(tmp_path, framework="deepspeed", zero_stage=stage, **SMALL)
    zero = doc["framework"]["zero"]
    msgs = {m["msg"]: m for _, m in _ds_records(out, doc)}
    assert f"Reduce bucket size {zero['reduce_bucket_size']}" in msgs
    if stage < 3:  # stage_1_and_2.py logs these four; stage3.py the prefetch size instead
        assert f"Allgather bucket size {zero['allgather_bucket_size']}" in msgs
        offload = zero["offload_optimizer"] == "cpu"
        assert f"CPU Offload: {offload}" in msgs
        assert msgs[f"CPU Offload: {offload}"]["file"] == "stage_1_and_2.py"
    else:
        assert any(m.startswith("Prefetch bucket size ") for m in msgs)
    version = [DS_RANK.match(m)["body"] for m in msgs if "DeepSpeed info:" in m]  # type: ignore[index]
    assert version == [
        f"DeepSpeed info: version={doc['framework']['deepspeed_version']}, git-hash=unknown, "
        "git-branch=unknown"
    ]


def test_deepspeed_lines_only_on_rank_0_in_order(tmp_path: Path) -> None:
    out, _, doc = _gen(
        tmp_path, framework="deepspeed", launcher="torchrun", timestamps=True, **SMALL
    )
    recs = _ds_records(out, doc)
    framework_recs = [(p, m) for p, m in recs if "real_accelerator" not in m["file"]]
    assert framework_recs
    assert {p for p, _ in framework_recs} == {"[default0]:"}  # global rank 0, local rank 0
    stamps = [m["ts"] for _, m in framework_recs]
    assert stamps == sorted(stamps)
    for _, m in framework_recs:  # log_dist adds [Rank 0]; logger.info does not
        assert (m["func"] == "log_dist") == bool(DS_RANK.match(m["msg"]))
    # DeepSpeed's version line comes before NCCL creates the world communicator, the rest
    # before the first collective.
    lines = _lines(out / "job.log")
    first_coll = next(i for i, x in enumerate(lines) if "NCCL INFO AllGather: opCount" in x)
    first_init = next(i for i, x in enumerate(lines) if " Init START" in x)
    info = next(i for i, x in enumerate(lines) if "DeepSpeed info:" in x)
    dump = next(i for i, x in enumerate(lines) if "DeepSpeedEngine configuration:" in x)
    assert info < first_init < dump < first_coll


def test_memory_reports_match_truth(tmp_path: Path) -> None:
    out, _, doc = _gen(tmp_path, framework="deepspeed", offload="optimizer", **SMALL)
    recs = [m for _, m in _ds_records(out, doc) if m["func"] == "see_memory_usage"]
    assert len(recs) == 3 * len(doc["framework"]["memory_reports"])
    for k, want in enumerate(doc["framework"]["memory_reports"]):
        label, ma, cpu = recs[3 * k : 3 * k + 3]
        assert label["msg"] == want["label"]
        mem = DS_MEM.search(ma["msg"])
        assert mem
        assert ma["msg"].endswith(" GB ")  # the f-string's trailing space (D6)
        assert float(mem["ma"]) == want["ma_gb"]
        assert float(mem["max_ma"]) == want["max_ma_gb"]
        assert int(mem["max_ca"]) == want["max_ca_gb"]
        c = DS_CPU.search(cpu["msg"])
        assert c
        assert (float(c["used"]), float(c["pct"])) == (want["cpu_used_gb"], want["cpu_percent"])
    labels = [r["label"] for r in doc["framework"]["memory_reports"]]
    assert labels[0] == "Stage 3 initialize beginning"
    assert labels[-1] == "After initializing ZeRO optimizer"


# --- DeepSpeed per-step lines ---------------------------------------------------------


@pytest.mark.parametrize("ds_era", ["old", "new"])
@pytest.mark.parametrize("stage", [1, 3])
def test_timer_lines_match_truth(tmp_path: Path, ds_era: str, stage: int) -> None:
    out, truth, doc = _gen(
        tmp_path,
        framework="deepspeed",
        ds_era=ds_era,
        zero_stage=stage,
        launcher="torchrun",
        **{**SMALL, "steps": 7},
    )
    counts, per_line = _timer_counts(out, doc)
    assert dict(counts) == doc["framework"]["timer_lines"]
    steps = truth.steps_completed
    assert counts["fwd_microstep"] == counts["fwd"] == steps == 7
    optimizer = {"optimizer_step"} | (
        {"optimizer_allgather", "optimizer_gradients"} if stage < 3 else set()
    )
    assert {k for k in counts if k.startswith("optimizer_")} == optimizer
    timer_bodies = [m["msg"] for _, m in _ds_records(out, doc) if "time (ms)" in m["msg"]]
    if ds_era == "old":
        assert all("] rank=0 time (ms) | " in f"] {b[9:]}" for b in timer_bodies)
        assert any("forward_microstep: " in b for b in timer_bodies)
    else:
        assert all(b.startswith("[Rank 0] time (ms) | ") for b in timer_bodies)
        assert not any("forward" in b for b in timer_bodies)
    # The parts add up to the step: bwd = bwd_inner + bwd_allreduce (+ a little).
    for values in per_line:
        if "bwd" in values:
            assert values["bwd"] >= values["bwd_inner"] + values["bwd_allreduce"]


def test_straggler_grows_fwd_and_bwd_inner_on_rank_0(tmp_path: Path) -> None:
    kw: dict[str, Any] = {**SMALL, "steps": 12, "framework": "deepspeed", "zero_stage": 3}
    late = 0.05
    base_out, _, base_doc = _gen(tmp_path, "base", **kw)
    slow_out, _, slow_doc = _gen(tmp_path, "slow", faults=(SlowRank(5, late),), **kw)
    layers = SMALL["layers"]
    grow = slow_doc["framework"]["straggler_ms_per_step"]
    # ZeRO-3: one all-gather per layer in forward; an all-gather and a reduce-scatter per
    # layer in backward (inside bwd_inner, overlap_comm); the grad-norm all-reduce in step.
    assert grow["fwd"] == pytest.approx(layers * late * 1000)
    assert grow["bwd_inner"] == pytest.approx(2 * layers * late * 1000)
    assert grow["step"] == pytest.approx(late * 1000)
    assert set(base_doc["framework"]["straggler_ms_per_step"].values()) == {0.0}
    _, base = _timer_counts(base_out, base_doc)
    _, slow = _timer_counts(slow_out, slow_doc)

    def mean(lines: list[dict[str, float]], name: str) -> float:
        return statistics.mean(v[name] for v in lines if name in v)

    for name in ("fwd", "fwd_microstep", "bwd_inner", "step"):
        assert mean(slow, name) - mean(base, name) == pytest.approx(grow[name], abs=8.0)
    # A step is as long on rank 0 as in the NCCL time model: step_time + slots x lateness.
    step_ms = mean(slow, "fwd") + mean(slow, "bwd") + mean(slow, "step")
    slots = 3 * layers + 1
    assert step_ms == pytest.approx((0.5 + slots * late) * 1000, rel=0.03)


def test_throughput_every_steps_per_print(tmp_path: Path) -> None:
    out, _, doc = _gen(tmp_path, framework="deepspeed", steps_per_print=3, **{**SMALL, "steps": 10})
    tputs = [(m, t) for _, m in _ds_records(out, doc) if (t := DS_TPUT.search(m["msg"]))]
    assert [int(t["gstep"]) for _, t in tputs] == doc["framework"]["throughput_steps"] == [3, 6, 9]
    for m, t in tputs:
        assert m["file"] == "timer.py"
        assert m["func"] == "stop"
        assert not DS_RANK.match(m["msg"])  # ThroughputTimer logs without [Rank N]
        assert t["epoch"] == "0"
        assert t["micro"] == t["gstep"]
        assert float(t["cur"]) > 0
    progress = [m["msg"] for _, m in _ds_records(out, doc) if ", skipped=0, lr=[" in m["msg"]]
    assert [int(re.search(r"step=(\d+)", p)[1]) for p in progress] == [0, 3, 6, 9]  # type: ignore[index]


def test_comms_summary_table(tmp_path: Path) -> None:
    out, truth, doc = _gen(
        tmp_path,
        framework="deepspeed",
        comms_summary=True,
        launcher="torchrun",
        **SMALL,
    )
    lines = [x.removeprefix("[default0]:") for x in _lines(out / "job.log")]
    start = next(i for i, x in enumerate(lines) if COMM_HDR.match(x))
    rows = []
    op = None
    for x in lines[start + 1 :]:
        if (r := COMM_ROW.match(x)) and op is not None:
            rows.append({"op": op, "msg_size": r["size"], "count": int(r["count"])})
        elif m := COMM_OP.match(x):
            op = m["op"]
        else:
            break
    assert rows == [
        {"op": r["op"], "msg_size": r["msg_size"], "count": r["count"]}
        for r in doc["framework"]["comms_summary"]
    ]
    # Every world collective was recorded once by the comms logger.
    assert sum(r["count"] for r in rows) == truth.world_instances
    assert {r["op"] for r in rows} == {
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "all_reduce",
    }
    # Printed after training, before the communicators are destroyed.
    destroy = next(i for i, x in enumerate(lines) if "Destroy COMPLETE" in x)
    assert start < destroy


def test_no_comms_summary_after_a_hang(tmp_path: Path) -> None:
    out, _, doc = _gen(
        tmp_path, framework="deepspeed", comms_summary=True, faults=(StopRank(2, 9),), **SMALL
    )
    assert not any(COMM_HDR.match(x) for _, _, x in _all_lines(out, doc))
    assert doc["framework"]["comms_summary"] == []


def test_zero12_collective_program(tmp_path: Path) -> None:
    layers = SMALL["layers"]
    out, truth, doc = _gen(tmp_path, framework="deepspeed", zero_stage=2, **SMALL)
    assert truth.world_instances == SMALL["steps"] * (2 * layers + 1)
    assert SynthSpec(framework="deepspeed", zero_stage=1, layers=layers).world_per_step == 5
    assert truth.calls_by_op == {
        "AllGather": SMALL["steps"] * layers * SMALL["ranks"],
        "ReduceScatter": SMALL["steps"] * layers * SMALL["ranks"],
        "AllReduce": SMALL["steps"] * SMALL["ranks"],
    }
    # One rank's world ops of one step: reduce-scatters, the grad norm, then all-gathers.
    ops = []
    for line in _lines(out / "job.log"):
        m = re.search(r" \[0\] NCCL INFO (\w+): opCount \w+ .*\[nranks=8\]", line)
        if m and line.startswith(f"{doc['ranks'][0]['host']}:{doc['ranks'][0]['pid']}:"):
            ops.append(m[1])
    assert (
        ops[: 2 * layers + 1] == ["ReduceScatter"] * layers + ["AllReduce"] + ["AllGather"] * layers
    )


def test_size_budget_counts_framework_lines(tmp_path: Path) -> None:
    target = 500_000
    out, truth, doc = _gen(
        tmp_path,
        framework="deepspeed",
        target_size_bytes=target,
        ranks=16,
        hosts=2,
        timestamps=True,
    )
    size = sum(f.bytes for f in truth.files)
    assert abs(size - target) / target < 0.05
    assert truth.end_reason == "target_size"
    counts, _ = _timer_counts(out, doc)
    assert counts["fwd"] == truth.steps_completed > 0


# --- PyTorch: a hang ------------------------------------------------------------------


def _strip_rank_prefix(text: str) -> tuple[int | None, str]:
    m = RANKPFX.match(text)
    return (int(m["grank"]), text[m.end() :]) if m else (None, text)


@pytest.mark.parametrize("torch_era", ["2.1", "2.4", "2.7"])
@pytest.mark.parametrize("framework", ["deepspeed", "torch"])
def test_watchdog_lines_of_the_waiting_ranks(
    tmp_path: Path, torch_era: str, framework: str
) -> None:
    stop_rank, at = 5, 14
    out, truth, doc = _gen(
        tmp_path,
        framework=framework,
        torch_era=torch_era,
        launcher="torchrun",
        faults=(StopRank(stop_rank, at),),
        seed=1,
        **SMALL,
    )
    fw = doc["framework"]
    assert truth.end_reason == "hang"
    waiting = sorted(set(range(SMALL["ranks"])) - {stop_rank})
    timeouts = fw["timeouts"]
    assert [t["rank"] for t in timeouts] == waiting
    timeout_s = {"deepspeed": 1800.0, "torch": 1800.0 if torch_era == "2.1" else 600.0}[framework]
    assert fw["timeout_s"] == timeout_s
    lines = _all_lines(out, doc)
    found = []
    for path, no, line in lines:
        tee = TEE.match(line)
        m = WD.search(line)
        # The primary line: [rankG]:, glog header, [Rank r] Watchdog caught ... (the same
        # text inside "terminated with exception" and "what():" lines is not counted).
        if not m or WD_TERM.search(line) or "what():" in line:
            continue
        body = line[tee.end() :] if tee else line
        grank, body = _strip_rank_prefix(body)
        assert (grank is not None) == (torch_era != "2.1")  # [rankG]: from 2.2 on
        g = GLOG.match(body)
        assert g
        assert (g["mmdd"] is not None) == (torch_era != "2.1")  # timestamps from 2.4 on
        assert g["src"] == "ProcessGroupNCCL.cpp"
        found.append((path, no, int(m["rank"]), grank, m))
    assert len(found) == len(waiting)
    by_rank = {t["rank"]: t for t in timeouts}
    for path, no, rank, grank, m in found:
        want = by_rank[rank]
        assert (want["path"], want["line_no"]) == (path, no)
        assert grank in (None, want["global_rank"])
        assert int(m["seq"]) == want["seq"] == at + 1  # SeqNum counts from 1
        assert m["op"] == want["op"]
        assert int(m["nin"]) == want["numel_in"]
        assert int(m["nout"]) == want["numel_out"]
        assert int(m["timeout_ms"]) == round(timeout_s * 1000)
        assert int(m["timeout_ms"]) < int(m["ran_ms"]) < int(m["timeout_ms"]) + 1000
    # The op and count the waiting ranks logged (NCCL COLL lines) for world instance ``at``,
    # the collective the stopped rank never joined.
    (coll,) = {
        (m[1], int(m[2]))
        for _, _, x in lines
        if (m := re.search(rf"NCCL INFO (\w+): opCount {at:x} .* count (\d+) .*\[nranks=8\]", x))
    }
    op_type = {"AllGather": "_ALLGATHER_BASE", "ReduceScatter": "_REDUCE_SCATTER_BASE"}
    assert {t["op"] for t in timeouts} == {op_type.get(coll[0], "ALLREDUCE")}
    n_in, n_out = (coll[1], coll[1] * 8) if coll[0] == "AllGather" else (coll[1] * 8, coll[1])
    assert {(t["numel_in"], t["numel_out"]) for t in timeouts} == {(n_in, n_out)}
    # The stopped rank prints no torch line at all.
    assert not any(f"[Rank {stop_rank}]" in x or f"[rank{stop_rank}]:" in x for _, _, x in lines)
    # Companion lines per era.
    text = "\n".join(x for _, _, x in lines)
    n = len(waiting)
    exc = EXC_DET.findall(text)
    to_at = TO_AT.findall(text)
    fail = FAIL_DET.findall(text)
    if torch_era == "2.1":
        assert exc == to_at == fail == []
        assert "NCCL watchdog thread terminated with exception: " in text
    elif torch_era == "2.4":
        assert len(exc) == len(to_at) == n
        assert set(exc) == set(to_at) == {(str(at + 1), str(at + 1), str(at))}
        assert PG.search(text)["desc"] == "default_pg"  # type: ignore[index]
    else:
        assert len(fail) == n
        assert set(fail) == {(str(at + 1), str(at + 1), str(at))}
        assert "PG ID 0 PG GUID 0(default_pg) Rank " in text
        assert text.count("Stack trace of the failed collective not found") == n
    some = text.count("Some NCCL operations have failed or timed out.")
    assert 1 <= some <= n  # a rank SIGTERMed by its agent first never gets to say it


@pytest.mark.parametrize("torch_era", ["2.1", "2.4", "2.7"])
def test_agents_report_every_rank(tmp_path: Path, torch_era: str) -> None:
    out, _, doc = _gen(
        tmp_path,
        framework="torch",
        torch_era=torch_era,
        launcher="pdsh",
        faults=(StopRank(2, 11),),
        seed=2,
        **SMALL,
    )
    fw = doc["framework"]
    lines = _all_lines(out, doc)
    pid_of = {r["rank"]: r["pid"] for r in doc["ranks"]}
    host_of = {r["rank"]: r["host"] for r in doc["ranks"]}
    failed = {f["rank"] for f in fw["failures"]}
    # Each rank either aborted on its own (-6) and was seen so, or got SIGTERM.
    assert failed | set(fw["terminated"]) == set(range(SMALL["ranks"]))
    assert not failed & set(fw["terminated"])
    assert 2 in fw["terminated"]
    sigterm = [
        (line.split(": ", 1)[0], int(m["pid"]))
        for _, _, line in lines
        if (m := SIGTERM.search(line))
    ]
    assert sorted(pid for _, pid in sigterm) == sorted(pid_of[r] for r in fw["terminated"])
    for host, pid in sigterm:  # printed by the host's own agent (pdsh prefix)
        assert host == host_of[next(r for r, p in pid_of.items() if p == pid)]
    # One "failed (exitcode: -6)" line per host: its root cause.
    agent = [(line, m) for _, _, line in lines if (m := EL_FAILED.search(line))]
    roots = [f for f in fw["failures"] if f["root_cause"]]
    assert len(agent) == len(roots) == SMALL["hosts"]
    for line, m in agent:
        host = line.split(": ", 1)[0]
        root = next(f for f in roots if f["host"] == host)
        assert (int(m["code"]), int(m["lr"]), int(m["pid"])) == (
            -6,
            root["local_rank"],
            root["pid"],
        )
        body = line.split(": ", 1)[1]
        if torch_era == "2.1":
            assert "torch.distributed.elastic.multiprocessing.api: [ERROR] failed" in body
        else:
            g = PYGLOG.match(body)
            assert g
            assert g["src"].endswith("elastic/multiprocessing/api.py")
    # The ChildFailedError blocks: one entry per failed rank, with its rank and exitcode.
    files = {f["path"]: _lines(out / f["path"]) for f in doc["files"]}
    for f in fw["failures"]:
        entry = files[f["path"]][f["line_no"] - 1 : f["line_no"] + 6]
        body = [x.split(": ", 1)[1] if x.startswith(f"{f['host']}: ") else x for x in entry]
        assert re.fullmatch(r"\[\d+\]:", body[0])
        rk = EL_RANK.match(body[3])
        ex = EL_EXIT.match(body[4])
        assert rk
        assert ex
        assert (int(rk["rank"]), int(rk["lr"])) == (f["rank"], f["local_rank"])
        assert (int(ex["code"]), int(ex["pid"])) == (-6, f["pid"])
        assert body[6] == f"  traceback : Signal 6 (SIGABRT) received by PID {f['pid']}"
        heading = "Root Cause (first observed failure):" if f["root_cause"] else "Failures:"
        before = [x.split(": ", 1)[-1] for x in files[f["path"]][: f["line_no"] - 1]]
        last_heading = next(
            x
            for x in reversed(before)
            if x in ("Failures:", "Root Cause (first observed failure):")
        )
        assert last_heading == heading
    text = "\n".join(x for _, _, x in lines)
    assert text.count("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n") == 2


def test_sigtermed_ranks_print_nothing_after_it(tmp_path: Path) -> None:
    out, _, doc = _gen(
        tmp_path,
        framework="torch",
        torch_era="2.4",
        layout="per-rank",
        faults=(StopRank(2, 11),),
        seed=2,
        **SMALL,
    )
    fw = doc["framework"]
    files = {r["rank"]: r["file"] for r in doc["ranks"]}
    pids = {r["pid"]: r["rank"] for r in doc["ranks"]}
    # Agent output in its own file per host, named like NCCL_DEBUG_FILE's %h.%p.log.
    agent_files = [f["path"] for f in doc["files"] if f["path"] not in files.values()]
    assert len(agent_files) == SMALL["hosts"]
    killed_at: dict[int, float] = {}
    for path in agent_files:
        assert re.fullmatch(r"node-\d\.\d+\.log", path)
        for line in _lines(out / path):
            if (m := SIGTERM.search(line)) and (g := PYGLOG.match(line)):
                killed_at[pids[int(m["pid"])]] = _clock(g["time"])
        assert "ChildFailedError" in (out / path).read_text()
    assert sorted(killed_at) == fw["terminated"]

    failed = {f["rank"] for f in fw["failures"]}
    for rank in range(SMALL["ranks"]):
        lines = _lines(out / files[rank])
        text = "\n".join(lines)
        if rank in failed:  # aborted on its own: it got to say why
            assert "terminate called after throwing an instance of 'c10::DistBackendError'" in text
        if rank in killed_at:  # SIGTERM ends a process at once: no line after it
            stamps = [_clock(g["time"]) for x in lines if (g := GLOG.search(x)) and g["time"]]
            assert all(t <= killed_at[rank] + 0.001 for t in stamps)  # agent stamps are ms


def _clock(hms: str) -> float:
    hh, mm, ss = hms.split(":")
    return int(hh) * 3600 + int(mm) * 60 + float(ss)


def test_desync_report_names_the_stopped_rank(tmp_path: Path) -> None:
    stop, at = 5, 14
    out, _, doc = _gen(
        tmp_path,
        framework="deepspeed",
        torch_era="2.4",
        desync_report=True,
        faults=(StopRank(stop, at),),
        **SMALL,
    )
    text = "\n".join(x for _, _, x in _all_lines(out, doc))
    timeouts = [m for m in DESYNC_TO.finditer(text)]
    lags = [m for m in DESYNC_LAG.finditer(text)]
    assert len(timeouts) == len(lags) == SMALL["ranks"] - 1
    assert {int(m["seq"]) for m in timeouts} == {at + 1}
    assert {(m["ranks"], m["s2"], m["s3"]) for m in lags} == {(str(stop), str(at), str(at + 1))}
    assert doc["framework"]["desync_lagging"] == [stop]
    assert (
        f"[{stop}] finished collective #{at}, but didn't join collective #{at + 1} (count from 1)"
        in text
    )


def test_hang_at_the_first_collective(tmp_path: Path) -> None:
    out, _, doc = _gen(
        tmp_path,
        framework="torch",
        desync_report=True,
        faults=(StopRank(3, 0),),
        **SMALL,
    )
    text = "\n".join(x for _, _, x in _all_lines(out, doc))
    assert {t["seq"] for t in doc["framework"]["timeouts"]} == {1}
    assert {t["last_completed"] for t in doc["framework"]["timeouts"]} == {-1}
    assert set(TO_AT.findall(text)) == {("1", "1", "-1")}
    assert "ranks [3] are the lagging ranks that caused this timeout. They never joined" in text
    assert doc["framework"]["desync_lagging"] == [3]


def test_mismatch_hang_every_rank_times_out(tmp_path: Path) -> None:
    out, _, doc = _gen(
        tmp_path,
        framework="torch",
        desync_report=True,
        faults=(Mismatch(rank=2, at_instance=4, field="op"),),
        **SMALL,
    )
    timeouts = {t["rank"]: t for t in doc["framework"]["timeouts"]}
    assert sorted(timeouts) == list(range(SMALL["ranks"]))
    ops = Counter(t["op"] for t in timeouts.values())
    assert len(ops) == 2
    assert ops[timeouts[2]["op"]] == 1  # only the mismatching rank differs
    text = "\n".join(x for _, _, x in _all_lines(out, doc))
    lag = [m for m in DESYNC_LAG.finditer(text)]
    assert lag
    assert {(m["ranks"], m["s1"]) for m in lag} == {("0, 1, 2, 3, 4, 5, 6, 7", "5")}


def test_pg_timeout_option(tmp_path: Path) -> None:
    out, _, doc = _gen(
        tmp_path, framework="torch", pg_timeout_s=120.0, faults=(StopRank(1, 3),), **SMALL
    )
    text = "\n".join(x for _, _, x in _all_lines(out, doc))
    assert set(re.findall(r"Timeout\(ms\)=(\d+)\)", text)) == {"120000"}
    assert {t["timeout_s"] for t in doc["framework"]["timeouts"]} == {120.0}


def test_ib_error_keeps_its_nccl_aftermath_only(tmp_path: Path) -> None:
    out, truth, doc = _gen(tmp_path, framework="torch", faults=(IbError("node-1", 5),), **SMALL)
    assert truth.end_reason == "error"
    assert doc["framework"]["timeouts"] == doc["framework"]["failures"] == []
    assert "Watchdog caught" not in (out / "job.log").read_text()


# --- options and CLI ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"zero_stage": 2}, "framework='deepspeed'"),
        ({"framework": "torch", "offload": "optimizer"}, "framework='deepspeed'"),
        ({"torch_era": "2.1"}, "needs a framework"),
        ({"desync_report": True}, "needs a framework"),
        ({"framework": "deepspeed", "zero_stage": 2, "offload": "param"}, "stage 3"),
        ({"framework": "deepspeed", "zero_stage": 4}, "zero_stage"),
        ({"framework": "torch", "pg_timeout_s": 0.0}, "pg_timeout_s"),
        ({"framework": "deepspeed", "steps_per_print": 0}, "steps_per_print"),
        ({"framework": "pytorch"}, "framework must be"),
    ],
)
def test_framework_validation(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SynthSpec(**kw)


def test_cli_help_lists_the_framework_options() -> None:
    result = CliRunner().invoke(synth, ["--help"])
    assert result.exit_code == 0
    for text in (
        "--framework [none|deepspeed|torch]",
        "--zero-stage [1|2|3]",
        "--offload [none|optimizer|param|both]",
        "--ds-era [old|new]",
        "--torch-era [2.1|2.4|2.7]",
        "--pg-timeout SECONDS",
        "--steps-per-print N",
        "--comms-summary",
        "--desync-report",
        "--framework deepspeed --zero-stage 3",
    ):
        assert text in result.output


def test_cli_framework_run(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    result = CliRunner().invoke(
        synth,
        [
            "--out", str(out), "--ranks", "8", "--hosts", "2", "--steps", "4", "--layers", "2",
            "--framework", "deepspeed", "--zero-stage", "2", "--offload", "optimizer",
            "--ds-era", "old", "--torch-era", "2.7", "--pg-timeout", "300",
            "--steps-per-print", "2", "--desync-report", "--stop-rank", "3:12",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "deepspeed" in result.output
    assert "7 watchdog timeouts" in result.output
    doc = json.loads((out / "truth.json").read_text())
    fw = doc["framework"]
    assert fw["name"] == "deepspeed"
    assert fw["zero"]["stage"] == 2
    assert fw["zero"]["offload_optimizer"] == "cpu"
    assert fw["deepspeed_version"].startswith("0.9.")
    assert fw["torch_era"] == "2.7"
    assert fw["timeout_s"] == 300.0
    assert fw["throughput_steps"] == [2]
    assert doc["spec"]["framework"] == "deepspeed"
    bad = CliRunner().invoke(synth, ["--out", str(tmp_path / "x"), "--zero-stage", "1"])
    assert bad.exit_code == 2
    assert "framework='deepspeed'" in bad.output


def test_truth_framework_schema(tmp_path: Path) -> None:
    _, _, ds = _gen(tmp_path, "ds", framework="deepspeed", faults=(StopRank(1, 9),), **SMALL)
    _, _, pt = _gen(tmp_path, "pt", framework="torch", faults=(StopRank(1, 9),), **SMALL)
    common = {
        "name",
        "torch_era",
        "torch_version",
        "timeout_s",
        "lines",
        "timer_lines",
        "straggler_ms_per_step",
        "throughput_steps",
        "memory_reports",
        "comms_summary",
        "timeouts",
        "failures",
        "terminated",
        "desync_lagging",
    }
    deepspeed_only = {"deepspeed_version", "zero", "steps_per_print", "train_batch_size"}
    assert set(ds["framework"]) == common | deepspeed_only
    assert set(pt["framework"]) == common
    assert pt["framework"]["timer_lines"] == {}
    assert set(ds["framework"]["zero"]) == {
        "stage",
        "offload_optimizer",
        "offload_param",
        "overlap_comm",
        "reduce_bucket_size",
        "allgather_bucket_size",
    }
    assert set(ds["framework"]["timeouts"][0]) >= {
        "rank",
        "global_rank",
        "seq",
        "op",
        "numel_in",
        "numel_out",
        "timeout_s",
    }
    assert set(ds["framework"]["failures"][0]) >= {
        "rank",
        "local_rank",
        "host",
        "exitcode",
        "signal",
        "root_cause",
    }
    per_host: dict[str, int] = defaultdict(int)
    for f in ds["framework"]["failures"]:
        per_host[f["host"]] += f["root_cause"]
    assert set(per_host.values()) == {1}
