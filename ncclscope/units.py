"""NCCL enums and unit conversions into base units (bytes, seconds)."""

from __future__ import annotations

__all__ = [
    "DTYPE_BYTES",
    "DTYPE_NAMES",
    "REDOP_NAMES",
    "human_bytes",
    "human_seconds",
    "size_bucket_floor",
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
    10: "fp8e4m3",
    11: "fp8e5m2",
}

#: ``ncclRedOp_t`` value -> name; values >= 5 are user-defined (premul sum).
REDOP_NAMES: dict[int, str] = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}

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


def human_seconds(s: float | None) -> str:
    """Format a duration: ``human_seconds(552) == '9m12s'``."""
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.1f}ms"
    if s < 60:
        return f"{s:.1f}s"
    minutes, sec = divmod(round(s), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def size_bucket_floor(n_bytes: int) -> int:
    """Lower bound of the power-of-4 size bucket holding ``n_bytes`` (0 for empty messages).

    Buckets are 1 B, 4 B, 16 B, ... so a summary table stays short.
    """
    if n_bytes <= 0:
        return 0
    floor = 1
    while floor * 4 <= n_bytes:
        floor *= 4
    return floor
