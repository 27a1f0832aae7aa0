"""The DeepSpeed line parser on every family and era of shared/formats/deepspeed-torch.md.

Sample lines are written here from DeepSpeed's format strings (PART D); the values are
invented.
"""

from __future__ import annotations

import doctest
import time
from datetime import UTC, datetime

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ncclscope.parsers.deepspeed import lines as ds
from ncclscope.parsers.deepspeed.lines import (
    BLOCK_LINES,
    BLOCK_STARTS,
    CANDIDATES,
    DeepSpeedResult,
    ZeroConfig,
    parse_deepspeed,
)
from ncclscope.schema import COMMS_SCHEMA, MEMORY_SCHEMA, THROUGHPUT_SCHEMA, TIMERS_SCHEMA

GiB = 2**30
MiB = 2**20
TS = datetime(2024, 2, 19, 10, 11, 12, 345000, tzinfo=UTC)


def hdr(where: str = "logging.py:96:log_dist", *, at: str = "2024-02-19 10:11:12,345") -> str:
    """DeepSpeed's logger header (``utils/logging.py`` formatter)."""
    return f"[{at}] [INFO] [{where}] "


def rank0(where: str = "logging.py:96:log_dist") -> str:
    """Header plus the ``[Rank 0] `` that ``log_dist`` puts in front."""
    return hdr(where) + "[Rank 0] "


def parse(texts: list[str], *, start: int = 1, file_id: int = 0) -> DeepSpeedResult:
    """Parse consecutive lines numbered from ``start``."""
    return parse_deepspeed(list(enumerate(texts, start)), file_id=file_id)


def secs(ms: float) -> float:
    """Printed milliseconds in seconds, computed as the parser does."""
    return ms / 1000


def timer_rows(res: DeepSpeedResult) -> list[tuple[object, ...]]:
    return res.timers.select("line_no", "rank", "step", "name", "name_printed", "duration_s").rows()


# --------------------------------------------------------------------------------------
# Selection regexes (polars syntax)

NEEDED_ALONE = [
    rank0() + "time (ms) | fwd_microstep: 287.41 | bwd_microstep: 612.86",
    rank0() + "rank=0 time (ms) | forward_microstep: 287.41 | backward_microstep: 612.86",
    "rank=0 time (ms) | forward: 120.31 | backward: 250.12",
    "time (ms) | forward: 120.31 | backward: 250.12",
    hdr("timer.py:260:stop") + "epoch=0/micro_step=40/global_step=10, "
    "RunningAvgSamplesPerSec=21.873046128374906, CurrSamplesPerSec=22.41, "
    "MemAllocated=3.47GB, MaxMemAllocated=9.12GB",
    "1/200, SamplesPerSec=88.31",
    rank0() + "step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]",
    "steps: 100 loss: 2.3456 iter time (s): 0.512 samples/sec: 125.000",
    hdr("utils.py:796:see_memory_usage") + "Stage 3 initialize beginning",
    hdr("utils.py:797:see_memory_usage")
    + "MA 1.27 GB         Max_MA 1.84 GB         CA 3.41 GB         Max_CA 3 GB ",
    hdr("utils.py:804:see_memory_usage") + "CPU Virtual Memory:  used = 112.38 GB, percent = 44.6%",
    rank0() + "comm op: all_reduce | time (ms): 2.05 | msg size: 64.0 MB | "
    "algbw (Gbps): 523.78 | busbw (Gbps): 982.08",
    "Comm. Op            Message Size        Count               Total Latency(ms)   "
    "Avg Latency(ms)     tput_avg (Gbps)     busbw_avg (Gbps)    ",
    "Comm. Op            Message Size        Count               Total comm lat(ms)  "
    "Total straggler(ms) Avg comm lat(ms)    Avg straggler(ms)   ",
    hdr("config.py:984:print") + "DeepSpeedEngine configuration:",
    hdr("config.py:988:print") + "  zero_optimization_stage ...... 3",
    hdr("config.py:974:print_user_config") + "  json = {",
    rank0("engine.py:263:__init__")
    + "DeepSpeed info: version=0.14.0, git-hash=unknown, git-branch=unknown",
    hdr("launch.py:256:main") + "dist_world_size=16",
    hdr("stage_1_and_2.py:148:__init__") + "Reduce bucket size 500000000",
    rank0() + "Creating torch.float16 ZeRO stage 3 optimizer",
    "Invalidate trace cache @ step 5: expected module 12, but got module 14",
    hdr("stage3.py:1066:step")
    + "Invalidate trace cache @ step 0 and module 0: cache has only 0 modules",
    # prefixed and glued
    "gpu-node-07: " + rank0() + "time (ms) | fwd: 120.50",
    "  7%|███ | 41/596 [01:13<15:34,  1.62s/it]" + rank0() + "time (ms) | fwd: 120.50",
    "[default0]:" + hdr("timer.py:260:stop") + "1/200, SamplesPerSec=88.31",
]

ORDINARY = [
    "  7%|███ | 41/596 [01:13<15:34,  1.62s/it]",
    "Epoch 1: 100%|██████████| 596/596 [16:02<00:00,  1.61s/it, loss=2.31]",
    "epoch 3 loss 2.31",
    "[rank 3] step 120 loss 2.4102 tokens 32768",
    "node-1:55:55 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x7f00 recvbuff 0x7f80 "
    "count 4096 datatype 7 op 0 root 0 comm 0x55d1c2a4b2e0 [nranks=16] stream 0x55d1",
    "node-1:55:55 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
    "[rank0]:[E314 10:00:00.123456 4242 ProcessGroupNCCL.cpp:632] [PG 0 Rank 0] Watchdog "
    "caught collective operation timeout: WorkNCCL(SeqNum=41, OpType=_ALLGATHER_BASE, "
    "Timeout(ms)=600000) ran for 600052 milliseconds before timing out.",
    "[2024-02-19 10:00:00,123] torch.distributed.elastic.multiprocessing.api: [WARNING] "
    "Sending process 4242 closing signal SIGTERM",
    "[2025-06-02 14:03:11.482913] node1:4411:4502 [3] NCCL WARN NET/IB : Got completion",
    '    "stage": 3, ',
    "                    4.0 MB              48                  5.62                0.11",
    "all_gather_into_tensor",
    "",
]


@pytest.mark.parametrize("line", NEEDED_ALONE)
def test_candidates_match_lines_the_parser_needs(line: str) -> None:
    assert pl.Series([line]).str.contains(CANDIDATES).item() is True


@pytest.mark.parametrize("line", ORDINARY)
def test_candidates_skip_ordinary_lines(line: str) -> None:
    assert pl.Series([line]).str.contains(CANDIDATES).item() is False


def test_every_needed_line_is_read_on_its_own() -> None:
    # Each sample the selection delivers is recognised by the parser with nothing around it
    # (a lone "json = {" opens an object that never closes: that one is malformed).
    for i, line in enumerate(NEEDED_ALONE):
        res = parse_deepspeed([(10 * i + 1, line)], file_id=0)
        assert res.seen, line
        assert res.malformed == int(line.endswith("json = {")), line


