"""The generator's vocabulary: option types and their values, file names, NCCL enum values."""

from __future__ import annotations

from typing import Literal, TypeAlias, get_args

Json: TypeAlias = str | int | float | bool | list["Json"] | dict[str, "Json"] | None

Era = Literal["2.7", "2.18", "2.21", "2.26", "2.26.5", "2.27"]
Layout = Literal["combined", "per-rank"]
Launcher = Literal["none", "torchrun", "rank", "srun", "pdsh"]
MismatchField = Literal["op", "count", "dtype"]
Framework = Literal["none", "deepspeed", "torch"]
Offload = Literal["none", "optimizer", "param", "both"]
DsEra = Literal["old", "new"]  # DeepSpeed <= 0.10.0 / >= 0.10.1 timer names
TorchEra = Literal["2.1", "2.4", "2.7"]

ERAS: tuple[str, ...] = get_args(Era)
LAYOUTS: tuple[str, ...] = get_args(Layout)
LAUNCHERS: tuple[str, ...] = get_args(Launcher)
MISMATCH_FIELDS: tuple[str, ...] = get_args(MismatchField)
FRAMEWORKS: tuple[str, ...] = get_args(Framework)
OFFLOADS: tuple[str, ...] = get_args(Offload)
DS_ERAS: tuple[str, ...] = get_args(DsEra)
TORCH_ERAS: tuple[str, ...] = get_args(TorchEra)
ZERO_STAGES: tuple[int, ...] = (1, 2, 3)

TRUTH_FILE = "truth.json"
COMBINED_FILE = "job.log"
_TRUTH_FORMAT_VERSION = 1

# NCCL datatype / redop enum values (src/nccl.h.in).
_BF16 = 9
_FP32 = 7
_OP_SUM = 0

# Chunk sizes: big enough that write() syscalls and str.join are amortised, small enough that
# memory stays bounded even for per-rank layouts with hundreds of open files.
_FLUSH_CHARS = 8 << 20
_JITTER_S = 0.002
