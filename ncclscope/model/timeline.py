"""One timeline: per rank, per training step, per phase (``STEPS_SCHEMA``), and the
telemetry samples placed on it.

DeepSpeed prints its timers on rank 0 only, so steps and phases of every rank are found
in the collective pattern of the world communicator itself:

1. **Period.** Training repeats the same calls every step: the smallest ``P`` for which
   one member's ``(op, count)`` sequence repeats itself (90% of positions, after the
   start-up calls) is the number of world collectives per step.
2. **Step boundary.** The optimizer step runs no collective (ZeRO-3: after the gradient
   norm's AllReduce, before the next forward's first AllGather; ZeRO-1/2: before the
   AllGather of the updated partitions): of the positions where an AllGather follows
   another op, the one after the longest median pause starts a period (without
   AllGathers: the position after the longest pause).
3. **Phases** from each rank's own enqueue times (so each host's clock is compared only
   with itself):

   * ZeRO-3 shape (AllGathers in backward too): ``forward`` from the period's first
     AllGather to backward's first call (the AllGather just before the first
     ReduceScatter); ``backward`` to the period's last call; ``optimizer`` from the last
     call to the next period's first.
   * ZeRO-1/2 shape (an AllGather run, then ReduceScatters): ``forward`` from the end of
     the AllGather run to the first ReduceScatter, ``backward`` to the period's last
     call (the norm), ``optimizer`` from there to the first AllGather of the next
     period (the rank's own arrival there: the all-gather of the updated partitions,
     where ranks wait for each other, is left out of every phase).
   * Without AllGathers (DDP): ``backward`` over the AllReduce buckets; ``optimizer``
     from the last bucket to the next step's first (it holds the next forward too).

Steps are numbered from 1 in the order found; the last step has no ``optimizer`` row
when no collective follows it.  DeepSpeed's timers (``fwd``, ``bwd``, ``step``) add
``source="timers"`` rows for the rank that printed them, with the timer's duration.

Telemetry is placed on the timeline by :func:`phase_samples`: GPU samples join a rank
through (host, PCI bus id), and a sample belongs to a phase when its time falls inside
the phase's window shrunk by ``EDGE_S`` at both ends (NVML rates cover the last 20 ms;
hosts' clocks may disagree by milliseconds, DESIGN §4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from ncclscope.hosts import short_host_expr, with_log_hosts
from ncclscope.model.collectives import P2P_OPS
from ncclscope.schema import STEPS_SCHEMA, TS, validate

if TYPE_CHECKING:
    from ncclscope.model import Analysis

__all__ = [
    "EDGE_S",
    "MAX_PERIOD",
    "PERIOD_MATCH",
    "PHASES",
    "Pattern",
    "find_pattern",
    "find_period",
    "gpu_samples",
    "normalise_bus_id",
    "phase_samples",
    "step_timeline",
]

PHASES = ("forward", "backward", "optimizer")
#: Seconds trimmed from both ends of a phase before samples count as inside it.
EDGE_S = 0.025
#: Calls of one member read to find the pattern.
_PATTERN_CALLS = 20_000
#: Largest period tried (world collectives per step).
MAX_PERIOD = 4_000
#: Share of positions that must repeat for a period to count.
PERIOD_MATCH = 0.9


@dataclass(frozen=True)
class Pattern:
    """The world communicator's per-step collective pattern.

    ``start_seq`` is the sequence of the first full period; a period spans ``period``
    sequences.  ``phases`` are ``(phase, start position, start period offset, end
    position, end period offset)``: the phase of step ``k`` runs from the call at position
    ``sp`` of period ``k + sdk`` to the call at ``ep`` of period ``k + edk``.
    """

    comm_key: str
    period: int
    start_seq: int
    shape: str  # zero3 | zero12 | allreduce
    phases: tuple[tuple[str, int, int, int, int], ...]


def normalise_bus_id(col: pl.Expr) -> pl.Expr:
    """A PCI bus id as an integer, whether NCCL printed it (``18000``, hex digits of
    ``domain:bus:device.function``) or NVML did (``00000000:18:00.0``)."""
    digits = col.str.replace_all(r"[:.]", "").str.to_lowercase()
    return digits.str.to_integer(base=16, strict=False)


def _member_calls(analysis: Analysis, comm_key: str) -> pl.DataFrame:
    coll = analysis.collectives
    if coll is None:
        return pl.DataFrame()
    first = (
        analysis.identity.members.filter(pl.col("comm_key") == comm_key)["comm_rank"]
        .drop_nulls()
        .min()
    )
    if first is None:
        return pl.DataFrame()
    return (
        coll.filter(
            (pl.col("comm_key") == comm_key)
            & (pl.col("comm_rank") == first)
            & ~pl.col("op").is_in(P2P_OPS)
        )
        .select("seq", "op", "count", "ts")
        .sort("seq")
        .head(_PATTERN_CALLS)
        .collect(engine="streaming")
    )


def find_period(
    keys: pl.Series | Sequence[object], *, min_period: int = 1, max_period: int | None = None
) -> int | None:
    """The shortest period with which a sequence of calls repeats (one training step of
    collectives): the calls after the first quarter (the warm-up skipped), compared with
    themselves ``p`` calls later; the smallest ``p`` from ``min_period`` at which
    ``PERIOD_MATCH`` of them agree.  ``p`` goes up to ``max_period`` (by default a third
    of those calls, and ``MAX_PERIOD``); None under 6 calls.  ``keys``: what tells one
    call from another (op, count, datatype), one per call in sequence order.  The step
    pattern here, the ZeRO stage's step and the HTML report's steps all read it.

    >>> find_period([9, 9] + [1, 2, 2, 3] * 6)
    4
    >>> find_period([1, 2, 3, 4, 5, 6]) is None
    True
    """
    if len(keys) < 6:
        return None
    xs = keys if isinstance(keys, pl.Series) else pl.Series(values=list(keys))
    tail = xs.slice(len(xs) // 4)
    n = len(tail)
    top = min(n // 3, MAX_PERIOD) if max_period is None else max_period
    return next(
        (
            p
            for p in range(min_period, top + 1)
            if (tail.head(n - p) == tail.tail(n - p)).mean() >= PERIOD_MATCH  # type: ignore[operator]
        ),
        None,
    )


def find_pattern(analysis: Analysis) -> Pattern | None:
    """The world communicator's step pattern, or None (no timed COLL lines, no repeat)."""
    comm_key = analysis.identity.world_key
    if comm_key is None or analysis.summary is None or analysis.summary.with_ts == 0:
        return None
    calls = _member_calls(analysis, comm_key)
    if len(calls) < 6 or calls["ts"].null_count() == len(calls):
        return None
    key = (calls["op"] + ":" + calls["count"].cast(pl.String)).to_list()
    seqs = calls["seq"].to_list()
    period = find_period(key)
    if period is None:
        return None
    # The reference period: the last full one.
    ref = key[len(key) - period :]
    ref_seq0 = seqs[len(key) - period]
    ops = [k.split(":", 1)[0] for k in ref]
    # Pause before each position: median over periods.
    pauses = (
        calls.with_columns(
            (pl.col("ts").diff().dt.total_microseconds() / 1e6).alias("pause"),
            ((pl.col("seq") - ref_seq0) % period).alias("pos"),
        )
        .group_by("pos")
        .agg(pl.col("pause").median())
    )
    pause = dict(zip(pauses["pos"].to_list(), pauses["pause"].to_list(), strict=True))
    ags = [p for p in range(period) if ops[p] == "AllGather" and ops[p - 1] != "AllGather"]
    candidates = ags or list(range(period))
    best = max(candidates, key=lambda p: pause.get(p) or 0.0)
    rot = ops[best:] + ops[:best]
    shape, phases = _phases(rot)
    residue = (ref_seq0 + best) % period
    # The first full period: from the first sequence at the residue whose calls match.
    rotated = ref[best:] + ref[:best]
    index = {s: i for i, s in enumerate(seqs)}
    start = None
    for i, s in enumerate(seqs):
        if s % period == residue and key[i : i + period] == rotated and index.get(s) == i:
            start = s
            break
    if start is None:
        return None
    return Pattern(comm_key, period, start, shape, phases)


