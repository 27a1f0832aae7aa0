"""Grafana dashboards and Prometheus rules for the agent's metrics, declared as data.

``grafana/*.json`` and ``grafana/ncclscope-rules.yml`` are rendered from this package
(``NCCLSCOPE_REGENERATE=1 .venv/bin/pytest tests/test_grafana.py`` rewrites them, and
the test fails while they differ); the same test checks every metric and label named
here against the catalog, and ``tests/test_grafana_prometheus.py`` runs every panel's
query and the rules on a real Prometheus scraping ``ncclscope replay``.

Many nodes are watched the Prometheus way (DESIGN §8): each node's agent is scraped,
and the recording rules aggregate over them by ``job`` (the scrape job: one per training
job, or one for the cluster), ``comm`` and ``rank``.  Dashboards query the raw series,
so they work before the rules are loaded; alerts use the recorded ones.  The host's name
comes from ``ncclscope_node_info{hostname}`` joined ``on (job, instance)``.

The package holds three modules: ``dashboards`` (the job and node views, and the checks'
view of their queries), ``rules`` (recording and alert rules) and ``fabric`` (the rules
and panels that join node_exporter's InfiniBand and dcgm-exporter's GPU series with the
agents' alerts by host name).  Neither the agent nor
``analyze`` imports it: it is build tooling for the files under ``grafana/``.
"""

from ncclscope.export.grafana.dashboards import (
    DASHBOARDS,
    DATASOURCE,
    MACROS,
    THROTTLE_BITS,
    Panel,
    Target,
    dashboard_json,
    job_dashboard,
    node_dashboard,
    node_view_panels,
    pcie_ratio,
    queries,
    substitute,
)
from ncclscope.export.grafana.rules import (
    PCIE_CONTENTION_RATIO,
    RULE_GROUPS,
    SLOW_NODE_MIN_S,
    SLOW_NODE_SLOWDOWN,
    STALL_TIMEOUT_SHARE,
    STRAGGLER_CRITICAL,
    TIMEOUT_CRITICAL_LEFT_S,
    Rule,
    RuleGroup,
    rules_yaml,
)

__all__ = [
    "DASHBOARDS",
    "DATASOURCE",
    "MACROS",
    "PCIE_CONTENTION_RATIO",
    "RULE_GROUPS",
    "SLOW_NODE_MIN_S",
    "SLOW_NODE_SLOWDOWN",
    "STALL_TIMEOUT_SHARE",
    "STRAGGLER_CRITICAL",
    "THROTTLE_BITS",
    "TIMEOUT_CRITICAL_LEFT_S",
    "Panel",
    "Rule",
    "RuleGroup",
    "Target",
    "dashboard_json",
    "job_dashboard",
    "node_dashboard",
    "node_view_panels",
    "pcie_ratio",
    "queries",
    "rules_yaml",
    "substitute",
]
