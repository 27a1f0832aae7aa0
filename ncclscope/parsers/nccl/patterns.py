"""One compiled regex per NCCL line family, each with a sample line it matches.

The grammar comes from NCCL's own format strings, 2.4 to 2.30 (see
``shared/formats/nccl.md``).  Where the format changed between versions the pattern
takes every historic shape at once, so the parser needs no version dispatch for
these families; the few facts that truly depend on the version (``opCount`` being
constant on single-node communicators from 2.27) are decided from the data.

Python's ``re`` is used here, by the reference line parser.  The vectorised scanner
(``scan.py``) uses its own ASCII-only patterns for the hot COLL path, and the tests
check that both agree.
"""

from __future__ import annotations

import re

from ncclscope.parsers.common import ANSI_RE

__all__ = [
    "ANSI_RE",
    "BANNER_RE",
    "BINARY_CHARS",
    "BINARY_RE",
    "CHAIN_RE",
    "COLL_RE",
    "COMM_EVENT_RE",
    "CONN_RE",
    "ENV_RE",
    "HEADER_RE",
    "HOST_CHARS",
    "INIT_TIMINGS_RE",
    "KV_RE",
    "LAUNCHER_RES",
    "NNODES_RE",
    "PREFIX_TS_RE",
    "RING_LIST_RE",
    "TREE_RANK_RE",
]

#: Characters of a host name as NCCL prints it: gethostname() cut at the first dot, ``%``
#: and ``/`` replaced by ``-`` since 2.29, or a redaction such as ``<cluster_name>``.
HOST_CHARS = r"[A-Za-z0-9_<>.%/-]"

#: Bytes no text log holds: control characters other than tab, newlines and ESC (colour
#: codes are text), DEL, and U+FFFD where invalid UTF-8 was replaced.  One is enough to
#: call a line that parses as nothing "binary"; shared by the vectorised and Python paths.
BINARY_CHARS = "[\x00-\x08\x0e-\x1a\x1c-\x1f\x7f\ufffd]"
BINARY_RE = re.compile(BINARY_CHARS)


#: The NCCL line header, found anywhere in the line (launchers put text in front).
#:
#: Sample (2.18, INFO)::
#:
#:     gpu-node-a:20113:20113 [0] NCCL INFO Using network IB
#:
#: Sample (2.30.7+, WARN with function)::
#:
#:     node1:4411:4502 [3] transport/net.cc:1286 (sendProxyProgress) NCCL WARN ...
#:
#: Sample (TRACE, milliseconds since init)::
#:
#:     node1:4411:4411 [0] 1532.221680 ncclAllReduce:123 NCCL TRACE ...
HEADER_RE = re.compile(
    rf"(?P<host>{HOST_CHARS}+):(?P<pid>\d+):(?P<tid>\d+) "
    r"(?:\[(?P<dev>-?\d+)\] )?"
    r"(?:(?P<ms>\d+\.\d+) (?P<tfunc>[^\s:]+):(?P<tline>\d+) NCCL (?P<trace>TRACE) "
    r"|(?P<src>[^\s:]+):(?P<srcline>\d+)(?: \((?P<func>[^)]*)\))? NCCL (?P<warn>WARN) ?"
    r"|NCCL (?P<level>INFO|CALL) ?)"
)

#: An NCCL timestamp right before the header: default ``[%F %T] `` and ``%Nf`` precision.
#:
#: Sample prefix: ``[2025-06-02 14:03:11.482913] ``
PREFIX_TS_RE = re.compile(
    r"\[?(?P<date>\d{4}-\d{2}-\d{2})[ T_](?P<time>\d{2}:\d{2}:\d{2})"
    r"(?:[.,](?P<frac>\d{1,9}))?\]?\s*$"
)