@pytest.mark.parametrize(
    ("line", "opens"),
    [
        (hdr("config.py:984:print") + "DeepSpeedEngine configuration:", True),
        ("gpu-node-07: " + hdr("config.py:984:print") + "DeepSpeedEngine configuration:", True),
        (hdr("config.py:974:print_user_config") + "  json = {", True),
        ("Comm. Op            Message Size        Count               Total Latency(ms)   ", True),
        ("Comm. Op            Message Size        Count               Total comm lat(ms)  ", True),
        (hdr("config.py:988:print") + "  zero_optimization_stage ...... 3", False),
        (rank0() + "time (ms) | fwd: 120.50", False),
        (hdr("utils.py:796:see_memory_usage") + "Stage 3 initialize beginning", False),
        ('print(f"json = {cfg}")', False),
        ("epoch 3 loss 2.31", False),
    ],
)
def test_block_starts(line: str, opens: bool) -> None:
    assert pl.Series([line]).str.contains(BLOCK_STARTS).item() is opens
    if opens:  # a block start is always a candidate too
        assert pl.Series([line]).str.contains(CANDIDATES).item() is True


def test_block_lines_is_a_window() -> None:
    assert BLOCK_LINES == 400


def test_module_doctests() -> None:
    result = doctest.testmod(ds)
    assert result.attempted > 5
    assert result.failed == 0


# --------------------------------------------------------------------------------------
# Timers (D2, D3): both eras, header-less v0.3, ZeRO/fp16/swap groups, MoE


@pytest.mark.parametrize(
    ("line", "rows"),  # rows: (rank, name, name_printed, milliseconds)
    [
        pytest.param(
            rank0() + "time (ms) | fwd_microstep: 287.41 | bwd_microstep: 612.86 | "
            "bwd_inner_microstep: 402.57 | bwd_allreduce_microstep: 210.04 | step_microstep: 3.12",
            [
                (0, "fwd_microstep", "fwd_microstep", 287.41),
                (0, "bwd_microstep", "bwd_microstep", 612.86),
                (0, "bwd_inner_microstep", "bwd_inner_microstep", 402.57),
                (0, "bwd_allreduce_microstep", "bwd_allreduce_microstep", 210.04),
                (0, "step_microstep", "step_microstep", 3.12),
            ],
            id=">=0.10.1-micro",
        ),
        pytest.param(
            rank0() + "rank=0 time (ms) | forward_microstep: 287.41 | backward_microstep: 612.86 "
            "| backward_inner_microstep: 402.57 | backward_allreduce_microstep: 210.04 "
            "| step_microstep: 3.12",
            [
                (0, "fwd_microstep", "forward_microstep", 287.41),
                (0, "bwd_microstep", "backward_microstep", 612.86),
                (0, "bwd_inner_microstep", "backward_inner_microstep", 402.57),
                (0, "bwd_allreduce_microstep", "backward_allreduce_microstep", 210.04),
                (0, "step_microstep", "step_microstep", 3.12),
            ],
            id="<=0.10.0-micro",
        ),
        pytest.param(
            rank0() + "rank=0 time (ms) | forward: 1149.64 | backward: 2451.44 | "
            "backward_inner: 1610.28 | backward_allreduce: 841.16 | step: 12.48",
            [
                (0, "fwd", "forward", 1149.64),
                (0, "bwd", "backward", 2451.44),
                (0, "bwd_inner", "backward_inner", 1610.28),
                (0, "bwd_allreduce", "backward_allreduce", 841.16),
                (0, "step", "step", 12.48),
            ],
            id="<=0.10.0-global",
        ),
        pytest.param(
            "rank=0 time (ms) | forward: 120.31 | backward: 250.12 | step: 10.00",
            [
                (0, "fwd", "forward", 120.31),
                (0, "bwd", "backward", 250.12),
                (0, "step", "step", 10.00),
            ],
            id="v0.3-print-rank",
        ),
        pytest.param(
            "time (ms) | forward: 120.31 | backward: 250.12",
            [(None, "fwd", "forward", 120.31), (None, "bwd", "backward", 250.12)],
            id="v0.3-print-bare",
        ),
        pytest.param(
            rank0() + "time (ms) | optimizer_allgather: 12.40 | optimizer_gradients: 5.67 "
            "| optimizer_step: 89.01",
            [
                (0, "optimizer_allgather", "optimizer_allgather", 12.40),
                (0, "optimizer_gradients", "optimizer_gradients", 5.67),
                (0, "optimizer_step", "optimizer_step", 89.01),
            ],
            id="zero-1-2",
        ),
        pytest.param(
            rank0() + "time (ms) | optimizer_step: 912.33 | optimizer_swap_in_state: 401.20 "
            "| optimizer_swap_out_state: 388.75",
            [
                (0, "optimizer_step", "optimizer_step", 912.33),
                (0, "optimizer_swap_in_state", "optimizer_swap_in_state", 401.20),
                (0, "optimizer_swap_out_state", "optimizer_swap_out_state", 388.75),
            ],
            id="zero-3-swap",
        ),
        pytest.param(
            rank0() + "time (ms) | compute_norm: 1.02 | overflow_check: 0.33 | "
            "unscale_and_clip: 0.91 | basic_step: 6.40 | update_fp16: 0.77",
            [
                (0, "compute_norm", "compute_norm", 1.02),
                (0, "overflow_check", "overflow_check", 0.33),
                (0, "unscale_and_clip", "unscale_and_clip", 0.91),
                (0, "basic_step", "basic_step", 6.40),
                (0, "update_fp16", "update_fp16", 0.77),
            ],
            id="fp16",
        ),
        pytest.param(
            rank0() + "time (ms) | swap_in_param: 33.10 | swap_out_param: 31.95 | "
            "async_swap_gradient_wait: 4.05",
            [
                (0, "swap_in_param", "swap_in_param", 33.10),
                (0, "swap_out_param", "swap_out_param", 31.95),
                (0, "async_swap_gradient_wait", "async_swap_gradient_wait", 4.05),
            ],
            id="nvme-swap",
        ),
        pytest.param(
            rank0() + "time (ms) | fwd: 120.50 (fwd_moe: 30.10, 1st_a2a: 5.20, 2nd_a2a: 4.90, "
            "top_k: 1.10)",
            [
                (0, "fwd", "fwd", 120.50),
                (0, "fwd_moe", "fwd_moe", 30.10),
                (0, "1st_a2a", "1st_a2a", 5.20),
                (0, "2nd_a2a", "2nd_a2a", 4.90),
                (0, "top_k", "top_k", 1.10),
            ],
            id="moe->=0.10.1",
        ),
        pytest.param(
            rank0() + "rank=0 time (ms) | forward: 120.50 (forward_moe: 30.10, 1st alltoall: "
            "5.20, 2nd alltoall: 4.90, top-k: 1.10)",
            [
                (0, "fwd", "forward", 120.50),
                (0, "fwd_moe", "forward_moe", 30.10),
                (0, "1st_a2a", "1st alltoall", 5.20),
                (0, "2nd_a2a", "2nd alltoall", 4.90),
                (0, "top_k", "top-k", 1.10),
            ],
            id="moe-<=0.10.0",
        ),
        pytest.param(
            hdr() + "[Rank 3] time (ms) | pipe_send_output: 14.20 | pipe_recv_grad: -0.01",
            [
                (3, "pipe_send_output", "pipe_send_output", 14.20),
                (3, "pipe_recv_grad", "pipe_recv_grad", -0.01),
            ],
            id="pipe-rank3-negative",
        ),
        pytest.param(
            hdr() + "[Rank -1] time (ms) | fwd: 1.00",
            [(None, "fwd", "fwd", 1.00)],
            id="rank-before-init",
        ),
    ],
)
def test_timer_line(line: str, rows: list[tuple[object, ...]]) -> None:
    res = parse([line], start=7)
    # rows give the printed milliseconds; the table holds seconds
    assert timer_rows(res) == [(7, r[0], None, r[1], r[2], r[3] / 1000) for r in rows]
    assert (res.parsed, res.malformed, res.seen) == (1, 0, True)


