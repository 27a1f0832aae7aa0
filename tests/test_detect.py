"""Detectors against synthetic jobs whose faults are known (``synth`` imports no parser).

Each test writes a small job with one injected fault (or none), analyses it and checks
the findings name the culprit the generator injected, and that healthy jobs get no
finding of severity warning or above.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from ncclscope.analysis import Diagnosis, run_analysis
from ncclscope.cli import cli
from ncclscope.detect import Context
from ncclscope.detect.base import ranks_text, severity_at_least
from ncclscope.detect.timeout import countdown
from ncclscope.findings import Finding
from ncclscope.synth import (
    DeadProcess,
    ExtraCollective,
    IbError,
    Mismatch,
    SlowRank,
    StopRank,
    SynthSpec,
    generate,
)


def _analyse(tmp_path: Path, spec: SynthSpec) -> Diagnosis:
    out = tmp_path / "job"
    generate(spec, out)
    return run_analysis([str(out)], workdir=tmp_path / "work")


def _serious(a: Diagnosis) -> list[str]:
    return [
        f"{f.kind}: {f.message}" for f in a.findings if severity_at_least(f.severity, "warning")
    ]


@pytest.mark.parametrize(
    ("era", "timestamps", "layout", "launcher"),
    [
        ("2.27", True, "combined", "torchrun"),
        ("2.27", False, "per-rank", "none"),
        ("2.21", False, "combined", "srun"),
        ("2.18", False, "combined", "pdsh"),
        ("2.7", False, "per-rank", "none"),
    ],
)
def test_healthy_jobs_get_no_warning(
    tmp_path: Path, era: str, timestamps: bool, layout: str, launcher: str
) -> None:
    spec = SynthSpec(
        ranks=16,
        hosts=2,
        steps=6,
        era=era,  # type: ignore[arg-type]
        timestamps=timestamps,
        layout=layout,  # type: ignore[arg-type]
        launcher=launcher,  # type: ignore[arg-type]
        seed=11,
        benign_warns=2,
    )
    a = _analyse(tmp_path, spec)
    assert _serious(a) == []
    # The benign IB events are reported, as info.
    infos = [f for f in a.findings if f.kind == "nccl_error"]
    assert infos
    assert all(f.severity == "info" for f in infos)


@pytest.mark.parametrize("slow", [[5], [3, 12], [0, 9, 14]])
def test_stragglers_are_named(tmp_path: Path, slow: list[int]) -> None:
    faults = tuple(SlowRank(rank=r, lateness_s=0.004 + 0.002 * k) for k, r in enumerate(slow))
    spec = SynthSpec(ranks=16, hosts=2, steps=8, era="2.27", timestamps=True, seed=3, faults=faults)
    a = _analyse(tmp_path, spec)
    found = sorted(r for f in a.findings if f.kind == "straggler" for r in f.ranks)
    assert found == sorted(slow)
    for f in a.findings:
        if f.kind == "straggler":
            assert f.op == "AllGather"  # it gates every layer: reported first
            assert f.evidence["slowdown"] >= 0.05
            assert f.cost_gpu_s is not None
            assert f.cost_gpu_s > 0
            assert f.lines  # a COLL line of the straggler, quoted
            assert (
                f"[{f.ranks[0] % 8}] NCCL INFO"
                in a.quoted[(f.lines[0].file_id, f.lines[0].line_no)]
            )


def test_no_straggler_without_timestamps(tmp_path: Path) -> None:
    spec = SynthSpec(ranks=8, hosts=1, steps=6, seed=3, faults=(SlowRank(rank=2, lateness_s=0.02),))
    a = _analyse(tmp_path, spec)
    assert not [f for f in a.findings if f.kind == "straggler"]
    assert any("carry no time" in f.message for f in a.findings if f.kind == "config")


@pytest.mark.parametrize("layout", ["combined", "per-rank"])
def test_missing_rank_hang(tmp_path: Path, layout: str) -> None:
    """With the watchdog's reports, the hang is certain and rank 9 (behind on the world
    communicator, and the one rank that reported no timeout) is the culprit."""
    spec = SynthSpec(
        ranks=16,
        hosts=2,
        steps=4,
        era="2.21",
        layout=layout,  # type: ignore[arg-type]
        seed=8,
        framework="torch",
        faults=(StopRank(rank=9, at_instance=23),),
    )
    a = _analyse(tmp_path, spec)
    hangs = [f for f in a.findings if f.kind == "hang"]
    assert len(hangs) == 1
    h = hangs[0]
    # Per rank, the culprit's own file ends at its last collective, before the others'
    # reports: it could not have shown one, so its silence is weaker evidence (warning);
    # in a combined log it would have (critical).
    severity = "critical" if layout == "combined" else "warning"
    assert (h.ranks, h.seq, h.hang_class, h.severity) == ([9], 23, "missing_rank", severity)
    if layout == "per-rank":
        assert h.evidence["log_ends_at_stall"] == [9]
        assert h.evidence["culprit_basis"] == "last_seen"
    else:
        assert h.evidence["culprit_basis"] == "non_reporting_member"
    assert h.hosts == ["node-1"]
    assert h.evidence["waiting_ranks"] == [r for r in range(16) if r != 9]
    assert h.evidence["culprit_last"][0]["last_seq"] == 22
    assert "watchdog_timeout" in h.evidence["stop_evidence"]


def test_nccl_lines_that_end_are_not_a_hang(tmp_path: Path) -> None:
    """The same stop without any line that says the job stopped (NCCL lines only, no
    timestamps): the log may simply have been copied mid-run.  Said as info, nobody
    blamed, rank 9 only in ``waited_for`` (this used to be a critical hang on rank 9)."""
    spec = SynthSpec(
        ranks=16, hosts=2, steps=4, era="2.21", seed=8, faults=(StopRank(rank=9, at_instance=23),)
    )
    a = _analyse(tmp_path, spec)
    assert _serious(a) == []
    (h,) = [f for f in a.findings if f.kind == "hang"]
    assert (h.severity, h.ranks, h.seq) == ("info", [], 23)
    assert h.evidence["waited_for"] == [9]
    assert h.evidence["stop_evidence"] == []
    assert "log ends mid-run" in h.message


@pytest.mark.parametrize("field", ["op", "count", "dtype"])
def test_mismatch_hang(tmp_path: Path, field: str) -> None:
    spec = SynthSpec(
        ranks=8,
        hosts=1,
        steps=4,
        seed=2,
        faults=(Mismatch(rank=6, at_instance=17, field=field),),  # type: ignore[arg-type]
    )
    a = _analyse(tmp_path, spec)
    m = [f for f in a.findings if f.kind == "mismatch"]
    assert len(m) == 1
    assert (m[0].ranks, m[0].seq, m[0].hang_class) == ([6], 17, "mismatch")
    assert m[0].evidence["differs_in"] == [field]
    assert not [f for f in a.findings if f.kind == "hang"]  # the mismatch is the story


def test_mismatch_the_job_survived(tmp_path: Path) -> None:
    spec = SynthSpec(
        ranks=8,
        hosts=2,
        steps=4,
        seed=2,
        faults=(Mismatch(rank=1, at_instance=9, field="count", hang=False),),
    )
    a = _analyse(tmp_path, spec)
    m = [f for f in a.findings if f.kind == "mismatch"]
    assert [(f.ranks, f.seq, f.evidence["hung"], f.hang_class) for f in m] == [
        ([1], 9, False, None)
    ]


def test_ib_error_is_the_root_cause(tmp_path: Path) -> None:
    spec = SynthSpec(
        ranks=16,
        hosts=2,
        steps=4,
        era="2.21",
        seed=5,
        faults=(IbError(host="node-1", at_instance=20),),
    )
    a = _analyse(tmp_path, spec)
    errors = [f for f in a.findings if f.kind == "nccl_error"]
    root = [f for f in errors if f.evidence["root_cause"]]
    assert len(root) == 1
    assert root[0].severity == "critical"
    assert root[0].hosts == ["node-1"]
    assert root[0].evidence["error_kind"] == "ib_completion"
    assert all(f.severity != "critical" for f in errors if f is not root[0])


def test_countdown(tmp_path: Path) -> None:
    """What the agent will call live: the age of the half-entered collective at "now"."""
    spec = SynthSpec(
        ranks=8, hosts=2, steps=3, era="2.27", timestamps=True, seed=6,
        faults=(StopRank(rank=4, at_instance=11),),
    )  # fmt: skip
    a = _analyse(tmp_path, spec)
    ctx = Context(a.analysis)
    first = countdown(ctx, ctx.last_ts, 600.0).row(0, named=True)  # type: ignore[arg-type]
    later = first["since"] + timedelta(minutes=9, seconds=12)
    row = countdown(ctx, later, 600.0).row(0, named=True)
    assert (row["seq"], row["culprit_ranks"], row["op"]) == (11, [4], first["op"])
    assert row["entered_ranks"] == [0, 1, 2, 3, 5, 6, 7]
    assert row["age_s"] == pytest.approx(552.0)
    assert row["left_s"] == pytest.approx(48.0)
    assert countdown(ctx, later, None)["left_s"].to_list() == [None]
    healthy = _analyse(tmp_path / "ok", SynthSpec(ranks=8, hosts=2, steps=3, seed=6))
    hctx = Context(healthy.analysis)
    assert countdown(hctx, later, 600.0).is_empty()


def test_fail_on(tmp_path: Path) -> None:
    hung = tmp_path / "hung"
    # The watchdog's reports make the hang certain (NCCL lines that merely end are info).
    spec = SynthSpec(ranks=4, hosts=1, steps=2, seed=1, framework="torch", faults=(StopRank(2, 5),))
    generate(spec, hung)
    ok = tmp_path / "ok"
    generate(SynthSpec(ranks=4, hosts=1, steps=2, seed=1), ok)
    runner = CliRunner()
    for path, severity, code in [
        (hung, "critical", 3),
        (hung, "warning", 3),
        (ok, "warning", 0),
        (ok, "info", 3),  # "timestamps would help" is an info finding
    ]:
        result = runner.invoke(cli, ["analyze", str(path), "--fail-on", severity])
        assert result.exit_code == code, (path.name, severity, result.output)
    text = runner.invoke(cli, ["analyze", str(hung)]).output
    assert text.index("FINDINGS") < text.index("JOB")
    assert "rank 2 never joined" in text


def test_findings_order_and_ranks_text(tmp_path: Path) -> None:
    assert ranks_text([7, 1, 2, 3, 5]) == "1-3, 5, 7"
    # Most severe first, then most costly (no cost last among equals).
    made = [
        Finding("config", "info", "a", cost_gpu_s=5.0),
        Finding("straggler", "warning", "b", cost_gpu_s=1.0),
        Finding("hang", "critical", "c"),
        Finding("straggler", "warning", "d", cost_gpu_s=9.0),
        Finding("hang", "critical", "e", cost_gpu_s=2.0),
    ]
    assert [f.message for f in sorted(made, key=Finding.order)] == ["e", "c", "d", "b", "a"]
    # A job's findings come out in that order, not the order the detectors ran in
    # (config's, info, run first).
    spec = SynthSpec(ranks=4, hosts=1, steps=2, seed=1, framework="torch", faults=(StopRank(2, 5),))
    a = _analyse(tmp_path, spec)
    got = [(f.kind, f.severity, f.cost_gpu_s) for f in a.findings]
    assert got[0][:2] == ("hang", "critical"), got
    assert {s for _k, s, _c in got} >= {"critical", "info"}, got
    keys = [Finding.order(f) for f in a.findings]
    assert keys == sorted(keys), got


def test_detectors_read_the_collectives_a_bounded_number_of_times(tmp_path: Path) -> None:
    """A healthy job: the sample is the only read of the collectives table."""
    spec = SynthSpec(ranks=16, hosts=2, steps=6, era="2.27", timestamps=True, seed=2)
    a = _analyse(tmp_path, spec)
    reads: list[str] = []
    collectives = a.analysis.collectives
    assert collectives is not None

    class Counting(Context):
        def collectives(self) -> pl.LazyFrame | None:
            reads.append("read")
            return super().collectives()

    from ncclscope.detect import DETECTORS

    ctx = Counting(a.analysis)
    for d in DETECTORS.values():
        d.policy(d.metric(ctx), ctx)
    assert len(reads) == 1


def test_config_doctor_reads_the_job_s_configuration(tmp_path: Path) -> None:
    """A ZeRO-3 job with CPU offload, edited as a user's config would differ: offload
    without pinned memory, no wall-clock timers, and NCCL over sockets across 2 nodes."""
    out = tmp_path / "job"
    generate(
        SynthSpec(
            ranks=16, hosts=2, steps=3, framework="deepspeed", zero_stage=3,
            offload="optimizer", era="2.18", seed=1,
        ),
        out,
    )  # fmt: skip
    log = out / "job.log"
    text = log.read_text()
    assert "pin_memory=True" in text
    assert "wall_clock_breakdown ......... True" in text
    edited = [
        line.replace("pin_memory=True", "pin_memory=False")
        .replace("wall_clock_breakdown ......... True", "wall_clock_breakdown ......... False")
        .replace("via NET/IB/0/GDRDMA", "via NET/Socket/0")
        .replace("via NET/IB/3/GDRDMA", "via NET/Socket/0")
        for line in text.splitlines(keepends=True)
        if "time (ms)" not in line and "NET/IB" not in line.replace("via NET/IB", "")
    ]
    log.write_text("".join(edited))
    a = run_analysis([str(out)], workdir=tmp_path / "work")
    config = {f.message.split(":")[0]: f for f in a.findings if f.kind == "config"}
    hazards = sorted(m for m, f in config.items() if f.severity == "warning")
    assert any(m.startswith("offload_optimizer to cpu without pinned host memory") for m in hazards)
    assert any(m.startswith("ZeRO-3 across nodes over TCP sockets only") for m in hazards)
    assert "DeepSpeed ran without its wall-clock timers" in config
    pinned = next(f for m, f in config.items() if m.startswith("offload_optimizer"))
    assert "pin_memory=False" in pinned.evidence["detail"]


def test_timeout_shorter_than_a_wait_is_a_hazard(tmp_path: Path) -> None:
    """A 2 s timeout (stated by the watchdog) on a job whose slow rank makes every
    collective wait tens of milliseconds is fine; one shorter than twice the longest
    wait is not."""
    spec = SynthSpec(
        ranks=8, hosts=1, steps=3, era="2.27", timestamps=True, seed=4, framework="torch",
        pg_timeout_s=0.05,
        faults=(SlowRank(rank=1, lateness_s=0.04), StopRank(rank=2, at_instance=30)),
    )  # fmt: skip
    a = _analyse(tmp_path, spec)
    hazards = [f for f in a.findings if f.kind == "config" and f.severity == "warning"]
    assert any("collective timeout" in f.message for f in hazards), [f.message for f in a.findings]


def test_extra_collective(tmp_path: Path) -> None:
    """Rank 3 calls one AllReduce more than everyone: it runs one ahead, the others wait."""
    spec = SynthSpec(
        ranks=16, hosts=2, steps=4, era="2.21", seed=3, faults=(ExtraCollective(3, 9),)
    )
    a = _analyse(tmp_path, spec)
    serious = [f for f in a.findings if severity_at_least(f.severity, "warning")]
    assert [(f.kind, f.ranks, f.seq, f.hang_class) for f in serious] == [
        ("hang", [3], 9, "mismatch")
    ]
    text = a.quoted[(serious[0].lines[0].file_id, serious[0].lines[0].line_no)]
    assert "[3] NCCL INFO AllReduce: opCount 9 " in text  # the extra call, quoted first


@pytest.mark.parametrize("layout", ["combined", "per-rank"])
def test_dead_process(tmp_path: Path, layout: str) -> None:
    """Rank 12 is SIGKILLed; each host's torchrun agent names its own root cause, and the
    job's is the earliest: the dead rank, not the other host's watchdog abort."""
    spec = SynthSpec(
        ranks=16,
        hosts=2,
        steps=4,
        era="2.21",
        seed=3,
        layout=layout,  # type: ignore[arg-type]
        framework="torch",
        faults=(DeadProcess(12, 20),),
    )
    a = _analyse(tmp_path, spec)
    hang = next(f for f in a.findings if f.kind == "hang")
    assert (hang.ranks, hang.seq, hang.hang_class) == ([12], 20, "dead_process")
    assert hang.evidence["failure"]["signal"] == "SIGKILL"
    assert hang.evidence["failure"]["exitcode"] == -9