def _phases(ops: list[str]) -> tuple[str, tuple[tuple[str, int, int, int, int], ...]]:
    """Phase cuts of one rotated period (see the module docstring)."""
    last = len(ops) - 1
    if "ReduceScatter" in ops:
        first_rs = ops.index("ReduceScatter")
    elif "AllGather" in ops and "AllReduce" in ops:
        first_rs = ops.index("AllReduce")
    else:
        first_rs = None
    if first_rs is None or "AllGather" not in ops:
        return "allreduce", (("backward", 0, 0, last, 0), ("optimizer", last, 0, 0, 1))
    if "AllGather" in ops[first_rs:]:  # ZeRO-3: parameters gathered in backward too
        bwd = first_rs - 1 if first_rs > 0 and ops[first_rs - 1] == "AllGather" else first_rs
        return "zero3", (
            ("forward", 0, 0, bwd, 0),
            ("backward", bwd, 0, last, 0),
            ("optimizer", last, 0, 0, 1),
        )
    run_end = max(i for i in range(first_rs) if ops[i] == "AllGather")
    return "zero12", (
        ("forward", run_end, 0, first_rs, 0),
        ("backward", first_rs, 0, last, 0),
        ("optimizer", last, 0, 0, 1),
    )


def _collective_rows(analysis: Analysis, pattern: Pattern) -> pl.DataFrame:
    coll = analysis.collectives
    if coll is None:
        return pl.DataFrame(schema=STEPS_SCHEMA)
    needed = sorted({p for _n, sp, _a, ep, _b in pattern.phases for p in (sp, ep)})
    rel = pl.col("seq") - pattern.start_seq
    points = (
        coll.filter(
            (pl.col("comm_key") == pattern.comm_key)
            & (pl.col("seq") >= pattern.start_seq)
            & (rel % pattern.period).is_in(needed)
            & pl.col("ts").is_not_null()
        )
        .select(
            pl.coalesce("rank", "comm_rank").cast(pl.Int32).alias("rank"),
            "host",
            (rel // pattern.period).alias("k"),
            (rel % pattern.period).alias("pos"),
            "ts",
            "file_id",
            "line_no",
        )
        .collect(engine="streaming")
    )
    parts = []
    for name, sp, sdk, ep, edk in pattern.phases:
        start = points.filter(pl.col("pos") == sp).select(
            "rank", "host", (pl.col("k") - sdk).alias("k"), pl.col("ts").alias("start_ts")
        )
        end = points.filter(pl.col("pos") == ep).select(
            "rank",
            (pl.col("k") - edk).alias("k"),
            pl.col("ts").alias("end_ts"),
            "file_id",
            "line_no",
        )
        parts.append(
            start.join(end, on=["rank", "k"], how="inner").with_columns(pl.lit(name).alias("phase"))
        )
    rows = pl.concat(parts) if parts else pl.DataFrame()
    if rows.is_empty():
        return pl.DataFrame(schema=STEPS_SCHEMA)
    return rows.filter(pl.col("k") >= 0).select(
        "rank",
        "host",
        (pl.col("k") + 1).cast(pl.Int64).alias("step"),
        "phase",
        pl.col("start_ts").cast(TS),
        pl.col("end_ts").cast(TS),
        ((pl.col("end_ts") - pl.col("start_ts")).dt.total_microseconds() / 1e6).alias("duration_s"),
        pl.lit("collectives").alias("source"),
        pl.col("file_id").cast(pl.UInt32),
        pl.col("line_no").cast(pl.UInt32),
    )


#: DeepSpeed's global timers and the phase each one measures.
_TIMER_PHASES = {"fwd": "forward", "bwd": "backward", "step": "optimizer"}


def _timer_rows(analysis: Analysis) -> pl.DataFrame:
    timers = analysis.frameworks.timers
    if timers.is_empty():
        return pl.DataFrame(schema=STEPS_SCHEMA)
    hosts = analysis.identity.ranks.select("rank", "host")
    return (
        timers.filter(pl.col("name").is_in(list(_TIMER_PHASES)) & pl.col("step").is_not_null())
        .with_columns(pl.col("rank").fill_null(0))
        .join(hosts, on="rank", how="left")
        .select(
            pl.col("rank").cast(pl.Int32),
            "host",
            pl.col("step").cast(pl.Int64),
            pl.col("name").replace_strict(_TIMER_PHASES).alias("phase"),
            pl.lit(None, dtype=TS).alias("start_ts"),
            pl.col("ts").cast(TS).alias("end_ts"),
            "duration_s",
            pl.lit("timers").alias("source"),
            "file_id",
            "line_no",
        )
    )


def step_timeline(analysis: Analysis) -> pl.DataFrame:
    """Per rank, step and phase: start, end and duration (``STEPS_SCHEMA``), from the
    collective pattern and from DeepSpeed's timers; empty when neither is there."""
    pattern = find_pattern(analysis)
    parts = [_collective_rows(analysis, pattern)] if pattern is not None else []
    parts.append(_timer_rows(analysis))
    frame = pl.concat([p.cast(STEPS_SCHEMA) for p in parts]).sort(
        "source", "rank", "step", "start_ts", "phase", nulls_last=True
    )
    return validate(frame, STEPS_SCHEMA, "steps")


def gpu_samples(analysis: Analysis) -> pl.DataFrame:
    """The GPU telemetry samples, wide (one row per host, GPU and time: ``gpu``,
    ``pci_bus_id``, ``ts`` and a column per metric without its ``ncclscope_gpu_``
    prefix), with the rank whose NCCL init line names that (host, busId) (null when
    none does).  Hosts are compared as the logs spell them (``ncclscope.hosts``: the
    agent's ``node-7.cluster.internal`` is NCCL's ``node-7``)."""
    tel = with_log_hosts(
        analysis.telemetry.filter(pl.col("metric").str.starts_with("ncclscope_gpu_")),
        analysis.hosts,
    )
    if tel.is_empty():
        return pl.DataFrame()
    parts = pl.col("labels").str.split(",")
    wide = (
        tel.filter(
            ~pl.col("metric").is_in(
                [
                    "ncclscope_gpu_info",
                    "ncclscope_gpu_xid_errors_total",
                    "ncclscope_gpu_pcie_uplink_info",
                ]
            )
        )
        .with_columns(
            parts.list.get(0, null_on_oob=True).alias("gpu"),
            parts.list.get(2, null_on_oob=True).alias("pci_bus_id"),
            pl.col("metric").str.strip_prefix("ncclscope_gpu_"),
        )
        .filter(pl.col("pci_bus_id").is_not_null())
        .group_by("host", "gpu", "pci_bus_id", "ts", "metric")
        .agg(pl.col("value").max())
        .pivot(on="metric", index=["host", "gpu", "pci_bus_id", "ts"], values="value")
    )
    ranks = (
        analysis.identity.ranks.filter(pl.col("bus_id").is_not_null())
        .select(
            "rank",
            short_host_expr(pl.col("host")).alias("host"),
            normalise_bus_id(pl.col("bus_id")).alias("_bus"),
        )
        .unique(["host", "_bus"], keep="first")
    )
    return (
        wide.with_columns(normalise_bus_id(pl.col("pci_bus_id")).alias("_bus"))
        .join(ranks, on=["host", "_bus"], how="left")
        .drop("_bus")
        .sort("host", "gpu", "ts")
    )


def phase_samples(timeline: pl.DataFrame, samples: pl.DataFrame) -> pl.DataFrame:
    """The samples (``gpu_samples``) that fall inside a phase of their rank (the
    ``collectives`` rows of the timeline), with that phase's ``step`` and ``phase``."""
    if timeline.is_empty() or samples.is_empty() or "rank" not in samples.columns:
        return pl.DataFrame()
    phases = (
        timeline.filter(pl.col("source") == "collectives")
        .select("rank", "step", "phase", "start_ts", "end_ts")
        .sort("start_ts")
    )
    edge = pl.duration(microseconds=int(EDGE_S * 1e6))
    return (
        samples.filter(pl.col("rank").is_not_null())
        .sort("ts")
        .join_asof(
            phases,
            left_on="ts",
            right_on="start_ts",
            by="rank",
            strategy="backward",
            check_sortedness=False,  # both sorted by time; polars cannot check per group
        )
        .filter(
            pl.col("step").is_not_null()
            & (pl.col("ts") >= pl.col("start_ts") + edge)
            & (pl.col("ts") <= pl.col("end_ts") - edge)
        )
    )
