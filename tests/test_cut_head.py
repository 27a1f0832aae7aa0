"""Hangs in logs cut at the head (#28, "Logs cut at the head"): the culprit is named
wherever the kept lines hold every waiting member's watchdog report and the culprit's
own last collective, whatever the cut took before them (the init lines, a file's first
part, each file at another point); it is withheld only where a cut crosses a member's
report, and the finding then says which inputs limited it.

Jobs from ``tests/jobgen.py`` (written from the format notes, not from the parsers):
PyTorch watchdog hangs and hangs in a sub-group, per-host, per-rank and srun-combined
layouts, NCCL 2.7 / 2.21 (no times) and 2.27 (timed), each cut one of three ways.
"""

from __future__ import annotations

import random
import re
import tempfile
from pathlib import Path
from typing import Any

import jobgen
import pytest

from ncclscope.analysis import run_analysis
from ncclscope.export.json_report import to_json_dict
from ncclscope.synth import Mismatch, SynthSpec, generate

#: Jobs per kind: enough for every layout, era and cut to meet (the whole class is
#: measured over 400 jobs by ``benchmarks/bench_cut_head.py``).
JOBS = 16
KINDS = ("hang_watchdog", "multi_pg", "restart_hang")
CUTS = ("per_file", "job_head", "one_file")


def analyse(files: jobgen.Files) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cut-head-") as tmp:
        logs = jobgen.write_files(files, Path(tmp) / "logs")
        return to_json_dict(run_analysis([str(logs)], workdir=Path(tmp) / "work"))


def cut_head(rng: random.Random, job: jobgen.Job, how: str) -> jobgen.Files:
    """Each file cut at its own point, the job cut at one time, or one file cut."""
    files = job.files
    names = sorted(files)
    if how == "per_file":
        for name in names:
            files = jobgen.cut_lines(files, rng.uniform(0.0, 0.97), 1.0, only=name)
    elif how == "job_head":
        files = jobgen.cut_time(files, rng.uniform(0.05, 0.97), 1.0)
    else:
        files = jobgen.cut_lines(files, rng.uniform(0.3, 0.99), 1.0, only=rng.choice(names))
    return files


def reports_kept(job: jobgen.Job, cut: jobgen.Files) -> bool:
    """The kept lines hold every watchdog report of the job, the culprit's last
    collective before the stall (its own picture: it stopped there), and, with several
    process groups, the init lines that say who is in which."""
    kept = jobgen.kept_uids(cut)
    lines = [ln for v in job.files.values() for ln in v]
    culprits = set(job.truth["culprit_ranks"])
    reports = {ln.uid for ln in lines if ln.tag == "watchdog"}
    last: dict[int, jobgen.Line] = {}
    stall = job.truth.get("stall_true")
    if stall is None:  # a restart: the first run's hang, judged by jobgen.evidence_kept
        return bool(reports) and reports <= kept and jobgen.evidence_kept(job, cut)
    for ln in lines:
        if ln.tag == "coll" and ln.rank in culprits and ln.t <= stall + 1:
            if ln.rank not in last or ln.t >= last[ln.rank].t:
                last[ln.rank] = ln
    if job.spec.kind == "multi_pg":
        init = {ln.uid for ln in lines if ln.tag == "init"}
        if not init <= kept:
            return False
    return (
        bool(reports)
        and reports <= kept
        and set(last) == culprits
        and all(ln.uid in kept for ln in last.values())
    )


def _cases() -> list[Any]:
    return [pytest.param(kind, k, id=f"{kind}-{k}") for kind in KINDS for k in range(JOBS)]


@pytest.mark.parametrize(("kind", "k"), _cases())
def test_cut_head_hang(kind: str, k: int) -> None:
    rng = random.Random(f"cut-head:{kind}:{k}")
    job = jobgen.generate(jobgen.random_spec(rng, kind, max_ranks=32))
    how = CUTS[k % len(CUTS)]
    cut = cut_head(rng, job, how)
    doc = analyse(cut)
    culprits = set(job.truth["culprit_ranks"])
    verdict = jobgen.judge(doc, culprits)
    where = f"{kind} {job.spec.layout} {job.spec.era} cut {how}"
    assert not verdict.wrong, f"{where}: wrong culprit: {verdict.describe()}"
    if reports_kept(job, cut):
        assert verdict.named, f"{where} kept every report: {verdict.describe()}"
    hangs = [f for f in doc["findings"] if f["kind"] in ("hang", "timeout")]
    for f in hangs:
        withheld = f["evidence"].get("withheld")
        if withheld and f["evidence"].get("log_ends_early"):
            # a rank's report may have been cut away: the finding says whose input
            assert f["evidence"]["limited_by"], f"{where}: {f['message']}"
            assert "limited by" in f["message"], f["message"]


# --------------------------------------------------------------------------- by hand


