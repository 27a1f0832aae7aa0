"""The cluster's exporters as ``write_exporter_openmetrics`` writes them, through a real
Prometheus: generated jobs' counters backfilled (``promtool tsdb create-blocks-from
openmetrics``), served, read by ``analyze --prometheus``'s path (``read_for_job``,
``with_cluster``, ``diagnose``) and named as their causes (bench_fabric_e2e at test size).

The writer's own tests parse its text back: counters are cumulative and their increases
over each step are the table's.
"""

from __future__ import annotations

import itertools
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from cluster_env import scrape_config
from prom import Prometheus, tools

from ncclscope.analysis import build
from ncclscope.cluster.job import read_for_job
from ncclscope.cluster.job import with_cluster as join_cluster
from ncclscope.cluster.prometheus import PromClient
from ncclscope.cluster.tables import ClusterTables
from ncclscope.diagnose import diagnose
from ncclscope.findings import Finding
from ncclscope.synth import SlowHost, StopRank, SynthSpec, generate
from ncclscope.synth.cluster import (
    ClusterFault,
    GpuThrottle,
    GpuXid,
    PortErrors,
    cluster_tables,
    exporter_openmetrics,
    write_exporter_openmetrics,
)

_SAMPLE = re.compile(r"^(\w+)\{(.*)\} (\S+) (\d+)\.(\d{3})$")


def _ts(text: object) -> datetime:
    ts = datetime.fromisoformat(str(text))
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


def _parse(text: str) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(name, labels) -> [(ms, value)] in file order; checks the file's shape on the way:
    ``# EOF`` last, a ``# TYPE`` before each family, a family's samples together."""
    lines = text.splitlines()
    assert lines[-1] == "# EOF"
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    families: list[str] = []
    for line in lines[:-1]:
        if line.startswith("# TYPE "):
            _, _, family, _kind = line.split(" ")
            assert family not in families, f"{family} twice"
            families.append(family)
            continue
        m = _SAMPLE.match(line)
        assert m is not None, line
        name, labels, value, sec, ms = m.groups()
        kind_ok = name == families[-1] or name == families[-1] + "_total"
        assert kind_ok or name == families[-1] + "_info", (name, families[-1])
        out.setdefault((name, labels), []).append((int(sec) * 1000 + int(ms), float(value)))
    return out


def _labels(text: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="([^"]*)"', text))


TRUTH = {
    "first_ts": "2025-03-14T09:00:00",
    "last_ts": "2025-03-14T09:02:00",
    "ranks": [{"host": f"node-{h}", "nvml_dev": g} for h in range(2) for g in range(2)],
}
T0 = _ts(TRUTH["first_ts"])


def _tables(seed: int = 3) -> ClusterTables:
    faults: list[ClusterFault] = [
        PortErrors("node-1", T0, T0 + timedelta(seconds=90), symbol_errors=50, recoveries=2),
        GpuXid("node-0", 1, T0 + timedelta(seconds=60), code=48),
    ]
    return cluster_tables(TRUTH, faults, seed=seed, pad_s=60.0)


