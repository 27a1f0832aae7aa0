"""Framework lines, DeepSpeed and PyTorch (shared/formats/deepspeed-torch.md): set-up and steps."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ncclscope.synth.eras import _DS_ERA_FORMATS, _DS_RENAMES, _TORCH_ERA_FORMATS
from ncclscope.synth.options import _BF16, Json
from ncclscope.synth.parts import _Rank, _SecondCache, _Sink

if TYPE_CHECKING:
    from ncclscope.synth.nccl_lines import _JobLines


# NCCL collective -> c10d OpType (opTypeToString) of what DeepSpeed/FSDP call:
# all_gather_into_tensor, reduce_scatter_tensor, all_reduce.
_OP_TYPE = {
    "AllGather": "_ALLGATHER_BASE",
    "ReduceScatter": "_REDUCE_SCATTER_BASE",
    "AllReduce": "ALLREDUCE",
}
_DS_COMM_OP = {
    "AllGather": "all_gather_into_tensor",
    "ReduceScatter": "reduce_scatter_tensor",
    "AllReduce": "all_reduce",
}
_TORCH_LIB = "/usr/local/lib/python3.10/dist-packages/torch/lib"
_PY_SITE = "/usr/local/lib/python3.10/dist-packages"
_PY_BINARY = "/usr/bin/python3"
_ENTRYPOINT = "train.py"
_GIB = 1 << 30
_HOST_RAM_GB = 2015.56  # psutil total of the (invented) hosts, for "percent ="
_DESYNC_WHY = (
    "This is most likely caused by incorrect usages of collectives, e.g., wrong sizes used "
    "across ranks, the order of collectives is not same for all ranks or the scheduled "
    "collective, for some reason, didn't run. Additionally, this can be caused by GIL "
    "deadlock or other reasons such as network errors or bugs in the communications library "
    "(e.g. NCCL), etc. "
)


def _numel(op: str, count: int, nranks: int) -> tuple[int, int]:
    """NumelIn/NumelOut of a c10d work from the NCCL COLL count (send count for AllGather,
    receive count for ReduceScatter)."""
    if op == "AllGather":
        return count, count * nranks
    if op == "ReduceScatter":
        return count * nranks, count
    return count, count


def _convert_size(size_bytes: int) -> str:
    """DeepSpeed's ``convert_size`` (utils/comms_logging.py)."""
    if size_bytes == 0:
        return "0B"
    names = ("B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB")
    i = math.floor(math.log(size_bytes, 1024))
    return f"{round(size_bytes / math.pow(1024, i), 2)} {names[i]}"


def _ranks_str(ranks: list[int]) -> str:
    """c10d's ``ranksToString``: ``1, 2, 3``."""
    return ", ".join(str(r) for r in ranks)


def _rank_of(entry: dict[str, Json]) -> int:
    rank = entry["rank"]
    assert isinstance(rank, int)
    return rank


def _gb(value: float) -> float:
    """``round(bytes / 2**30, 2)``, as DeepSpeed prints memory."""
    return round(value / _GIB, 2)


@dataclass
class _Rec:
    """One write of hang-aftermath output: physical lines (prefix included, no '\\n').

    ``marks`` are (line offset in ``lines``, truth list, entry): once written, the entry
    gets the file and 1-based line number of that line and goes into the list.
    """

    t: float
    order: int
    sink: _Sink
    lines: list[str]
    marks: list[tuple[int, list[dict[str, Json]], dict[str, Json]]] = field(default_factory=list)
    owner: int = -1  # the rank whose process writes it (-1: a torchrun agent)
    desync: bool = False  # a desync report