def _report(rank: int, seq: int, numel_in: int, numel_out: int, prefix: str = "") -> list[str]:
    pre = f"{prefix}[rank{rank}]:"
    return [
        f"{pre}[E0314 09:10:05.96{rank}642537 ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog "
        f"caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=_ALLGATHER_BASE, "
        f"NumelIn={numel_in}, NumelOut={numel_out}, Timeout(ms)=600000) ran for 600164 "
        "milliseconds before timing out.",
        f"{pre}[E0314 09:10:05.96{rank}942537 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank "
        f"{rank}] Exception (either an error or timeout) detected by watchdog at work: {seq}, "
        f"last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}.",
        f"{pre}[E0314 09:10:05.96{rank}992537 ProcessGroupNCCL.cpp:630] [PG 0 (default_pg) Rank "
        f"{rank}] To avoid data inconsistency, we are taking the entire process down.",
    ]


def _run(tmp_path: Path, files: dict[str, list[str]]) -> dict[str, Any]:
    logs = tmp_path / "logs"
    logs.mkdir()
    for name, lines in files.items():
        (logs / name).write_text("".join(ln + "\n" for ln in lines))
    return to_json_dict(run_analysis([str(logs)], workdir=tmp_path / "work"))


def _hang(doc: dict[str, Any]) -> dict[str, Any]:
    return next(f for f in doc["findings"] if f["kind"] == "hang")


def test_a_log_starting_at_a_companion_line_began_inside_the_reports(tmp_path: Path) -> None:
    """The kept lines start with rank 7's companion lines, its timeout line cut away:
    ranks 1, 3, 5 and 7 reported in an 8-rank group, and ranks 0, 2, 4 and 6 may only
    have lost their reports to the cut; the finding names the file that limited it."""
    lines = _report(7, 61, 1024, 8192, prefix="7: ")[1:]
    for rank in (3, 5, 1):
        lines += _report(rank, 61, 1024, 8192, prefix=f"{rank}: ")
    doc = _run(tmp_path, {"job.log": lines})
    hang = _hang(doc)
    assert hang["ranks"] == [], hang["message"]
    assert "begin or end inside the watchdog reports" in hang["message"]
    assert hang["evidence"]["limited_by"][0]["path"].endswith("job.log")
    assert "limited by job.log" in hang["message"]


def test_the_same_block_whole_names_the_silent_member(tmp_path: Path) -> None:
    """The control: the same block whole (DeepSpeed's timers before it, the launcher's
    closing signal after), with sizes as PyTorch prints them (NumelOut = NumelIn x 4):
    rank 2, the one member of the 4-rank group with no report, is named."""
    lines = [
        "[2025-03-14 09:00:01,384] [INFO] [logging.py:96:log_dist] [Rank 0] rank=0 time (ms) "
        "| forward_microstep: 412.87 | backward_microstep: 771.35"
    ]
    for rank in (0, 1, 3):
        lines += _report(rank, 61, 1024, 4096)
    lines.append(
        "torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 9 "
        "closing signal SIGTERM"
    )
    doc = _run(tmp_path, {"job.log": lines})
    assert _hang(doc)["ranks"] == [2], _hang(doc)["message"]


def test_a_size_its_reports_contradict_is_no_size(tmp_path: Path) -> None:
    """A whole block whose NumelOut is written equal to NumelIn: read as a group of one
    rank, ranks 1, 3, 5 and 7 reporting made rank 0 "the one member that did not
    report" (named, where srun's prefixes make the stream the job's).  A size below the
    highest reporting rank is no size: the members are unknown, nobody is named."""
    lines = [
        "[2025-03-14 09:00:01,384] [INFO] [logging.py:96:log_dist] [Rank 0] rank=0 time (ms) "
        "| forward_microstep: 412.87 | backward_microstep: 771.35"
    ]
    for rank in (7, 3, 5, 1):
        lines += _report(rank, 61, 3145728, 3145728, prefix=f"{rank}: ")  # srun -l
    lines.append(
        "torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 9 "
        "closing signal SIGTERM"
    )
    doc = _run(tmp_path, {"job.log": lines})
    hang = _hang(doc)
    assert hang["ranks"] == [], hang["message"]
    assert "non_reporting" not in hang["evidence"], hang["evidence"]
    assert "the group's members are not in the logs" in hang["message"]


# --------------------------------------------------------------------------- mismatch


def cut_past_init(rng: random.Random, whole: Path, out: Path, at: int) -> Path:
    """Each log of ``whole`` cut at the head somewhere between its last init line and
    the first call at opCount ``at``, written to ``out``."""
    out.mkdir()
    for log in sorted(whole.glob("*.log")):
        lines = log.read_text().splitlines(keepends=True)
        init = [i for i, ln in enumerate(lines) if "commId" in ln or "Init COMPLETE" in ln]
        colls = [i for i, ln in enumerate(lines) if re.search(rf"opCount {at:x} ", ln)]
        start = (init[-1] + 1) if init else 0
        stop = min(colls) if colls else len(lines)
        keep_from = rng.randrange(start, max(start + 1, stop))
        (out / log.name).write_text("".join(lines[keep_from:]))
    return out


