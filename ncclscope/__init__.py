"""ncclscope: diagnose distributed GPU training from the NCCL logs it already writes."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
