"""What launchers and loggers put in front of every line of a tool's output.

nccl-tests and ``ncclras`` output reaches users through ``mpirun --tag-output``
(``[1,0]<stdout>:``), ``srun --label`` (`` 0: ``), Intel MPI's ``-prepend-rank``
(``[0] ``), torchrun's ``--tee`` (``[default0]:``), Ray/SkyPilot job logs
(``(head, rank=0, pid=3808) ``), ``pdsh``/``clush`` (``node-a: ``) and timestamping
filters (``ts``: ``Mar 02 11:04:31 ``; ISO-8601, bracketed or not).  They stack
(a timestamp before an MPI tag), so :func:`strip_prefix` removes them repeatedly
from the start of a line.  Pure: no state, no I/O.
"""

from __future__ import annotations

import re

__all__ = ["strip_prefix"]

_PREFIXES = re.compile(
    r"""^(?:
        \[\d+,\d+\]<std(?:out|err)>:\s?            # Open MPI --tag-output
      | \([^()]{0,80}?\b(?:pid|rank|ip)=[^()]{0,60}\)\s+  # Ray / SkyPilot: (head, rank=0, pid=1)
      | \[\d{4}-\d\d-\d\d[T\ ][\d:.,]+(?:Z|[+-]\d\d:?\d\d)?\]\s*  # [2026-03-02 11:04:31]
      | \d{4}-\d\d-\d\d[T\ ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+
      | [A-Z][a-z]{2}\s+\d{1,2}\s\d\d:\d\d:\d\d(?:\.\d+)?\s+      # ts: Mar 02 11:04:31
      | \d{9,10}\.\d+\s+                            # epoch seconds
      | \s*\d{1,5}:\s                               # srun --label
      | \[\d{1,5}\]\s                               # Intel MPI -prepend-rank
      | \[[A-Za-z]+\d+\]:\s?                        # torchrun --tee: [default0]:
      | [A-Za-z][\w.-]{0,62}:\s+                    # pdsh / clush: node-a:
    )""",
    re.VERBOSE,
)


def strip_prefix(line: str) -> str:
    """``line`` without the launcher/logger prefixes at its start (repeatedly)."""
    for _ in range(4):
        m = _PREFIXES.match(line)
        if m is None or not m.end():
            return line
        line = line[m.end() :]
    return line
