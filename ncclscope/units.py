"""NCCL datatype sizes and byte formatting."""

from __future__ import annotations

__all__ = [
    "APPLICATION_XIDS",
    "DTYPE_BYTES",
    "DTYPE_NAMES",
    "PCIE_LANE_GT_PER_S",
    "TORCH_DTYPES",
    "XID_NAMES",
    "human_bytes",
    "pcie_max_bytes_per_second",
    "rank_ranges",
]

#: ``ncclDataType_t`` value -> element size in bytes (``src/nccl.h.in``).
DTYPE_BYTES: dict[int, int] = {
    0: 1,  # ncclInt8
    1: 1,  # ncclUint8
    2: 4,  # ncclInt32
    3: 4,  # ncclUint32
    4: 8,  # ncclInt64
    5: 8,  # ncclUint64
    6: 2,  # ncclFloat16
    7: 4,  # ncclFloat32
    8: 8,  # ncclFloat64
    9: 2,  # ncclBfloat16
    10: 1,  # ncclFloat8e4m3
    11: 1,  # ncclFloat8e5m2
}

#: ``ncclDataType_t`` value -> its name without the ``nccl`` prefix.
DTYPE_NAMES: dict[int, str] = {
    0: "int8",
    1: "uint8",
    2: "int32",
    3: "uint32",
    4: "int64",
    5: "uint64",
    6: "float16",
    7: "float32",
    8: "float64",
    9: "bfloat16",
    10: "float8e4m3",
    11: "float8e5m2",
}

#: PyTorch ``ScalarType`` name as ``c10::toString`` prints it (the flight recorder's
#: ``input_dtypes``) -> (element size in bytes, the ``ncclDataType_t`` value PyTorch
#: passes to NCCL for it, or None where NCCL has no such type).  ``Bool`` goes to NCCL as
#: uint8.
TORCH_DTYPES: dict[str, tuple[int, int | None]] = {
    "Char": (1, 0),
    "Byte": (1, 1),
    "Bool": (1, 1),
    "Short": (2, None),
    "Int": (4, 2),
    "UInt16": (2, None),
    "UInt32": (4, 3),
    "Long": (8, 4),
    "UInt64": (8, 5),
    "Half": (2, 6),
    "Float": (4, 7),
    "Double": (8, 8),
    "BFloat16": (2, 9),
    "Float8_e4m3fn": (1, 10),
    "Float8_e5m2": (1, 11),
    "Float8_e4m3fnuz": (1, None),
    "Float8_e5m2fnuz": (1, None),
    "ComplexHalf": (4, None),
    "ComplexFloat": (8, None),
    "ComplexDouble": (16, None),
}

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: float | None) -> str:
    """Format a byte count with binary units: ``human_bytes(3 << 20) == '3.0 MiB'``."""
    if n is None:
        return "-"
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def rank_ranges(ranks: list[int]) -> str:
    """Ranks as ranges.

    >>> rank_ranges([0, 1, 2, 4, 6, 7]), rank_ranges([])
    ('0-2, 4, 6-7', '')
    """
    if not ranks:
        return ""
    parts: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ", ".join(parts)


#: Raw signalling rate per lane, in gigatransfers (Gbit) per second, by PCIe generation.
PCIE_LANE_GT_PER_S: dict[int, float] = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}


def pcie_max_bytes_per_second(gen: int | None, width: int | None) -> float | None:
    """The PCIe link's theoretical payload bandwidth in one direction, in bytes per second.

    ``GT/s per lane x 1e9 x lanes x encoding / 8``, where the encoding efficiency is
    8b/10b (0.8) for generations 1-2 and 128b/130b for generation 3 and later. Packet
    (TLP/DLLP) overhead is not taken off, so real transfers peak lower. Generation 6 is
    counted the same way for comparability, although it actually uses FLIT encoding.

    Returns ``None`` for an unknown generation or a missing value.

    >>> round(pcie_max_bytes_per_second(4, 16) / 1e9, 3)  # 16 GT/s x 16 x 128/130 / 8, GB/s
    31.508
    >>> pcie_max_bytes_per_second(1, 1)  # 2.5 GT/s x 8/10 / 8
    250000000.0
    >>> pcie_max_bytes_per_second(7, 16) is None
    True
    """
    if gen is None or width is None or gen not in PCIE_LANE_GT_PER_S:
        return None
    encoding = 8 / 10 if gen <= 2 else 128 / 130
    return PCIE_LANE_GT_PER_S[gen] * 1e9 * width * encoding / 8


#: XIDs NVIDIA puts on the application, not the GPU (an engine exception, a page fault,
#: a stopped channel, the cleanup after one): NVIDIA's k8s-device-plugin skips them
#: (``applicationErrorXids``).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68})
#: NVIDIA's names of the hardware XIDs most seen in training fleets (the rest print a
#: number).
XID_NAMES: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remap recorded",
    64: "ECC page retirement or row remap failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}


#: DCGM's ``DCGM_CLOCKS_EVENT_REASON_*`` bits (a 1:1 map of NVML's clocks event reasons).
CLOCK_EVENT_BITS = {
    0x1: "gpu_idle",
    0x2: "clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
#: Bits that slow a GPU down for its hardware's sake, whatever its peers do (HW slowdown,
#: SW and HW thermal, HW power brake); the power cap (0x4) is a loaded GPU's normal state.
SLOWDOWN_BITS = 0x8 | 0x20 | 0x40 | 0x80
