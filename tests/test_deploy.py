"""The deployment examples in ``deploy/``, checked by the tools a cluster's admin uses.

* Kubernetes (``deploy/kubernetes/``): the core kinds against the Kubernetes JSON schemas
  with ``kubernetes-validate`` (offline: the schemas ship inside the package), strictly
  (an unknown field fails); the Prometheus Operator's kinds, which it has no schema for,
  structurally (the fields the operator reads, the pods they select); the PodMonitor's
  relabelings on a real Prometheus (the labels a target ends with); the PrometheusRule's
  ``spec`` by ``promtool check rules``, and against ``grafana/ncclscope-rules.yml``.
  Nothing is applied to a cluster (there is none here).
* Slurm (``deploy/slurm/``): ``bash -n`` and ``shellcheck`` on the scripts; the batch
  script run for real with stand-ins for ``srun``, ``scontrol`` and ``torchrun`` (its
  agent, target file and clean-up); ``promtool check config`` on ``prometheus.yml`` with
  the target file it wrote, and that file's labels on a real Prometheus.

``deploy/kubernetes/prometheusrule.yaml`` is rendered from the rules file; after the rules
change, ``NCCLSCOPE_REGENERATE=1 .venv/bin/pytest tests/test_grafana.py tests/test_deploy.py``.
A test needing a tool (promtool, prometheus, shellcheck, kubernetes-validate) skips where it
is missing and fails under CI (``.ci/run`` installs them).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prom import need

from ncclscope.agent.exporter import DEFAULT_LISTEN
from ncclscope.catalog import by_name
from ncclscope.export.grafana import rules_yaml

try:
    import yaml
except ImportError:  # PyYAML comes with kubernetes-validate, in the test extra
    if os.environ.get("CI"):
        raise
    pytest.skip("PyYAML not installed (pip install -e '.[test]')", allow_module_level=True)

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"
SLURM = DEPLOY / "slurm"
RULES = REPO / "grafana" / "ncclscope-rules.yml"
PROMETHEUS_RULE = K8S / "prometheusrule.yaml"
JOB = K8S / "training-job.yaml"
POD_MONITOR = K8S / "podmonitor.yaml"
SBATCH = SLURM / "train.sbatch"
PORT = int(DEFAULT_LISTEN.rsplit(":", 1)[1])
#: The oldest Kubernetes the example is for (native sidecars: an init container with
#: ``restartPolicy: Always``, on by default since 1.29), and the newest the package knows.
K8S_VERSIONS = ("1.29.0", "latest")
#: The Prometheus Operator's kinds (no schema in kubernetes-validate).
OPERATOR_KINDS = frozenset({"PodMonitor", "ServiceMonitor", "PrometheusRule"})
#: Fields of the operator's RelabelConfig (monitoring.coreos.com/v1), and its actions.
RELABEL_FIELDS = frozenset(
    {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement", "action"}
)
RELABEL_ACTIONS = frozenset(
    {"replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep", "lowercase",
     "uppercase", "keepequal", "dropequal"}
)  # fmt: skip
POD_METRICS_ENDPOINT_FIELDS = frozenset(
    {"port", "portNumber", "targetPort", "path", "scheme", "params", "interval",
     "scrapeTimeout", "honorLabels", "honorTimestamps", "relabelings", "metricRelabelings",
     "basicAuth", "bearerTokenSecret", "tlsConfig", "followRedirects", "enableHttp2",
     "filterRunning", "proxyUrl", "authorization", "oauth2", "trackTimestampsStaleness"}
)  # fmt: skip
#: Labels the operator puts on every PodMonitor target (besides job and instance).
OPERATOR_TARGET_LABELS = frozenset({"namespace", "pod", "container", "endpoint"})


def _kubernetes_validate() -> Any:
    try:
        import kubernetes_validate  # type: ignore[import-untyped]
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("kubernetes-validate is missing: it is in the test extra")
        pytest.skip("kubernetes-validate not installed (pip install -e '.[test]')")
    return kubernetes_validate


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _one(path: Path, kind: str) -> dict[str, Any]:
    (doc,) = [d for d in _docs(path) if d["kind"] == kind]
    return doc


# --- the PrometheusRule, from the rules file ----------------------------------------------


def prometheus_rule_yaml(rules_text: str) -> str:
    """``grafana/ncclscope-rules.yml`` as a Prometheus Operator PrometheusRule: the file's
    ``groups:`` and all after it, indented under ``spec:`` (comments and block scalars keep
    their meaning when every line moves right by the same amount)."""
    lines = rules_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    body = "\n".join(f"  {line}" if line else "" for line in lines[start:])
    return (
        "# grafana/ncclscope-rules.yml for the Prometheus Operator, rendered by\n"
        "# tests/test_deploy.py from the same source: after the rules change,\n"
        "#   NCCLSCOPE_REGENERATE=1 .venv/bin/pytest tests/test_grafana.py tests/test_deploy.py\n"
        "# The label must match your Prometheus's ruleSelector. See docs/deploy.md.\n"
        "apiVersion: monitoring.coreos.com/v1\n"
        "kind: PrometheusRule\n"
        "metadata:\n"
        "  name: ncclscope\n"
        "  labels:\n"
        "    release: prometheus\n"
        "spec:\n"
        f"{body}\n"
    )


def test_prometheus_rule_is_rendered_from_the_rules_file() -> None:
    # From the module the rules file is rendered from (test_grafana checks they agree), so
    # one regenerating run of both test files leaves them in step whatever their order.
    text = prometheus_rule_yaml(rules_yaml())
    if os.environ.get("NCCLSCOPE_REGENERATE"):
        PROMETHEUS_RULE.write_text(text)
    assert PROMETHEUS_RULE.read_text() == text, (
        "run with NCCLSCOPE_REGENERATE=1 after checking the diff"
    )


def test_prometheus_rule_spec_is_the_rules_file() -> None:
    rule = _one(PROMETHEUS_RULE, "PrometheusRule")
    rules = yaml.safe_load(RULES.read_text())
    assert rule["spec"] == rules
    names = [r.get("alert") or r["record"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert "NcclscopeTimeoutImminent" in names
    assert "NcclscopeAgentDown" in names


def test_the_renderer_keeps_block_scalars_and_comments() -> None:
    text = prometheus_rule_yaml(
        "# head\ngroups:\n  # why\n  - name: g\n    rules:\n"
        "      - record: a\n        expr: |-\n          max by (job) (\n\n            b)\n"
    )
    spec = yaml.safe_load(text)["spec"]
    assert spec["groups"][0]["rules"][0]["expr"] == "max by (job) (\n\n  b)"
    assert "  # why" in text
    assert "# head" not in text


def test_promtool_checks_the_prometheus_rule_spec(tmp_path: Path) -> None:
    promtool = need("promtool", "prometheus")
    spec = tmp_path / "spec.yml"
    spec.write_text(yaml.safe_dump(_one(PROMETHEUS_RULE, "PrometheusRule")["spec"]))
    check = subprocess.run([promtool, "check", "rules", str(spec)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout


# --- the Kubernetes manifests --------------------------------------------------------------


def _k8s_docs() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, d) for p in sorted(K8S.glob("*.yaml")) for d in _docs(p)]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_validate_accepts_the_core_manifests(version: str) -> None:
    kv = _kubernetes_validate()
    if version == "latest":
        version = kv.utils.latest_version()
    checked = []
    for path, doc in _k8s_docs():
        if doc["kind"] in OPERATOR_KINDS:
            continue
        try:
            kv.validate(doc, version, strict=True)
        except kv.utils.ValidationError as err:
            where = ".".join(str(x) for x in err.path)
            pytest.fail(f"{path.name} {doc['kind']} at {where}: {err.message}")
        checked.append(doc["kind"])
    assert sorted(checked) == ["Job", "PersistentVolumeClaim", "Service"]


def test_kubernetes_validate_rejects_a_broken_job() -> None:
    """The strict check reads the fields: a misspelt one and a wrong type both fail."""
    kv = _kubernetes_validate()
    job = _one(JOB, "Job")
    pod = job["spec"]["template"]["spec"]
    pod["initContainers"][0]["volumeMount"] = pod["initContainers"][0].pop("volumeMounts")
    with pytest.raises(kv.utils.ValidationError):
        kv.validate(job, "1.29.0", strict=True)
    job = _one(JOB, "Job")
    job["spec"]["completions"] = "two"
    with pytest.raises(kv.utils.ValidationError):
        kv.validate(job, "1.29.0", strict=True)


def _pod_template() -> dict[str, Any]:
    template: dict[str, Any] = _one(JOB, "Job")["spec"]["template"]
    return template


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    ok = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok &= {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
    return ok


def test_the_job_is_one_agent_per_pod_sharing_the_logs() -> None:
    pod = _pod_template()["spec"]
    (agent,) = [c for c in pod["initContainers"] if "agent" in c.get("args", [])]
    (trainer,) = pod["containers"]
    assert agent["restartPolicy"] == "Always"  # a native sidecar: the Job can complete
    args = agent["args"]
    listen = args[args.index("--listen") + 1]
    assert listen == f"0.0.0.0:{PORT}"
    assert {p["containerPort"] for p in agent["ports"]} == {PORT}
    follow = args[args.index("--follow") + 1]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["NCCL_DEBUG"] == "INFO"
    # Stamps every reader reads alike: microseconds, in UTC (NCCL prints local time).
    assert env["NCCL_DEBUG_TIMESTAMP_FORMAT"] == "[%F %T.%6f] "
    assert env["TZ"] == "UTC"
    debug_file = env["NCCL_DEBUG_FILE"]
    log_dir = str(Path(debug_file).parent)
    assert Path(follow).parent == Path(log_dir)
    assert Path(debug_file.replace("%h", "train-llm-0").replace("%p", "123")).match(follow)
    mounts = {c["name"]: {(m["name"], m["mountPath"]) for m in c["volumeMounts"]}
              for c in (agent, trainer)}  # fmt: skip
    volumes = {v["name"]: v for v in pod["volumes"]}
    shared = [n for n in volumes
              if all((n, log_dir) in mounts[c] for c in ("ncclscope", "trainer"))]  # fmt: skip
    assert shared == ["logs"]
    # Evidence at a stall goes to the job's claim too, in a writable folder of the pod's
    # own (the logs stay read-only to the agent), and outlives the pod.
    out = args[args.index("--out") + 1]
    (evidence,) = [m for m in agent["volumeMounts"] if m["mountPath"] == out]
    assert evidence["name"] == "logs"
    assert not evidence.get("readOnly")
    assert evidence["subPathExpr"] == "$(POD_NAME)-ncclscope"
    # The logs outlive the pod: a claim of the job's (a size limit), each pod in its own
    # folder of it, the same for both containers.
    claim = volumes["logs"]["persistentVolumeClaim"]["claimName"]
    pvc = _one(JOB, "PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == claim
    assert pvc["spec"]["resources"]["requests"]["storage"]
    assert "ReadWriteMany" in pvc["spec"]["accessModes"]
    sub = {c["name"]: next(m for m in c["volumeMounts"] if m["name"] == "logs")
           for c in (agent, trainer)}  # fmt: skip
    assert sub["ncclscope"]["subPathExpr"] == sub["trainer"]["subPathExpr"] == "$(POD_NAME)"
    for c in (agent, trainer):
        (pod_name,) = [e for e in c["env"] if e["name"] == "POD_NAME"]
        assert pod_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_the_sidecar_arguments_are_the_agents() -> None:
    """The image's entrypoint is ``ncclscope``; the sidecar's arguments parse as
    ``ncclscope agent``'s (click reads them without running the agent)."""
    from ncclscope.agent_cli import agent as agent_command

    pod = _pod_template()["spec"]
    (sidecar,) = pod["initContainers"]
    assert sidecar["args"][0] == "agent"
    params = agent_command.make_context("agent", list(sidecar["args"][1:])).params
    assert params["from_start"] is True
    assert params["follow"] == ("/logs/*.log",)
    assert 'ENTRYPOINT ["ncclscope"]' in (DEPLOY / "Dockerfile").read_text()
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (REPO / source).exists(), line


