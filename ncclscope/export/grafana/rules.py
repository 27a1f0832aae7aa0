"""Prometheus recording and alert rules for the agent's metrics, declared as data and
rendered to ``grafana/ncclscope-rules.yml`` (``rules_yaml``).

Many nodes are watched the Prometheus way (DESIGN §8): each node's agent is scraped,
and the recording rules aggregate over them by ``job`` (the scrape job: one per training
job, or one for the cluster), ``comm`` and ``rank``; alerts use the recorded series.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ncclscope.export.grafana.dashboards import pcie_ratio

__all__ = [
    "PCIE_CONTENTION_RATIO",
    "RULE_GROUPS",
    "SLOW_NODE_MIN_S",
    "SLOW_NODE_SLOWDOWN",
    "STALL_TIMEOUT_SHARE",
    "STRAGGLER_CRITICAL",
    "TIMEOUT_CRITICAL_LEFT_S",
    "Rule",
    "RuleGroup",
    "rules_yaml",
]


@dataclass(frozen=True)
class Rule:
    """A recording rule (``alert`` empty) or an alert rule."""

    name: str
    expr: str
    alert: bool = False
    for_: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    comment: str = ""


@dataclass(frozen=True)
class RuleGroup:
    """A rule group: evaluated together, in order."""

    name: str
    rules: tuple[Rule, ...]
    comment: str = ""
    #: the group's own evaluation interval (empty: the global one)
    interval: str = ""


def _rec(name: str, expr: str, comment: str = "") -> Rule:
    return Rule(name, expr, comment=comment)


#: Seconds left from which an imminent timeout is critical (the timeout detector's
#: ``_CRITICAL_LEFT_S``).
TIMEOUT_CRITICAL_LEFT_S = 300
#: Straggler score from which a straggler is critical (the straggler detector's
#: ``_CRITICAL_SLOWDOWN``).
STRAGGLER_CRITICAL = 0.25
#: Share of the PCIe link from which offload traffic contends (issue #6: ~80%).
PCIE_CONTENTION_RATIO = 0.8
#: Share of the collective timeout the leaders of a communicator have waited for members
#: behind them from which the stall is alerted.  A quarter: no healthy job keeps its
#: ranks waiting that long (its slowest rank is late by milliseconds to seconds, a
#: rank-0 checkpoint a minute or two of a 10-30 minute timeout), and three quarters of
#: the timeout are left to take stacks.
STALL_TIMEOUT_SHARE = 0.25
#: A node's excess arrival lateness over the job's least late node, as a share of the
#: gap between collectives, from which it is a slow node.  Twice the post-mortem
#: detector's minimum effect (``straggler.MIN_SLOWDOWN``): a 5-minute average has none of
#: that detector's significance test.
SLOW_NODE_SLOWDOWN = 0.1
#: ...and at least this many seconds: below it NTP's offsets between hosts (~1 ms) are
#: the whole signal.
SLOW_NODE_MIN_S = 0.002

#: The ranks and nodes of a communicator, joined across every node's agent.  Each agent
#: exports its own ranks' facts (``ncclscope_collective_seq``, the time each entered its
#: last collective, marks); these rules compare them, so a whole frozen node, a node
#: whose agent died and a slow node are seen though no agent sees both sides.
_BEHIND = "job_comm_rank:ncclscope_collective_seq:behind"
_WAIT = "job_comm:ncclscope_leaders_wait_seconds:since_entered"
_LEFT = "job_comm:ncclscope_collective_timeout_left_seconds:from_wait"
_TIMEOUT = "job:ncclscope_collective_timeout_seconds:max"
_CULPRIT = "job_comm_rank:ncclscope_collective_seq:behind_on_host"
_STALLED = f"{_WAIT} >= on (job) group_left () ({STALL_TIMEOUT_SHARE} * {_TIMEOUT})"
_HOST_OF_RANK = "max by (job, rank, hostname) (ncclscope_rank_info)"
#: ... recorded every 15 s (ranks keep their host): a join on it costs the 1 s rules no
#: aggregation over every rank.
_RANK_HOST = "job_rank_hostname:ncclscope_rank_info:max"
#: The op the leaders of the alert's communicator entered, read when an alert's text is
#: rendered (not at every evaluation: on 1,024 ranks that join cost ~35 ms a second).
_LEADERS_OP = (
    '{{ with printf "topk(1, max by (op) (ncclscope_collective_op_info{job=%q,comm=%q}'
    ' and on (rank) (job_comm_rank:ncclscope_collective_seq:behind{job=%q,comm=%q} == 0)))"'
    " $labels.job $labels.comm $labels.job $labels.comm | query }}"
    '{{ . | first | label "op" }}{{ else }}a collective{{ end }}'
)
_MARK_NOW = "job_comm_rank_every:ncclscope_collective_mark_timestamp_seconds:current"
_MARK_LATE = "job_comm_rank_every:ncclscope_collective_mark_timestamp_seconds:lateness"
_HOST_LATE = "job_comm_host:ncclscope_collective_lateness_seconds:avg5m"
_HOST_EXCESS = "job_comm_host:ncclscope_collective_excess_lateness_seconds:avg5m"
_GAP = "job_comm:ncclscope_collective_gap_seconds:delta2m"

_CROSS_NODE: tuple[Rule, ...] = (
    Rule(
        "job_comm:ncclscope_collective_seq:max",
        "max by (job, comm) (ncclscope_collective_seq)",
        comment="The leaders' sequence number on each communicator, over every node.",
    ),
    Rule(
        _BEHIND,
        "max by (job, comm, rank) (\n"
        "  job_comm:ncclscope_collective_seq:max\n"
        "    - on (job, comm) group_right ()\n"
        "  ncclscope_collective_seq\n"
        ")",
        comment="Collectives each rank is behind its communicator's leaders (0: a leader).",
    ),
    Rule(_TIMEOUT, "max by (job) (ncclscope_collective_timeout_seconds)"),
    Rule(
        "job_comm_rank:ncclscope_collective_wait_seconds:own_clock",
        "max by (job, comm, rank) (\n"
        "  ncclscope_clock_timestamp_seconds\n"
        "    - on (job, instance) group_right ()\n"
        "  ncclscope_collective_entered_timestamp_seconds\n"
        ")",
        comment=(
            "Each rank's time since it entered its last collective, on the clock of the"
            " agent that read its log (the node's own: an offset between nodes' clocks"
            " cancels; a replay's clock runs at its speed)."
        ),
    ),
    Rule(
        _WAIT,
        "clamp_min(\n"
        "  max by (job, comm) (\n"
        "    job_comm_rank:ncclscope_collective_wait_seconds:own_clock\n"
        f"    and on (job, comm, rank) ({_BEHIND} == 0)\n"
        "  ),\n"
        "  0\n"
        ")",
        comment=(
            "How long the leaders have waited in their collective: on a healthy job,"
            " since the last collective began."
        ),
    ),
    Rule(_LEFT, f"{_TIMEOUT}\n  - on (job) group_right ()\n{_WAIT}"),
    Rule(
        _CULPRIT,
        f"({_BEHIND} > 0 and on (job, comm) ({_STALLED}))\n"
        f"  * on (job, rank) group_left (hostname) {_RANK_HOST}\n"
        f"or on (job, comm, rank) ({_BEHIND} > 0 and on (job, comm) ({_STALLED}))",
        comment=(
            "The ranks behind on a stalled communicator, with their host where known:"
            " whom the collective waits for."
        ),
    ),
)

#: Nodes compared with each other: arrival times at the same mark (slow nodes).
_NODE_LATENESS: tuple[Rule, ...] = (
    Rule(_RANK_HOST, _HOST_OF_RANK, comment="Each rank's host, as its log lines name it."),
    Rule(
        "job_comm:ncclscope_leaders_entered_timestamp_seconds:min",
        "min by (job, comm) (\n"
        "  ncclscope_collective_entered_timestamp_seconds\n"
        f"  and on (job, comm, rank) ({_BEHIND} == 0)\n"
        ")",
        comment="When the first leader entered the leaders' collective.",
    ),
    Rule(
        _MARK_NOW,
        "max by (job, comm, rank, every) (\n"
        "  ncclscope_collective_mark_timestamp_seconds\n"
        "  and on (job, comm, rank, every) (\n"
        "    ncclscope_collective_mark_seq\n"
        "      == on (job, comm, every) group_left ()\n"
        "    max by (job, comm, every) (ncclscope_collective_mark_seq)\n"
        "  )\n"
        ")",
        comment=(
            "Each rank's arrival at its communicator's newest mark, for the ranks that"
            " reached it (an agent that has not exported it yet is left out, not late)."
        ),
    ),
    Rule(
        _MARK_LATE,
        f"(\n  {_MARK_NOW}\n    - on (job, comm, every) group_left ()\n"
        f"  min by (job, comm, every) ({_MARK_NOW})\n)\n"
        "and on (job, comm, every) (\n"
        f"  count by (job, comm, every) ({_MARK_NOW})\n"
        "    ==\n"
        "  count by (job, comm, every) (ncclscope_collective_mark_seq)\n"
        ")",
        comment=(
            "Only at marks every rank has reached by its agent's last export: a mark some"
            " agents have not exported yet would compare the late node with itself."
        ),
    ),
    Rule(
        _HOST_LATE,
        "avg by (job, comm, hostname) (\n"
        f"  avg_over_time({_MARK_LATE}[5m])\n"
        f"    * on (job, rank) group_left (hostname) {_HOST_OF_RANK}\n"
        ")",
        comment="Each node's mean arrival lateness on each communicator over 5 minutes.",
    ),
    Rule(
        _HOST_EXCESS,
        f"{_HOST_LATE}\n  - on (job, comm) group_left ()\nmin by (job, comm) ({_HOST_LATE})",
        comment="Over the least late node's (the job's nodes compared with each other).",
    ),
    Rule(
        _GAP,
        "delta(job_comm:ncclscope_leaders_entered_timestamp_seconds:min[2m])\n"
        "  / (delta(job_comm:ncclscope_collective_seq:max[2m]) > 0)",
        comment="Seconds between collectives, in the logs' time (a replay's speed cancels out).",
    ),
    Rule(
        "job_comm_host:ncclscope_node_slowdown:ratio",
        f"({_HOST_EXCESS} >= {SLOW_NODE_MIN_S})\n  / on (job, comm) group_left () ({_GAP} > 0)",
        comment="A node's excess lateness as a share of the gap between collectives.",
    ),
)

RULE_GROUPS: tuple[RuleGroup, ...] = (
    RuleGroup(
        "ncclscope-job",
        (
            *_CROSS_NODE,
            _rec(
                "job_comm:ncclscope_timeout_remaining_seconds:min",
                "min by (job, comm) (ncclscope_timeout_remaining_seconds)",
                "Seconds left before the collective timeout, the most pessimistic node's.",
            ),
            _rec(
                "job:ncclscope_timeout_remaining_seconds:min",
                "min by (job) (ncclscope_timeout_remaining_seconds)",
            ),
            _rec(
                "job_comm:ncclscope_timeout_culprit_info:max",
                "max by (job, comm, rank, op, seq) (ncclscope_timeout_culprit_info)",
                "The ranks pending collectives wait for, whichever node saw it.",
            ),
            _rec(
                "job_comm:ncclscope_pending_collective_age_seconds:max",
                "max by (job, comm) (ncclscope_pending_collective_age_seconds)",
            ),
            _rec(
                "job_kind_severity:ncclscope_findings:max",
                "max by (job, kind, severity) (ncclscope_findings)",
            ),
            Rule(
                "NcclscopeTimeoutImminent",
                "(\n"
                "  job_comm:ncclscope_timeout_culprit_info:max\n"
                "    * on (job, comm) group_left ()\n"
                "  job_comm:ncclscope_timeout_remaining_seconds:min\n"
                "  or on (job, comm)\n"
                "  job_comm:ncclscope_timeout_remaining_seconds:min\n"
                "  or on (job, comm)\n"
                f"  {_LEFT}\n"
                "    + on (job, comm) group_right ()\n"
                f"  (0 * {_CULPRIT})\n"
                f"  and on (job, comm) ({_STALLED})\n"
                f") < {TIMEOUT_CRITICAL_LEFT_S}",
                alert=True,
                labels=(("severity", "critical"),),
                comment=(
                    "With the culprit's labels where a node names one, the countdown alone"
                    " where none does; else the countdown joined across nodes, with the ranks"
                    " behind. No `for`: the countdown comes from the logs' own timestamps,"
                    " so a first value under the threshold is already sustained."
                ),
                annotations=(
                    (
                        "summary",
                        "NCCL collective timeout in {{ $value | humanizeDuration }} "
                        "(job {{ $labels.job }}, comm {{ $labels.comm }})",
                    ),
                    (
                        "description",
                        "A collective on communicator {{ $labels.comm }} has waited long "
                        "enough that the watchdog will abort the job in "
                        "{{ $value | humanizeDuration }}."
                        "{{ if $labels.rank }} It waits for rank {{ $labels.rank }}"
                        "{{ if $labels.hostname }} on {{ $labels.hostname }}{{ end }}"
                        "{{ if $labels.op }} ({{ $labels.op }}"
                        "{{ if $labels.seq }} #{{ $labels.seq }}{{ end }}){{ end }}:"
                        " take its stacks now "
                        "(py-spy dump) before the job is killed.{{ end }}",
                    ),
                ),
            ),
            Rule(
                "NcclscopeCollectiveStalled",
                f"{_LEFT}\n"
                "  + on (job, comm) group_right ()\n"
                f"(0 * {_CULPRIT})\n"
                f"and on (job, comm) ({_STALLED})",
                alert=True,
                labels=(("severity", "warning"),),
                comment=(
                    "Ranks behind while the leaders have waited a quarter of the timeout,"
                    " across nodes (a whole node frozen, one rank per node). Value: seconds"
                    " left. No `for`: the wait comes from the logs' timestamps."
                ),
                annotations=(
                    (
                        "summary",
                        "Rank {{ $labels.rank }}{{ if $labels.hostname }} on "
                        "{{ $labels.hostname }}{{ end }} holds up communicator "
                        "{{ $labels.comm }} of job {{ $labels.job }}: timeout in "
                        "{{ $value | humanizeDuration }}",
                    ),
                    (
                        "description",
                        f"The other members entered {_LEADERS_OP} on "
                        "{{ $labels.comm }} and have "
                        "waited for rank {{ $labels.rank }} long enough that the watchdog "
                        "aborts the job in {{ $value | humanizeDuration }}. Take its stacks "
                        "now (py-spy dump --pid ...){{ if $labels.hostname }} on "
                        "{{ $labels.hostname }}{{ end }}; if every rank of a node is named, "
                        "look at the node (GPU XID, NIC, kernel log).",
                    ),
                ),
            ),
            Rule(
                "NcclscopeNodeLost",
                f"min by (job) ({_LEFT} and on (job, comm) ({_STALLED}))\n"
                "  + on (job) group_right ()\n"
                "(\n"
                '  0 * (up{job=~".*ncclscope.*"} == 0)\n'
                "    * on (job, instance) group_left (hostname)\n"
                "  max by (job, instance, hostname) (last_over_time(ncclscope_node_info[15m]))\n"
                ")",
                alert=True,
                labels=(("severity", "critical"),),
                comment=(
                    "An agent that stopped answering while the others' collective stalls:"
                    " its node is the likely culprit (its ranks' series went with it)."
                    " Value: seconds left."
                ),
                annotations=(
                    (
                        "summary",
                        "Node {{ $labels.hostname }} lost while job {{ $labels.job }} waits: "
                        "timeout in {{ $value | humanizeDuration }}",
                    ),
                    (
                        "description",
                        "The agent on {{ $labels.hostname }} ({{ $labels.instance }}) stopped "
                        "answering and the other nodes' ranks have waited in a collective "
                        "since: the node (or its ranks) is likely down or frozen. The watchdog "
                        "aborts the job in {{ $value | humanizeDuration }}. Check the node "
                        "(reachable? kernel log, GPU XID) before the job is killed.",
                    ),
                ),
            ),
        ),
        "Across the ranks and nodes of a job (each node's agent sees its own ranks' logs):"
        " stalls, countdowns and their alerts, at the global evaluation interval. Rules of"
        " one group run in order, so an alert sees this evaluation's recorded values.",
    ),
    RuleGroup(
        "ncclscope-job-trends",
        (
            *_NODE_LATENESS,
            _rec(
                "job_rank:ncclscope_straggler_score:max",
                "max by (job, rank) (ncclscope_straggler_score)",
            ),
            _rec("job:ncclscope_straggler_score:max", "max by (job) (ncclscope_straggler_score)"),
            _rec(
                "job_rank:ncclscope_collective_lateness_seconds:max",
                "max by (job, rank) (ncclscope_collective_lateness_seconds)",
            ),
            _rec(
                "job_comm_rank:ncclscope_collective_seq:rate1m",
                "max by (job, comm, rank) (rate(ncclscope_collective_seq[1m]))",
                "Collectives per second per rank (the sequence number only grows, so rate()"
                " reads it like a counter).",
            ),
            Rule(
                "NcclscopeSlowNode",
                "max by (job, hostname) (job_comm_host:ncclscope_node_slowdown:ratio)\n"
                f"  >= {SLOW_NODE_SLOWDOWN}",
                alert=True,
                for_="5m",
                labels=(("severity", "warning"),),
                comment=(
                    "A node whose ranks arrive late at collectives compared with the other"
                    " nodes', over 5 minutes, for 5 more. Clocks cannot be told from"
                    " slowness here: both are said."
                ),
                annotations=(
                    (
                        "summary",
                        "Node {{ $labels.hostname }} of job {{ $labels.job }} is slow (or its "
                        "clock is off)",
                    ),
                    (
                        "description",
                        "The ranks on {{ $labels.hostname }} enter collectives later than the "
                        "other nodes' by {{ $value | humanizePercentage }} of the gap between "
                        "collectives, for 5 minutes: every other node waits for it. Or its "
                        "clock is behind by that much: check `chronyc tracking` (or PTP) on "
                        "it; if the clock is right, look at its GPUs' clocks and throttling, "
                        "its NIC and its CPU load. `ncclscope analyze` on the logs tells the "
                        "two apart.",
                    ),
                ),
            ),
            Rule(
                "NcclscopeStraggler",
                f"job_rank:ncclscope_straggler_score:max >= {STRAGGLER_CRITICAL}",
                alert=True,
                for_="10m",
                labels=(("severity", "warning"),),
                annotations=(
                    (
                        "summary",
                        "Rank {{ $labels.rank }} of job {{ $labels.job }} straggles",
                    ),
                    (
                        "description",
                        "Rank {{ $labels.rank }} arrives at collectives late by "
                        "{{ $value | humanizePercentage }} of the gap between them, "
                        "for 10 minutes: every other rank waits for it.",
                    ),
                ),
            ),
        ),
        "Averages over minutes (slow nodes, stragglers, collective rates) and their alerts,"
        " which fire after minutes: evaluated every 15 s, a fifteenth of the cost of the"
        " stall rules at a 1 s interval (benchmarks/bench_rules.py).",
        interval="15s",
    ),
    RuleGroup(
        "ncclscope-node",
        (
            _rec(
                "instance_gpu:ncclscope_gpu_pcie_utilization:ratio",
                pcie_ratio(),
                "Each GPU's busier PCIe direction as a share of the link's one-direction capacity.",
            ),
            _rec(
                "job:ncclscope_gpu_pcie_utilization:max_ratio",
                "max by (job) (instance_gpu:ncclscope_gpu_pcie_utilization:ratio)",
            ),
            _rec(
                "instance_gpu:ncclscope_gpu_memory_used:ratio",
                "ncclscope_gpu_memory_used_bytes / ncclscope_gpu_memory_total_bytes",
            ),
            _rec(
                "job:ncclscope_gpu_memory_used:max_ratio",
                "max by (job) (instance_gpu:ncclscope_gpu_memory_used:ratio)",
            ),
            _rec(
                "instance:ncclscope_host_memory_available:ratio",
                "ncclscope_host_memory_available_bytes / ncclscope_host_memory_total_bytes",
            ),
            _rec(
                "job:ncclscope_host_memory_available:min_ratio",
                "min by (job) (instance:ncclscope_host_memory_available:ratio)",
            ),
            Rule(
                "NcclscopePcieContention",
                "quantile_over_time(0.75, "
                "instance_gpu:ncclscope_gpu_pcie_utilization:ratio[5m])\n"
                "  * on (job, instance) group_left (hostname) ncclscope_node_info\n"
                f"  >= {PCIE_CONTENTION_RATIO}",
                alert=True,
                for_="5m",
                labels=(("severity", "warning"),),
                comment=(
                    "At or above the share for at least a quarter of the last 5 minutes:"
                    " offload traffic comes in bursts (the optimizer step), and NVML's PCIe"
                    " rates are 20 ms samples."
                ),
                annotations=(
                    (
                        "summary",
                        "PCIe of GPU {{ $labels.gpu }} on {{ $labels.hostname }} near its capacity",
                    ),
                    (
                        "description",
                        "GPU {{ $labels.gpu }} ({{ $labels.pci_bus_id }}) on "
                        "{{ $labels.hostname }} moves at least "
                        "{{ $value | humanizePercentage }} of its PCIe link's capacity "
                        "for a quarter of the time: with ZeRO offload, ranks that share "
                        "the host or switch contend. Try pinned memory, fewer offloading "
                        "ranks per host or switch, or binding cores to ranks.",
                    ),
                ),
            ),
            Rule(
                "NcclscopeAgentDown",
                'up{job=~".*ncclscope.*"} == 0',
                alert=True,
                for_="2m",
                labels=(("severity", "warning"),),
                comment="The agents' scrape job's name must contain ncclscope (or edit this).",
                annotations=(
                    ("summary", "ncclscope agent {{ $labels.instance }} is down"),
                    (
                        "description",
                        "Prometheus has not reached the agent at {{ $labels.instance }} "
                        "(job {{ $labels.job }}) for 2 minutes: that node's GPUs, host "
                        "and ranks are not watched.",
                    ),
                ),
            ),
        ),
        "Per GPU and per node, their worst over the job, and the alerts on them (over"
        " minutes: evaluated every 15 s).",
        interval="15s",
    ),
)


def _quote(text: str) -> str:
    """A YAML double-quoted scalar (JSON's escaping is valid YAML)."""
    return json.dumps(text, ensure_ascii=False)


_DURATION = re.compile(r"(\[|for: |interval: )([0-9]+)([smh])(\]|$)", re.MULTILINE)
_SECONDS = {"s": 1, "m": 60, "h": 3600}


def _scaled(text: str, time_scale: float) -> str:
    """Every range, ``for`` and group ``interval`` in ``text`` divided by ``time_scale``,
    in ms."""

    def repl(m: re.Match[str]) -> str:
        ms = round(int(m[2]) * _SECONDS[m[3]] * 1000 / time_scale)
        return f"{m[1]}{max(ms, 1)}ms{m[4]}"

    return _DURATION.sub(repl, text)


def rules_yaml(time_scale: float = 1.0) -> str:
    """``grafana/ncclscope-rules.yml``: Prometheus' rule-file format.

    ``time_scale``: for a replay at that many times real speed, every range and ``for``
    duration divided by it, so that the rules see the replayed job as they would the
    real one (waits and countdowns come from the logs' clock and need no scaling)."""
    text = _rules_yaml()
    return text if time_scale == 1.0 else _scaled(text, time_scale)


def _rules_yaml() -> str:
    out = [
        "# Prometheus rules for ncclscope agent's metrics. Rendered from",
        "# ncclscope/export/grafana/rules.py: edit there, then",
        "#   NCCLSCOPE_REGENERATE=1 .venv/bin/pytest tests/test_grafana.py",
        "# Load with `rule_files: [ncclscope-rules.yml]`; unit tests: ncclscope-rules.test.yml.",
        "groups:",
    ]
    for group in RULE_GROUPS:
        if group.comment:
            out.append(f"  # {group.comment}")
        out.append(f"  - name: {group.name}")
        if group.interval:
            out.append(f"    interval: {group.interval}")
        out.append("    rules:")
        for rule in group.rules:
            if rule.comment:
                out.append(f"      # {rule.comment}")
            key = "alert" if rule.alert else "record"
            out.append(f"      - {key}: {rule.name}")
            out.append("        expr: |-")
            out += [f"          {line}" for line in rule.expr.splitlines()]
            if rule.for_:
                out.append(f"        for: {rule.for_}")
            for section, pairs in (("labels", rule.labels), ("annotations", rule.annotations)):
                if pairs:
                    out.append(f"        {section}:")
                    out += [f"          {k}: {_quote(v)}" for k, v in pairs]
    return "\n".join(out) + "\n"
