#!/usr/bin/env python3
"""On a machine with NVIDIA GPUs: the PCIe topology the agent reads at start, from sysfs
and from NVML, beside what ``nvidia-smi topo -m`` and the raw sysfs files say.

Needs only the standard library and nvidia-ml-py (``pynvml``); prints each GPU's sysfs
path, the links on it, the uplinks :func:`ncclscope.agent.topology.collector_topology`
finds, NVML's switch groups, and how long reading the topology took.

Usage:
    python3 benchmarks/device_topology.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ncclscope.agent.nvml import NvmlCollector
from ncclscope.agent.topology import (
    collector_topology,
    nvml_switch_groups,
    read_sysfs_paths,
    sysfs_bus_id,
)


def main() -> int:
    c = NvmlCollector()
    msg = c.start()
    if msg is not None:
        print(msg)
        return 1
    for s in c.statics:
        entry = Path("/sys/bus/pci/devices") / sysfs_bus_id(s.pci_bus_id)
        real = os.path.realpath(entry)
        print(f"GPU {s.index} {s.pci_bus_id} max Gen{s.pcie_link_max_gen} x{s.pcie_link_max_width}")
        print(f"  sysfs: {real}")
        for p in [Path(real), *Path(real).parents][:8]:
            speed = p / "current_link_speed"
            if speed.exists():
                width = (p / "current_link_width").read_text().strip()
                print(f"    {p.name}: {speed.read_text().strip()} x{width}")
    t0 = time.perf_counter()
    paths = read_sysfs_paths({s.index: s.pci_bus_id for s in c.statics})
    t1 = time.perf_counter()
    groups = nvml_switch_groups(c.module, c.handles)  # type: ignore[arg-type]
    t2 = time.perf_counter()
    topo = collector_topology(c)
    t3 = time.perf_counter()
    print(f"sysfs links per GPU: {paths}  ({(t1 - t0) * 1e3:.2f} ms)")
    print(f"NVML switch groups (NearestGpus SINGLE): {groups}  ({(t2 - t1) * 1e3:.2f} ms)")
    print(f"topology: uplinks {dict(topo.uplinks)}")
    for link in topo.links.values():
        print(f"  {link}  capacity {link.max_bytes_per_second}")
    print(f"collector_topology: {(t3 - t2) * 1e3:.2f} ms")
    c.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