#: Launcher prefixes that carry a rank or a host, tried in order on the text before the header.
LAUNCHER_RES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("torch_rank", re.compile(r"\[rank(?P<rank>\d+)\]:")),  # [rank3]:
    ("torchrun", re.compile(r"\[(?:[A-Za-z_]+)(?P<local_rank>\d+)\]:")),  # [default3]:
    ("openmpi", re.compile(r"\[\d+,(?P<rank>\d+)\]<std(?:out|err)>:")),  # [1,3]<stdout>:
    ("ray", re.compile(r"\((?P<actor>\w+) pid=(?P<lpid>\d+), ip=(?P<ip>[0-9a-fA-F.:]+)\)")),
    ("srun", re.compile(r"^\s*(?P<rank>\d+): ")),  # srun -l
    ("pdsh", re.compile(r"^\s*(?P<lhost>[A-Za-z0-9][A-Za-z0-9_.-]*): ")),  # pdsh host:
)

#: The version banner, bare (<= 2.22) or as an INFO message (2.23+).
#:
#: Sample: ``NCCL version 2.18.3+cuda12.1``
BANNER_RE = re.compile(
    r"NCCL version (?P<version>\d+\.\d+\.\d+)(?P<suffix>[^+\s]*)\+cuda(?P<cuda>\d+\.\d+)"
)

#: A collective or point-to-point call (``NCCL_DEBUG_SUBSYS=COLL``), 2.4 to 2.30.
#:
#: Sample::
#:
#:     AllGather: opCount 1a sendbuff 0x7f2c4a000000 recvbuff 0x7f2c4c000000 count 262144
#:     datatype 9 op 0 root 0 comm 0x55d1c2a4b2e0 [nranks=16] stream 0x55d1c29f7a10
COLL_RE = re.compile(
    r"^(?P<op>[A-Za-z]+): opCount (?P<opcount>[0-9a-fA-F]+) sendbuff (?P<sendbuff>\S+) "
    r"recvbuff (?P<recvbuff>\S+) count (?P<count>\d+) datatype (?P<dtype>\d+) op (?P<redop>\d+) "
    r"root (?P<root>-?\d+) comm (?P<comm>\S+) \[nranks=(?P<nranks>\d+)\]"
    r"(?: stream (?P<stream>\S+))?"
)

#: Communicator lifecycle lines: Init START/COMPLETE in every version, Destroy, Abort, Revoke.
#:
#: Samples::
#:
#:     comm 0x5581e2c0 rank 3 nranks 4 cudaDev 1 busId 2000 - Init COMPLETE            (2.5-2.16)
#:     comm 0x5581e2c0 rank 3 nranks 16 cudaDev 3 nvmlDev 3 busId 3d000 commId
#:     0x8a2f4c1d9e3b7a60 - Init START                                                    (2.18)
#:     ncclCommSplit comm 0x55 rank 1 nranks 8 cudaDev 1 nvmlDev 1 busId 1b000 parent
#:     0x54 splitCount 1 color 0 key 1- Init START                                      (2.24)
#:     [Rank 3] ncclCommInitRankConfig comm 0x55 rank 3 ... - Init START               (2.29+)
#:     comm 0x5581e2c0 rank 3 nRanks 4 cudaDev 1 busId 2000 - Abort START              (2.28+)
COMM_EVENT_RE = re.compile(
    r"^(?:\[Rank \d+\] )?(?:(?P<fn>nccl\w+) )?comm (?P<comm>0x[0-9a-fA-F]+|\(nil\)) "
    r"rank (?P<rank>\d+) n[Rr]anks (?P<nranks>\d+)(?P<kv>(?: \w+ -?\w+)*) ?"
    r"- (?P<event>Init|Destroy|Abort|Revoke) (?P<phase>START|COMPLETE)\s*$"
)

#: ``key value`` pairs inside a lifecycle line (``cudaDev 3 nvmlDev 3 busId 3d000 ...``).
KV_RE = re.compile(r"(\w+) (\S+)")

