"""The cause behind a finding, from the cluster's counters (#29): the fabric for a slow
node whose port shows errors in its slow window, the GPU for a slow node with clean
ports and a throttled GPU, the GPU (with its rank) for an XID at a hang; the network
never blamed with clean counters, nothing on healthy jobs.

Jobs from ``synth``; the cluster's rows from ``synth.cluster`` (its own noise model, not
the detector's thresholds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ncclscope.analysis import build
from ncclscope.detect.fabric import peer_of
from ncclscope.diagnose import Diagnosis, diagnose
from ncclscope.findings import Finding
from ncclscope.synth import SlowHost, StopRank, SynthSpec, generate
from ncclscope.synth.cluster import (
    ClusterFault,
    GpuThrottle,
    GpuXid,
    PortCongestion,
    PortErrors,
    cluster_tables,
    with_cluster,
)

Faults = Callable[[dict[str, Any]], Sequence[ClusterFault]]


def _ts(text: str) -> datetime:
    ts = datetime.fromisoformat(text)  # the truth's times are UTC
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


def _run(tmp_path: Path, spec: SynthSpec, faults: Faults, *, noise: float = 1.0) -> Diagnosis:
    truth = generate(spec, tmp_path / "job").to_dict()
    tables = cluster_tables(truth, faults(truth), seed=spec.seed, noise=noise)
    return diagnose(with_cluster(build([str(tmp_path / "job")], workdir=tmp_path / "w"), tables))


def _slow(seed: int = 1, host: str = "node-2") -> SynthSpec:
    return SynthSpec(
        ranks=16,
        hosts=4,
        steps=20,
        timestamps=True,
        step_time_s=3.0,
        seed=seed,
        faults=(SlowHost(host, slowdown=0.5, from_instance=100, to_instance=200),),
    )


def _window(truth: dict[str, Any]) -> tuple[str, datetime, datetime]:
    d = next(f for f in truth["faults"] if f["kind"] == "SlowHost")["details"]
    return str(d["host"]), _ts(d["start"]), _ts(d["end"])


def _causes(d: Diagnosis) -> list[Finding]:
    return [f for f in d.findings if f.kind == "cluster_cause"]


def _straggler(d: Diagnosis) -> Finding:
    (f,) = [f for f in d.findings if f.kind == "straggler" and f.hosts == ["node-2"]]
    return f


def test_slow_node_with_port_errors_is_the_fabric(tmp_path: Path) -> None:
    def faults(truth: dict[str, Any]) -> list[ClusterFault]:
        host, a, b = _window(truth)
        return [PortErrors(host, a, b, symbol_errors=120, recoveries=2)]

    d = _run(tmp_path, _slow(), faults)
    (c,) = _causes(d)
    assert c.evidence["cause"] == "fabric"
    assert c.hosts == ["node-2"]
    (port,) = c.evidence["ports"]
    assert (port["host"], port["device"], port["port"]) == ("node-2", "mlx5_0", "1")
    assert port["counters"]["symbol_error_total"] == 120
    assert port["counters"]["link_error_recovery_total"] == 2
    assert c.evidence["explains"]["kind"] == "straggler"
    assert _straggler(d).evidence["cluster"]["ports_clean"] is False


def test_port_errors_outside_the_slow_window_are_not_the_cause(tmp_path: Path) -> None:
    def faults(truth: dict[str, Any]) -> list[ClusterFault]:
        host, _a, _b = _window(truth)
        before = _ts(str(truth["first_ts"])) - timedelta(minutes=4)
        return [PortErrors(host, before, before + timedelta(seconds=20))]

    d = _run(tmp_path, _slow(), faults)
    assert _causes(d) == []
    assert _straggler(d).evidence["cluster"]["ports_clean"] is True


def test_slow_node_with_clean_ports_and_a_throttled_gpu_is_the_gpu(tmp_path: Path) -> None:
    def faults(truth: dict[str, Any]) -> list[ClusterFault]:
        host, a, b = _window(truth)
        return [GpuThrottle(host, 1, a, b, bits=0x40 | 0x8)]

    d = _run(tmp_path, _slow(), faults, noise=3.0)
    (c,) = _causes(d)
    assert c.evidence["cause"] == "gpu_throttle"
    assert "fabric" not in c.evidence["causes"]
    assert c.evidence["ports_clean"] is True
    assert "ports clean in the window" in c.message
    (g,) = c.evidence["gpus"]
    assert (g["host"], g["gpu"], g["rank"]) == ("node-2", "1", 9)
    assert set(g["events"]["clocks_event_reasons"]) >= {"hw_thermal", "hw_slowdown"}


def test_slow_node_with_clean_counters_blames_nothing(tmp_path: Path) -> None:
    d = _run(tmp_path, _slow(), lambda truth: [], noise=3.0)
    assert _causes(d) == []
    cluster = _straggler(d).evidence["cluster"]
    assert cluster["ports_clean"] is True
    assert cluster["gpus_clean"] is True
    assert cluster["cause"] is None
    assert "ports clean in the window" in cluster["note"]


def test_congested_port_of_the_slow_node(tmp_path: Path) -> None:
    def faults(truth: dict[str, Any]) -> list[ClusterFault]:
        host, a, b = _window(truth)
        return [PortCongestion(a, b, share=0.4, hosts=(host,))]

    d = _run(tmp_path, _slow(), faults)
    (c,) = _causes(d)
    assert c.evidence["cause"] == "fabric_congestion"
    (port,) = c.evidence["ports"]
    assert port["host"] == "node-2"
    assert port["transmit_wait_share"] >= 0.3


def _hang(seed: int = 3) -> SynthSpec:
    return SynthSpec(
        ranks=16,
        hosts=4,
        steps=6,
        timestamps=True,
        seed=seed,
        faults=(StopRank(rank=13, at_instance=40),),
    )


def _hang_xid(code: int) -> Faults:
    def faults(truth: dict[str, Any]) -> list[ClusterFault]:
        r = next(r for r in truth["ranks"] if r["rank"] == 13)
        at = _ts(str(truth["last_ts"])) - timedelta(seconds=1)
        return [GpuXid(str(r["host"]), int(r["nvml_dev"]), at, code=code)]

    return faults


@pytest.mark.parametrize("code", [79, 48, 94, 95])
def test_xid_at_a_hang_names_the_gpu_and_its_rank(tmp_path: Path, code: int) -> None:
    d = _run(tmp_path, _hang(), _hang_xid(code))
    (c,) = _causes(d)
    assert c.evidence["cause"] == "gpu"
    assert c.ranks == [13]
    (g,) = c.evidence["gpus"]
    assert g["rank"] == 13
    assert [x["code"] for x in g["events"]["xid"]] == [code]
    assert c.evidence["explains"]["kind"] == "hang"


def test_application_xid_at_a_hang_is_not_the_gpu(tmp_path: Path) -> None:
    d = _run(tmp_path, _hang(), _hang_xid(43))
    assert _causes(d) == []


@pytest.mark.parametrize(("seed", "noise"), [(5, 1.0), (6, 3.0)])
def test_healthy_job_gives_no_cluster_finding(tmp_path: Path, seed: int, noise: float) -> None:
    spec = SynthSpec(ranks=16, hosts=4, steps=20, timestamps=True, step_time_s=3.0, seed=seed)
    d = _run(tmp_path, spec, lambda truth: [], noise=noise)
    assert _causes(d) == []
    assert all("cluster" not in f.evidence for f in d.findings)


def test_peer_of_an_ib_error() -> None:
    msg = "NET/IB : Got completion from peer 10.0.1.17<54313> with status=12 opcode=0"
    assert peer_of(msg) == "10.0.1.17"
    assert peer_of("NET/IB : Got completion with error 12, opcode 0") is None


def test_a_few_symbol_errors_are_noise_not_the_fabric(tmp_path: Path) -> None:
    def faults(truth: dict[str, Any]) -> list[ClusterFault]:
        host, a, b = _window(truth)
        return [PortErrors(host, a, b, symbol_errors=3, recoveries=0)]

    d = _run(tmp_path, _slow(), faults)
    assert _causes(d) == []
    assert _straggler(d).evidence["cluster"]["ports_clean"] is True
