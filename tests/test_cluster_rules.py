"""The rules and panels that join the cluster's exporters with the agents (issue #29,
"the same live"), on real components, and against a broken join.

- A real Prometheus scrapes, every second, Debian's ``prometheus-node-exporter`` on two
  nodes (its InfiniBand collector reading a sysfs tree built as the kernel lays it out,
  its uname a fully qualified ``node-a.cluster.local``), a dcgm-exporter stand-in per
  node (dcgm-exporter's names and labels, ``Hostname`` short) and an agent (``ncclscope
  replay``, the agent's live path) whose log puts both ranks on ``node-a``, with
  ``grafana/ncclscope-rules.yml`` evaluated every second.  A port of each node goes
  down: ``NcclscopeIbPortFlapping`` names node-a's port only (no job runs on node-b);
  node-a's GPU throws XID 79 and node-b's counts an uncorrectable ECC error and a
  thermal slowdown, recorded per host; every rule evaluates without error; and every
  job-view panel on node_exporter's and dcgm-exporter's series returns data.
- The join broken (each host taken whole, not by its short name; or node_exporter's
  counters not joined to its uname): ``promtool test rules`` of the shipped unit tests
  fails on each of the joined alerts, so those tests do test the join.

Locally they skip without ``prometheus``/``prometheus-node-exporter``; under CI they fail.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from cluster_env import DcgmStandIn, NodeExporter, scrape_config, wait_for
from conftest import sample_lines
from prom import Prometheus, free_port, get, need, stop, tools

from ncclscope.export.grafana import DASHBOARDS, queries, substitute
from ncclscope.export.grafana.fabric import (
    DCGM_FIELDS,
    EXTERNAL_METRICS,
    fabric_alerts,
    reads_other_exporters,
)

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "grafana" / "ncclscope-rules.yml"
RULES_TEST = REPO / "grafana" / "ncclscope-rules.test.yml"
JOINED = {name for name, *_rest in fabric_alerts()}


def _agent(log: Path, host: str, out: BinaryIO) -> tuple[subprocess.Popen[bytes], str]:
    """A real agent's live path for ``host``: ``ncclscope replay`` of the sample log with
    both ranks on ``host`` (its ``ncclscope_rank_info``), serving until stopped."""
    text = "\n".join(ln.text.replace("node-b", host).replace("node-a", host)
                     for ln in sample_lines())  # fmt: skip
    log.write_text(text + "\n")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ncclscope", "replay", str(log), "--hostname", host,
         "--speed", "100", "--linger", "600", "--listen", f"127.0.0.1:{port}"],
        stdout=out, stderr=subprocess.STDOUT,
    )  # fmt: skip
    return proc, f"127.0.0.1:{port}"


def _extend(dcgm: DcgmStandIn) -> None:
    """Every dcgm-exporter field the rules and panels read, at healthy values."""
    from prometheus_client import Gauge

    for name in DCGM_FIELDS:
        if name not in dcgm.fields and name != "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS":
            dcgm.fields[name] = Gauge(name, name, list(EXTERNAL_METRICS[name][:5]),
                                      registry=dcgm.registry)  # fmt: skip
            for g in dcgm.gpus:
                dcgm.fields[name].labels(*g).set(4 if "REASONS" in name else 0)


def _alerts(server: Prometheus, name: str) -> list[dict[str, Any]]:
    return [a for a in server.alerts() if a["labels"]["alertname"] == name]


@pytest.mark.slow
def test_joined_rules_and_panels_on_real_exporters(tmp_path: Path) -> None:
    prometheus, _promtool = tools()
    node_exporter = need("prometheus-node-exporter", "prometheus-node-exporter")
    nodes = [
        NodeExporter(node_exporter, tmp_path / h, f"{h}.cluster.local")
        for h in ("node-a", "node-b")
    ]
    dcgms = [DcgmStandIn(h) for h in ("node-a", "node-b")]
    for d in dcgms:
        _extend(d)
    agent_out = (tmp_path / "agent.out").open("wb")
    agent, agent_address = _agent(tmp_path / "job.log", "node-a", agent_out)
    rules = tmp_path / "rules.yml"
    rules.write_text(RULES.read_text().replace("    interval: 15s\n", "    interval: 1s\n"))
    config = scrape_config(
        tmp_path / "prometheus.yml",
        {"node": [n.address for n in nodes], "dcgm": [d.address for d in dcgms],
         "ncclscope": [agent_address]},
    )  # fmt: skip
    config.write_text(config.read_text().replace(
        "scrape_configs:", f"rule_files: [{json.dumps(str(rules))}]\nscrape_configs:"
    ))  # fmt: skip
    server = Prometheus(prometheus, config, tmp_path)
    try:
        assert server.ready(), server.tail()
        uname = "instance_host:ncclscope_node_exporter_uname:short"
        assert wait_for(lambda: len(server.query(uname)) == 2, 30), server.tail()
        assert {s["metric"]["host"] for s in server.query(uname)} == {"node-a", "node-b"}
        # Two scrapes of the healthy counters, then the faults.
        assert wait_for(
            lambda: (
                len(server.query("count_over_time(node_infiniband_link_downed_total[1m]) > 2")) == 4
            ),
            30,
        )
        assert not server.query("host_device_port_counter:ncclscope_ib_port_errors:increase10m")
        nodes[0].bump("mlx5_0", "link_downed", 1)
        nodes[0].bump("mlx5_0", "symbol_error", 12)
        nodes[1].bump("mlx5_1", "link_downed", 2)
        dcgms[0].set("DCGM_FI_DEV_XID_ERRORS", 1, 79)
        dcgms[1].fields["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"].labels(*dcgms[1].gpus[0]).set(1)
        dcgms[1].fields["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"].labels(*dcgms[1].gpus[0]).set(0x44)

        # The alert's text is drawn again at each evaluation: the XID shows once the GPU's
        # scrape, whenever in the second it falls, has reached its recording rule.
        def flapping_with_xid() -> bool:
            return any("XID 79" in a["annotations"]["description"]
                       for a in _alerts(server, "NcclscopeIbPortFlapping"))  # fmt: skip

        assert wait_for(flapping_with_xid, 30), (_alerts(server, "NcclscopeIbPortFlapping"),
                                                 server.tail())  # fmt: skip
        flapping = _alerts(server, "NcclscopeIbPortFlapping")
        assert [(a["labels"]["host"], a["labels"]["device"]) for a in flapping] == [
            ("node-a", "mlx5_0")
        ]
        text = flapping[0]["annotations"]["description"]
        assert "ranks of job ncclscope run on the node" in text
        assert "mlx5_0 port 1 symbol_error_total +" in text
        assert "Its GPUs' XIDs: GPU 1 XID 79;" in text

        def recorded(expr: str) -> dict[tuple[str, ...], float]:
            return {
                tuple(s["metric"].get(k, "") for k in ("host", "gpu", "field")): float(
                    s["value"][1]
                )
                for s in server.query(expr)
            }

        assert wait_for(
            lambda: (
                recorded("host:ncclscope_dcgm_gpu_faults:count15m")
                == {("node-a", "", ""): 1.0, ("node-b", "", ""): 1.0}
            ),
            15,
        ), recorded("host:ncclscope_dcgm_gpu_faults:count15m")
        assert recorded("host_gpu:ncclscope_dcgm_xid:max15m") == {("node-a", "1", ""): 79.0}
        errors = recorded("host_gpu_field:ncclscope_dcgm_gpu_errors:increase15m")
        assert set(errors) == {("node-b", "0", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")}
        assert recorded("host_gpu:ncclscope_dcgm_clocks_event_reasons:hw_slowdown") == {
            ("node-b", "0", ""): 64.0  # 0x44: the HW thermal bit (0x40)
        }

        rules_now = [r for g in get(server.base, "/api/v1/rules")["data"]["groups"]
                     for r in g["rules"]]  # fmt: skip
        bad = [(r["name"], r.get("lastError")) for r in rules_now if r["health"] != "ok"]
        assert not bad, bad

        problems = []
        for name in sorted(DASHBOARDS):
            dash = json.loads((REPO / "grafana" / name).read_text())
            for title, expr, _legend in queries(dash):
                if not reads_other_exporters(expr):
                    continue
                answer = get(server.base, "/api/v1/query", query=substitute(expr))
                if answer.get("status") != "success":
                    problems.append(f"{title!r}: {answer.get('error')}: {substitute(expr)}")
                elif not answer["data"]["result"]:
                    problems.append(f"{title!r}: no data: {substitute(expr)}")
                else:
                    hosts = {s["metric"].get("host") for s in answer["data"]["result"]}
                    assert hosts <= {"node-a", "node-b"}, (title, hosts)
        assert not problems, "\n".join(problems)
    finally:
        server.close()
        for n in nodes:
            n.close()
        for d in dcgms:
            d.close()
        stop(agent)
        agent_out.close()


#: Ways to break the join, each with the joined alerts whose unit tests must then fail.
BREAKS = {
    # Each host taken whole: node-2.cluster.local is no longer node-2.
    "whole host names": ('"([^.]+).*"', '"(.+)"', JOINED),
    # node_exporter's counters not joined to its uname: no host on any port.
    "ports without their host": (
        "* on (instance) group_left (host) instance_host:ncclscope_node_exporter_uname:short",
        "",
        {"NcclscopeSlowNodeFabric", "NcclscopeStallFabric", "NcclscopeIbPortFlapping"},
    ),
}


@pytest.mark.parametrize("how", sorted(BREAKS))
def test_unit_tests_fail_when_the_join_is_broken(tmp_path: Path, how: str) -> None:
    _prometheus, promtool = tools()
    old, new, failing = BREAKS[how]
    text = RULES.read_text()
    assert old in text
    (tmp_path / "ncclscope-rules.yml").write_text(text.replace(old, new))
    (tmp_path / "ncclscope-rules.test.yml").write_text(RULES_TEST.read_text())
    ran = subprocess.run(
        [promtool, "test", "rules", str(tmp_path / "ncclscope-rules.test.yml")],
        capture_output=True,
        text=True,
    )
    assert ran.returncode != 0
    failed = set(re.findall(r"alertname: (\w+), time", ran.stdout + ran.stderr))
    assert failing <= failed, (failing - failed, ran.stdout[-3000:])
