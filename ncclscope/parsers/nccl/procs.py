"""The ``host:pid:tid`` header of an NCCL line, read into its parts.

The scan keeps COLL rows keyed by the raw token; these turn a token into the host, pid
and tid columns, or say it is damaged.
"""

from __future__ import annotations

import re

from ncclscope.parsers.nccl.patterns import HOST_CHARS

__all__ = ["bad_tokens", "decode_proc"]

_HOST = re.compile(f"{HOST_CHARS}+")
_INT32_MAX = 2**31 - 1


def decode_proc(token: str) -> tuple[str, int, int] | None:
    """``[default3]:node-6:5381:5382`` -> ``("node-6", 5381, 5382)``; None if not a header
    or if its pid or tid is too large for their Int32 columns (a damaged line: the scan
    hands such lines to the reference parser, which counts them as malformed).

    >>> decode_proc("[default3]:node-6:5381:5382"), decode_proc("x|y:1:2")
    (('node-6', 5381, 5382), None)
    >>> decode_proc("node-6:4294967296:5382"), decode_proc("node-6:1\u00b2:5382")
    (None, None)
    """
    parts = token.rsplit(":", 3)
    if len(parts) < 3:
        return None
    host, pid, tid = parts[-3], parts[-2], parts[-1]
    # isdecimal, not isdigit: ``²`` is a digit that int() cannot read (a flipped byte)
    if not (_HOST.fullmatch(host) and pid.isdecimal() and tid.isdecimal()):
        return None
    if int(pid) > _INT32_MAX or int(tid) > _INT32_MAX:
        return None
    return host, int(pid), int(tid)


def bad_tokens(tokens: list[str | None]) -> list[str]:
    """The tokens whose host holds characters no host name has (junk glued in front),
    or whose pid or tid no Int32 column holds (a missing token is none of them)."""
    return [t for t in tokens if t is not None and decode_proc(t) is None]