class _FrameworkLines:
    """The PyTorch/DeepSpeed side of one job while it runs: set-up, step and end lines.

    It draws from its own random generator, so that the NCCL side of a job is the same
    whatever the framework writes. ``framework_hang._Framework`` adds a failure's lines and
    the framework truth.
    """

    def __init__(self, job: _JobLines) -> None:
        spec = job.spec
        self.job = job
        self.spec = spec
        self.ds = spec.framework == "deepspeed"
        self.rnd = random.Random(spec.seed * 7919 + 3)
        self.tf = _TORCH_ERA_FORMATS[spec.torch_era]
        self.df = _DS_ERA_FORMATS[spec.ds_era]
        self.timeout_s = spec.pg_timeout
        self.ds_sec = _SecondCache("%Y-%m-%d %H:%M:%S")
        self.lines = 0
        # --- truth, filled in as lines are written
        self.timer_lines: dict[str, int] = {}
        self.throughput_steps: list[int] = []
        self.memory_reports: list[dict[str, Json]] = []
        self.comms_rows: list[dict[str, Json]] = []
        self.timeouts: list[dict[str, Json]] = []
        self.failures: list[dict[str, Json]] = []
        self.terminated: list[int] = []
        self.desync_lagging: list[int] = []
        # --- the user's ds_config: HF-style "auto" sizes from the model's hidden size
        hidden = job.hidden
        self.stage = spec.zero_stage
        self.off_opt = spec.offload in ("optimizer", "both")
        self.off_param = spec.offload in ("param", "both")
        self.overlap = spec.zero_stage >= 2  # DeepSpeed's default is off for stage 1
        if self.stage == 3:
            self.reduce_bucket = hidden * hidden
            self.allgather_bucket = 500_000_000  # DeepSpeed's default (unused by stage 3)
            self.prefetch_bucket = hidden * hidden * 9 // 10
            self.persistence = 10 * hidden
        else:
            self.reduce_bucket = self.allgather_bucket = 200_000_000
            self.prefetch_bucket = 50_000_000
            self.persistence = 100_000
        self.micro_batch = self.rnd.choice((1, 2, 4, 8))
        self.batch = self.micro_batch * job.n
        # --- time model of a step as rank 0 sees it (module docstring)
        self.lateness = max(job.late)
        self.wait_slots: dict[str, int] = dict.fromkeys(
            (
                "fwd",
                "bwd_inner",
                "bwd_allreduce",
                "step",
                "optimizer_gradients",
                "optimizer_allgather",
            ),
            0,
        )
        for call in job.prog:
            for name in self._timers_of(call.phase):
                self.wait_slots[name] += 1
        step_share = 0.35 if self.off_opt else 0.08  # CPU Adam makes the optimizer step long
        # Stage 1 without overlap reduces after backward, inside allreduce_gradients().
        ar_share = 0.03 if (spec.zero12 and not self.overlap) else 0.0002
        rest = 1.0 - step_share - ar_share
        self.share = {
            "fwd": rest / 3,
            "bwd_inner": rest * 2 / 3,
            "bwd_allreduce": ar_share,
            "step": step_share,
        }
        self.step_wall_s = spec.step_time_s + len(job.prog) * self.lateness
        # One-off delays in the current step: seconds added to each timer, and in all.
        self.step_extra: dict[str, float] = {}
        self.step_push = 0.0
        self._tput_sum = 0.0
        self._tput_n = 0
        self.mem_final = 0.0  # bytes allocated when the engine is ready
        self.act_bytes = self.rnd.uniform(1.0, 4.0) * _GIB  # activations during a step
        self.cpu_used_gb = self.rnd.uniform(40.0, 120.0)
        self.config = self._user_config()

    # ---- DeepSpeed ----------------------------------------------------------------------

    def _timers_of(self, phase: str) -> tuple[str, ...]:
        """Timers a collective slot of this phase runs under (each gets its wait)."""
        if phase == "fwd":
            return ("fwd",)
        if phase == "bwd":
            return ("bwd_inner",)
        if phase == "reduce":
            # ZeRO reduces from backward hooks (inside bwd_inner) when it overlaps; ZeRO-1
            # without overlap reduces in allreduce_gradients() (bwd_allreduce), PART S 3.
            return ("bwd_inner",) if self.stage == 3 or self.overlap else ("bwd_allreduce",)
        if phase == "norm":
            return ("step", "optimizer_gradients") if self.spec.zero12 else ("step",)
        if phase == "optim_ag":
            return ("step", "optimizer_allgather")
        return ()

    def _user_config(self) -> dict[str, Json]:
        zero: dict[str, Json] = {
            "stage": self.stage,
            "overlap_comm": self.overlap,
            "contiguous_gradients": True,
            "reduce_bucket_size": self.reduce_bucket,
        }
        if self.stage == 3:
            zero["stage3_prefetch_bucket_size"] = self.prefetch_bucket
            zero["stage3_param_persistence_threshold"] = self.persistence
            zero["sub_group_size"] = 1_000_000_000
        else:
            zero["allgather_bucket_size"] = self.allgather_bucket
        if self.off_opt:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if self.off_param:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        cfg: dict[str, Json] = {
            "bf16": {"enabled": True},
            "gradient_accumulation_steps": 1,
            "gradient_clipping": 1.0,
            "optimizer": {
                "type": "AdamW",
                "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
            },
            "steps_per_print": self.spec.steps_per_print,
            "train_batch_size": self.batch,
            "train_micro_batch_size_per_gpu": self.micro_batch,
            "wall_clock_breakdown": True,
            "zero_optimization": zero,
        }
        if self.spec.comms_summary:
            cfg["comms_logger"] = {
                "enabled": True,
                "verbose": False,
                "prof_all": True,
                "debug": False,
            }
        return cfg

    def _ds_ts(self, t: float) -> str:
        sec = int(t)
        return f"[{self.ds_sec.get(sec)},{int((t - sec) * 1000):03d}]"

    def _ds_text(self, rk: _Rank, t: float, src: str, msg: str) -> str:
        """One DeepSpeed logger record: header on its first line only, prefix on each."""
        lines = f"{self._ds_ts(t + self.job.rank_off[rk.rank])} [INFO] [{src}] {msg}".split("\n")
        self.lines += len(lines)
        return "".join(f"{rk.head}{line}\n" for line in lines)

    def _zero_repr(self) -> str:
        """``zero_config`` as the pydantic model prints it: user values plain, DeepSpeed's
        own integer defaults (``pp_int``) comma-grouped."""
        cfg = self.config["zero_optimization"]
        assert isinstance(cfg, dict)

        def val(key: str, default: int) -> str:
            v = cfg.get(key)
            return str(v) if v is not None else f"{default:,}"

        off_param = (
            "DeepSpeedZeroOffloadParamConfig(device='cpu', nvme_path=None, buffer_count=5, "
            "buffer_size=100,000,000, max_in_cpu=1,000,000,000, pin_memory=True)"
            if self.off_param
            else "None"
        )
        off_opt = (
            "DeepSpeedZeroOffloadOptimizerConfig(device='cpu', nvme_path=None, buffer_count=4, "
            "pin_memory=True, pipeline_read=False, pipeline_write=False, fast_init=False, "
            "ratio=1.0)"
            if self.off_opt
            else "None"
        )
        new = self.df.newer_keys
        parts = [
            f"stage={self.stage}",
            "contiguous_gradients=True",
            "reduce_scatter=True",
            f"reduce_bucket_size={val('reduce_bucket_size', 500_000_000)}",
            *(["use_multi_rank_bucket_allreduce=True"] if new else []),
            "allgather_partitions=True",
            f"allgather_bucket_size={val('allgather_bucket_size', 500_000_000)}",
            f"overlap_comm={self.overlap}",
            "load_from_fp32_weights=True",
            "elastic_checkpoint=False",
            f"offload_param={off_param}",
            f"offload_optimizer={off_opt}",
            f"sub_group_size={val('sub_group_size', 1_000_000_000)}",
            "cpu_offload_param=None",
            "cpu_offload_use_pin_memory=None",
            "cpu_offload=None",
            f"prefetch_bucket_size={val('stage3_prefetch_bucket_size', 50_000_000)}",
            f"param_persistence_threshold={val('stage3_param_persistence_threshold', 100_000)}",
            "model_persistence_threshold=sys.maxsize",
            "max_live_parameters=1,000,000,000",
            "max_reuse_distance=1,000,000,000",
            "gather_16bit_weights_on_model_save=False",
            *(["use_all_reduce_for_fetch_params=False"] if new else []),
            "stage3_gather_fp16_weights_on_model_save=False",
            "ignore_unused_parameters=True",
            "legacy_stage1=False",
            "round_robin_gradients=False",
            "zero_hpz_partition_size=1",
            "zero_quantized_weights=False",
            "zero_quantized_nontrainable_weights=False",
            "zero_quantized_gradients=False",
            "mics_shard_size=-1",
            "mics_hierarchical_params_gather=False",
            "memory_efficient_linear=True",
            *(["pipeline_loading_checkpoint=False", "override_module_apply=True"] if new else []),
        ]
        return " ".join(parts)

    def _config_dump(self) -> list[tuple[str, str]]:
        """``DeepSpeedConfig.print``: the title, one line per attribute, then the json."""
        n = self.job.n
        # DeepSpeedConfigObject.__repr__ (ScientificNotationEncoder): ", " ends each line.
        act = (
            '{\n    "partition_activations": false, \n    "contiguous_memory_optimization": '
            'false, \n    "cpu_checkpointing": false, \n    "number_checkpoints": null, \n    '
            '"synchronize_checkpoint_boundary": false, \n    "profile": false\n}'
        )
        flops = (
            '{\n    "enabled": false, \n    "recompute_fwd_factor": 0.0, \n    "profile_step": 1, '
            '\n    "module_depth": -1, \n    "top_modules": 1, \n    "detailed": true, \n    '
            '"output_file": null\n}'
        )
        attrs: dict[str, str] = {
            "activation_checkpointing_config": act,
            "aio_config": (
                "{'block_size': 1048576, 'queue_depth': 8, 'thread_count': 1, "
                "'single_submit': False, 'overlap_events': True}"
            ),
            "amp_enabled": "False",
            "amp_params": "False",
            "bfloat16_enabled": "True",
            "checkpoint_parallel_write_pipeline": "False",
            "checkpoint_tag_validation_enabled": "True",
            "checkpoint_tag_validation_fail": "False",
            "comms_config": (
                "<deepspeed.comm.config.DeepSpeedCommsConfig object at "
                f"0x7f{self.rnd.getrandbits(40):010x}>"
            ),
            "communication_data_type": "None",
            "curriculum_enabled_legacy": "False",
            "curriculum_params_legacy": "False",
            "data_efficiency_enabled": "False",
            "dataloader_drop_last": "False",
            "disable_allgather": "False",
            "dump_state": "False",
            "dynamic_loss_scale_args": "None",
            "eigenvalue_enabled": "False",
            "eigenvalue_gas_boundary_resolution": "1",
            "eigenvalue_layer_name": "bert.encoder.layer",
            "eigenvalue_layer_num": "0",
            "eigenvalue_max_iter": "100",
            "eigenvalue_stability": "1e-06",
            "eigenvalue_tol": "0.01",
            "eigenvalue_verbose": "False",
            "elasticity_enabled": "False",
            "flops_profiler_config": flops,
            "fp16_auto_cast": "None",
            "fp16_enabled": "False",
            "fp16_master_weights_and_gradients": "False",
            "global_rank": "0",
            "grad_accum_dtype": "None",
            "gradient_accumulation_steps": "1",
            "gradient_clipping": "1.0",
            "gradient_predivide_factor": "1.0",
            "initial_dynamic_scale": "1",
            "load_universal_checkpoint": "False",
            "loss_scale": "1.0",
            "memory_breakdown": "False",
            "mics_hierarchial_params_gather": "False",
            "mics_shard_size": "-1",
            "monitor_config": (
                "tensorboard=TensorBoardConfig(enabled=False, output_path='', "
                "job_name='DeepSpeedJobName') wandb=WandbConfig(enabled=False, group=None, "
                "team=None, project='deepspeed') csv_monitor=CSVConfig(enabled=False, "
                "output_path='', job_name='DeepSpeedJobName') enabled=False"
            ),
            "optimizer_legacy_fusion": "False",
            "optimizer_name": "adamw",
            "optimizer_params": (
                "{'lr': 0.0003, 'betas': [0.9, 0.95], 'eps': 1e-08, 'weight_decay': 0.1}"
            ),
            "pld_enabled": "False",
            "pld_params": "False",
            "prescale_gradients": "False",
            "scheduler_name": "None",
            "scheduler_params": "None",
            "sparse_attention": "None",
            "sparse_gradients_enabled": "False",
            "steps_per_print": str(self.spec.steps_per_print),
            "train_batch_size": str(self.batch),
            "train_micro_batch_size_per_gpu": str(self.micro_batch),
            "use_node_local_storage": "False",
            "wall_clock_breakdown": "True",
            "weight_quantization_config": "None",
            "world_size": str(n),
            "zero_allow_untested_optimizer": "False",
            "zero_config": self._zero_repr(),
            "zero_enabled": "True",
            "zero_force_ds_cpu_optimizer": "True",
            "zero_optimization_stage": str(self.stage),
        }
        if self.df.newer_keys:
            attrs.update(
                {
                    "bfloat16_immediate_grad_update": "False",
                    "compile_config": "enabled=False backend='inductor' kwargs={}",
                    "graph_harvesting": "False",
                    "seq_parallel_communication_data_type": "torch.float32",
                    "timers_config": "enabled=True synchronized=True",
                    "use_data_before_expert_parallel_": "False",
                }
            )
        out = [(self.df.cfg_title, "DeepSpeedEngine configuration:")]
        # "  {} {} {}".format(arg, "." * (29 - len(arg)), value): no dots from 29 chars on.
        out += [
            (self.df.cfg_line, f"  {k} {'.' * (29 - len(k))} {attrs[k]}") for k in sorted(attrs)
        ]
        dumped = json.dumps(self.config, sort_keys=True, indent=4, separators=(",", ":"))
        out.append((self.df.cfg_json, f"  json = {dumped}"))
        return out

    def _memory_plan(self) -> list[tuple[str, float, float]]:
        """see_memory_usage reports at init: (label, GPU bytes allocated, host GB used)."""
        job = self.job
        n = job.n
        total = float(sum(job.params))  # elements
        shard = total / n
        rph = job.rph
        opt_gpu = 0.0 if self.off_opt else 12.0 * shard  # fp32 master + Adam moments
        opt_cpu = 12.0 * shard * rph / 1e9 if self.off_opt else 0.0  # every local rank's
        cpu = self.cpu_used_gb
        if self.stage == 3:
            w = 2.0 * shard  # zero.Init partitioned the bf16 weights at construction
            w_end = 0.05 * w if self.off_param else w
            cpu_param = 2.0 * shard * rph / 1e9 if self.off_param else 0.0
            plan = [
                ("Stage 3 initialize beginning", w, cpu),
                ("DeepSpeedZeRoOffload initialize [begin]", w, cpu),
                ("DeepSpeedZeRoOffload initialize [end]", w_end, cpu + cpu_param),
                ("Before creating fp16 partitions", w_end, cpu + cpu_param),
                ("After creating fp16 partitions: 1", w_end, cpu + cpu_param),
                ("Before creating fp32 partitions", w_end, cpu + cpu_param),
                (
                    "After creating fp32 partitions",
                    w_end + opt_gpu / 3,
                    cpu + cpu_param + opt_cpu / 3,
                ),
                (
                    "Before initializing optimizer states",
                    w_end + opt_gpu / 3,
                    cpu + cpu_param + opt_cpu / 3,
                ),
                ("After initializing optimizer states", w_end + opt_gpu, cpu + cpu_param + opt_cpu),
                (
                    "After initializing ZeRO optimizer",
                    w_end + opt_gpu + 2.0 * shard,
                    cpu + cpu_param + opt_cpu,
                ),
            ]
        else:
            w = 4.0 * total  # bf16 weights + their flat bf16 copy
            grads = 2.0 * shard if self.stage == 2 else 2.0 * total
            plan = [
                ("Before initializing optimizer states", w + opt_gpu / 3, cpu + opt_cpu / 3),
                ("After initializing optimizer states", w + opt_gpu, cpu + opt_cpu),
                ("After initializing ZeRO optimizer", w + opt_gpu + grads, cpu + opt_cpu),
            ]
        self.mem_final = plan[-1][1]
        return plan

    def _memory_report(self, label: str, ma: float, cpu_gb: float) -> list[tuple[str, str]]:
        r = self.rnd
        max_ma = ma * r.uniform(1.0, 1.15)
        ca = max_ma * r.uniform(1.02, 1.2) + 0.1 * _GIB
        max_ca = round(ca * r.uniform(1.0, 1.1) / _GIB)
        used = round(cpu_gb, 2)
        pct = round(100.0 * used / _HOST_RAM_GB, 1)
        rec: dict[str, Json] = {
            "label": label,
            "ma_gb": _gb(ma),
            "max_ma_gb": _gb(max_ma),
            "ca_gb": _gb(ca),
            "max_ca_gb": max_ca,
            "cpu_used_gb": used,
            "cpu_percent": pct,
        }
        self.memory_reports.append(rec)
        # A backslash-continued f-string: 9 spaces between fields, one at the end (D6).
        gap = " " * 9
        ma_line = (
            f"MA {_gb(ma)} GB{gap}Max_MA {_gb(max_ma)} GB{gap}CA {_gb(ca)} GB{gap}"
            f"Max_CA {max_ca} GB "
        )
        a, b, c = self.df.mem
        return [
            (a, label),
            (b, ma_line),
            (c, f"CPU Virtual Memory:  used = {used} GB, percent = {pct}%"),
        ]

    def _setup_msgs(self) -> list[tuple[str, str]]:
        """Engine set-up on rank 0, after the communicators, in DeepSpeed's order."""
        df = self.df
        dist = df.log_dist
        opt_cls = "DeepSpeedCPUAdam" if self.off_opt else "FusedAdam"
        opt_path = (
            "deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam"
            if self.off_opt
            else "deepspeed.ops.adam.fused_adam.FusedAdam"
        )
        out: list[tuple[str, str]] = [
            (dist, "[Rank 0] DeepSpeed Flops Profiler Enabled: False"),
            (dist, "[Rank 0] Using DeepSpeed Optimizer param name adamw as basic optimizer"),
            (dist, f"[Rank 0] DeepSpeed Basic Optimizer = {opt_cls}"),
            (
                df.zero_utils,
                f"Checking ZeRO support for optimizer={opt_cls} type=<class '{opt_path}'>",
            ),
            (dist, f"[Rank 0] Creating torch.bfloat16 ZeRO stage {self.stage} optimizer"),
        ]
        plan = self._memory_plan()
        if self.stage == 3:
            head, rest = plan[:1], plan[1:]
            for label, ma, cpu in head:
                out += self._memory_report(label, ma, cpu)
            out += [
                (f"stage3.py:{df.stage3}:__init__", f"Reduce bucket size {self.reduce_bucket}"),
                (
                    f"stage3.py:{df.stage3 + 1}:__init__",
                    f"Prefetch bucket size {self.prefetch_bucket}",
                ),
            ]
            for label, ma, cpu in rest:
                if label == "After initializing ZeRO optimizer":
                    out.append((df.stage3_opt, "optimizer state initialized"))
                out += self._memory_report(label, ma, cpu)
        else:
            src = "stage_1_and_2.py:{}:__init__"
            out += [
                (src.format(df.stage12), f"Reduce bucket size {self.reduce_bucket}"),
                (src.format(df.stage12 + 1), f"Allgather bucket size {self.allgather_bucket}"),
                (src.format(df.stage12 + 2), f"CPU Offload: {self.off_opt}"),
                (src.format(df.stage12 + 3), "Round robin gradient partitioning: False"),
            ]
            for label, ma, cpu in plan:
                out += self._memory_report(label, ma, cpu)
        out += [
            (dist, "[Rank 0] DeepSpeed Final Optimizer = adamw"),
            (dist, "[Rank 0] DeepSpeed using configured LR scheduler = None"),
            (dist, "[Rank 0] DeepSpeed LR Scheduler = None"),
            (dist, f"[Rank 0] step=0, skipped=0, lr=[{self._lr(0)!r}], mom=[(0.9, 0.95)]"),
        ]
        out += self._config_dump()
        return out

    def _lr(self, step: int) -> float:
        return 3e-4 * min(1.0, (step + 1) / 100)  # linear warm-up, as the noise prints it

    def init_events(self, events: list[list[tuple[float, str]]], steps_t0: float) -> None:
        """Add rank 0's DeepSpeed start-up lines to the init events (kept in time order)."""
        if not self.ds:
            return
        job = self.job
        rk = job.ranks[0]
        evs = events[0]
        # deepspeed.initialize() logs the version before anything creates a communicator.
        t = job.t_world_init - self.rnd.uniform(0.3, 0.6)
        msg = (
            f"[Rank 0] DeepSpeed info: version={self.df.version}, git-hash=unknown, "
            "git-branch=unknown"
        )
        evs.append((t, self._ds_text(rk, t, self.df.log_dist, msg)))
        # The rest fits in the 1.5 s between the last communicator and the first step.
        msgs = self._setup_msgs()
        t = steps_t0 - 1.45
        dt = 1.3 / len(msgs)
        for src, msg in msgs:
            evs.append((t, self._ds_text(rk, t, src, msg)))
            if src != self.df.cfg_line:  # the config dump is logged in one go
                t += dt
        evs.sort(key=lambda e: e[0])  # stable: NCCL lines keep their order

    def delayed(self, phase: str, push: float) -> None:
        """A one-off delay held the current step's slot of this phase up by ``push`` s."""
        for name in self._timers_of(phase):
            self.step_extra[name] = self.step_extra.get(name, 0.0) + push
        self.step_push += push

    def _timer_values(self) -> dict[str, float]:
        """Milliseconds of one step's timers (>= 0.10.1 names; micro and global)."""
        r = self.rnd
        st = self.spec.step_time_s
        late = self.lateness
        extra = self.step_extra

        def ms(name: str) -> float:
            wall = st * self.share[name] + self.wait_slots[name] * late + extra.get(name, 0.0)
            return wall * 1000.0 * r.uniform(0.97, 1.03)

        fwd, bi, ba, stp = ms("fwd"), ms("bwd_inner"), ms("bwd_allreduce"), ms("step")
        micro = {
            "fwd_microstep": fwd,
            "bwd_microstep": bi + ba + r.uniform(0.05, 0.5),  # bwd = inner + allreduce + hooks
            "bwd_inner_microstep": bi,
            "bwd_allreduce_microstep": ba,
            "step_microstep": stp,
        }
        out = dict(micro)
        for name, v in micro.items():  # one accumulation step: global ~ micro + overhead
            out[name.removesuffix("_microstep")] = v + r.uniform(0.01, 0.08)
        step_c = st * self.share["step"] * 1000.0
        if self.spec.zero12:
            out["optimizer_allgather"] = (
                step_c * 0.2
                + self.wait_slots["optimizer_allgather"] * late * 1000.0
                + extra.get("optimizer_allgather", 0.0) * 1000.0
            ) * r.uniform(0.97, 1.03)
            out["optimizer_gradients"] = (
                step_c * 0.15
                + self.wait_slots["optimizer_gradients"] * late * 1000.0
                + extra.get("optimizer_gradients", 0.0) * 1000.0
            ) * r.uniform(0.97, 1.03)
            out["optimizer_step"] = step_c * 0.6 * r.uniform(0.97, 1.03)
        else:
            out["optimizer_step"] = step_c * 0.7 * r.uniform(0.97, 1.03)
        if "optimizer_step" in extra:
            out["optimizer_step"] += extra["optimizer_step"] * 1000.0
        return out

    def _timer_msg(self, names: tuple[str, ...], values: dict[str, float]) -> str:
        """``SynchronizedWallClockTimer.log``: ``time (ms) | name: 1.23 | ...``."""
        text = self.df.timer_head
        for name in names:
            text += f" | {name}: {values[_DS_RENAMES.get(name, name)]:.2f}"
            key = _DS_RENAMES.get(name, name)
            self.timer_lines[key] = self.timer_lines.get(key, 0) + 1
        return f"[Rank 0] {text}"

    def step_done(self, gstep: int, t: float) -> int:
        """Rank 0's lines at the end of global step ``gstep``; return the characters added."""
        try:
            return self._step_lines(gstep, t)
        finally:
            self.step_extra = {}
            self.step_push = 0.0

    def _step_lines(self, gstep: int, t: float) -> int:
        if not self.ds:
            return 0
        job = self.job
        rk = job.ranks[0]
        df = self.df
        r = self.rnd
        values = self._timer_values()
        msgs: list[tuple[str, str]] = []
        # The optimizer logs its timers inside engine.step(), before the engine's own.
        opt: tuple[str, ...] = ("optimizer_step",)
        if self.spec.zero12:
            opt = ("optimizer_allgather", "optimizer_gradients", "optimizer_step")
        msgs.append((df.log_dist, self._timer_msg(opt, values)))
        cur = self.batch / ((self.step_wall_s + self.step_push) * r.uniform(0.98, 1.02))
        if gstep >= 2:  # ThroughputTimer starts counting at start_step=2
            self._tput_sum += cur
            self._tput_n += 1
        if gstep % self.spec.steps_per_print == 0:
            lr = self._lr(gstep)
            msgs.append(
                (df.log_dist, f"[Rank 0] step={gstep}, skipped=0, lr=[{lr!r}], mom=[(0.9, 0.95)]")
            )
            avg = self._tput_sum / self._tput_n if self._tput_n else float("-inf")
            ma = self.mem_final + self.act_bytes * r.uniform(0.1, 0.3)
            peak = self.mem_final + self.act_bytes * r.uniform(1.0, 1.2)
            msgs.append(
                (
                    df.timer_stop,
                    f"epoch=0/micro_step={gstep}/global_step={gstep}, "
                    f"RunningAvgSamplesPerSec={avg!r}, CurrSamplesPerSec={cur!r}, "
                    f"MemAllocated={_gb(ma)}GB, MaxMemAllocated={_gb(peak)}GB",
                )
            )
            self.throughput_steps.append(gstep)
        msgs.append((df.log_dist, self._timer_msg(df.micro, values)))
        msgs.append((df.log_dist, self._timer_msg(df.glob, values)))
        text = "".join(
            self._ds_text(rk, t + 0.0002 * k, src, msg) for k, (src, msg) in enumerate(msgs)
        )
        job.rank_sink[0].add(text)
        job._touch(t + 0.0002 * len(msgs))
        return len(text)

    def end_events(self, events: list[list[tuple[float, str]]]) -> None:
        """The comms-logger summary (rank 0, plain print) before the communicators go."""
        if not (self.ds and self.spec.comms_summary):
            return
        job = self.job
        n = job.n
        world_calls = [c for c in job.prog if c.world]
        full, part = divmod(job.world.seq, len(world_calls))
        counts: dict[str, dict[int, int]] = {}  # op -> size -> calls, in first-call order
        for k, call in enumerate(world_calls):
            calls = full + (1 if k < part else 0)
            if not calls:
                continue
            size = call.count_of(n) * (2 if call.dtype == _BF16 else 4)
            per = counts.setdefault(_DS_COMM_OP[call.op], {})
            per[size] = per.get(size, 0) + calls
        r = self.rnd
        wait = self.lateness - job.late[0]  # the logger's latency includes waiting for peers
        lines = [
            f"{'Comm. Op': <20}{'Message Size': <20}{'Count': <20}{'Total Latency(ms)': <20}"
            f"{'Avg Latency(ms)': <20}{'tput_avg (Gbps)': <20}{'busbw_avg (Gbps)': <20}"
        ]
        for op, sizes in counts.items():
            lines.append(op)
            for size, count in sorted(sizes.items()):
                moved = size * n if op != "all_reduce" else 2 * size  # calc_bw_log
                lat_s = (2e-5 + moved / 20e9 + wait) * r.uniform(0.97, 1.03)
                algbw = moved * 8 / 1e9 / lat_s
                busbw = algbw * (n - 1) / n
                total = lat_s * 1000.0 * count * r.uniform(0.99, 1.01)
                lines.append(
                    f"{' ': <20}{_convert_size(size): <20}{count: <20}{total: <20.2f}"
                    f"{lat_s * 1000.0: <20.2f}{algbw: <20.2f}{busbw: <20.2f}"
                )
                self.comms_rows.append(
                    {
                        "op": op,
                        "msg_size_bytes": size,
                        "msg_size": _convert_size(size),
                        "count": count,
                    }
                )
        head = job.ranks[0].head
        self.lines += len(lines)
        t = job.last_t + 0.2  # _end_events starts 0.5 s after the last line
        events[0].append((t, "".join(f"{head}{line}\n" for line in lines)))
        events[0].sort(key=lambda e: e[0])
