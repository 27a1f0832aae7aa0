"""The straggler from Inspector's execution times, beyond one rank all along (issue #28):
a stretch of the run, a whole node, a sub-communicator's straggler with the world's
calls recorded too, and no finding on healthy output (noise, one outlier collective).

Each class runs over generated variants (seeds, sizes, rates of missing records) and
must be right in at least 95% of them and never wrong; each also fails with the
feature that names it taken out.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from functools import cache
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from ncclscope.cli import cli
from ncclscope.detect import exec_straggler as es
from ncclscope.detect.context import Context
from ncclscope.parsers.tools.inspector import read_inspector_text
from ncclscope.synth.inspector import InspectorJob, inspector_files, write_job

CLASSES = ("window", "node", "subcomm", "healthy")
VARIANTS = 12


def _rows(job: InspectorJob) -> pl.DataFrame:
    files = sorted(inspector_files(job).items())
    return pl.concat(
        [
            read_inspector_text(text, name).rows.with_columns(pl.lit(k, pl.UInt32).alias("file_id"))
            for k, (name, text) in enumerate(files)
        ]
    )


def _job(cls: str, k: int) -> InspectorJob:
    rng = random.Random(f"{cls}-{k}")
    nranks = rng.choice((8, 16))
    per_host = rng.choice((2, 4))
    start = rng.uniform(0.0, 2 / 3)
    healthy = cls == "healthy"
    sub = cls == "subcomm" or (healthy and k % 2 == 1)
    return InspectorJob(
        nranks=nranks,
        ranks_per_host=per_host,
        collectives=rng.randint(120, 180),
        straggler=rng.randrange(nranks) if cls == "window" else None,
        window=(start, start + 1 / 3) if cls == "window" else None,
        slow_host=rng.randrange(nranks // per_host) if cls == "node" else None,
        sub_size=per_host if sub else 0,
        sub_straggler=rng.randrange(nranks) if cls == "subcomm" else None,
        slowdown=0.0 if healthy else rng.uniform(0.15, 0.4),
        compute_s=rng.uniform(0.01, 0.03),
        jitter=rng.uniform(0.01, 0.04),
        spike_rate=rng.uniform(0.0, 0.05),
        outlier=rng.uniform(5, 50) if healthy else 0.0,
        drop=rng.uniform(0.0, 0.2),
        seed=k,
    )


@cache
def _variant(cls: str, k: int) -> tuple[InspectorJob, pl.DataFrame]:
    job = _job(cls, k)
    return job, _rows(job)


def _verdict(job: InspectorJob, cls: str, found: pl.DataFrame) -> str:
    """right, wrong or missed (as ``benchmarks/bench_exec_straggler.py`` scores them)."""
    rows = list(found.iter_rows(named=True))
    if cls == "healthy":
        return "wrong" if rows else "right"
    if cls == "node":
        assert job.slow_host is not None
        host = job.host(job.slow_host * job.ranks_per_host)
        ok = [r for r in rows if r["scope"] == "node" and r["host"] == host]
        bad = [r for r in rows if r not in ok]
        return "wrong" if bad else "right" if ok else "missed"
    rank = job.straggler if cls == "window" else job.sub_straggler
    assert rank is not None
    ok = [
        r for r in rows
        if r["scope"] != "node" and r["pid"] == job.pid(rank)
        and (r["scope"] == "window" if cls == "window" else r["comm_hash"] == job.sub_hash(rank))
    ]  # fmt: skip
    bad = [r for r in rows if r["scope"] == "node" or r["pid"] != job.pid(rank)]
    return "wrong" if bad else "right" if ok else "missed"


def _score(cls: str, n: int = VARIANTS) -> Counter[str]:
    out: Counter[str] = Counter()
    for k in range(n):
        job, rows = _variant(cls, k)
        out[_verdict(job, cls, es.judge(rows))] += 1
    return out


@pytest.mark.parametrize("cls", CLASSES)
def test_each_class_is_right_and_never_wrong(cls: str) -> None:
    score = _score(cls)
    assert score["wrong"] == 0, score
    assert score["right"] >= 0.95 * VARIANTS, score


def test_without_the_window_search_a_stretch_is_missed(monkeypatch: pytest.MonkeyPatch) -> None:
    none = pl.DataFrame(
        schema={"comm_hash": pl.String, "comm_rank": pl.Int32, "host": pl.String, "pid": pl.Int32}
    )
    monkeypatch.setattr(es, "window_flagged", lambda _i, _m: none)
    score = _score("window")
    assert score["right"] == 0, score


def test_without_the_node_comparison_a_slow_node_is_not_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(es, "node_metric", lambda _i: pl.DataFrame())
    score = _score("node")
    assert score["right"] == 0, score


def test_without_the_sub_communicator_explaining_its_host_the_world_blames_the_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    none = pl.DataFrame(schema={"comm_hash": pl.String, "host": pl.String})
    monkeypatch.setattr(es, "explained_nodes", lambda _n, _r: none)
    score = _score("subcomm")
    assert score["wrong"] >= VARIANTS // 2, score


def test_pooling_the_communicators_loses_the_sub_communicators_straggler() -> None:
    # Judged over all calls at once, as one communicator: the world's calls, where its
    # whole host is late together, drown the sub-communicator's.
    score: Counter[str] = Counter()
    for k in range(VARIANTS):
        job, rows = _variant("subcomm", k)
        pooled = rows.with_columns(
            pl.lit(job.comm_hash).alias("comm_hash"),
            pl.lit(job.nranks, pl.Int32).alias("nranks"),
            (pl.col("host").str.slice(5).cast(pl.Int32) * job.ranks_per_host
             + pl.col("comm_rank") % job.ranks_per_host).cast(pl.Int32).alias("comm_rank"),
            pl.concat_str(pl.col("op"), pl.lit("-"), pl.col("comm_hash")).alias("op"),
        )  # fmt: skip
        named = set(es.judge(pooled)["pid"].to_list())
        score["right" if named == {job.pid(job.sub_straggler or 0)} else "not"] += 1
    assert score["right"] <= VARIANTS // 4, score


def test_without_the_scan_bound_healthy_sub_communicators_raise_windows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two-rank sub-communicators: half their collectives are anyone's, and the search
    # picks the luckiest stretch of each rank.
    monkeypatch.setattr(es, "_tail", lambda _k, _n, _p: 0.0)
    named = 0
    for k in range(16):
        job = InspectorJob(nranks=16, ranks_per_host=2, sub_size=2, collectives=200, seed=k,
                           jitter=0.03, spike_rate=0.02)  # fmt: skip
        named += not es.judge(_rows(job)).is_empty()
    assert named >= 1


def test_a_two_host_job_names_the_slow_one_not_its_mirror() -> None:
    job = InspectorJob(nranks=8, ranks_per_host=4, slow_host=0, slowdown=0.2, seed=3)
    found = es.judge(_rows(job))
    assert found.select("scope", "host").rows() == [("node", "node-00")]


def test_one_late_rank_of_a_host_is_that_rank_not_the_node() -> None:
    job = InspectorJob(nranks=16, ranks_per_host=2, straggler=5, slowdown=0.2, seed=4)
    found = es.judge(_rows(job))
    assert found.select("scope", "comm_rank").rows() == [("run", 5)]


def test_findings_from_the_detector(monkeypatch: pytest.MonkeyPatch) -> None:
    job = InspectorJob(nranks=16, ranks_per_host=4, slow_host=1, slowdown=0.2, seed=5)
    rows = _rows(job)
    det = es.ExecStragglerDetector()

    class _Tools:
        inspector = rows

    class _Identity:
        members = pl.DataFrame()

    class _Analysis:
        followed_by = None
        tools = _Tools()
        identity = _Identity()

    class _Ctx:
        analysis = _Analysis()

    ctx: Context = _Ctx()  # type: ignore[assignment]
    found = det.policy(det.metric(ctx), ctx)
    assert [(f.kind, f.hosts, f.evidence["scope"]) for f in found] == [
        ("straggler", ["node-01"], "node")
    ]
    assert found[0].cost_gpu_s is not None
    assert found[0].cost_gpu_s > 0

    wjob = InspectorJob(nranks=8, straggler=3, slowdown=0.2, window=(0.5, 0.83), seed=6)
    wrows = _rows(wjob)
    monkeypatch.setattr(_Tools, "inspector", wrows)
    found = det.policy(det.metric(ctx), ctx)
    assert len(found) == 1
    ev = found[0].evidence
    assert (ev["comm_rank"], found[0].hosts) == (3, ["node-00"])
    assert 0.4 * ev["window_of"] <= ev["window_first"] <= 0.6 * ev["window_of"]


def test_analyze_names_the_sub_communicators_straggler_by_its_global_rank(
    tmp_path: Path,
) -> None:
    job = InspectorJob(nranks=16, ranks_per_host=4, sub_size=4, sub_straggler=6, slowdown=0.2)
    write_job(job, tmp_path / "job")
    out = CliRunner().invoke(
        cli, ["analyze", str(tmp_path / "job"), "--format", "json", "--no-progress"]
    )
    found = [f for f in json.loads(out.stdout)["findings"] if f["kind"] == "straggler"]
    assert [(f["ranks"], f["hosts"]) for f in found] == [([6], ["node-01"])]
    assert found[0]["evidence"]["communicator"] == job.sub_hash(6)
