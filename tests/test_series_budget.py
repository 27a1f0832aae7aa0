"""The series budget (docs/metrics.md): what one agent exports, as a function of its
GPUs, processes, ranks and communicators, rendered from a real agent's board for
several shapes, after 100 and after 1,600 collectives; and no label whose values grow
with the run.

Each shape is one node of a two-node job written here in NCCL 2.27's format (INFO
timestamps, one file per rank): init lines per communicator, then collectives on every
communicator, every rank 50 us after the one before; GPUs from the fake NVML behind PCIe
switches laid out in a fake sysfs, one job process per rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ncclscope.agent.exporter import render
from ncclscope.agent.fake_nvml import FakeNvml
from ncclscope.agent.fake_sysfs import write_pci_tree
from ncclscope.agent.nvml import NvmlCollector
from ncclscope.agent.run import Agent, AgentConfig
from ncclscope.catalog import BOUNDED_LABELS, CATALOG, GROWING_LABELS, series_budget

T0 = datetime(2026, 11, 27, 10, tzinfo=UTC)
HOST = "node-0"
GAP_S = 0.1


@dataclass(frozen=True)
class Comm:
    """A communicator: its name and the node's ranks (local indices) on it."""

    name: str
    local: tuple[int, ...]
    nranks: int


@dataclass(frozen=True)
class Shape:
    gpus: int
    ranks: int
    comms: tuple[Comm, ...]
    gpus_per_switch: int = 2

    @property
    def memberships(self) -> int:
        return sum(len(c.local) for c in self.comms)


def _shared(ranks: int, count: int) -> tuple[Comm, ...]:
    """``count`` communicators every rank of the node is on (the world, the node's own,
    then others spanning both nodes)."""
    every = tuple(range(ranks))
    names = [("world", 2 * ranks), ("node", ranks), ("pp", 2 * ranks), ("cp", 2 * ranks)]
    return tuple(Comm(n, every, size) for n, size in names[:count])


def _dp(ranks: int) -> tuple[Comm, ...]:
    """The world, the node's own, and one data-parallel group per rank (the ranks of the
    same local index on each node: one of them on this node)."""
    return (*_shared(ranks, 2), *(Comm(f"dp{i}", (i,), 2) for i in range(ranks)))


SHAPES = {
    "8 GPUs, 8 ranks, 1 communicator": Shape(8, 8, _shared(8, 1)),
    "8 GPUs, 8 ranks, 2 communicators": Shape(8, 8, _shared(8, 2)),
    "8 GPUs, 8 ranks, 4 communicators": Shape(8, 8, _shared(8, 4)),
    "8 GPUs, 8 ranks, world + node + DP groups": Shape(8, 8, _dp(8)),
    "4 GPUs, 4 ranks, 2 communicators": Shape(4, 4, _shared(4, 2)),
    "4 GPUs on their own root ports, 4 ranks, 2 communicators": Shape(
        4, 4, _shared(4, 2), gpus_per_switch=1
    ),
}


@dataclass
class _Line:
    path: str
    text: str
    arrived: datetime


class _Lines:
    """Lines handed to the agent as a follower would."""

    def __init__(self) -> None:
        self.queue: list[_Line] = []

    def poll(self) -> list[_Line]:
        out, self.queue = self.queue, []
        return out


def _ts(t: datetime) -> str:
    return t.strftime("[%Y-%m-%d %H:%M:%S.%f] ")


def _pid(local: int) -> int:
    return 4000 + local


def _comm_ptr(ci: int, local: int) -> str:
    return f"0x55{ci:02x}{local:02x}00001000"


def _comm_id(ci: int) -> str:
    return f"0x{(0x168E5087AF895F5B + ci * 0x9E3779B97F4A7C15) & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def _init_lines(shape: Shape) -> list[_Line]:
    out = []
    t = T0
    for ci, comm in enumerate(shape.comms):
        for k, local in enumerate(comm.local):
            pid = _pid(local)
            # this node is node 0: a rank's place in a communicator spanning both nodes
            # is its global rank; in the node's own, its index there
            rank = k if comm.nranks == len(comm.local) else local
            for what in ("START", "COMPLETE"):
                t += timedelta(microseconds=10)
                out.append(
                    _Line(
                        f"/logs/{HOST}.{pid}.log",
                        f"{_ts(t)}{HOST}:{pid}:{pid} [{local}] NCCL INFO ncclCommInitRankConfig"
                        f" comm {_comm_ptr(ci, local)} rank {rank} nranks {comm.nranks}"
                        f" cudaDev {local} nvmlDev {local} busId {0x18 + local:x}000"
                        f" commId {_comm_id(ci)} - Init {what}",
                        t,
                    )
                )
    return out