def test_timer_rows_exact_with_time_and_frame_schema() -> None:
    res = parse(
        [rank0() + "time (ms) | fwd: 120.50", "rank=0 time (ms) | forward: 99.00"], file_id=4
    )
    assert res.timers.schema == TIMERS_SCHEMA
    assert res.timers.rows() == [
        (4, 1, 0, None, "fwd", "fwd", 0.1205, TS, "logger"),
        (4, 2, 0, None, "fwd", "forward", 0.099, None, "none"),
    ]


def test_timer_step_is_the_last_global_step_seen() -> None:
    timer = rank0() + "time (ms) | fwd: 1.00"
    res = parse(
        [
            timer,  # before any step: null
            rank0() + "step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]",
            timer,
            hdr("timer.py:260:stop") + "epoch=0/micro_step=88/global_step=11, "
            "RunningAvgSamplesPerSec=21.5, CurrSamplesPerSec=22.0, MemAllocated=3.47GB, "
            "MaxMemAllocated=9.12GB",
            timer,
            hdr("timer.py:198:stop") + "0/40, RunningAvgSamplesPerSec=21.87, "
            "CurrSamplesPerSec=22.41, MemAllocated=3.47GB, MaxMemAllocated=9.12GB",
            timer,
            "steps: 100 loss: 2.3456 iter time (s): 0.512 samples/sec: 125.000",
            timer,
        ]
    )
    assert res.timers.select("line_no", "step").rows() == [
        (1, None),
        (3, 10),
        (5, 11),
        (7, 40),
        (9, 100),
    ]


# --------------------------------------------------------------------------------------
# Throughput (D4)


