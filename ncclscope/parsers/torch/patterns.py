"""The message grammars of the PyTorch-distributed parser, applied after the prefixes.

One pattern per family: c10d's watchdog timeout and its companion lines, the heartbeat
monitor, the desync report, ``NCCL error ... Last error:``, torchelastic's agent line and
its ``ChildFailedError`` summary.  Each comment shows a real sample line.

Sample::

    [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=57, ...
"""

from __future__ import annotations

import re

__all__: list[str] = []  # internal to the torch parser; lines.py is its interface

# --------------------------------------------------------------------------------------
# Message patterns (applied to the text after the prefixes)

#: The watchdog timeout, 1.x to 2.8 (``NumelIn``/``NumelOut`` from 2.0, ``SeqNum``
#: from 1.10); the fields are read by :data:`_KV_RE` so new ones do not break it::
#:
#:     [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=57,
#:     OpType=_ALLGATHER_BASE, NumelIn=1024, NumelOut=16384, Timeout(ms)=600000) ran for
#:     600113 milliseconds before timing out.
_WD_RE = re.compile(
    r"(?:\[Rank (?P<rank>\d{1,9})\] )?Watchdog caught collective operation timeout: "
    r"WorkNCCL\((?P<fields>(?:[^()]|\(ms\)){1,600}?)\) ran for\s?(?P<ran>\d{1,19})\s?"
    r"milliseconds before timing out",
    re.ASCII,
)
_KV_RE = re.compile(r"(\w{1,40}(?:\(ms\))?)=([^,]{0,40})", re.ASCII)

#: ``[PG 2 Rank 6] Process group watchdog thread terminated with exception: <what>``
#: (``NCCL watchdog thread ...`` in 2.0-2.3).
_TERM_RE = re.compile(r"(?:NCCL|Process group) watchdog thread terminated with exception: ?")

#: Companion lines: where the PG stood when the watchdog fired.
#:
#:     [PG 1 Rank 2] Exception (either an error or timeout) detected by watchdog at work:
#:     2641, last enqueued NCCL work: 2643, last completed NCCL work: 2640.        (2.4-2.6)
#:     [PG 0 (default_pg) Rank 6] Timeout at NCCL work: 57, last enqueued NCCL work: 58,
#:     last completed NCCL work: 56.                                                (2.4)
#:     [PG ID 0 PG GUID 0(default_pg) Rank 3]  failure detected by watchdog at work
#:     sequence id: 48213 PG status: last enqueued work: 48215, last completed work: 48212
_EXC_DET_RE = re.compile(
    r"Exception \(either an error or timeout\) detected by watchdog at work: (?P<seq>\d{1,19}), "
    r"last enqueued NCCL work: (?P<enq>-?\d{1,19}), last completed NCCL work: (?P<comp>-?\d{1,19})",
    re.ASCII,
)
_TO_AT_RE = re.compile(
    r"Timeout at NCCL work: (?P<seq>\d{1,19}), last enqueued\s{1,4}NCCL work: (?P<enq>-?\d{1,19}), "
    r"last completed\s{1,4}NCCL work: (?P<comp>-?\d{1,19})",
    re.ASCII,
)
_FAIL_DET_RE = re.compile(
    r"failure detected by watchdog at work sequence id: (?P<seq>\d{1,19}) PG status: "
    r"last enqueued work: (?P<enq>-?\d{1,19}), last completed work: (?P<comp>-?\d{1,19})",
    re.ASCII,
)

#: ``[PG 0 Rank 3] Heartbeat monitor timed out! Process will be terminated after dumping
#: debug info. workMetaList_.size()=57`` (>= 2.3): outstanding works on this rank.
_HB_RE = re.compile(
    r"Heartbeat monitor timed out!.{0,300}?workMetaList_\.size\(\) ?= ?(?P<n>\d{1,19})", re.ASCII
)
_HB_LENIENT_RE = re.compile(r"Heartbeat monitor timed out!")

#: ``[PG 0 Rank 3] ProcessGroupNCCL's watchdog got stuck for 600 seconds without making
#: progress in monitoring enqueued collectives. ...``
_STUCK_RE = re.compile(
    r"watchdog got stuck for (?P<sec>\d{1,12}) seconds? without making progress", re.ASCII
)

#: The desync report (``TORCH_NCCL_DESYNC_DEBUG=1``, TraceUtils.h), one item a line::
#:
#:     [E ProcessGroupNCCL.cpp:1942]
#:     	 - [2] Timeout at collective: ALLREDUCE, #642
#:     	 - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:
#:     	   - [5] joined but didn't finish collective #436 (count from 1)
#:     	     [0, 1] finished collective #436, but didn't join collective #437 (count from 1)
#:     	 - To our best knowledge, ranks [4, 7] are the lagging ranks that caused this
#:     timeout. They never joined any collectives
_DESYNC_TO_RE = re.compile(
    r"\[(?P<rank>\d{1,9})\] Timeout at collective: (?P<op>\w{1,64}), #(?P<seq>\d{1,19})",
    re.ASCII,
)
_RANKS = r"\[(?P<ranks>[\d, ]{1,65536})\]"
_DESYNC_JOINED_RE = re.compile(
    _RANKS + r" joined but didn't finish collective #(?P<seq>\d{1,19})", re.ASCII
)
_DESYNC_FINISHED_RE = re.compile(
    _RANKS + r" finished collective #\d{1,19}, but didn't join collective #(?P<seq>\d{1,19})",
    re.ASCII,
)
_DESYNC_NEVER_RE = re.compile(_RANKS + r" are the lagging ranks that caused this timeout", re.ASCII)

