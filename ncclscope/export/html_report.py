"""The HTML report: one self-contained file that opens offline (``analyze --html``).

plotly.js is embedded once (about 4.8 MB); every plot is a ``Plotly.newPlot`` call on
data already reduced to what a screen can show, so the file stays small beside
plotly.js whatever the job's size:

- the per-rank timeline keeps, per rank and time bin, the call that came latest (a
  straggler's late arrivals are exactly what survives), plus a "waiting" bar per rank
  from its last logged collective to the end of the logs;
- the lateness heatmap keeps, per rank and step (or group of steps), the worst lateness;
- telemetry keeps, per series and time bin, the minimum, the maximum and the last
  sample, so peaks and dips are never averaged away.

Every string that comes from a log (host names, messages, quoted lines, evidence) goes
through :func:`html.escape` before it reaches the page or a plot label; plotly's own
JSON encoding escapes ``<`` inside the ``<script>`` blocks.

Steps come from one function, :func:`step_table`, so that the per-rank per-step
per-phase table of the correlation work can replace what it derives today (DeepSpeed's
timers on rank 0, or the collectives' repeating pattern).
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
import polars as pl
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from ncclscope import __version__
from ncclscope.detect.base import Finding, ranks_text
from ncclscope.detect.context import Context
from ncclscope.export.html_bandwidth import BANDWIDTH_INTRO, NO_BANDWIDTH, bandwidth_figure
from ncclscope.export.html_flight import flight_body
from ncclscope.export.json_report import flight_doc
from ncclscope.hosts import with_log_hosts
from ncclscope.model.timeline import find_period
from ncclscope.schema import REPORT_STEPS_SCHEMA, TS

if TYPE_CHECKING:
    from ncclscope.diagnose import Diagnosis
    from ncclscope.model import Analysis

__all__ = [
    "MAX_HEATMAP_CELLS",
    "MAX_TELEMETRY_POINTS",
    "MAX_TIMELINE_POINTS",
    "render_html",
    "step_table",
    "write_html",
]

#: Points of the per-rank timeline at most (ranks x time bins).
MAX_TIMELINE_POINTS = 30_000
#: Time bins of the timeline at most (fewer when ranks are many).
_TIMELINE_BINS = 300
#: Cells of the lateness heatmap at most (ranks x step columns).
MAX_HEATMAP_CELLS = 60_000
#: Time bins per telemetry series (each keeps its min, max and last sample).
_TELEMETRY_BINS = 300
#: Telemetry points per metric at most (fewer bins per series when series are many).
MAX_TELEMETRY_POINTS = 30_000
#: GPU series per metric drawn one by one; beyond that, one per host.
_MAX_SERIES = 32
#: Step markers drawn on a time axis at most (every k-th step beyond that).
_MAX_STEP_MARKERS = 60
#: Sequences read to find the collectives' repeating pattern (a step).
_PATTERN_SEQS = 4096
#: Longest step pattern looked for, in collectives.
_MAX_PERIOD = 512

#: DeepSpeed timers stacked in the breakdown, in order (>= 0.10.1 names; the parser
#: normalises older ones).  ``*_microstep`` lines repeat them per micro-step.
_PHASES = ("fwd", "bwd", "step")
#: the timeline's phase names, as DeepSpeed's timers name the same phases
_TIMELINE_PHASES = {"forward": "fwd", "backward": "bwd", "optimizer": "step"}

_SEVERITY_COLOR = {"critical": "#c0392b", "warning": "#d68910", "info": "#2e86c1"}


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


# ----------------------------------------------------------------------------- steps


def step_table(analysis: Analysis, ctx: Context) -> pl.DataFrame:
    """Per (rank, step, phase): durations and times (``REPORT_STEPS_SCHEMA``).

    The one place steps come from: the timeline's per-rank phases cut from the world
    communicator's collective pattern (``ncclscope.model.timeline``) where NCCL timestamps
    allow; else DeepSpeed's timers (printed by rank 0 once per step); else the world
    communicator's collectives cut into steps by long gaps in time.
    """
    timeline = ctx.timeline.filter(pl.col("source") == "collectives")
    if not timeline.is_empty():
        return timeline.select(
            "rank",
            "step",
            pl.col("phase").replace_strict(_TIMELINE_PHASES, return_dtype=pl.String),
            pl.col("start_ts").alias("start"),
            pl.col("end_ts").alias("end"),
            "duration_s",
            "source",
        ).cast(REPORT_STEPS_SCHEMA)
    timers = _steps_from_timers(analysis.frameworks.timers)
    if not timers.is_empty():
        return timers
    return _steps_from_collectives(ctx)


def _steps_from_timers(timers: pl.DataFrame) -> pl.DataFrame:
    """One step per printed timer line of the ``fwd``/``bwd``/``step`` family.

    The printed step numbers are unreliable (DeepSpeed prints the timers of one step
    beside the progress line of another), so steps are numbered in print order.
    """
    plain = timers.filter(pl.col("name").is_in(_PHASES))
    family = plain
    if plain.is_empty():
        family = timers.filter(
            pl.col("name").is_in([f"{p}_microstep" for p in _PHASES])
        ).with_columns(pl.col("name").str.strip_suffix("_microstep"))
    if family.is_empty():
        return pl.DataFrame(schema=REPORT_STEPS_SCHEMA)
    lines = (
        family.select("file_id", "line_no")
        .unique()
        .sort("file_id", "line_no")
        .with_row_index("step")
    )
    rows = (
        family.drop("step")
        .join(lines, on=["file_id", "line_no"])
        .with_columns(pl.col("duration_s").sum().over("step").alias("total"))
    )
    return (
        rows.select(
            pl.col("rank"),
            pl.col("step").cast(pl.Int64),
            pl.col("name").alias("phase"),
            (pl.col("ts") - pl.duration(microseconds=(pl.col("total") * 1e6).cast(pl.Int64)))
            .cast(TS)
            .alias("start"),
            pl.col("ts").cast(TS).alias("end"),
            pl.col("duration_s"),
            pl.lit("deepspeed_timers").alias("source"),
        )
        .cast(REPORT_STEPS_SCHEMA)
        .sort("step", "phase")
    )


def _world_comm(ctx: Context) -> str | None:
    """The communicator with the most members that logged collectives."""
    if ctx.progress.is_empty():
        return None
    counts = ctx.progress.group_by("comm_key").agg(pl.len(), pl.col("calls").sum())
    return str(counts.sort(["len", "calls"], descending=True)["comm_key"][0])


def collective_period(ctx: Context) -> int | None:
    """Collectives per step on the world communicator, from their repeating ops."""
    comm = _world_comm(ctx)
    coll = ctx.collectives()
    if comm is None or coll is None:
        return None
    head = (
        coll.filter((pl.col("comm_key") == comm) & (pl.col("seq") < _PATTERN_SEQS))
        .group_by("seq")
        .agg(pl.col("op").first())
        .sort("seq")
        .collect(engine="streaming")
    )
    ops = head["op"]
    period = find_period(ops, min_period=2, max_period=min(_MAX_PERIOD, len(ops) // 2))
    # Ops alone: a period of one op (every call an AllReduce after the warm-up's
    # Broadcast) says nothing of the steps.
    if period is None or ops.slice(len(ops) // 4, period).n_unique() < 2:
        return None
    return period


def _steps_from_collectives(ctx: Context) -> pl.DataFrame:
    """Steps from the world communicator's collectives: its repeating pattern of ops, or
    failing that (every call the same op), the long gaps between calls in time."""
    comm = _world_comm(ctx)
    if comm is None or ctx.collectives() is None:
        return pl.DataFrame(schema=REPORT_STEPS_SCHEMA)
    inst = ctx.instances.filter(pl.col("comm_key") == comm).sort("seq")
    period = collective_period(ctx)
    if period is not None:
        starts = inst.with_columns((pl.col("seq") // period).alias("step"))
    elif inst["ts_min"].null_count() < len(inst) and len(inst) > 2:
        gap = pl.col("ts_min").diff().dt.total_microseconds()
        starts = inst.with_columns(
            (gap > 3 * gap.median()).fill_null(False).cum_sum().cast(pl.Int64).alias("step")
        )
    else:
        return pl.DataFrame(schema=REPORT_STEPS_SCHEMA)
    bounds = (
        starts.group_by("step")
        .agg(pl.col("ts_min").min().alias("start"), pl.col("ts_max").max().alias("last"))
        .sort("step")
        .with_columns(pl.col("start").shift(-1).alias("next"))
        .with_columns(pl.coalesce("next", "last").alias("end"))
    )
    return (
        bounds.select(
            pl.lit(None, pl.Int32).alias("rank"),
            pl.col("step").cast(pl.Int64),
            pl.lit("step").alias("phase"),
            pl.col("start").cast(TS),
            pl.col("end").cast(TS),
            ((pl.col("end") - pl.col("start")).dt.total_microseconds() / 1e6).alias("duration_s"),
            pl.lit("collectives").alias("source"),
        )
        .cast(REPORT_STEPS_SCHEMA)
        .sort("step")
    )


def step_bounds(steps: pl.DataFrame) -> pl.DataFrame:
    """Per step: its start and end (rows without times left out)."""
    return (
        steps.filter(pl.col("end").is_not_null())
        .group_by("step")
        .agg(pl.col("start").min(), pl.col("end").max())
        .sort("step")
    )


# ----------------------------------------------------------------------------- data


@dataclass
class _Data:
    """What the sections read, computed once."""

    analysis: Analysis
    diagnosis: Diagnosis
    ctx: Context
    steps: pl.DataFrame
    bounds: pl.DataFrame
    late: pl.DataFrame  # per sampled call: rank, host, op, seq, ts, late_ms
    labels: dict[int, str]  # rank -> "rank R (host)" (escaped)
    culprits: set[int]


def _lateness(ctx: Context, comm: str | None) -> pl.DataFrame:
    """Per sampled call of fully timed instances of the world communicator: its
    lateness after the instance's first arrival, in milliseconds."""
    empty = pl.DataFrame(
        schema={
            "rank": pl.Int32,
            "host": pl.String,
            "op": pl.String,
            "seq": pl.Int64,
            "ts": TS,
            "late_ms": pl.Float64,
        }
    )
    if comm is None or ctx.sample.is_empty():
        return empty
    inst = ctx.instances.filter(
        (pl.col("comm_key") == comm) & (pl.col("n") >= 2) & (pl.col("with_ts") == pl.col("n"))
    )
    if inst.is_empty():
        return empty
    return (
        ctx.sample.filter(pl.col("comm_key") == comm)
        .join(inst.select("comm_key", "seq", "ts_min"), on=["comm_key", "seq"])
        .select(
            pl.coalesce("rank", "comm_rank").cast(pl.Int32).alias("rank"),
            "host",
            "op",
            "seq",
            pl.col("ts").cast(TS),
            ((pl.col("ts") - pl.col("ts_min")).dt.total_microseconds() / 1e3).alias("late_ms"),
        )
    )


