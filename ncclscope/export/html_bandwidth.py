"""The HTML report's bus-bandwidth plot: the job's (NCCL Inspector) against the fabric's
baseline (nccl-tests), per message size, log-log."""

from __future__ import annotations

import html

import plotly.graph_objects as go

from ncclscope.detect.collective_cost import cost_by_size
from ncclscope.model.tools import ToolTables

__all__ = ["BANDWIDTH_INTRO", "NO_BANDWIDTH", "bandwidth_figure"]

NO_BANDWIDTH = (
    "No NCCL Inspector records and no nccl-tests output among the inputs: bus bandwidth per "
    "message size is not measured (COLL lines time no collective). Run the job with "
    "<code>NCCL_PROFILER_PLUGIN=libnccl-profiler-inspector.so NCCL_INSPECTOR_ENABLE=1</code> "
    "(NCCL &ge; 2.28) and give its <code>NCCL_INSPECTOR_DUMP_DIR</code> beside the logs; "
    "give an <code>all_gather_perf</code> run's output for the fabric's baseline."
)
BANDWIDTH_INTRO = (
    "NCCL Inspector's bus bandwidth per power-of-two message size: the median over records "
    "(as the ranks saw it, waits for late ranks included) and the network's (per "
    "collective, its shortest execution: the rank that waited for nobody), against "
    "nccl-tests' out-of-place bus bandwidth where its output is among the inputs."
)
_GBS = 1e9
_HOVER = "%{x:.3s}B: %{y:.2f} GB/s<extra></extra>"


def _gbs(values: list[float | None]) -> list[float | None]:
    return [None if v is None else v / _GBS for v in values]


def bandwidth_figure(tools: ToolTables) -> go.Figure | None:
    """The plot, or None when neither Inspector records nor nccl-tests rows are there."""
    cost = cost_by_size(tools.inspector)
    runs = tools.nccl_tests
    if cost.is_empty() and runs.is_empty():
        return None
    fig = go.Figure()
    if not cost.is_empty():
        for (op,), part in cost.partition_by("op", as_dict=True, maintain_order=True).items():
            for col, name, dash in (
                ("bus_bw_bytes_per_s", "as the ranks saw it", "solid"),
                ("net_bus_bw_bytes_per_s", "network (shortest execution)", "dot"),
            ):
                fig.add_trace(
                    go.Scatter(
                        x=part["bucket_bytes"].to_list(),
                        y=_gbs(part[col].to_list()),
                        mode="lines+markers",
                        line={"dash": dash},
                        name=html.escape(f"{op}: {name}"),
                        hovertemplate=_HOVER,
                    )
                )
    paths = {fid: path for fid, path, _kind, _n in tools.files}
    for (fid, run), part in runs.partition_by(
        "file_id", "run", as_dict=True, maintain_order=True
    ).items():
        test = part["test"][0] or "nccl-tests"
        where = paths.get(int(str(fid)), "")
        fig.add_trace(
            go.Scatter(
                x=part["size_bytes"].to_list(),
                y=_gbs(part["oop_bus_bw_bytes_per_s"].to_list()),
                mode="lines+markers",
                line={"dash": "dash"},
                name=html.escape(f"baseline {test} ({where} #{run})"),
                hovertemplate=_HOVER,
            )
        )
    fig.update_layout(height=420)
    fig.update_xaxes(title="message size (bytes; whole buffer, as nccl-tests counts)", type="log")
    fig.update_yaxes(title="bus bandwidth (GB/s)")
    return fig