def test_counters_are_cumulative_and_their_steps_are_the_tables_increases() -> None:
    tables = _tables()
    series = _parse(exporter_openmetrics(tables))
    step = float(tables.step_s or 0)
    grid = sorted({int(t.timestamp() * 1000) for t in tables.ports["ts"].to_list()})
    # node_exporter's instances are addresses; its node_uname_info names the node
    host_of = {
        _labels(k[1])["instance"]: _labels(k[1])["nodename"].split(".")[0]
        for k in series
        if k[0] == "node_uname_info"
    }
    assert sorted(host_of.values()) == ["node-0", "node-1"]
    assert all(not i.startswith("node-") for k in series for i in [_labels(k[1])["instance"]])
    counted: dict[str, float] = {}
    for (name, labels), samples in series.items():
        lab = _labels(labels)
        if not (name.startswith("node_infiniband_") and name.endswith("_total")):
            continue
        assert [ms for ms, _v in samples] == grid, name  # every scrape, in order
        values = [v for _ms, v in samples]
        assert values[0] > 0, name  # the node counted before the job
        assert all(b >= a for a, b in itertools.pairwise(values)), name
        host, metric = host_of[lab["instance"]], name.removeprefix("node_infiniband_")
        rows = tables.ports.filter(
            (pl.col("metric") == metric) & (pl.col("host") == host) & (pl.col("device") == "mlx5_0")
        )
        want = {int(r["ts"].timestamp() * 1000): r for r in rows.iter_rows(named=True)}
        for (_ms, before), (ms, after) in itertools.pairwise(samples):
            r = want.get(ms)
            inc = 0.0 if r is None else r["value"] * (step if r["kind"] == "rate_per_s" else 1)
            assert after - before == pytest.approx(inc, rel=1e-9, abs=1e-6), (name, host, ms)
        counted[f"{host}/{metric}"] = values[-1] - values[0]
    # the fault's errors are node-1's (less any in the first step, before the first scrape)
    assert counted["node-1/symbol_error_total"] >= 40
    assert counted["node-1/link_error_recovery_total"] >= 1
    assert counted["node-0/link_error_recovery_total"] == 0


def test_gpu_fields_carry_dcgm_exporters_labels_and_the_tables_values() -> None:
    tables = _tables()
    series = _parse(exporter_openmetrics(tables))
    xid = {
        _labels(k[1])["Hostname"] + "/" + _labels(k[1])["gpu"]: v
        for k, v in series.items()
        if k[0] == "DCGM_FI_DEV_XID_ERRORS"
    }
    assert sorted(xid) == ["node-0/0", "node-0/1", "node-1/0", "node-1/1"]
    assert max(v for _ms, v in xid["node-0/1"]) == 48
    assert max(v for _ms, v in xid["node-1/0"]) == 0
    some = next(k for k in series if k[0] == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
    assert set(_labels(some[1])) >= {"gpu", "UUID", "device", "modelName", "Hostname", "job"}
    names = {k[0] for k in series}
    assert {"ncclscope_node_info", "node_uname_info", "up"} <= names


def test_two_jobs_continue_each_series_and_overlaps_are_refused() -> None:
    first = _tables()
    later = {**TRUTH, "first_ts": "2025-03-14T11:00:00", "last_ts": "2025-03-14T11:02:00"}
    second = cluster_tables(later, seed=4, pad_s=60.0)
    series = _parse(exporter_openmetrics([first, second]))
    for (name, _labels_text), samples in series.items():
        if name.endswith("_total") and name.startswith("node_infiniband_"):
            values = [v for _ms, v in samples]
            assert all(b >= a for a, b in itertools.pairwise(values)), name
            assert len(samples) == first.ports["ts"].n_unique() + second.ports["ts"].n_unique()
    with pytest.raises(ValueError, match="same time"):
        exporter_openmetrics([first, first])


# ----------------------------------------------------------------------------- real


@dataclass
class _Job:
    name: str
    folder: Path
    truth: dict[str, Any]


def _jobs(work: Path) -> tuple[list[_Job], list[ClusterTables]]:
    """A slow node whose port errs, a slow node whose GPU throttles, a rank that stops
    with its GPU's XID: each half an hour after the last (the jobs share host names)."""
    start = _ts(SynthSpec().start_time)
    slow = SlowHost("node-1", slowdown=0.6, from_instance=80, to_instance=200)
    common: dict[str, Any] = {"ranks": 12, "hosts": 3, "timestamps": True, "seed": 7}
    specs = {
        "port_errors": SynthSpec(steps=20, step_time_s=3.0, faults=(slow,), **common),
        "throttle": SynthSpec(steps=20, step_time_s=3.0, faults=(slow,), **common),
        "xid": SynthSpec(steps=6, faults=(StopRank(rank=6, at_instance=30),), **common),
    }
    jobs, tables = [], []
    for k, (name, spec) in enumerate(specs.items()):
        at = (start + timedelta(minutes=30 * k)).replace(tzinfo=None)
        spec = SynthSpec(**{**spec.__dict__, "start_time": at.isoformat()})
        truth: dict[str, Any] = dict(generate(spec, work / name / "job").to_dict())
        faults: list[ClusterFault] = []
        if name == "xid":
            r = next(r for r in truth["ranks"] if r["rank"] == 6)
            at_xid = _ts(truth["last_ts"]) - timedelta(seconds=1)
            faults.append(GpuXid(str(r["host"]), int(r["nvml_dev"]), at_xid, code=79))
        else:
            d = next(f for f in truth["faults"] if f["kind"] == "SlowHost")["details"]
            a, b = _ts(d["start"]), _ts(d["end"])
            faults.append(
                PortErrors("node-1", a, b, symbol_errors=300, recoveries=2)
                if name == "port_errors"
                else GpuThrottle("node-1", 2, a, b, bits=0x40)
            )
        tables.append(cluster_tables(truth, faults, seed=k, noise=1.0))
        jobs.append(_Job(name, work / name, truth))
    return jobs, tables


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[_Job], str]]:
    prometheus, promtool = tools()
    work = tmp_path_factory.mktemp("fabric-e2e")
    jobs, tables = _jobs(work)
    om = work / "cluster.om"
    write_exporter_openmetrics(tables, om)
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "-q", str(om), str(work / "tsdb")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # the jobs' times are the synth's, in the past: a retention longer than their age
    config = scrape_config(work / "prometheus.yml", {})
    server = Prometheus(prometheus, config, work, retention="36500d")
    try:
        assert server.ready(), server.tail()
        yield jobs, server.base
    finally:
        server.close()