@pytest.mark.parametrize(
    ("message", "row"),
    [
        pytest.param(
            "epoch=2/micro_step=40/global_step=10, RunningAvgSamplesPerSec=21.873046128374906, "
            "CurrSamplesPerSec=22.41, MemAllocated=3.47GB, MaxMemAllocated=9.12GB",
            (2, 40, 10, 22.41, 21.873046128374906, round(3.47 * GiB), round(9.12 * GiB)),
            id=">=0.7.6",
        ),
        pytest.param(
            "0/40, RunningAvgSamplesPerSec=21.87, CurrSamplesPerSec=22.41, MemAllocated=3.47GB, "
            "MaxMemAllocated=9.12GB",
            (0, 40, None, 22.41, 21.87, round(3.47 * GiB), round(9.12 * GiB)),
            id="0.7.0-0.7.5",
        ),
        pytest.param(
            "1/200, SamplesPerSec=88.31, MemAllocated=0.5GB, MaxMemAllocated=1.0GB",
            (1, 200, None, None, 88.31, GiB // 2, GiB),
            id="0.5-0.6-mem",
        ),
        pytest.param(
            "1/200, SamplesPerSec=88.31", (1, 200, None, None, 88.31, None, None), id="<=0.5"
        ),
        pytest.param(
            "epoch=0/micro_step=2/global_step=1, RunningAvgSamplesPerSec=-inf, "
            "CurrSamplesPerSec=1.2e-05, MemAllocated=0.0GB, MaxMemAllocated=12GB",
            (0, 2, 1, 1.2e-05, None, 0, 12 * GiB),
            id="-inf-and-scientific",
        ),
    ],
)
def test_throughput_line(message: str, row: tuple[object, ...]) -> None:
    res = parse([hdr("timer.py:260:stop") + message], start=5, file_id=2)
    assert res.throughput.schema == THROUGHPUT_SCHEMA
    assert res.throughput.rows() == [(2, 5, *row, TS, "logger")]
    assert (res.parsed, res.malformed) == (1, 0)


def test_throughput_line_without_header() -> None:
    res = parse(["1/200, SamplesPerSec=88.31"])
    assert res.throughput.rows() == [(0, 1, 1, 200, None, None, 88.31, None, None, None, "none")]


# --------------------------------------------------------------------------------------
# see_memory_usage (D6)

MEM_LABEL = hdr("utils.py:796:see_memory_usage") + "Stage 3 initialize beginning"
MEM_MA = (
    hdr("utils.py:797:see_memory_usage")
    + "MA 1.27 GB         Max_MA 1.84 GB         CA 3.41 GB         Max_CA 3 GB "
)
MEM_CPU = (
    hdr("utils.py:804:see_memory_usage") + "CPU Virtual Memory:  used = 112.38 GB, percent = 44.6%"
)
MEM_ROW = (
    round(1.27 * GiB),
    round(1.84 * GiB),
    round(3.41 * GiB),
    3 * GiB,
    round(112.38 * GiB),
    44.6,
)


def test_memory_three_lines_make_one_row() -> None:
    res = parse([MEM_LABEL, MEM_MA, MEM_CPU], start=20, file_id=1)
    assert res.memory.schema == MEMORY_SCHEMA
    assert res.memory.rows() == [(1, 21, "Stage 3 initialize beginning", *MEM_ROW, TS, "logger")]
    assert (res.parsed, res.malformed) == (3, 0)


def test_memory_lines_interleaved_with_other_processes() -> None:
    nccl = "node-1:56:56 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/IPC"
    res = parse([MEM_LABEL, nccl, MEM_MA, nccl, MEM_CPU])
    assert res.memory.select("line_no", "label", "cpu_percent").rows() == [
        (3, "Stage 3 initialize beginning", 44.6)
    ]


def test_memory_without_label_or_cpu_line() -> None:
    res = parse_deepspeed([(1, MEM_LABEL), (40, MEM_MA), (80, MEM_MA)], file_id=0)
    # The label is too far from the MA line to be its label; no CPU line followed.
    assert res.memory.select("line_no", "label", "cpu_used_bytes", "cpu_percent").rows() == [
        (40, None, None, None),
        (80, None, None, None),
    ]
    assert res.parsed == 2


def test_memory_ma_line_cut_is_malformed() -> None:
    res = parse_deepspeed(
        [(1, MEM_LABEL), (2, hdr("utils.py:797:see_memory_usage") + "MA 1.27 GB   Max_MA 1.8")],
        file_id=0,
    )
    assert res.memory.is_empty()
    assert (res.malformed, res.first_malformed) == (1, 2)


# --------------------------------------------------------------------------------------
# Comms logger (D5)


@pytest.mark.parametrize(
    ("size", "nbytes"),
    [
        ("0B", 0),
        ("512.0 B", 512),
        ("2.0 KB", 2048),
        ("4.0 MB", 4 * MiB),
        ("3.17 GB", round(3.17 * GiB)),
        ("1.5 TB", round(1.5 * 1024**4)),
    ],
)
def test_comm_call_sizes(size: str, nbytes: int) -> None:
    line = (
        rank0() + f"comm op: broadcast | time (ms): 1.00 | msg size: {size} | "
        "algbw (Gbps): 8.00 | busbw (Gbps): 8.00"
    )
    res = parse([line])
    assert res.comms.select("msg_size_bytes").item() == nbytes


def test_comm_call_lines_both_eras() -> None:
    res = parse(
        [
            rank0() + "comm op: all_gather_into_tensor | time (ms): 1.23 | msg size: 4.0 MB | "
            "algbw (Gbps): 54.17 | busbw (Gbps): 50.78",
            rank0() + "rank=0 | comm op: all_reduce | time (ms): 2.05 | msg size: 64.0 MB | "
            "algbw (Gbps): 523.78  | busbw (Gbps): 982.08 ",
            rank0() + "comm op: reduce_scatter_tensor | [Caller Func: reduce_ipg_grads] | "
            "time (ms): 0.50 | msg size: 2.0 KB | algbw (Gbps): 0.07 | busbw (Gbps): 0.06",
        ],
        file_id=9,
    )
    assert res.comms.schema == COMMS_SCHEMA
    assert res.comms.rows() == [
        (
            9,
            1,
            "call",
            "all_gather_into_tensor",
            4 * MiB,
            1,
            1.23 / 1000,
            1.23 / 1000,
            54.17e9 / 8,
            50.78e9 / 8,
            TS,
            "logger",
        ),
        (
            9,
            2,
            "call",
            "all_reduce",
            64 * MiB,
            1,
            2.05 / 1000,
            2.05 / 1000,
            523.78e9 / 8,
            982.08e9 / 8,
            TS,
            "logger",
        ),
        (
            9,
            3,
            "call",
            "reduce_scatter_tensor",
            2048,
            1,
            0.50 / 1000,
            0.50 / 1000,
            0.07e9 / 8,
            0.06e9 / 8,
            TS,
            "logger",
        ),
    ]


SUMMARY = [
    "Comm. Op            Message Size        Count               Total Latency(ms)   "
    "Avg Latency(ms)     tput_avg (Gbps)     busbw_avg (Gbps)    ",
    "all_gather_into_tensor",
    "                    4.0 MB              48                  5.62                "
    "0.11                301.47              282.63              ",
    "                    3.17 GB             2                   1500.00             "
    "750.00              36.31               34.04               ",
    "log_summary_barrier",
    "                    0B                  1                   0.05                "
    "0.05                0.00                0.00                ",
]
STRAGGLER = [
    "_______________________________",
    "Breakdown with straggler effect",
    "-------------------------------",
    "Comm. Op            Message Size        Count               Total comm lat(ms)  "
    "Total straggler(ms) Avg comm lat(ms)    Avg straggler(ms)   ",
    "all_gather_into_tensor",
    "                    4.0 MB              48                  4.10                "
    "1.52                0.08                0.03                ",
]


def test_comms_summary_and_straggler_tables() -> None:
    res = parse(SUMMARY + STRAGGLER, start=100, file_id=5)
    assert res.comms.rows() == [
        (5, 102, "summary", "all_gather_into_tensor", 4 * MiB, 48, secs(0.11), secs(5.62),
         301.47e9 / 8, 282.63e9 / 8, None, "none"),
        (5, 103, "summary", "all_gather_into_tensor", round(3.17 * GiB), 2, secs(750.00),
         secs(1500.00), 36.31e9 / 8, 34.04e9 / 8, None, "none"),
        (5, 105, "summary", "log_summary_barrier", 0, 1, secs(0.05), secs(0.05), 0.0, 0.0, None,
         "none"),
        # straggler table: latency_s/total_latency_s are the straggler (wait) times
        (5, 111, "straggler", "all_gather_into_tensor", 4 * MiB, 48, secs(0.03), secs(1.52),
         None, None, None, "none"),
    ]  # fmt: skip
    assert (res.parsed, res.malformed, res.seen) == (12, 0, True)


def test_comms_table_with_pdsh_prefix_and_other_hosts_interleaved() -> None:
    other = "gpu-node-08: " + rank0() + "time (ms) | fwd: 9.00"
    lines = ["gpu-node-07: " + x for x in SUMMARY]
    lines.insert(3, other)  # another node's output between two rows
    lines.insert(1, "gpu-node-08: all_reduce")  # another node's single word line
    res = parse(lines)
    assert res.comms.select("op", "msg_size_bytes", "count").rows() == [
        ("all_gather_into_tensor", 4 * MiB, 48),
        ("all_gather_into_tensor", round(3.17 * GiB), 2),
        ("log_summary_barrier", 0, 1),
    ]
    assert timer_rows(res) == [(5, 0, None, "fwd", "fwd", 9.00 / 1000)]


def test_comms_table_ends_at_a_gap() -> None:
    numbered = list(enumerate(SUMMARY[:3], 1))
    # A row-shaped line after lines that were not delivered is not part of the table.
    numbered.append((50, SUMMARY[3]))
    res = parse_deepspeed(numbered, file_id=0)
    assert res.comms.select("line_no").to_series().to_list() == [3]


def test_comms_row_without_op_line_is_malformed() -> None:
    res = parse([SUMMARY[0], SUMMARY[2]])
    assert res.comms.is_empty()
    assert (res.parsed, res.malformed, res.first_malformed) == (1, 1, 2)


# --------------------------------------------------------------------------------------
# Engine configuration dump (D7)


def cfg(key: str, value: str) -> str:
    """A dump line exactly as ``DeepSpeedConfig.print`` formats it."""
    return hdr("config.py:988:print") + "  {} {} {}".format(key, "." * (29 - len(key)), value)


ZERO3_REPR = (
    "stage=3 contiguous_gradients=True reduce_scatter=True reduce_bucket_size=500000000 "
    "use_multi_rank_bucket_allreduce=True allgather_partitions=True "
    "allgather_bucket_size=500,000,000 overlap_comm=True load_from_fp32_weights=True "
    "elastic_checkpoint=False offload_param=DeepSpeedZeroOffloadParamConfig(device='cpu', "
    "nvme_path=None, buffer_count=5, buffer_size=100,000,000, max_in_cpu=1,000,000,000, "
    "pin_memory=True) offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig(device='cpu', "
    "nvme_path=None, buffer_count=4, pin_memory=True, pipeline_read=False, "
    "pipeline_write=False, fast_init=False, ratio=1.0) sub_group_size=1,000,000,000 "
    "cpu_offload_param=None cpu_offload_use_pin_memory=None cpu_offload=None "
    "prefetch_bucket_size=50,000,000 param_persistence_threshold=100,000 "
    "model_persistence_threshold=sys.maxsize max_live_parameters=1,000,000,000 "
    "max_reuse_distance=1,000,000,000 gather_16bit_weights_on_model_save=False"
)

#: ZeRO-3 with CPU offload of both, as DeepSpeed >= 0.9 prints it
#: (``ScientificNotationEncoder``: ``"key": value, `` and numbers > 1e3 in %e).
ZERO3_DUMP = [
    hdr("config.py:984:print") + "DeepSpeedEngine configuration:",
    cfg("activation_checkpointing_config", "{"),
    '    "partition_activations": false, ',
    '    "contiguous_memory_optimization": false, ',
    '    "number_checkpoints": null',
    "}",
    cfg("aio_config", "{'block_size': 1048576, 'queue_depth': 8, 'thread_count': 1}"),
    cfg("gradient_accumulation_steps", "4"),
    cfg("steps_per_print", "10"),
    cfg("train_batch_size", "128"),
    cfg("train_micro_batch_size_per_gpu", "4"),
    cfg("wall_clock_breakdown", "True"),
    cfg("world_size", "8"),
    cfg("zero_allow_untested_optimizer", "False"),
    cfg("zero_config", ZERO3_REPR),
    cfg("zero_enabled", "True"),
    cfg("zero_optimization_stage", "3"),
    hdr("config.py:974:print_user_config") + "  json = {",
    '    "train_batch_size": 128, ',
    '    "train_micro_batch_size_per_gpu": 4, ',
    '    "wall_clock_breakdown": true, ',
    '    "zero_optimization": {',
    '        "stage": 3, ',
    '        "offload_optimizer": {',
    '            "device": "cpu", ',
    '            "pin_memory": true',
    "        }, ",
    '        "offload_param": {',
    '            "device": "cpu", ',
    '            "pin_memory": true',
    "        }, ",
    '        "overlap_comm": true, ',
    '        "reduce_bucket_size": 2.000000e+08, ',
    '        "stage3_prefetch_bucket_size": 1.509949e+07, ',
    '        "allgather_bucket_size": 5.000000e+08',
    "    }, ",
    '    "steps_per_print": inf',
    "}",
]

#: ZeRO-2 without offload, as older versions print the user JSON (plain json.dumps with
#: sort_keys and ``separators=(",", ":")``).
ZERO2_DUMP = [
    hdr("config.py:1059:print") + "DeepSpeedEngine configuration:",
    cfg("train_micro_batch_size_per_gpu", "16"),
    cfg("world_size", "1,024"),
    cfg(
        "zero_config",
        "stage=2 contiguous_gradients=True reduce_bucket_size=500,000,000 "
        "allgather_bucket_size=500,000,000 overlap_comm=False offload_param=None "
        "offload_optimizer=None",
    ),
    hdr("config.py:1062:print") + "  json = {",
    '    "fp16":{',
    '        "enabled":true',
    "    },",
    '    "train_batch_size":16384,',
    '    "zero_optimization":{',
    '        "allgather_bucket_size":200000000,',
    '        "overlap_comm":false,',
    '        "reduce_bucket_size":200000000,',
    '        "stage":2',
    "    }",
    "}",
]


def test_config_dump_zero3_cpu_offload_of_both() -> None:
    res = parse(ZERO3_DUMP)
    assert res.zero == ZeroConfig(
        stage=3,
        offload_optimizer="cpu",
        offload_param="cpu",
        overlap_comm=True,
        reduce_bucket_size=200_000_000,
        allgather_bucket_size=500_000_000,
        prefetch_bucket_size=15_099_490,
        source="json",
    )
    assert res.config == {
        "activation_checkpointing_config": "{\n"
        '    "partition_activations": false,\n'
        '    "contiguous_memory_optimization": false,\n'
        '    "number_checkpoints": null\n'
        "}",
        "aio_config": "{'block_size': 1048576, 'queue_depth': 8, 'thread_count': 1}",
        "gradient_accumulation_steps": "4",
        "steps_per_print": "10",
        "train_batch_size": "128",
        "train_micro_batch_size_per_gpu": "4",  # 30 characters: no dots, two spaces
        "wall_clock_breakdown": "True",
        "world_size": "8",
        "zero_allow_untested_optimizer": "False",
        "zero_config": ZERO3_REPR,
        "zero_enabled": "True",
        "zero_optimization_stage": "3",
    }
    assert res.world_size == 8
    assert (res.parsed, res.malformed, res.seen) == (len(ZERO3_DUMP), 0, True)


def test_config_dump_zero2_no_offload_old_json_and_comma_integers() -> None:
    res = parse(ZERO2_DUMP)
    assert res.zero == ZeroConfig(
        stage=2,
        offload_optimizer="none",
        offload_param="none",
        overlap_comm=False,
        reduce_bucket_size=200_000_000,
        allgather_bucket_size=200_000_000,
        prefetch_bucket_size=None,
        source="json",
    )
    assert res.world_size == 1024
    assert res.config["world_size"] == "1,024"  # as printed
    assert res.malformed == 0


def test_config_key_lines_with_long_and_short_keys() -> None:
    lines = [
        hdr("config.py:984:print") + "DeepSpeedEngine configuration:",
        hdr("config.py:988:print") + "  train_micro_batch_size_per_gpu  4",
        hdr("config.py:988:print") + "  zero_force_ds_cpu_optimizer .. True",
        hdr("config.py:988:print") + "  scheduler_name ............... None",
        hdr("config.py:988:print") + "  comms_config ................. "
        "<deepspeed.comm.config.DeepSpeedCommsConfig object at 0x7f2a1c3e5d50>",
    ]
    assert parse(lines).config == {
        "train_micro_batch_size_per_gpu": "4",
        "zero_force_ds_cpu_optimizer": "True",
        "scheduler_name": "None",
        "comms_config": "<deepspeed.comm.config.DeepSpeedCommsConfig object at 0x7f2a1c3e5d50>",
    }


def test_json_cut_by_a_gap_falls_back_to_zero_config() -> None:
    numbered = list(enumerate(ZERO3_DUMP[:25], 1))
    numbered += list(enumerate(ZERO3_DUMP[30:], 200))  # lines 26..199 were not delivered
    res = parse_deepspeed(numbered, file_id=0)
    assert res.zero == ZeroConfig(
        stage=3,
        offload_optimizer="cpu",
        offload_param="cpu",
        overlap_comm=True,
        reduce_bucket_size=500_000_000,
        allgather_bucket_size=500_000_000,
        prefetch_bucket_size=50_000_000,
        source="zero_config",
    )
    json_line = ZERO3_DUMP.index(hdr("config.py:974:print_user_config") + "  json = {") + 1
    assert (res.malformed, res.first_malformed) == (1, json_line)


def test_multi_line_value_cut_by_a_gap_keeps_what_was_printed() -> None:
    numbered = [(1, ZERO3_DUMP[0]), (2, ZERO3_DUMP[1]), (3, ZERO3_DUMP[2]), (9, ZERO3_DUMP[6])]
    res = parse_deepspeed(numbered, file_id=0)
    assert res.config == {
        "activation_checkpointing_config": '{\n    "partition_activations": false,',
        "aio_config": "{'block_size': 1048576, 'queue_depth': 8, 'thread_count': 1}",
    }


def test_zero_from_init_lines_only() -> None:
    res = parse(
        [
            rank0() + "Creating torch.float16 ZeRO stage 2 optimizer",
            hdr("stage_1_and_2.py:148:__init__") + "Reduce bucket size 500,000,000",
            hdr("stage_1_and_2.py:149:__init__") + "Allgather bucket size 200000000",
            hdr("stage_1_and_2.py:150:__init__") + "CPU Offload: False",
            hdr("stage_1_and_2.py:151:__init__") + "Round robin gradient partitioning: False",
        ]
    )
    assert res.zero == ZeroConfig(
        stage=2,
        offload_optimizer="none",
        offload_param=None,
        overlap_comm=None,
        reduce_bucket_size=500_000_000,
        allgather_bucket_size=200_000_000,
        prefetch_bucket_size=None,
        source="init_lines",
    )
    assert res.parsed == 4


def test_zero3_init_lines() -> None:
    res = parse(
        [
            rank0() + "Creating fp16 ZeRO stage 3 optimizer",
            hdr("stage3.py:130:__init__") + "Reduce bucket size 500000000",
            hdr("stage3.py:131:__init__") + "Prefetch bucket size 50000000",
        ]
    )
    assert res.zero is not None
    assert (res.zero.stage, res.zero.prefetch_bucket_size, res.zero.source) == (
        3,
        50_000_000,
        "init_lines",
    )


def test_model_size_from_zero_init_and_dtype_from_the_optimizer_line() -> None:
    res = parse(
        [
            hdr("partition_parameters.py:366:__exit__")
            + "finished initializing model - num_params = 695, num_elems = 7.95B",
            hdr("partition_parameters.py:366:__exit__")
            + "finished initializing model - num_params = 12, num_elems = 0.01B",
            rank0() + "Creating torch.bfloat16 ZeRO stage 3 optimizer",
        ],
        start=40,
    )
    # The first one counts (a second zero.Init, e.g. a reference model, comes later).
    assert (res.model_elems, res.model_elems_line) == (7_950_000_000, 40)
    assert res.train_dtype == "bfloat16"
    assert res.parsed == 3


def test_model_size_line_cut_is_malformed() -> None:
    res = parse(
        [
            hdr("partition_parameters.py:366:__exit__")
            + "finished initializing model - num_params = 695, num_el"
        ]
    )
    assert (res.model_elems, res.malformed) == (None, 1)


def test_zero_precedence_field_by_field() -> None:
    lines = [
        hdr("config.py:984:print") + "DeepSpeedEngine configuration:",
        cfg("zero_config", "stage=2 overlap_comm=True reduce_bucket_size=400,000,000"),
        hdr("config.py:974:print_user_config") + '  json = {"zero_optimization": {"stage": 1}}',
        hdr("stage_1_and_2.py:149:__init__") + "Allgather bucket size 300000000",
    ]
    res = parse(lines)
    # stage from the JSON beats the repr; fields the JSON lacks come from the next source
    assert res.zero == ZeroConfig(
        stage=1,
        offload_optimizer="none",
        offload_param="none",
        overlap_comm=True,
        reduce_bucket_size=400_000_000,
        allgather_bucket_size=300_000_000,
        prefetch_bucket_size=None,
        source="json",
    )


@pytest.mark.parametrize(
    ("repr_text", "optimizer", "param"),
    [
        ("stage=3 offload_param=None offload_optimizer=None", "none", "none"),
        (
            "stage=3 offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig(device='nvme', "
            "nvme_path=PosixPath('/local nvme'), buffer_count=4)",
            "nvme",
            None,
        ),
        (
            "stage=3 offload_param=DeepSpeedZeroOffloadParamConfig(device=<OffloadDeviceEnum.cpu: "
            "'cpu'>, pin_memory=True) offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig("
            "device='none')",
            "none",
            "cpu",
        ),
        ("stage=2 cpu_offload=True", "cpu", None),
    ],
)
def test_zero_config_repr_offload_devices(
    repr_text: str, optimizer: str | None, param: str | None
) -> None:
    res = parse(
        [
            hdr("config.py:984:print") + "DeepSpeedEngine configuration:",
            cfg("zero_config", repr_text),
        ]
    )
    assert res.zero is not None
    assert (res.zero.offload_optimizer, res.zero.offload_param, res.zero.source) == (
        optimizer,
        param,
        "zero_config",
    )


def test_zero_config_as_multi_line_json_of_old_versions() -> None:
    res = parse(
        [
            hdr("config.py:712:print") + "DeepSpeedEngine configuration:",
            cfg("zero_config", "{"),
            '    "stage": 2, ',
            '    "overlap_comm": true, ',
            '    "reduce_bucket_size": 5.000000e+08, ',
            '    "cpu_offload": true',
            "}",
            cfg("zero_enabled", "True"),
        ]
    )
    assert res.zero == ZeroConfig(
        stage=2,
        offload_optimizer="cpu",
        offload_param=None,
        overlap_comm=True,
        reduce_bucket_size=500_000_000,
        allgather_bucket_size=None,
        prefetch_bucket_size=None,
        source="zero_config",
    )


def test_user_json_without_zero_section_means_zero_off() -> None:
    res = parse(
        [
            hdr("config.py:984:print") + "DeepSpeedEngine configuration:",
            hdr("config.py:974:print_user_config") + "  json = {",
            '    "train_batch_size": 8',
            "}",
        ]
    )
    assert res.zero is not None
    assert (res.zero.stage, res.zero.offload_optimizer, res.zero.source) == (0, "none", "json")


def test_only_the_first_dump_is_kept() -> None:
    second = [
        hdr("config.py:984:print") + "DeepSpeedEngine configuration:",
        cfg("world_size", "2"),
        cfg("zero_optimization_stage", "0"),
        hdr("config.py:974:print_user_config") + '  json = {"train_batch_size": 2}',
    ]
    res = parse(ZERO3_DUMP + second)
    assert res.world_size == 8
    assert res.config["zero_optimization_stage"] == "3"
    assert res.zero is not None
    assert res.zero.stage == 3


def test_config_dump_over_pdsh_with_other_nodes_interleaved() -> None:
    lines = ["gpu-node-07: " + x for x in ZERO2_DUMP]
    lines.insert(6, "gpu-node-08: " + rank0() + "time (ms) | fwd: 9.00")
    lines.insert(3, "gpu-node-08: " + hdr("engine.py:100:_configure") + "Using DeepSpeed Optimizer")
    res = parse(lines)
    assert res.zero is not None
    assert (res.zero.stage, res.zero.source, res.world_size) == (2, "json", 1024)
    assert res.timers.height == 1
    assert res.malformed == 0


def test_config_dump_with_crlf_line_ends() -> None:
    res = parse([x + "\r\n" for x in ZERO2_DUMP])
    assert res.zero is not None
    assert (res.zero.stage, res.zero.source, res.world_size) == (2, "json", 1024)
    assert res.config["zero_config"].endswith("offload_optimizer=None")


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ('    "zero_optimization": {', 1),
        ("    }, ", -1),
        ('    "path": "/a{b[c", ', 0),
        ('    "quote": "say \\"{\\"", ', 0),  # escaped quotes inside the string
        ('    "backslash": "C:\\\\", "x": [', 1),  # the string ends after \\
        ('    "open": "never closed {[', 0),
    ],
)
def test_json_bracket_depth_ignores_strings(text: str, depth: int) -> None:
    assert ds._depth(text) == depth


