"""ZeRO stage advisor: would another ZeRO stage (or no offload) fit and run faster?

The choice of a ZeRO stage trades GPU memory against network traffic.  Per GPU, with
mixed-precision Adam, plain data parallelism (DDP, "stage 0") holds 16 bytes per
parameter: 2 of weights, 2 of gradients and 12 of optimizer states (fp32 master copy and
two moments; in fp32 training 4 + 4 + 8).  Across the ``N`` data-parallel ranks, ZeRO-1
shards the optimizer states, ZeRO-2 the gradients too, ZeRO-3 the weights too; offload
moves the optimizer states (and, stage 3, the weights) to host memory.  Traffic per GPU
and optimizer step, in bus bytes (``(N-1)/N`` of the data, as nccl-tests counts it), with
``ga`` gradient-accumulation micro-steps and ``W`` the bytes of all weights:

=========  ==========================================  ===================
stage      collectives                                 bus bytes / step
=========  ==========================================  ===================
0 (DDP)    all-reduce of gradients once per step        2 W (N-1)/N
1          reduce-scatter + all-gather once per step    2 W (N-1)/N
2          reduce-scatter every micro-step, all-gather  (ga + 1) W (N-1)/N
3          all-gather in forward and in backward and    3 ga W (N-1)/N
           reduce-scatter, every micro-step
=========  ==========================================  ===================

Metric (:func:`options`): one row per configuration (stage 0-3 x offload), with the
estimated model states per GPU, the predicted peak, whether it fits, the traffic per step
and the predicted step time.  The estimate is calibrated on what the job measured: the
peak memory beyond the estimated model states (activations, allocator cache, CUDA
context) is taken as the same for every configuration, and the step time beyond the
estimated communication and optimizer time is the same compute for every configuration.
Communication is counted as if nothing overlapped it: a bound on what a stage with less
traffic saves.

Policy: always ``info`` (advice, not a fault: the job runs as configured; the JSON
contract's ``info`` is advice).  ``evidence.recommended`` names a configuration with no
more offload than the current one that fits (predicted peak within 90% of the GPU's
memory) and is predicted at least 10% faster per step; else it is null and the current
choice is kept.  Every input says where it came from
(``evidence.inputs.*.source``); what was missing is listed (``evidence.missing``), and a
configuration whose fit or speed the inputs cannot support says ``null``.

Inputs and where they come from, best first:

* parameters: DeepSpeed's ``zero.Init`` line (rank 0), else one step's ReduceScatter
  elements on the data-parallel communicator times its ranks (the step found from the
  period of rank 0's collective sequence)::

      [2025-03-14 09:00:02,100] [INFO] [partition_parameters.py:366:__exit__] finished
      initializing model - num_params = 695, num_elems = 7.95B

* dtype: the ZeRO optimizer's ``Creating torch.bfloat16 ZeRO stage 3 optimizer`` line, the
  config dump's ``bfloat16_enabled``/``fp16_enabled``, else the ReduceScatter dtype;
* data-parallel size: the config dump's ``world_size``, else the largest communicator;
* GPU memory total and peak: the agent's telemetry (``ncclscope_gpu_memory_total_bytes``,
  ``..._used_bytes``), else the peak only, from DeepSpeed's ``MaxMemAllocated``
  (throughput lines) or ``see_memory_usage``'s ``Max_MA``; the model states measured
  after init (``see_memory_usage`` "After initializing ZeRO optimizer") stand beside the
  estimate as its check;
* step and optimizer time: rank 0's DeepSpeed timers ``fwd`` + ``bwd`` + ``step``;
* bus bandwidth: DeepSpeed's comms logger (all-gather busbw), else NCCL Inspector's
  all-gather records (``coll_busbw_gbs``, the larger half of the messages), else a nominal
  figure for the slowest transport the job used (assumed, and said so).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl

from ncclscope.detect.base import Finding, LineRef, duration_text, register
from ncclscope.detect.context import Context
from ncclscope.units import DTYPE_BYTES

__all__ = [
    "FIT_SHARE",
    "MIN_SPEEDUP",
    "NOMINAL_BUS_BW",
    "Fact",
    "Inputs",
    "Option",
    "ZeroStageDetector",
    "comm_bus_bytes",
    "gather_inputs",
    "model_states",
    "options",
]

#: A configuration fits when its predicted peak is within this share of the GPU's memory.
FIT_SHARE = 0.90
#: ...and is worth recommending when its predicted step is at least this much shorter.
MIN_SPEEDUP = 0.10

#: Nominal bus bandwidth per GPU (bytes/s) by the slowest transport in use, when nothing
#: measured it: generous figures, so that the traffic a stage saves is not overstated.
NOMINAL_BUS_BW: dict[str, float] = {
    "NVLS": 300e9,
    "P2P": 150e9,  # NVLink class; P2P over PCIe is slower (saving then underestimated)
    "SHM": 20e9,
    "NET/IB": 25e9,
    "NET/other": 25e9,
    "NET/Socket": 5e9,
}
#: Host <-> GPU copies per GPU (bytes/s) when the agent did not report the PCIe link.
NOMINAL_PCIE_BW = 25e9
#: GPU memory bandwidth for the (memory-bound) Adam step on the GPU.
NOMINAL_HBM_BW = 1.5e12
#: Bytes an Adam step moves per parameter it updates (read and write master, two
#: moments, gradient, weight).
ADAM_BYTES_PER_PARAM = 32
#: DeepSpeed's defaults (elements) for buckets the config does not set.
DEFAULT_REDUCE_BUCKET = 500_000_000
DEFAULT_ALLGATHER_BUCKET = 500_000_000
DEFAULT_PREFETCH_BUCKET = 50_000_000

#: DeepSpeed's training dtype, by the names its lines give it -> bytes.
_TRAIN_DTYPE_BYTES = {
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "fp32": 4,
}
#: Calls of rank 0's data-parallel communicator read to find the step's period.
_PERIOD_CALLS = 4000


@dataclass(frozen=True)
class Fact:
    """A number the estimate uses and where it came from (``assumed`` in the source when
    nothing in the inputs said it)."""

    value: float
    source: str


@dataclass(frozen=True)
class Option:
    """A ZeRO configuration: ``stage`` 0 is plain data parallelism."""

    stage: int
    offload_optimizer: bool
    offload_param: bool

    def label(self) -> str:
        """``"ZeRO-3 + offload optimizer, params"``, ``"DDP"``."""
        name = "DDP (no ZeRO)" if self.stage == 0 else f"ZeRO-{self.stage}"
        off = [
            w
            for w, on in (("optimizer", self.offload_optimizer), ("params", self.offload_param))
            if on
        ]
        return name + (f" + offload {', '.join(off)}" if off else "")


ALL_OPTIONS: tuple[Option, ...] = (
    Option(0, offload_optimizer=False, offload_param=False),
    Option(1, offload_optimizer=False, offload_param=False),
    Option(1, offload_optimizer=True, offload_param=False),
    Option(2, offload_optimizer=False, offload_param=False),
    Option(2, offload_optimizer=True, offload_param=False),
    Option(3, offload_optimizer=False, offload_param=False),
    Option(3, offload_optimizer=True, offload_param=False),
    Option(3, offload_optimizer=False, offload_param=True),
    Option(3, offload_optimizer=True, offload_param=True),
)


@dataclass
class Inputs:
    """What the estimate reads, each with its source; ``None`` where the inputs lack it."""

    current: Option
    params: Fact | None = None
    weight_bytes: Fact | None = None
    dp: Fact | None = None
    grad_accum: Fact | None = None
    gpu_total: Fact | None = None
    peak: Fact | None = None
    states_after_init: Fact | None = None
    step_s: Fact | None = None
    optimizer_s: Fact | None = None
    bus_bw: Fact | None = None
    pcie_bw: Fact | None = None
    reduce_bucket: Fact | None = None
    allgather_bucket: Fact | None = None
    prefetch_bucket: Fact | None = None
    lines: list[LineRef] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------
# The estimator (pure)


def model_states(
    option: Option, *, params: float, dp: int, weight_bytes: int = 2
) -> dict[str, float]:
    """Bytes per GPU of weights, gradients and optimizer states (and their total).

    Mixed precision (2-byte weights): 2 + 2 + 12 bytes per parameter; fp32: 4 + 4 + 8.
    Optimizer offload moves the optimizer states, and from stage 2 the gradient partition
    too, to the host; parameter offload (stage 3) moves the weight partition.
    1e9 parameters on 8 ranks, ZeRO-2: weights 2e9, gradients 2e9/8, optimizer 12e9/8.

    >>> s = model_states(Option(2, False, False), params=1e9, dp=8)
    >>> s["weights"], s["grads"], s["optimizer"], s["total"]
    (2000000000.0, 250000000.0, 1500000000.0, 3750000000.0)
    >>> model_states(Option(0, False, False), params=1e9, dp=8)["total"]
    16000000000.0
    >>> model_states(Option(3, True, False), params=1e9, dp=8)["total"]  # weights only
    250000000.0
    """
    weights = weight_bytes * params
    grads = weight_bytes * params
    optimizer = (12.0 if weight_bytes == 2 else 8.0) * params
    if option.stage >= 1:
        optimizer /= dp
    if option.stage >= 2:
        grads /= dp
    if option.stage >= 3:
        weights /= dp
    if option.offload_optimizer:
        optimizer = 0.0
        if option.stage >= 2:
            grads = 0.0  # the gradient partition is copied out for the CPU optimizer
    if option.offload_param:
        weights = 0.0
    return {
        "weights": weights,
        "grads": grads,
        "optimizer": optimizer,
        "total": weights + grads + optimizer,
    }


def buffers(
    option: Option,
    *,
    weight_bytes: int,
    reduce_bucket: float,
    allgather_bucket: float,
    prefetch_bucket: float,
) -> float:
    """Bytes of ZeRO's communication buffers: the gradient reduce bucket, plus stage 1-2's
    all-gather bucket or stage 3's prefetched (gathered) parameters.  DDP: 0 (its 25 MB
    buckets are noise at this scale).

    >>> buffers(Option(3, False, False), weight_bytes=2, reduce_bucket=5e8,
    ...         allgather_bucket=5e8, prefetch_bucket=5e7)
    1100000000.0
    """
    if option.stage == 0:
        return 0.0
    second = prefetch_bucket if option.stage == 3 else allgather_bucket
    return weight_bytes * (reduce_bucket + second)


def comm_bus_bytes(
    stage: int, *, params: float, dp: int, weight_bytes: int = 2, grad_accum: int = 1
) -> float:
    """Bus bytes per GPU per optimizer step (module docstring's table).

    1e9 bf16 parameters on 8 ranks: DDP and ZeRO-1/2 move 2 x 2e9 x 7/8 = 3.5e9 bytes,
    ZeRO-3 1.5x that.

    >>> comm_bus_bytes(2, params=1e9, dp=8), comm_bus_bytes(3, params=1e9, dp=8)
    (3500000000.0, 5250000000.0)
    >>> comm_bus_bytes(3, params=1e9, dp=8, grad_accum=4)  # every micro-step
    21000000000.0
    """
    if dp <= 1:
        return 0.0
    share = (dp - 1) / dp * weight_bytes * params
    if stage <= 1:
        return 2 * share
    if stage == 2:
        return (grad_accum + 1) * share
    return 3 * grad_accum * share


def _gpu_adam_s(option: Option, *, params: float, dp: int) -> float:
    """An Adam step on the GPU over the parameters this rank updates (memory bound)."""
    updated = params if option.stage == 0 else params / dp
    return updated * ADAM_BYTES_PER_PARAM / NOMINAL_HBM_BW


def _param_fetch_s(option: Option, inp: Inputs, params: float, dp: int, wb: int) -> float:
    """Stage 3 parameter offload: each rank's weight shard crosses PCIe in forward and in
    backward, every micro-step."""
    if not option.offload_param or inp.pcie_bw is None:
        return 0.0
    ga = int(inp.grad_accum.value) if inp.grad_accum else 1
    return 2 * ga * wb * params / dp / inp.pcie_bw.value


def options(inp: Inputs) -> pl.DataFrame:
    """The metric: one row per configuration (``ALL_OPTIONS``) with its estimate.

    Columns: ``stage``, ``offload_optimizer``, ``offload_param``, ``current``,
    ``model_states_bytes``, ``buffers_bytes``, ``peak_bytes`` (predicted), ``fits``,
    ``comm_bus_bytes``, ``comm_s``, ``optimizer_s``, ``step_s`` (predicted); null where the
    inputs cannot support the figure.
    """
    schema = {
        "stage": pl.Int32,
        "offload_optimizer": pl.Boolean,
        "offload_param": pl.Boolean,
        "current": pl.Boolean,
        "model_states_bytes": pl.Float64,
        "buffers_bytes": pl.Float64,
        "peak_bytes": pl.Float64,
        "fits": pl.Boolean,
        "comm_bus_bytes": pl.Float64,
        "comm_s": pl.Float64,
        "optimizer_s": pl.Float64,
        "step_s": pl.Float64,
    }
    if inp.params is None or inp.dp is None:
        return pl.DataFrame(schema=schema)
    params, dp = inp.params.value, int(inp.dp.value)
    wb = int(inp.weight_bytes.value) if inp.weight_bytes else 2
    ga = int(inp.grad_accum.value) if inp.grad_accum else 1
    reduce_b = inp.reduce_bucket.value if inp.reduce_bucket else DEFAULT_REDUCE_BUCKET
    gather_b = inp.allgather_bucket.value if inp.allgather_bucket else DEFAULT_ALLGATHER_BUCKET
    prefetch_b = inp.prefetch_bucket.value if inp.prefetch_bucket else DEFAULT_PREFETCH_BUCKET

    def buf_of(o: Option) -> float:
        return buffers(
            o,
            weight_bytes=wb,
            reduce_bucket=reduce_b,
            allgather_bucket=gather_b,
            prefetch_bucket=prefetch_b,
        )

    cur = inp.current

    def memory(o: Option) -> float:
        return model_states(o, params=params, dp=dp, weight_bytes=wb)["total"] + buf_of(o)

    def comm_s(o: Option) -> float | None:
        if inp.bus_bw is None:
            return None
        return comm_bus_bytes(o.stage, params=params, dp=dp, weight_bytes=wb, grad_accum=ga) / (
            inp.bus_bw.value
        )

    def optimizer_s(o: Option) -> float | None:
        if o.offload_optimizer:
            # CPU Adam: only what this job measured (the same shard in stages 1-3).
            return inp.optimizer_s.value if cur.offload_optimizer and inp.optimizer_s else None
        return _gpu_adam_s(o, params=params, dp=dp)

    # What the estimate does not cover, measured as what is left of the current run.
    overhead = None
    if inp.peak is not None:
        overhead = max(0.0, inp.peak.value - memory(cur))
    compute = None
    cur_comm, cur_opt = comm_s(cur), optimizer_s(cur)
    if inp.step_s is not None and cur_comm is not None and cur_opt is not None:
        if cur.offload_optimizer and inp.optimizer_s is not None:
            cur_opt = inp.optimizer_s.value
        compute = inp.step_s.value - cur_comm - cur_opt - _param_fetch_s(cur, inp, params, dp, wb)
        if compute < 0:
            # Communication overlaps compute, or the bandwidth is above the assumed one:
            # the model cannot predict step times for this job.
            compute = None
    rows = []
    for o in ALL_OPTIONS:
        states = model_states(o, params=params, dp=dp, weight_bytes=wb)["total"]
        buf = buf_of(o)
        peak = states + buf + overhead if overhead is not None else None
        fits = None
        if o == cur:
            fits = True  # it ran
        elif peak is not None and inp.gpu_total is not None:
            fits = peak <= FIT_SHARE * inp.gpu_total.value
        c, opt = comm_s(o), optimizer_s(o)
        if o == cur and cur.offload_optimizer and inp.optimizer_s is not None:
            opt = inp.optimizer_s.value
        step = None
        if compute is not None and c is not None and opt is not None:
            step = compute + c + opt + _param_fetch_s(o, inp, params, dp, wb)
        if o == cur and inp.step_s is not None:
            step = inp.step_s.value
        rows.append(
            {
                "stage": o.stage,
                "offload_optimizer": o.offload_optimizer,
                "offload_param": o.offload_param,
                "current": o == cur,
                "model_states_bytes": states,
                "buffers_bytes": buf,
                "peak_bytes": peak,
                "fits": fits,
                "comm_bus_bytes": comm_bus_bytes(
                    o.stage, params=params, dp=dp, weight_bytes=wb, grad_accum=ga
                ),
                "comm_s": c,
                "optimizer_s": opt,
                "step_s": step,
            }
        )
    return pl.DataFrame(rows, schema=schema)


# --------------------------------------------------------------------------------------
# Reading the inputs


def _params_from_collectives(ctx: Context, dp: int) -> tuple[Fact, int | None] | None:
    """One step's ReduceScatter elements on the data-parallel communicator x its ranks,
    and their dtype."""
    coll = ctx.collectives()
    comms = ctx.analysis.communicators
    if coll is None or comms.is_empty():
        return None
    world = comms.filter(pl.col("nranks") == dp)
    if world.is_empty():
        return None
    key = world["comm_key"][0]
    calls = (
        coll.filter((pl.col("comm_key") == key) & (pl.col("comm_rank") == 0))
        .select("seq", "op", "count", "dtype")
        .sort("seq")
        .head(_PERIOD_CALLS)
        .collect(engine="streaming")
    )
    if calls.is_empty():
        return None
    # Imported here, as ``Context`` imports the timeline: the agent's detectors never
    # load it unless a ZeRO job asks.
    from ncclscope.model.timeline import find_period

    sig = calls.select(pl.struct("op", "count", "dtype").hash())
    # Three steps seen are enough here (a short log's steps still give the parameters).
    period = find_period(sig.to_series(), max_period=len(calls) // 3)
    if period is None:
        return None
    last = calls.tail(period)
    rs = last.filter(pl.col("op") == "ReduceScatter")
    if rs.is_empty():
        return None
    elems = float(rs["count"].sum()) * dp
    dtype = rs["dtype"].mode().to_list()
    return (
        Fact(elems, f"one step's ReduceScatter elements x {dp} ranks ({period} calls a step)"),
        int(dtype[0]) if dtype and dtype[0] is not None else None,
    )


def _telemetry_gpu(ctx: Context, metric: str, how: str) -> float | None:
    tel = ctx.analysis.telemetry
    if tel.is_empty():
        return None
    per_gpu = (
        tel.filter(pl.col("metric") == metric)
        .group_by("host", "labels")
        .agg(pl.col("value").max())["value"]
    )
    if per_gpu.is_empty():
        return None
    value = per_gpu.min() if how == "min" else per_gpu.max()
    return float(value) if isinstance(value, int | float) else None


def _median_timer(ctx: Context, name: str) -> float | None:
    t = ctx.analysis.frameworks.timers.filter(pl.col("name") == name)["duration_s"]
    med = t.median() if len(t) else None
    return float(med) if isinstance(med, int | float) else None


def gather_inputs(ctx: Context) -> Inputs | None:
    """The estimate's inputs from the logs and telemetry; ``None`` without a DeepSpeed
    ZeRO configuration (nothing to advise on)."""
    a = ctx.analysis
    fw = a.frameworks
    zero = fw.zero
    if zero is None or zero.stage is None:
        return None
    cur = Option(
        zero.stage,
        offload_optimizer=zero.offload_optimizer in ("cpu", "nvme"),
        offload_param=zero.offload_param in ("cpu", "nvme"),
    )
    inp = Inputs(current=cur)
    cfg = fw.ds_config

    # Data-parallel size.
    if fw.world_size:
        inp.dp = Fact(fw.world_size, "DeepSpeed world_size (config dump or launcher)")
    elif a.identity.world_size:
        inp.dp = Fact(a.identity.world_size, "the largest NCCL communicator")
    else:
        inp.missing.append("data-parallel size: no DeepSpeed world_size and no NCCL init lines")

    # dtype.
    dtype_from_coll: int | None = None
    if fw.train_dtype and fw.train_dtype in _TRAIN_DTYPE_BYTES:
        inp.weight_bytes = Fact(
            _TRAIN_DTYPE_BYTES[fw.train_dtype], f"ZeRO optimizer's dtype ({fw.train_dtype})"
        )
    elif "True" in (cfg.get("bfloat16_enabled"), cfg.get("fp16_enabled")):
        inp.weight_bytes = Fact(2, "DeepSpeed config dump (bf16/fp16 enabled)")
    elif cfg.get("bfloat16_enabled") == "False" and cfg.get("fp16_enabled") == "False":
        inp.weight_bytes = Fact(4, "DeepSpeed config dump (neither bf16 nor fp16)")

    # Parameters.
    if fw.model_elems:
        inp.params = Fact(
            fw.model_elems, "DeepSpeed zero.Init 'finished initializing model' (num_elems)"
        )
        if fw.model_elems_line is not None:
            inp.lines.append(LineRef(*fw.model_elems_line))
    elif inp.dp is not None:
        found = _params_from_collectives(ctx, int(inp.dp.value))
        if found is not None:
            inp.params, dtype_from_coll = found
    if inp.params is None:
        inp.missing.append(
            "parameter count: no zero.Init 'finished initializing model' line (ZeRO-3) and "
            "no repeating ReduceScatter pattern in the COLL lines"
        )
    if inp.weight_bytes is None:
        if dtype_from_coll in DTYPE_BYTES:
            inp.weight_bytes = Fact(DTYPE_BYTES[dtype_from_coll], "ReduceScatter dtype")
        else:
            inp.weight_bytes = Fact(2, "assumed (bf16/fp16 mixed precision)")

    ga = _int(cfg.get("gradient_accumulation_steps"))
    inp.grad_accum = (
        Fact(ga, "DeepSpeed config dump")
        if ga
        else Fact(1, "assumed (no gradient_accumulation_steps in the logs)")
    )
    for attr, value in (
        ("reduce_bucket", zero.reduce_bucket_size),
        ("allgather_bucket", zero.allgather_bucket_size),
        ("prefetch_bucket", zero.prefetch_bucket_size),
    ):
        if value:
            setattr(inp, attr, Fact(value, f"DeepSpeed ZeRO config ({zero.source})"))

    # Memory.
    total = _telemetry_gpu(ctx, "ncclscope_gpu_memory_total_bytes", "min")
    if total is not None:
        inp.gpu_total = Fact(total, "telemetry ncclscope_gpu_memory_total_bytes (smallest GPU)")
    else:
        inp.missing.append("GPU memory total: no telemetry (analyze --telemetry)")
    used = _telemetry_gpu(ctx, "ncclscope_gpu_memory_used_bytes", "max")
    tput_peak = fw.throughput["max_mem_allocated_bytes"].max()
    mem_peak = fw.memory["max_allocated_bytes"].max()
    if used is not None:
        inp.peak = Fact(used, "telemetry ncclscope_gpu_memory_used_bytes (largest GPU)")
    elif isinstance(tput_peak, int) and tput_peak > 0:
        inp.peak = Fact(tput_peak, "DeepSpeed MaxMemAllocated (rank 0 throughput lines)")
    elif isinstance(mem_peak, int) and mem_peak > 0:
        inp.peak = Fact(mem_peak, "DeepSpeed see_memory_usage Max_MA (rank 0)")
    else:
        inp.missing.append("GPU memory peak: no telemetry and no DeepSpeed memory lines")
    after = fw.memory.filter(pl.col("label").str.contains("After initializing ZeRO optimizer"))
    if len(after):
        row = after.row(len(after) - 1, named=True)
        inp.states_after_init = Fact(
            row["allocated_bytes"], "see_memory_usage 'After initializing ZeRO optimizer' (MA)"
        )
        inp.lines.append(LineRef(int(row["file_id"]), int(row["line_no"])))

    # Time.
    parts = [_median_timer(ctx, n) for n in ("fwd", "bwd", "step")]
    if all(p is not None for p in parts):
        inp.step_s = Fact(
            sum(p for p in parts if p is not None),
            "rank 0 DeepSpeed timers fwd + bwd + step (median)",
        )
    else:
        inp.missing.append(
            "step time: no DeepSpeed fwd/bwd/step timers (wall_clock_breakdown: true)"
        )
    opt = parts[2]
    if opt is not None:
        inp.optimizer_s = Fact(opt, "rank 0 DeepSpeed timer step (median)")

    # Bandwidth.
    comms = fw.comms.filter(
        pl.col("op").str.contains("all_gather") & pl.col("busbw_bytes_per_s").is_not_null()
    )
    if len(comms):
        # The larger half of the messages: small ones are latency bound.
        bw = comms.sort("msg_size_bytes")["busbw_bytes_per_s"].tail(max(1, len(comms) // 2))
        med = bw.median()
        inp.bus_bw = Fact(
            float(med) if isinstance(med, int | float) else 0.0,
            f"DeepSpeed comms logger all-gather busbw ({len(comms)} rows)",
        )
    elif (measured := _inspector_bus_bw(ctx)) is not None:
        inp.bus_bw = measured
    else:
        transport = _slowest_transport(a.transports, multi_node=len(a.hosts) > 1)
        if transport is not None:
            inp.bus_bw = Fact(
                NOMINAL_BUS_BW[transport],
                f"nominal for {transport} (assumed; not measured: NCCL COLL lines time "
                "enqueues, not completions)",
            )
        else:
            inp.missing.append("bus bandwidth: no comms logger and no NCCL transport lines")
    pcie = _telemetry_gpu(ctx, "ncclscope_gpu_pcie_link_max_bytes_per_second", "min")
    inp.pcie_bw = (
        Fact(pcie, "telemetry ncclscope_gpu_pcie_link_max_bytes_per_second")
        if pcie
        else Fact(NOMINAL_PCIE_BW, "assumed (PCIe Gen4 x16)")
    )
    return inp


def _inspector_bus_bw(ctx: Context) -> Fact | None:
    """NCCL Inspector's all-gather bus bandwidth: the median over the larger half of the
    messages (small ones are latency bound), waits for late ranks included."""
    ag = ctx.analysis.tools.inspector.filter(
        (pl.col("op") == "AllGather") & pl.col("bus_bw_bytes_per_s").is_not_null()
    )
    if ag.is_empty():
        return None
    bw = ag.sort("msg_size_bytes")["bus_bw_bytes_per_s"].tail(max(1, len(ag) // 2))
    med = bw.median()
    if not isinstance(med, int | float) or med <= 0:
        return None
    return Fact(float(med), f"NCCL Inspector all-gather busbw ({len(ag)} records)")


def _int(text: str | None) -> int | None:
    try:
        return int(text.replace(",", "")) if text else None
    except ValueError:
        return None


def _slowest_transport(transports: list[str], *, multi_node: bool) -> str | None:
    """The transport that bounds the data-parallel collectives."""
    nets = [t for t in transports if t.startswith("NET/")]
    if multi_node or nets:
        if "NET/Socket" in nets:
            return "NET/Socket"
        if nets:
            return "NET/IB" if "NET/IB" in nets else "NET/other"
    if "SHM" in transports:
        return "SHM"
    if any(t.startswith("P2P") for t in transports):
        return "P2P"
    if "NVLS" in transports:
        return "NVLS"
    return None


# --------------------------------------------------------------------------------------
# The detector


def _gib(value: float | None) -> str:
    return "?" if value is None else f"{value / 2**30:.1f} GiB"


def _option_row(r: dict[str, Any]) -> dict[str, Any]:
    """A metric row for JSON: bytes in whole numbers, seconds to the microsecond, and the
    communication share of the step."""
    out: dict[str, Any] = {}
    for k, v in r.items():
        if isinstance(v, float):
            out[k] = round(v, 6) if k.endswith("_s") else round(v)
        else:
            out[k] = v
    comm, step = r["comm_s"], r["step_s"]
    out["comm_share"] = round(comm / step, 4) if comm is not None and step else None
    return out


def _option_of(r: dict[str, Any]) -> Option:
    return Option(r["stage"], r["offload_optimizer"], r["offload_param"])


@register
class ZeroStageDetector:
    """Is the ZeRO stage (and offload) the fastest one that fits?"""

    name = "zero_stage"

    def metric(self, ctx: Context) -> pl.DataFrame:
        inp = gather_inputs(ctx)
        return options(inp) if inp is not None else pl.DataFrame()

    def policy(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        inp = gather_inputs(ctx)
        if inp is None:
            return []
        cur = inp.current
        rows = list(metric.iter_rows(named=True))
        current = next((r for r in rows if r["current"]), None)
        best = None
        if current is not None and current["step_s"]:
            candidates = [
                r
                for r in rows
                if not r["current"]
                and r["fits"]
                and r["step_s"] is not None
                and r["offload_optimizer"] <= cur.offload_optimizer
                and r["offload_param"] <= cur.offload_param
                and r["step_s"] <= (1 - MIN_SPEEDUP) * current["step_s"]
            ]
            # Fastest first; among equals, the least memory.
            candidates.sort(key=lambda r: (round(r["step_s"], 3), r["peak_bytes"]))
            best = candidates[0] if candidates else None
        evidence: dict[str, Any] = {
            "current": asdict(cur),
            "recommended": asdict(_option_of(best)) if best else None,
            "inputs": [
                {"name": name, "value": fact.value, "source": fact.source}
                for name, fact in (
                    ("params", inp.params),
                    ("weight_bytes", inp.weight_bytes),
                    ("dp_size", inp.dp),
                    ("grad_accum_steps", inp.grad_accum),
                    ("gpu_memory_total_bytes", inp.gpu_total),
                    ("peak_memory_bytes", inp.peak),
                    ("model_states_after_init_bytes", inp.states_after_init),
                    ("step_s", inp.step_s),
                    ("optimizer_step_s", inp.optimizer_s),
                    ("bus_bandwidth_bytes_per_s", inp.bus_bw),
                    ("pcie_bandwidth_bytes_per_s", inp.pcie_bw),
                    ("reduce_bucket_elements", inp.reduce_bucket),
                    ("allgather_bucket_elements", inp.allgather_bucket),
                    ("prefetch_bucket_elements", inp.prefetch_bucket),
                )
                if fact is not None
            ],
            "missing": inp.missing,
            "options": [_option_row(r) for r in rows],
        }
        message = self._message(inp, current, best)
        return [
            Finding(
                kind="zero_stage",
                severity="info",  # advice; the recommendation is in the evidence
                message=message,
                evidence=evidence,
                lines=inp.lines,
            )
        ]

    def _message(
        self, inp: Inputs, current: dict[str, Any] | None, best: dict[str, Any] | None
    ) -> str:
        cur = inp.current.label()
        if current is None:
            return (
                f"{cur}: cannot estimate the other ZeRO stages: "
                + "; ".join(m.split(":")[0] for m in inp.missing)
                + " missing"
            )
        est = current["model_states_bytes"]
        check = (
            f" (measured after init: {_gib(inp.states_after_init.value)})"
            if inp.states_after_init
            else ""
        )
        head = f"{cur}: model states ~{_gib(est)} per GPU estimated{check}"
        if inp.peak is not None:
            head += f", peak {_gib(inp.peak.value)}"
        if inp.gpu_total is not None:
            head += f" of {_gib(inp.gpu_total.value)}"
        if current["comm_s"] is not None and current["step_s"]:
            head += (
                f"; communication ~{duration_text(current['comm_s'])} of a "
                f"{duration_text(current['step_s'])} step"
            )
        if best is not None:
            saving = 1 - best["step_s"] / current["step_s"]
            return (
                f"{head}. {_option_of(best).label()} would fit (predicted peak "
                f"{_gib(best['peak_bytes'])}) and run ~{saving:.0%} faster per step "
                f"({duration_text(best['step_s'])})"
            )
        if inp.missing:
            return (
                f"{head}. Not enough to advise on another stage: "
                + "; ".join(m.split(":")[0] for m in inp.missing)
                + " missing"
            )
        return f"{head}. No other stage both fits and is clearly faster: keep it"
