"""Prometheus recording and alert rules for the agent's metrics, declared as data and
rendered to ``grafana/ncclscope-rules.yml`` (``rules_yaml``).

Many nodes are watched the Prometheus way (DESIGN §8): each node's agent is scraped,
and the recording rules aggregate over them by ``job`` (the scrape job: one per training
job, or one for the cluster) and ``comm``; alerts use the recorded series.  The rules
evaluated every second (stalls, countdowns, a lost node) read one series per node and
communicator, each node's summary of its own ranks (``ncclscope.agent.rollup``), so
their cost grows with nodes x communicators, not ranks (``benchmarks/bench_rules.py``);
the ranks a stall waits for are named from the summaries of the few nodes that hold it
up.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ncclscope.export.grafana.dashboards import pcie_ratio
from ncclscope.export.grafana.fabric import fabric_alerts, fabric_rules, slow_node_causes

__all__ = [
    "MAX_NODE_RANKS",
    "NODE_LOST_FOR",
    "PCIE_CONTENTION_RATIO",
    "RULE_GROUPS",
    "SLOW_NODE_MIN_S",
    "SLOW_NODE_SLOWDOWN",
    "STALL_TIMEOUT_SHARE",
    "STRAGGLER_CRITICAL",
    "STRAGGLER_FLOOR",
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
#: Straggler score from which a rank straggles at all (the straggler detector's
#: ``MIN_SLOWDOWN``): below it no rank's score is recorded.
STRAGGLER_FLOOR = 0.05
#: Share of the PCIe link from which offload traffic contends (issue #6: ~80%).
PCIE_CONTENTION_RATIO = 0.8
#: Share of the collective timeout the leaders of a communicator have waited for members
#: behind them from which the stall is alerted where no agent knows the job's own bound
#: (``detect.waits``: too little history), and the most it waits where one does.  A
#: quarter: no healthy job keeps its ranks waiting that long (its slowest rank is late by
#: milliseconds to seconds, a rank-0 checkpoint a minute or two of a 10-30 minute
#: timeout), and three quarters of the timeout are left to take stacks.
STALL_TIMEOUT_SHARE = 0.25
#: How long an agent must stay unreachable during a stall to be named lost: ten 1 s
#: scrapes (one failed scrape is no lost node), against a quarter of a 10-30 min timeout.
NODE_LOST_FOR = "10s"
#: A node's excess arrival lateness over the job's least late node, as a share of the
#: gap between collectives, from which it is a slow node.  Twice the post-mortem
#: detector's minimum effect (``straggler.MIN_SLOWDOWN``): a 5-minute average has none of
#: that detector's significance test.
SLOW_NODE_SLOWDOWN = 0.1
#: ...and at least this many seconds: below it NTP's offsets between hosts (~1 ms) are
#: the whole signal.
SLOW_NODE_MIN_S = 0.002

#: The nodes of a communicator, compared across every node's agent.  Each agent sums up
#: its own ranks per communicator (``ncclscope.agent.rollup``: the node's highest and
#: lowest sequence number, how long its first rank has been in its highest collective,
#: its first arrival at marks); these rules compare the nodes, so a whole frozen node, a
#: node whose agent died and a slow node are seen though no agent sees both sides.  Every
#: rule of the 1 s group reads one series per node and communicator (or per node), never
#: one per rank: the ranks that hold a stalled collective up are named from their node's
#: list of ranks and its own countdown.
_SEQ_MAX = "job_comm:ncclscope_collective_seq:max"
_WAIT = "job_comm:ncclscope_leaders_wait_seconds:since_entered"
_LEFT = "job_comm:ncclscope_collective_timeout_left_seconds:from_wait"
_TIMEOUT = "job:ncclscope_collective_timeout_seconds:max"
_HOLDING = "job_instance_comm:ncclscope_collective_seq:holding_up"
_ALL_BEHIND = "job_instance_comm:ncclscope_collective_seq:all_behind"
_CULPRIT = "job_comm_rank:ncclscope_collective_seq:behind_on_host"
#: The job's own stall bound per communicator (the agents' ``wait_bounds``; the most
#: patient node's), and the threshold the stall rules hold the leaders' wait to: that
#: bound, at most a quarter of the timeout; the quarter where no agent knows a bound.
_BOUND = "job_comm:ncclscope_collective_wait_bound_seconds:max"
_THRESHOLD = "job_comm:ncclscope_collective_wait_bound_seconds:threshold"
_QUARTER = f"({STALL_TIMEOUT_SHARE} * {_TIMEOUT})"
_STALLED = f"{_WAIT} >= on (job, comm) {_THRESHOLD}"
#: Each node's host, kept 15 minutes after its agent stopped answering (recorded every
#: 15 s: the range costs the 1 s rules nothing).
_NODE_HOST = "job_instance_hostname:ncclscope_node_info:last15m"
#: The most ranks of one node on one communicator the stall rules name one by one.
MAX_NODE_RANKS = 16
#: The op of the leaders' collective, recorded every 15 s (a stall's does not change).
_OP_LEADERS = "job_comm_op:ncclscope_node_collective_op_info:leaders"
#: ... read when an alert's text is rendered: at every evaluation, for every alert, so
#: it reads the recorded series (a query over every node's op per alert and second cost
#: more than the rules at 10,000 ranks).
_LEADERS_OP = (
    f'{{{{ with printf "topk(1, {_OP_LEADERS}{{job=%q,comm=%q}})"'
    " $labels.job $labels.comm | query }}"
    '{{ . | first | label "op" }}{{ else }}a collective{{ end }}'
)
#: The pending collective's sequence number, where a node's own countdown gives it.
_PENDING_SEQ = (
    '{{ with printf "max(ncclscope_pending_collective_seq{job=%q,comm=%q})"'
    " $labels.job $labels.comm | query }} #{{ . | first | value }}{{ end }}"
)
_MARK_NOW = "job_instance_comm_every:ncclscope_node_collective_mark_timestamp_seconds:current"
_MARK_LATE = "job_instance_comm_every:ncclscope_node_collective_mark_timestamp_seconds:lateness"
_HOST_LATE = "job_comm_host:ncclscope_collective_lateness_seconds:avg5m"
_HOST_EXCESS = "job_comm_host:ncclscope_collective_excess_lateness_seconds:avg5m"
_GAP = "job_comm:ncclscope_collective_gap_seconds:delta2m"


#: The nodes at their communicator's highest sequence, computed at once (the 15 s rules
#: read raw series newer than the 1 s group's recorded highest).
_LEADING = (
    "ncclscope_node_collective_seq_max\n"
    "  == on (job, comm) group_left ()\n"
    "  max by (job, comm) (ncclscope_node_collective_seq_max)"
)


def _each_rank(nodes: str, indent: str) -> str:
    """One series per rank of ``nodes``, ``rank`` taken from their ``ranks`` list (up to
    ``MAX_NODE_RANKS``; PromQL has no split): the k-th element where the list has one,
    else ``-``, dropped at the end."""
    marked = f'label_replace({nodes}, "rank", "-", "", "")'
    terms = [
        f'{indent}  label_replace({marked}, "rank", "$1", "ranks",'
        f' "{f"(?:[^,]+,){{{k}}}" if k else ""}([^,]+).*")'
        for k in range(MAX_NODE_RANKS)
    ]
    none = 'label_replace(vector(1), "rank", "-", "", "")'
    return (
        f"{indent}(\n"
        + f"\n{indent}  or\n".join(terms)
        + f"\n{indent})\n{indent}unless on (rank) {none}"
    )


_CROSS_NODE: tuple[Rule, ...] = (
    Rule(
        _SEQ_MAX,
        "max by (job, comm) (ncclscope_node_collective_seq_max)",
        comment="The leaders' sequence number on each communicator, over every node.",
    ),
    Rule(
        _WAIT,
        "clamp_min(\n"
        "  max by (job, comm) (\n"
        "    ncclscope_node_collective_wait_seconds\n"
        "    and on (job, instance, comm)\n"
        f"    ncclscope_node_collective_seq_max >= on (job, comm) group_left () {_SEQ_MAX}\n"
        "  ),\n"
        "  0\n"
        ")",
        comment=(
            "How long the leaders have waited in their collective: the longest wait of the"
            " nodes at the communicator's highest sequence, each on its own clock (an"
            " offset between nodes' clocks cancels; a replay's runs at its speed). On a"
            " healthy job, since the last collective began. A node behind, or one whose"
            " agent stopped reading, is no leader: its growing wait is not the leaders'."
            " (At or above the highest recorded just before: a scrape may have landed"
            " between the two rules.)"
        ),
    ),
    Rule(
        _BOUND,
        "max by (job, comm) (ncclscope_collective_wait_bound_seconds)",
        comment=(
            "How long a collective may wait before it is a stall, by the job's own history"
            " (each agent's window; the most patient node's): a checkpoint or evaluation"
            " that recurs raises it."
        ),
    ),
    Rule(
        _THRESHOLD,
        "(\n"
        f"  {_BOUND}\n"
        f"    < on (job) group_left () {_QUARTER}\n"
        ")\n"
        "or on (job, comm)\n"
        f"(0 * {_WAIT} + on (job) group_left () {_QUARTER})\n"
        "or on (job, comm)\n"
        "(\n"
        "  0 * max by (job, comm) (ncclscope_pending_collective_age_seconds)\n"
        f"    + on (job) group_left () {_QUARTER}\n"
        ")",
        comment=(
            "The leaders' wait past which a communicator is stalled: the job's own bound,"
            " at most a quarter of the timeout; the quarter where no agent has history"
            " enough to know a bound (on every communicator the leaders' wait or a node's"
            " countdown is known for)."
        ),
    ),
    Rule(_LEFT, f"{_TIMEOUT}\n  - on (job) group_right ()\n{_WAIT}"),
    Rule(
        _HOLDING,
        "(\n"
        f"  {_SEQ_MAX}\n"
        "    - on (job, comm) group_right ()\n"
        "  ncclscope_node_collective_seq_min\n"
        f") > 0\nand on (job, comm) ({_STALLED})",
        comment=(
            "The nodes that hold a stalled collective up (ranks behind the leaders while"
            " they have waited past the stall threshold), by how many collectives, with"
            " the list of their ranks: a handful of series, none on a running job."
        ),
    ),
    Rule(
        _ALL_BEHIND,
        f"{_HOLDING}\nunless on (job, instance, comm) ncclscope_timeout_culprit_info",
        comment=(
            "Of those, the nodes whose ranks are all behind (a frozen node, a node's one"
            " rank on the communicator): their own countdown sees no rank ahead."
        ),
    ),
    Rule(
        _CULPRIT,
        "max by (job, comm, rank, hostname) (\n"
        "  (\n"
        "    (\n"
        "      (\n" + _each_rank(_ALL_BEHIND, "        ") + "\n        or\n"
        "        max by (job, instance, comm, rank) (\n"
        f"          ncclscope_timeout_culprit_info and on (job, instance, comm) {_HOLDING}\n"
        "        )\n"
        "      )\n"
        f"      * 0 + on (job, instance, comm) group_left () {_HOLDING}\n"
        "    )\n"
        "    or\n"
        "    max by (job, instance, comm, rank) (ncclscope_timeout_culprit_info)\n"
        "      and on (job, instance, comm)\n"
        "    ncclscope_pending_collective_age_seconds\n"
        f"      >= on (job, comm) group_left () {_THRESHOLD}\n"
        "  )\n"
        f"  * on (job, instance) group_left (hostname) {_NODE_HOST}\n"
        ")",
        comment=(
            "The ranks behind on a stalled communicator, with their node's host: whom the"
            " collective waits for (value: collectives their node's last rank is behind, 1"
            " where only a node's own countdown saw it). A node whose ranks are all behind"
            " names each from its list; a node with ranks on both sides names those its own"
            " countdown names, and so does a node whose countdown has waited past the stall"
            " threshold (on a communicator wholly on the node, the only view there is)."
            " No series per rank is read."
        ),
    ),
)

#: Nodes compared with each other: arrival times at the same mark (slow nodes); what
#: changes slowly (the timeout, findings, the nodes' hosts).
_NODE_LATENESS: tuple[Rule, ...] = (
    Rule(
        _NODE_HOST,
        "max by (job, instance, hostname) (last_over_time(ncclscope_node_info[15m]))",
        comment=(
            "Each node's host, also for 15 minutes after its agent stopped answering"
            " (a lost node is named by it)."
        ),
    ),
    Rule(_TIMEOUT, "max by (job) (ncclscope_collective_timeout_seconds)"),
    _rec(
        "job_kind_severity:ncclscope_findings:max",
        "max by (job, kind, severity) (ncclscope_findings)",
    ),
    Rule(
        _OP_LEADERS,
        "max by (job, comm, op) (\n"
        "  ncclscope_node_collective_op_info\n"
        "  and on (job, instance, comm)\n"
        f"  {_LEADING}\n"
        ")",
        comment="The op the leaders entered (the stall alert's text names it).",
    ),
    Rule(
        "job_comm:ncclscope_leaders_entered_timestamp_seconds:min",
        "min by (job, comm) (\n"
        "  (\n"
        "    ncclscope_clock_timestamp_seconds\n"
        "      - on (job, instance) group_right ()\n"
        "    ncclscope_node_collective_wait_seconds\n"
        "  )\n"
        f"  and on (job, instance, comm) ({_LEADING})\n"
        ")",
        comment="When the first leader entered the leaders' collective (on its node's clock).",
    ),
    Rule(
        _MARK_NOW,
        "ncclscope_node_collective_mark_timestamp_seconds\n"
        "and on (job, instance, comm, every) (\n"
        "  ncclscope_node_collective_mark_seq\n"
        "    == on (job, comm, every) group_left ()\n"
        "  max by (job, comm, every) (ncclscope_node_collective_mark_seq)\n"
        ")",
        comment=(
            "Each node's first arrival at its communicator's newest mark, for the nodes"
            " that reached it (an agent that has not exported it yet is left out, not late)."
        ),
    ),
    Rule(
        _MARK_LATE,
        f"(\n  {_MARK_NOW}\n    - on (job, comm, every) group_left ()\n"
        f"  min by (job, comm, every) ({_MARK_NOW})\n)\n"
        "and on (job, comm, every) (\n"
        f"  count by (job, comm, every) ({_MARK_NOW})\n"
        "    ==\n"
        "  count by (job, comm, every) (ncclscope_node_collective_mark_seq)\n"
        ")",
        comment=(
            "Only at marks every node has reached by its agent's last export: a mark some"
            " agents have not exported yet would compare the late node with itself."
        ),
    ),
    Rule(
        _HOST_LATE,
        "avg by (job, comm, hostname) (\n"
        f"  avg_over_time({_MARK_LATE}[5m])\n"
        f"    * on (job, instance) group_left (hostname) {_NODE_HOST}\n"
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
        f"  / (delta({_SEQ_MAX}[2m]) > 0)",
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
                "max by (job, comm, rank, op) (ncclscope_timeout_culprit_info)",
                "The ranks pending collectives wait for, whichever node saw it.",
            ),
            _rec(
                "job_comm:ncclscope_pending_collective_age_seconds:max",
                "max by (job, comm) (ncclscope_pending_collective_age_seconds)",
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
                        f"{_PENDING_SEQ}){{{{ end }}}}:"
                        " take its stacks now "
                        "(docs/deploy.md, taking a rank's stacks) before the job is killed."
                        "{{ end }}",
                    ),
                ),
            ),
            Rule(
                "NcclscopeCollectiveStalled",
                f"(\n  {_LEFT}\n  or on (job, comm)\n"
                "  job_comm:ncclscope_timeout_remaining_seconds:min\n)\n"
                "  + on (job, comm) group_right ()\n"
                f"(0 * {_CULPRIT})",
                alert=True,
                labels=(("severity", "warning"),),
                comment=(
                    "Ranks behind while the leaders have waited longer than the job ever has"
                    " (its own bound, at most a quarter of the timeout),"
                    " across nodes (a whole node frozen, one rank per node) or on a node that"
                    " sees both sides. Value: seconds left. No `for`: the wait comes from the"
                    " logs' timestamps."
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
                        "now (docs/deploy.md, taking a rank's stacks){{ if $labels.hostname }} on "
                        "{{ $labels.hostname }}{{ end }}; if every rank of a node is named, "
                        "look at the node (GPU XID, NIC, kernel log)."
                        "{{ if $labels.hostname }}" + slow_node_causes() + "{{ end }}",
                    ),
                ),
            ),
            Rule(
                "NcclscopeNodeLost",
                f"min by (job) ({_LEFT} and on (job, comm) ({_STALLED}))\n"
                "  + on (job) group_right ()\n"
                "(\n"
                '  0 * (max_over_time(up{job=~".*ncclscope.*"}[1m]) == 0)\n'
                "    * on (job, instance) group_left (hostname)\n"
                f"  {_NODE_HOST}\n"
                ")",
                alert=True,
                for_=NODE_LOST_FOR,
                labels=(("severity", "critical"),),
                comment=(
                    "An agent that stopped answering while the others' collective stalls:"
                    " its node is the likely culprit (its ranks' series went with it)."
                    f" Every scrape of the last minute failed, for {NODE_LOST_FOR} more: a"
                    " scrape that timed out on a busy node (or Prometheus) is no lost node."
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
                        "(reachable? kernel log, GPU XID) before the job is killed."
                        + slow_node_causes(),
                    ),
                ),
            ),
        ),
        "Across the nodes of a job (each node's agent sees its own ranks' logs and sums"
        " them up per communicator): stalls, countdowns and their alerts, every second"
        " whatever the site's global evaluation interval (10% of it at 10,000 ranks,"
        " benchmarks/README.md; from ~100,000 ranks make it 5s). Every rule reads one"
        " series per node and communicator (or per node), none one per rank. Rules of one"
        " group run in order, so an alert sees this evaluation's recorded values.",
        interval="1s",
    ),
    RuleGroup(
        "ncclscope-job-trends",
        (
            *_NODE_LATENESS,
            _rec(
                "job_rank:ncclscope_straggler_score:max",
                f"max by (job, rank) (ncclscope_straggler_score >= {STRAGGLER_FLOOR})",
                "The ranks that straggle at all (at or above the detectors' floor): a"
                " handful of series where one per rank would be recorded.",
            ),
            _rec(
                "job:ncclscope_straggler_score:max",
                "max by (job) (job_rank:ncclscope_straggler_score:max)",
                "The worst straggler's score, where one reaches the floor.",
            ),
            _rec(
                "job_instance:ncclscope_collective_lateness_seconds:max",
                "max by (job, instance) (ncclscope_collective_lateness_seconds)",
                "Each node's latest rank's median lateness (a series per node, not per rank).",
            ),
            _rec(
                "job_comm:ncclscope_collective_seq:rate1m",
                "max by (job, comm) (rate(ncclscope_node_collective_seq_max[1m]))",
                "Collectives per second on each communicator, its leaders' (the sequence"
                " number only grows, so rate() reads it like a counter).",
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
                        "two apart." + slow_node_causes(),
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
        " which fire after minutes, and what changes slowly (the nodes' hosts, the timeout,"
        " findings): evaluated every 15 s, a fifteenth of their cost at a 1 s interval"
        " (benchmarks/bench_rules.py).",
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
    RuleGroup(
        "ncclscope-evidence",
        (
            Rule(
                "NcclscopeRankStuckOutsideNccl",
                "max by (job, instance, rank, pid, stack, frame) (\n"
                "  ncclscope_evidence_rank_info"
                '{stack=~"data_loader|checkpoint|lock|sleep|io|compute"}\n'
                ")\n"
                "  and on (job) (count by (job) "
                '(ncclscope_evidence_rank_info{stack="in_collective"}) > 0)',
                alert=True,
                labels=(("severity", "warning"),),
                comment=(
                    "The agents' evidence at a stall (--collect-at): a rank whose Python stack"
                    " is not in a collective while another rank's of the job is. As analyze"
                    " judges a folder (evidence.read.judge): the rank's own stack, not a"
                    " headcount. The rows go when the node's ranks log collectives again."
                ),
                annotations=(
                    (
                        "summary",
                        "rank {{ $labels.rank }} on {{ $labels.instance }} is stuck outside NCCL",
                    ),
                    (
                        "description",
                        "At the stall the others wait in a collective, and rank {{ $labels.rank }}"
                        " (pid {{ $labels.pid }}) is in {{ $labels.stack }}: {{ $labels.frame }}."
                        " A CPU-side hang: look at that process (its stack is in the agent's"
                        " evidence folder) before the NCCL timeout kills the job.",
                    ),
                ),
            ),
            Rule(
                "NcclscopeRankProcessFrozenOrGone",
                'ncclscope_evidence_rank_info{state=~"gone|stopped|disk-sleep|zombie"}',
                alert=True,
                labels=(("severity", "critical"),),
                comment=(
                    "At a stall, a local rank's process was gone (died), stopped (SIGSTOP, a"
                    " debugger) or in uninterruptible sleep (a driver or file system that does"
                    " not return): the job will not move again."
                ),
                annotations=(
                    (
                        "summary",
                        "rank {{ $labels.rank }} on {{ $labels.instance }}: "
                        "process {{ $labels.state }}",
                    ),
                    (
                        "description",
                        "The agent found rank {{ $labels.rank }}'s process (pid {{ $labels.pid }})"
                        " {{ $labels.state }} while a collective waited for it. Drain or restart"
                        " the node; the job will hit its NCCL timeout.",
                    ),
                ),
            ),
            Rule(
                "NcclscopeRasRankProblem",
                'ncclscope_ras_rank_problem_info{problem=~"dead|missing|unresponsive"}',
                alert=True,
                labels=(("severity", "critical"),),
                comment="NCCL's RAS, asked at the stall, reports a rank it cannot reach.",
                annotations=(
                    (
                        "summary",
                        "NCCL RAS: rank {{ $labels.rank }} on {{ $labels.ras_host }} "
                        "{{ $labels.problem }}",
                    ),
                    (
                        "description",
                        "NCCL's RAS reports communicator {{ $labels.comm }}'s rank"
                        " {{ $labels.rank }} on {{ $labels.ras_host }} as {{ $labels.problem }}:"
                        " look at that node first.",
                    ),
                ),
            ),
            Rule(
                "NcclscopeNodeToDrain",
                "max by (job, host, reason) (ncclscope_node_fault_info)",
                alert=True,
                labels=(("severity", "warning"),),
                comment=(
                    "analyze --exclude-list's verdict, live: a node with evidence of a fault,"
                    " one alert per reason."
                ),
                annotations=(
                    ("summary", "drain {{ $labels.host }}: {{ $labels.reason }}"),
                    (
                        "description",
                        "The agents' analysis finds evidence of a fault on {{ $labels.host }}"
                        " ({{ $labels.reason }}): take it out of the next job's nodes"
                        " (ncclscope analyze --exclude-list slurm|kubectl|json on the logs).",
                    ),
                ),
            ),
        ),
        "What the agents' evidence at a stall shows (absent until a stall passes --collect-at),"
        " and the nodes their analyses would drain.",
        interval="15s",
    ),
    RuleGroup(
        "ncclscope-fabric",
        (
            *(_rec(name, expr, comment) for name, expr, comment in fabric_rules()),
            *(
                Rule(
                    name,
                    expr,
                    alert=True,
                    labels=(("severity", severity),),
                    annotations=(("summary", summary), ("description", description)),
                    comment=comment,
                )
                for name, severity, expr, summary, description, comment in fabric_alerts()
            ),
        ),
        "The cluster's own exporters joined with the agents' alerts by host"
        " (ncclscope/export/grafana/fabric.py): node_exporter's InfiniBand counters and"
        " dcgm-exporter's GPU health, recorded only where something rose, and the alerts"
        " that name a slow node's or a stall's cause. Every 15 s.",
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
    in ms (an interval not below 1 s)."""

    def repl(m: re.Match[str]) -> str:
        ms = round(int(m[2]) * _SECONDS[m[3]] * 1000 / time_scale)
        # A group evaluated more often than every second would cost a test's Prometheus
        # more than the job it watches: intervals stay at 1 s or more.
        least = 1000 if m[1] == "interval: " else 1
        return f"{m[1]}{max(ms, least)}ms{m[4]}"

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
