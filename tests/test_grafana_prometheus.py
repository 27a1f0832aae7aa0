"""The dashboards and rules on a real Prometheus scraping ``ncclscope replay``.

Debian's ``prometheus`` (``.ci/run`` installs it) is started on a free loopback port
with a temporary TSDB, a 1 s scrape and evaluation interval and ``grafana/`` rules (every
group evaluated each second, its 15 s groups too, so that each has evaluated on the
replay's series when the alert fires); the
replay of ``fixtures/stalled-227-ts`` (rank 6 never enters AllGather #30, 1800 s timeout)
at 50x, with recorded telemetry beside it, serves ``/metrics`` on another port.  Its clock
starts 800 s into the job (``--log-start``: what came before, the collectives and the
stall, goes out at once; Prometheus' first scrape comes seconds after the replay starts,
long after the stall, either way), so the collective timeout comes 20 s (real) into the
replay, 6 s after fewer than 300 s are left: the NcclscopeTimeoutImminent alert must be
firing by then, naming rank 6, after about 9 scrapes.  Then
every panel's query and every variable of both dashboards must return data, and every
rule must evaluate without error (the panels of node_exporter's and dcgm-exporter's
series are run in ``tests/test_cluster_rules.py``, where those exporters are).  An
agent following ``fixtures/inspector``'s Inspector files, scraped as a second job,
gives the bandwidth panel its data.  Locally it skips
without ``prometheus``; under CI it fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prom import free_port, get, stop, tools

from ncclscope.export.grafana import DASHBOARDS, queries, substitute
from ncclscope.export.grafana.fabric import reads_other_exporters

REPO = Path(__file__).resolve().parent.parent
LOG = REPO / "fixtures" / "stalled-227-ts" / "job.log"
TELEMETRY = REPO / "tests" / "data" / "telemetry" / "stalled-227-ts"
RULES = REPO / "grafana" / "ncclscope-rules.yml"
INSPECTOR = REPO / "fixtures" / "inspector"
SPEED = 50.0
#: The log time the replay's clock starts at (800 s into the job): the stall and what led
#: to it go out at once, the wait for the timeout is played at SPEED.
LOG_START = "2025-03-14 09:13:20"
SKIPPED_S = 800.0
#: The replay's timeout, in real seconds after its clock starts: the first waiter enters
#: AllGather #30 at 09:00:09.5 (log time), plus 1800 s, less what --log-start skips.
TIMEOUT_AT_S = (9.5 + 1800.0 - SKIPPED_S) / SPEED

pytestmark = pytest.mark.slow


def _firing(base: str, deadline: float) -> dict[str, Any] | None:
    while time.monotonic() < deadline:
        try:
            alerts = get(base, "/api/v1/alerts")["data"]["alerts"]
        # ValueError: a starting Prometheus answers 503 with a text body, not JSON
        except (urllib.error.URLError, ConnectionError, ValueError):
            alerts = []
        for alert in alerts:
            if (
                alert["labels"]["alertname"] == "NcclscopeTimeoutImminent"
                and alert["labels"].get("job") == "ncclscope"
                and alert["state"] == "firing"
            ):
                return dict(alert)
        time.sleep(0.2)
    return None


def test_dashboards_and_alerts_on_a_real_prometheus(tmp_path: Path) -> None:
    prometheus, promtool = tools()
    prom_port, replay_port, agent_port = free_port(), free_port(), free_port()
    # The rules as grafana/ has them, every group evaluated each second (four groups are
    # every 15 s: one evaluation might otherwise come only after the checks below).
    rules_text = RULES.read_text()
    assert rules_text.count("    interval: 15s\n") == 4
    rules_file = tmp_path / "ncclscope-rules.yml"
    rules_file.write_text(rules_text.replace("    interval: 15s\n", "    interval: 1s\n"))
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s, scrape_timeout: 900ms}\n"
        f"rule_files: [{json.dumps(str(rules_file))}]\n"
        "scrape_configs:\n"
        "  - job_name: ncclscope\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{replay_port}']}}]\n"
        "  - job_name: ncclscope-inspector\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{agent_port}']}}]\n"
    )
    check = subprocess.run([promtool, "check", "config", str(config)], capture_output=True)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()

    prom_log = (tmp_path / "prometheus.log").open("wb")
    replay_log = (tmp_path / "replay.log").open("wb")
    base = f"http://127.0.0.1:{prom_port}"
    # Prometheus first: its first scrape comes ~5.5 s after start whatever the interval.
    prom = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}", "--web.enable-lifecycle",
         "--storage.tsdb.retention.time=1h"],
        stdout=prom_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    replay = subprocess.Popen(
        [sys.executable, "-m", "ncclscope", "replay", str(LOG), "--telemetry", str(TELEMETRY),
         "--speed", str(SPEED), "--log-start", LOG_START,
         "--listen", f"127.0.0.1:{replay_port}", "--interval", "0.25",
         "--analyse-every", "0.5", "--linger", "60"],
        stdout=replay_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    agent_log = (tmp_path / "agent.log").open("wb")
    agent = subprocess.Popen(
        [sys.executable, "-m", "ncclscope", "agent", "--follow", str(INSPECTOR / "gpu-*.log"),
         "--from-start", "--listen", f"127.0.0.1:{agent_port}", "--interval", "0.25",
         "--analyse-every", "0.5", "--sysfs-root", "none"],
        stdout=agent_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    started = time.monotonic()
    try:
        alert = _firing(base, started + TIMEOUT_AT_S + 5)
        logs = (
            f"\n--- prometheus\n{(tmp_path / 'prometheus.log').read_text()[-3000:]}"
            f"\n--- replay\n{(tmp_path / 'replay.log').read_text()[-3000:]}"
            f"\n--- agent\n{(tmp_path / 'agent.log').read_text()[-3000:]}"
        )
        assert alert is not None, f"no firing NcclscopeTimeoutImminent{logs}"
        # Its value is the replay's seconds left when it was evaluated: before the timeout.
        assert 0 < float(alert["value"]) < 300, alert
        assert alert["labels"]["rank"] == "6", alert
        assert alert["labels"]["op"] == "AllGather"
        assert "seq" not in alert["labels"]  # a value (its text says it), not a label
        assert "(AllGather #30)" in alert["annotations"]["description"]
        assert alert["labels"]["severity"] == "critical"
        assert "rank 6" in alert["annotations"]["description"]

        problems = []
        for name in sorted(DASHBOARDS):
            dash = json.loads((REPO / "grafana" / name).read_text())
            for title, expr, _legend in queries(dash):
                if reads_other_exporters(expr):
                    continue  # node_exporter's and dcgm-exporter's: test_cluster_rules.py
                query = substitute(expr)
                answer = get(base, "/api/v1/query", query=query)
                if answer.get("status") != "success":
                    problems.append(f"{name} {title!r}: {answer.get('error')}: {query}")
                elif not answer["data"]["result"]:
                    problems.append(f"{name} {title!r}: no data: {query}")
            for v in dash["templating"]["list"]:
                if v["type"] != "query":
                    continue
                inner, _, label = v["query"].removeprefix("label_values(")[:-1].rpartition(",")
                answer = get(
                    base, f"/api/v1/label/{label.strip()}/values", **{"match[]": substitute(inner)}
                )
                if not answer.get("data"):
                    problems.append(f"{name} variable {v['name']}: no values: {v['query']}")
        assert not problems, "\n".join(problems) + logs

        groups = get(base, "/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert len(rules) == RULES.read_text().count("- record:") + RULES.read_text().count(
            "- alert:"
        )
        bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
        assert not bad, bad
        ratio = get(
            base, "/api/v1/query", query="instance_gpu:ncclscope_gpu_pcie_utilization:ratio"
        )
        assert len(ratio["data"]["result"]) == 2  # the two simulated GPUs
        assert all(0 <= float(s["value"][1]) <= 1 for s in ratio["data"]["result"])
    finally:
        # Prometheus' lifecycle endpoint, SIGTERM if that did not work.
        try:
            urllib.request.urlopen(
                urllib.request.Request(f"{base}/-/quit", method="POST"), timeout=5
            )
            prom.wait(timeout=10)
        except (urllib.error.URLError, ConnectionError, subprocess.TimeoutExpired):
            pass
        stop(prom)
        stop(replay)
        stop(agent)
        prom_log.close()
        replay_log.close()
        agent_log.close()
    assert prom.returncode == 0
    assert replay.returncode == 0