MISMATCH_CASES = [
    (field, era, layout, seed)
    for field in ("op", "count", "dtype")
    for era, layout in (("2.21", "combined"), ("2.27", "per-rank"), ("2.18", "combined"))
    for seed in (1, 2)
]


@pytest.mark.parametrize(("field", "era", "layout", "seed"), MISMATCH_CASES)
def test_a_mismatch_cut_past_its_init_lines_names_both_sides(
    tmp_path: Path, field: str, era: str, layout: str, seed: int
) -> None:
    """Every file cut at the head somewhere between its last init line and the
    mismatched collective: the communicator is matched by order, no member's rank in it
    known.  The mismatch is still found with both sides' op, count and datatype from the
    COLL lines that remain; the culprit is its process, named by job rank only where a
    kept line gives it, never anyone else."""
    rng = random.Random(f"mismatch:{field}:{era}:{layout}:{seed}")
    culprit = rng.randrange(8)
    at = rng.randrange(14, 22)
    spec = SynthSpec(
        ranks=8,
        hosts=2,
        steps=3,
        era=era,
        layout=layout,
        launcher="torchrun" if layout == "combined" else "none",
        seed=seed,
        faults=(Mismatch(rank=culprit, at_instance=at, field=field),),  # type: ignore[arg-type]
    )
    whole = tmp_path / "whole"
    generate(spec, whole)
    cut = cut_past_init(rng, whole, tmp_path / "cut", at)
    doc = to_json_dict(run_analysis([str(cut)], workdir=tmp_path / "work"))
    found = [f for f in doc["findings"] if f["kind"] == "mismatch"]
    assert found, [f["message"] for f in doc["findings"]]
    calls = found[0]["evidence"]["culprit_calls"]
    expected = found[0]["evidence"]["expected"]
    assert expected is not None, found[0]["message"]
    text = found[0]["message"]
    for call in (*calls, expected):
        assert call["op"] in text, text
        assert f"count {call['count']:,}" in text, text
    assert found[0]["ranks"] in ([], [culprit]), text
    verdict = jobgen.judge(doc, {culprit})
    assert not verdict.wrong, verdict.describe()


def test_the_launcher_s_summary_gives_the_cut_process_its_rank(tmp_path: Path) -> None:
    """The same cut, with torchrun's failure summary after it listing the culprit's
    process (``rank : 5`` ... ``(pid: N)``): the worker torchrun started is the process
    that called NCCL, so the mismatch names rank 5, not only its pid."""
    spec = SynthSpec(
        ranks=8, hosts=2, steps=3, era="2.21", layout="combined", launcher="torchrun", seed=3,
        faults=(Mismatch(rank=5, at_instance=17, field="count"),),
    )  # fmt: skip
    whole = tmp_path / "whole"
    generate(spec, whole)
    (log,) = sorted(whole.glob("*.log"))
    lines = log.read_text().splitlines(keepends=True)
    proc = next(
        m for ln in lines if (m := re.search(r"\]:(\S+):(\d+):\d+ \[\d\] .* rank 5 nranks 8 ", ln))
    )
    host, pid = proc.group(1), int(proc.group(2))
    last_init = max(i for i, ln in enumerate(lines) if "Init COMPLETE" in ln)
    summary = [
        "=" * 60,
        "train.py FAILED",
        "-" * 60,
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "-" * 60,
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2025-03-14_09:10:07",
        f"  host      : {host}",
        "  rank      : 5 (local_rank: 1)",
        f"  exitcode  : -6 (pid: {pid})",
        "  error_file: <N/A>",
        f"  traceback : Signal 6 (SIGABRT) received by PID {pid}",
        "=" * 60,
    ]
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / log.name).write_text("".join(lines[last_init + 1 :]) + "\n".join(summary) + "\n")
    doc = to_json_dict(run_analysis([str(cut)], workdir=tmp_path / "work"))
    (found,) = [f for f in doc["findings"] if f["kind"] == "mismatch"]
    assert found["ranks"] == [5], found["message"]
    assert (
        found["message"].startswith("rank 5 called AllReduce")
        or "rank 5 called" in found["message"]
    )


def test_a_damaged_group_size_lists_a_few_limits_not_a_million(tmp_path: Path) -> None:
    """Fuzz #28: an all-gather whose NumelOut says 2^19 ranks made every one of them a
    silent member, and listing each one's inputs took minutes.  A few are listed, the
    rest counted."""
    lines = [
        "[2025-03-14 09:00:01,384] [INFO] [logging.py:96:log_dist] [Rank 0] rank=0 time (ms) "
        "| forward_microstep: 412.87 | backward_microstep: 771.35"
    ]
    for rank in (0, 1, 2):
        lines += _report(rank, 61, 1024, 1024 * 2**19)
    lines.append(
        "torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 9 "
        "closing signal SIGTERM"
    )
    hang = _hang(_run(tmp_path, {"job.log": lines}))
    assert hang["ranks"] == [], hang["message"]
    assert "3-524287 did not report" in hang["message"], hang["message"]
    assert len(hang["evidence"]["limited_by"]) <= 9