def _diagnose(job: _Job, url: str) -> tuple[list[Finding], ClusterTables]:
    """``analyze JOB --prometheus URL``'s path."""
    built = build([str(job.folder / "job")], workdir=job.folder / "w")
    cluster = read_for_job(built.analysis, PromClient(url))
    dx = diagnose(join_cluster(built, cluster, telemetry=True))
    return [f for f in dx.findings if f.kind == "cluster_cause"], cluster


def test_port_errors_and_a_throttled_gpu_are_named_through_prometheus(
    served: tuple[list[_Job], str],
) -> None:
    jobs, url = served
    port_job, throttle_job = jobs[0], jobs[1]
    causes, cluster = _diagnose(port_job, url)
    assert all(a.status == "ok" for a in cluster.asks), cluster.asks
    # every host tied through the exporters' own labels, never an address
    hows = set(cluster.instances.filter(pl.col("host").is_not_null())["how"].to_list())
    assert hows == {"uname", "dcgm", "agent"}
    assert sorted(set(cluster.instances["host"].drop_nulls().to_list())) == [
        "node-0", "node-1", "node-2"
    ]  # fmt: skip
    assert [(f.evidence["cause"], f.hosts) for f in causes] == [("fabric", ["node-1"])]
    ports = causes[0].evidence["ports"]
    assert [(p["host"], p["device"], p["port"]) for p in ports] == [("node-1", "mlx5_0", "1")]
    assert ports[0]["counters"]["symbol_error_total"] >= 10

    causes, _cluster = _diagnose(throttle_job, url)
    assert [(f.evidence["cause"], f.hosts) for f in causes] == [("gpu_throttle", ["node-1"])]
    rank = next(
        r["rank"] for r in throttle_job.truth["ranks"]
        if r["host"] == "node-1" and r["nvml_dev"] == 2
    )  # fmt: skip
    gpus = causes[0].evidence["gpus"]
    assert [(g["host"], g["gpu"], g["rank"]) for g in gpus] == [("node-1", "2", rank)]
    assert causes[0].ranks == [rank]


def test_an_xid_at_the_hang_is_named_with_its_rank_through_prometheus(
    served: tuple[list[_Job], str],
) -> None:
    jobs, url = served
    causes, _cluster = _diagnose(jobs[2], url)
    assert [(f.evidence["cause"], f.ranks) for f in causes] == [("gpu", [6])]