def test_config_keys_after_a_gap_are_still_read() -> None:
    numbered = [
        (1, ZERO3_DUMP[0]),
        (2, cfg("train_batch_size", "128")),
        (9, cfg("world_size", "8")),
    ]
    res = parse_deepspeed(numbered, file_id=0)
    assert res.config == {"train_batch_size": "128", "world_size": "8"}
    assert res.world_size == 8


# --------------------------------------------------------------------------------------
# Version, world size, trace cache, year, counters


def test_version_world_size_and_trace_cache() -> None:
    res = parse(
        [
            hdr("launch.py:256:main") + "dist_world_size=16",
            rank0("engine.py:263:__init__")
            + "DeepSpeed info: version=0.14.0+ce78a632, git-hash=ce78a632, git-branch=master",
            "Invalidate trace cache @ step 5: expected module 12, but got module 14",
            hdr("stage3.py:1066:step")
            + "Invalidate trace cache @ step 0 and module 0: cache has only 0 modules",
        ]
    )
    assert (res.version, res.world_size, res.trace_cache_warnings) == ("0.14.0+ce78a632", 16, 2)


def test_world_size_from_the_dump_beats_the_launcher() -> None:
    res = parse([hdr("launch.py:256:main") + "dist_world_size=16", *ZERO3_DUMP])
    assert res.world_size == 8


