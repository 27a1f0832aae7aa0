"""Which nodes to drain (``analyze --exclude-list``): every faulty node, never a waiter.

Jobs come from ``synth`` with known faulty hosts: a slow node (SlowHost), a straggler
rank (SlowRank), a dead process (DeadProcess) and a frozen rank (StopRank) with
PyTorch's watchdog lines, an IB completion error (IbError: its peer's consequential
error must not list the peer), and a mismatch (the program's: no node).  GPU XID, ECC
and PCIe link facts are added to a synth job's telemetry, as the agent records them.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner

from ncclscope.agent.telemetry import read_telemetry
from ncclscope.analysis import Diagnosis, run_analysis
from ncclscope.cli import cli
from ncclscope.export.exclude import (
    FORMATS,
    REASONS,
    ExcludeVerdict,
    NodeVerdict,
    exclude_verdict,
    host_verdicts,
    hostlist,
    taint_value,
)
from ncclscope.findings import Finding, Kind, Severity
from ncclscope.synth import (
    DeadProcess,
    Fault,
    IbError,
    Mismatch,
    SlowHost,
    SlowRank,
    StopRank,
    SynthSpec,
    generate,
)

_PER_HOST = 4
_HOSTS = 3
_ALL = [f"node-{h}" for h in range(_HOSTS)]

#: kind -> (faults for a culprit rank, synth options, the reason the culprit's host gets)
_JOBS: dict[str, tuple[Any, dict[str, Any], str | None]] = {
    "healthy": (lambda r: (), {"timestamps": True, "framework": "torch"}, None),
    "slow_node": (
        lambda r: (SlowHost(f"node-{r // _PER_HOST}", slowdown=0.3),),
        {"timestamps": True},
        "slow_node",
    ),
    "straggler": (lambda r: (SlowRank(r, 0.02),), {"timestamps": True}, "straggler"),
    "dead": (lambda r: (DeadProcess(r, 30),), {"framework": "torch"}, "dead_process"),
    "hang": (lambda r: (StopRank(r, 30),), {"framework": "torch"}, "frozen"),
    "ib_error": (lambda r: (IbError(f"node-{r // _PER_HOST}", 30),), {}, "network_error"),
    "mismatch": (lambda r: (Mismatch(r, 30, "count"),), {"framework": "torch"}, None),
}


def _job(tmp_path: Path, faults: tuple[Fault, ...], seed: int, **options: Any) -> Path:
    spec = SynthSpec(
        ranks=_HOSTS * _PER_HOST, hosts=_HOSTS, steps=6, seed=seed, faults=faults, **options
    )
    generate(spec, tmp_path / "job")
    return tmp_path / "job"


def _diagnose(tmp_path: Path, job: Path, samples: pl.DataFrame | None = None) -> Diagnosis:
    return run_analysis([str(job)], workdir=tmp_path / "work", telemetry=samples)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("kind", list(_JOBS))
def test_every_faulty_node_and_no_waiter(tmp_path: Path, kind: str, seed: int) -> None:
    faults, options, reason = _JOBS[kind]
    culprit = (seed * 5) % (_HOSTS * _PER_HOST)  # a different rank and host per seed
    d = _diagnose(tmp_path, _job(tmp_path, faults(culprit), seed, **options))
    v = exclude_verdict(d)
    faulty = f"node-{culprit // _PER_HOST}"
    if reason is None:
        assert v.exclude == [], [n.findings for n in v.exclude]
        assert v.keep == _ALL
        return
    assert [(n.host, n.reasons) for n in v.exclude] == [(faulty, [reason])]
    assert v.exclude[0].findings, "each node carries the findings that named it"
    assert v.keep == [h for h in _ALL if h != faulty]  # the waiters among them


def test_a_peers_consequential_error_does_not_list_it(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, _job(tmp_path, (IbError("node-1", 30),), 4))
    errors = {f.hosts[0]: f.evidence["root_cause"] for f in d.findings if f.kind == "nccl_error"}
    assert errors == {"node-1": True, "node-2": False}  # the peer saw it too
    assert [n.host for n in exclude_verdict(d).exclude] == ["node-1"]


@pytest.mark.parametrize("seed", [1, 2])
def test_a_flush_error_read_first_is_not_the_failure(tmp_path: Path, seed: int) -> None:
    # Per-rank files, WARNs stamped to the second: node-0's file comes first, so its
    # flush error (the peer's view of node-2's failure) reads as the root cause.
    job = _job(tmp_path, (IbError("node-2", 30),), seed, layout="per-rank")
    d = _diagnose(tmp_path, job)
    root = next(f for f in d.findings if f.kind == "nccl_error" and f.evidence["root_cause"])
    assert (root.hosts, "status=5 " in root.message) == (["node-0"], True)
    assert [n.host for n in exclude_verdict(d).exclude] == ["node-2"]


def test_waiting_ranks_are_in_the_evidence_not_the_list(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, _job(tmp_path, (StopRank(5, 30),), 5, framework="torch"))
    hang = next(f for f in d.findings if f.kind == "hang")
    waiting_hosts = {"node-0", "node-2"}
    assert set(hang.evidence["waiting_ranks"]) >= {0, 11}  # ranks of node-0 and node-2
    assert host_verdicts(d) == {"node-0": [], "node-1": ["frozen"], "node-2": []}
    assert waiting_hosts.isdisjoint(n.host for n in exclude_verdict(d).exclude)


# --- the rules, one finding at a time


def _f(kind: Kind, severity: Severity = "critical", **kw: Any) -> Finding:
    kw.setdefault("hosts", ["node-1"])
    kw.setdefault("ranks", [5])
    return Finding(kind=kind, severity=severity, message=kw.pop("message", "m"), **kw)


_IB = "NET/IB: Got completion from peer 10.0.0.2<1> with status={} opcode=0 len=0"


@pytest.mark.parametrize(
    ("finding", "reason"),
    [
        (_f("hang", hang_class="dead_process"), "dead_process"),
        (_f("hang", "warning", hang_class="missing_rank"), "frozen"),
        (_f("hang", hang_class="frozen_node"), "frozen"),
        (_f("hang", hang_class="stuck_outside_nccl"), None),  # its Python code: any node
        (_f("hang", hang_class="stuck_in_nccl"), None),  # another collective: the program
        (_f("hang", "info", hang_class="missing_rank"), None),  # nothing says it stopped
        (_f("timeout", evidence={"culprit_basis": "died_first"}), "dead_process"),
        (_f("timeout", evidence={"culprit_basis": "non_reporting_member"}), "frozen"),
        (_f("timeout", evidence={"culprit_basis": "mismatch"}), None),
        (_f("timeout_imminent", "warning"), "frozen"),
        (_f("straggler", "warning", evidence={"cause": "slow", "unit": "host"}), "slow_node"),
        (_f("straggler", "warning", evidence={"cause": "slow"}), "straggler"),
        (_f("straggler", "warning", ranks=[], evidence={"cause": "clock"}), None),
        (_f("straggler", "info", evidence={"cause": "slow"}), None),
        (_f("mismatch", hang_class="mismatch"), None),  # the program's bug
        (_f("config"), None),
        (_f("oom_risk"), None),
        (_f("pcie_contention"), None),
        (
            _f("nccl_error", message=_IB.format(12), evidence={"root_cause": True,
               "error_kind": "ib_completion"}),
            "network_error",
        ),
        (
            _f("nccl_error", message="remote process exited", evidence={"root_cause": True,
               "error_kind": "remote_exit"}),
            None,  # blames the peer that left, not the host that saw it
        ),
        (
            _f("nccl_error", message="Cuda failure 'uncorrectable ECC error encountered'",
               evidence={"root_cause": True, "error_kind": "cuda"}),
            "gpu_error",
        ),
        (
            _f("nccl_error", message="Cuda failure 'an illegal memory access was encountered'",
               evidence={"root_cause": True, "error_kind": "cuda"}),
            None,  # the program's
        ),
    ],
)  # fmt: skip
def test_rules(tmp_path: Path, finding: Finding, reason: str | None) -> None:
    d = _diagnose(tmp_path, _job(tmp_path, (), 9))
    v = exclude_verdict(replace(d, findings=[finding]))
    assert [(n.host, n.reasons) for n in v.exclude] == ([("node-1", [reason])] if reason else [])


def test_a_consequence_after_a_real_failure_does_not_list(tmp_path: Path) -> None:
    ev = {"error_kind": "ib_completion", "first_seen": "2025-03-14T09:00:25+00:00"}
    root = _f("nccl_error", message=_IB.format(12), evidence={**ev, "root_cause": True})
    later = _f("nccl_error", "warning", hosts=["node-2"], message=_IB.format(12),
               evidence={**ev, "root_cause": False})  # fmt: skip
    d = _diagnose(tmp_path, _job(tmp_path, (), 9))
    v = exclude_verdict(replace(d, findings=[root, later]))
    assert [n.host for n in v.exclude] == ["node-1"]


def test_ranks_without_hosts_and_host_order(tmp_path: Path) -> None:
    # Flight Recorder findings name ranks only: their hosts come from the logs.
    d = _diagnose(tmp_path, _job(tmp_path, (), 9))
    found = [
        _f("hang", hosts=[], ranks=[9], hang_class="missing_rank"),  # node-2
        _f("hang", hosts=["node-10"], hang_class="dead_process", message="rank 5 died"),
        _f("straggler", "warning", hosts=["node-10"], evidence={"cause": "slow"}),
    ]
    v = exclude_verdict(replace(d, findings=found))
    assert [(n.host, n.reasons, n.findings) for n in v.exclude] == [
        ("node-2", ["frozen"], ["m"]),
        ("node-10", ["dead_process", "straggler"], ["rank 5 died", "m"]),
    ]
    assert v.keep == ["node-0", "node-1"]


# --- telemetry: GPU XID, ECC and PCIe link width


def _gpu_rows(
    samples: pl.DataFrame, host: str, gpu: str, metric: str, values: list[float]
) -> pl.DataFrame:
    """``metric`` for one GPU of ``host`` at its first ``len(values)`` sample times."""
    mine = samples.filter(
        (pl.col("metric") == "ncclscope_gpu_memory_used_bytes")
        & pl.col("host").str.starts_with(host + ".")
        & pl.col("labels").str.starts_with(gpu + ",")
    ).head(len(values))
    return mine.with_columns(pl.lit(metric).alias("metric"), pl.Series("value", values))


def _with_faults(samples: pl.DataFrame) -> pl.DataFrame:
    """node-0: an application XID (13) only; node-1: XID 79; node-2 GPU 3: a x8 link
    (Gen4, capacity x16) and GPU 1 idling at Gen1 between Gen4 samples (not degraded);
    every link's width and generation recorded."""
    links = []
    for h in _ALL:
        for g in map(str, range(_PER_HOST)):
            gens = [1.0, 4.0, 1.0] if (h, g) == ("node-2", "1") else [4.0] * 3
            width = [8.0] * 3 if (h, g) == ("node-2", "3") else [16.0] * 3
            links.append(_gpu_rows(samples, h, g, "ncclscope_gpu_pcie_link_generation", gens))
            links.append(_gpu_rows(samples, h, g, "ncclscope_gpu_pcie_link_width", width))
    xid = "ncclscope_gpu_xid_errors_total"
    extra = [
        _gpu_rows(samples, "node-0", "2", xid, [0.0, 1.0]).with_columns(pl.col("labels") + ",13"),
        _gpu_rows(samples, "node-1", "0", xid, [1.0, 1.0]).with_columns(pl.col("labels") + ",79"),
    ]
    return pl.concat([samples, *links, *extra])


