"""The GPUs' PCIe uplinks: sysfs trees written under tmp_path, the fake NVML's topology
calls (direct-attached, 2 and 4 GPUs per switch), and the agent's rows."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ncclscope.agent.fake_nvml import (
    NVML_TOPOLOGY_INTERNAL,
    NVML_TOPOLOGY_NODE,
    NVML_TOPOLOGY_SINGLE,
    FakeGpu,
    FakeHandle,
    FakeNvml,
    NVMLError_InvalidArgument,
    NVMLError_NotSupported,
)
from ncclscope.agent.fake_sysfs import write_pci_tree
from ncclscope.agent.nvml import NvmlCollector, pcie_max_bytes_per_second
from ncclscope.agent.run import Agent, AgentConfig
from ncclscope.agent.topology import (
    collector_topology,
    link_rows,
    read_sysfs_paths,
    sysfs_bus_id,
)


def _collector(n: int, per_switch: int = 1, **kw: object) -> NvmlCollector:
    c = NvmlCollector(FakeNvml.with_devices(n, gpus_per_switch=per_switch, **kw))  # type: ignore[arg-type]
    assert c.start() is None
    return c


@pytest.mark.parametrize("per_switch", [1, 2, 4])
def test_sysfs_tree_gives_each_gpu_its_uplink(tmp_path: Path, per_switch: int) -> None:
    c = _collector(8, per_switch)
    truth = write_pci_tree(tmp_path, [s.pci_bus_id for s in c.statics], gpus_per_switch=per_switch)
    topo = collector_topology(c, sysfs_root=tmp_path)
    for s in c.statics:
        assert topo.uplinks[s.index] == (truth[sysfs_bus_id(s.pci_bus_id)],)
    shared = {lid: link.gpus for lid, link in topo.links.items()}
    assert sorted(len(g) for g in shared.values()) == [per_switch] * (8 // per_switch)
    link = next(iter(topo.links.values()))
    assert (link.generation, link.width, link.source) == (4, 16, "sysfs")
    assert link.max_bytes_per_second == pcie_max_bytes_per_second(4, 16)


def test_uplink_speed_is_read_at_the_switch_not_the_gpu(tmp_path: Path) -> None:
    c = _collector(4, 4)
    write_pci_tree(
        tmp_path, [s.pci_bus_id for s in c.statics], gpus_per_switch=4, uplink_gen=3, gpu_gen=5
    )
    (link,) = collector_topology(c, sysfs_root=tmp_path).links.values()
    assert (link.generation, link.width, link.gpus) == (3, 16, (0, 1, 2, 3))


def test_nested_switches_give_two_links(tmp_path: Path) -> None:
    gpu = "0000:1b:00.0"
    path = tmp_path / "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0"
    path = path / "0000:18:00.0/0000:19:04.0" / gpu
    for i, node in enumerate([*reversed(path.parents[:5]), path]):
        node.mkdir(parents=True, exist_ok=True)
        (node / "current_link_speed").write_text("16.0 GT/s PCIe\n" if i != 3 else "8.0 GT/s\n")
        (node / "current_link_width").write_text("16\n")
    devs = tmp_path / "bus/pci/devices"
    devs.mkdir(parents=True)
    (devs / gpu).symlink_to(path)
    links = read_sysfs_paths({0: "00000000:1B:00.0"}, sysfs_root=tmp_path)[0]
    assert [(lid, gen) for lid, gen, _w in links] == [
        ("0000:16:00.0", 4),
        ("0000:18:00.0", 3),
        (gpu, 4),
    ]


def test_missing_sysfs_and_flat_trees_are_no_topology(tmp_path: Path) -> None:
    assert read_sysfs_paths({0: "00000000:18:00.0"}, sysfs_root=tmp_path) == {}
    flat = tmp_path / "devices/pci0000:00/0000:00:04.0"  # a VM: the GPU on the root bus
    flat.mkdir(parents=True)
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    (tmp_path / "bus/pci/devices/0000:00:04.0").symlink_to(flat)
    assert read_sysfs_paths({0: "00000000:00:04.0"}, sysfs_root=tmp_path) == {}


@pytest.mark.parametrize("per_switch", [2, 4])
def test_nvml_groups_gpus_behind_a_switch_when_sysfs_cannot(per_switch: int) -> None:
    c = _collector(8, per_switch)
    topo = collector_topology(c, sysfs_root=None)
    groups = sorted(link.gpus for link in topo.links.values())
    assert groups == [tuple(range(k, k + per_switch)) for k in range(0, 8, per_switch)]
    link = next(iter(topo.links.values()))
    assert link.source == "assumed"
    assert (link.generation, link.width) == (5, 16)  # the GPUs' own maximum


def test_direct_attached_gpus_have_no_nvml_group() -> None:
    assert collector_topology(_collector(8, 1), sysfs_root=None).empty


def test_fake_nvml_topology_calls_follow_nvml() -> None:
    fake = FakeNvml.with_devices(4, gpus_per_switch=2)
    fake.nvmlInit()
    h = [fake.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    assert fake.nvmlDeviceGetTopologyCommonAncestor(h[0], h[0]) == NVML_TOPOLOGY_INTERNAL
    assert fake.nvmlDeviceGetTopologyCommonAncestor(h[0], h[1]) == NVML_TOPOLOGY_SINGLE
    assert fake.nvmlDeviceGetTopologyCommonAncestor(h[0], h[2]) == NVML_TOPOLOGY_NODE
    assert fake.nvmlDeviceGetTopologyNearestGpus(h[2], NVML_TOPOLOGY_SINGLE) == [FakeHandle(3)]
    assert len(fake.nvmlDeviceGetTopologyNearestGpus(h[2], NVML_TOPOLOGY_NODE)) == 3
    with pytest.raises(NVMLError_InvalidArgument):
        fake.nvmlDeviceGetTopologyNearestGpus(h[0], 7)
    with pytest.raises(NVMLError_InvalidArgument):
        fake.nvmlDeviceGetTopologyCommonAncestor(h[0], FakeHandle(9))


def test_nvml_not_supported_leaves_the_topology_empty(caplog: pytest.LogCaptureFixture) -> None:
    gpus = [
        FakeGpu(pcie_switch=0, not_supported={"nvmlDeviceGetTopologyNearestGpus"}) for _ in range(2)
    ]
    c = NvmlCollector(FakeNvml(gpus))  # type: ignore[arg-type]
    c.start()
    with caplog.at_level(logging.INFO):
        assert collector_topology(c, sysfs_root=None).empty
    assert "Not Supported" in caplog.text
    assert NVMLError_NotSupported  # the error NVML documents for a VM or another OS


def test_nvml_disagreeing_with_sysfs_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    c = _collector(4, 2)  # NVML: two per switch
    write_pci_tree(tmp_path, [s.pci_bus_id for s in c.statics], gpus_per_switch=1)
    with caplog.at_level(logging.WARNING):
        topo = collector_topology(c, sysfs_root=tmp_path)
    assert all(len(link.gpus) == 1 for link in topo.links.values())  # sysfs wins
    assert "sysfs shows no link they share" in caplog.text


def test_link_rows_have_bounded_labels(tmp_path: Path) -> None:
    c = _collector(8, 4)
    write_pci_tree(tmp_path, [s.pci_bus_id for s in c.statics], gpus_per_switch=4)
    keys = {s.index: (str(s.index), s.uuid, s.pci_bus_id) for s in c.statics}
    rows = link_rows(collector_topology(c, sysfs_root=tmp_path), keys)
    assert len(rows["ncclscope_gpu_pcie_uplink_info"]) == 8
    assert rows["ncclscope_pcie_uplink_gpus"] == [
        (("0000:80:00.0",), 4.0),
        (("0000:82:00.0",), 4.0),
    ]
    assert {v for _l, v in rows["ncclscope_pcie_uplink_max_bytes_per_second"]} == {
        pcie_max_bytes_per_second(4, 16)
    }


def test_agent_exports_and_records_the_uplinks(tmp_path: Path) -> None:
    import polars as pl

    from ncclscope.agent.exporter import render
    from ncclscope.agent.telemetry import read_telemetry

    fake = FakeNvml.with_devices(4, gpus_per_switch=2)
    nvml = NvmlCollector(fake)  # type: ignore[arg-type]
    sysfs = tmp_path / "sys"
    write_pci_tree(
        sysfs, [f"00000000:{b}:00.0" for b in ("18", "2A", "3A", "5D")], gpus_per_switch=2
    )
    out = tmp_path / "tel"
    agent = Agent(
        AgentConfig(out=out, sysfs_root=sysfs, hostname="node-7.cluster.internal"), nvml=nvml
    )
    agent.start()
    agent.tick()
    agent.finish()
    text = render(agent.board).decode()
    assert 'ncclscope_gpu_pcie_uplink_info{UUID="' in text
    assert 'ncclscope_pcie_uplink_gpus{uplink="0000:80:00.0"} 2.0' in text
    tel = read_telemetry([out])
    info = tel.filter(pl.col("metric") == "ncclscope_gpu_pcie_uplink_info")
    assert info["labels"].str.split(",").list.get(3).to_list() == [
        "0000:80:00.0",
        "0000:80:00.0",
        "0000:82:00.0",
        "0000:82:00.0",
    ]
    assert set(tel["host"]) == {"node-7.cluster.internal"}


def test_a_vm_with_a_flat_pci_tree_has_no_topology(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # As seen on an H200 VM: /sys/devices/pci0000:00/0000:00:06.0 (no root port above the
    # GPU); NVML's NearestGpus raises InvalidArgument at every level, CommonAncestor
    # NotSupported.
    fake = FakeNvml([FakeGpu(pci_bus_id="00000000:00:06.0")], virtual_machine=True)
    gpu = tmp_path / "devices/pci0000:00/0000:00:06.0"
    gpu.mkdir(parents=True)
    (gpu / "current_link_speed").write_text("32.0 GT/s PCIe\n")
    (gpu / "current_link_width").write_text("16\n")
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    (tmp_path / "bus/pci/devices/0000:00:06.0").symlink_to(gpu)
    c = NvmlCollector(fake)  # type: ignore[arg-type]
    assert c.start() is None
    with caplog.at_level(logging.INFO):
        assert collector_topology(c, sysfs_root=tmp_path).empty
    assert "Invalid Argument" in caplog.text
    with pytest.raises(NVMLError_NotSupported):
        fake.nvmlDeviceGetTopologyCommonAncestor(FakeHandle(0), FakeHandle(0))