def _requirements(lines: list[str]) -> dict[str, str]:
    """name -> version (or specifier) of requirement lines, names normalised."""
    out = {}
    for line in lines:
        m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*([<>=!~].*)?$", line.split("#")[0])
        if m and m[1]:
            out[re.sub(r"[-_.]+", "-", m[1]).lower()] = (m[2] or "").strip()
    return out


def test_the_image_installs_the_agent_pinned_and_without_plotly() -> None:
    """deploy/Dockerfile: Python 3.11 on Debian 12 (what CI tests); every runtime
    dependency but plotly, at deploy/constraints.txt's versions, each pinned exactly and
    at or above pyproject.toml's floor."""
    from packaging.version import Version

    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim-bookworm", text, re.M)
    run = " ".join(text.split("RUN ", 1)[1].split("\n"))
    assert "-c /src/deploy/constraints.txt" in run
    assert "--no-deps /src" in run  # ncclscope itself brings nothing more
    installed = _requirements(run.split("constraints.txt", 1)[1].split("&&", 1)[0].split())
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    wanted = _requirements(pyproject["project"]["dependencies"])
    evidence = _requirements(pyproject["project"]["optional-dependencies"]["evidence"])
    assert set(installed) == (set(wanted) - {"plotly"}) | {"polars-runtime-32"} | set(evidence)
    pins = _requirements((DEPLOY / "constraints.txt").read_text().splitlines())
    for name, spec in {**wanted, **evidence}.items():
        assert pins[name].startswith("=="), name
        floor = spec.removeprefix(">=")
        assert Version(pins[name][2:]) >= Version(floor), (name, pins[name], spec)