@pytest.fixture
def telemetry_job(tmp_path: Path) -> tuple[Path, pl.DataFrame]:
    job = _job(tmp_path, (), 6, timestamps=True, telemetry=True, telemetry_domain="cluster.local")
    return job, _with_faults(read_telemetry([job / "telemetry"]))


def test_gpu_xid_and_degraded_pcie_link(
    tmp_path: Path, telemetry_job: tuple[Path, pl.DataFrame]
) -> None:
    job, samples = telemetry_job
    v = exclude_verdict(_diagnose(tmp_path, job), samples=samples)
    # Hosts as NCCL prints them (node-1), not as the agent recorded them (node-1.cluster.local).
    assert [(n.host, n.reasons) for n in v.exclude] == [
        ("node-1", ["gpu_xid"]),
        ("node-2", ["pcie_link_degraded"]),
    ]
    assert "XID 79 (GPU has fallen off the bus)" in v.exclude[0].findings[0]
    assert "Gen4 x8" in v.exclude[1].findings[0]
    assert v.keep == ["node-0"]  # its XID 13 is the application's


def test_uncorrected_ecc_lists_the_node(
    tmp_path: Path, telemetry_job: tuple[Path, pl.DataFrame]
) -> None:
    job, samples = telemetry_job
    ecc = _gpu_rows(
        samples, "node-0", "1", "ncclscope_gpu_ecc_uncorrected_errors_total", [0.0, 2.0]
    )
    v = exclude_verdict(_diagnose(tmp_path, job), samples=pl.concat([samples, ecc]))
    assert (v.exclude[0].host, v.exclude[0].reasons) == ("node-0", ["gpu_ecc"])
    assert "GPU 1 (" in v.exclude[0].findings[0]
    assert "2 uncorrected ECC" in v.exclude[0].findings[0]