def test_year_seen_and_counts() -> None:
    res = parse(
        [
            "epoch 3 loss 2.31",
            hdr(at="2023-12-31 23:59:59,999") + "Some message we do not read",
            hdr(at="2024-01-01 00:00:00,001") + "Another",
        ]
    )
    assert (res.year, res.seen, res.parsed, res.malformed) == (2023, True, 0, 0)
    nothing = parse(["epoch 3 loss 2.31", "node-1:55:55 [0] NCCL INFO Using network IB"])
    assert (nothing.year, nothing.seen, nothing.parsed, nothing.zero) == (None, False, 0, None)


def test_empty_input() -> None:
    res = parse_deepspeed([], file_id=0)
    assert res.timers.schema == TIMERS_SCHEMA
    assert res.throughput.schema == THROUGHPUT_SCHEMA
    assert res.memory.schema == MEMORY_SCHEMA
    assert res.comms.schema == COMMS_SCHEMA
    assert res.timers.is_empty()
    assert (res.zero, res.config, res.version, res.world_size) == (None, {}, None, None)
    assert (res.seen, res.parsed, res.malformed, res.first_malformed) == (False, 0, 0, None)


# --------------------------------------------------------------------------------------
# Prefixes and damage

TIMER = rank0() + "time (ms) | fwd_microstep: 287.41 | bwd_microstep: 612.86"
TIMER_EXPECTED = [
    (1, 0, None, "fwd_microstep", "fwd_microstep", 0.28741),
    (1, 0, None, "bwd_microstep", "bwd_microstep", 0.61286),
]


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("gpu-node-07: " + TIMER, id="pdsh"),
        pytest.param("10.20.30.41: " + TIMER, id="pdsh-ip"),
        pytest.param("[default0]:" + TIMER, id="torchrun"),
        pytest.param("3: " + TIMER, id="srun"),
        pytest.param("  7%|███ | 41/596 [01:13<15:34,  1.62s/it]" + TIMER, id="tqdm-glued"),
        pytest.param(" 7%|█ | 41/596\r 8%|█ | 42/596\r" + TIMER, id="tqdm-cr"),
        pytest.param(
            "gpu-node-07: \x1b[32m  7%|███ | 41/596 [01:13<15:34,  1.62s/it]\x1b[0m" + TIMER,
            id="pdsh-ansi-tqdm",
        ),
        pytest.param("gpu-node-07: [default0]:" + TIMER + "\r\n", id="pdsh-torchrun-crlf"),
        pytest.param("node-2: [2024-02-19 10:11:12,1" + TIMER, id="spliced-write-before"),
        pytest.param("\x00\ufffd" + TIMER, id="nul-and-replacement-char"),
    ],
)
def test_prefixes_in_combination(line: str) -> None:
    res = parse([line])
    assert timer_rows(res) == TIMER_EXPECTED
    assert res.timers.select("ts").item(0, 0) == TS


