"""Classify NCCL WARN root causes into kinds and severities (a registry, first match wins).

Sample root cause (2.21)::

    ip-10-0-1-42:30412:30561 [1] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion
    from peer 10.0.1.17<54313> with status=12 opcode=0 len=0 vendor err 129 (Send) ...

is kind ``ib_completion``, severity ``error``.
"""

from __future__ import annotations

import re

__all__ = [
    "ERROR_KINDS",
    "RESULT_CODES",
    "classify_warn",
    "hint_for",
    "kind_of_code",
    "signature",
]

#: (kind, pattern) in priority order.  The kinds are the JSON contract's.
ERROR_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("ib_completion", re.compile(r"NET/IB ?: ?Got completion|NET/IB.*completion (?:with )?error")),
    ("net_completion", re.compile(r"Got completion|[Cc]ompletion (?:with )?error|cq error")),
    (
        "remote_exit",
        re.compile(
            r"[Cc]onnection closed by remote peer|[Cc]onnection reset by peer|remote process exited"
            r"|[Rr]emote peer .*(?:exited|closed)|declaring peer .* as DEAD|closed by localRank"
        ),
    ),
    ("bootstrap", re.compile(r"[Bb]ootstrap|has already checked in")),
    (
        "socket",
        re.compile(
            r"[Ss]ocket|Connect to .* failed|Call to (?:connect|recv|send|accept|poll)|Net : "
        ),
    ),
    ("proxy", re.compile(r"[Pp]roxy")),
    ("cuda", re.compile(r"Cuda failure|CUDA error|cuda\w* .*(?:failed|error)|cuMem|NVML|nvml")),
    (
        "system",
        re.compile(
            r"[Ss]ystem error|Failed to open|No such file|errno|Cannot allocate|[Oo]ut of memory"
            r"|Permission denied|Resource temporarily|[Cc]all to \w+ failed|ibv_\w+ failed"
        ),
    ),
    (
        "internal",
        re.compile(
            r"[Ii]nternal error|does not loop back|Mismatched|Duplicate GPU|[Ii]nvalid|mismatch"
        ),
    ),
)

#: WARNs that report an optional feature missing rather than a failure.
_BENIGN = re.compile(
    r"Failed to open libibverbs|libnccl-net|NET/Plugin|[Pp]lugin .*not found|No plugin found"
    r"|is deprecated|Could not find"
    # IB async events that report fabric housekeeping, not a failure: NCCL's async thread
    # only logs them and established connections carry on.
    r"|Got async (?:error )?event ?: ?(?:SM change|LID change|P_Key change|[Cc]lient rereg"
    r"|GID (?:table )?change|port active|communication established)"
)
#: WARNs that are worth a look but do not stop the job by themselves.
_WARNING = re.compile(r"Got async (?:error )?event|timeout warning|retrying|HINT|[Tt]rying again")

#: ``ncclResult_t`` values (``src/nccl.h.in``).
RESULT_CODES: dict[int, str] = {
    1: "unhandled cuda error",
    2: "unhandled system error",
    3: "internal error",
    4: "invalid argument",
    5: "invalid usage",
    6: "remote process exited or there was a network error",
    7: "in progress",
    8: "timeout",
}

_CODE_KIND = {1: "cuda", 2: "system", 3: "internal", 4: "internal", 5: "internal", 6: "remote_exit"}

_MASK = re.compile(r"0x[0-9a-fA-F]+|\d+(?:\.\d+)*(?:<\d+>)?|<\d+>")


def classify_warn(message: str) -> tuple[str, str]:
    """Return ``(kind, severity)`` for a WARN message.

    >>> classify_warn("NET/IB : Got completion from peer 10.0.1.17<54313> with status=12")
    ('ib_completion', 'error')
    >>> classify_warn("Failed to open libibverbs.so[.1]")
    ('system', 'info')
    >>> classify_warn("NET/IB : mlx5_2:1 Got async error event: SM change")
    ('other', 'info')
    """
    kind = next((name for name, regex in ERROR_KINDS if regex.search(message)), "other")
    if _BENIGN.search(message):
        severity = "info"
    elif _WARNING.search(message):
        severity = "warning"
    else:
        severity = "error"
    return kind, severity


def kind_of_code(code: int) -> str:
    """Kind for a return-code chain that no WARN explains (``-> 6`` is a remote error)."""
    return _CODE_KIND.get(code, "other")


def signature(message: str) -> str:
    """The message with numbers, addresses and ports masked, to group repeats.

    >>> signature("Connect to 10.0.0.2<43117> failed : Connection refused")
    'Connect to # failed : Connection refused'
    """
    return _MASK.sub("#", message)


#: ``enum ibv_wc_status`` (libibverbs) values NCCL prints as ``status=N`` / ``error N``.
IBV_WC_STATUS: dict[int, str] = {
    1: "LOC_LEN_ERR",
    2: "LOC_QP_OP_ERR",
    4: "LOC_PROT_ERR",
    5: "WR_FLUSH_ERR",
    7: "BAD_RESP_ERR",
    8: "LOC_ACCESS_ERR",
    9: "REM_INV_REQ_ERR",
    10: "REM_ACCESS_ERR",
    11: "REM_OP_ERR",
    12: "RETRY_EXC_ERR",
    13: "RNR_RETRY_EXC_ERR",
    16: "REM_ABORT_ERR",
    19: "FATAL_ERR",
    20: "RESP_TIMEOUT_ERR",
    21: "GENERAL_ERR",
}
_IB_MEANING: dict[int, str] = {
    4: "the buffer was not registered for RDMA on this side (memory registration, "
    "GPUDirect RDMA / peer memory module)",
    5: "the queue pair was already in error: a consequence of an earlier failure, "
    "look for the first error",
    10: "the peer refused access to its memory (registration on the peer side)",
    12: "retries exhausted: the peer or a link stopped answering (peer process dead, "
    "port down, heavy congestion); check the peer host first, then the fabric; "
    "NCCL_IB_TIMEOUT and NCCL_IB_RETRY_CNT set how long NCCL waits",
    13: "the peer was not ready to receive, again and again (receiver stalled or dead)",
}
_IB_STATUS = re.compile(r"(?:status=|with error )(\d+)")


def hint_for(kind: str, message: str) -> str | None:
    """What an error means, where the message alone is cryptic.

    >>> hint_for("ib_completion", "NET/IB : Got completion from peer x with status=12")[:44]
    'IB work completion status 12 (RETRY_EXC_ERR)'
    """
    if kind == "ib_completion":
        m = _IB_STATUS.search(message)
        if m:
            code = int(m[1])
            name = IBV_WC_STATUS.get(code, "unknown status")
            meaning = _IB_MEANING.get(code)
            head = f"IB work completion status {code} ({name})"
            return f"{head}: {meaning}" if meaning else head
    if kind == "remote_exit":
        return "another process closed the connection: it probably died first; find its error"
    return None
