"""``analyze --prom-out``: the job's metrics as the agent would export them at the last
line of the logs, written once in Prometheus text format."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from ncclscope.agent.exporter import Board, identity_rows, write_textfile
from ncclscope.agent.live import job_rows
from ncclscope.agent.rollup import exported
from ncclscope.diagnose import Diagnosis

__all__ = ["write_postmortem"]


def write_postmortem(diagnosis: Diagnosis, path: Path) -> None:
    """Write the job's metrics at the logs' last time (else now) to ``path``."""
    board = Board()
    board.set("identity", identity_rows())
    now = diagnosis.context.last_ts or datetime.now(UTC)
    board.set("job", exported(job_rows(diagnosis, now), now.timestamp()))
    write_textfile(board, path)
