"""The HTML report's cluster section (issue #29): what the cluster's exporters measured
for the job's hosts, on the same time axis as the collectives' timeline: each port's
error counters as they rose (symbol errors, link downs and recoveries), each port's
share of time waiting for credits, and each GPU's events (an XID with its code, a
double-bit ECC error, a clock slowdown).  Read from ``Analysis.cluster``
(``analyze --prometheus``); the reading's own limits are in the CLUSTER text section."""

from __future__ import annotations

import polars as pl
from plotly import graph_objects as go
from plotly.subplots import make_subplots

from ncclscope.cluster.tables import ClusterTables
from ncclscope.detect.fabric import PORT_ERRORS, SLOWDOWN_BITS, WAIT_TICK_S

__all__ = ["INTRO", "cluster_figure"]

INTRO = (
    "<p>What the cluster's exporters measured for the job's hosts, on the collectives' "
    "time axis: ports' errors and waiting, GPUs' events; findings' windows shaded.</p>"
)

#: Ports whose waiting is drawn: the ones that waited most.
MAX_WAIT_LINES = 8
_XID = "DCGM_FI_DEV_XID_ERRORS"
_DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
_REASONS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")


def _naive(frame: pl.DataFrame) -> list[object]:
    """Times as plotly draws the timeline's: UTC, without a zone."""
    return frame.select(pl.col("ts").dt.replace_time_zone(None))["ts"].to_list()


def cluster_figure(cluster: ClusterTables) -> go.Figure | None:
    """Three rows sharing the time axis: port errors, port waiting, GPU events; None
    when nothing was read for the job's hosts."""
    ports, gpus = cluster.ports, cluster.gpus
    if ports.is_empty() and gpus.is_empty():
        return None
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        row_heights=[0.4, 0.3, 0.3],
        subplot_titles=(
            "InfiniBand port errors (increase per step)",
            "share of time ports waited for credits",
            "GPU events",
        ),
    )
    port = pl.format("{} {}:{}", "host", "device", "port")
    errors = ports.filter(
        pl.col("metric").is_in(list(PORT_ERRORS))
        & (pl.col("kind") == "increase")
        & (pl.col("value") > 0)
    ).with_columns(port.alias("where"))
    for metric in sorted(errors["metric"].unique().to_list()):
        rows = errors.filter(pl.col("metric") == metric).sort("ts")
        fig.add_trace(
            go.Scatter(
                x=_naive(rows),
                y=rows["where"].to_list(),
                mode="markers",
                name=metric.removesuffix("_total").replace("_", " "),
                marker={"size": [min(18, 6 + 2 * v**0.5) for v in rows["value"].to_list()]},
                text=[f"+{v:g}" for v in rows["value"].to_list()],
                hovertemplate="%{y}<br>%{x}<br>%{text}<extra>" + metric + "</extra>",
            ),
            row=1,
            col=1,
        )
    wait = ports.filter(pl.col("metric") == "port_transmit_wait_total").filter(
        pl.col("kind") == "rate_per_s"
    )
    if len(wait):
        wait = wait.with_columns(
            port.alias("where"), (pl.col("value") * WAIT_TICK_S).alias("share")
        )
        top = (
            wait.group_by("where")
            .agg(pl.col("share").max())
            .sort("share", descending=True)
            .head(MAX_WAIT_LINES)["where"]
            .to_list()
        )
        for where in top:
            rows = wait.filter(pl.col("where") == where).sort("ts")
            fig.add_trace(
                go.Scatter(
                    x=_naive(rows),
                    y=rows["share"].to_list(),
                    mode="lines",
                    name=f"wait {where}",
                    hovertemplate="%{y:.1%}<br>%{x}<extra>" + where + "</extra>",
                ),
                row=2,
                col=1,
            )
    gpu = pl.format("{} GPU {}", "host", "gpu")
    # XID and the clock reasons are gauges holding their last value: drawn where it
    # changes (an XID stays 79 until the driver is reloaded), not at every sample
    changed = pl.col("value") != pl.col("value").shift(1).over("host", "gpu", "metric")
    gpus = gpus.sort("ts").filter((pl.col("kind") != "gauge") | changed.fill_null(value=True))
    events = [
        gpus.filter((pl.col("metric") == _XID) & (pl.col("value") > 0)).with_columns(
            pl.format("XID {}", pl.col("value").cast(pl.Int64)).alias("what")
        ),
        gpus.filter(
            (pl.col("metric") == _DBE) & (pl.col("kind") == "increase") & (pl.col("value") > 0)
        ).with_columns(pl.lit("double-bit ECC").alias("what")),
        gpus.filter(
            pl.col("metric").is_in(_REASONS)
            & ((pl.col("value").cast(pl.Int64, strict=False) & SLOWDOWN_BITS) > 0)
        ).with_columns(
            pl.format(
                "clock slowdown 0x{}",
                pl.col("value")
                .cast(pl.Int64)
                .map_elements(lambda v: format(v, "x"), return_dtype=pl.String),
            ).alias("what")
        ),
    ]
    for frame in events:
        if frame.is_empty():
            continue
        rows = frame.with_columns(gpu.alias("where")).sort("ts")
        fig.add_trace(
            go.Scatter(
                x=_naive(rows),
                y=rows["where"].to_list(),
                mode="markers",
                name=str(rows["what"][0]).split(" 0x")[0] if len(rows) else "GPU",
                marker={"symbol": "x", "size": 9},
                text=rows["what"].to_list(),
                hovertemplate="%{y}<br>%{x}<br>%{text}<extra></extra>",
            ),
            row=3,
            col=1,
        )
    fig.update_yaxes(tickformat=".0%", row=2, col=1)
    fig.update_xaxes(title="time (UTC)", row=3, col=1)
    fig.update_layout(height=720, showlegend=True, legend={"orientation": "h", "y": -0.12})
    return fig
