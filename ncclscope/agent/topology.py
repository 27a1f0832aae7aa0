"""Each GPU's PCIe path to the CPU, read once at start: which links its traffic shares.

In an 8-GPU server two or four GPUs usually sit behind one PCIe switch whose uplink to
the CPU is a single x16 link: under ZeRO offload each GPU's own link reads 25-50% busy
while that uplink is saturated.  The detector needs to know, per GPU, the links above
it, their capacity and the GPUs behind each.  The same by hand::

    readlink -f /sys/bus/pci/devices/0000:1b:00.0
    # /sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:1b:00.0
    cat /sys/bus/pci/devices/0000:16:00.0/current_link_{speed,width}
    # 16.0 GT/s PCIe / 16
    nvidia-smi topo -m    # PIX / PXB: GPUs behind one switch / several switches

**From sysfs** (:func:`read_sysfs_paths`): ``/sys/bus/pci/devices/<bus id>`` resolves to
the device's place in the PCI tree, ``pci<domain>:<bus>`` (the host bridge) and then each
bridge down to the GPU.  The first is the CPU's root port; under it links and switches
alternate: root port -[link]- switch upstream port -(inside the switch)- downstream port
-[link]- next upstream port or the GPU.  So the links on a path ``[p0, p1, ..., gpu]`` end
at ``p1, p3, p5, ...`` (the GPU itself last), and each link is read at that lower end:
its ``current_link_speed`` (``"16.0 GT/s PCIe"``: the generation) and
``current_link_width`` (lanes), ``max_link_*`` where the current value is unknown.
A link is named by the bus id of that lower end: for a switch, its upstream port.

**From NVML** (:func:`nvml_switch_groups`), where sysfs shows no bridge above the GPU (a
VM's flat PCI tree) or cannot be read: ``nvmlDeviceGetTopologyNearestGpus(h,
NVML_TOPOLOGY_SINGLE)`` lists the GPUs behind the same switch.  NVML does not give the
uplink's speed: it is taken as the GPUs' own maximum (a switch's uplink is as wide as
its ports on every common design) and marked ``assumed``.

The result (:class:`Topology`): per GPU its own link and the links above it that are
not its own (shared with other GPUs, or a narrower hop), each with its GPUs.  Nothing
here raises for a missing file or an NVML error: the topology is then smaller.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ncclscope.agent.nvml import PCIE_LANE_GT_PER_S, NvmlCollector, pcie_max_bytes_per_second

__all__ = [
    "Link",
    "Topology",
    "collector_topology",
    "link_rows",
    "nvml_switch_groups",
    "read_sysfs_paths",
    "read_topology",
    "sysfs_bus_id",
]

logger = logging.getLogger(__name__)

#: ``0000:3b:00.0``: a PCI address as sysfs spells it.
_ADDR = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_GEN_BY_GT = {gt: gen for gen, gt in PCIE_LANE_GT_PER_S.items()}


@dataclasses.dataclass(frozen=True)
class Link:
    """One PCIe link above one or more GPUs.

    Attributes:
        id: the bus id of the link's lower end (a switch's upstream port, or the GPU),
            as sysfs spells it (``0000:16:00.0``); ``nvml:<first GPU's bus id>`` where
            only NVML's grouping is known.
        generation: PCIe generation (1-6) the link runs at; None when unknown.
        width: lanes; None when unknown.
        gpus: NVML indices of the GPUs whose traffic crosses it.
        source: ``sysfs`` (read), or ``assumed`` (NVML's grouping, the GPUs' own maximum).
    """

    id: str
    generation: int | None
    width: int | None
    gpus: tuple[int, ...]
    source: str = "sysfs"

    @property
    def max_bytes_per_second(self) -> float | None:
        """One direction's capacity (:func:`~ncclscope.agent.nvml.pcie_max_bytes_per_second`)."""
        return pcie_max_bytes_per_second(self.generation, self.width)


