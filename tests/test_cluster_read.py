"""``analyze --prometheus`` (issue #29): reading the cluster's Prometheus for the job's
hosts and window, bounded and never fatal.

A fake Prometheus (``cluster_env.FakeProm``) answers as an odd one would: unreachable,
slow, an error document, warnings, garbage, too many series, labels spelled otherwise.
Then real components: Debian's node_exporter on a sysfs tree built here and a
dcgm-exporter stand-in, scraped every second by a real Prometheus while the test raises
a port's error counters and sets a GPU's XID; ``analyze --prometheus`` must find them.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner, Result
from cluster_env import (
    DcgmStandIn,
    FakeProm,
    NodeExporter,
    scrape_config,
    stamped_log,
    wait_for,
)
from conftest import sample_lines, write_sample
from prom import Prometheus, free_port, need, stop, tools

from ncclscope.catalog import by_name
from ncclscope.cli import cli
from ncclscope.cluster.hosts import HostMatcher, instance_host, map_instances
from ncclscope.cluster.prometheus import PromClient
from ncclscope.cluster.read import AGENT_DENSE, AGENT_STATIC, QUERIES, read_cluster, step_for
from ncclscope.schema import GPU_SAMPLES_SCHEMA, PORT_SAMPLES_SCHEMA, TELEMETRY_SCHEMA

HOSTS = ["node-a", "node-b"]
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=20)


@pytest.fixture
def fake() -> Any:
    servers: list[FakeProm] = []

    def make(**kw: Any) -> FakeProm:
        servers.append(FakeProm(**kw))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def _status(client: PromClient) -> dict[str, str]:
    return {a.what: a.status for a in client.asks}


# ----------------------------------------------------------------------------- reading


def test_a_healthy_answer_fills_every_table(fake: Any) -> None:
    prom = fake()
    client = PromClient(prom.url)
    t = read_cluster(client, HOSTS, T0, T1)
    assert set(_status(client).values()) == {"ok"}
    assert len(client.asks) <= 10
    assert t.step_s == 15.0
    assert t.ports.schema == PORT_SAMPLES_SCHEMA
    assert t.gpus.schema == GPU_SAMPLES_SCHEMA
    assert t.telemetry.schema == TELEMETRY_SCHEMA
    sym = t.ports.filter(metric="symbol_error_total")
    assert sym["host"].unique().to_list() == ["node-a"]
    assert sym["kind"].unique().to_list() == ["increase"]
    assert sym["value"].sum() == 8
    rates = t.ports.filter(kind="rate_per_s")
    assert set(rates["metric"]) == {"port_transmit_wait_total", "port_data_transmitted_bytes_total"}
    assert set(t.ports.filter(metric="rate_bytes_per_second")["host"]) == set(HOSTS)
    assert t.ports.filter(metric="state_id")["host"].to_list() == ["node-b"]
    xid = t.gpus.filter(metric="DCGM_FI_DEV_XID_ERRORS")
    assert xid["host"].unique().to_list() == ["node-b"]
    assert set(xid["value"]) == {79.0}
    assert xid["uuid"][0] == "GPU-0b"
    # The agent's series as --telemetry gives them: catalog label order.
    used = t.telemetry.filter(metric="ncclscope_gpu_memory_used_bytes")
    assert set(used["host"]) == set(HOSTS)
    assert set(used["labels"]) == {"0,GPU-0a,00000000:18:00.0"}
    assert not t.telemetry.filter(metric="ncclscope_gpu_memory_total_bytes").is_empty()
    # NaN and +Inf are dropped and counted.
    assert client.nonfinite == 4
    assert any("4 NaN or infinite" in p for p in t.problems)
    inst = t.instances
    assert set(inst.filter(pl_host_not_null(inst))["how"]) == {"uname", "dcgm", "agent"}
    assert "other-1:9100" in inst["instance"].to_list()
    assert any("10.9.9.9:9100" in p for p in t.problems)


def pl_host_not_null(frame: Any) -> Any:
    return frame["host"].is_not_null()


def test_unreachable_is_said_once_and_nothing_more_is_asked() -> None:
    client = PromClient(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    t = read_cluster(client, HOSTS, T0, T1)
    assert [a.status for a in client.asks] == ["unreachable"]  # nothing after it asked
    assert t.ports.is_empty()
    assert t.instances.is_empty()
    assert "unreachable at identity" in t.problems[0]


def test_not_an_http_url_is_not_opened() -> None:
    client = PromClient("file:///etc/passwd")
    t = read_cluster(client, HOSTS, T0, T1)
    assert [a.status for a in client.asks] == ["unreachable"]
    assert "not an http(s) URL" in (client.asks[0].message or "")
    assert t.instances.is_empty()


def test_a_slow_prometheus_times_out_and_stops_the_read(fake: Any) -> None:
    """Every query after the identities slow: the first few (in flight together: where
    the counters moved, and the first dense queries) time out, the rest are not asked;
    what came before (the instances) is kept."""
    prom = fake(modes={"*": "slow", "identity": "ok"}, delay_s=3.0)
    client = PromClient(prom.url, timeout_s=0.4)
    t = read_cluster(client, HOSTS, T0, T1)
    # The queries in flight together when the first timed out (one to three, however
    # busy the machine) time out; none after them is asked.
    got = [(a.what, a.status) for a in client.asks]
    assert got[0] == ("identity", "ok")
    assert 1 <= len(got) - 1 <= 3, got
    assert [w for w, _s in got[1:]] == ["changed", "ports_rates", "ports_state"][: len(got) - 1]
    assert {s for _w, s in got[1:]} == {"timeout"}, got
    assert set(t.instances["host"].drop_nulls()) == set(HOSTS)
    assert any("timeout at changed" in p for p in t.problems)
    assert any(p.startswith("not asked: ") and "gpus_events" in p for p in t.problems)


def test_a_clean_fabric_is_not_asked_for_its_counters_rises(fake: Any) -> None:
    """Where no error counter moved in the window, the dense rises are not asked (they
    cost the most), and that is no problem: the ports are measured and clean."""
    prom = fake(clean=True)
    client = PromClient(prom.url)
    t = read_cluster(client, HOSTS, T0, T1)
    asked = [a.what for a in client.asks]
    assert asked[:2] == ["identity", "changed"]
    assert "ports_errors" not in asked
    assert "gpus_events" not in asked
    assert not any("not asked" in p for p in t.problems), t.problems
    assert t.ports.filter(kind="increase").is_empty()
    assert not t.ports.filter(kind="rate_per_s").is_empty()
    moved = read_cluster(PromClient(fake().url), HOSTS, T0, T1)
    assert not moved.ports.filter(kind="increase").is_empty()


def test_one_slow_query_times_out_and_the_rest_is_read(fake: Any) -> None:
    prom = fake(modes={"ports_rates": "slow"}, delay_s=3.0)
    client = PromClient(prom.url, timeout_s=0.4)
    t = read_cluster(client, HOSTS, T0, T1)
    assert _status(client)["ports_rates"] == "timeout"
    assert not t.ports.filter(metric="symbol_error_total").is_empty()  # what came is kept
    assert t.ports.filter(kind="rate_per_s").is_empty()


def test_prometheus_timeout_parameter_is_sent_and_its_timeout_document_read(fake: Any) -> None:
    prom = fake(modes={"gpus_gauges": "timeout_doc"})
    client = PromClient(prom.url, timeout_s=7)
    t = read_cluster(client, HOSTS, T0, T1)
    assert _status(client)["gpus_gauges"] == "timeout"
    order = [q.what for q in QUERIES]
    asked = [a.what for a in client.asks if a.what in order]
    assert asked == sorted(asked, key=order.index)  # asks in the read's order
    assert not t.gpus.filter(metric="DCGM_FI_DEV_XID_ERRORS").is_empty()
    assert prom.timeouts == {"7s"}


def test_an_error_document_is_an_error_ask_and_the_rest_is_read(fake: Any) -> None:
    prom = fake(modes={"ports_errors": "error"})
    client = PromClient(prom.url)
    t = read_cluster(client, HOSTS, T0, T1)
    ask = next(a for a in client.asks if a.what == "ports_errors")
    assert ask.status == "error"
    assert ask.message is not None
    assert "bad_data: parse error" in ask.message
    assert t.ports.filter(kind="increase").is_empty()
    assert not t.ports.filter(kind="rate_per_s").is_empty()
    assert _status(client)["agent_static"] == "ok"


def test_warnings_make_a_partial_answer_that_is_kept(fake: Any) -> None:
    prom = fake(modes={"ports_rates": "warnings"})
    client = PromClient(prom.url)
    t = read_cluster(client, HOSTS, T0, T1)
    ask = next(a for a in client.asks if a.what == "ports_rates")
    assert ask.status == "partial"
    assert "partial data" in (ask.message or "")
    assert not t.ports.filter(kind="rate_per_s").is_empty()


@pytest.mark.parametrize("what", ["identity", "agent"])
def test_garbage_is_a_malformed_answer(fake: Any, what: str) -> None:
    prom = fake(modes={what: "garbage"})
    client = PromClient(prom.url)
    t = read_cluster(client, HOSTS, T0, T1)
    ask = next(a for a in client.asks if a.what == what)
    assert ask.status == "error"
    assert "malformed answer: not JSON" in (ask.message or "")
    if what == "identity":  # no instance known: nothing more asked, said
        assert len(client.asks) == 1
        assert any("no scraped instance could be matched" in p for p in t.problems)
    else:
        assert t.telemetry.filter(metric="ncclscope_gpu_memory_used_bytes").is_empty()


def test_too_many_series_are_cut_at_the_limit(fake: Any) -> None:
    prom = fake(modes={"ports_rates": "many"}, many=50)
    client = PromClient(prom.url, max_series=10)
    read_cluster(client, HOSTS, T0, T1)
    ask = next(a for a in client.asks if a.what == "ports_rates")
    assert (ask.status, ask.series) == ("truncated", 10)
    assert "40 series past the limit of 10" in (ask.message or "")


def test_labels_spelled_otherwise(fake: Any) -> None:
    """Instances by IP address, names in upper case with a domain, dcgm-exporter without
    its Hostname label: the exporters' own names match (short, case-insensitive); the
    IP-only instances are listed, never guessed."""
    prom = fake(relabelled=True)
    client = PromClient(prom.url)
    t = read_cluster(client, HOSTS, T0, T1)
    matched = t.instances.filter(t.instances["host"].is_not_null())
    assert sorted(zip(matched["instance"], matched["how"], matched["host"], strict=True)) == [
        ("10.0.0.1:9100", "uname", "node-a"),
        ("10.0.0.1:9477", "agent", "node-a"),
        ("10.0.0.2:9100", "uname", "node-b"),
        ("10.0.0.2:9477", "agent", "node-b"),
    ]
    assert set(t.ports["host"]) == set(HOSTS)
    line = next(p for p in t.problems if "matched no log host" in p)
    assert "10.0.0.1:9400" in line
    assert "IP addresses are never matched" in line
    assert t.gpus.is_empty()
    assert any("no dcgm-exporter GPU series" in p for p in t.problems)


def test_host_matching() -> None:
    match = HostMatcher(["node-a", "Node-B", "10.0.0.3"])
    assert match("NODE-A.cluster.local") == "node-a"
    assert match("node-b") == "Node-B"
    assert match("10.0.0.3") is None
    assert match("") is None
    assert match(None) is None
    assert instance_host("[fe80::1]:9100") == "fe80::1"
    frame = map_instances(
        [
            {"__name__": "up", "instance": "dgx001:9100", "job": "node"},
            {"__name__": "node_uname_info", "instance": "10.1.1.1:9100", "job": "node",
             "nodename": "dgx002"},
            {"__name__": "DCGM_FI_DEV_GPU_TEMP", "instance": "10.1.1.1:9400", "job": "dcgm",
             "Hostname": "dgx002"},
            # dcgm-exporter since its May 2026 rename (NVIDIA/dcgm-exporter#655)
            {"__name__": "DCGM_FI_DEV_XID_ERRORS", "instance": "10.1.1.3:9400",
             "job": "dcgm", "hostname": "dgx003.cluster.local"},
            {"__name__": "up", "instance": "10.1.1.9:9100", "job": "node"},
        ],
        ["dgx001", "dgx002", "dgx003"],
    )  # fmt: skip
    rows = {r["instance"]: (r["host"], r["how"]) for r in frame.iter_rows(named=True)}
    assert rows == {
        "dgx001:9100": ("dgx001", "instance"),
        "10.1.1.1:9100": ("dgx002", "uname"),
        "10.1.1.1:9400": ("dgx002", "dcgm"),
        "10.1.1.3:9400": ("dgx003", "dcgm"),
        "10.1.1.9:9100": (None, "instance"),
    }


def test_requests_stay_few_whatever_the_job_size(fake: Any) -> None:
    hosts = tuple(f"dgx{k:03d}" for k in range(128))
    prom = fake(hosts=hosts)
    client = PromClient(prom.url)
    t = read_cluster(client, list(hosts), T0, T0 + timedelta(hours=6))
    assert t.step_s == 90.0
    assert len(client.asks) <= 20
    assert set(t.instances["host"].drop_nulls()) == set(hosts)
    assert not t.ports.is_empty()
    assert step_for(T0, T0 + timedelta(days=3)) == 300.0
    assert step_for(T0, T0 + timedelta(minutes=1)) == 15.0


def test_the_agent_series_read_are_catalog_names() -> None:
    catalog = by_name()
    assert all(name in catalog for name in (*AGENT_DENSE, *AGENT_STATIC))


# ----------------------------------------------------------------------------- CLI


def _run(args: list[str]) -> Result:
    return CliRunner().invoke(cli, ["analyze", *args, "--no-progress"])


def test_analyze_joins_the_cluster(fake: Any, tmp_path: Path) -> None:
    log = stamped_log(tmp_path / "job.log", T0 + timedelta(minutes=7))
    prom = fake()
    plain = _run([str(log)])
    text = _run([str(log), "--prometheus", prom.url])
    assert text.exit_code == plain.exit_code, text.output
    out = text.stdout
    assert "CLUSTER (Prometheus " + prom.url in out
    # the agents' clock, the identities, where counters moved, 8 range queries
    assert "11 requests" in out
    assert "node-a mlx5_0 port 1: link_error_recovery_total +1, symbol_error_total +8" in out
    assert "node-b gpu 0: XID 79" in out
    assert "TELEMETRY" in out  # the agent's series from Prometheus, as --telemetry's
    doc = json.loads(_run([str(log), "--prometheus", prom.url, "--format", "json"]).stdout)
    c = doc["cluster"]
    assert c["requests"] == 11
    assert {a["status"] for a in c["asks"]} == {"ok"}
    assert c["start"] == "2026-03-01T12:02:01+00:00"  # the first COLL line, 5 min earlier
    port = next(p for p in c["ports"] if p["host"] == "node-a")
    assert port["errors"] == {"link_error_recovery_total": 1.0, "symbol_error_total": 8.0}
    assert port["capacity_bytes_per_second"] == 2.5e10
    assert next(p for p in c["ports"] if p["host"] == "node-b")["not_active_samples"] == 1
    assert c["gpus"] == [
        {"host": "node-b", "gpu": "0", "uuid": "GPU-0b", "errors": {}, "xids": [79],
         "clocks_event_reasons": None},
    ]  # fmt: skip
    assert c["telemetry_samples"] > 0
    assert json.loads(plain_json(log))["cluster"] is None


def plain_json(log: Path) -> str:
    return _run([str(log), "--format", "json"]).stdout


@pytest.mark.parametrize("mode", ["unreachable", "slow", "garbage"])
def test_a_broken_prometheus_changes_nothing_else(fake: Any, tmp_path: Path, mode: str) -> None:
    log = stamped_log(tmp_path / "job.log", T0)
    if mode == "unreachable":
        url = f"http://127.0.0.1:{free_port()}"
    else:
        url = fake(modes={"*": mode}, delay_s=2.0).url
    args = [str(log), "--format", "json"]
    plain = _run(args)
    got = _run([*args, "--prometheus", url, "--prometheus-timeout", "0.3"])
    assert got.exit_code == plain.exit_code, got.output
    a, b = json.loads(plain.stdout), json.loads(got.stdout)
    cluster = b.pop("cluster")
    a.pop("cluster")
    for f in b["findings"]:  # where a finding says what the cluster's counters were
        f["evidence"].pop("cluster", None)
    assert a == b  # the logs' analysis, findings included, unchanged
    status = {"unreachable": "unreachable", "slow": "timeout", "garbage": "error"}[mode]
    # The first request (the agents' clock) stops the read where Prometheus is down or
    # slow; an error answer (an old Prometheus without last_over_time) goes on.
    asked = [(x["what"], x["status"]) for x in cluster["asks"]]
    if mode == "garbage":
        assert asked == [("zone", status), ("identity", status)]
    else:
        assert asked == [("zone", status)]
    assert cluster["problems"]
    text = _run([str(log), "--prometheus", url, "--prometheus-timeout", "0.3"]).stdout
    assert f"--prometheus {url}: zone {status}" in got.stderr
    assert f"zone          {status}" in text
    assert "problem: " in text


def test_the_clock_the_agents_learned_sets_the_window(fake: Any, tmp_path: Path) -> None:
    """NCCL stamps local time without a zone: logs stamped from 12:00 on nodes whose
    agents learned UTC+9 were written from 03:00 UTC.  Their zone is asked first, over
    every hour they could have been written in; the logs are read again in it and the
    cluster over their true window, as ``--log-tz +09:00`` would."""
    log = stamped_log(tmp_path / "job.log", T0)  # 12:00 as the logs print it
    prom = fake(offset_s=9 * 3600)
    doc = json.loads(_run([str(log), "--prometheus", prom.url, "--format", "json"]).stdout)
    job, c = doc["job"], doc["cluster"]
    assert (job["log_zone"], job["log_zone_source"]) == ("+09:00", "telemetry")
    assert c["asks"][0]["what"] == "zone"
    assert c["start"] == "2026-03-01T02:55:01+00:00", c["start"]  # 9 h, 5 min before
    given = [str(log), "--format", "json", "--log-tz", "+09:00"]
    doc_given = json.loads(_run([*given, "--prometheus", prom.url]).stdout)
    assert doc_given["cluster"]["asks"][0]["what"] == "identity"  # a zone given: not asked
    assert doc_given["cluster"]["start"] == c["start"]
    assert [f["message"] for f in doc["findings"]] == [f["message"] for f in doc_given["findings"]]
    text = _run([str(log), "--prometheus", prom.url]).stdout
    assert "times read as +09:00 (learned by the agent" in text


def test_agents_that_learned_utc_confirm_it(fake: Any, tmp_path: Path) -> None:
    log = stamped_log(tmp_path / "job.log", T0)
    doc = json.loads(
        _run([str(log), "--prometheus", fake(offset_s=0).url, "--format", "json"]).stdout
    )
    assert (doc["job"]["log_zone"], doc["job"]["log_zone_source"]) == ("UTC", "telemetry")
    assert doc["cluster"]["start"] == "2026-03-01T11:55:01+00:00"
    doc = json.loads(_run([str(log), "--prometheus", fake().url, "--format", "json"]).stdout)
    assert (doc["job"]["log_zone"], doc["job"]["log_zone_source"]) == ("UTC", "assumed")


def test_agents_that_disagree_change_nothing_and_say_so(tmp_path: Path) -> None:
    log = stamped_log(tmp_path / "job.log", T0)
    prom = FakeProm(offset_s=9 * 3600)
    zone = prom.zone

    def split(params: dict[str, list[str]]) -> list[dict[str, Any]]:
        got = zone(params)
        got[0]["value"][1] = "-18000"  # node-a's agent learned UTC-5
        return got

    prom.zone = split  # type: ignore[method-assign]
    try:
        doc = json.loads(_run([str(log), "--prometheus", prom.url, "--format", "json"]).stdout)
    finally:
        prom.close()
    assert doc["job"]["log_zone_source"] == "assumed"
    assert doc["cluster"]["start"] == "2026-03-01T11:55:01+00:00"
    said = [p for p in doc["cluster"]["problems"] if "different clocks" in p]
    assert said
    assert "node-a UTC-5 h" in said[0]
    assert "node-b UTC+9 h" in said[0]


@pytest.mark.parametrize("offset_s", [1e9, -5e4, 1234.5])
def test_an_offset_no_zone_has_is_said_not_applied(
    fake: Any, tmp_path: Path, offset_s: float
) -> None:
    """A damaged or foreign ``ncclscope_log_utc_offset_seconds`` (past a day, past
    UTC-12, not a quarter hour) is no clock: said, the logs read as before."""
    log = stamped_log(tmp_path / "job.log", T0)
    got = _run([str(log), "--prometheus", fake(offset_s=offset_s).url, "--format", "json"])
    assert got.exit_code == 0, got.output
    doc = json.loads(got.stdout)
    assert doc["job"]["log_zone_source"] == "assumed"
    assert any("no zone's, left unused" in p for p in doc["cluster"]["problems"])


def test_logs_on_stdin_are_not_read_again_the_zone_to_give_is_said(
    fake: Any, tmp_path: Path
) -> None:
    log = stamped_log(tmp_path / "job.log", T0)
    got = CliRunner().invoke(
        cli,
        ["analyze", "-", "--no-progress", "--format", "json", "--prometheus",
         fake(offset_s=9 * 3600).url],
        input=log.read_bytes(),
    )  # fmt: skip
    assert got.exit_code == 0, got.output
    doc = json.loads(got.stdout)
    assert doc["job"]["log_zone_source"] == "assumed"
    assert any("give --log-tz +09:00" in p for p in doc["cluster"]["problems"])


def test_credentials_in_the_url_or_a_token_file_and_never_said(fake: Any, tmp_path: Path) -> None:
    """A Prometheus behind a login proxy: a user and password in the URL go as Basic
    authentication, a token file as a bearer token; the password and the token appear
    nowhere in what is printed.  Without credentials, the 401 says what to give."""
    import base64

    log = stamped_log(tmp_path / "job.log", T0)
    basic = "Basic " + base64.b64encode(b"ops:s3cr@t").decode()
    prom = fake(auth=basic)
    url = prom.url.replace("http://", "http://ops:s3cr%40t@")
    got = _run([str(log), "--prometheus", url, "--format", "json"])
    assert got.exit_code == 0, got.output
    c = json.loads(got.stdout)["cluster"]
    assert {a["status"] for a in c["asks"]} == {"ok"}, c["asks"]
    assert c["url"] == prom.url.replace("http://", "http://ops:***@")
    assert "s3cr" not in got.output
    assert prom.authorizations == {basic}

    token = tmp_path / "token"
    token.write_text("eyJhbGciOi.secret-token\n")
    bearer = fake(auth="Bearer eyJhbGciOi.secret-token")
    args = [str(log), "--prometheus", bearer.url, "--prometheus-token-file", str(token)]
    got = _run(args)
    assert got.exit_code == 0, got.output
    assert "secret-token" not in got.output
    assert "11 requests" in got.stdout, got.stdout

    refused = _run([str(log), "--prometheus", bearer.url, "--format", "json"])
    assert refused.exit_code == 0, refused.output
    c = json.loads(refused.stdout)["cluster"]
    assert c["asks"][0]["status"] == "error"
    assert "HTTP 401" in c["asks"][0]["message"]
    assert "https://user:pass@host, or --prometheus-token-file" in c["asks"][0]["message"]
    assert "HTTP 401" in refused.stderr


def test_logs_without_times_read_nothing(fake: Any, tmp_path: Path) -> None:
    log = write_sample(tmp_path / "plain.log")
    prom = fake()
    doc = json.loads(_run([str(log), "--prometheus", prom.url, "--format", "json"]).stdout)
    assert doc["cluster"]["requests"] == 0
    assert "no times" in doc["cluster"]["problems"][0]
    assert prom.requests == {}


# ----------------------------------------------------------------------------- real


def test_real_node_exporter_and_dcgm_scraped_by_prometheus(tmp_path: Path) -> None:
    """Debian's node_exporter on built sysfs trees for two nodes and a dcgm-exporter
    stand-in each, scraped every second by a real Prometheus: node-a's port mlx5_1 takes
    symbol errors and a link recovery, node-b's GPU 1 an XID, during the job's logs."""
    prometheus, _promtool = tools()
    node_exporter = need("prometheus-node-exporter", "prometheus-node-exporter")
    start = datetime.now(UTC)
    nodes: list[NodeExporter] = []
    dcgms: list[DcgmStandIn] = []
    prom: Prometheus | None = None
    try:
        for h in HOSTS:
            (tmp_path / h).mkdir()
            nodes.append(NodeExporter(node_exporter, tmp_path / h, h))
            # node-b's dcgm-exporter spells its label as since NVIDIA/dcgm-exporter#655
            dcgms.append(DcgmStandIn(h, host_label="hostname" if h == "node-b" else "Hostname"))
        config = scrape_config(
            tmp_path / "prometheus.yml",
            {"node": [n.address for n in nodes], "dcgm": [d.address for d in dcgms]},
        )
        prom = Prometheus(prometheus, config, tmp_path)
        assert prom.ready(), prom.tail()
        p = prom
        assert wait_for(lambda: len(p.query("up == 1")) == 4, 15), prom.tail()
        assert wait_for(lambda: len(p.query("node_infiniband_symbol_error_total")) == 4, 10)
        nodes[0].bump("mlx5_1", "symbol_error", 5)
        nodes[0].bump("mlx5_1", "link_error_recovery", 1)
        dcgms[1].set("DCGM_FI_DEV_XID_ERRORS", 1, 79)
        seen = "increase(node_infiniband_symbol_error_total[1m]) > 0"
        assert wait_for(lambda: bool(p.query(seen)) and bool(p.query("DCGM_FI_DEV_XID_ERRORS > 0")))
        log = stamped_log(tmp_path / "job.log", start)
        got = _run([str(log), "--prometheus", prom.base, "--format", "json"])
        assert got.exit_code == 0, got.output
        c = json.loads(got.stdout)["cluster"]
        assert {a["status"] for a in c["asks"]} == {"ok"}, c["asks"]
        hows = {(i["host"], i["how"]) for i in c["instances"] if i["host"]}
        assert hows == {("node-a", "uname"), ("node-b", "uname"), ("node-a", "dcgm"),
                        ("node-b", "dcgm")}  # fmt: skip
        ports = {(p["host"], p["device"]): p for p in c["ports"]}
        assert len(ports) == 4
        bad = ports[("node-a", "mlx5_1")]["errors"]
        assert set(bad) == {"symbol_error_total", "link_error_recovery_total"}, bad
        assert all(not p["errors"] for k, p in ports.items() if k != ("node-a", "mlx5_1"))
        assert ports[("node-b", "mlx5_0")]["capacity_bytes_per_second"] == 2.5e10
        assert [(g["host"], g["gpu"], g["xids"]) for g in c["gpus"]] == [("node-b", "1", [79])]
        assert c["telemetry_samples"] > 0  # ncclscope_gpu_memory_used_bytes
        ran = _run([str(log), "--prometheus", prom.base])
        text = ran.stdout
        assert ran.exit_code == 0, ran.output
        assert "InfiniBand ports: 4, 1 with errors or down" in text
        assert "node-a mlx5_1 port 1: " in text
        assert "node-b gpu 1: XID 79" in text
    finally:
        if prom is not None:
            prom.close()
        for n in nodes:
            n.close()
        for d in dcgms:
            d.close()


def test_a_real_agent_beside_node_exporter_teaches_analyze_the_logs_clock(tmp_path: Path) -> None:
    """A real ``ncclscope agent`` (simulated GPUs) follows a log whose NCCL lines this
    test writes as a node in UTC+9 stamps them, beside Debian's node_exporter, both
    scraped every second by a real Prometheus; a port takes symbol errors meanwhile.
    ``analyze --prometheus`` without ``--log-tz`` reads the zone the agent learned, reads
    the logs in it, and finds the port's errors and the agent's GPU series in the true
    window (the logs' 12 h ahead otherwise: nothing there)."""
    prometheus, _promtool = tools()
    node_exporter = need("prometheus-node-exporter", "prometheus-node-exporter")
    host = socket.gethostname().split(".")[0]  # the agent names its node so
    ahead = timedelta(hours=9)
    log = tmp_path / "job.log"
    log.write_text("Starting training with 2 processes\n")
    node = NodeExporter(node_exporter, tmp_path, host)
    agent_port = free_port()
    agent_out = (tmp_path / "agent.log").open("wb")
    agent = subprocess.Popen(
        [sys.executable, "-m", "ncclscope", "agent", "--follow", str(log), "--fake-gpus", "2",
         "--listen", f"127.0.0.1:{agent_port}", "--interval", "0.5", "--sysfs-root", "none",
         "--collect-at", "off"],
        stdout=agent_out, stderr=subprocess.STDOUT,
    )  # fmt: skip
    prom: Prometheus | None = None
    try:
        config = scrape_config(
            tmp_path / "prometheus.yml",
            {"node": [node.address], "ncclscope": [f"127.0.0.1:{agent_port}"]},
        )
        prom = Prometheus(prometheus, config, tmp_path)
        assert prom.ready(), prom.tail()
        p = prom
        # the agent's imports take seconds on a busy machine
        assert wait_for(lambda: len(p.query("up == 1")) == 2, 60), prom.tail()
        lines = [ln for ln in sample_lines() if ln.rank is not None]
        for k in range(0, len(lines), 8):  # a job writing: batches in polls of their own
            with log.open("a", encoding="utf-8") as f:
                for ln in lines[k : k + 8]:
                    text = ln.text.replace("node-a", host).replace("node-b", host)
                    f.write(f"[{datetime.now(UTC) + ahead:%Y-%m-%d %H:%M:%S.%f}] {text}\n")
            if k == 16:
                node.bump("mlx5_1", "symbol_error", 7)
            time.sleep(0.35)
        learned = "ncclscope_log_utc_offset_seconds == 32400"
        errors = "increase(node_infiniband_symbol_error_total[1m]) > 0"
        assert wait_for(lambda: bool(p.query(learned)) and bool(p.query(errors)), 40), (
            agent_out.name,
            p.query("ncclscope_log_utc_offset_seconds"),
        )
        got = _run([str(log), "--prometheus", prom.base, "--format", "json"])
        assert got.exit_code == 0, got.output
        doc = json.loads(got.stdout)
        assert (doc["job"]["log_zone"], doc["job"]["log_zone_source"]) == ("+09:00", "telemetry")
        c = doc["cluster"]
        assert [a["what"] for a in c["asks"]][:2] == ["zone", "identity"]
        assert {a["status"] for a in c["asks"]} == {"ok"}, c["asks"]
        assert {(i["host"], i["how"]) for i in c["instances"]} == {(host, "uname"),
                                                                  (host, "agent")}  # fmt: skip
        bad = [(q["device"], q["errors"]) for q in c["ports"] if q["errors"]]
        assert bad == [("mlx5_1", {"symbol_error_total": 7.0})], c["ports"]
        assert c["telemetry_samples"] > 0  # the agent's GPU memory, as --telemetry's
    finally:
        if prom is not None:
            prom.close()
        stop(agent)
        agent_out.close()
        node.close()


def test_a_burst_between_two_steps_is_counted_once(tmp_path: Path) -> None:
    """node_exporter scraped every 30 s; a port's symbol errors jump by 4 between the
    scrapes at 90 s and 120 s, and by 2 within one step later on.  The read's steps are
    60 s apart from 45 s: the first jump falls between two steps' scrapes (where
    ``increase(x[60s])`` at each step sees neither side of it and counts nothing).  Each
    jump is counted once, whole (a TSDB backfilled with promtool: the scrapes' times are
    the test's, not the machine's)."""
    prometheus, promtool = tools()
    t0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    labels = 'instance="10.0.0.1:9100",job="node"'
    port = f'{labels},device="mlx5_0",port="1"'
    om = ["# TYPE node_uname_info gauge"]
    om += [f'node_uname_info{{{labels},nodename="node-a"}} 1 {t0.timestamp() + k * 30:.0f}'
           for k in range(41)]  # fmt: skip
    om += ["# TYPE node_infiniband_symbol_error counter"]
    for k in range(41):
        value = 10 + (4 if k >= 4 else 0) + (2 if k >= 25 else 0)  # +4 at 120 s, +2 at 750 s
        om.append(
            f"node_infiniband_symbol_error_total{{{port}}} {value} {t0.timestamp() + k * 30:.0f}"
        )
    (tmp_path / "data.om").write_text("\n".join([*om, "# EOF"]) + "\n")
    backfill = [promtool, "tsdb", "create-blocks-from", "openmetrics"]
    subprocess.run([*backfill, str(tmp_path / "data.om"), str(tmp_path / "tsdb")], check=True,
                   capture_output=True)  # fmt: skip
    config = scrape_config(tmp_path / "prometheus.yml", {})
    prom = Prometheus(prometheus, config, tmp_path, retention="30d")
    try:
        assert prom.ready(), prom.tail()
        start, end = t0 + timedelta(seconds=45), t0 + timedelta(minutes=20)
        t = read_cluster(PromClient(prom.base, timeout_s=20), ["node-a"], start, end)
        assert {a.status for a in t.asks} == {"ok"}, t.asks
        rises = t.ports.filter(pl.col("metric") == "symbol_error_total")
        got = [((ts - t0).total_seconds(), v) for ts, v in rises.select("ts", "value").iter_rows()]
        assert got == [(165.0, 4.0), (765.0, 2.0)], got
    finally:
        prom.close()


def test_a_power_capped_gpu_is_no_event_a_thermal_one_is() -> None:
    """GPUs at their power cap (0x4) all the time are busy, not failing: only a GPU whose
    reasons carry a slowdown bit (0x40 HW thermal here) is listed, with every bit seen."""
    from ncclscope.cluster.summary import cluster_doc
    from ncclscope.cluster.tables import ClusterTables

    rows = [
        (T0 + timedelta(seconds=15 * k), "node-a", gpu, f"GPU-{gpu}",
         "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", value)
        for k in range(4)
        for gpu, value in (("0", 4.0), ("1", 0x44 if k == 2 else 4.0), ("2", 1.0))
    ]  # fmt: skip
    gpus = pl.DataFrame(rows, schema=GPU_SAMPLES_SCHEMA, orient="row")
    doc = cluster_doc(ClusterTables(url="http://x", gpus=gpus))
    assert doc is not None
    assert [(g["gpu"], g["clocks_event_reasons"]) for g in doc["gpus"]] == [("1", 0x44)]


def test_range_answers_read_fast_are_read_as_json_would() -> None:
    """Prometheus' compact answers are read by labels and a regular expression over the
    values; whatever is not laid out so (spaces, a marker inside a label) is read as JSON,
    and both give the same series, warnings and dropped values."""
    from ncclscope.cluster.prometheus import _fast_matrix

    tricky = {"__name__": "x", "a": '{"metric":,"values":[[1,"2"]]},', "b": "]]}]}"}
    result = [
        {"metric": tricky, "values": [[1700000000.5, "NaN"], [1700000090, "+Inf"],
                                      [1700000180, "1.5e+10"], [1700000270, "3"]]},
        {"metric": {"__name__": "y"}, "values": [[1, "0"]]},
    ]  # fmt: skip
    for warnings in (None, ["store-2 missing"]):
        doc: dict[str, Any] = {"status": "success",
                               "data": {"resultType": "matrix", "result": result}}  # fmt: skip
        if warnings:
            doc["warnings"] = warnings
        compact = json.dumps(doc, separators=(",", ":")).encode()
        assert _fast_matrix(compact) is not None
        assert _fast_matrix(json.dumps(doc).encode()) is None
        fast, slow = PromClient("http://x"), PromClient("http://x")
        got = fast._read(compact, "query_range", "ok", None)
        assert got == slow._read(json.dumps(doc).encode(), "query_range", "ok", None)
        assert fast.nonfinite == slow.nonfinite == 2
        assert got[2][0].labels == tricky
        assert got[2][0].values == [1.5e10, 3.0]
        assert got[0] == ("partial" if warnings else "ok")
