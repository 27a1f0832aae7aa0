"""Config doctor: what these logs cannot answer and the settings that would, and hazards
the logs show in the job's own configuration.

Metric: one row per observation (``gap`` or ``hazard``).  Policy: gaps are ``info``;
hazards are ``warning``.  Hazards read here:

* a collective timeout shorter than what the job already spends in one collective or one
  step (the watchdog will fire on a slow step, not only on a hang);
* ZeRO-3 across nodes over TCP sockets only (every layer's all-gather over Ethernet);
* ZeRO offload without pinned host memory (``pin_memory=False``: each copy to the CPU
  is staged through a bounce buffer), as the engine's ``zero_config`` dump prints it::

      zero_config .... offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig(device='cpu',
      nvme_path=None, buffer_count=4, pin_memory=False, ...)

* NCCL 2.26.2 with sub-second timestamps: its sub-second digits are wrong (``src/debug.cc``
  divided ``tv_nsec`` by ``1000000 / 10^N``; fixed in 2.26.3), so lateness between ranks
  cannot be measured from them.  2.26.3-2.26.6 and later print them right.

Gaps beyond ``Analysis.gaps``: a PyTorch timeout without the flight recorder's dump, a
DeepSpeed engine whose configuration dump says ``wall_clock_breakdown ... False``, and
telemetry from a host that matches no host of the logs (``ncclscope.hosts``: compared as
NCCL prints names, cut at the first dot), whose samples no finding can use.
"""

from __future__ import annotations

import re

import polars as pl

from ncclscope.detect.base import Finding, register
from ncclscope.detect.context import Context
from ncclscope.hosts import unmatched_hosts
from ncclscope.schema import CONFIG_SCHEMA

__all__ = ["BAD_SUBSECOND_VERSIONS", "ConfigDetector", "subsecond_digits_unreliable"]


#: NCCL releases whose timestamps carry wrong sub-second digits: only 2.26.2 divided
#: ``tv_nsec`` by ``1000000 / 10^N`` (``src/debug.cc``; 2.26.3 divides ``1000000000``).
#: 2.26.0 and 2.26.1 were never released (2.26.2 is the first 2.26 tag).
BAD_SUBSECOND_VERSIONS = frozenset({"2.26.2"})


def subsecond_digits_unreliable(versions: list[str]) -> bool:
    """Whether one of these NCCL versions printed wrong sub-second digits (2.26.2 only).

    A version string may carry a suffix (``2.26.2+cuda12.8``): the release is what
    precedes it.

    >>> subsecond_digits_unreliable(["2.26.2"]), subsecond_digits_unreliable(["2.26.5"])
    (True, False)
    >>> subsecond_digits_unreliable(["2.27.3", "2.26.2+cuda12.8"])
    True
    """
    return any(re.split(r"[^0-9.]", v, maxsplit=1)[0] in BAD_SUBSECOND_VERSIONS for v in versions)


