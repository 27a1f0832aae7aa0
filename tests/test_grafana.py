"""The dashboards and rules in ``grafana/`` against the metric catalog, statically.

The files are rendered from ``ncclscope/export/grafana/``; regenerate them with
``NCCLSCOPE_REGENERATE=1 .venv/bin/pytest tests/test_grafana.py`` after checking the
diff.  The promtool checks skip where Debian's ``prometheus`` package is missing and
fail under CI (``.ci/run`` installs it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ncclscope.catalog import by_name
from ncclscope.export.grafana import (
    DASHBOARDS,
    RULE_GROUPS,
    dashboard_json,
    queries,
    rules_yaml,
    substitute,
)
from ncclscope.export.grafana.fabric import EXTERNAL_METRICS

REPO = Path(__file__).resolve().parent.parent
GRAFANA = REPO / "grafana"
RULES = GRAFANA / "ncclscope-rules.yml"
RULES_TEST = GRAFANA / "ncclscope-rules.test.yml"

#: Labels Prometheus adds to every scraped series.
TARGET_LABELS = frozenset({"job", "instance"})
#: Series Prometheus makes itself.
BUILTIN = {"up": frozenset()}
#: PromQL words that look like names.
KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
     "bool", "offset", "inf", "nan"}
)  # fmt: skip
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\{([^}]*)\}")
_NAME = re.compile(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?!\w)(\s*\()?")
#: label_replace's destination label (followed by its replacement, source and regex).
_REPLACED = re.compile(r'"(\w+)",\s*"[^"]*",\s*"\w*",\s*"[^"]*"\)')


def created(expr: str) -> set[str]:
    """The labels ``expr``'s label_replace calls create."""
    return set(_REPLACED.findall(expr))


def _label_names(text: str) -> set[str]:
    return {x.strip() for x in text.split(",") if x.strip()}


def parse(expr: str) -> tuple[set[str], list[tuple[str, set[str]]], set[str]]:
    """A PromQL expression's metric names, its selectors' ``(name, matcher labels)`` and
    the labels its grouping clauses name (a parser for what our expressions use)."""
    # A selector by name alone, ``{__name__=~"A|B"}``: the metrics it names.
    expr = re.sub(r'\{__name__=~"([\w|]+)"\}', lambda m: f"({' or '.join(m[1].split('|'))})", expr)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    selectors = [
        (m.group(1) or "", {x.split("=")[0].rstrip("!~ ").strip() for x in m.group(2).split(",")})
        for m in _SELECTOR.finditer(text)
    ]
    selectors = [(name, labels - {""}) for name, labels in selectors]
    grouped = set().union(*(_label_names(m.group(2)) for m in _GROUPING.finditer(text)))
    text = _GROUPING.sub(" ", text)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    names = {
        m.group(1)
        for m in _NAME.finditer(text)
        if m.group(2) is None and m.group(1).lower() not in KEYWORDS
    }
    return names, selectors, grouped


def _recorded() -> dict[str, frozenset[str]]:
    """Recording rules' names -> the labels they can carry (their inputs')."""
    known = _known_base()
    out: dict[str, frozenset[str]] = {}
    # Until nothing changes: a group may read what a later group records.
    while True:
        before = dict(out)
        for group in RULE_GROUPS:
            for rule in group.rules:
                if not rule.alert:
                    names, _sel, _grouped = parse(rule.expr)
                    labels: set[str] = set(TARGET_LABELS) | created(rule.expr)
                    for name in names:
                        labels |= out.get(name) or known.get(name) or frozenset()
                    out[rule.name] = frozenset(labels)
        if out == before:
            return out


def _known_base() -> dict[str, frozenset[str]]:
    catalog = {m.exposed: frozenset(m.labels) | TARGET_LABELS for m in by_name().values()}
    # Other exporters' series the fabric rules and panels join (node_exporter,
    # dcgm-exporter, Prometheus' ALERTS), with the labels they carry.
    external = {k: frozenset(v) | TARGET_LABELS for k, v in EXTERNAL_METRICS.items()}
    return {**catalog, **external, **{k: v | TARGET_LABELS for k, v in BUILTIN.items()}}


