"""Exceptions ncclscope raises; the CLI turns them into messages and exit codes."""

from __future__ import annotations

__all__ = ["InputError", "NcclscopeError"]


class NcclscopeError(Exception):
    """Base class of every error ncclscope raises on purpose."""


class InputError(NcclscopeError):
    """An input path cannot be read (missing, unreadable, not a log).

    Attributes:
        path: the path as the user gave it.
        reason: what is wrong, phrased for the user.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
