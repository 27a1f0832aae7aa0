"""The HTML report's cluster section (#29 item 4): the ports' errors and waiting and the
GPUs' events on the collectives' time axis, from what ``analyze --prometheus`` read."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ncclscope.analysis import build
from ncclscope.diagnose import diagnose
from ncclscope.export.html_report import render_html
from ncclscope.synth import SlowHost, SynthSpec, generate
from ncclscope.synth.cluster import GpuXid, PortErrors, cluster_tables, with_cluster


def _ts(text: str) -> datetime:
    ts = datetime.fromisoformat(text)
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


def _figure(html: str, div: str) -> dict[str, object]:
    """The plotly figure drawn into ``div``: its traces' data and layout."""
    at = html.index(f'id="{div}"')
    call = html.index("Plotly.newPlot(", at)
    args = html[call + len("Plotly.newPlot(") :]
    body = args[args.index("[") :]
    depth = 0
    for k, ch in enumerate(body):
        depth += ch == "["
        depth -= ch == "]"
        if depth == 0:
            return {"data": json.loads(body[: k + 1])}
    raise AssertionError("no figure")


def test_port_errors_and_an_xid_are_drawn_on_the_job_s_time_axis(tmp_path: Path) -> None:
    spec = SynthSpec(
        ranks=8, hosts=2, steps=12, timestamps=True, step_time_s=3.0, seed=4,
        faults=(SlowHost("node-1", slowdown=0.5, from_instance=40, to_instance=100),),
    )  # fmt: skip
    truth = generate(spec, tmp_path / "job").to_dict()
    first = _ts(str(truth["first_ts"]))
    errors_at = first + timedelta(seconds=20)
    faults = [
        PortErrors("node-1", errors_at, errors_at + timedelta(seconds=30), symbol_errors=90),
        GpuXid("node-0", 2, first + timedelta(seconds=40), code=79),
    ]
    tables = cluster_tables(truth, faults, seed=4)
    d = diagnose(with_cluster(build([str(tmp_path / "job")], workdir=tmp_path / "w"), tables))
    html = render_html(d)
    assert '<section id="cluster">' in html
    data = _figure(html, "plot-cluster")["data"]
    assert isinstance(data, list)
    names = {t["name"] for t in data}
    assert "symbol error" in names, names
    symbols = next(t for t in data if t["name"] == "symbol error")
    assert set(symbols["y"]) == {"node-1 mlx5_0:1"}
    # the injected burst where it happened (a stray background error may be drawn too)
    drawn = [
        (datetime.fromisoformat(x).replace(tzinfo=UTC), int(re.sub(r"\D", "", n)))
        for x, n in zip(symbols["x"], symbols["text"], strict=True)
    ]
    window = (errors_at - timedelta(seconds=15), errors_at + timedelta(seconds=60))
    assert sum(n for t, n in drawn if window[0] <= t <= window[1]) >= 90, drawn
    xid = next(t for t in data if str(t["name"]).startswith("XID"))
    assert xid["y"] == ["node-0 GPU 2"]
    assert xid["text"] == ["XID 79"]


def test_no_cluster_read_no_section(tmp_path: Path) -> None:
    spec = SynthSpec(ranks=4, hosts=1, steps=3, timestamps=True, seed=1)
    generate(spec, tmp_path / "job")
    d = diagnose(build([str(tmp_path / "job")], workdir=tmp_path / "w"))
    assert '<section id="cluster">' not in render_html(d)