def test_pdsh_prefixed_v03_timer_without_header() -> None:
    res = parse(["gpu-node-07: rank=2 time (ms) | forward: 120.31"])
    assert timer_rows(res) == [(1, 2, None, "fwd", "forward", 0.12031)]


def test_hard_wrap_inside_a_value_is_joined() -> None:
    res = parse([TIMER[:-3], TIMER[-3:], "epoch 3 loss 2.31"])
    assert timer_rows(res) == TIMER_EXPECTED
    assert (res.parsed, res.malformed) == (2, 0)


def test_hard_wrap_right_after_a_value_is_joined() -> None:
    cut = TIMER.index(" | bwd_microstep")
    res = parse([TIMER[:cut], TIMER[cut:]])
    assert timer_rows(res) == TIMER_EXPECTED
    assert (res.parsed, res.malformed) == (2, 0)


def test_hard_wrapped_throughput_and_comm_lines() -> None:
    tput = (
        hdr("timer.py:260:stop") + "epoch=0/micro_step=40/global_step=10, "
        "RunningAvgSamplesPerSec=21.87, CurrSamplesPerSec=22.41, MemAllocated=3.47GB, "
        "MaxMemAllocated=9.12GB"
    )
    comm = (
        rank0() + "comm op: all_reduce | time (ms): 2.05 | msg size: 64.0 MB | "
        "algbw (Gbps): 523.78 | busbw (Gbps): 982.08"
    )
    res = parse([tput[:120], tput[120:], comm[:100], comm[100:]])
    assert res.throughput.select("global_step", "max_mem_allocated_bytes").rows() == [
        (10, round(9.12 * GiB))
    ]
    assert res.comms.select("line_no", "busbw_bytes_per_s").rows() == [(3, 982.08e9 / 8)]
    assert (res.parsed, res.malformed) == (4, 0)