def test_the_agent_and_the_text_report_need_no_plotly(tmp_path: Path) -> None:
    """What the image runs works without plotly; --html says what to install."""
    blocked = (
        "import sys; sys.modules['plotly'] = None; "
        "from ncclscope.entry import main; sys.argv[0] = 'ncclscope'; main()"
    )

    def ncclscope(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", blocked, *args], capture_output=True, text=True, cwd=REPO
        )

    fixture = str(REPO / "fixtures" / "stalled-227-ts" / "job.log")
    report = ncclscope("analyze", fixture, "--no-progress")
    assert report.returncode == 0, report.stderr
    assert "AllGather" in report.stdout
    assert ncclscope("agent", "--help").returncode == 0
    html = ncclscope("analyze", fixture, "--no-progress", "--html", str(tmp_path / "r.html"))
    assert html.returncode == 1
    assert "--html needs plotly" in html.stderr
    assert "pip install plotly" in html.stderr


#: The volume types the Restricted Pod Security Standard allows (kubernetes.io, "Pod
#: Security Standards", Restricted: "Volume Types").
_RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip


def _restricted_violations(pod: dict[str, Any]) -> list[str]:
    """Where a pod spec breaks the Restricted Pod Security Standard (its Baseline and
    Restricted controls as the Kubernetes docs list them, for the fields a pod can set
    here): host namespaces, privileged, capabilities, hostPath and other volume types,
    host ports, /proc mount, sysctls, privilege escalation, non-root, seccomp."""
    out = [f"spec.{f}" for f in ("hostNetwork", "hostPID", "hostIPC") if pod.get(f)]
    psc = pod.get("securityContext", {})
    for v in pod.get("volumes", []):
        name, kinds = v["name"], set(v) - {"name"}
        if not kinds <= _RESTRICTED_VOLUMES:
            out.append(f"volume {name}: {sorted(kinds - _RESTRICTED_VOLUMES)}")
    if psc.get("sysctls"):
        out.append("spec.securityContext.sysctls")
    containers = pod.get("initContainers", []) + pod.get("containers", [])
    for c in containers:
        sc = c.get("securityContext", {})
        where = f"container {c['name']}"
        if sc.get("privileged"):
            out.append(f"{where}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            out.append(f"{where}: capabilities must drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{where}: adds capabilities")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{where}: procMount")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{where}: hostPort")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"{where}: runAsNonRoot must be true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{where}: runAsUser 0")
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{where}: seccompProfile must be RuntimeDefault or Localhost")
    return out


