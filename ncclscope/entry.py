"""The ``ncclscope`` console script: settles what the process needs before polars loads.

The sidecar commands (``agent``, ``replay``) run beside a training job for days.  Two
settings only take effect if they are in the environment when polars is imported, so
they are set here, before anything imports it, and only where the user has not set
them:

- ``POLARS_MAX_THREADS=1``: the agent's periodic detector run takes one core, not every
  core the training job is using (it is small work: a window of the latest lines).
- ``_RJEM_MALLOC_CONF`` (polars' jemalloc): keep freed pages for 30 s, longer than the
  interval between detector runs, so each run reuses the memory of the one before
  instead of handing it back to the kernel and faulting it in again; and serve large
  allocations from the same arenas (``oversize_threshold:0``: by default those over
  8 MiB go to an arena that returns its pages at once).  The agent's RSS is then its
  working set, steady, rather than a saw-tooth.
"""

from __future__ import annotations

import os
import sys

__all__ = ["SIDECAR_COMMANDS", "SIDECAR_ENV", "main"]

SIDECAR_COMMANDS = frozenset({"agent", "replay"})
SIDECAR_ENV = {
    "POLARS_MAX_THREADS": "1",
    "_RJEM_MALLOC_CONF": "dirty_decay_ms:30000,muzzy_decay_ms:30000,oversize_threshold:0",
}


def main() -> None:
    """Console-script entry point."""
    command = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    if command in SIDECAR_COMMANDS and "polars" not in sys.modules:
        for key, value in SIDECAR_ENV.items():
            os.environ.setdefault(key, value)
    from ncclscope.cli import main as cli_main  # after the environment is set

    cli_main()