def _coll_lines(shape: Shape, first: int, count: int) -> list[_Line]:
    out = []
    for k in range(first, first + count):
        start = T0 + timedelta(seconds=1 + k * GAP_S)
        for ci, comm in enumerate(shape.comms):
            for local in comm.local:
                pid = _pid(local)
                t = start + timedelta(microseconds=50 * local + 7 * ci)
                out.append(
                    _Line(
                        f"/logs/{HOST}.{pid}.log",
                        f"{_ts(t)}{HOST}:{pid}:{pid} [{local}] NCCL INFO AllReduce: opCount"
                        f" {k:x} sendbuff 0x7f0000000000 recvbuff 0x7f0000000000 count 1024"
                        f" datatype 7 op 0 root 0 comm {_comm_ptr(ci, local)}"
                        f" [nranks={comm.nranks}] stream 0x550000000000",
                        t,
                    )
                )
    return out


@dataclass
class _Proc:
    pid: int
    name: str = "python"
    rss_bytes: int = 32 << 30
    cpu_seconds_total: float = 100.0


@dataclass
class _Sample:
    processes: list[_Proc]
    memory_total_bytes: int = 2 << 40
    memory_available_bytes: int = 1 << 40
    swap_used_bytes: int = 0
    swap_in_bytes_total: int = 0
    swap_out_bytes_total: int = 0
    cpu_ratio: float = 0.3


class _Host:
    def __init__(self, pids: list[int]) -> None:
        self.pids = pids

    def sample(self) -> _Sample:
        return _Sample([_Proc(p) for p in self.pids])


def _series(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def _exposition_after(shape: Shape, tmp_path: Path, calls: tuple[int, ...]) -> list[list[str]]:
    """The agent's exposition after each count of collectives in ``calls``."""
    fake = FakeNvml.with_devices(shape.gpus, gpus_per_switch=shape.gpus_per_switch)
    nvml = NvmlCollector(fake)  # type: ignore[arg-type]
    lines = _Lines()
    now = [T0]
    agent = Agent(
        AgentConfig(analyse_s=0.0, refresh_s=0.0, hostname=HOST, sysfs_root=tmp_path),
        nvml=nvml,
        host=_Host([_pid(i) for i in range(shape.ranks)]),
        lines=lines,
        wall=lambda: now[0],
    )
    fake.nvmlInit()
    bus_ids = [str(fake.nvmlDeviceGetPciInfo(fake.nvmlDeviceGetHandleByIndex(i)).busId)
               for i in range(shape.gpus)]  # fmt: skip
    fake.nvmlShutdown()
    write_pci_tree(tmp_path, bus_ids, gpus_per_switch=shape.gpus_per_switch)
    agent.start()
    out = []
    done = 0
    lines.queue = _init_lines(shape)
    try:
        for upto in calls:
            lines.queue += _coll_lines(shape, done, upto - done)
            done = upto
            now[0] = T0 + timedelta(seconds=1 + upto * GAP_S + 0.05)
            agent.tick()
            out.append(_series(render(agent.board).decode()))
    finally:
        agent.finish()
    return out


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_series_per_node_follow_the_budget_and_not_the_collectives(
    name: str, tmp_path: Path
) -> None:
    shape = SHAPES[name]
    early, late = _exposition_after(shape, tmp_path, (100, 1600))
    by_metric = {line.split("{")[0].split(" ")[0] for line in late}
    # a healthy job: no collective pending; the findings (the config doctor's, here) on
    # top of the budget, the same before and after
    assert "ncclscope_pending_collective_age_seconds" not in by_metric
    state = [
        [s for s in exposition if s.startswith(("ncclscope_findings", "ncclscope_nccl_errors"))]
        for exposition in (early, late)
    ]
    assert state[0] == state[1]
    expected = len(state[0]) + series_budget(
        gpus=shape.gpus,
        uplinks=-(-shape.gpus // shape.gpus_per_switch),
        processes=shape.ranks,
        ranks=shape.ranks,
        memberships=shape.memberships,
        comms=len(shape.comms),
        spanning=sum(c.nranks > len(c.local) for c in shape.comms),
        timed=len(shape.comms),  # every communicator: 100 collectives with times
    )
    assert len(early) == expected, sorted(by_metric)
    # 1,500 more collectives, past 64- and 1,024-collective marks: the same series, new
    # values only.
    assert len(late) == len(early)
    assert {s.rsplit(" ", 1)[0] for s in late} - {s.rsplit(" ", 1)[0] for s in early} <= {
        s.rsplit(" ", 1)[0] for s in late if "op=" in s
    }
    if (shape.gpus, shape.ranks) == (8, 8) and len(shape.comms) <= 4:
        assert len(late) <= 300  # issue #25's target: an 8-GPU node, 8 ranks, <= 4 comms


def test_no_label_grows_with_the_run() -> None:
    """Every label is one whose values stay few (``BOUNDED_LABELS`` says why); none is a
    sequence number, step, call, line or time."""
    assert not GROWING_LABELS & BOUNDED_LABELS.keys()
    for m in CATALOG:
        for label in m.labels:
            assert label in BOUNDED_LABELS, f"{m.name}: say why {label!r} stays bounded"
            assert label.lower() not in GROWING_LABELS, f"{m.name}: {label!r} grows with the run"
    assert set(BOUNDED_LABELS) == {label for m in CATALOG for label in m.labels}
