"""Golden exposition: the agent's /metrics for a fixed fake-NVML state, a fixed host
sample and a replayed fixture, compared with tests/golden/agent_exposition.prom.

Values that depend on the machine or the moment (timings, CPU seconds, versions, the
hostname) are masked.  Regenerate only on purpose:
``NCCLSCOPE_REGENERATE=1 .venv/bin/pytest tests/test_agent_golden.py``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from prometheus_client import generate_latest
from test_agent_run import STALLED, _Clock, _Host

from ncclscope.agent.exporter import new_registry, render
from ncclscope.agent.fake_nvml import FakeNvml
from ncclscope.agent.nvml import NvmlCollector
from ncclscope.agent.replay import ReplaySource
from ncclscope.agent.run import Agent, AgentConfig

GOLDEN = Path(__file__).parent / "golden" / "agent_exposition.prom"
_MASK = re.compile(
    r"^(ncclscope_(?:scrape_collector_duration_seconds|sample_cpu_seconds_total)\{[^}]*\}) .*$"
    r"|(?<=ncclscope_build_info\{)[^}]*(?=\})",
    re.MULTILINE,
)


def _mask(text: str) -> str:
    return _MASK.sub(lambda m: f"{m.group(1)} <masked>" if m.group(1) else "<masked>", text)


def test_exposition_matches_the_golden_file() -> None:
    clock = _Clock()
    source = ReplaySource([STALLED], speed=60.0, clock=clock)
    nvml = NvmlCollector(FakeNvml.with_devices(2))  # type: ignore[arg-type]
    a = Agent(
        AgentConfig(analyse_s=0.0, hostname="node-golden"),
        nvml=nvml,
        host=_Host(),
        lines=source,
        wall=source.now,
    )
    a.start()
    clock.t = 5.0
    a.tick()
    text = _mask(render(a.board).decode())
    # the fast renderer writes what client_python would, byte for byte
    assert render(a.board) == generate_latest(new_registry(a.board))
    a.finish()
    if os.environ.get("NCCLSCOPE_REGENERATE"):
        GOLDEN.write_text(text)  # then compared with itself: regenerating passes
    assert text == GOLDEN.read_text(), "run with NCCLSCOPE_REGENERATE=1 after checking the diff"
    assert "ncclscope_timeout_culprit_info{comm=" in text
    assert 'gpu="1"' in text
