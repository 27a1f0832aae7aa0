"""A PCI tree in sysfs's shape, written under any folder, for tests and benchmarks.

:func:`write_pci_tree` lays out what ``/sys`` shows for GPUs on a CPU's root ports, either
one GPU per root port or ``gpus_per_switch`` behind one PCIe switch per root port::

    ROOT/devices/pci0000:00/0000:00:01.0/0000:81:00.0/0000:82:00.0/0000:18:00.0
             host bridge  root port    switch up    switch down  the GPU
    ROOT/bus/pci/devices/0000:18:00.0 -> ../../../devices/pci0000:00/.../0000:18:00.0

Every device has ``current_link_speed`` (``"16.0 GT/s PCIe"``, as Linux 5.x+ prints it)
and ``current_link_width``; the switch's upstream port and the GPU carry their link's
values, the root port and downstream ports their downstream link's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ncclscope.agent.nvml import PCIE_LANE_GT_PER_S

__all__ = ["write_pci_tree"]


def _device(path: Path, gen: int, width: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "current_link_speed").write_text(f"{PCIE_LANE_GT_PER_S[gen]:.1f} GT/s PCIe\n")
    (path / "current_link_width").write_text(f"{width}\n")
    (path / "max_link_speed").write_text(f"{PCIE_LANE_GT_PER_S[gen]:.1f} GT/s PCIe\n")
    (path / "max_link_width").write_text(f"{width}\n")


def write_pci_tree(
    root: Path,
    bus_ids: Sequence[str],
    *,
    gpus_per_switch: int = 1,
    uplink_gen: int = 4,
    uplink_width: int = 16,
    gpu_gen: int = 4,
    gpu_width: int = 16,
) -> dict[str, str]:
    """Write the tree; return each GPU's (sysfs) bus id -> its uplink's id (the switch's
    upstream port, or the GPU itself when direct-attached).

    ``bus_ids``: the GPUs in NVML's or sysfs's spelling (``00000000:18:00.0``).
    """
    out: dict[str, str] = {}
    host = root / "devices" / "pci0000:00"
    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    for i, bus in enumerate(bus_ids):
        domain, _, rest = bus.lower().partition(":")
        gpu = f"{int(domain, 16):04x}:{rest}"
        slot = i // gpus_per_switch
        port = host / f"0000:00:{slot + 1:02x}.0"
        _device(port, uplink_gen if gpus_per_switch > 1 else gpu_gen, uplink_width)
        if gpus_per_switch > 1:
            up = f"0000:{0x80 + 2 * slot:02x}:00.0"
            down = f"0000:{0x81 + 2 * slot:02x}:{i % gpus_per_switch:02x}.0"
            _device(port / up, uplink_gen, uplink_width)
            path = port / up / down / gpu
            _device(port / up / down, gpu_gen, gpu_width)
            out[gpu] = up
        else:
            path = port / gpu
            out[gpu] = gpu
        _device(path, gpu_gen, gpu_width)
        link = links / gpu
        if not link.exists():
            link.symlink_to(os.path.relpath(path, links))
    return out