def _data(diagnosis: Diagnosis) -> _Data:
    # The detectors' context: lateness and periods are not computed a second time.
    analysis = diagnosis.analysis
    ctx = diagnosis.context
    steps = step_table(analysis, ctx)
    members = analysis.identity.members.filter(pl.col("rank").is_not_null())
    labels = {
        int(r["rank"]): _esc(f"rank {r['rank']} ({r['host']})")
        for r in members.unique("rank", keep="first").iter_rows(named=True)
    }
    culprits = {
        r
        for f in diagnosis.findings
        if f.kind in ("hang", "mismatch", "straggler", "timeout")
        for r in f.ranks
    }
    return _Data(
        analysis=analysis,
        diagnosis=diagnosis,
        ctx=ctx,
        steps=steps,
        bounds=step_bounds(steps),
        late=_lateness(ctx, _world_comm(ctx)),
        labels=labels,
        culprits=culprits,
    )


def _naive(ts: pl.Expr) -> pl.Expr:
    """UTC times without the zone: shorter in the page's JSON (axes say UTC)."""
    return ts.dt.replace_time_zone(None)


def _rank_label(d: _Data, rank: int) -> str:
    label = d.labels.get(rank, f"rank {rank}")
    if rank in d.culprits:
        return f'<span style="color:#c0392b"><b>{label}</b></span>'
    return label