@register
class ConfigDetector:
    """Missing signals (``info``) and configuration hazards (``warning``)."""

    name = "config"

    def metric(self, ctx: Context) -> pl.DataFrame:
        a = ctx.analysis
        rows: list[dict[str, object]] = [
            {"kind": "gap", "what": g.what, "settings": list(g.settings), "detail": None}
            for g in a.gaps
        ]
        rows += self._hazards(ctx)
        return pl.DataFrame(rows, schema=CONFIG_SCHEMA)

    def _hazards(self, ctx: Context) -> list[dict[str, object]]:
        a = ctx.analysis
        fw = a.frameworks
        out: list[dict[str, object]] = []
        timeout_s, source = fw.timeout
        if timeout_s is not None:
            spread = ctx.instances.select(
                (pl.col("ts_max") - pl.col("ts_min")).dt.total_microseconds().max()
            ).item()
            longest_wait = spread / 1e6 if spread is not None else 0.0
            step = fw.timers.filter(pl.col("name").is_in(["step", "fwd", "bwd"]))[
                "duration_s"
            ].max()
            longest_step = float(step) if isinstance(step, float) else 0.0
            worst = max(longest_wait, longest_step)
            if worst > timeout_s / 2:
                out.append(
                    {
                        "kind": "hazard",
                        "what": (
                            f"the collective timeout ({timeout_s:.0f} s, {source}) is less "
                            f"than twice the longest wait or step seen ({worst:.0f} s): a slow "
                            "step, not only a hang, will trip the watchdog"
                        ),
                        "settings": [
                            "torch.distributed.init_process_group(timeout=...)",
                            "deepspeed.init_distributed(timeout=...)",
                        ],
                        "detail": None,
                    }
                )
        zero = fw.zero
        multi_node = len(a.hosts) > 1
        if zero is not None and zero.stage == 3 and multi_node:
            nets = {t for t in a.transports if t.startswith("NET/")}
            if nets == {"NET/Socket"}:
                out.append(
                    {
                        "kind": "hazard",
                        "what": (
                            "ZeRO-3 across nodes over TCP sockets only: every layer's "
                            "all-gather crosses Ethernet"
                        ),
                        "settings": ["NCCL_IB_HCA / NCCL_NET=IB (or the cluster's OFI plugin)"],
                        "detail": None,
                    }
                )
        out.extend(
            {
                "kind": "hazard",
                "what": (
                    f"{o.what} to {o.device} without pinned host memory: every "
                    "copy goes through a pageable bounce buffer"
                ),
                "settings": [f'"{o.what}": {{"pin_memory": true}}'],
                "detail": o.text,
            }
            for o in fw.offloads
            if o.device in ("cpu", "nvme") and not o.pin_memory
        )
        if len(fw.timeouts):
            out.append(
                {
                    "kind": "gap",
                    "what": (
                        "PyTorch timed out, but the logs do not say what each rank was "
                        "doing then: its flight recorder would dump every rank's last "
                        "collectives on the timeout"
                    ),
                    "settings": [
                        "TORCH_NCCL_TRACE_BUFFER_SIZE=2000",
                        "TORCH_NCCL_DUMP_ON_TIMEOUT=1",
                        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/path/to/shared/nccl_trace_rank_",
                    ],
                    "detail": None,
                }
            )
        if fw.ds_config.get("wall_clock_breakdown") == "False" and fw.timers.is_empty():
            out.append(
                {
                    "kind": "gap",
                    "what": (
                        "DeepSpeed ran without its wall-clock timers: rank 0's forward, "
                        "backward and step times (and the wait for a slow rank inside them) "
                        "are not in the logs"
                    ),
                    "settings": ['"wall_clock_breakdown": true (DeepSpeed config)'],
                    "detail": None,
                }
            )
        out.extend(
            {
                "kind": "gap",
                "what": (
                    f"telemetry from host {t} matches no host in the logs (hosts: "
                    f"{', '.join(a.hosts[:8])}{', ...' if len(a.hosts) > 8 else ''}): its "
                    "samples are left out of every finding"
                ),
                "settings": [
                    "analyze --telemetry with the folders of the agents that ran beside "
                    "this job's ranks"
                ],
                "detail": t,
            }
            for t in unmatched_hosts(a.telemetry["host"].unique().to_list(), a.hosts)
        )
        if a.timestamps != "none" and subsecond_digits_unreliable(a.nccl_versions):
            out.append(
                {
                    "kind": "gap",
                    "what": (
                        "NCCL 2.26.2 prints wrong sub-second digits in its timestamps (fixed "
                        "in 2.26.3): lateness between ranks cannot be measured from them"
                    ),
                    "settings": ["NCCL >= 2.26.3"],
                    "detail": None,
                }
            )
        return out

    def policy(self, metric: pl.DataFrame, ctx: Context) -> list[Finding]:
        del ctx
        return [
            Finding(
                kind="config",
                severity="info" if r["kind"] == "gap" else "warning",
                message=r["what"],
                evidence={"settings": list(r["settings"]), "detail": r["detail"]},
            )
            for r in metric.iter_rows(named=True)
        ]