def test_analysis_telemetry_is_the_default(
    tmp_path: Path, telemetry_job: tuple[Path, pl.DataFrame]
) -> None:
    job, samples = telemetry_job
    d = _diagnose(tmp_path, job, samples)
    assert [n.host for n in exclude_verdict(d).exclude] == ["node-1", "node-2"]


# --- formats


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        ([], ""),
        (["node-1"], "node-1"),
        (["node-03", "node-01", "node-02", "node-07"], "node-[01-03,07]"),
        (["node-01", "node-02", "node-03", "node-07", "gpu9"], "gpu9,node-[01-03,07]"),
        (["n9", "n10", "n11"], "n[9-11]"),  # unpadded numbers join across widths
        (["n09", "n10"], "n[09-10]"),  # padded, same width
        (["n9", "n010"], "n[9,010]"),  # the padding of 010 kept; not a range with 9
        (["n007", "n7"], "n[7,007]"),  # two hosts, one number
        (["login", "a1", "a2", "b-x"], "a[1-2],b-x,login"),
        (["rack1-node4", "rack1-node5", "rack2-node4"], "rack1-node[4-5],rack2-node4"),
        (["10.0.0.1", "10.0.0.2", "10.0.0.4"], "10.0.0.[1-2,4]"),
    ],
)
def test_hostlist(hosts: list[str], expected: str) -> None:
    assert hostlist(hosts) == expected