@dataclasses.dataclass(frozen=True)
class Topology:
    """The shared links above the GPUs (each GPU's own link is NVML's to report).

    ``uplinks``: per GPU index, the ids of the links above it other than its own, top
    (nearest the CPU) first; a direct-attached GPU has its own link there (shared with
    nothing).  ``links``: those links by id.
    """

    uplinks: Mapping[int, tuple[str, ...]]
    links: Mapping[str, Link]

    @property
    def empty(self) -> bool:
        return not self.uplinks


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` as sysfs spells it: ``0000:3b:00.0``.

    >>> sysfs_bus_id("00000000:3B:00.0"), sysfs_bus_id("0001:3b:00.0")
    ('0000:3b:00.0', '0001:3b:00.0')
    """
    domain, _, rest = nvml_bus_id.strip().lower().partition(":")
    return f"{int(domain or '0', 16):04x}:{rest}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def _speed_gen(text: str | None) -> int | None:
    """``"16.0 GT/s PCIe"`` or ``"8 GT/s"`` -> 4 or 3; ``"Unknown"`` -> None.

    >>> _speed_gen("16.0 GT/s PCIe"), _speed_gen("2.5 GT/s"), _speed_gen("Unknown")
    (4, 1, None)
    """
    m = re.match(r"^\s*([0-9.]+)\s*GT/s", text or "")
    return _GEN_BY_GT.get(float(m.group(1))) if m else None


def _width(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() and int(text) > 0 else None


def _link_at(device: Path) -> tuple[int | None, int | None]:
    """(generation, width) of the link above ``device``, read at the device."""
    gen = _speed_gen(_read(device / "current_link_speed"))
    width = _width(_read(device / "current_link_width"))
    if gen is None:
        gen = _speed_gen(_read(device / "max_link_speed"))
    if width is None:
        width = _width(_read(device / "max_link_width"))
    return gen, width


def read_sysfs_paths(
    bus_ids: Mapping[int, str], *, sysfs_root: Path = Path("/sys")
) -> dict[int, list[tuple[str, int | None, int | None]]]:
    """Per GPU index, the links on its path from the CPU down, each ``(id, gen, width)``;
    the last is the GPU's own.  GPUs whose path shows no bridge (or is missing) are left
    out.  ``bus_ids``: NVML's bus id per GPU index."""
    out: dict[int, list[tuple[str, int | None, int | None]]] = {}
    for index, bus in bus_ids.items():
        entry = sysfs_root / "bus" / "pci" / "devices" / sysfs_bus_id(bus)
        try:
            real = entry.resolve(strict=True)
        except (OSError, RuntimeError):
            continue
        parts = real.parts
        # from the host bridge (pci0000:15) down: the PCI addresses only
        start = next((i for i, p in enumerate(parts) if p.startswith("pci")), None)
        if start is None:
            continue
        nodes = [
            Path(*parts[: i + 1]) for i in range(start + 1, len(parts)) if _ADDR.match(parts[i])
        ]
        if len(nodes) < 2:  # no root port above the GPU: a VM's flat tree
            continue
        links = []
        for i, node in enumerate(nodes):
            if i % 2 == 1 or i == len(nodes) - 1:
                gen, width = _link_at(node)
                links.append((node.name, gen, width))
        out[index] = links
    return out


def nvml_switch_groups(nvml: ModuleType, handles: Mapping[int, Any]) -> list[tuple[int, ...]]:
    """GPUs that NVML says sit behind one PCIe switch (``NVML_TOPOLOGY_SINGLE``), as
    groups of two or more indices; ``[]`` where NVML cannot tell (NotSupported: not
    Linux, a VM; any other NVML error is logged once)."""
    level = getattr(nvml, "NVML_TOPOLOGY_SINGLE", None)
    fn = getattr(nvml, "nvmlDeviceGetTopologyNearestGpus", None)
    if level is None or fn is None:
        return []
    by_bus: dict[str, int] = {}
    for index, handle in handles.items():
        try:
            by_bus[str(nvml.nvmlDeviceGetPciInfo(handle).busId)] = index
        except nvml.NVMLError:
            continue
    groups: dict[int, set[int]] = {}
    for index, handle in handles.items():
        try:
            near = fn(handle, level)
        except nvml.NVMLError as err:
            logger.info("GPU %d: NVML topology not available (%s)", index, err)
            continue
        peers = set()
        for other in near:
            try:
                peers.add(by_bus[str(nvml.nvmlDeviceGetPciInfo(other).busId)])
            except (nvml.NVMLError, KeyError):
                continue
        if peers - {index}:
            groups[index] = peers | {index}
    unique = {tuple(sorted(g)) for g in groups.values()}
    return sorted(g for g in unique if len(g) >= 2)


def read_topology(
    bus_ids: Mapping[int, str],
    *,
    own: Mapping[int, tuple[int | None, int | None]] | None = None,
    sysfs_root: Path | None = Path("/sys"),
    nvml: ModuleType | None = None,
    handles: Mapping[int, Any] | None = None,
) -> Topology:
    """The links above the GPUs: from sysfs, else NVML's switch groups.

    Args:
        bus_ids: NVML's bus id per GPU index.
        own: each GPU's own maximum (generation, width), for links NVML groups.
        sysfs_root: where sysfs is mounted (tests build a tree under ``tmp_path``);
            None: do not read it.
        nvml, handles: the NVML module and each GPU's handle, for the fallback and
            the cross-check.
    """
    paths = read_sysfs_paths(bus_ids, sysfs_root=sysfs_root) if sysfs_root else {}
    behind: dict[str, list[int]] = {}
    facts: dict[str, tuple[int | None, int | None]] = {}
    uplinks: dict[int, tuple[str, ...]] = {}
    for index, links in paths.items():
        above = links[:-1] if len(links) > 1 else links
        uplinks[index] = tuple(lid for lid, _g, _w in above)
        for lid, gen, width in above:
            behind.setdefault(lid, []).append(index)
            facts[lid] = (gen, width)
    out = {lid: Link(lid, *facts[lid], tuple(sorted(g))) for lid, g in behind.items()}
    groups = nvml_switch_groups(nvml, handles) if nvml is not None and handles else []
    for group in groups:
        if all(i in paths for i in group):
            shared = set.intersection(*(set(uplinks[i]) for i in group))
            if not shared:
                logger.warning(
                    "NVML puts GPUs %s behind one PCIe switch; sysfs shows no link they "
                    "share: sysfs's paths are used",
                    ",".join(map(str, group)),
                )
            continue
        lid = "nvml:" + sysfs_bus_id(bus_ids[group[0]])
        gens = [(own or {}).get(i, (None, None)) for i in group]
        gen = min((g for g, _w in gens if g), default=None)
        width = min((w for _g, w in gens if w), default=None)
        out[lid] = Link(lid, gen, width, group, source="assumed")
        for i in group:
            uplinks[i] = (lid,)
    return Topology(uplinks=uplinks, links=out)


def link_rows(
    topology: Topology, gpu_keys: Mapping[int, tuple[str, ...]]
) -> dict[str, Sequence[tuple[tuple[str, ...], float]]]:
    """Catalog rows of the topology: ``ncclscope_gpu_pcie_uplink_info`` per GPU and link
    above it, and per link its generation, width, capacity and GPUs behind it.
    ``gpu_keys``: each GPU's ``(gpu, UUID, pci_bus_id)`` label values."""
    info = [
        ((*gpu_keys[i], lid), 1.0)
        for i, lids in sorted(topology.uplinks.items())
        if i in gpu_keys
        for lid in lids
    ]
    links = sorted(topology.links.values(), key=lambda x: x.id)
    rows: dict[str, list[tuple[tuple[str, ...], float]]] = {
        "ncclscope_gpu_pcie_uplink_info": info,
        "ncclscope_pcie_uplink_generation": [
            ((x.id,), float(x.generation)) for x in links if x.generation is not None
        ],
        "ncclscope_pcie_uplink_width": [
            ((x.id,), float(x.width)) for x in links if x.width is not None
        ],
        "ncclscope_pcie_uplink_max_bytes_per_second": [
            ((x.id,), x.max_bytes_per_second) for x in links if x.max_bytes_per_second is not None
        ],
        "ncclscope_pcie_uplink_gpus": [((x.id,), float(len(x.gpus))) for x in links],
    }
    return {k: v for k, v in rows.items() if v}


def collector_topology(
    collector: NvmlCollector, *, sysfs_root: Path | None = Path("/sys")
) -> Topology:
    """:func:`read_topology` for the GPUs a started collector follows (empty when NVML
    is off)."""
    statics = collector.statics
    if not statics:
        return Topology(uplinks={}, links={})
    return read_topology(
        {s.index: s.pci_bus_id for s in statics},
        own={s.index: (s.pcie_link_max_gen, s.pcie_link_max_width) for s in statics},
        sysfs_root=sysfs_root,
        nvml=collector.module,
        handles=collector.handles,
    )