#: Node layout of a communicator (2.20+), the best source of node and local-rank counts.
#:
#: Sample: ``comm 0x55d1c2a4b2e0 rank 9 nRanks 16 nNodes 2 localRanks 8 localRank 1 MNNVL 0``
NNODES_RE = re.compile(
    r"^comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) "
    r"nNodes (?P<nnodes>\d+) localRanks (?P<local_ranks>\d+) localRank (?P<local_rank>\d+)"
)

#: Connection lines, every historic shape (2.4 ``Ring``, 2.5+ busId, 2.18.3+ nvmlDev).
#:
#: Samples::
#:
#:     Ring 00 : 0 -> 1 via P2P/direct pointer                                (2.4)
#:     Channel 00 : 0[1000] -> 1[2000] via P2P/IPC                             (2.7)
#:     Channel 00/0 : 7[7] -> 8[0] [send] via NET/IB/0/GDRDMA                  (2.18.3+)
#:     Channel 02/0 : 1[1] -> 2[2] via P2P/CUMEM/read                          (2.20+)
#:     CollNet 00/0 : 3 [send] via COLLNET/SHARP/0                             (2.14+)
CONN_RE = re.compile(
    r"^(?P<kind>Ring|Channel|CollNet) (?P<ch>\d+)(?:/(?P<conn>\d+))? : "
    r"(?P<src>\d+)(?:\[(?P<sdev>[0-9a-fA-F]+)\])?"
    r"(?: -> (?P<dst>\d+)(?:\[(?P<ddev>[0-9a-fA-F]+)\])?)?"
    r"(?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)\s*$"
)

#: Rank 0's ring listing (``Channel 00/32 :    0   1   2 ...``); at most 20 ranks before 2.23.
RING_LIST_RE = re.compile(
    r"^Channel (?P<ch>\d+)(?:/(?P<nch>\d+))? :(?P<ranks>(?: +\d+)*)(?: \.\.\.)?\s*$"
)

#: The rank inside ``Trees`` / ``Ring`` / ``Tree`` lines: the middle of ``a->rank->b``.
#:
#: Samples: ``Trees [0] 1/-1/-1->0->-1 [1] -1/-1/-1->0->1`` (2.8+),
#: ``Ring 00 : 7 -> 0 -> 1`` (GRAPH), ``Tree 0 : -1 -> 0 -> 1/8/-1`` (GRAPH).
TREE_RANK_RE = re.compile(
    r"^(?:Trees \[\d+\] [-\d/]+->(?P<trees>\d+)->"
    r"|(?:Ring|Tree) \d+ : -?[\d/-]+ -> (?P<graph>\d+) -> )"
)

#: A return-code chain line (INFO): ``transport/net.cc:1286 -> 6`` and its variants.
#:
#: Samples::
#:
#:     transport/net.cc:1286 -> 6
#:     misc/socket.cc:561 -> 2 (Connection refused) [Async thread]
#:     proxy.cc:1529 (progressOps) -> 6 [Progress Thread]                      (2.30.7+)
CHAIN_RE = re.compile(
    r"^(?P<file>[^\s:]+):(?P<line>\d+)(?: \((?P<func>[^)]*)\))? -> (?P<code>\d+)"
    r"(?: \((?P<errstr>[^)]*)\))?(?: \[(?P<thread>[^\]]+)\])?\s*$"
)

#: ``NCCL_IB_TIMEOUT set by environment to 22.`` and ``NCCL_IB_HCA set to mlx5_0``.
ENV_RE = re.compile(r"^(?P<name>NCCL_\w+) set (?:by environment )?to (?P<value>.*?)\.?\s*$")

#: Init timings (2.22 and 2.23+): ``Init timings - ncclCommInitRank: rank 3 nranks 16
#: total 1.21 (kernels 0.18, alloc 0.01, bootstrap 0.62, ...)``.
INIT_TIMINGS_RE = re.compile(
    r"^Init timings(?: - (?P<fn>\w+))?: rank (?P<rank>\d+) nranks (?P<nranks>\d+) "
    r"total (?P<total>[\d.]+)"
)