def test_the_job_passes_the_restricted_pod_security_level() -> None:
    pod = _pod_template()["spec"]
    assert _restricted_violations(pod) == []
    # The check reads what it should: root, a hostPath, a kept capability all fail.
    broken = copy.deepcopy(pod)
    broken["securityContext"]["runAsNonRoot"] = False
    broken["volumes"].append({"name": "host", "hostPath": {"path": "/var/log"}})
    broken["containers"][0]["securityContext"]["capabilities"] = {"drop": ["NET_RAW"]}
    found = _restricted_violations(broken)
    assert any("runAsNonRoot" in f for f in found)
    assert any("hostPath" in f for f in found)
    assert any("drop ALL" in f for f in found)


def test_the_sidecar_asks_for_no_gpu_nor_every_gpu_of_the_node() -> None:
    """NVIDIA_VISIBLE_DEVICES=all on a container without a GPU request is refused on
    hardened GPU Operator setups and shows other tenants' GPUs: the sidecar sets it not,
    and requests no GPU (the trainer holds the pod's)."""
    pod = _pod_template()["spec"]
    (agent,) = [c for c in pod["initContainers"] if "agent" in c.get("args", [])]
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in agent.get("env", [])}
    assert not any("gpu" in k for k in agent["resources"].get("limits", {}))


def test_the_sidecar_never_gates_the_trainer() -> None:
    """No probe of the agent holds the pod back (a native sidecar's readiness is the
    pod's; its startup probe would delay the trainer), and the headless Service names
    pods before they are ready (torchrun's rendezvous needs the names first)."""
    pod = _pod_template()["spec"]
    (agent,) = [c for c in pod["initContainers"] if "agent" in c.get("args", [])]
    assert not {"readinessProbe", "startupProbe"} & set(agent)
    assert _one(JOB, "Service")["spec"]["publishNotReadyAddresses"] is True
    # Its root is read-only: what it writes goes to a volume of bounded size.
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    tmp = {m["mountPath"]: m["name"] for m in agent["volumeMounts"]}["/tmp"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == tmp]
    assert volume["emptyDir"]["sizeLimit"]


def test_the_headless_service_gives_the_pods_their_names() -> None:
    service = _one(JOB, "Service")
    template = _pod_template()
    assert service["spec"]["clusterIP"] == "None"
    assert _matches({"matchLabels": service["spec"]["selector"]}, template["metadata"]["labels"])
    assert template["spec"]["subdomain"] == service["metadata"]["name"]
    (trainer,) = template["spec"]["containers"]
    assert f"--master-addr={_one(JOB, 'Job')['metadata']['name']}-0." in trainer["command"][-1]


