"""``truth.json``: what the generator wrote, recorded as it wrote it (never parsed back)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ncclscope.synth.options import _TRUTH_FORMAT_VERSION, Json


@dataclass(frozen=True)
class FileRecord:
    """One written log file: path relative to the output directory, '\\n' count, bytes."""

    path: str
    lines: int
    bytes: int


@dataclass(frozen=True)
class RankRecord:
    """Identity of one rank, as injected."""

    rank: int
    host: str
    host_index: int
    local_rank: int
    pid: int
    tid: int
    proxy_tid: int
    cuda_dev: int
    nvml_dev: int
    bus_id: str
    file: str
    launcher_prefix: str


@dataclass(frozen=True)
class CommRecord:
    """One communicator.

    ``comm_id`` is the ``commId`` hex printed in Init lines (``None`` for eras without it);
    ``comm_ptrs`` maps str(rank) to the per-process ``comm %p``; ``calls`` counts COLL lines;
    ``instances`` counts distinct sequence numbers entered by at least one rank;
    ``init_func`` is the API name printed before ``comm`` in Init lines (None: not printed);
    ``last_seq`` maps str(rank) to the last sequence it logged (``None``: none);
    ``opcount_printed`` is ``"seq"`` (opCount = sequence, hex) or ``"zero"`` (NCCL 2.27
    prints 0 on single-node communicators).
    """

    name: str
    comm_id: str | None
    nranks: int
    ranks: list[int]
    n_nodes: int
    n_channels: int
    init_func: str | None
    comm_ptrs: dict[str, str]
    calls: int
    instances: int
    last_seq: dict[str, int | None]
    opcount_printed: str


@dataclass(frozen=True)
class FaultOutcome:
    """What an injected fault did. ``effective`` = it changed the output."""

    kind: str
    fault: dict[str, Json]
    effective: bool
    details: dict[str, Json]


@dataclass(frozen=True)
class BenignWarnRecord:
    """One injected benign WARN.

    ``path`` is the file it went to (relative to the output directory) and ``line_no`` the
    1-based number of the WARN line itself in that file (the empty line NCCL writes before
    it is ``line_no - 1``). ``tid`` is the IB async thread that printed it.
    """

    rank: int
    host: str
    pid: int
    tid: int
    path: str
    line_no: int
    warn_src: str
    message: str


@dataclass(frozen=True)
class Truth:
    """Ground truth of a synthetic job (written to ``truth.json``)."""

    spec: dict[str, Json]
    nccl_version: str
    files: list[FileRecord]
    ranks: list[RankRecord]
    communicators: list[CommRecord]
    coll_calls: int
    coll_instances: int
    calls_by_op: dict[str, int]
    world_instances: int
    steps_completed: int
    end_reason: str
    non_nccl_lines: int
    first_ts: str
    last_ts: str
    faults: list[FaultOutcome]
    format_version: int = _TRUTH_FORMAT_VERSION
    benign_warns: list[BenignWarnRecord] = field(default_factory=list)
    # What the framework wrote (see ``_Framework.truth``); None (and absent from the
    # JSON) without a framework.
    framework: dict[str, Json] | None = None
    # Each host's clock offset: {host_index, host, offset_s}, offset_s = printed - true
    # time. None (absent from the JSON) without clock offsets, unless truth_format is 2.
    clock_offsets: list[dict[str, Json]] | None = None
    # One-off delays (not faults): {kind: "delay", rank, host, pid, instance, step, op,
    # count, delay_s}, by instance. None (absent) without jitter_events, unless
    # truth_format is 2.
    noise: list[dict[str, Json]] | None = None
    # The telemetry written beside the logs (``telemetry.TelemetryTruth``): its
    # folder, hosts, GPUs, the injected contention and memory growth. None (absent)
    # without ``telemetry``.
    telemetry: dict[str, Json] | None = None

    def to_dict(self) -> dict[str, Json]:
        """Plain JSON-compatible dict; optional parts that are None are left out."""
        out: dict[str, Json] = asdict(self)
        for key in ("framework", "clock_offsets", "noise", "telemetry"):
            if out[key] is None:
                del out[key]
        return out

    def to_json(self, *, indent: int | None = 1) -> str:
        """Serialise to a JSON string (stable key order, so output is deterministic)."""
        return json.dumps(self.to_dict(), indent=indent)