#: ``NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691, unhandled
#: system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3`` (C10D_NCCL_CHECK)
#: and ``NCCL error: remote process exited or there was a network error, NCCL version
#: 2.18.1`` (async errors); then ``ncclRemoteError: ...``, ``Last error:`` and its text.
_NCCL_ERR_RE = re.compile(r"NCCL error(?: in: (?P<where>[^\s,]{1,400}),|:) (?P<rest>.{0,4000})")
_NCCL_CODE_RE = re.compile(r"\s{0,8}(?P<code>nccl[A-Z]\w{0,40}): (?P<desc>.{0,1000})", re.ASCII)
_LAST_ERR_RE = re.compile(r"\s{0,8}Last error:(?P<text>.{0,2000})")

#: ``Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:565
#: (most recent call first):`` (every c10::Error's location line).
_EXC_RAISED = "Exception raised from "

#: torchelastic, before it kills the others: ``Sending process 48210 closing signal SIGTERM``.
_CLOSING_RE = re.compile(
    r"Sending process (?P<pid>\d{1,10}) closing signal (?P<sig>SIG[A-Z0-9]{1,10})", re.ASCII
)

#: The torchelastic agent's verdict (three header styles, all stripped as prefixes):
#: ``failed (exitcode: -6) local_rank: 1 (pid: 87) of binary: /opt/conda/bin/python``
_AGENT_RE = re.compile(
    r"failed \(exitcode: (?P<code>-?\d{1,10})\) local_rank: (?P<lr>\d{1,9}) "
    r"\(pid: (?P<pid>\d{1,10})\)",
    re.ASCII,
)

#: The ChildFailedError summary (>= 1.11; 1.9/1.10 print ``Root Cause:`` first and
#: ``Other Failures:``, fields ``time: ``, ``msg: "Signal 6 (SIGABRT) ..."``)::
#:
#:     torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
#:     ============================================================
#:     train.py FAILED
#:     ------------------------------------------------------------
#:     Failures:
#:     [1]:
#:       time      : 2024-09-27_03:12:48
#:       host      : gpu-node-07.cluster.local
#:       rank      : 13 (local_rank: 5)
#:       exitcode  : -6 (pid: 1184572)
#:       error_file: <N/A>
#:       traceback : Signal 6 (SIGABRT) received by PID 1184572
#:     ------------------------------------------------------------
#:     Root Cause (first observed failure):
#:     [0]:
#:       ...
#:     ============================================================
#:
#: ``[k]:`` is the entry's index, not the rank (``[1]:`` may hold ``rank : 2``).
_SUM_SECTION_RE = re.compile(
    r"\s{0,8}(?:(?P<root>Root Cause(?: \(first observed failure\))?)|(?:Other )?Failures):\s*$"
)
_SUM_ENTRY_RE = re.compile(r"\s{0,8}\[(?P<idx>\d{1,9})\]:\s*$", re.ASCII)
_SUM_FIELD_RE = re.compile(
    r"\s{0,8}(?P<key>time|host|rank|exitcode|error_file|traceback|msg)\s{0,12}:\s?(?P<val>.{0,2000})"
)
_SUM_RANK_RE = re.compile(r"(?P<rank>\d{1,9}) \(local_rank: (?P<lr>\d{1,9})\)", re.ASCII)
_SUM_EXIT_RE = re.compile(r"(?P<code>-?\d{1,10}) \(pid: (?P<pid>\d{1,10})\)", re.ASCII)
_SUM_TIME_RE = re.compile(r"(?P<date>\d{4}-\d{2}-\d{2})_(?P<time>\d{2}:\d{2}:\d{2})", re.ASCII)
_SUM_SIGNAL_RE = re.compile(r"Signal \d{1,3} \((?P<sig>SIG[A-Z0-9]{1,10})\)", re.ASCII)
_SUM_RULE_RE = re.compile(r"\s{0,8}(?:={5,}|-{5,}|\*{5,})\s*$")
_SUM_TITLE_RE = re.compile(r"\s{0,40}\S{1,500} FAILED\s*$")
#: The ``====`` rule a summary's title sits under (its frame's top).
_SUM_TOP_RULE_RE = re.compile(r"\s{0,8}={5,}\s*$")
_NO_OTHER = "<NO_OTHER_FAILURES>"

#: A torch version printed by an environment dump: ``PyTorch version: 2.1.0+cu121``
#: (collect_env), ``- PyTorch version (GPU?): 2.3.1 (True)`` (transformers-cli env),
#: ``torch version .................... 2.1.0+cu121`` (ds_report), ``torch==2.4.1`` (pip).
_VERSION_RES: tuple[re.Pattern[str], ...] = (
    re.compile(r"PyTorch version(?: \(GPU\?\))?: (?P<v>\d{1,3}\.\d{1,3}[\w.+-]{0,60})", re.ASCII),
    re.compile(r"torch version \.{0,80} ?(?P<v>\d{1,3}\.\d{1,3}[\w.+-]{0,60})", re.ASCII),
    re.compile(r"(?<![\w.-])torch==(?P<v>\d{1,3}\.\d{1,3}[\w.+-]{0,60})", re.ASCII),
)