def test_the_pod_monitor_scrapes_the_sidecar() -> None:
    monitor = _one(POD_MONITOR, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["name"]
    template = _pod_template()
    assert _matches(monitor["spec"]["selector"], template["metadata"]["labels"])
    ports = {p["name"]: p["containerPort"] for c in template["spec"]["initContainers"]
             for p in c.get("ports", [])}  # fmt: skip
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert set(endpoint) <= POD_METRICS_ENDPOINT_FIELDS, set(endpoint) - POD_METRICS_ENDPOINT_FIELDS
    assert ports[endpoint["port"]] == PORT
    assert endpoint["path"] == "/metrics"
    # The rules are written for 1 s to 15 s scrapes.
    assert 1 <= int(endpoint["interval"].rstrip("s")) <= 15
    assert int(endpoint["scrapeTimeout"].rstrip("s")) < int(endpoint["interval"].rstrip("s"))
    for relabel in endpoint["relabelings"]:
        assert set(relabel) <= RELABEL_FIELDS, relabel
        assert relabel.get("action", "replace") in RELABEL_ACTIONS
        re.compile(relabel.get("regex", "(.*)"))
        assert all(s.startswith("__meta_kubernetes_pod_") for s in relabel.get("sourceLabels", []))


def test_the_prometheus_rule_is_an_operator_resource() -> None:
    rule = _one(PROMETHEUS_RULE, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"]
    assert set(rule["spec"]) == {"groups"}
    for group in rule["spec"]["groups"]:
        assert group["name"]
        for r in group["rules"]:
            assert ("alert" in r) != ("record" in r)
            assert r["expr"]


def test_the_labels_added_to_targets_are_not_the_agents_own() -> None:
    """A target label that an exported metric also has would rename the metric's label to
    ``exported_<name>`` (honor_labels is off), and the rules would lose it."""
    exported = {label for m in by_name().values() for label in m.labels}
    relabelled = {
        r["targetLabel"]
        for e in _one(POD_MONITOR, "PodMonitor")["spec"]["podMetricsEndpoints"]
        for r in e["relabelings"]
    }
    slurm = set(_sd_labels(SBATCH.read_text()))
    added = (relabelled | slurm | OPERATOR_TARGET_LABELS) - {"job", "instance"}
    assert "node" in added
    assert not added & exported


def _sd_labels(script: str) -> list[str]:
    (printf,) = re.findall(r'"labels": \{([^}]*)\}', script)
    return re.findall(r'"(\w+)": ', printf)


# --- a real Prometheus ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _targets(config: Path, want: int) -> list[dict[str, Any]]:
    """The active targets a real Prometheus makes of ``config`` (once ``want`` are there).
    Every target address is on 127.0.0.1."""
    prometheus = need("prometheus", "prometheus")
    port = _free_port()
    proc = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={config.parent / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                url = f"http://127.0.0.1:{port}/api/v1/targets"
                with urllib.request.urlopen(url, timeout=2) as response:
                    active: list[dict[str, Any]] = json.load(response)["data"]["activeTargets"]
                if len(active) >= want:
                    return active
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.1)
        pytest.fail(f"Prometheus made fewer than {want} targets of {config} in 30 s")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _snake(key: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m.group(0).lower(), key)


@pytest.mark.slow
def test_the_pod_monitor_relabelings_on_a_real_prometheus(tmp_path: Path) -> None:
    """The operator's own relabelings for a PodMonitor (job "<namespace>/<name>", the pod's
    namespace, pod, container) and then ours, on targets that carry the ``__meta_`` labels
    Kubernetes discovery gives a pod (from a file here)."""
    monitor = _one(POD_MONITOR, "PodMonitor")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    job = _pod_template()["metadata"]["labels"]["training.ncclscope.io/job"]
    closed = _free_port()  # nothing listens there: only the labels are looked at

    def pod(node: str, name: str, training_job: str) -> dict[str, Any]:
        return {
            "targets": [f"127.0.0.1:{closed}"],
            "labels": {
                "__meta_kubernetes_namespace": "ml",
                "__meta_kubernetes_pod_name": name,
                "__meta_kubernetes_pod_container_name": "ncclscope",
                "__meta_kubernetes_pod_container_port_name": endpoint["port"],
                "__meta_kubernetes_pod_container_port_number": str(PORT),
                "__meta_kubernetes_pod_node_name": node,
                "__meta_kubernetes_pod_label_training_ncclscope_io_job": training_job,
            },
        }

    (tmp_path / "pods.json").write_text(json.dumps([
        pod("gpu-a", f"{job}-0-x", job), pod("gpu-b", f"{job}-1-y", job),
        pod("gpu-c", "other-0-z", "other"),
    ]))  # fmt: skip
    operator = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"ml/{monitor['metadata']['name']}"},
        {"target_label": "endpoint", "replacement": endpoint["port"]},
    ]
    ours = [{_snake(k): v for k, v in r.items()} for r in endpoint["relabelings"]]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": [{
        "job_name": "podmonitor/ml/ncclscope/0", "scrape_interval": "1h",
        "file_sd_configs": [{"files": [str(tmp_path / "pods.json")]}],
        "relabel_configs": operator + ours,
    }]}))  # fmt: skip
    promtool = need("promtool", "prometheus")
    check = subprocess.run([promtool, "check", "config", str(config)], capture_output=True)
    assert check.returncode == 0, check.stdout + check.stderr
    labels = sorted((t["labels"] for t in _targets(config, 3)), key=lambda x: x["pod"])
    assert [(x["job"], x["instance"], x["node"]) for x in labels] == [
        ("ncclscope-other", f"gpu-c:{PORT}", "gpu-c"),
        (f"ncclscope-{job}", f"gpu-a:{PORT}", "gpu-a"),
        (f"ncclscope-{job}", f"gpu-b:{PORT}", "gpu-b"),
    ]
    # NcclscopeAgentDown's selector matches every training job's agents.
    assert all(re.fullmatch(".*ncclscope.*", x["job"]) for x in labels)


