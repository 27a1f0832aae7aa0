"""Shared helpers for the tests: a small valid NCCL log and a way to analyse one.

The log is written from ``shared/formats/nccl.md`` (NCCL 2.23+ shapes), not from
``ncclscope``: two ranks on two hosts, Init START/COMPLETE with commId, the node layout
line, connection lines, ten COLL lines per rank with increasing hex opCount, and one
IB completion WARN (preceded by its empty line) with its return-code chain.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from ncclscope.cli import cli

HOSTS = ("node-a", "node-b")
PIDS = (4101, 5202)
COMM_PTRS = ("0x55aa10c0ffee", "0x55bb20c0ffee")
STREAMS = ("0x55aa10d00d00", "0x55bb20d00d00")
COMM_ID = "0x4f1a6c2e9b7d3058"
NET = "NET/IB/0/GDRDMA"
#: opCount of the k-th collective: 8..0x11, so the hex digits a-f and a carry appear.
OPCOUNTS = tuple(range(8, 18))
#: op name, count, datatype of the k-th collective (same on both ranks).
COLLS = tuple(
    ("AllReduce", 262144, 7) if k % 3 else ("Broadcast", 1024, 9) for k in range(len(OPCOUNTS))
)


@dataclass(frozen=True)
class LogLine:
    """One line of the sample log: the rank whose process wrote it (None: no NCCL process)."""

    rank: int | None
    text: str
    is_coll: bool = False


def coll_text(rank: int, k: int) -> str:
    """The k-th COLL line of ``rank`` (no newline)."""
    host, pid, comm = HOSTS[rank], PIDS[rank], COMM_PTRS[rank]
    op, count, dtype = COLLS[k]
    return (
        f"{host}:{pid}:{pid} [0] NCCL INFO {op}: opCount {OPCOUNTS[k]:x} "
        f"sendbuff 0x7f3a{rank}c000000 recvbuff 0x7f3a{rank}e000000 count {count} "
        f"datatype {dtype} op 0 root 0 comm {comm} [nranks=2] stream {STREAMS[rank]}"
    )


def sample_lines() -> list[LogLine]:
    """The sample log, line by line, in the order a combined stdout would hold them."""
    out: list[LogLine] = [
        LogLine(None, "Starting training with 2 processes"),
        LogLine(None, "2024-08-03 14:07:22,519 - INFO - world size 2"),
    ]
    for r in range(2):
        host, pid, comm = HOSTS[r], PIDS[r], COMM_PTRS[r]
        tid = pid + 90
        head = f"{host}:{pid}:{pid} [0] NCCL INFO "
        thead = f"{host}:{pid}:{tid} [0] NCCL INFO "
        out += [
            LogLine(r, head + "NCCL version 2.23.4+cuda12.6"),
            LogLine(r, head + f"Bootstrap : Using eth0:10.0.0.{r + 1}<0>"),
            LogLine(r, head + "NCCL_IB_TIMEOUT set by environment to 22."),
            LogLine(r, head + "Using network IB"),
            LogLine(
                r,
                thead + f"ncclCommInitRank comm {comm} rank {r} nranks 2 cudaDev 0 nvmlDev 0 "
                f"busId {18 + r}000 commId {COMM_ID} - Init START",
            ),
            LogLine(
                r,
                thead + f"comm {comm} rank {r} nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0",
            ),
            LogLine(r, thead + f"Channel 00/0 : {1 - r}[0] -> {r}[0] [receive] via {NET}"),
            LogLine(r, thead + f"Channel 00/0 : {r}[0] -> {1 - r}[0] [send] via {NET}"),
            LogLine(r, thead + "Connected all rings, use ring PXN 0 GDR 1"),
            LogLine(
                r,
                thead + f"ncclCommInitRank comm {comm} rank {r} nranks 2 cudaDev 0 nvmlDev 0 "
                f"busId {18 + r}000 commId {COMM_ID} - Init COMPLETE",
            ),
        ]
    out.append(LogLine(None, "epoch 0 step 0 loss 2.3125"))
    for k in range(len(OPCOUNTS)):
        for r in range(2):
            out.append(LogLine(r, coll_text(r, k), is_coll=True))
    host, pid = HOSTS[1], PIDS[1]
    proxy = pid + 200
    out += [
        LogLine(1, ""),
        LogLine(
            1,
            f"{host}:{pid}:{proxy} [0] transport/net_ib/common.cc:1685 NCCL WARN NET/IB: "
            "Got completion from peer 10.0.0.1<45126> with status=12 opcode=0 len=0 "
            "vendor err 129 (Send) hca mlx5_0",
        ),
        LogLine(1, f"{host}:{pid}:{proxy} [0] NCCL INFO transport/net.cc:1286 -> 6"),
        LogLine(None, "RuntimeError: NCCL communicator was aborted on rank 1"),
    ]
    return out


def sample_text(lines: Sequence[LogLine] | None = None, *, eol: str = "\n") -> str:
    """The sample log (or ``lines``) as text, every line ended by ``eol``."""
    lines = sample_lines() if lines is None else lines
    return "".join(line.text + eol for line in lines)


def write_sample(path: Path, lines: Sequence[LogLine] | None = None) -> Path:
    """Write the sample log (or ``lines``) to ``path`` and return it."""
    path.write_bytes(sample_text(lines).encode())
    return path


#: What must not change when damage around valid lines is skipped: everything the
#: analysis learned from the lines (line numbers and paths left out).
def facts(doc: dict[str, Any]) -> dict[str, Any]:
    """The analysis results of a JSON document, without where they came from."""
    job = doc["job"]
    return {
        "nccl_versions": job["nccl_versions"],
        "cuda_versions": job["cuda_versions"],
        "hosts": job["hosts"],
        "world_size": job["world_size"],
        "ranks": [{k: v for k, v in r.items() if k != "path"} for r in job["ranks"]],
        "communicators": job["communicators"],
        "transports": job["transports"],
        "timestamps": job["timestamps"],
        "env": job["env"],
        "collectives": doc["collectives"],
        "errors": [{k: v for k, v in e.items() if k != "first_line"} for e in doc["errors"]],
    }


@dataclass
class CliRun:
    """One ``ncclscope analyze --format json`` run through click's runner."""

    result: Result
    doc: dict[str, Any] | None

    @property
    def code(self) -> int:
        return self.result.exit_code

    @property
    def stdout(self) -> str:
        return self.result.stdout

    @property
    def stderr(self) -> str:
        return self.result.stderr

    def input(self, path: str) -> dict[str, Any]:
        """The ``inputs[]`` entry whose path is ``path``."""
        assert self.doc is not None
        found = [i for i in self.doc["inputs"] if i["path"] == path]
        assert len(found) == 1, (path, [i["path"] for i in self.doc["inputs"]])
        return found[0]


def run_cli(paths: Sequence[str | Path], *, stdin: bytes | None = None) -> CliRun:
    """Run ``ncclscope analyze PATHS --format json``; fail on a Python traceback."""
    runner = CliRunner()
    args = ["analyze", *(str(p) for p in paths), "--format", "json", "--no-progress"]
    result = runner.invoke(cli, args, input=stdin, catch_exceptions=True)
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{type(result.exception).__name__}: {result.exception}"
    )
    doc = json.loads(result.stdout) if result.stdout.strip() else None
    return CliRun(result, doc)


@pytest.fixture
def analyze() -> Callable[..., CliRun]:
    """``analyze(paths, stdin=None)`` -> :class:`CliRun` (exit code, stdout, stderr, JSON)."""
    return run_cli


@pytest.fixture
def sample_log(tmp_path: Path) -> Path:
    """The undamaged sample log, written to ``tmp_path/clean.log``."""
    return write_sample(tmp_path / "clean.log")


def scrape_metrics(port: int) -> dict[str, float]:
    """An agent's ``/metrics`` on loopback ``port``: each sample (name with its labels) to
    its value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    values = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values