def _known() -> dict[str, frozenset[str]]:
    return {**_known_base(), **_recorded()}


def _check(
    expr: str, known: dict[str, frozenset[str]], *, shown: set[str] | None = None
) -> list[str]:
    """What is wrong with ``expr``: unknown names, labels its metrics lack (in
    selectors, grouping, or ``shown``: legends and annotations)."""
    names, selectors, grouped = parse(expr)
    problems = [f"{n} is neither in the catalog nor a recording rule" for n in names - set(known)]
    available: set[str] = set(TARGET_LABELS) | created(expr) | {"__name__"}
    for n in names & set(known):
        available |= known[n]
    for name, labels in selectors:
        allowed = known.get(name, frozenset()) if name else frozenset()
        problems += [f"{name} has no label {x}" for x in sorted(labels - allowed)]
    problems += [f"no metric of it has label {x}" for x in sorted(grouped - available)]
    problems += [f"shows label {x}, which it has not" for x in sorted((shown or set()) - available)]
    return [f"{p}: {expr}" for p in problems]


def test_the_parser_finds_names_and_labels() -> None:
    names, selectors, grouped = parse(
        'max by (comm, rank) (rate(ncclscope_collective_seq{job=~"$job", rank!="a,b"}[1m]))'
        " * on (job, instance) group_left (hostname) ncclscope_node_info"
    )
    assert names == {"ncclscope_collective_seq", "ncclscope_node_info"}
    assert selectors == [("ncclscope_collective_seq", {"job", "rank"})]
    assert grouped == {"comm", "rank", "job", "instance", "hostname"}
    bad = _check('sum by (gpu) (ncclscope_host_swap_used_bytes{rank="1"}) + nope', _known())
    assert len(bad) == 3


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_file_is_rendered_from_the_module(name: str) -> None:
    path = GRAFANA / name
    text = dashboard_json(name)
    if os.environ.get("NCCLSCOPE_REGENERATE"):
        path.write_text(text)
    assert path.read_text() == text, "run with NCCLSCOPE_REGENERATE=1 after checking the diff"


def test_rules_file_is_rendered_from_the_module() -> None:
    text = rules_yaml()
    if os.environ.get("NCCLSCOPE_REGENERATE"):
        RULES.write_text(text)
    assert RULES.read_text() == text, "run with NCCLSCOPE_REGENERATE=1 after checking the diff"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_is_provisionable(name: str) -> None:
    dash = json.loads((GRAFANA / name).read_text())
    assert dash["uid"]
    assert dash["title"]
    assert "id" not in dash  # provisioning assigns ids
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource"
    assert ds["query"] == "prometheus"
    assert {"job", "host"} <= set(variables)
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
    assert json.dumps(dash).count("${datasource}") >= len(dash["panels"])


def test_the_views_show_what_the_issue_asks() -> None:
    job = {t for t, _e, _l in queries(json.loads((GRAFANA / "ncclscope-job.json").read_text()))}
    node = json.loads((GRAFANA / "ncclscope-node.json").read_text())
    exprs = " ".join(e for _t, e, _l in queries(node))
    assert {"Findings", "Seconds left before the collective timeout", "Waiting for (the culprit)",
            "Straggler score per rank", "Arrival lateness per rank",
            "Collectives per second"} <= job  # fmt: skip
    for name in ("gpu_memory_used_bytes", "gpu_pcie_link_max_bytes_per_second",
                 "gpu_clocks_event_reasons", "host_memory_available_bytes",
                 "host_swap_used_bytes", "scrape_collector_success"):  # fmt: skip
        assert f"ncclscope_{name}" in exprs
    assert "up{" in exprs
    # The job's ports and GPU health beside the collectives (issue #29).
    job_exprs = " ".join(
        e for _t, e, _l in queries(json.loads((GRAFANA / "ncclscope-job.json").read_text()))
    )
    for name in ("node_infiniband_symbol_error_total", "node_infiniband_link_downed_total",
                 "node_infiniband_port_transmit_wait_total", "node_infiniband_state_id",
                 "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                 "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
                 "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"):  # fmt: skip
        assert name in job_exprs, name
    # joined to the job's hosts by name: node_exporter's uname, dcgm-exporter's Hostname
    assert '"nodename"' in job_exprs
    assert '"Hostname"' in job_exprs
    heatmap = [p for p in json.loads((GRAFANA / "ncclscope-job.json").read_text())["panels"]
               if p["type"] == "heatmap"]  # fmt: skip
    assert len(heatmap) == 1


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_queries_name_catalog_metrics_and_labels(name: str) -> None:
    dash = json.loads((GRAFANA / name).read_text())
    known = _known()
    problems = []
    for _title, expr, legend in queries(dash):
        problems += _check(expr, known, shown=set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)))
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", v["query"])
            assert m, v["query"]
            problems += _check(m.group(1), known)
            metric = parse(m.group(1))[0].pop()
            if m.group(2) not in known[metric]:
                problems.append(f"{metric} has no label {m.group(2)}")
    assert not problems, "\n".join(problems)


