"""The ``ncclscope`` console script: settles what the process needs before polars loads.

The sidecar commands (``agent``, ``replay``) run beside a training job for days.  Two
settings only take effect if they are in the environment when polars is imported, so
they are set here, before anything imports it, and only where the user has not set
them:

- ``POLARS_MAX_THREADS=1``: the agent's analysis of its window (in a process of its
  own, ``agent.reference``, which inherits this) takes one core, not every core the
  training job is using (it is small work: a window of the latest lines).
- ``_RJEM_MALLOC_CONF`` (polars' jemalloc): one arena for all threads, freed pages kept
  for 10 minutes, and large allocations in that arena too (``oversize_threshold:0``: by
  default those over 8 MiB go to an arena that returns its pages at once).  Each
  detector run (every few seconds, in a new thread) then reuses the pages of the run
  before instead of handing them back to the kernel and faulting them in again; with
  an arena per thread, a run's pages sat in another arena than the next run's.  The
  agent's RSS is then its working set, steady (measured: a 30-minute soak in
  ``benchmarks/README.md``), rather than a saw-tooth; pages unused for 10 minutes are
  still returned.  (Since the analyses left the agent for a process of their own, only
  a stall's reading and replays driven by hand allocate in the agent's arena.)
"""

from __future__ import annotations

import os
import sys

__all__ = ["SIDECAR_COMMANDS", "SIDECAR_ENV", "main"]

SIDECAR_COMMANDS = frozenset({"agent", "replay"})
SIDECAR_ENV = {
    "POLARS_MAX_THREADS": "1",
    "_RJEM_MALLOC_CONF": (
        "narenas:1,dirty_decay_ms:600000,muzzy_decay_ms:600000,oversize_threshold:0"
    ),
}


def main() -> None:
    """Console-script entry point."""
    command = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    if command in SIDECAR_COMMANDS and "polars" not in sys.modules:
        for key, value in SIDECAR_ENV.items():
            os.environ.setdefault(key, value)
    from ncclscope.cli import main as cli_main  # after the environment is set

    cli_main()