# ----------------------------------------------------------------------------- sections


@dataclass
class _Section:
    anchor: str
    title: str
    body: str  # HTML


def _note(text: str) -> str:
    return f'<p class="why">{text}</p>'


_NO_TIMES = (
    "NCCL printed no times on its COLL lines, so arrivals and lateness cannot be measured. "
    "With NCCL &ge; 2.26 set <code>NCCL_DEBUG_TIMESTAMP_LEVELS=WARN,INFO</code> and "
    "<code>NCCL_DEBUG_TIMESTAMP_FORMAT='[%F %T.%6f] '</code>, or run "
    "<code>ncclscope agent --follow</code> beside the job to stamp each line as it arrives."
)
_NO_COLL = (
    "No COLL lines: per-rank collectives cannot be followed. Set "
    "<code>NCCL_DEBUG=INFO</code> and <code>NCCL_DEBUG_SUBSYS=INIT,COLL</code>."
)


def _plot(fig: go.Figure, div_id: str) -> str:
    fig.update_layout(
        template="plotly_white", margin={"l": 60, "r": 30, "t": 40, "b": 40}, hovermode="closest"
    )
    return str(
        fig.to_html(
            full_html=False,
            include_plotlyjs=False,
            div_id=div_id,
            config={"displaylogo": False, "responsive": True},
        )
    )


