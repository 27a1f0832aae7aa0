"""The TELEMETRY section of the text report: one line per GPU, none empty."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl

from ncclscope.agent.telemetry import summary_lines
from ncclscope.schema import TELEMETRY_SCHEMA

T0 = datetime(2025, 3, 14, 9, 0, tzinfo=UTC)


def _frame() -> pl.DataFrame:
    gpu = "0,GPU-aa,00000000:18:00.0"
    rows = [
        (T0, "vm", "ncclscope_gpu_memory_used_bytes", gpu, 40 * 2.0**30),
        (T0, "vm", "ncclscope_gpu_memory_total_bytes", gpu, 80 * 2.0**30),
        (T0, "vm", "ncclscope_gpu_pcie_tx_bytes_per_second", gpu, 8e9),
        (T0, "vm", "ncclscope_gpu_pcie_link_max_bytes_per_second", gpu, 32e9),
        # series with more labels than the GPU's own: they used to make empty rows
        (T0, "vm", "ncclscope_gpu_info", gpu + ",NVIDIA H100", 1.0),
        (T0, "vm", "ncclscope_gpu_process_memory_used_bytes", gpu + ",4242", 2.0**30),
        (T0, "vm", "ncclscope_gpu_xid_errors_total", gpu + ",79", 1.0),
        # a GPU with nothing the summary shows: no line at all
        (T0, "vm", "ncclscope_gpu_info", "1,GPU-bb,00000000:2A:00.0,NVIDIA H100", 1.0),
        (T0, "vm", "ncclscope_host_memory_available_bytes", "", 100 * 2.0**30),
    ]
    return pl.DataFrame(rows, schema=TELEMETRY_SCHEMA, orient="row")


def test_one_line_per_gpu_and_no_empty_gpu_lines() -> None:
    lines = summary_lines(_frame())
    gpu_lines = [line for line in lines if " gpu " in line]
    assert gpu_lines == [
        "  vm gpu 0: memory peak 40.0 of 80.0 GiB PCIe peak 8.0 GB/s (25% of the link)"
    ]
    assert "  vm: host memory available at least 100.0 GiB" in lines


def test_no_gpu_series_no_gpu_lines() -> None:
    frame = _frame().filter(pl.col("metric") == "ncclscope_host_memory_available_bytes")
    lines = summary_lines(frame)
    assert not [line for line in lines if " gpu " in line]