def _expand(expr: str) -> set[str]:
    """Slurm's reading of a hostlist (the inverse ``hostlist`` must satisfy)."""
    out: set[str] = set()
    for prefix, body, plain in re.findall(r"([^,\[]*)\[([^\]]*)\]|([^,\[\]]+)", expr):
        if plain:
            out.add(plain)
            continue
        for part in body.split(","):
            lo, _, hi = part.partition("-")
            for n in range(int(lo), int(hi or lo) + 1):
                out.add(prefix + str(n).zfill(len(lo)))
    return out


def test_hostlist_reads_back() -> None:
    hosts = ["gpu-a100-07", "gpu-a100-08", "gpu-a100-10", "gpu9", "gpu10", "x", "n099", "n100"]
    assert _expand(hostlist(hosts)) == set(hosts)


_VERDICT = ExcludeVerdict(
    [
        NodeVerdict("node-10", ["dead_process", "gpu_xid"], ["rank 5 died", "XID 79"]),
        NodeVerdict("node-2", ["slow_node"], ["host node-2 is slow"]),
    ],
    keep=["node-1", "node-3"],
)
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?$")


def test_kubectl_lines() -> None:
    lines = FORMATS["kubectl"](_VERDICT).splitlines()
    assert lines == [
        "# node-10: dead_process, gpu_xid",
        "kubectl taint nodes node-10 ncclscope.io/fault=dead_process.gpu_xid:NoSchedule "
        "--overwrite",
        "# node-2: slow_node",
        "kubectl taint nodes node-2 ncclscope.io/fault=slow_node:NoSchedule --overwrite",
    ]
    for line in lines[1::2]:
        value = re.fullmatch(
            r"kubectl taint nodes \S+ ncclscope\.io/fault=(\S+):NoSchedule .*", line
        )
        assert value is not None
        assert _LABEL_VALUE.match(value.group(1))