def _timeline(d: _Data) -> _Section:
    title = "Per-rank timeline of collectives"
    a = d.analysis
    if a.collectives is None:
        return _Section("timeline", title, _note(_NO_COLL))
    if d.late.is_empty():
        return _Section("timeline", title, _note(_NO_TIMES) + _progress_plot(d))
    late = d.late.with_columns(
        ((pl.col("ts") - pl.col("ts").min()).dt.total_microseconds()).alias("us")
    )
    ranks = sorted(late["rank"].unique().to_list())
    bins = max(20, min(_TIMELINE_BINS, MAX_TIMELINE_POINTS // max(1, len(ranks))))
    span = max(1, int(late.select(pl.col("us").max()).item() or 1))
    kept = (
        late.with_columns((pl.col("us") * bins // (span + 1)).alias("bin"))
        .sort("late_ms", descending=True)
        .group_by("rank", "bin")
        .agg(pl.all().first(), pl.len().alias("calls"))
        .sort("ts")
    )
    fig = go.Figure()
    fig.add_trace(
        go.Scattergl(
            x=kept.select(_naive(pl.col("ts").dt.truncate("1ms")))["ts"].to_list(),
            y=kept["rank"].to_list(),
            mode="markers",
            name="collective (latest call per bin)",
            marker={
                "color": kept["late_ms"].round(2).to_list(),
                "colorscale": "YlOrRd",
                "cmin": 0,
                "size": 6,
                "colorbar": {"title": "late (ms)"},
            },
            text=[_esc(f"{op} #{seq}") for op, seq in kept.select("op", "seq").iter_rows()],
            hovertemplate="rank %{y}<br>%{x}<br>%{marker.color:.2f} ms late<br>%{text}"
            "<extra></extra>",
        )
    )
    _add_waits(d, fig)
    fig.update_yaxes(
        title="rank",
        tickmode="array",
        tickvals=ranks if len(ranks) <= 64 else None,
        ticktext=[_rank_label(d, r) for r in ranks] if len(ranks) <= 64 else None,
        autorange="reversed",
    )
    fig.update_xaxes(title="time (UTC)")
    _mark_steps(d, fig)
    _mark_findings(d, fig)
    fig.update_layout(
        height=min(1400, 240 + 18 * len(ranks)),
        showlegend=True,
        legend={"orientation": "h", "y": -0.15},
    )
    sampled = d.ctx.stride
    intro = (
        "Each dot is a rank's arrival at a collective of the world communicator, coloured by "
        "how long after the first rank it came; per rank and time bin the latest call is "
        "kept. A straggler is the row that stays hot. Red bars: ranks waiting, from their "
        "last logged collective to the end of the logs."
        + (f" One collective in every {sampled} was sampled." if sampled > 1 else "")
    )
    return _Section("timeline", title, f"<p>{intro}</p>" + _plot(fig, "plot-timeline"))


def _add_waits(d: _Data, fig: go.Figure) -> None:
    """A bar per rank from its last logged collective to the end of the logs, where that
    is long against the gap between collectives (a stall)."""
    end = d.ctx.last_ts
    if end is None:
        return
    last = d.late.group_by("rank").agg(pl.col("ts").max())
    gaps = d.late.group_by("seq").agg(pl.col("ts").min()).sort("seq")["ts"].diff()
    gap_us = gaps.dt.total_microseconds().median()
    gap_s = float(gap_us) / 1e6 if isinstance(gap_us, (int, float)) else 0.0
    xs: list[Any] = []
    ys: list[Any] = []
    for rank, ts in last.sort("rank").iter_rows():
        if (end - ts).total_seconds() > max(5 * gap_s, 1.0):
            xs += [ts.replace(tzinfo=None), end.replace(tzinfo=None), None]
            ys += [rank, rank, None]
    if xs:
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                line={"color": "#c0392b", "width": 5},
                opacity=0.5,
                name="waiting: no further collective logged",
                hoverinfo="skip",
            )
        )


def _progress_plot(d: _Data) -> str:
    """Without times: how far each rank got on the world communicator."""
    comm = _world_comm(d.ctx)
    if comm is None:
        return ""
    prog = d.ctx.progress.filter(pl.col("comm_key") == comm).with_columns(
        pl.coalesce("rank", "comm_rank").alias("who")
    )
    ranks = prog["who"].to_list()
    colors = ["#c0392b" if r in d.culprits else "#5d6d7e" for r in ranks]
    fig = go.Figure(
        go.Bar(
            x=prog["last_seq"].to_list(),
            y=[_rank_label(d, r) for r in ranks],
            orientation="h",
            marker={"color": colors},
            hovertemplate="%{y}: last collective #%{x}<extra></extra>",
        )
    )
    fig.update_xaxes(title="last collective reached (sequence on the world communicator)")
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=min(1400, 200 + 18 * len(ranks)))
    return (
        "<p>Instead: how far each rank got on the world communicator (culprits in red).</p>"
        + _plot(fig, "plot-progress")
    )


def _heatmap(d: _Data) -> _Section:
    title = "Lateness heatmap (rank x step)"
    if d.analysis.collectives is None:
        return _Section("heatmap", title, _note(_NO_COLL))
    if d.late.is_empty():
        return _Section("heatmap", title, _note(_NO_TIMES))
    late = d.late
    by = "step"
    period = collective_period(d.ctx)
    if period is not None:
        # Exact: the world communicator's pattern of ops repeats once per step.
        late = late.with_columns((pl.col("seq") // period).alias("step"))
        what = "step"
    elif not d.bounds.is_empty():
        late = late.sort("ts").join_asof(
            d.bounds.select(pl.col("start").cast(TS), "step").sort("start"),
            left_on="ts",
            right_on="start",
            strategy="backward",
        )
        late = late.with_columns(pl.col("step").fill_null(0))
        what = "step"
    else:
        late = late.with_columns((pl.col("seq") // 16).alias("step"))
        what = "group of 16 collectives"
        by = "group"
    ranks = sorted(late["rank"].unique().to_list())
    steps = sorted(late["step"].unique().to_list())
    width = max(1, MAX_HEATMAP_CELLS // max(1, len(ranks)))
    per_col = max(1, math.ceil(len(steps) / width))
    cells = (
        late.with_columns((pl.col("step") // per_col).alias("col"))
        .group_by("rank", "col")
        .agg(pl.col("late_ms").max())
    )
    cols = sorted(cells["col"].unique().to_list())
    grid = {(r, c): v for r, c, v in cells.select("rank", "col", "late_ms").iter_rows()}
    z = [
        [None if grid.get((r, c)) is None else round(grid[(r, c)], 3) for c in cols] for r in ranks
    ]
    x = [str(c) if per_col == 1 else f"{c * per_col}-{c * per_col + per_col - 1}" for c in cols]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=x,
            y=[_rank_label(d, r) for r in ranks],
            colorscale="YlOrRd",
            colorbar={"title": "worst late (ms)"},
            hovertemplate="%{y}<br>" + by + " %{x}<br>worst %{z:.3f} ms late<extra></extra>",
        )
    )
    fig.update_xaxes(
        title=what if per_col == 1 else f"{what}s ({per_col} per column)", type="category"
    )
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=min(1400, 200 + 16 * len(ranks)))
    intro = (
        f"Per rank and {what}: the worst lateness at a collective of the world communicator. "
        "A straggler is a hot row; a hot column is a step where everyone waited for someone."
    )
    return _Section("heatmap", title, f"<p>{_esc(intro)}</p>" + _plot(fig, "plot-heatmap"))


def _phases(d: _Data) -> _Section:
    title = "Step phases"
    steps = d.steps
    if steps.is_empty():
        why = (
            "No steps found: no DeepSpeed timers in the logs (set "
            '<code>"wall_clock_breakdown": true</code> in the DeepSpeed config) and no '
            "repeating pattern of collectives to cut the run into steps."
        )
        return _Section("phases", title, _note(why))
    source = steps["source"][0]
    rank = steps["rank"].drop_nulls()
    who = f"rank {rank[0]}" if len(rank) else "the job"
    fig = go.Figure()
    phases = [p for p in (*_PHASES, *sorted(steps["phase"].unique())) if p in steps["phase"]]
    for phase in dict.fromkeys(phases):
        part = (
            steps.filter(pl.col("phase") == phase)
            .group_by("step")
            .agg(pl.col("duration_s").median())
            .sort("step")
        )
        fig.add_trace(
            go.Bar(
                x=part["step"].to_list(),
                y=[None if v is None else round(v, 6) for v in part["duration_s"].to_list()],
                name=_esc(phase),
                hovertemplate="step %{x}<br>" + _esc(phase) + " %{y:.3f} s<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack", height=380)
    fig.update_xaxes(title="step", dtick=1 if steps["step"].n_unique() <= 40 else None)
    fig.update_yaxes(title="seconds")
    if source == "deepspeed_timers":
        intro = (
            f"DeepSpeed's wall-clock timers ({who}): forward, backward and optimizer step per "
            "step, numbered in the order they were printed."
        )
    elif steps["phase"].n_unique() > 1:
        intro = (
            "Steps and phases cut from the world communicator's repeating pattern of "
            "collectives, on every rank's own clock (ncclscope.model.timeline); each bar is the "
            "median over ranks of one step's phases."
        )
    else:
        intro = (
            "No DeepSpeed timers: steps cut from the world communicator's repeating pattern "
            "of collectives; each bar is one step's duration, from its first collective to "
            "the next step's (phases need per-rank timers)."
        )
    return _Section("phases", title, f"<p>{_esc(intro)}</p>" + _plot(fig, "plot-phases"))


def _downsample(series: pl.DataFrame, bins: int) -> pl.DataFrame:
    """Per time bin of one series: the samples at its minimum, maximum and last; and of
    a run of equal values only its first and last sample (a constant, such as a GPU's
    total memory, is two points)."""
    if len(series) > 3 * bins:
        us = (pl.col("ts") - pl.col("ts").min()).dt.total_microseconds()
        span = int(series.select(us.max()).item() or 1) + 1
        binned = series.with_columns(
            (us * bins // span).alias("bin"), pl.int_range(pl.len()).alias("i")
        )
        keep = pl.concat(
            [
                binned.sort("value").group_by("bin").first(),
                binned.sort("value").group_by("bin").last(),
                binned.sort("ts").group_by("bin").last(),
            ]
        )
        series = keep.unique("i").sort("ts").drop("bin", "i")
    value = pl.col("value")
    inside_run = (value == value.shift(1)) & (value == value.shift(-1))
    return series.filter(~inside_run.fill_null(False))


def _series(tel: pl.DataFrame, metric: str) -> list[tuple[str, pl.DataFrame]]:
    """One downsampled series per (host, labels) of ``metric``; with more than
    ``_MAX_SERIES`` of them, one per host: the largest value over its GPUs at each
    sample (the hottest GPU is the one that matters)."""
    rows = tel.filter(pl.col("metric") == metric)
    if rows.is_empty():
        return []
    keys = ["host", "labels"]
    if rows.select(pl.struct(keys).n_unique()).item() > _MAX_SERIES:
        rows = rows.group_by("host", "ts").agg(
            pl.lit("").alias("labels"), pl.col("value").max(), pl.len().alias("gpus")
        )
        keys = ["host"]
    groups = rows.group_by(keys, maintain_order=True)
    bins = max(20, min(_TELEMETRY_BINS, MAX_TELEMETRY_POINTS // (3 * max(1, groups.len().height))))
    out = []
    for key, part in groups:
        host = str(key[0])
        gpu = str(key[1]).split(",")[0] if len(key) > 1 and key[1] else ""
        name = (
            f"{host} gpu {gpu}"
            if gpu
            else (f"{host} (max over GPUs)" if "gpus" in part.columns else host)
        )
        out.append((name, _downsample(part.select("ts", "value").sort("ts"), bins)))
    return sorted(out, key=lambda kv: kv[0])


def _telemetry(d: _Data) -> _Section:
    title = "GPU memory, PCIe and host memory"
    tel = with_log_hosts(d.analysis.telemetry, d.analysis.hosts)  # hosts as the logs name them
    if tel.is_empty():
        why = (
            "No telemetry: run <code>ncclscope agent --out DIR</code> on each node beside "
            "the job and pass <code>--telemetry DIR</code> to <code>analyze</code>."
        )
        return _Section("telemetry", title, _note(why))
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07,
        subplot_titles=(
            "GPU memory used (GiB; dashed: total)",
            "PCIe throughput (GB/s; dashed: link capacity, dotted: 80% of it)",
            "Host memory available and swap used (GiB)",
        ),
    )
    gib, gb = float(1 << 30), 1e9

    def line(name: str, s: pl.DataFrame, scale: float, row: int, **kw: Any) -> None:
        fig.add_trace(
            go.Scatter(
                x=s.select(_naive(pl.col("ts")))["ts"].to_list(),
                y=[round(v / scale, 4) for v in s["value"].to_list()],
                mode="lines",
                name=_esc(name),
                legendgroup=str(row),
                **kw,
            ),
            row=row,
            col=1,
        )

    for name, s in _series(tel, "ncclscope_gpu_memory_used_bytes"):
        line(name, s, gib, 1)
    for name, s in _series(tel, "ncclscope_gpu_memory_total_bytes"):
        line(f"{name} total", s, gib, 1, line={"dash": "dash", "width": 1})
    for direction in ("tx", "rx"):
        for name, s in _series(tel, f"ncclscope_gpu_pcie_{direction}_bytes_per_second"):
            line(f"{name} {direction.upper()}", s, gb, 2)
    for name, s in _series(tel, "ncclscope_gpu_pcie_link_max_bytes_per_second"):
        line(f"{name} link", s, gb, 2, line={"dash": "dash", "width": 1})
        line(
            f"{name} 80%",
            s.with_columns(pl.col("value") * 0.8),
            gb,
            2,
            line={"dash": "dot", "width": 1},
        )
    for name, s in _series(tel, "ncclscope_host_memory_available_bytes"):
        line(f"{name} available", s, gib, 3)
    for name, s in _series(tel, "ncclscope_host_swap_used_bytes"):
        line(f"{name} swap used", s, gib, 3, line={"dash": "dash"})
    t0, t1 = tel.select(pl.col("ts").min()).item(), tel.select(pl.col("ts").max()).item()
    _mark_steps(d, fig, within=(t0, t1))
    _mark_findings(d, fig, within=(t0, t1))
    fig.update_xaxes(title="time (UTC)", row=3, col=1)
    fig.update_layout(height=900, legend={"groupclick": "toggleitem"})
    intro = (
        "The agent's samples per GPU and host, against the GPU's memory and the PCIe link's "
        "capacity; per time bin the minimum, maximum and last sample are kept. Grey lines "
        "mark step ends; shaded spans are findings' windows."
    )
    return _Section("telemetry", title, f"<p>{_esc(intro)}</p>" + _plot(fig, "plot-telemetry"))


def _mark_steps(
    d: _Data, fig: go.Figure, within: tuple[datetime | None, datetime | None] | None = None
) -> None:
    ends = d.bounds["end"].drop_nulls()
    if within is not None and within[0] is not None and within[1] is not None:
        ends = ends.filter((ends >= within[0]) & (ends <= within[1]))
    if ends.is_empty():
        return
    every = max(1, math.ceil(len(ends) / _MAX_STEP_MARKERS))
    _add_shapes(
        fig,
        [
            _vspan(ts, ts, line={"color": "#aab7b8", "width": 1, "dash": "dot"})
            for ts in ends.to_list()[::every]
        ],
    )


def _vspan(x0: datetime, x1: datetime, **style: Any) -> dict[str, Any]:
    """A shape across the whole plot's height from ``x0`` to ``x1`` (a line when equal)."""
    kind = "line" if x0 == x1 else "rect"
    return {
        "type": kind,
        "xref": "x",
        "yref": "paper",
        "x0": x0.replace(tzinfo=None),
        "x1": x1.replace(tzinfo=None),
        "y0": 0,
        "y1": 1,
        **style,
    }


def _add_shapes(
    fig: go.Figure, shapes: list[dict[str, Any]], notes: list[dict[str, Any]] | None = None
) -> None:
    """Add shapes (and annotations) in one layout update: plotly's ``add_vline``
    re-validates every shape already there, quadratic in the number of markers."""
    if shapes:
        fig.update_layout(shapes=[*fig.layout.shapes, *shapes])
    if notes:
        fig.update_layout(annotations=[*fig.layout.annotations, *notes])


def _finding_window(f: Finding) -> tuple[datetime, datetime | None] | None:
    """A finding's time or window, from its evidence (``since``, ``window_start``...)."""
    times: dict[str, datetime] = {}
    for key, value in f.evidence.items():
        if not (key in ("ts", "since") or key.endswith(("_ts", "_at", "start", "end"))):
            continue
        when = value
        if isinstance(value, str):
            if ":" not in value:
                continue
            try:
                when = datetime.fromisoformat(value)
            except ValueError:
                continue
        if isinstance(when, datetime):
            times[key] = when if when.tzinfo else when.replace(tzinfo=UTC)
    if not times:
        return None
    ordered = sorted(times.values())
    return ordered[0], ordered[-1] if len(ordered) > 1 else None


def _mark_findings(
    d: _Data, fig: go.Figure, within: tuple[datetime | None, datetime | None] | None = None
) -> None:
    end_of_logs = d.ctx.last_ts
    shapes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    for f in d.diagnosis.findings:
        window = _finding_window(f)
        if window is None:
            continue
        start, end = window
        end = end or end_of_logs
        if within is not None and within[0] is not None and within[1] is not None:
            if start > within[1] or (end or start) < within[0]:
                continue
        color = _SEVERITY_COLOR.get(f.severity, "#7f8c8d")
        if end is not None and end > start:
            shapes.append(_vspan(start, end, fillcolor=color, opacity=0.12, line_width=0))
        else:
            shapes.append(_vspan(start, start, line={"color": color, "width": 2}))
        notes.append(
            {
                "x": start.replace(tzinfo=None),
                "xref": "x",
                "y": 1,
                "yref": "paper",
                "text": _esc(f.kind),
                "showarrow": False,
                "xanchor": "left",
                "yanchor": "bottom",
                "font": {"color": color, "size": 11},
            }
        )
    _add_shapes(fig, shapes, notes)


def _findings(d: _Data) -> _Section:
    a = d.analysis
    findings = d.diagnosis.findings
    if not findings:
        return _Section("findings", "Findings", _note("Nothing wrong was found in these logs."))
    parts = []
    for k, f in enumerate(findings):
        color = _SEVERITY_COLOR.get(f.severity, "#7f8c8d")
        facts = []
        if f.ranks:
            facts.append(f"ranks {_esc(ranks_text(f.ranks))}")
        if f.hosts:
            facts.append(f"hosts {_esc(', '.join(f.hosts))}")
        if f.op:
            facts.append(f"op {_esc(f.op)}")
        if f.cost_gpu_s:
            facts.append(f"~{f.cost_gpu_s:,.1f} GPU-s lost")
        lines = []
        for ref in f.lines:
            path = a.paths[ref.file_id] if 0 <= ref.file_id < len(a.paths) else "?"
            text = d.diagnosis.quoted.get((ref.file_id, ref.line_no), "")
            lines.append(
                f'<div class="ref">{_esc(path)}:{ref.line_no}</div>'
                f'<pre class="line">{_esc(text)}</pre>'
            )
        evidence = json.dumps(f.evidence, indent=2, default=str, ensure_ascii=False)
        parts.append(
            f'<div class="finding" id="finding-{k}" style="border-left-color:{color}">'
            f'<div class="head"><span class="sev" style="background:{color}">'
            f"{_esc(f.severity)}</span> <b>{_esc(f.kind)}</b> "
            f'<span class="facts">{" · ".join(facts)}</span></div>'
            f"<p>{_esc(f.message)}</p>{''.join(lines)}"
            f"<details><summary>evidence</summary><pre>{_esc(evidence)}</pre></details></div>"
        )
    return _Section("findings", f"Findings ({len(findings)})", "".join(parts))


def _job(d: _Data) -> str:
    a = d.analysis
    ranks = a.identity.members["rank"].drop_nulls().n_unique()
    facts = [
        ("inputs", ", ".join(a.paths) or "none"),
        ("NCCL", ", ".join(a.nccl_versions) or "unknown"),
        (
            "hosts",
            f"{len(a.hosts)}: {', '.join(a.hosts[:16])}{' ...' if len(a.hosts) > 16 else ''}",
        ),
        ("ranks", str(ranks)),
        ("NCCL timestamps", a.timestamps),
        ("telemetry samples", f"{len(a.telemetry):,}"),
    ]
    rows = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in facts)
    gaps = "".join(
        f"<li>{_esc(g.what)} <i>Set:</i> "
        + ", ".join(f"<code>{_esc(s)}</code>" for s in g.settings)
        + "</li>"
        for g in a.gaps
    )
    gaps_html = f"<h3>What these logs cannot tell</h3><ul>{gaps}</ul>" if gaps else ""
    return f'<table class="facts">{rows}</table>{gaps_html}'


_CSS = """
body{font-family:system-ui,-apple-system,"DejaVu Sans",sans-serif;margin:0;color:#1c2833}
header{background:#1c2833;color:#fff;padding:12px 24px}
header h1{margin:0;font-size:20px} header .sub{color:#aeb6bf;font-size:13px}
nav{padding:8px 24px;border-bottom:1px solid #d5d8dc;font-size:14px}
nav a{margin-right:16px;color:#2874a6}
main{padding:0 24px 40px;max-width:1500px}
h2{border-bottom:1px solid #d5d8dc;padding-bottom:4px;margin-top:28px}
.why{background:#fef9e7;border:1px solid #f7dc6f;padding:8px 12px;border-radius:4px}
.finding{border-left:6px solid;padding:6px 12px;margin:12px 0;background:#f8f9f9}
.sev{color:#fff;border-radius:3px;padding:1px 6px;font-size:12px;text-transform:uppercase}
.facts{color:#566573;font-size:13px}
.ref{font-size:12px;color:#566573;margin-top:6px}
pre{white-space:pre-wrap;word-break:break-all;font-size:12px;margin:2px 0}
pre.line{background:#eaeded;padding:4px 8px}
table.facts th{text-align:left;padding-right:16px;font-weight:600}
table.status{border-collapse:collapse;font-size:13px}
table.status td,table.status th{border:1px solid #d5d8dc;padding:2px 8px;text-align:right}
table.status tr.behind{background:#fdebd0}
#ncclscope-errors{display:none;background:#fdedec;border:1px solid #c0392b;padding:8px}
"""

#: Written before plotly.js: any script error shows on the page (and a test reads it
#: back from the DOM).
_ERROR_HOOK = """
window.ncclscopeErrors = [];
window.addEventListener("error", function (e) {
  window.ncclscopeErrors.push(String(e.message));
  var box = document.getElementById("ncclscope-errors");
  if (box) { box.style.display = "block"; box.textContent =
    "This report failed to draw: " + window.ncclscopeErrors.join("; "); }
});
"""


def _bandwidth(d: _Data) -> _Section:
    """Bus bandwidth by message size, the job against the baseline (``html_bandwidth``)."""
    title = "Bus bandwidth by message size"
    fig = bandwidth_figure(d.analysis.tools)
    if fig is None:
        return _Section("bandwidth", title, _note(NO_BANDWIDTH))
    body = f"<p>{_esc(BANDWIDTH_INTRO)}</p>" + _plot(fig, "plot-bandwidth")
    return _Section("bandwidth", title, body)


def _flight(diagnosis: Diagnosis) -> list[_Section]:
    """The Flight Recorder section (``html_flight``), where dumps are among the inputs."""
    body = flight_body(flight_doc(diagnosis.analysis))
    return [] if body is None else [_Section("flight", "Flight Recorder dumps", body)]


def _cluster(d: _Data) -> list[_Section]:
    """The cluster's ports and GPUs (``analyze --prometheus``), findings marked."""
    from ncclscope.export.html_cluster import INTRO, cluster_figure

    fig = cluster_figure(d.analysis.cluster) if d.analysis.cluster is not None else None
    if fig is not None:
        _mark_findings(d, fig)
    body = INTRO + _plot(fig, "plot-cluster") if fig is not None else ""
    return [_Section("cluster", "Cluster: ports and GPUs", body)] if body else []


def render_html(diagnosis: Diagnosis) -> str:
    """The whole report as one HTML document (plotly.js embedded)."""
    d = _data(diagnosis)
    analysis = diagnosis.analysis
    sections = [
        _findings(d),
        _timeline(d),
        _heatmap(d),
        _phases(d),
        _bandwidth(d),
        *_flight(diagnosis),
        _telemetry(d),
        *_cluster(d),
    ]
    nav = "".join(f'<a href="#{s.anchor}">{_esc(s.title)}</a>' for s in sections)
    body = "".join(
        f'<section id="{s.anchor}"><h2>{_esc(s.title)}</h2>{s.body}</section>' for s in sections
    )
    title = "ncclscope report: " + (", ".join(analysis.paths[:3]) or "no input")
    made = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_esc(title)}</title><style>{_CSS}</style>"
        f"<script>{_ERROR_HOOK}</script>"
        f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>'
        f"<header><h1>{_esc(title)}</h1>"
        f'<div class="sub">ncclscope {_esc(__version__)} · {made}</div></header>'
        f"<nav>{nav}</nav><main>"
        '<div id="ncclscope-errors"></div>'
        f'<section id="job"><h2>Job</h2>{_job(d)}</section>{body}</main></body></html>\n'
    )


def write_html(diagnosis: Diagnosis, path: Path) -> int:
    """Write the report to ``path`` (atomically); return its size in bytes."""
    text = render_html(diagnosis)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path.stat().st_size