# --- Slurm ---------------------------------------------------------------------------------


@pytest.mark.parametrize("script", ["train.sbatch", "epilog.sh"])
def test_bash_parses_the_slurm_scripts(script: str) -> None:
    check = subprocess.run(["bash", "-n", str(SLURM / script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize("script", ["train.sbatch", "epilog.sh"])
def test_shellcheck_passes_the_slurm_scripts(script: str) -> None:
    shellcheck = need("shellcheck", "shellcheck")
    check = subprocess.run(
        [shellcheck, "--shell=bash", str(SLURM / script)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr


#: srun's stand-in runs its command here, once (this "allocation" is one node), and
#: enforces what matters to the script: which step holds the node's GPUs. A step takes
#: them unless it asks for none (--gres=none, --gpus=0); it shares them with --overlap
#: only from Slurm 22.05 (NEWS: "--overlap now allows the step to share all resources
#: (CPUs, memory, and GRES)"; before, CPUs only). A step that needs GPUs a running step
#: holds unshared would wait forever in Slurm: the stand-in fails it at once. Its
#: version is SRUN_STANDIN_VERSION's.
_SRUN = r"""#!/bin/bash
version=${SRUN_STANDIN_VERSION:-23.11.4}
if [[ $1 == --version ]]; then echo "slurm $version"; exit 0; fi
takes=1 overlap=0
while [[ $1 == -* ]]; do
  case $1 in
    --gres=none|--gpus=0|--gres=gpu:0) takes=0 ;;
    --overlap) overlap=1 ;;
  esac
  shift
done
mode=none
if (( takes )); then
  mode=exclusive
  if (( overlap )) && printf '%s\n' 22.05 "$version" | sort -V -C; then mode=shared; fi
fi
steps=$SLURM_SUBMIT_DIR/.srun-steps
mkdir -p "$steps"
exec 9>"$steps/lock"
flock 9
if [[ $mode == exclusive ]]; then
  for held in "$steps"/step.*; do
    [[ -e $held ]] || continue
    pid=${held##*.}
    if ! kill -0 "$pid" 2>/dev/null; then rm -f "$held"; continue; fi
    if [[ $(cat "$held") == exclusive ]]; then
      echo "srun (stand-in, Slurm $version): this step needs the GPUs step $pid holds" \
        "without sharing them: Slurm would keep it waiting forever" >&2
      exit 1
    fi
  done
fi
echo "$mode" >"$steps/step.$$"
exec 9>&-
exec "$@"
"""

STAND_INS = {
    "srun": _SRUN,
    "scontrol": '#!/bin/bash\n[[ "$1 $2" == "show hostnames" ]] && echo localhost\n',
    # torchrun writes an NCCL line where NCCL_DEBUG_FILE says, then waits for the test.
    "torchrun": (
        "#!/bin/bash\n"
        "log=${NCCL_DEBUG_FILE//%h/$(hostname -s)}; log=${log//%p/$$}\n"
        'printf "%s|%s" "$TZ" "$NCCL_DEBUG_TIMESTAMP_FORMAT" >"$SLURM_SUBMIT_DIR/trainer.env"\n'
        'echo "$(hostname -s):$$:$$ [0] NCCL INFO NCCL version 2.21.5+cuda12.4" >"$log"\n'
        "for _ in $(seq 600); do [[ -e $NCCLSCOPE_TEST_DONE ]] && break; sleep 0.1; done\n"
        'echo "torchrun done"\n'
        'exit "$(cat "$NCCLSCOPE_TEST_DONE")"\n'
    ),
}


def _batch_env(tmp_path: Path, slurm: str) -> dict[str, str]:
    """The environment train.sbatch runs in under the stand-ins (Slurm ``slurm``)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(parents=True)
    for name, text in STAND_INS.items():
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train llm", "SLURM_JOB_NODELIST": "localhost",
        "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_SUBMIT_DIR": str(tmp_path),
        "NCCLSCOPE": str(Path(sys.executable).parent / "ncclscope"),
        "NCCLSCOPE_PORT": str(_free_port()), "NCCLSCOPE_LISTEN": "127.0.0.1",
        "NCCLSCOPE_SD_DIR": str(tmp_path / "ncclscope.d"),
        "NCCLSCOPE_TEST_DONE": str(tmp_path / "done"), "SRUN_STANDIN_VERSION": slurm,
    }  # fmt: skip


def _run_batch(
    tmp_path: Path, exit_code: int, *, slurm: str = "23.11.4"
) -> tuple[Path, Any, str, int, int]:
    """Run train.sbatch with the stand-ins (Slurm ``slurm``) until its training step
    runs; look at what it made; let the training end with ``exit_code``; return what is
    left and its status."""
    env = _batch_env(tmp_path, slurm)
    port, done = int(env["NCCLSCOPE_PORT"]), Path(env["NCCLSCOPE_TEST_DONE"])
    sd_dir = Path(env["NCCLSCOPE_SD_DIR"])
    # Another node's file in the shared log directory: this node's agent must leave it.
    (tmp_path / "logs" / "4242").mkdir(parents=True)
    (tmp_path / "logs" / "4242" / "other-node.77.log").write_text("other-node:77:77 [0] x\n")
    proc = subprocess.Popen(
        ["bash", str(SBATCH)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        sd_file = sd_dir / "ncclscope-4242.json"
        # Followed: this node's NCCL file and torchrun.log, not the other node's file.
        want = re.compile(r"^ncclscope_log_files_followed 2\.0$", re.M)
        metrics = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not want.search(metrics):
            time.sleep(0.1)
            try:
                url = f"http://127.0.0.1:{port}/metrics"
                with urllib.request.urlopen(url, timeout=2) as response:
                    metrics = response.read().decode()
            except (urllib.error.URLError, ConnectionError):
                continue
        assert want.search(metrics), "the agent did not follow this node's 2 files in 60 s"
        targets = json.loads(sd_file.read_text())
        host = socket.gethostname().split(".")[0]
        logs = sorted(p.name for p in (tmp_path / "logs" / "4242").iterdir())
        ours = [name for name in logs if name.startswith(f"{host}.")]
        assert len(ours) == 2, logs  # <host>.<pid>.log from NCCL and the trainer's own
        assert f"{host}.torchrun.log" in ours
        assert sorted(set(logs) - set(ours)) == ["other-node.77.log"]
        # The training step's stamps: UTC, microseconds.
        assert (tmp_path / "trainer.env").read_text() == "UTC|[%F %T.%6f] "
        shutil.copy(sd_file, tmp_path / "targets.json")
        done.write_text(str(exit_code))
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # a failed check: end the script and its agent
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    # The agent is gone: nothing serves its port any more.
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "the agent outlived the batch script"
    return sd_file, targets, out.decode(), proc.returncode, port


@pytest.mark.slow
def test_the_batch_script_runs_an_agent_and_cleans_up(tmp_path: Path) -> None:
    sd_file, targets, out, rc, port = _run_batch(tmp_path, 0)
    assert rc == 0, out
    assert "torchrun done" in out
    assert targets == [{
        "targets": [f"localhost:{port}"],
        "labels": {"job": "ncclscope-4242", "slurm_job_name": "train_llm"},
    }]  # fmt: skip
    assert not sd_file.exists()
    assert list(sd_file.parent.iterdir()) == []


@pytest.mark.slow
def test_before_slurm_22_05_the_agent_step_takes_no_gpus(tmp_path: Path) -> None:
    """Slurm 21.08: --overlap shares CPUs only, so the agent step asks for no GPUs and
    the training step gets them; the same script without that would wait forever."""
    _sd_file, _targets, out, rc, _port = _run_batch(tmp_path, 0, slurm="21.08.8")
    assert rc == 0, out
    assert "torchrun done" in out
    assert "takes no GPUs (--gres=none)" in out
    assert "waiting forever" not in out  # neither step was refused the GPUs
    # The stand-in enforces it: without --gres=none one of the two steps cannot start
    # (whichever asks second: the agent's is started first, but in the background).
    text = SBATCH.read_text()
    assert "  agent_gres=(--gres=none)\n" in text
    naive = tmp_path / "naive.sbatch"
    naive.write_text(text.replace("  agent_gres=(--gres=none)\n", "  :\n"))
    work = tmp_path / "naive"
    env = _batch_env(work, "21.08.8")
    (work / "logs" / "4242").mkdir(parents=True)
    # The training step holds the GPUs until told to end, so that the two steps overlap
    # whichever starts first (a training step ended before the agent's asked would leave
    # nothing to refuse): told once one was refused, or after 60 s.
    said = work / "naive.out"
    with said.open("wb") as out_file:
        naive_run = subprocess.Popen(
            ["bash", str(naive)], cwd=work, env=env, stdout=out_file, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and "waiting forever" not in said.read_text():
                time.sleep(0.1)
            Path(env["NCCLSCOPE_TEST_DONE"]).write_text("0")
            naive_run.wait(timeout=60)
        finally:
            if naive_run.poll() is None:
                os.killpg(naive_run.pid, signal.SIGKILL)
                naive_run.wait()
    assert "Slurm would keep it waiting forever" in said.read_text()


@pytest.mark.slow
def test_a_failed_training_still_stops_the_agent(tmp_path: Path) -> None:
    sd_file, _targets, out, rc, _port = _run_batch(tmp_path, 3)
    assert rc == 3, out
    assert not sd_file.exists()


@pytest.mark.slow
def test_promtool_and_prometheus_take_the_slurm_config(tmp_path: Path) -> None:
    """prometheus.yml installed as the docs say (the rules beside it, ncclscope.d/ with a
    target file the batch script wrote): promtool checks it all, and a real Prometheus
    gives the target the training job's `job` label and the node as `instance`."""
    promtool = need("promtool", "prometheus")
    etc = tmp_path / "etc"
    (etc / "ncclscope.d").mkdir(parents=True)
    shutil.copy(SLURM / "prometheus.yml", etc / "prometheus.yml")
    shutil.copy(RULES, etc / "ncclscope-rules.yml")
    (tmp_path / "run").mkdir()
    _sd_file, targets, out, rc, _port = _run_batch(tmp_path / "run", 0)
    assert rc == 0, out
    closed = _free_port()  # the target is looked at, not scraped
    targets[0]["targets"] = [f"127.0.0.1:{closed}"]
    (etc / "ncclscope.d" / "ncclscope-4242.json").write_text(json.dumps(targets))
    check = subprocess.run(
        [promtool, "check", "config", str(etc / "prometheus.yml")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 1 rule files found" in check.stdout + check.stderr
    # promtool reads the target files too: a broken one fails the check.
    (etc / "ncclscope.d" / "broken.json").write_text('[{"targets": "node-0:9477"}]')
    bad = subprocess.run([promtool, "check", "config", str(etc / "prometheus.yml")],
                         capture_output=True)  # fmt: skip
    assert bad.returncode != 0
    (etc / "ncclscope.d" / "broken.json").unlink()
    (target,) = _targets(etc / "prometheus.yml", 1)
    assert target["labels"] == {
        "job": "ncclscope-4242", "instance": f"127.0.0.1:{closed}", "slurm_job_name": "train_llm",
    }  # fmt: skip
    assert target["scrapeInterval"] == "5s"


def test_the_slurm_config_merges_into_a_site_config(tmp_path: Path) -> None:
    """Merged into a site's prometheus.yml (its own global intervals, an unrelated scrape
    job), the ncclscope job and rules keep their intervals and the site's job its own."""
    promtool = need("promtool", "prometheus")
    ours = yaml.safe_load((SLURM / "prometheus.yml").read_text())
    assert "global" not in ours  # nothing of the site's is changed
    closed = _free_port()
    site = {
        "global": {"scrape_interval": "1m", "evaluation_interval": "1m"},
        "rule_files": ours["rule_files"],
        "scrape_configs": [
            {"job_name": "node", "static_configs": [{"targets": [f"127.0.0.1:{closed}"]}]},
            *ours["scrape_configs"],
        ],
    }
    etc = tmp_path / "etc"
    (etc / "ncclscope.d").mkdir(parents=True)
    (etc / "prometheus.yml").write_text(yaml.safe_dump(site))
    shutil.copy(RULES, etc / "ncclscope-rules.yml")
    (etc / "ncclscope.d" / "job.json").write_text(
        json.dumps([{"targets": [f"127.0.0.1:{_free_port()}"], "labels": {"job": "ncclscope-1"}}])
    )
    check = subprocess.run(
        [promtool, "check", "config", str(etc / "prometheus.yml")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    intervals = {
        t["labels"]["job"]: t["scrapeInterval"] for t in _targets(etc / "prometheus.yml", 2)
    }
    assert intervals == {"node": "1m", "ncclscope-1": "5s"}
    # Every rule group says its interval: the site's 1m evaluation slows none of them.
    groups = yaml.safe_load(RULES.read_text())["groups"]
    assert {g["name"]: g.get("interval") for g in groups} == {
        "ncclscope-job": "1s", "ncclscope-job-trends": "15s", "ncclscope-node": "15s",
        "ncclscope-evidence": "15s", "ncclscope-fabric": "15s",
    }  # fmt: skip


# --- docs ----------------------------------------------------------------------------------


def test_the_docs_are_linked() -> None:
    assert (REPO / "docs" / "deploy.md").is_file()
    assert "docs/deploy.md" in (REPO / "README.md").read_text()
    assert "../docs/deploy.md" in (REPO / "grafana" / "README.md").read_text()
    doc = (REPO / "docs" / "deploy.md").read_text()
    for path in [*K8S.glob("*.yaml"), *SLURM.iterdir(), DEPLOY / "Dockerfile"]:
        assert path.name in doc, f"docs/deploy.md does not mention {path.name}"