@pytest.mark.parametrize(
    "reasons",
    [
        list(REASONS),  # longer than 63 characters joined
        ["a b/c", "_x_"],
        ["-"],
    ],
)
def test_taint_value_is_a_label_value(reasons: list[str]) -> None:
    value = taint_value(reasons)
    assert 0 < len(value) <= 63
    assert _LABEL_VALUE.match(value), value


def test_json_shape() -> None:
    text = FORMATS["json"](_VERDICT)
    doc = json.loads(text)
    assert doc == {
        "exclude": [
            {"findings": ["rank 5 died", "XID 79"], "host": "node-10",
             "reasons": ["dead_process", "gpu_xid"]},
            {"findings": ["host node-2 is slow"], "host": "node-2", "reasons": ["slow_node"]},
        ],
        "keep": ["node-1", "node-3"],
    }  # fmt: skip
    assert text == json.dumps(doc, indent=2, sort_keys=True) + "\n"  # keys sorted


def test_empty_when_nothing_is_wrong() -> None:
    none = ExcludeVerdict([], keep=["node-0"])
    assert FORMATS["slurm"](none) == ""
    assert FORMATS["kubectl"](none) == ""
    assert json.loads(FORMATS["json"](none)) == {"exclude": [], "keep": ["node-0"]}


# --- through the CLI


def _analyze(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["analyze", "--no-progress", *args])
    return result.exit_code, result.stdout


def test_cli_formats(tmp_path: Path, telemetry_job: tuple[Path, pl.DataFrame]) -> None:
    job, samples = telemetry_job
    part = tmp_path / "extra" / "part-00000000000000000001-1.parquet"
    part.parent.mkdir()
    samples.filter(pl.col("metric").str.contains("xid|link_(?:generation|width)")).write_parquet(
        part
    )
    tel = ["--telemetry", str(job / "telemetry"), "--telemetry", str(part.parent)]
    code, out = _analyze(str(job), *tel, "--exclude-list", "slurm")
    assert (code, out) == (0, "node-[1-2]\n")
    code, out = _analyze(str(job), *tel, "--exclude-list", "kubectl")
    assert code == 0
    assert [ln.split()[3] for ln in out.splitlines() if ln.startswith("kubectl")] == [
        "node-1",
        "node-2",
    ]
    code, out = _analyze(str(job), *tel, "--exclude-list", "json", "--fail-on", "warning")
    assert code == 0  # the job is healthy by its logs; the list changes no exit code
    assert [n["host"] for n in json.loads(out)["exclude"]] == ["node-1", "node-2"]


def test_cli_replaces_the_report_and_keeps_exit_codes(tmp_path: Path) -> None:
    job = _job(tmp_path, (DeadProcess(6, 30),), 7, framework="torch")
    code, out = _analyze(str(job), "--exclude-list", "slurm", "--fail-on", "critical")
    assert (code, out) == (3, "node-1\n")
    written = tmp_path / "drain.txt"
    code, out = _analyze(str(job), "--exclude-list", "json", "-o", str(written))
    assert (code, out) == (0, "")
    assert json.loads(written.read_text())["keep"] == ["node-0", "node-2"]


def test_cli_healthy_job_prints_nothing(tmp_path: Path) -> None:
    job = _job(tmp_path, (), 8, timestamps=True)
    for fmt in ("slurm", "kubectl"):
        assert _analyze(str(job), "--exclude-list", fmt) == (0, "")
    assert json.loads(_analyze(str(job), "--exclude-list", "json")[1]) == {
        "exclude": [],
        "keep": _ALL,
    }


def test_cli_help_shows_an_example() -> None:
    result = CliRunner().invoke(cli, ["analyze", "--help"])
    assert "--exclude-list slurm" in result.output
