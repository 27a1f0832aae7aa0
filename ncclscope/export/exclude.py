"""Which nodes to drain: ``analyze --exclude-list FORMAT``.

A node is listed only on evidence of a fault *on that node*: a dead or frozen rank the
others waited for, a slow node or straggler, an IB/network error that started the
failure there, a GPU XID or uncorrectable ECC error, a PCIe link trained below its
capacity.  A node that only waited (the ranks behind a hang, the peer that saw the
first error's consequence) never is: findings blame in ``Finding.hosts`` and keep the
waiters in their evidence, and a rule below reads only the blamed.  What turns a
finding into a reason is :data:`RULES` (one entry per finding kind, with a severity
floor); kinds that never blame a node are in :data:`NOT_A_NODE_FAULT`, with why, and
every kind must be in one or the other.  Telemetry facts that no detector reads are
:data:`TELEMETRY_CHECKS`.

Sample, a job where ``node-1``'s ranks were late at every collective::

    >>> v = ExcludeVerdict([NodeVerdict("node-1", ["slow_node"], ["host node-1 is slow"])],
    ...                    keep=["node-0", "node-2"])
    >>> FORMATS["slurm"](v)
    'node-1\\n'
    >>> print(FORMATS["kubectl"](v), end="")
    # node-1: slow_node
    kubectl taint nodes node-1 ncclscope.io/fault=slow_node:NoSchedule --overwrite
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import polars as pl

from ncclscope.diagnose import Diagnosis
from ncclscope.findings import (
    HANG_CLASSES,
    KINDS,
    Finding,
    HangClass,
    Kind,
    Severity,
    severity_at_least,
)
from ncclscope.hosts import with_log_hosts
from ncclscope.units import APPLICATION_XIDS, XID_NAMES

__all__ = [
    "FORMATS",
    "NOT_A_NODE_FAULT",
    "REASONS",
    "RULES",
    "TAINT_KEY",
    "TELEMETRY_CHECKS",
    "ExcludeVerdict",
    "NodeVerdict",
    "Rule",
    "exclude_verdict",
    "host_verdicts",
    "hostlist",
    "taint_value",
]

#: The reasons a node is listed, in the order a node's reasons are written.
REASONS = (
    "dead_process",
    "frozen",
    "network_error",
    "gpu_error",
    "gpu_xid",
    "gpu_ecc",
    "pcie_link_degraded",
    "slow_node",
    "straggler",
)

#: The taint ``--exclude-list kubectl`` sets (its value: the node's reasons).
TAINT_KEY = "ncclscope.io/fault"


@dataclass(frozen=True)
class NodeVerdict:
    """A node to drain: ``NodeVerdict("node-1", ["slow_node"], ["host node-1 (ranks 4-7)
    is slow: ..."])``.  ``reasons`` are :data:`REASONS` codes; ``findings`` the messages
    of the findings (or the telemetry facts) that gave them."""

    host: str
    reasons: list[str]
    findings: list[str]


@dataclass(frozen=True)
class ExcludeVerdict:
    """The nodes to drain (``exclude``, in host order) and every other host the job had
    (``keep``)."""

    exclude: list[NodeVerdict]
    keep: list[str] = field(default_factory=list)

    def to_json_dict(self) -> dict[str, object]:
        """``{"exclude": [{"host", "reasons", "findings"}], "keep": [...]}``."""
        return {
            "exclude": [
                {"host": n.host, "reasons": n.reasons, "findings": n.findings} for n in self.exclude
            ],
            "keep": self.keep,
        }


# --- findings -> reasons


@dataclass(frozen=True)
class Rule:
    """How a finding of one kind blames its hosts: ``reason`` gives the :data:`REASONS`
    code (None: this finding says nothing about a node) from the finding and the job's
    other findings, for findings at ``floor`` or worse."""

    floor: Severity
    reason: Callable[[Finding, Sequence[Finding]], str | None]


def _straggler(f: Finding, _job: Sequence[Finding]) -> str | None:
    # A host's ranks late *together* is the node (its CPUs, its power, its cooling);
    # one late rank is still its node's GPU or its share of the node: listed as a
    # straggler.  A constant shift that the logs cannot tell from a clock offset
    # (cause "clock", "ambiguous", "slow_unattributed") names no rank and no node.
    if f.evidence.get("cause", "slow") != "slow" or not f.ranks:
        return None
    return "slow_node" if f.evidence.get("unit") == "host" else "straggler"


#: A hang's class -> reason (None: not the node's).  A rank that died first is its
#: node's until shown otherwise (the OOM killer, a SIGBUS from a full /dev/shm, a GPU
#: fault are all the node's).  A rank that never joined while every other rank ran the
#: same code (``missing_rank``, or stopped after an NCCL error) is listed as frozen,
#: although the logs alone cannot tell a rank stuck in Python from one stuck in the
#: driver: draining a sound node costs one node until it is checked, keeping a frozen
#: one hangs the next run at the same place, and the reason says "frozen", not
#: "broken", so whoever reads it checks.  Where an evidence folder told the process's
#: own state, it decides: stopped or in uninterruptible sleep (``frozen_node``) is the
#: node; a main thread outside any collective (the data loader, a checkpoint, a lock:
#: ``stuck_outside_nccl``) or in another collective than every other rank's
#: (``stuck_in_nccl``) is the program, on any node, as a mismatch is.
_HANG_REASONS: dict[HangClass, str | None] = {
    "dead_process": "dead_process",
    "missing_rank": "frozen",
    "nccl_error": "frozen",
    "frozen_node": "frozen",
    "stuck_outside_nccl": None,
    "stuck_in_nccl": None,
    "mismatch": None,
    "unknown": None,
}
if set(_HANG_REASONS) != set(HANG_CLASSES):  # a new hang class must be decided
    _msg = f"hang classes without a decision: {sorted(set(HANG_CLASSES) - set(_HANG_REASONS))}"
    raise ImportError(_msg)


def _hang(f: Finding, _job: Sequence[Finding]) -> str | None:
    return _HANG_REASONS[f.hang_class or "unknown"] if f.ranks or f.hosts else None


def _timeout(f: Finding, _job: Sequence[Finding]) -> str | None:
    # The watchdog's finding names the hang detector's culprit; its basis says how.
    basis = f.evidence.get("culprit_basis")
    if basis in ("mismatch", "withheld") or not (f.ranks or f.hosts):
        return None
    return "dead_process" if basis == "died_first" else "frozen"


def _timeout_imminent(f: Finding, _job: Sequence[Finding]) -> str | None:
    # Blames only once the job's lines show it stopped (``countdown``): the same
    # culprit as the hang it becomes.
    return "frozen" if f.ranks or f.hosts else None


#: NCCL error kinds (``parsers.nccl.errors.ERROR_KINDS``) that are the host's network:
#: its HCA, cable or switch port failed a work request.  ``remote_exit`` blames the
#: peer that left, ``socket``/``bootstrap`` a peer that was not listening or a setting,
#: ``system``/``internal`` a setting or NCCL itself: not the reporting node.
_NETWORK_ERRORS = frozenset({"ib_completion", "net_completion"})
#: CUDA errors that are the GPU's hardware rather than the program's (an illegal
#: address, an invalid argument are the program's).
_GPU_HARDWARE = re.compile(
    r"ECC|fallen off the bus|hardware (?:stack )?error|uncorrectable|NVLink", re.IGNORECASE
)


#: ``status=N`` / ``with error N`` of a completion error (``errors.IBV_WC_STATUS``).
_WC_STATUS = re.compile(r"(?:status=|with error )(\d+)")
#: IBV_WC_WR_FLUSH_ERR: the queue pair was already in error, so the failure was earlier
#: (the peer's end of the broken link, or this host's own first error).
_FLUSH = 5


def _flush(f: Finding) -> bool:
    m = _WC_STATUS.search(f.message)
    return m is not None and int(m.group(1)) == _FLUSH


def _network_failures(job: Sequence[Finding]) -> list[Finding]:
    """The completion errors that report a failure (not a flush), the earliest first."""
    own = [
        g
        for g in job
        if g.kind == "nccl_error"
        and g.evidence.get("error_kind") in _NETWORK_ERRORS
        and severity_at_least(g.severity, "warning")
        and not _flush(g)
    ]
    return sorted(own, key=lambda g: str(g.evidence.get("first_seen") or "~"))


def _nccl_error(f: Finding, job: Sequence[Finding]) -> str | None:
    # The root cause only: the errors after it on other hosts are their view of the
    # first one (a flush error from the peer of a broken link): they waited on it.
    # Where both ends of a link report, the one that failed first is named; the message
    # keeps the peer's address for whoever checks the link.
    kind = f.evidence.get("error_kind")
    if kind == "cuda":
        hardware = f.evidence.get("root_cause") and _GPU_HARDWARE.search(f.message)
        return "gpu_error" if hardware else None
    if kind not in _NETWORK_ERRORS or _flush(f):
        return None
    if f.evidence.get("root_cause"):
        return "network_error"
    # Lines stamped to the second only (per-rank files, 2.26+'s default WARN stamp) can
    # put the peer's flush error first: then the root cause is the first failure that
    # is not a flush (ties: each, as the lines cannot order them).
    root = next((g for g in job if g.kind == "nccl_error" and g.evidence.get("root_cause")), None)
    failures = _network_failures(job)
    if root is None or not _flush(root) or not failures:
        return None
    first = failures[0].evidence.get("first_seen")
    return "network_error" if f.evidence.get("first_seen") == first else None


#: Finding kind -> rule.  Floors: a straggler or hang at ``info`` blames nobody (a
#: spell no slowdown explains, a log that merely ends), nor does a benign WARN (an
#: optional plugin missing, an IB subnet manager event); an NCCL error's consequences
#: are ``warning``, read only where the root cause the detector chose is a flush.
RULES: dict[Kind, Rule] = {
    "straggler": Rule("warning", _straggler),
    "hang": Rule("warning", _hang),
    "timeout": Rule("warning", _timeout),
    "timeout_imminent": Rule("warning", _timeout_imminent),
    "nccl_error": Rule("warning", _nccl_error),
}

#: Finding kinds that never list a node, and why.
NOT_A_NODE_FAULT: dict[Kind, str] = {
    "mismatch": "ranks called different collectives: the program's bug, on any node",
    "config": "a setting or a missing log option, the same on every node",
    "zero_stage": "a DeepSpeed configuration choice",
    "pcie_contention": "offload traffic sharing a link as the topology was built",
    "oom_risk": "the job's memory budget, which a new node does not change",
    "collective_cost": "how much time collectives take, not a fault",
    "cluster_cause": "explains another finding, which lists the node itself",
}
if set(RULES) | set(NOT_A_NODE_FAULT) != set(KINDS) or set(RULES) & set(NOT_A_NODE_FAULT):
    # A new finding kind must be decided: does it blame a node?
    _msg = f"finding kinds without a decision: {sorted(set(KINDS) - set(RULES))}"
    raise ImportError(_msg)


# --- telemetry -> reasons

#: The share of its capacity below which a link's best reading is degraded (a reading
#: a hair under, from rounding in the agent's bytes per second, is not).
_LINK_FLOOR = 0.99

_Facts = list[tuple[str, str]]  # (host, sentence)


def _gpu_series(tel: pl.DataFrame, metric: str) -> pl.DataFrame:
    """One metric's rows with ``gpu`` and ``pci_bus_id`` split from the catalog's label
    order (``gpu,UUID,pci_bus_id[,xid]``)."""
    parts = pl.col("labels").str.split(",")
    return tel.filter(pl.col("metric") == metric).with_columns(
        parts.list.get(0, null_on_oob=True).alias("gpu"),
        parts.list.get(2, null_on_oob=True).alias("pci_bus_id"),
        parts.list.get(3, null_on_oob=True).alias("xid"),
    )


def _xids(tel: pl.DataFrame) -> _Facts:
    """``ncclscope_gpu_xid_errors_total{gpu,UUID,pci_bus_id,xid}`` above 0 for an XID
    that is not the application's: ``GPU 3 (00000000:1B:00.0) reported XID 79 (GPU has
    fallen off the bus) 1 time(s)``."""
    rows = (
        _gpu_series(tel, "ncclscope_gpu_xid_errors_total")
        .group_by("host", "gpu", "pci_bus_id", "xid")
        .agg(pl.col("value").max())
        .filter(pl.col("value") > 0)
        .sort("host", "gpu", "xid")
    )
    out: _Facts = []
    for host, gpu, bus, xid, count in rows.iter_rows():
        code = int(xid) if xid is not None and str(xid).isdigit() else None
        if code in APPLICATION_XIDS:
            continue
        name = f" ({XID_NAMES[code]})" if code in XID_NAMES else ""
        out.append((host, f"GPU {gpu} ({bus}) reported XID {xid}{name} {int(count)} time(s)"))
    return out


def _ecc(tel: pl.DataFrame) -> _Facts:
    """Uncorrected ECC errors since the driver loaded: the GPU needs at least a reset
    before it is trusted again, whenever they happened."""
    rows = (
        _gpu_series(tel, "ncclscope_gpu_ecc_uncorrected_errors_total")
        .group_by("host", "gpu", "pci_bus_id")
        .agg(pl.col("value").max())
        .filter(pl.col("value") > 0)
        .sort("host", "gpu")
    )
    return [
        (h, f"GPU {g} ({b}) counted {int(v)} uncorrected ECC error(s)")
        for h, g, b, v in rows.iter_rows()
    ]


def _pcie_links(tel: pl.DataFrame) -> _Facts:
    """A GPU's PCIe link whose best reading stays below its capacity.  An idle link
    drops to a lower generation to save power and trains back up under load, so only
    the highest generation and the widest width it ever showed are compared (each at
    its best, possibly at different times: an overestimate, never a false alarm)."""
    # Here, not at the top: ``analyze`` imports this module, and only telemetry needs it.
    from ncclscope.units import pcie_max_bytes_per_second

    best = []
    for metric, name in (
        ("ncclscope_gpu_pcie_link_generation", "gen"),
        ("ncclscope_gpu_pcie_link_width", "width"),
        ("ncclscope_gpu_pcie_link_max_bytes_per_second", "cap"),
    ):
        best.append(
            _gpu_series(tel, metric)
            .group_by("host", "gpu", "pci_bus_id")
            .agg(pl.col("value").max().alias(name))
        )
    keys = ["host", "gpu", "pci_bus_id"]
    rows = best[0].join(best[1], on=keys).join(best[2], on=keys).sort("host", "gpu")
    out: _Facts = []
    for host, gpu, bus, gen, width, cap in rows.iter_rows():
        now = pcie_max_bytes_per_second(int(gen), int(width))
        if now is None or not cap or now >= _LINK_FLOOR * cap:
            continue
        out.append(
            (
                host,
                f"GPU {gpu} ({bus}) PCIe link at best Gen{int(gen)} x{int(width)} "
                f"({now / 1e9:.1f} GB/s) of its {cap / 1e9:.1f} GB/s",
            )
        )
    return out


#: Reason -> the telemetry facts that give it (the agent's samples, hosts as the logs
#: spell them).
TELEMETRY_CHECKS: dict[str, Callable[[pl.DataFrame], _Facts]] = {
    "gpu_xid": _xids,
    "gpu_ecc": _ecc,
    "pcie_link_degraded": _pcie_links,
}


# --- the verdict


def _natural(host: str) -> tuple[object, ...]:
    """Sort key: ``node-2`` before ``node-10``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", host))


def _rank_hosts(diagnosis: Diagnosis) -> dict[int, str]:
    ranks = diagnosis.analysis.identity.ranks
    if ranks.is_empty() or "host" not in ranks.columns:
        return {}
    return {
        int(r): str(h)
        for r, h in ranks.select("rank", "host").iter_rows()
        if r is not None and h is not None
    }


def _blamed(f: Finding, rank_hosts: dict[int, str]) -> list[str]:
    """The finding's hosts; where it names only ranks (Flight Recorder dumps carry no
    host), their hosts from the logs."""
    if f.hosts:
        return list(f.hosts)
    return sorted({rank_hosts[r] for r in f.ranks if r in rank_hosts})


def host_verdicts(
    diagnosis: Diagnosis, samples: pl.DataFrame | None = None
) -> dict[str, list[str]]:
    """Every host of the job -> its reasons to drain (:data:`REASONS` codes; empty: keep
    it), e.g. ``{"node-0": [], "node-1": ["slow_node"]}``.  ``samples``: the agent's
    telemetry (TELEMETRY_SCHEMA); default: what the analysis read with ``--telemetry``."""
    verdict = exclude_verdict(diagnosis, samples=samples)
    out: dict[str, list[str]] = {h: [] for h in verdict.keep}
    out |= {n.host: list(n.reasons) for n in verdict.exclude}
    return dict(sorted(out.items(), key=lambda kv: _natural(kv[0])))


def exclude_verdict(diagnosis: Diagnosis, *, samples: pl.DataFrame | None = None) -> ExcludeVerdict:
    """The nodes with evidence of a fault, each with its reasons, and the rest.

    ``samples``: the agent's telemetry (TELEMETRY_SCHEMA, long format); default: what
    the analysis read with ``--telemetry``.  For a job whose rank 5 on ``node-1`` died
    (SIGKILL) while the others waited (``synth``, 16 ranks on 4 hosts, PyTorch)::

        ExcludeVerdict(exclude=[NodeVerdict(host="node-1", reasons=["dead_process"],
            findings=["rank 5 died before AllGather #40; 15 rank(s) entered it and waited",
                      "_ALLGATHER_BASE SeqNum 41 on process group 0 (default_pg) timed "
                      "out on 12 rank(s) after 10m00s; waiting for rank 5"])],
            keep=["node-0", "node-2", "node-3"])
    """
    reasons: dict[str, list[str]] = {}
    said: dict[str, list[str]] = {}

    def add(host: str, reason: str, text: str) -> None:
        if reason not in reasons.setdefault(host, []):
            reasons[host].append(reason)
        if text not in said.setdefault(host, []):
            said[host].append(text)

    rank_hosts = _rank_hosts(diagnosis)
    for f in diagnosis.findings:  # most severe first: so are each node's findings
        rule = RULES.get(f.kind)
        if rule is None or not severity_at_least(f.severity, rule.floor):
            continue
        reason = rule.reason(f, diagnosis.findings)
        if reason is None:
            continue
        for host in _blamed(f, rank_hosts):
            add(host, reason, f.message)
    log_hosts = diagnosis.analysis.hosts
    tel = samples if samples is not None else diagnosis.analysis.telemetry
    if not tel.is_empty():
        tel = with_log_hosts(tel, log_hosts)
        for reason, check in TELEMETRY_CHECKS.items():
            for host, text in check(tel):
                add(host, reason, text)
    exclude = [
        NodeVerdict(h, sorted(reasons[h], key=REASONS.index), said[h])
        for h in sorted(reasons, key=_natural)
    ]
    keep = sorted((h for h in set(log_hosts) if h and h not in reasons), key=_natural)
    return ExcludeVerdict(exclude, keep)


# --- formats


def _split_number(host: str) -> tuple[str, str] | None:
    """``node-07`` -> ``("node-", "07")``; None for a name that ends in no digit."""
    m = re.fullmatch(r"(.*?)(\d+)", host)
    return (m.group(1), m.group(2)) if m else None


def _padded(digits: str) -> bool:
    return len(digits) > 1 and digits.startswith("0")


def _ranges(numbers: list[str]) -> list[str]:
    """Consecutive numbers of one prefix as Slurm's ranges: zero-padded numbers keep
    their width and join only numbers of that width (``09,10`` -> ``09-10``; ``9,010``
    stay apart); unpadded ones join across widths (``9,10`` -> ``9-10``)."""
    out: list[str] = []
    run: list[str] = []
    for digits in sorted(set(numbers), key=lambda d: (int(d), len(d))):
        if run:
            last = run[-1]
            fixed = _padded(last) or _padded(digits) or _padded(run[0])
            if int(digits) == int(last) + 1 and (not fixed or len(digits) == len(last)):
                run.append(digits)
                continue
            out.append(run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [digits]
    if run:
        out.append(run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return out


def hostlist(hosts: list[str]) -> str:
    """Hosts as one Slurm hostlist expression (``scontrol show hostlist``), for
    ``sbatch --exclude``.

    >>> hostlist(["node-01", "node-02", "node-03", "node-07", "gpu9"])
    'gpu9,node-[01-03,07]'
    >>> hostlist(["a9", "a10", "login", "a012"])
    'a[9-10,012],login'
    """
    groups: dict[str, list[str]] = {}
    plain: list[str] = []
    for host in set(hosts):
        split = _split_number(host)
        if split is None:
            plain.append(host)
        else:
            groups.setdefault(split[0], []).append(split[1])
    parts = [(h, h) for h in plain]
    for prefix, numbers in groups.items():
        body = ",".join(_ranges(numbers))
        one = len(numbers) == 1
        parts.append((prefix, prefix + body if one else f"{prefix}[{body}]"))
    return ",".join(text for _key, text in sorted(parts))


def _slurm(v: ExcludeVerdict) -> str:
    return hostlist([n.host for n in v.exclude]) + "\n" if v.exclude else ""


def taint_value(reasons: list[str]) -> str:
    """A node's reasons as a Kubernetes label value (at most 63 characters of
    ``[A-Za-z0-9_.-]``, beginning and ending with a letter or digit).

    >>> taint_value(["dead_process", "gpu_xid"])
    'dead_process.gpu_xid'
    """
    text = re.sub(r"[^A-Za-z0-9_.-]", "_", ".".join(reasons))[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", text) or "fault"


def _kubectl(v: ExcludeVerdict) -> str:
    # --overwrite: a node tainted after an earlier job gets this job's reasons instead
    # of an error ("already has a taint with key").
    return "".join(
        f"# {n.host}: {', '.join(n.reasons)}\n"
        f"kubectl taint nodes {n.host} {TAINT_KEY}={taint_value(n.reasons)}:NoSchedule "
        "--overwrite\n"
        for n in v.exclude
    )


def _json(v: ExcludeVerdict) -> str:
    return json.dumps(v.to_json_dict(), indent=2, sort_keys=True) + "\n"


#: ``--exclude-list`` format -> renderer (the whole output, newline-terminated; empty
#: when no node is to be drained, except JSON, which still lists ``keep``).
FORMATS: dict[str, Callable[[ExcludeVerdict], str]] = {
    "slurm": _slurm,
    "kubectl": _kubectl,
    "json": _json,
}