def test_old_throughput_cut_inside_mem_allocated_is_joined() -> None:
    line = (
        hdr("timer.py:198:stop") + "0/40, RunningAvgSamplesPerSec=21.87, "
        "CurrSamplesPerSec=22.41, MemAllocated=3.47GB, MaxMemAllocated=9.12GB"
    )
    cut = line.index("MemAllocated=3.4") + len("MemAllocated=3.4")
    res = parse([line[:cut], line[cut:]])
    assert res.throughput.select("micro_step", "mem_allocated_bytes").rows() == [
        (40, round(3.47 * GiB))
    ]
    assert (res.parsed, res.malformed) == (2, 0)


def test_cut_timer_without_its_continuation_is_malformed() -> None:
    res = parse_deepspeed([(5, TIMER[:-3]), (9, TIMER[-3:])], file_id=0)
    assert res.timers.is_empty()
    assert (res.malformed, res.first_malformed, res.seen) == (1, 5, True)


def test_spliced_lines_read_the_last_record() -> None:
    other = hdr() + "[Rank 1] some message cut sho"
    res = parse([other + TIMER])
    assert timer_rows(res) == TIMER_EXPECTED


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("x" * 1_000_000 + TIMER, id="junk-then-timer"),
        pytest.param(TIMER + " | a: 1.00" * 100_000, id="many-pairs"),
        pytest.param("time (ms) | " + "a" * 1_000_000, id="endless-name"),
        pytest.param("[" * 1_000_000, id="brackets"),
        pytest.param("] [INFO] [" * 100_000, id="header-pieces"),
        pytest.param(hdr() * 30_000, id="many-headers"),
        pytest.param("comm op: " + "x" * 1_000_000 + " | time (ms): 1.00", id="comm-op"),
        pytest.param("0/1, " * 200_000 + "SamplesPerSec=1", id="throughput-prefixes"),
        pytest.param("\r" * 1_000_000, id="carriage-returns"),
        pytest.param("\x1b[" * 500_000, id="ansi-pieces"),
    ],
)
def test_megabyte_lines_do_not_hang(line: str) -> None:
    began = time.perf_counter()
    res = parse([line, line])
    assert time.perf_counter() - began < 5
    if line.endswith(TIMER):
        assert timer_rows(res) == TIMER_EXPECTED + [(2, *row[1:]) for row in TIMER_EXPECTED]


def test_megabyte_lines_inside_blocks() -> None:
    lines = [
        hdr("config.py:984:print") + "DeepSpeedEngine configuration:",
        cfg("activation_checkpointing_config", "{"),
        " " + "{" * 1_000_000,
        hdr("config.py:974:print_user_config") + "  json = {",
        " " + "[" * 1_000_000,
        "}",
        SUMMARY[0],
        "all_reduce",
        " " * 1_000_000 + "4.0 MB 1 1.00 1.00 1.00 1.00",
        hdr("config.py:974:print_user_config") + "  json = {",
        '    "a": "' + '\\"' * 30_000,  # an unclosed string of escaped quotes
        "    " + '"' * 60_000,
        "}",
    ]
    began = time.perf_counter()
    res = parse(lines)
    assert time.perf_counter() - began < 5
    # Only the last 64 KiB of a line are read: the "{" run is kept in the cut value, the
    # "[" run (now without its indent) is not JSON of the dump; "}" closes the object.
    assert res.config["activation_checkpointing_config"].startswith("{\n{{{")
    assert res.zero is not None
    assert (res.zero.stage, res.zero.source) == (0, "json")
    assert res.comms.is_empty()
    assert res.malformed == 1  # the second JSON object: a string never closed


# --------------------------------------------------------------------------------------
# Properties

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: Pieces of real DeepSpeed lines, so generated junk reaches the family parsers.
PIECES = (
    hdr(),
    hdr("config.py:988:print"),
    hdr("utils.py:797:see_memory_usage"),
    "[Rank 0] ",
    "rank=0 ",
    "time (ms) | ",
    "fwd: 1.00",
    " | ",
    "(fwd_moe: 1.00, ",
    "SamplesPerSec=",
    "epoch=0/micro_step=1/global_step=1, ",
    "MemAllocated=1.0GB",
    "comm op: ",
    "msg size: 4.0 MB",
    "MA 1.0 GB ",
    "CPU Virtual Memory:",
    "step=1, skipped=0, lr=",
    "DeepSpeedEngine configuration:",
    "  json = {",
    "  zero_config .... ",
    "stage=3 offload_param=None",
    "{",
    "}",
    '    "stage": 3, ',
    "Comm. Op            Message Size        Count               Total Latency(ms)   ",
    "                    4.0 MB              48                  5.62  0.11  1.00  1.00",
    "all_reduce",
    "Invalidate trace cache @ step",
    "gpu-node-07: ",
    "\r",
    "\x1b[0m",
    "\x00",
    "\ufffd",
)

JUNK_TEXT = st.one_of(
    st.text(max_size=3000),
    st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=20)), max_size=12).map("".join),
)


@st.composite
def numbered(draw: st.DrawFn, texts: st.SearchStrategy[str]) -> list[tuple[int, str]]:
    """Lines with increasing numbers and random gaps."""
    out: list[tuple[int, str]] = []
    line_no = draw(st.integers(1, 50))
    for text in draw(st.lists(texts, max_size=25)):
        out.append((line_no, text))
        line_no += draw(st.sampled_from((1, 1, 1, 2, 7, 400)))
    return out


@PROPS
@given(numbered(JUNK_TEXT), st.integers(0, 2**32 - 1))
def test_never_raises(lines: list[tuple[int, str]], file_id: int) -> None:
    res = parse_deepspeed(lines, file_id=file_id)
    assert res.timers.schema == TIMERS_SCHEMA
    assert res.comms.schema == COMMS_SCHEMA
    assert res.malformed >= 0
    assert res.parsed <= len(lines) + 1


TIMER_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,30}", fullmatch=True)
TIMER_VALUES = st.integers(-100, 10**9)  # hundredths of a millisecond


@PROPS
@given(
    numbered(JUNK_TEXT),
    st.integers(0, 30),
    st.lists(st.tuples(TIMER_NAMES, TIMER_VALUES), min_size=1, max_size=8),
    st.sampled_from(("", "gpu-node-07: ", "  7%|█ | 41/596 [01:13<15:34,  1.62s/it]")),
)
def test_timer_line_found_among_junk(
    junk: list[tuple[int, str]],
    where: int,
    pairs: list[tuple[str, int]],
    prefix: str,
) -> None:
    body = "".join(f" | {name}: {value / 100:.2f}" for name, value in pairs)
    line = prefix + hdr() + "[Rank 2] time (ms)" + body
    cut = min(where, len(junk))
    line_no = (junk[cut - 1][0] if cut else 0) + 1
    after = [(n + 1, t) for n, t in junk[cut:]]  # make room: numbers stay increasing
    lines = [*junk[:cut], (line_no, line), *after]
    res = parse_deepspeed(lines, file_id=0)
    got = res.timers.filter(pl.col("line_no") == line_no)
    assert got.select("rank", "name_printed", "duration_s").rows() == [
        (2, name, float(f"{value / 100:.2f}") / 1000) for name, value in pairs
    ]
    assert got.select("name").to_series().to_list() == [
        ds.normalise_timer_name(name) for name, _ in pairs
    ]