def test_rules_name_catalog_metrics_and_labels() -> None:
    known = _known()
    problems = []
    for group in RULE_GROUPS:
        for rule in group.rules:
            annotations = " ".join(v for _k, v in rule.annotations)
            shown = set(re.findall(r"\$labels\.(\w+)", annotations))
            problems += _check(rule.expr, known, shown=shown)
    assert not problems, "\n".join(problems)


def test_rule_names_follow_the_convention() -> None:
    for group in RULE_GROUPS:
        for rule in group.rules:
            if rule.alert:
                assert re.fullmatch(r"Ncclscope[A-Z][A-Za-z]+", rule.name)
                assert dict(rule.labels)["severity"] in {"warning", "critical"}
                assert {"summary", "description"} <= dict(rule.annotations).keys()
            else:
                level, metric, _ops = rule.name.split(":")
                assert re.fullmatch(r"[a-z_]+", level)
                assert metric.startswith("ncclscope_")


def test_every_alert_has_a_promtool_unit_test() -> None:
    tested = set(re.findall(r"alertname:\s*(\w+)", RULES_TEST.read_text()))
    alerts = {r.name for g in RULE_GROUPS for r in g.rules if r.alert}
    assert alerts == tested
    assert {"NcclscopeTimeoutImminent", "NcclscopeStraggler", "NcclscopePcieContention",
            "NcclscopeAgentDown"} <= alerts  # fmt: skip


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: .ci/run installs the prometheus package")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return path


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = _promtool()
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(
        [promtool, "test", "rules", str(RULES_TEST)], capture_output=True, text=True
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_promtool_parses_every_panel_query(tmp_path: Path) -> None:
    """Without a server: each query, as Grafana sends it, wrapped as a recording rule."""
    promtool = _promtool()
    lines = ["groups:", "  - name: dashboards", "    rules:"]
    for name in sorted(DASHBOARDS):
        for _title, expr, _legend in queries(json.loads((GRAFANA / name).read_text())):
            lines += [f"      - record: dashboard:query{len(lines)}",
                      f"        expr: {json.dumps(substitute(expr))}"]  # fmt: skip
    rules = tmp_path / "dashboards.yml"
    rules.write_text("\n".join(lines) + "\n")
    check = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_promtool_accepts_the_example_config() -> None:
    promtool = _promtool()
    check = subprocess.run(
        [promtool, "check", "config", str(GRAFANA / "prometheus-example.yml")],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "1 rule files found" in check.stdout + check.stderr


def test_provisioning_examples_point_at_the_dashboards() -> None:
    provider = (GRAFANA / "provisioning" / "dashboards" / "ncclscope.yml").read_text()
    assert "apiVersion: 1" in provider
    assert "type: file" in provider
    datasource = (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    assert "type: prometheus" in datasource
    readme = (GRAFANA / "README.md").read_text()
    for name in [*DASHBOARDS, RULES.name, RULES_TEST.name, "prometheus-example.yml"]:
        assert name in readme


def test_every_alert_is_documented() -> None:
    readme = (GRAFANA / "README.md").read_text()
    alerts = {r.name for g in RULE_GROUPS for r in g.rules if r.alert}
    assert not {a for a in alerts if f"| `{a}` |" not in readme}
